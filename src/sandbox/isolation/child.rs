//! What the forked child does between `fork` and `exec`: everything here is prepared in the
//! parent, and [`ChildSetup::apply`] makes only async-signal-safe system calls.

use seccompiler::BpfProgram;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// Namespaces to enter, and the mounts to make inside them.
#[derive(Debug)]
pub(crate) struct NsSetup {
    /// `CLONE_NEW*` flags for `unshare`.
    pub flags: libc::c_int,
    /// Contents for `/proc/self/uid_map` and `gid_map` when a user namespace is created.
    pub id_maps: Option<(Vec<u8>, Vec<u8>)>,
    /// A directory bind-mounted over `/tmp` (needs a mount namespace).
    pub private_tmp: Option<CString>,
}

/// Everything the child applies to itself before `exec`.
#[derive(Debug)]
pub(crate) struct ChildSetup {
    /// `(resource, soft, hard)` for `setrlimit`.
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// Namespaces (with a PID namespace the child forks and becomes its init).
    pub ns: Option<NsSetup>,
    /// Unprivileged `(uid, gid)` to switch to.
    pub creds: Option<(libc::uid_t, libc::gid_t)>,
    /// A Landlock ruleset fd to enforce.
    pub landlock: Option<OwnedFd>,
    /// A seccomp BPF program to install.
    pub seccomp: Option<BpfProgram>,
    /// `cgroup.procs` files of the run's cgroups, joined first (by writing `0`).
    pub cgroup_procs: Vec<CString>,
}

const PROC_SETGROUPS: &[u8] = b"/proc/self/setgroups\0";
const PROC_UID_MAP: &[u8] = b"/proc/self/uid_map\0";
const PROC_GID_MAP: &[u8] = b"/proc/self/gid_map\0";
const SLASH: &[u8] = b"/\0";
const TMP: &[u8] = b"/tmp\0";

fn check(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes `data` to a NUL-terminated path with raw syscalls.
///
/// # Safety
/// `path` must be NUL-terminated.
unsafe fn write_file(path: &[u8], data: &[u8]) -> io::Result<()> {
    let fd = libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
    check(fd as libc::c_long)?;
    let n = libc::write(fd, data.as_ptr().cast(), data.len());
    libc::close(fd);
    if n != data.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl ChildSetup {
    /// Applies the setup to the calling (freshly forked) process.
    ///
    /// # Safety
    /// Must only be called in the child between `fork` and `exec`. It allocates nothing and
    /// calls only async-signal-safe functions; with a PID namespace it forks once more and the
    /// intermediate process never returns (it waits for the namespace's init and `_exit`s with
    /// its status).
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
        // Own session and process group: the parent kills the whole group on timeout.
        check(libc::setsid() as libc::c_long)?;
        // Join the run's cgroups while still privileged and before any fork.
        for procs in &self.cgroup_procs {
            write_file(procs.as_bytes_with_nul(), b"0")?;
        }
        for &(res, soft, hard) in &self.rlimits {
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            check(libc::setrlimit(res, &lim) as libc::c_long)?;
        }
        let mut pid_ns = false;
        if let Some(ns) = &self.ns {
            check(libc::unshare(ns.flags) as libc::c_long)?;
            if let Some((uid_map, gid_map)) = &ns.id_maps {
                write_file(PROC_SETGROUPS, b"deny")?;
                write_file(PROC_UID_MAP, uid_map)?;
                write_file(PROC_GID_MAP, gid_map)?;
            }
            if ns.flags & libc::CLONE_NEWNS != 0 {
                // Nothing mounted here propagates back to the host.
                check(libc::mount(
                    std::ptr::null(),
                    SLASH.as_ptr().cast(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) as libc::c_long)?;
                if let Some(tmp) = &ns.private_tmp {
                    check(libc::mount(
                        tmp.as_ptr(),
                        TMP.as_ptr().cast(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ) as libc::c_long)?;
                }
            }
            if ns.flags & libc::CLONE_NEWPID != 0 {
                pid_ns = true;
                let pid = libc::fork();
                check(pid as libc::c_long)?;
                if pid > 0 {
                    intermediate(pid);
                }
            }
        }
        if let Some((uid, gid)) = self.creds {
            check(libc::setgroups(0, std::ptr::null()) as libc::c_long)?;
            check(libc::setresgid(gid, gid, gid) as libc::c_long)?;
            check(libc::setresuid(uid, uid, uid) as libc::c_long)?;
        }
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long)?;
        if let Some(fd) = &self.landlock {
            check(libc::syscall(
                libc::SYS_landlock_restrict_self,
                fd.as_raw_fd(),
                0u32,
            ))?;
        }
        if let Some(prog) = &self.seccomp {
            seccompiler::apply_filter(prog)
                .map_err(|_| io::Error::from_raw_os_error(libc::EPERM))?;
        }
        if pid_ns {
            // If the intermediate dies, the namespace's init (and with it every process in
            // the namespace) dies too. Set after the uid change, which clears it.
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) as libc::c_long)?;
        }
        Ok(())
    }
}

/// The process between the parent and the PID namespace's init: it holds no descriptors but
/// stdio, waits for init, and exits the way init did.
///
/// # Safety
/// Only async-signal-safe calls; never returns.
unsafe fn intermediate(child: libc::pid_t) -> ! {
    // Drop every inherited descriptor above stdio, notably std's exec-status pipe, so the
    // parent's `spawn` returns as soon as init has exec'd.
    if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
        for fd in 3..4096 {
            libc::close(fd);
        }
    }
    let mut status: libc::c_int = 0;
    loop {
        let r = libc::waitpid(child, &mut status, 0);
        if r == child {
            break;
        }
        if r < 0 && *libc::__errno_location() != libc::EINTR {
            libc::_exit(127);
        }
    }
    if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        libc::signal(sig, libc::SIG_DFL);
        libc::kill(libc::getpid(), sig);
        libc::_exit(128 + sig);
    }
    libc::_exit(libc::WEXITSTATUS(status))
}
