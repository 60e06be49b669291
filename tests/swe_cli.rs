//! `sorft data` end to end through the binary (needs python3 and git).

use std::process::Command;

fn sorft(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn synth_subtasks_stats_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (rc, out, err) = sorft(&["data", "synth", "--n", "2", "--seed", "3", "--out", d]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        out.contains("wrote 2 instances") && out.contains("all validated"),
        "{out}"
    );
    let inst = format!("{d}/instances.jsonl");
    let repos = format!("{d}/repos");
    let sub = format!("{d}/subtasks.jsonl");
    let (rc, out, err) = sorft(&[
        "data",
        "subtasks",
        "--instances",
        &inst,
        "--repos",
        &repos,
        "--out",
        &sub,
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("file=2 function=2 line=2 edit=2"), "{out}");
    let (rc, out, _) = sorft(&["data", "stats", &inst]);
    assert_eq!(rc, 0);
    assert!(out.contains("2 instances from 1 repositories"), "{out}");
    let (rc, out, _) = sorft(&["data", "stats", &sub]);
    assert_eq!(rc, 0);
    assert!(out.contains("subtask records of 2 instances"), "{out}");
}

#[test]
fn bad_input_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"instance_id\":\"a\",\"repo\":\"o/r\",\"base_commit\":\"c\"}\n{\"instance_id\":\"b\",\"repo\":5}\n").unwrap();
    let (rc, _, err) = sorft(&["data", "stats", bad.to_str().unwrap()]);
    assert_eq!(rc, 1);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("bad.jsonl:2: field `repo`"), "{err}");
    let (rc, _, err) = sorft(&[
        "data",
        "subtasks",
        "--instances",
        bad.to_str().unwrap(),
        "--repos",
        "/nonexistent",
        "--out",
        dir.path().join("o.jsonl").to_str().unwrap(),
    ]);
    assert_eq!(rc, 1);
    assert!(err.contains("bad.jsonl:2"), "{err}");
    // A missing mirror is reported per instance, and no records means failure.
    let good = dir.path().join("good.jsonl");
    std::fs::write(
        &good,
        "{\"instance_id\":\"a\",\"repo\":\"o/r\",\"base_commit\":\"c\"}\n",
    )
    .unwrap();
    let (rc, _, err) = sorft(&[
        "data",
        "subtasks",
        "--instances",
        good.to_str().unwrap(),
        "--repos",
        dir.path().to_str().unwrap(),
        "--out",
        dir.path().join("o.jsonl").to_str().unwrap(),
    ]);
    assert_eq!(rc, 1);
    assert!(err.contains("no git mirror for o/r"), "{err}");
}
