//! The training engine: a training forward that keeps activations in named structs, hand-written
//! backward per layer (the llm.c way), the chunked token loss, AdamW with clipping and a cosine
//! schedule, LoRA adapters, supervised fine-tuning on chat JSONL, and checkpoints with exact resume.
//!
//! Every numeric operation goes through the [`crate::engine::Backend`] trait.

pub mod backward;
pub mod checkpoint;
pub mod data;
pub mod error;
pub mod forward;
pub mod lora;
pub mod loss;
pub mod memory;
pub mod optim;
pub mod params;
pub mod restrict;
pub mod sft;

pub use error::{Result, TrainError};
pub use forward::{Batch, Forward, ForwardOptions};
pub use lora::{Lora, LoraConfig, LoraTarget};
pub use params::Grads;
