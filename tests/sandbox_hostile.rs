//! Hostile code and bad input, run in CI. Each case asserts the host is untouched and the run
//! ends with a clear status; where a protection layer is missing on the host, the test prints
//! which one instead of passing silently. Every run is bounded by a few seconds.

#[path = "fixtures/sandbox/common.rs"]
mod common;

use common::*;
use sorft::sandbox::apply::{apply_diff, apply_model_change, ApplyError};
use sorft::sandbox::isolation::HostSupport;
use sorft::sandbox::process::{ExitKind, LimitHit};
use std::time::{Duration, Instant};

fn setup(name: &str) -> (tempfile::TempDir, sorft::sandbox::workspace::Workspace) {
    let base = scratch();
    let repo = tiny_repo(base.path());
    let ws = workspace(base.path(), &repo);
    let _ = name;
    (base, ws)
}

#[test]
fn fork_bomb_is_contained() {
    let (_b, ws) = setup("fork_bomb");
    let Some((uid, _)) = ws.ids() else {
        report_missing("fork_bomb_is_contained");
        eprintln!(
            "SKIPPED fork_bomb_is_contained: no dedicated uid, so RLIMIT_NPROC is not proven"
        );
        return;
    };
    let mut limits = tight();
    limits.nproc = 24;
    limits.wall = Duration::from_secs(3);
    // Prove the process limit is active in this very run before any bomb.
    let probe = sh(
        &ws,
        "i=0; while [ $i -lt 60 ]; do sleep 20 & i=$((i+1)); done; echo never",
        &limits,
    );
    if probe.layers.uid != Some(uid) {
        report_missing("fork_bomb_is_contained");
        eprintln!("SKIPPED fork_bomb_is_contained: the uid drop did not happen in this run");
        return;
    }
    assert!(
        !probe.output.tail.contains("never"),
        "process limit not active: {:?}",
        probe
    );
    assert!(live_processes_of(uid).is_empty());
    let t = Instant::now();
    let out = py(
        &ws,
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        &limits,
    );
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "took {:?}",
        t.elapsed()
    );
    assert!(out.limits_hit.contains(&LimitHit::WallTime), "{out:?}");
    assert!(live_processes_of(uid).is_empty(), "fork bomb survived");
    // The host can still fork.
    assert!(std::process::Command::new("/bin/true")
        .status()
        .unwrap()
        .success());
}

#[test]
fn infinite_loop_hits_cpu_or_wall_limit() {
    let (_b, ws) = setup("loop");
    let mut limits = tight();
    limits.cpu_secs = 1;
    limits.wall = Duration::from_secs(4);
    let t = Instant::now();
    let out = py(&ws, "while True:\n    pass\n", &limits);
    assert!(t.elapsed() < Duration::from_secs(6));
    assert!(
        out.limits_hit.contains(&LimitHit::CpuTime) || out.limits_hit.contains(&LimitHit::WallTime),
        "{out:?}"
    );
    assert!(!out.success());
}

#[test]
fn sleeping_forever_is_killed_at_the_wall_clock_limit() {
    let (_b, ws) = setup("sleep");
    let mut limits = tight();
    limits.wall = Duration::from_millis(800);
    let t = Instant::now();
    let out = sh(&ws, "sleep 1000", &limits);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(out.limits_hit, vec![LimitHit::WallTime]);
    assert_eq!(out.exit, ExitKind::Signaled(libc::SIGKILL));
}

#[test]
fn memory_hog_is_contained() {
    let (_b, ws) = setup("mem");
    let mut limits = tight();
    limits.address_space = 256 << 20;
    // Pages are written, so a memory cgroup (which bounds memory used, not reserved) sees them.
    let out = py(
        &ws,
        "chunks = []\nfor i in range(64):\n    chunks.append(b'x' * (64 << 20))\nprint('allocated 4 GiB')\n",
        &limits,
    );
    assert!(!out.output.tail.contains("allocated 4 GiB"), "{out:?}");
    if out.layers.cgroups.memory_max.is_some() {
        // The memory cgroup's OOM killer stops it.
        assert_eq!(
            out.layers.address_space, None,
            "no RLIMIT_AS with a memory cgroup"
        );
    } else {
        assert!(
            out.output.tail.contains("MemoryError"),
            "{}",
            out.output.tail
        );
    }
    assert!(out.limits_hit.contains(&LimitHit::Memory), "{out:?}");
    assert!(!out.success());
}

#[test]
fn a_gigabyte_of_output_is_capped_and_stopped() {
    let (_b, ws) = setup("output");
    let limits = tight();
    let t = Instant::now();
    let out = py(
        &ws,
        "import sys\nb = b'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.buffer.write(b)\nprint('done')\n",
        &limits,
    );
    assert!(t.elapsed() < Duration::from_secs(6));
    assert!(
        out.limits_hit.contains(&LimitHit::Output),
        "{:?}",
        out.limits_hit
    );
    assert!(out.output.truncated);
    assert!(out.output.tail.len() <= limits.output_tail);
    assert!(out.output.total_bytes < 1 << 30);
}

#[test]
fn writes_outside_the_workspace_do_not_reach_the_host() {
    let host = HostSupport::get();
    let base = scratch();
    // The mirror lives outside the system temp dir, world-writable, so only Landlock (or the
    // namespaces hiding it) can protect it; a plain root-owned file is protected by the uid.
    let outside = outside_dir("writes");
    let mirror = outside.join("mirror");
    std::fs::create_dir_all(&mirror).unwrap();
    std::fs::write(mirror.join("hello.txt"), "hello\n").unwrap();
    let open_file = outside.join("world-writable.txt");
    std::fs::write(&open_file, "original\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(&open_file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let ws = workspace(base.path(), &mirror);
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let marker = format!("sorft-escape-{}", std::process::id());
    let host_tmp_file = format!("/tmp/{marker}");
    let home_file = format!("{home}/{marker}");
    let code = format!(
        "import os\nfor p in [{host_tmp_file:?}, {home_file:?}, {mirror_file:?}, {open_file:?}]:\n    try:\n        with open(p, 'a') as f:\n            f.write('pwned')\n        print('WROTE', p)\n    except OSError as e:\n        print('DENIED', p, e)\n",
        mirror_file = mirror.join("hello.txt").display().to_string(),
        open_file = open_file.display().to_string(),
    );
    let out = py(&ws, &code, &tight());
    eprintln!("{}", out.output.tail);
    assert_eq!(out.exit, ExitKind::Exited(0), "{}", out.output.tail);
    let landlock = out.layers.landlock_abi.is_some();
    let uid = out.layers.uid.is_some();
    let ns = out.layers.namespaces;
    if uid || landlock {
        assert_eq!(
            std::fs::read_to_string(mirror.join("hello.txt")).unwrap(),
            "hello\n"
        );
        assert!(
            !std::path::Path::new(&home_file).exists(),
            "wrote into home"
        );
    }
    if landlock {
        assert_eq!(std::fs::read_to_string(&open_file).unwrap(), "original\n");
    } else {
        report_missing("writes_outside_the_workspace");
        eprintln!("world-writable files outside the workspace are NOT protected without landlock");
    }
    if landlock || ns {
        assert!(
            !std::path::Path::new(&host_tmp_file).exists(),
            "wrote into host /tmp"
        );
    } else {
        eprintln!("host /tmp is NOT protected without landlock or a mount namespace");
    }
    // The workspace copy itself is writable.
    let own = py(
        &ws,
        "open('hello.txt', 'a').write('ok')\nprint('own ok')",
        &tight(),
    );
    assert!(own.output.tail.contains("own ok"), "{}", own.output.tail);
    let _ = std::fs::remove_file(&host_tmp_file);
    let _ = std::fs::remove_file(&home_file);
    let _ = std::fs::remove_dir_all(&outside);
    let _ = host;
}

#[test]
fn secrets_outside_the_workspace_cannot_be_read() {
    let (_b, ws) = setup("secret");
    let outside = outside_dir("secret");
    let secret = format!("TOPSECRET-{}", std::process::id());
    let public = outside.join("world-readable.txt");
    let private = outside.join("private.txt");
    std::fs::write(&public, &secret).unwrap();
    std::fs::write(&private, &secret).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let code = format!(
        "for p in [{:?}, {:?}]:\n    try:\n        print(open(p).read())\n    except OSError as e:\n        print('DENIED', e)\n",
        private.display().to_string(),
        public.display().to_string()
    );
    let out = py(&ws, &code, &tight());
    eprintln!("{}", out.output.tail);
    let leaked: Vec<&str> = out
        .output
        .tail
        .lines()
        .filter(|l| l.contains(&secret))
        .collect();
    if out.layers.landlock_abi.is_some() {
        assert!(leaked.is_empty(), "secret leaked: {leaked:?}");
    } else if out.layers.uid.is_some() {
        report_missing("secrets_outside_the_workspace");
        eprintln!("without landlock only the mode-0600 secret is protected");
        assert_eq!(leaked.len(), 1, "the 0600 secret leaked");
    } else {
        report_missing("secrets_outside_the_workspace");
        eprintln!("no layer protects reads on this host");
    }
    let _ = std::fs::remove_dir_all(&outside);
}

#[test]
fn no_tcp_connection_to_a_host_listener() {
    let (_b, ws) = setup("tcp");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    s.sendall(b'hello')\n    print('CONNECTED')\nexcept OSError as e:\n    print('BLOCKED', e)\n"
    );
    let out = py(&ws, &code, &tight());
    eprintln!("{}", out.output.tail);
    let accepted = listener.accept().is_ok();
    let l = &out.layers;
    if l.namespaces || l.seccomp || l.landlock_abi.is_some_and(|v| v >= 4) {
        assert!(!accepted, "the sandbox reached the host listener");
        assert!(out.output.tail.contains("BLOCKED"), "{}", out.output.tail);
    } else {
        report_missing("no_tcp_connection_to_a_host_listener");
        eprintln!("network is NOT blocked on this host (accepted: {accepted})");
    }
}

#[test]
fn killing_its_parent_does_not_reach_the_host() {
    let (_b, ws) = setup("killparent");
    let out0 = sh(&ws, "true", &tight());
    let l = &out0.layers;
    if l.uid.is_none() && l.landlock_abi.is_none_or(|v| v < 6) {
        report_missing("killing_its_parent");
        eprintln!(
            "SKIPPED: neither a uid drop nor Landlock signal scoping; would kill the test runner"
        );
        return;
    }
    let me = std::process::id();
    let out = sh(
        &ws,
        &format!("kill -9 $PPID 2>&1; kill -9 {me} 2>&1; kill -9 1 2>&1; echo still-here"),
        &tight(),
    );
    // We are alive to assert this; the run ended normally.
    assert!(out.output.tail.contains("still-here"), "{out:?}");
    assert!(out.wall_secs < 5.0);
}

#[test]
fn a_daemon_left_behind_is_gone_after_the_run() {
    let (_b, ws) = setup("daemon");
    let marker = format!(
        "{}.{}",
        4000 + std::process::id() % 1000,
        std::process::id()
    );
    let code = format!(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', '{marker}'])\n    os._exit(0)\ntime.sleep(0.3)\nprint('parent exits')\n"
    );
    let out = py(&ws, &code, &tight());
    assert!(
        out.output.tail.contains("parent exits"),
        "{}",
        out.output.tail
    );
    assert!(out.wall_secs < 3.0, "{out:?}");
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        processes_with(&marker).is_empty(),
        "daemon survived: {:?}",
        processes_with(&marker)
    );
    if let Some((uid, _)) = ws.ids() {
        assert!(live_processes_of(uid).is_empty());
    }
}

#[test]
fn patch_with_dotdot_paths_is_refused() {
    let base = scratch();
    let repo = base.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let diff = "diff --git a/../escape.txt b/../escape.txt\nnew file mode 100644\n--- /dev/null\n+++ b/../escape.txt\n@@ -0,0 +1 @@\n+pwned\n";
    let e = apply_diff(&repo, diff, "model patch").unwrap_err();
    assert!(matches!(e, ApplyError::Unsafe { .. }), "{e}");
    assert!(e.to_string().contains(".."), "{e}");
    assert!(!base.path().join("escape.txt").exists());
    let abs = "--- /dev/null\n+++ /tmp/sorft-abs-escape\n@@ -0,0 +1 @@\n+pwned\n";
    assert!(apply_diff(&repo, abs, "model patch").is_err());
    assert!(!std::path::Path::new("/tmp/sorft-abs-escape").exists());
    let git = "diff --git a/.git/hooks/pre-commit b/.git/hooks/pre-commit\nnew file mode 100755\n--- /dev/null\n+++ b/.git/hooks/pre-commit\n@@ -0,0 +1 @@\n+rm -rf /\n";
    let e = apply_diff(&repo, git, "model patch").unwrap_err();
    assert!(e.to_string().contains(".git"), "{e}");
}

#[test]
fn patch_creating_a_symlink_to_root_then_writing_through_it_is_refused() {
    let base = scratch();
    let repo = base.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let target = format!("sorft-link-escape-{}", std::process::id());
    let diff = format!(
        "diff --git a/root b/root\nnew file mode 120000\n--- /dev/null\n+++ b/root\n@@ -0,0 +1 @@\n+/\n\\ No newline at end of file\ndiff --git a/root/tmp/{target} b/root/tmp/{target}\nnew file mode 100644\n--- /dev/null\n+++ b/root/tmp/{target}\n@@ -0,0 +1 @@\n+pwned\n"
    );
    let e = apply_diff(&repo, &diff, "model patch").unwrap_err();
    assert!(matches!(e, ApplyError::Unsafe { .. }), "{e}");
    assert!(!std::path::Path::new(&format!("/tmp/{target}")).exists());
    assert!(
        std::fs::symlink_metadata(repo.join("root")).is_err(),
        "nothing written"
    );
    // A symlink already in the repository that points out is not written through either.
    std::os::unix::fs::symlink("/tmp", repo.join("out")).unwrap();
    let through = format!("--- /dev/null\n+++ b/out/{target}\n@@ -0,0 +1 @@\n+pwned\n");
    assert!(apply_diff(&repo, &through, "model patch").is_err());
    let blocks = format!("### out/{target}\n<<<<<<< SEARCH\n=======\npwned\n>>>>>>> REPLACE\n");
    assert!(apply_model_change(&repo, &blocks).is_err());
    assert!(!std::path::Path::new(&format!("/tmp/{target}")).exists());
}
