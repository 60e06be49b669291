//! The numeric engine: tensors whose storage belongs to a backend, and the one backend trait through
//! which every numeric operation of the model passes. The CPU backend is the f32 reference.

pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod error;
pub mod restricted;
pub mod rng;
pub mod sampling;
pub mod shapes;
pub mod tensor;

pub use backend::{AttentionShape, Backend, HostData, SharedPrefix};
pub use cpu::Cpu;
pub use cuda::Cuda;
pub use dtype::DType;
pub use error::EngineError;
pub use sampling::SamplingParams;
pub use tensor::Tensor;
