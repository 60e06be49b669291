//! Per-run control groups: a pids cgroup (a fork-bomb bound that counts the run's processes and
//! threads, so a test starting 100 threads is fine) and a memory cgroup (a bound on memory
//! actually used, so thread- and mmap-heavy tests are not broken by an address-space limit).
//!
//! cgroup v2 is used when its hierarchy offers the controller, else the v1 hierarchy of that
//! controller; each run gets a child of the caller's own cgroup, which the child process joins
//! before `exec` (writing `0` to `cgroup.procs` moves the writer). After the run every process
//! left in it is killed and the cgroup removed (also when the run fails to start).

use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A controller's hierarchy: where this process's cgroup for it lives.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Hierarchy {
    /// `v1` or `v2`.
    pub version: u8,
    /// The caller's cgroup directory in that hierarchy (children are created below it).
    pub dir: PathBuf,
}

/// The caller's cgroup directory for `controller` (`pids`, `memory`), v2 first.
pub fn find(controller: &str) -> Result<Hierarchy, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    let own_path = |v2: bool| -> Option<String> {
        own.lines().find_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
            let hit = if v2 {
                ctrls.is_empty()
            } else {
                ctrls.split(',').any(|c| c == controller)
            };
            hit.then(|| path.trim_start_matches('/').to_string())
        })
    };
    let mut v1 = None;
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let mount = pre.split(' ').nth(4).unwrap_or("");
        let mut post = post.split(' ');
        let (fstype, opts) = (post.next().unwrap_or(""), post.nth(1).unwrap_or(""));
        if fstype == "cgroup2" {
            let offered = std::fs::read_to_string(Path::new(mount).join("cgroup.controllers"))
                .unwrap_or_default();
            if offered.split_whitespace().any(|c| c == controller) {
                if let Some(p) = own_path(true) {
                    return Ok(Hierarchy {
                        version: 2,
                        dir: Path::new(mount).join(p),
                    });
                }
            }
        } else if fstype == "cgroup" && opts.split(',').any(|o| o == controller) {
            if let Some(p) = own_path(false) {
                v1.get_or_insert(Hierarchy {
                    version: 1,
                    dir: Path::new(mount).join(p),
                });
            }
        }
    }
    v1.ok_or_else(|| format!("no cgroup hierarchy with the {controller} controller is mounted"))
}

/// What one run's cgroups bound, for the run's record.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CgroupLimits {
    /// `pids.max` of the run's pids cgroup.
    pub pids_max: Option<u64>,
    /// Memory limit (v1 `memory.limit_in_bytes`, v2 `memory.max`) of the run's memory cgroup.
    pub memory_max: Option<u64>,
    /// Why a cgroup could not be used, per controller.
    pub unavailable: Vec<String>,
}

/// What happened inside a run's cgroups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupEvents {
    /// Forks refused at `pids.max`.
    pub pids_refused: u64,
    /// Processes killed by the memory cgroup's OOM killer.
    pub oom_kills: u64,
}

/// One run's cgroups; dropped after the run: processes killed, directories removed.
#[derive(Debug)]
pub struct RunCgroup {
    dirs: Vec<(String, u8, PathBuf)>,
    _tracked: Vec<crate::sandbox::cleanup::Tracked>,
}

fn write(p: &Path, v: &str) -> Result<(), String> {
    std::fs::write(p, v).map_err(|e| format!("writing {}: {e}", p.display()))
}

fn make_child(controller: &str, name: &str) -> Result<(u8, PathBuf), String> {
    let h = find(controller)?;
    if h.version == 2 {
        // Best effort: children only get the controller when the parent delegates it.
        let _ = std::fs::write(
            h.dir.join("cgroup.subtree_control"),
            format!("+{controller}"),
        );
    }
    let dir = h.dir.join(name);
    std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    Ok((h.version, dir))
}

impl RunCgroup {
    /// Creates the run's pids cgroup (`pids_max`) and memory cgroup (`memory_max` bytes), each
    /// where the host allows; reports what it got.
    pub fn create(pids_max: u64, memory_max: u64) -> (RunCgroup, CgroupLimits) {
        let name = format!(
            "sorft-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mut cg = RunCgroup {
            dirs: vec![],
            _tracked: vec![],
        };
        let mut got = CgroupLimits::default();
        match make_child("pids", &name) {
            Ok((v, dir)) => {
                cg.dirs.push(("pids".into(), v, dir.clone()));
                match write(&dir.join("pids.max"), &pids_max.to_string()) {
                    Ok(()) => got.pids_max = Some(pids_max),
                    Err(e) => got.unavailable.push(format!("pids: {e}")),
                }
            }
            Err(e) => got.unavailable.push(format!("pids: {e}")),
        }
        match make_child("memory", &name) {
            Ok((v, dir)) => {
                cg.dirs.push(("memory".into(), v, dir.clone()));
                let r = if v == 2 {
                    write(&dir.join("memory.max"), &memory_max.to_string()).map(|()| {
                        let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                    })
                } else {
                    write(&dir.join("memory.limit_in_bytes"), &memory_max.to_string()).map(|()| {
                        // Swap does not extend the bound where the kernel accounts it.
                        let _ = std::fs::write(
                            dir.join("memory.memsw.limit_in_bytes"),
                            memory_max.to_string(),
                        );
                    })
                };
                match r {
                    Ok(()) => got.memory_max = Some(memory_max),
                    Err(e) => got.unavailable.push(format!("memory: {e}")),
                }
            }
            Err(e) => got.unavailable.push(format!("memory: {e}")),
        }
        // A cgroup without its limit is of no use; drop it.
        let keep = |c: &str| match c {
            "pids" => got.pids_max.is_some(),
            _ => got.memory_max.is_some(),
        };
        let (kept, dropped): (Vec<_>, Vec<_>) = cg.dirs.drain(..).partition(|d| keep(&d.0));
        for (_, _, d) in dropped {
            let _ = std::fs::remove_dir(d);
        }
        cg._tracked = kept
            .iter()
            .map(|(_, _, d)| crate::sandbox::cleanup::track_cgroup(d.clone()))
            .collect();
        cg.dirs = kept;
        (cg, got)
    }

    /// `cgroup.procs` files the child writes `0` to, joining every cgroup of the run.
    pub fn procs_files(&self) -> Vec<CString> {
        self.dirs
            .iter()
            .filter_map(|(_, _, d)| {
                CString::new(d.join("cgroup.procs").as_os_str().as_encoded_bytes()).ok()
            })
            .collect()
    }

    /// Refused forks and OOM kills so far.
    pub fn events(&self) -> CgroupEvents {
        let mut ev = CgroupEvents::default();
        let field = |text: &str, key: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
                .unwrap_or(0)
        };
        for (c, v, d) in &self.dirs {
            if c == "pids" {
                let t = std::fs::read_to_string(d.join("pids.events")).unwrap_or_default();
                ev.pids_refused = field(&t, "max ");
            } else {
                let file = if *v == 2 {
                    "memory.events"
                } else {
                    "memory.oom_control"
                };
                let t = std::fs::read_to_string(d.join(file)).unwrap_or_default();
                ev.oom_kills = field(&t, "oom_kill ");
            }
        }
        ev
    }

    fn pids_in(dir: &Path) -> Vec<i32> {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Kills every process left in the run's cgroups (bounded to a few seconds).
    pub fn kill_all(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        for (_, v, d) in &self.dirs {
            if *v == 2 {
                let _ = std::fs::write(d.join("cgroup.kill"), "1");
            }
            loop {
                let pids = Self::pids_in(d);
                if pids.is_empty() || Instant::now() >= deadline {
                    break;
                }
                for p in pids {
                    // SAFETY: kill takes plain integers; these pids are members of the run's
                    // cgroup, which only the run's processes joined.
                    unsafe {
                        libc::kill(p, libc::SIGKILL);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        self.kill_all();
        for (_, _, d) in &self.dirs {
            // Killed processes leave the cgroup once reaped by their parents; retry briefly.
            for _ in 0..200 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}
