//! The device choice of every command and the CLI's output hygiene, through the binary:
//! `--device auto` without a GPU runs on the CPU with one note line, `--device cuda` without one
//! is a one-line error (exit 1), a closed stdout ends a run quietly, `score` with one token gives
//! the next-token distribution, and error lines do not repeat themselves.
//!
//! A missing GPU is simulated with `CUDA_VISIBLE_DEVICES=` (no device visible to the driver), so
//! the tests mean the same on machines with and without one.

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity/qwen2_gqa_tied")
}

/// `sorft ARGS` on a machine where no GPU is visible.
fn sorft(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

#[test]
fn auto_runs_on_the_cpu_with_one_note_and_cuda_is_a_one_line_error() {
    let m = model();
    let m = m.to_str().unwrap();
    let ok = sorft(&["score", "--model", m, "--ids", "1,2,3"]);
    let err = text(&ok.stderr);
    assert_eq!(ok.status.code(), Some(0), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("note: running on the CPU (CUDA unavailable"),
        "{err}"
    );
    let quiet = sorft(&["score", "--model", m, "--ids", "1,2,3", "--device", "cpu"]);
    assert_eq!(quiet.status.code(), Some(0));
    assert!(quiet.stderr.is_empty(), "{}", text(&quiet.stderr));
    assert_eq!(
        ok.stdout, quiet.stdout,
        "auto fell back to the same CPU run"
    );
    for args in [
        vec!["score", "--model", m, "--ids", "1,2"],
        vec!["generate", "--model", m, "--prompt", "x"],
        vec!["bench", "model", "--model", m],
        vec!["sft", "--model", m, "--data", "d.jsonl", "--out", "o"],
        vec![
            "rl",
            "--model",
            m,
            "--instances",
            "i",
            "--repos",
            "r",
            "--out",
            "o",
        ],
        vec!["eval", "--model", m, "--instances", "i", "--repos", "r"],
        vec!["repro", "--quick", "--out", "o"],
    ] {
        let mut a = args.clone();
        a.extend(["--device", "cuda"]);
        let o = sorft(&a);
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert_eq!(e.lines().count(), 1, "{args:?}: {e}");
        assert!(e.starts_with("error: --device cuda: "), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{e}");
    }
}

#[test]
fn print_config_names_the_device_key_and_what_it_resolves_to() {
    let o = sorft(&["repro", "--quick", "--print-config", "--dtype", "f32"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("device = \"auto\"\n"), "{out}");
    assert!(out.contains("dtype = \"f32\"\n"), "{out}");
    let last = out.lines().last().unwrap();
    assert!(last.starts_with("# device: cpu"), "{last}");
    assert!(last.contains("auto: CUDA unavailable"), "{last}");
    let o = sorft(&["repro", "--quick", "--print-config", "--device", "cuda"]);
    let out = text(&o.stdout);
    assert!(out.contains("device = \"cuda\"\n"), "{out}");
    assert!(out
        .lines()
        .last()
        .unwrap()
        .starts_with("# device: unavailable (--device cuda: "));
}

/// Runs `sorft ARGS` with stdout a pipe whose reading end is already closed.
fn into_closed_pipe(args: &[&str]) -> Output {
    let mut fds = [0i32; 2];
    // SAFETY: `pipe` fills two new descriptors, each owned exactly once below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", "")
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_stdout_ends_a_run_quietly() {
    let m = model();
    let m = m.to_str().unwrap();
    for args in [
        vec!["model", "info", m],
        vec!["score", "--model", m, "--ids", "1,2", "--device", "cpu"],
        vec!["repro", "--quick", "--print-config", "--device", "cpu"],
    ] {
        let o = into_closed_pipe(&args);
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {e}");
        assert!(e.is_empty(), "{args:?}: {e}");
    }
}

#[test]
fn one_token_scores_to_the_next_token_distribution() {
    let m = model();
    let m = m.to_str().unwrap();
    let o = sorft(&[
        "score", "--model", m, "--ids", "5", "--top", "3", "--device", "cpu",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let next = v["next"].as_array().unwrap();
    assert_eq!(next.len(), 3);
    let lp = |e: &serde_json::Value| e["logprob"].as_f64().unwrap();
    assert!(lp(&next[0]) >= lp(&next[1]) && lp(&next[1]) >= lp(&next[2]));
    assert!(lp(&next[0]) < 0.0);
    // The most likely next token, appended, is scored with exactly that log-probability.
    let best = next[0]["id"].as_u64().unwrap();
    let two = format!("5,{best}");
    let o = sorft(&["score", "--model", m, "--ids", &two, "--device", "cpu"]);
    let w: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(w["logprobs"][1].as_f64().unwrap(), lp(&next[0]));
    let o = sorft(&["score", "--model", m, "--ids", ",", "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).starts_with("error: nothing to score"));
}

#[test]
fn a_missing_model_directory_is_said_once() {
    let o = sorft(&[
        "score",
        "--model",
        "/nonexistent/m",
        "--ids",
        "1",
        "--device",
        "cpu",
    ]);
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        e.trim_end(),
        "error: /nonexistent/m: model directory not found"
    );
}

#[test]
fn bench_model_runs_on_random_weights_of_a_config() {
    let cfg = model().join("config.json");
    let cfg = cfg.to_str().unwrap();
    let args = [
        "bench",
        "model",
        "--random-config",
        cfg,
        "--device",
        "cpu",
        "--prompt-len",
        "8",
        "--new-tokens",
        "2",
        "--batch",
        "2",
        "--repeats",
        "1",
        "--group",
        "0",
    ];
    let o = sorft(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["random_weights"], true);
    assert!(v["decode_tokens_per_s"]["batch_2"].as_f64().unwrap() > 0.0);
    // Neither a model nor a config: clap's one-line usage error, no panic.
    let o = sorft(&["bench", "model", "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!text(&o.stderr).contains("panicked"));
    // A config that is not JSON: a one-line error naming the file.
    let dir = std::env::temp_dir().join(format!("sorft-bench-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("config.json");
    std::fs::write(&bad, "{not json").unwrap();
    let o = sorft(&[
        "bench",
        "model",
        "--random-config",
        bad.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("config.json"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}
