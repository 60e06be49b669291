//! The embedded SWE sandbox: private workspaces, patch application, isolated and bounded test
//! runs, test-log parsing and SWE-bench-style grading — without Docker.

pub mod apply;
pub mod capture;
pub mod cleanup;
mod error;
pub mod grading;
pub mod isolation;
pub mod limits;
pub mod logparse;
pub mod paths;
pub mod pool;
pub mod predictions;
pub mod process;
pub mod python;
pub mod runner;
pub mod testcmd;
pub mod uid;
pub mod workspace;

pub use error::{Result, SandboxError};
pub use limits::Limits;
