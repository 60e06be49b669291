//! Last-resort cleanup: live sandbox process groups and workspaces are registered here, and
//! on SIGINT, SIGTERM or SIGHUP they are killed and removed before the process exits.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, Once};

#[derive(Debug)]
enum Entry {
    Process { pid: u32, uid: Option<u32> },
    Dir(PathBuf),
    Cgroup(PathBuf),
}

static NEXT: AtomicU64 = AtomicU64::new(0);
static LIVE: Mutex<Option<HashMap<u64, Entry>>> = Mutex::new(None);
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// True once SIGINT, SIGTERM or SIGHUP arrived: no new run should start.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Registration of a live resource; unregisters on drop.
#[derive(Debug)]
pub struct Tracked(u64);

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Ok(mut g) = LIVE.lock() {
            if let Some(m) = g.as_mut() {
                m.remove(&self.0);
            }
        }
    }
}

fn track(e: Entry) -> Tracked {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut g) = LIVE.lock() {
        g.get_or_insert_with(HashMap::new).insert(id, e);
    }
    Tracked(id)
}

/// Registers a sandboxed process group (and its uid) to kill on a fatal signal.
pub fn track_process(pid: u32, uid: Option<u32>) -> Tracked {
    track(Entry::Process { pid, uid })
}

/// Registers a workspace directory to remove on a fatal signal.
pub fn track_dir(path: PathBuf) -> Tracked {
    track(Entry::Dir(path))
}

/// Registers a run's cgroup directory: its processes are killed and it is removed on a fatal
/// signal.
pub fn track_cgroup(path: PathBuf) -> Tracked {
    track(Entry::Cgroup(path))
}

/// Kills what is left in a cgroup and removes it, retrying for up to a second.
fn remove_cgroup(dir: &std::path::Path) {
    for _ in 0..200 {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs
            .lines()
            .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
        {
            // SAFETY: signalling members of a cgroup only the sandbox's runs joined.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Kills every registered process group and removes every registered directory and cgroup.
pub fn cleanup_all() {
    let entries: Vec<Entry> = match LIVE.lock() {
        Ok(mut g) => g
            .take()
            .map(|m| m.into_values().collect())
            .unwrap_or_default(),
        Err(_) => return,
    };
    for e in &entries {
        if let Entry::Process { pid, uid } = e {
            // SAFETY: signalling a process group we started.
            unsafe {
                libc::kill(-(*pid as libc::pid_t), libc::SIGKILL);
            }
            if let Some(u) = uid {
                crate::sandbox::uid::kill_all_of_uid(*u);
            }
        }
    }
    for e in entries {
        match e {
            Entry::Dir(p) => {
                // A workspace may be its own tmpfs: detach it first (a no-op otherwise).
                crate::sandbox::quota::unmount(&p);
                let _ = std::fs::remove_dir_all(p);
            }
            Entry::Cgroup(p) => remove_cgroup(&p),
            Entry::Process { .. } => {}
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; `b` lives for the call.
        unsafe {
            libc::write(fd, (&b as *const u8).cast(), 1);
        }
    }
}

/// Installs handlers for SIGINT, SIGTERM and SIGHUP (once per process) that clean up every
/// registered resource and then die of the same signal.
pub fn install_signal_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid two-element buffer.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return;
        }
        SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
        let reader = fds[0];
        let spawned = std::thread::Builder::new()
            .name("sandbox-signals".into())
            .spawn(move || loop {
                let mut b = 0u8;
                // SAFETY: reading one byte into a local.
                let n = unsafe { libc::read(reader, (&mut b as *mut u8).cast(), 1) };
                if n == 1 {
                    // Flag first: a run that sees its process die checks the flag and stops.
                    INTERRUPTED.store(true, Ordering::SeqCst);
                    cleanup_all();
                    // Give the main thread a moment to exit with its own error; catch
                    // anything registered meanwhile, then die of the signal.
                    std::thread::sleep(std::time::Duration::from_millis(300));
                    cleanup_all();
                    // SAFETY: restore the default action and re-raise so the exit status
                    // reports the signal.
                    unsafe {
                        libc::signal(b as libc::c_int, libc::SIG_DFL);
                        libc::raise(b as libc::c_int);
                    }
                } else if n == 0 {
                    return;
                }
            });
        if spawned.is_err() {
            return;
        }
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: installing a handler that only calls write(2).
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as *const () as usize;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    });
}
