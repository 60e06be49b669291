//! Orchestration of whole runs (`sorft repro`) and their reports.

pub mod plot;
