//! End to end: instances from a git mirror, patches applied, unittest run in the jail, graded;
//! the worker pool; the `sorft sandbox` commands; cleanup on Ctrl-C.

#[path = "fixtures/sandbox/mirror.rs"]
mod mirror;

use mirror::*;
use sorft::sandbox::apply::Strategy;
use sorft::sandbox::isolation::{HostSupport, Policy};
use sorft::sandbox::pool::{run_all, Job, Summary};
use sorft::sandbox::python;
use sorft::sandbox::runner::{run_instance, MirrorRepos, RunStatus, SandboxConfig};
use sorft::sandbox::testcmd::CommandTable;
use sorft::sandbox::Limits;
use std::path::Path;
use std::time::Duration;

fn config(work: &Path) -> SandboxConfig {
    SandboxConfig {
        limits: Limits {
            wall: Duration::from_secs(20),
            ..Limits::default()
        },
        policy: Policy::default(),
        python: python::resolve(None, HostSupport::get().root).unwrap(),
        commands: CommandTable::default(),
        work_dir: work.to_path_buf(),
        integrity: Default::default(),
    }
}

#[test]
fn gold_resolves_and_bad_patches_are_graded() {
    let d = scratch();
    let repos = d.path().join("repos");
    let work = d.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let inst = make_mirror(&repos, "synth__calc-1");
    let cfg = config(&work);
    let mirrors = MirrorRepos::new(&repos);

    let gold = run_instance(&cfg, &mirrors, &inst, "gold", &inst.patch);
    assert_eq!(gold.status, RunStatus::Resolved, "{gold:#?}");
    assert!(gold.resolved && gold.applied);
    assert_eq!(gold.apply.as_ref().unwrap().strategy, Strategy::Exact);
    assert_eq!(gold.tests.len(), 2, "{:?}", gold.tests);
    assert!(gold.timings.total >= gold.timings.tests);
    assert!(
        gold.command.iter().any(|a| a == "unittest"),
        "{:?}",
        gold.command
    );

    // Nothing changes: test_sub fails, FAIL_TO_PASS not passing.
    let noop = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,3 @@\n+# a comment\n def add(a, b):\n     return a + b\n";
    let r = run_instance(&cfg, &mirrors, &inst, "m", noop);
    assert_eq!(r.status, RunStatus::Unresolved, "{r:#?}");
    assert!(r.applied && !r.resolved);
    assert!(
        r.error.as_deref().unwrap().contains("FAIL_TO_PASS"),
        "{:?}",
        r.error
    );

    // Breaking add breaks PASS_TO_PASS.
    let broken = CALC_FIXED.replace("return a + b", "return a * b");
    let patch = sorft::swe::diff::unified_diff("calc.py", CALC, &broken);
    let r = run_instance(&cfg, &mirrors, &inst, "m", &patch);
    assert_eq!(r.status, RunStatus::Unresolved);
    assert!(r.grade.as_ref().unwrap().report.p2p_failure.len() == 1);

    // Does not apply: names the hunk.
    let bad = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n-def nothing():\n+def other():\n     pass\n";
    let r = run_instance(&cfg, &mirrors, &inst, "m", bad);
    assert_eq!(r.status, RunStatus::PatchFailed);
    assert!(
        r.error.as_deref().unwrap().contains("hunk 1"),
        "{:?}",
        r.error
    );

    let r = run_instance(&cfg, &mirrors, &inst, "m", "  ");
    assert_eq!(r.status, RunStatus::EmptyPatch);

    // A test run that never ends is stopped and reported.
    let mut slow_cfg = config(&work);
    slow_cfg.limits.wall = Duration::from_millis(1500);
    let hang = sorft::swe::diff::unified_diff(
        "calc.py",
        CALC,
        &format!("{CALC_FIXED}\nimport time\ntime.sleep(60)\n"),
    );
    let r = run_instance(&slow_cfg, &mirrors, &inst, "m", &hang);
    assert_eq!(r.status, RunStatus::LimitHit, "{r:#?}");
    assert!(r.timings.total < 5.0);

    // Every workspace is gone.
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
}

#[test]
fn pool_runs_many_and_summarises() {
    let d = scratch();
    let repos = d.path().join("repos");
    let work = d.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let inst = make_mirror(&repos, "synth__calc-1");
    let cfg = config(&work);
    let mirrors = MirrorRepos::new(&repos);
    let jobs: Vec<Job> = (0..6)
        .map(|i| {
            let mut instance = inst.clone();
            instance.instance_id = format!("synth__calc-{i}");
            Job {
                instance,
                model: "m".into(),
                patch: if i % 2 == 0 {
                    inst.patch.clone()
                } else {
                    String::new()
                },
            }
        })
        .collect();
    let mut seen = 0;
    let results = run_all(&cfg, &mirrors, &jobs, 3, |_| seen += 1);
    assert_eq!(seen, 6);
    assert_eq!(results.len(), 6);
    assert_eq!(results[4].instance_id, "synth__calc-4");
    let s = Summary::of(&results);
    assert_eq!((s.total, s.applied, s.resolved), (6, 3, 3));
    assert!((s.pct_resolved - 50.0).abs() < 1e-9);
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
}

#[test]
fn cli_run_gold_and_check() {
    let d = scratch();
    let repos = d.path().join("repos");
    let inst = make_mirror(&repos, "synth__calc-1");
    let instances = d.path().join("instances.jsonl");
    sorft::swe::instance::write_jsonl(&instances, std::slice::from_ref(&inst)).unwrap();
    let preds = d.path().join("preds.jsonl");
    let pred = serde_json::json!({"instance_id": inst.instance_id, "model_name_or_path": "m", "model_patch": inst.patch});
    std::fs::write(&preds, format!("{pred}\n")).unwrap();
    let out = d.path().join("results.jsonl");
    let bin = env!("CARGO_BIN_EXE_sorft");
    let o = std::process::Command::new(bin)
        .args(["sandbox", "run", "--instances"])
        .arg(&instances)
        .arg("--repos")
        .arg(&repos)
        .arg("--predictions")
        .arg(&preds)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("100.0% resolved"), "{stdout}");
    let line = std::fs::read_to_string(&out).unwrap();
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["status"], "resolved");
    let summary = std::fs::read_to_string(format!("{}.summary.json", out.display())).unwrap();
    assert!(summary.contains("\"pct_applied\": 100.0"), "{summary}");

    let o = std::process::Command::new(bin)
        .args(["sandbox", "gold", "--instances"])
        .arg(&instances)
        .arg("--repos")
        .arg(&repos)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Bad input: one-line error naming the file, exit code 1.
    std::fs::write(&preds, "{not json\n").unwrap();
    let o = std::process::Command::new(bin)
        .args(["sandbox", "run", "--instances"])
        .arg(&instances)
        .arg("--repos")
        .arg(&repos)
        .arg("--predictions")
        .arg(&preds)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("preds.jsonl") && err.contains("line 1"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let o = std::process::Command::new(bin)
        .args(["sandbox", "check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    for layer in ["uid-drop", "namespaces", "landlock", "seccomp"] {
        assert!(text.contains(layer), "{text}");
    }
}

#[test]
fn ctrl_c_kills_the_runs_and_removes_the_workspaces() {
    let d = scratch();
    let repos = d.path().join("repos");
    let work = d.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let inst = make_mirror(&repos, "synth__calc-1");
    let instances = d.path().join("instances.jsonl");
    sorft::swe::instance::write_jsonl(&instances, std::slice::from_ref(&inst)).unwrap();
    let marker = format!(
        "{}.{}",
        7000 + std::process::id() % 1000,
        std::process::id()
    );
    let hang = sorft::swe::diff::unified_diff(
        "calc.py",
        CALC,
        &format!("{CALC_FIXED}\nimport subprocess\nsubprocess.run(['sleep', '{marker}'])\n"),
    );
    let preds = d.path().join("preds.jsonl");
    let pred = serde_json::json!({"instance_id": inst.instance_id, "model_name_or_path": "m", "model_patch": hang});
    std::fs::write(&preds, format!("{pred}\n")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["sandbox", "run", "--timeout", "30", "--instances"])
        .arg(&instances)
        .arg("--repos")
        .arg(&repos)
        .arg("--predictions")
        .arg(&preds)
        .arg("--out")
        .arg(d.path().join("out.jsonl"))
        .arg("--work-dir")
        .arg(&work)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the test is running (the sleeper exists), then interrupt.
    let start = std::time::Instant::now();
    let sleeping = |m: &str| -> bool {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(m))
                .unwrap_or(false)
        })
    };
    while !sleeping(&marker) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sleeping(&marker), "the test never started");
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 1);
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(start.elapsed() < Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(100));
    assert!(!sleeping(&marker), "the sandboxed sleeper survived Ctrl-C");
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "workspace left behind"
    );
}
