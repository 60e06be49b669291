//! Errors of the training engine.

use std::path::PathBuf;

use crate::engine::EngineError;
use crate::model::ModelError;

/// An error raised while training, loading data or handling checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
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
        /// The field (or `line N`).
        field: String,
        /// What is wrong.
        msg: String,
    },
    /// A checkpoint failed verification.
    #[error("checkpoint {path} is corrupt: {msg}")]
    Corrupt {
        /// The checkpoint directory.
        path: PathBuf,
        /// What failed.
        msg: String,
    },
    /// Bad arguments or options.
    #[error("{0}")]
    Input(String),
    /// A model error.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A backend error.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl TrainError {
    /// An `Io` error.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.into(),
            source,
        }
    }

    /// An `Invalid` error.
    pub fn invalid(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        msg: impl Into<String>,
    ) -> Self {
        TrainError::Invalid {
            path: path.into(),
            field: field.into(),
            msg: msg.into(),
        }
    }
}

/// Result type of the training engine.
pub type Result<T> = std::result::Result<T, TrainError>;
