//! sorft: subtask-oriented reinforcement fine-tuning (SoRFT) of code LLMs, end to end, in one binary.
//!
//! Layers (imports point downward only), see `ARCHITECTURE.md` in the shared folder:
//! `cli` -> `pipeline` -> `rft` -> (`swe`, `sandbox`, `model`) -> `engine`.

pub mod engine;
pub mod model;
pub mod pipeline;
pub mod rft;
pub mod swe;
pub mod train;
