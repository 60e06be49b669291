//! Errors of the engine layer.

use crate::engine::DType;

/// An error raised by a backend operation.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// An operand had the wrong shape.
    #[error("{op}: shape mismatch: {detail}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// What was expected and what came.
        detail: String,
    },
    /// An operand had a dtype the operation does not take.
    #[error("{op}: unsupported dtype {dtype}")]
    DType {
        /// The operation.
        op: &'static str,
        /// The dtype that came.
        dtype: DType,
    },
    /// An index (token id, slot, position) was out of range.
    #[error("{op}: index {index} out of range (limit {limit})")]
    Index {
        /// The operation.
        op: &'static str,
        /// The offending index.
        index: usize,
        /// The exclusive upper bound.
        limit: usize,
    },
    /// Host data did not match the declared shape and dtype.
    #[error("host data: {0}")]
    HostData(String),
    /// A device or driver failure (CUDA backend).
    #[error("device: {0}")]
    Device(String),
}

/// Result type of the engine.
pub type Result<T> = std::result::Result<T, EngineError>;
