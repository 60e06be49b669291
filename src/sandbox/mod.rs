//! The embedded SWE sandbox: private workspaces, patch application, isolated and bounded test
//! runs, test-log parsing and SWE-bench-style grading — without Docker.
//!
//! One run ([`runner::run_instance`]): the instance's repository at `base_commit` is written
//! into a private [`workspace::Workspace`] (owned by a dedicated uid when running as root,
//! removed on drop, on panic and on Ctrl-C via [`cleanup`]); the model's change (unified diff
//! or SEARCH/REPLACE blocks) and then the test patch are applied by [`apply`] (exact, then
//! whitespace-insensitive, then context fuzz; paths checked by [`paths`]), checked by the
//! [`integrity`] rule (test infrastructure stripped or refused) and the test patch's files reset
//! to the base commit; the hardened test command from [`testcmd`] runs through
//! [`process::run_jailed`] under the [`isolation`] layers and [`Limits`]; its log is parsed by a [`logparse::LogParser`] and graded by [`grading`].
//! [`pool::run_all`] runs many instances on a bounded number of threads.
//!
//! Isolation layers (see `sorft sandbox check`): always a new session and process group,
//! rlimits, per-run pids and memory cgroups where the host has them, a per-run bounded tmpfs
//! holding the workspace ([`quota`], as root), a reduced environment,
//! closed stdin, capped output and a wall-clock kill of the whole tree; as root a dedicated unprivileged uid per run ([`uid`]); where available new
//! mount/PID/network/IPC/UTS namespaces (with a user namespace when not root), Landlock and a
//! seccomp socket filter.

pub mod apply;
pub mod capture;
pub mod cleanup;
mod error;
pub mod grading;
pub mod integrity;
pub mod isolation;
pub mod limits;
pub mod logparse;
pub mod paths;
pub mod pool;
pub mod predictions;
pub mod process;
pub mod python;
pub mod quota;
pub mod runner;
pub mod testcmd;
pub mod uid;
pub mod workspace;

pub use error::{Result, SandboxError};
pub use limits::Limits;
