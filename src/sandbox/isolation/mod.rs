//! Isolation layers: detected on the host at run time, chosen by a [`Policy`], and turned into
//! the child-side setup of one run.
//!
//! Always: own session and process group, rlimits, a reduced environment, stdin closed, output
//! captured with a cap, a wall-clock timeout that kills the tree. As root: a dedicated
//! unprivileged uid per run. Where the kernel allows: new mount, PID, network, IPC and UTS
//! namespaces (a user namespace too when not root), Landlock and seccomp.

pub mod cgroup;
pub(crate) mod child;
pub mod landlock;
pub mod seccomp;

use crate::sandbox::error::Result;
use crate::sandbox::limits::Limits;
use child::{ChildSetup, NsSetup};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Namespaces entered when available (plus `CLONE_NEWUSER` when not root).
const NS_FLAGS: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// What this host supports, probed once per process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HostSupport {
    /// Running as root, so runs can drop to a dedicated uid.
    pub root: bool,
    /// Dropping to an unprivileged uid works (`Err` says why not).
    pub uid_drop: std::result::Result<(), String>,
    /// New mount/PID/net/IPC/UTS namespaces can be created (with a user namespace when not root).
    pub namespaces: std::result::Result<(), String>,
    /// Landlock ABI version, when available.
    pub landlock: std::result::Result<i32, String>,
    /// Seccomp filters can be installed.
    pub seccomp: std::result::Result<(), String>,
}

impl HostSupport {
    /// The host's support, probed on first use (each probe spawns `/bin/true` once).
    pub fn get() -> &'static HostSupport {
        static HOST: OnceLock<HostSupport> = OnceLock::new();
        HOST.get_or_init(HostSupport::probe)
    }

    fn probe() -> HostSupport {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let uid_drop = if root {
            probe_spawn(ChildSetup {
                creds: Some((crate::sandbox::uid::UID_BASE, crate::sandbox::uid::UID_BASE)),
                ..ChildSetup::empty()
            })
        } else {
            Err("not running as root (the run keeps the caller's uid)".into())
        };
        let namespaces = match ns_setup(root, None) {
            Ok(ns) => probe_spawn(ChildSetup {
                ns: Some(ns),
                ..ChildSetup::empty()
            }),
            Err(e) => Err(e.to_string()),
        };
        let landlock = match landlock::kernel_abi() {
            None => Err("kernel has no Landlock (or it is disabled at boot)".into()),
            Some(v) => landlock::build_ruleset(v, &landlock::FsRules::default())
                .map_err(|e| e.to_string())
                .and_then(|fd| {
                    // A ruleset with no rules denies every file access, exec included, so the
                    // probe must fail with EACCES exactly when Landlock is enforced.
                    match probe_spawn(ChildSetup {
                        landlock: Some(fd),
                        ..ChildSetup::empty()
                    }) {
                        Err(e) if e.contains("denied") => Ok(v),
                        Err(e) => Err(e),
                        Ok(()) => Err("ruleset was not enforced".into()),
                    }
                }),
        };
        let seccomp = if !seccomp::kernel_supports() {
            Err("kernel has no seccomp".into())
        } else {
            seccomp::socket_filter()
                .map_err(|e| e.to_string())
                .and_then(|prog| {
                    probe_spawn(ChildSetup {
                        seccomp: Some(prog),
                        ..ChildSetup::empty()
                    })
                })
        };
        HostSupport {
            root,
            uid_drop,
            namespaces,
            landlock,
            seccomp,
        }
    }
}

fn probe_spawn(setup: ChildSetup) -> std::result::Result<(), String> {
    let mut cmd = Command::new("/bin/true");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .env_clear();
    // SAFETY: `apply` only makes async-signal-safe calls (see its contract).
    unsafe {
        cmd.pre_exec(move || setup.apply());
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("probe exited with {s}")),
        Err(e) => Err(e.to_string()),
    }
}

impl ChildSetup {
    fn empty() -> ChildSetup {
        ChildSetup {
            rlimits: Vec::new(),
            ns: None,
            creds: None,
            landlock: None,
            seccomp: None,
            cgroup_procs: Vec::new(),
        }
    }
}

fn ns_setup(root: bool, private_tmp: Option<&Path>) -> Result<NsSetup> {
    let private_tmp = private_tmp
        .map(|p| CString::new(p.as_os_str().as_bytes()))
        .transpose()
        .map_err(|_| crate::sandbox::error::SandboxError::Layer {
            layer: "namespaces",
            reason: "temp path contains a NUL byte".into(),
        })?;
    if root {
        return Ok(NsSetup {
            flags: NS_FLAGS,
            id_maps: None,
            private_tmp,
        });
    }
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    Ok(NsSetup {
        flags: NS_FLAGS | libc::CLONE_NEWUSER,
        id_maps: Some((
            format!("{uid} {uid} 1").into_bytes(),
            format!("{gid} {gid} 1").into_bytes(),
        )),
        private_tmp,
    })
}

/// Which layers a run should use. `true` means "use it when the host supports it".
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Policy {
    /// Drop to a dedicated unprivileged uid (root only).
    pub uid_drop: bool,
    /// Enter new mount/PID/net/IPC/UTS namespaces.
    pub namespaces: bool,
    /// Enforce Landlock filesystem/TCP/signal rules.
    pub landlock: bool,
    /// Install the seccomp socket filter.
    pub seccomp: bool,
    /// Fail instead of running with fewer layers than requested.
    pub require_all: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            uid_drop: true,
            namespaces: true,
            landlock: true,
            seccomp: true,
            require_all: false,
        }
    }
}

/// The layers actually active for one run (recorded in every result).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ActiveLayers {
    /// The uid the run executed as, when dropped.
    pub uid: Option<u32>,
    /// New namespaces were entered.
    pub namespaces: bool,
    /// The workspace's temp dir is mounted on `/tmp`.
    pub private_tmp: bool,
    /// Landlock ABI enforced.
    pub landlock_abi: Option<i32>,
    /// Seccomp socket filter installed.
    pub seccomp: bool,
    /// Requested layers the host lacks, with the reason.
    pub missing: Vec<String>,
    /// The run's pids and memory cgroups.
    #[serde(default)]
    pub cgroups: cgroup::CgroupLimits,
    /// RLIMIT_AS in bytes, when set (not with a memory cgroup).
    #[serde(default)]
    pub address_space: Option<u64>,
    /// RLIMIT_NPROC of the run's uid.
    #[serde(default)]
    pub nproc: u64,
}

/// Paths of one run's jail.
#[derive(Clone, Debug)]
pub struct JailPaths {
    /// The working directory (the repository copy); writable.
    pub repo: PathBuf,
    /// The private temp directory (also `HOME`); writable, mounted on `/tmp` with namespaces.
    pub tmp: PathBuf,
    /// Extra trees that may be read (interpreter prefix, virtualenv).
    pub read: Vec<PathBuf>,
}

/// System trees every run may read.
pub const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/etc",
    "/proc",
    "/dev",
    "/sys/devices/system/cpu",
];

/// Device files every run may write.
const DEV_WRITE: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// Builds the child setup for one run and reports which layers it activates; the run's cgroups
/// (removed when dropped) come with it.
pub(crate) fn prepare(
    policy: &Policy,
    limits: &Limits,
    uid: Option<(u32, u32)>,
    paths: &JailPaths,
) -> Result<(ChildSetup, ActiveLayers, cgroup::RunCgroup)> {
    let host = HostSupport::get();
    let mut active = ActiveLayers::default();
    let missing = |layer: &str, why: &str| format!("{layer}: {why}");
    let mut missing_list = Vec::new();

    let creds = match (policy.uid_drop, &host.uid_drop, uid) {
        (true, Ok(()), Some(ids)) => Some(ids),
        (true, Err(e), _) => {
            missing_list.push(missing("uid-drop", e));
            None
        }
        _ => None,
    };
    let ns = match (policy.namespaces, &host.namespaces) {
        (true, Ok(())) => {
            // Covering /tmp would hide a workspace that lives under it.
            let private_tmp = !paths.repo.starts_with("/tmp");
            if !private_tmp {
                missing_list.push(missing(
                    "private-tmp",
                    "the workspace is under /tmp (use a work dir elsewhere, e.g. /var/tmp)",
                ));
            }
            active.private_tmp = private_tmp;
            Some(ns_setup(
                host.root,
                private_tmp.then_some(paths.tmp.as_path()),
            )?)
        }
        (true, Err(e)) => {
            missing_list.push(missing("namespaces", e));
            None
        }
        _ => None,
    };
    let landlock = match (policy.landlock, &host.landlock) {
        (true, Ok(abi)) => {
            let mut read: Vec<PathBuf> = SYSTEM_READ.iter().map(PathBuf::from).collect();
            read.extend(paths.read.iter().cloned());
            let mut write = vec![paths.repo.clone(), paths.tmp.clone()];
            write.extend(DEV_WRITE.iter().map(PathBuf::from));
            let fd = landlock::build_ruleset(*abi, &landlock::FsRules { read, write })?;
            active.landlock_abi = Some(*abi);
            Some(fd)
        }
        (true, Err(e)) => {
            missing_list.push(missing("landlock", e));
            None
        }
        _ => None,
    };
    let seccomp = match (policy.seccomp, &host.seccomp) {
        (true, Ok(())) => Some(seccomp::socket_filter()?),
        (true, Err(e)) => {
            missing_list.push(missing("seccomp", e));
            None
        }
        _ => None,
    };
    if policy.require_all && !missing_list.is_empty() {
        return Err(crate::sandbox::error::SandboxError::Layer {
            layer: "required",
            reason: missing_list.join("; "),
        });
    }
    // With a uid drop but no namespaces, leftover processes of other ids are not ours to
    // count; without a uid drop the caller's processes share RLIMIT_NPROC, so add them.
    let nproc = if creds.is_some() || host.root {
        limits.nproc
    } else {
        limits.nproc + count_processes_of_current_uid()
    };
    let (cg, cg_limits) = cgroup::RunCgroup::create(limits.nproc, limits.address_space);
    // With a memory cgroup bounding what is used, no address-space limit: it breaks thread-
    // and mmap-heavy programs that reserve much more than they touch.
    let address_space = cg_limits
        .memory_max
        .is_none()
        .then_some(limits.address_space);
    let as_limit = address_space.unwrap_or(libc::RLIM_INFINITY);
    let rlimits = vec![
        (libc::RLIMIT_CPU, limits.cpu_secs, limits.cpu_secs + 1),
        (libc::RLIMIT_AS, as_limit, as_limit),
        (libc::RLIMIT_NPROC, nproc, nproc),
        (libc::RLIMIT_FSIZE, limits.file_size, limits.file_size),
        (libc::RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (libc::RLIMIT_CORE, 0, 0),
    ];
    active.uid = creds.map(|(u, _)| u);
    active.namespaces = ns.is_some();
    active.seccomp = seccomp.is_some();
    active.missing = missing_list;
    active.address_space = address_space;
    active.nproc = nproc;
    active.cgroups = cg_limits;
    Ok((
        ChildSetup {
            rlimits,
            ns,
            creds,
            landlock,
            seccomp,
            cgroup_procs: cg.procs_files(),
        },
        active,
        cg,
    ))
}

fn count_processes_of_current_uid() -> u64 {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for e in dir.flatten() {
        use std::os::unix::fs::MetadataExt;
        if e.file_name().as_bytes().iter().all(u8::is_ascii_digit) {
            if let Ok(m) = e.metadata() {
                if m.uid() == uid {
                    n += 1;
                }
            }
        }
    }
    n
}

/// Attaches the setup to a command as its `pre_exec` hook.
pub(crate) fn attach(cmd: &mut Command, setup: ChildSetup) {
    // SAFETY: `ChildSetup::apply` only makes async-signal-safe calls and allocates nothing;
    // all of its data was prepared in the parent.
    unsafe {
        cmd.pre_exec(move || setup.apply());
    }
}
