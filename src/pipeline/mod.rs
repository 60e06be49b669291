//! Orchestration of whole runs (`sorft repro`) and their reports.

pub mod augment;
pub mod config;
pub mod p2t_stage1;
pub mod plot;
pub mod repro;
