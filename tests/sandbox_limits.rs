//! Limits that contain hostile code without breaking real test suites: thread- and
//! process-heavy programs and mmap reservations run inside the default limits, while the pids
//! and memory bounds still hold (see also `sandbox_hostile.rs`), and the cgroups are removed.

#[path = "fixtures/sandbox/common.rs"]
mod common;

use common::*;
use sorft::sandbox::process::{ExitKind, LimitHit};
use sorft::sandbox::Limits;
use std::time::Duration;

fn defaults() -> Limits {
    Limits {
        wall: Duration::from_secs(30),
        output_tail: 64 << 10,
        ..Limits::default()
    }
}

fn setup() -> (tempfile::TempDir, sorft::sandbox::workspace::Workspace) {
    let base = scratch();
    let repo = tiny_repo(base.path());
    let ws = workspace(base.path(), &repo);
    (base, ws)
}

#[test]
fn a_hundred_threads_run_under_the_default_limits() {
    let (_b, ws) = setup();
    let code = "import threading, time\nev = threading.Event()\nts = [threading.Thread(target=ev.wait) for _ in range(100)]\nfor t in ts:\n    t.start()\nprint('alive', threading.active_count())\nev.set()\nfor t in ts:\n    t.join()\nprint('threads ok')\n";
    let out = py(&ws, code, &defaults());
    eprintln!("layers: {:?}", out.layers);
    assert_eq!(out.exit, ExitKind::Exited(0), "{}", out.output.tail);
    assert!(out.output.tail.contains("alive 101"), "{}", out.output.tail);
}

#[test]
fn twenty_processes_run_under_the_default_limits() {
    let (_b, ws) = setup();
    let code = "import multiprocessing as mp\n\ndef sq(x):\n    return x * x\n\nif __name__ == '__main__':\n    ps = [mp.Process(target=sq, args=(i,)) for i in range(20)]\n    for p in ps:\n        p.start()\n    for p in ps:\n        p.join()\n    print('exit codes', sorted(set(p.exitcode for p in ps)))\n";
    std::fs::write(ws.repo().join("procs.py"), code).unwrap();
    ws.hand_over().unwrap();
    let interp =
        sorft::sandbox::python::resolve(None, sorft::sandbox::isolation::HostSupport::get().root)
            .unwrap();
    let cmd = sorft::sandbox::process::JailCommand {
        program: interp.program.clone(),
        args: vec!["procs.py".into()],
        env: vec![],
        stdin: None,
    };
    let out = sorft::sandbox::process::run_jailed(
        &cmd,
        &ws.jail_paths(interp.read_roots.clone()),
        &sorft::sandbox::isolation::Policy::default(),
        &defaults(),
        ws.ids(),
    )
    .unwrap();
    assert_eq!(out.exit, ExitKind::Exited(0), "{}", out.output.tail);
    assert!(
        out.output.tail.contains("exit codes [0]"),
        "{}",
        out.output.tail
    );
}

#[test]
fn large_mmap_reservations_work_with_a_memory_cgroup() {
    let (_b, ws) = setup();
    // 8 GiB reserved, a few pages touched: fine under a memory cgroup, refused by RLIMIT_AS.
    let code = "import mmap\nm = mmap.mmap(-1, 8 << 30)\nm[0] = 1\nm[(8 << 30) - 1] = 1\nprint('mapped')\n";
    let out = py(&ws, code, &defaults());
    if out.layers.cgroups.memory_max.is_none() {
        report_missing("large_mmap_reservations");
        eprintln!(
            "SKIPPED: no memory cgroup here ({:?}); RLIMIT_AS bounds reservations",
            out.layers.cgroups.unavailable
        );
        return;
    }
    assert_eq!(out.exit, ExitKind::Exited(0), "{}", out.output.tail);
    assert!(out.output.tail.contains("mapped"));
}

#[test]
fn pids_cgroup_bounds_threads_and_is_removed() {
    let (_b, ws) = setup();
    let mut limits = defaults();
    limits.nproc = 40;
    limits.wall = Duration::from_secs(10);
    let code = "import threading\nev = threading.Event()\nn = 0\ntry:\n    for _ in range(200):\n        threading.Thread(target=ev.wait).start()\n        n += 1\nexcept RuntimeError as e:\n    print('refused after', n, e)\nev.set()\n";
    let out = py(&ws, code, &limits);
    assert!(
        out.output.tail.contains("refused after"),
        "{}",
        out.output.tail
    );
    if out.layers.cgroups.pids_max.is_some() {
        assert!(out.limits_hit.contains(&LimitHit::Processes), "{out:?}");
        // The run's cgroup is gone afterwards (other tests of this binary may still hold
        // theirs for a moment: wait for all of this process's cgroups to go).
        let mine = format!("sorft-{}-", std::process::id());
        let leftovers = || -> Vec<std::path::PathBuf> {
            std::fs::read_dir("/sys/fs/cgroup/pids")
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
                        .map(|e| e.path())
                        .collect()
                })
                .unwrap_or_default()
        };
        let t = std::time::Instant::now();
        while !leftovers().is_empty() && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(leftovers().is_empty(), "cgroups left: {:?}", leftovers());
    } else {
        report_missing("pids_cgroup");
        eprintln!("no pids cgroup here: {:?}", out.layers.cgroups.unavailable);
    }
}

#[test]
fn the_workspace_quota_bounds_files_and_bytes_and_is_unmounted() {
    use sorft::sandbox::quota::{self, Quota};
    use sorft::sandbox::workspace::{RepoSource, Workspace};
    let base = scratch();
    let repo = tiny_repo(base.path());
    let q = Quota {
        bytes: 16 << 20,
        files: 300,
    };
    let ws = Workspace::create_with(base.path(), RepoSource::Dir(&repo), Some(&q)).unwrap();
    let Some(got) = ws.quota().tmpfs else {
        let why = ws.quota().missing.clone().unwrap_or_default();
        assert!(
            std::env::var_os("SORFT_REQUIRE_QUOTA").is_none(),
            "SORFT_REQUIRE_QUOTA is set but the workspace tmpfs is missing: {why}"
        );
        eprintln!("SKIPPED: no per-run tmpfs here ({why}); only RLIMIT_FSIZE bounds files");
        return;
    };
    assert_eq!(got, q);
    let root = ws.root().to_path_buf();
    assert!(quota::is_mounted(&root));
    // Many empty files stop at the inode bound; big files stop at the byte bound, in the
    // repository and in /tmp alike (both live on the run's tmpfs).
    let code = "import os\nn = 0\ntry:\n    for i in range(1000):\n        open('f%d' % i, 'w').close()\n        n += 1\nexcept OSError as e:\n    print('files stopped', n, e.errno)\nfor i in range(n):\n    os.remove('f%d' % i)\nfor d in ('.', '/tmp'):\n    big = 0\n    try:\n        for i in range(8):\n            with open(os.path.join(d, 'big%d' % i), 'wb') as f:\n                f.write(b'x' * (4 << 20))\n            big += 1\n    except OSError as e:\n        print('bytes stopped', d, big, e.errno)\n    for i in range(big + 1):\n        try:\n            os.remove(os.path.join(d, 'big%d' % i))\n        except OSError:\n            pass\n";
    let out = py(&ws, code, &defaults());
    let tail = &out.output.tail;
    assert_eq!(out.exit, ExitKind::Exited(0), "{tail}");
    let stopped_at = |prefix: &str| -> Option<(u64, i32)> {
        let l = tail.lines().find(|l| l.starts_with(prefix))?;
        let w: Vec<&str> = l.split_whitespace().collect();
        Some((w[w.len() - 2].parse().ok()?, w[w.len() - 1].parse().ok()?))
    };
    let (files, errno) = stopped_at("files stopped").expect(tail);
    assert!(files < 300 && errno == libc::ENOSPC, "{tail}");
    let (big, errno) = stopped_at("bytes stopped .").expect(tail);
    assert!(big < 4 && errno == libc::ENOSPC, "{tail}");
    let (big, errno) = stopped_at("bytes stopped /tmp").expect(tail);
    assert!(big < 4 && errno == libc::ENOSPC, "{tail}");
    drop(ws);
    assert!(
        !quota::is_mounted(&root),
        "the tmpfs outlived its workspace"
    );
    assert!(!root.exists());
}

#[test]
fn a_workspace_without_a_quota_says_why() {
    use sorft::sandbox::workspace::{RepoSource, Workspace};
    let base = scratch();
    let repo = tiny_repo(base.path());
    let ws = Workspace::create_with(base.path(), RepoSource::Dir(&repo), None).unwrap();
    assert!(ws.quota().tmpfs.is_none());
    assert!(!sorft::sandbox::quota::is_mounted(ws.root()));
    assert_eq!(ws.quota().missing.as_deref(), Some("no quota requested"));
}
