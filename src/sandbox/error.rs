//! The sandbox's error type.

use std::path::PathBuf;

/// Everything that can go wrong in the sandbox, as one-line messages.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A filesystem or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path or process.
        context: String,
        /// The underlying OS error.
        source: std::io::Error,
    },
    /// An isolation layer was requested but cannot be set up on this host.
    #[error("isolation layer {layer} unavailable: {reason}")]
    Layer {
        /// The layer's name as listed by `sorft sandbox check`.
        layer: &'static str,
        /// Why it is unavailable.
        reason: String,
    },
    /// No usable Python interpreter was found or the named one is unusable.
    #[error("python interpreter: {0}")]
    Interpreter(String),
    /// A patch touches a path outside the repository or inside `.git/`.
    #[error("refused path {path:?}: {reason}")]
    UnsafePath {
        /// The path as written in the patch.
        path: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A patch could not be applied.
    #[error("patch does not apply: {0}")]
    Apply(String),
    /// An input file (instances, predictions, command table) is malformed.
    #[error("{file}: {message}")]
    Input {
        /// The file that was read.
        file: PathBuf,
        /// What is wrong, naming the line or field.
        message: String,
    },
    /// A fatal signal (Ctrl-C) arrived; no new run starts.
    #[error("interrupted")]
    Interrupted,
    /// No free sandbox uid slot could be reserved.
    #[error("no free sandbox uid slot (all {0} in use)")]
    NoUidSlot(u32),
}

impl SandboxError {
    /// Wraps an I/O error with a description of what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        SandboxError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result type of the sandbox module.
pub type Result<T> = std::result::Result<T, SandboxError>;
