//! Running one command inside the jail: spawn with the isolation setup, capture output with a
//! cap, enforce the wall-clock limit, and kill the whole tree afterwards.

use crate::sandbox::capture::{CapturedOutput, TailBuffer};
use crate::sandbox::error::{Result, SandboxError};
use crate::sandbox::isolation::{self, ActiveLayers, JailPaths, Policy};
use crate::sandbox::limits::Limits;
use crate::sandbox::uid::{kill_all_of_uid, kill_pass};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A command to run in the jail.
#[derive(Clone, Debug)]
pub struct JailCommand {
    /// Program (absolute path).
    pub program: PathBuf,
    /// Arguments.
    pub args: Vec<OsString>,
    /// Extra environment on top of the reduced base environment.
    pub env: Vec<(OsString, OsString)>,
    /// Bytes readable on stdin (at most 4 KiB, fits a pipe); `None` for `/dev/null`.
    pub stdin: Option<Vec<u8>>,
}

/// A stdin carrying `data`: a pipe whose write end is filled and closed before the spawn.
fn stdin_with(data: Option<&[u8]>) -> Result<Stdio> {
    let Some(data) = data else {
        return Ok(Stdio::null());
    };
    if data.len() > 4096 {
        return Err(SandboxError::io(
            "stdin for the sandboxed process",
            std::io::Error::other("more than 4 KiB"),
        ));
    }
    let (r, w) = pipe()?;
    // The read end was made non-blocking for the output pipe's sake; stdin must block.
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let fl = libc::fcntl(r.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(r.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    let mut f = std::fs::File::from(w);
    std::io::Write::write_all(&mut f, data)
        .map_err(|e| SandboxError::io("writing stdin for the sandboxed process", e))?;
    drop(f);
    Ok(Stdio::from(r))
}

/// How a run ended.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum ExitKind {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
}

/// A limit that stopped or constrained the run.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LimitHit {
    /// The wall-clock timeout killed the tree.
    WallTime,
    /// RLIMIT_CPU (SIGXCPU or SIGKILL at the hard limit).
    CpuTime,
    /// RLIMIT_FSIZE (SIGXFSZ).
    FileSize,
    /// More output than `output_total`; the tree was killed.
    Output,
    /// The memory cgroup's OOM killer, or RLIMIT_AS inferred from the log (`MemoryError`,
    /// `Cannot allocate memory`).
    Memory,
    /// The pids cgroup refused a fork, or RLIMIT_NPROC inferred from the log.
    Processes,
}

/// The outcome of one jailed command.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ProcessOutcome {
    /// Exit code or signal of the top process.
    pub exit: ExitKind,
    /// Wall-clock time from spawn to the tree being gone.
    pub wall_secs: f64,
    /// Limits that were hit.
    pub limits_hit: Vec<LimitHit>,
    /// Combined stdout+stderr (tail).
    pub output: CapturedOutput,
    /// Layers active for the run.
    pub layers: ActiveLayers,
    /// True when a process kept the output pipe open after the tree was killed (only possible
    /// without uid drop and namespaces).
    pub leftover_writer: bool,
}

impl ProcessOutcome {
    /// True for exit code 0.
    pub fn success(&self) -> bool {
        self.exit == ExitKind::Exited(0)
    }
}

/// Base environment: everything else is dropped.
fn base_env(paths: &JailPaths, cmd: &JailCommand) -> Vec<(OsString, OsString)> {
    let mut path = OsString::new();
    if let Some(dir) = cmd.program.parent() {
        path.push(dir.as_os_str());
        path.push(":");
    }
    path.push("/usr/local/bin:/usr/bin:/bin");
    vec![
        ("PATH".into(), path),
        ("HOME".into(), paths.tmp.clone().into_os_string()),
        ("TMPDIR".into(), paths.tmp.clone().into_os_string()),
        ("LANG".into(), "C.UTF-8".into()),
        ("LC_ALL".into(), "C.UTF-8".into()),
        ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ("PYTHONUNBUFFERED".into(), "1".into()),
        ("PYTHONHASHSEED".into(), "0".into()),
        ("PYTHONNOUSERSITE".into(), "1".into()),
    ]
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid two-element buffer.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(SandboxError::io(
            "creating output pipe",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: pipe2 returned two fresh descriptors that we now own.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on an fd we own.
    unsafe {
        let fl = libc::fcntl(r.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(r.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    Ok((r, w))
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
    // SAFETY: a non-negative return is a new descriptor we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Reads what is available; returns false at end of file.
fn drain(fd: &OwnedFd, buf: &mut [u8], sink: &mut TailBuffer) -> bool {
    loop {
        // SAFETY: reading into a buffer we own, of its length.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            sink.push(&buf[..n as usize]);
            continue;
        }
        if n == 0 {
            return false;
        }
        let err = std::io::Error::last_os_error();
        return err.raw_os_error() == Some(libc::EINTR)
            || err.kind() == std::io::ErrorKind::WouldBlock;
    }
}

fn poll2(a: &OwnedFd, b: Option<&OwnedFd>, timeout: Duration) -> (bool, bool) {
    let mut fds = [
        libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b.map_or(-1, |f| f.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout.as_millis().clamp(0, 10_000) as i32;
    // SAFETY: `fds` is a valid array of two pollfd structs.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if rc <= 0 {
        return (false, false);
    }
    (fds[0].revents != 0, fds[1].revents != 0)
}

/// Kills the child's process group; call before reaping the child, so its pid (the group id)
/// cannot have been reused.
fn kill_group(child: &Child) {
    // SAFETY: kill with a negative pid signals the process group led by the child (it called
    // setsid); the child is not yet reaped.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
    }
}

/// Waits for `pid` (blocking, or not with `nohang`): its raw status and CPU seconds used by it
/// and the descendants it reaped. `Ok(None)` when `nohang` and it is still running.
fn wait4(pid: u32, nohang: bool) -> std::io::Result<Option<(libc::c_int, f64)>> {
    loop {
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value for the kernel to overwrite.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let flags = if nohang { libc::WNOHANG } else { 0 };
        // SAFETY: `status` and `ru` are valid out-pointers; `pid` is our unreaped child.
        let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, flags, &mut ru) };
        if r == pid as libc::pid_t {
            let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            return Ok(Some((status, secs(ru.ru_utime) + secs(ru.ru_stime))));
        }
        if r == 0 {
            return Ok(None);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Runs `cmd` in `paths.repo` under `policy` and `limits`, as `uid` when given.
pub fn run_jailed(
    cmd: &JailCommand,
    paths: &JailPaths,
    policy: &Policy,
    limits: &Limits,
    uid: Option<(u32, u32)>,
) -> Result<ProcessOutcome> {
    if crate::sandbox::cleanup::interrupted() {
        return Err(SandboxError::Interrupted);
    }
    let (setup, layers, cgroup) = isolation::prepare(policy, limits, uid, paths)?;
    let dropped_uid = layers.uid;
    let pid_namespace = layers.namespaces;
    let (read_end, write_end) = pipe()?;
    let write2 = write_end
        .try_clone()
        .map_err(|e| SandboxError::io("duplicating output pipe", e))?;
    let mut command = Command::new(&cmd.program);
    command
        .args(&cmd.args)
        .current_dir(&paths.repo)
        .env_clear()
        .envs(base_env(paths, cmd))
        .envs(cmd.env.iter().cloned())
        .stdin(stdin_with(cmd.stdin.as_deref())?)
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::from(write2));
    isolation::attach(&mut command, setup);
    let start = Instant::now();
    let child = command.spawn().map_err(|e| {
        SandboxError::io(
            format!("starting {} in the sandbox", cmd.program.display()),
            e,
        )
    })?;
    // The parent's copies of the write end were moved into `command`; drop them now so that
    // end of file arrives once the tree is gone.
    drop(command);
    let _guard = crate::sandbox::cleanup::track_process(child.id(), dropped_uid);
    let pidfd = pidfd_open(child.id());
    let mut sink = TailBuffer::new(limits.output_tail);
    let mut buf = vec![0u8; 64 << 10];
    let mut limits_hit = Vec::new();
    let deadline = start + limits.wall;
    let mut open = true;
    let status = loop {
        let now = Instant::now();
        if now >= deadline {
            limits_hit.push(LimitHit::WallTime);
            kill_group(&child);
            break wait4(child.id(), false);
        }
        let wait = (deadline - now).min(if pidfd.is_some() {
            Duration::from_secs(10)
        } else {
            Duration::from_millis(5)
        });
        let (readable, exited) = if open {
            poll2(&read_end, pidfd.as_ref(), wait)
        } else if let Some(p) = &pidfd {
            let (r, _) = poll2(p, None, wait);
            (false, r)
        } else {
            std::thread::sleep(wait);
            (false, false)
        };
        if readable {
            open = drain(&read_end, &mut buf, &mut sink);
            if sink.total() > limits.output_total {
                limits_hit.push(LimitHit::Output);
                kill_group(&child);
                break wait4(child.id(), false);
            }
        }
        if exited {
            // The top process is a zombie: kill the rest of its group, then reap it.
            kill_group(&child);
            break wait4(child.id(), false);
        }
        if pidfd.is_none() {
            match wait4(child.id(), true) {
                Ok(Some(done)) => {
                    // Reaped: the group id stays reserved while members remain.
                    kill_group(&child);
                    break Ok(Some(done));
                }
                Err(e) => break Err(e),
                Ok(None) => {}
            }
        }
    };
    let (status, cpu_secs) = status
        .map_err(|e| SandboxError::io("waiting for the sandboxed process", e))?
        .unwrap_or((0, 0.0));
    // Whatever is left in the run's cgroups is killed (this also reaches processes that
    // changed their session, group or, without a uid drop, were never ours to enumerate).
    cgroup.kill_all();
    let events = cgroup.events();
    // Whatever is left in the group or of the uid is killed; now collect the rest of the
    // output, giving up after a short grace if some process outside our reach holds the pipe.
    if let Some(u) = dropped_uid {
        if pid_namespace && limits_hit.is_empty() {
            // The run ended by itself: its init exited only after every process of the PID
            // namespace was gone, so one pass guards against the impossible. (When we killed
            // the tree, processes may still be dying: sweep until they are gone.)
            kill_pass(u);
        } else {
            kill_all_of_uid(u);
        }
    }
    let grace = Instant::now() + Duration::from_millis(200);
    let mut leftover_writer = false;
    while open {
        let now = Instant::now();
        if now >= grace {
            leftover_writer = true;
            break;
        }
        let (readable, _) = poll2(&read_end, None, grace - now);
        if readable {
            open = drain(&read_end, &mut buf, &mut sink);
        }
    }
    let exit = if libc::WIFSIGNALED(status) {
        ExitKind::Signaled(libc::WTERMSIG(status))
    } else {
        ExitKind::Exited(libc::WEXITSTATUS(status))
    };
    match exit {
        ExitKind::Signaled(libc::SIGXFSZ) => limits_hit.push(LimitHit::FileSize),
        // A PID namespace's init ignores SIGXCPU and dies of SIGKILL at the hard limit.
        ExitKind::Signaled(libc::SIGXCPU | libc::SIGKILL)
            if limits_hit.is_empty() && cpu_secs + 0.05 >= limits.cpu_secs as f64 =>
        {
            limits_hit.push(LimitHit::CpuTime)
        }
        _ => {}
    }
    let output = sink.finish();
    if events.oom_kills > 0
        || output.tail.contains("MemoryError")
        || output.tail.contains("Cannot allocate memory")
    {
        limits_hit.push(LimitHit::Memory);
    }
    if events.pids_refused > 0
        || output.tail.contains("Cannot fork")
        || output.tail.contains("fork: Resource temporarily")
    {
        limits_hit.push(LimitHit::Processes);
    }
    drop(cgroup);
    Ok(ProcessOutcome {
        exit,
        wall_secs: start.elapsed().as_secs_f64(),
        limits_hit,
        output,
        layers,
        leftover_writer,
    })
}
