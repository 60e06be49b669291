//! Orchestration of whole runs (`sorft repro`) and their reports.

pub mod augment;
pub mod compare;
pub mod config;
pub mod curriculum;
pub mod curriculum_run;
pub mod edit_drill;
pub mod eval_cache;
pub mod export;
pub mod failforge;
pub mod p2t_stage1;
pub mod plot;
pub mod repro;
pub mod reward_service;
pub mod scores;
