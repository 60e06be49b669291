//! Dedicated sandbox uids: one per concurrent run, reserved across processes with `flock`,
//! so that RLIMIT_NPROC (counted per uid) and the final sweep (`kill(-1)` as that uid) never
//! touch another run's or the host's processes.

use crate::sandbox::error::{Result, SandboxError};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

/// First uid (and gid) handed to sandboxes; far above ordinary system and user ids.
pub const UID_BASE: u32 = 61_000;
/// Number of uid slots (concurrent runs across all processes on the host).
pub const UID_SLOTS: u32 = 512;

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("sorft-sandbox-uids")
}

/// A reserved uid/gid pair; released (after a final sweep) on drop.
#[derive(Debug)]
pub struct UidSlot {
    /// The unprivileged uid the run executes as.
    pub uid: u32,
    /// Its gid (same number).
    pub gid: u32,
    _lock: File,
}

impl UidSlot {
    /// Reserves a free slot, sweeping any process left over from a crashed earlier holder.
    pub fn acquire() -> Result<UidSlot> {
        let dir = lock_dir();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| SandboxError::io(format!("creating {}", dir.display()), e))?;
        // Start at a per-process offset so concurrent processes rarely contend.
        let start = std::process::id() % UID_SLOTS;
        for i in 0..UID_SLOTS {
            let n = (start + i) % UID_SLOTS;
            let path = dir.join(n.to_string());
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| SandboxError::io(format!("opening {}", path.display()), e))?;
            // SAFETY: flock on a descriptor we own; no memory is passed.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                let uid = UID_BASE + n;
                kill_all_of_uid(uid);
                return Ok(UidSlot {
                    uid,
                    gid: uid,
                    _lock: file,
                });
            }
        }
        Err(SandboxError::NoUidSlot(UID_SLOTS))
    }
}

impl Drop for UidSlot {
    fn drop(&mut self) {
        kill_all_of_uid(self.uid);
    }
}

/// Kills every process whose real or saved uid is `uid`, repeating until none is left
/// (a fork bomb may fork between two sweeps). Needs root; a no-op otherwise.
pub fn kill_all_of_uid(uid: u32) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || uid == 0 {
        return false;
    }
    // SAFETY: the child makes only async-signal-safe calls (setresuid, kill, nanosleep,
    // _exit) and never returns into Rust code.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            if libc::setresuid(uid, uid, uid) != 0 {
                libc::_exit(2);
            }
            // kill(-1) as `uid` reaches exactly the processes of `uid` (not itself).
            let pause = libc::timespec {
                tv_sec: 0,
                tv_nsec: 2_000_000,
            };
            for _ in 0..50 {
                if libc::kill(-1, libc::SIGKILL) != 0 {
                    libc::_exit(0);
                }
                libc::nanosleep(&pause, std::ptr::null_mut());
            }
            libc::_exit(1);
        }
        if pid < 0 {
            return false;
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if *libc::__errno_location() != libc::EINTR {
                return false;
            }
        }
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}
