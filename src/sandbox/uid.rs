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
                // Leftovers of a crashed earlier holder: one pass kills them all (dumpable or
                // not); wait until the visible ones are gone.
                kill_pass(uid);
                for _ in 0..200 {
                    if !any_dumpable_process_of(uid) {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    kill_pass(uid);
                }
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
        // Runs sweep thoroughly themselves; this pass is the last guard before the uid is
        // handed to another run (which sweeps thoroughly on acquire, too).
        kill_pass(self.uid);
    }
}

/// True when a live process of effective uid `uid` owns its `/proc` entry (a quick check that
/// reads no file for other users' processes).
fn any_dumpable_process_of(uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        e.metadata().is_ok_and(|m| m.uid() == uid)
            && e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
            && std::fs::read_to_string(e.path().join("stat")).is_ok_and(|st| {
                st.rsplit_once(')')
                    .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
            })
    })
}

/// Live (non-zombie) processes with `uid` as real, effective or saved uid, from `/proc`
/// (the `Uid:` line, which stays right for processes that made themselves non-dumpable).
pub fn processes_of(uid: u32) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let mut out = vec![];
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // /proc/<pid> belongs to the effective uid, or to root for a non-dumpable process.
        if !e.metadata().is_ok_and(|m| m.uid() == uid || m.uid() == 0) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let mut ours = false;
        let mut zombie = false;
        for line in status.lines() {
            if let Some(rest) = line.strip_prefix("State:") {
                zombie = rest.trim_start().starts_with(['Z', 'X']);
            } else if let Some(rest) = line.strip_prefix("Uid:") {
                let ids: Vec<u32> = rest
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                ours = ids.iter().take(3).any(|&u| u == uid);
                break;
            }
        }
        if ours && !zombie {
            out.push(pid);
        }
    }
    out
}

/// Kills every process of `uid` (real or saved uid), repeating until none is left: a fork
/// bomb may fork between two passes. Needs root; returns false when processes remain.
pub fn kill_all_of_uid(uid: u32) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || uid == 0 {
        return false;
    }
    // One pass unconditionally (it is cheap), then repeat while anything is left.
    kill_pass(uid);
    for _ in 0..200 {
        if processes_of(uid).is_empty() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        kill_pass(uid);
    }
    processes_of(uid).is_empty()
}

/// One `kill(-1, SIGKILL)` issued as `uid` (root only): the kernel signals, in one sweep, exactly the
/// processes that `uid` may signal (its own), never the caller.
pub fn kill_pass(uid: u32) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || uid == 0 {
        return;
    }
    // SAFETY: the child makes only async-signal-safe calls (setresuid, kill, _exit) and never
    // returns into Rust code.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            if libc::setresuid(uid, uid, uid) != 0 {
                libc::_exit(2);
            }
            libc::kill(-1, libc::SIGKILL);
            libc::_exit(0);
        }
        if pid < 0 {
            return;
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if *libc::__errno_location() != libc::EINTR {
                return;
            }
        }
    }
}
