//! Errors of the model layer.

use std::path::PathBuf;

use crate::engine::EngineError;

/// An error loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file had invalid content; `field` names what was wrong.
    #[error("{path}: {field}: {msg}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field or tensor.
        field: String,
        /// What is wrong.
        msg: String,
    },
    /// The model's architecture is not one sorft runs.
    #[error("{path}: unsupported architecture: {msg}")]
    Unsupported {
        /// The config file.
        path: PathBuf,
        /// What is unsupported.
        msg: String,
    },
    /// Bad arguments to a model call (token ids out of range, too long, ...).
    #[error("{0}")]
    Input(String),
    /// A backend operation failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl ModelError {
    /// An `Invalid` error.
    pub fn invalid(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        msg: impl Into<String>,
    ) -> Self {
        ModelError::Invalid {
            path: path.into(),
            field: field.into(),
            msg: msg.into(),
        }
    }

    /// An `Io` error.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Result type of the model layer.
pub type Result<T> = std::result::Result<T, ModelError>;
