//! Resource limits of one sandboxed run.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Bounds applied to every sandboxed process tree.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Limits {
    /// Wall-clock time after which the whole tree is killed.
    #[serde(with = "secs_f64")]
    pub wall: Duration,
    /// RLIMIT_CPU, in CPU seconds per process (SIGXCPU at the soft limit).
    pub cpu_secs: u64,
    /// Memory bound in bytes: the run's memory cgroup limit where one is available (memory
    /// used by the whole run), else RLIMIT_AS (address space per process).
    pub address_space: u64,
    /// Processes and threads of the run: `pids.max` of its pids cgroup, and RLIMIT_NPROC of
    /// its dedicated uid.
    pub nproc: u64,
    /// RLIMIT_FSIZE: largest file the run may write, in bytes.
    pub file_size: u64,
    /// RLIMIT_NOFILE: open file descriptors per process.
    pub open_files: u64,
    /// Bytes of combined stdout+stderr kept (the tail).
    pub output_tail: usize,
    /// Total output bytes after which the run is killed.
    pub output_total: u64,
    /// Total bytes a run's workspace may hold (repository copy, writes, `/tmp`): the size of
    /// its own tmpfs, where one can be mounted.
    #[serde(default = "default_workspace_bytes")]
    pub workspace_bytes: u64,
    /// Total files (inodes) a run's workspace may hold: its tmpfs's `nr_inodes`.
    #[serde(default = "default_workspace_files")]
    pub workspace_files: u64,
}

fn default_workspace_bytes() -> u64 {
    2 << 30
}

fn default_workspace_files() -> u64 {
    200_000
}

impl Limits {
    /// The workspace storage bounds of these limits.
    pub fn quota(&self) -> crate::sandbox::quota::Quota {
        crate::sandbox::quota::Quota {
            bytes: self.workspace_bytes,
            files: self.workspace_files,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            wall: Duration::from_secs(300),
            cpu_secs: 300,
            address_space: 4 << 30,
            nproc: 512,
            file_size: 256 << 20,
            open_files: 1024,
            output_tail: 2 << 20,
            output_total: 64 << 20,
            workspace_bytes: default_workspace_bytes(),
            workspace_files: default_workspace_files(),
        }
    }
}

mod secs_f64 {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = f64::deserialize(d)?;
        if !(v.is_finite() && v >= 0.0) {
            return Err(serde::de::Error::custom(
                "wall time must be a non-negative number",
            ));
        }
        Ok(Duration::from_secs_f64(v))
    }
}
