//! `sorft repro --quick` end to end (the CI-sized run): every stage runs, the report, metrics,
//! configuration, predictions and plots are written, and the same seed gives the same report.

use std::process::Command;

fn run(out: &std::path::Path) -> String {
    run_with(out, &[])
}

fn run_with(out: &std::path::Path, sets: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sorft"));
    cmd.args(["repro", "--quick", "--seed", "3", "--out"])
        .arg(out);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let o = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    std::fs::read_to_string(out.join("report.md")).unwrap()
}

#[test]
fn quick_repro_writes_a_complete_report_deterministically() {
    let a = tempfile::tempdir().unwrap();
    let report = run(a.path());
    for needle in [
        "| initial |",
        "| sft |",
        "| sft+rl |",
        "%Resolved",
        "Stage 1 rejection sampling",
        "| file |",
        "free decoding, greedy; primary",
        "## Stage-to-stage deltas on the test split",
        "| subtask reward (free, greedy) | initial -> sft |",
        "| pipeline %Resolved | sft -> sft+rl |",
        "at the 5% level",
        "Dev split",
        "Dev split (constrained, greedy)",
        "Dev split (sampled as in stage 2)",
        "edit hit@n",
        "failed execution",
    ] {
        assert!(
            report.contains(needle),
            "report lacks {needle:?}:\n{report}"
        );
    }
    for f in [
        "rl_reward.svg",
        "rl_kl.svg",
        "rl_entropy.svg",
        "rl_override.svg",
        "rl_response_length.svg",
        "hit_rates.svg",
        "subtask_rewards.svg",
    ] {
        let svg = std::fs::read_to_string(a.path().join(f)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{f}"
        );
    }
    let metrics = std::fs::read_to_string(a.path().join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rl: Vec<&serde_json::Value> = lines.iter().filter(|v| v["stage"] == "stage2").collect();
    assert_eq!(rl.len(), 2);
    for v in &rl {
        for k in ["reward_mean", "kl", "entropy", "time_rollout", "time_train"] {
            assert!(v[k].as_f64().is_some_and(f64::is_finite), "{k}: {v}");
        }
    }
    assert_eq!(
        lines
            .iter()
            .filter(|v| v["stage"].as_str().is_some_and(|s| s.starts_with("eval:")))
            .count(),
        3
    );
    let cfg = std::fs::read_to_string(a.path().join("config.toml")).unwrap();
    assert!(cfg.contains("seed = 3"));
    let preds = std::fs::read_to_string(a.path().join("predictions_sft_rl.jsonl")).unwrap();
    for l in preds.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert!(v["instance_id"].is_string() && v["model_patch"].is_string());
    }
    // Same seed, same results (wall times differ, so compare the tables above them).
    let b = tempfile::tempdir().unwrap();
    let report_b = run(b.path());
    let cut = |r: &str| r.split("## Stage 2").next().unwrap_or("").to_string();
    assert_eq!(cut(&report), cut(&report_b));
    // The two runs side by side (`sorft data compare`): paired on the same instances, identical.
    let compare = |stage: &str| {
        Command::new(env!("CARGO_BIN_EXE_sorft"))
            .args(["data", "compare"])
            .args([a.path(), b.path()])
            .args(["--stage", stage])
            .output()
            .unwrap()
    };
    let o = compare("sft+rl");
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(md.contains("No delta is significant"), "{md}");
    assert!(md.contains("| subtask reward (free, greedy) |"), "{md}");
    // Resumed with nothing changed: every evaluation is reused (predictions not rewritten), and
    // the report is the same.
    let preds_at = |stage: &str| {
        std::fs::metadata(a.path().join(format!("predictions_{stage}.jsonl")))
            .and_then(|m| m.modified())
            .unwrap()
    };
    let before: Vec<_> = ["initial", "sft", "sft_rl"].map(preds_at).to_vec();
    let data_at = || {
        std::fs::metadata(a.path().join("data/instances.jsonl"))
            .and_then(|m| m.modified())
            .unwrap()
    };
    let data_before = data_at();
    let o = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["repro", "--quick", "--seed", "3", "--resume", "--out"])
        .arg(a.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(before, ["initial", "sft", "sft_rl"].map(preds_at).to_vec());
    // The data phase is reused too (the generator runs every candidate bug's tests).
    assert_eq!(data_before, data_at(), "the data were generated again");
    let resumed = std::fs::read_to_string(a.path().join("report.md")).unwrap();
    assert_eq!(cut(&report), cut(&resumed));
    // A broken score file is a one-line error, not a silent fallback to the predictions.
    std::fs::write(b.path().join("scores_sft.json"), "{truncated").unwrap();
    let o = compare("sft");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("malformed"), "{err}");
}

#[test]
fn a_stalled_curriculum_starts_again_from_a_new_initialisation() {
    let a = tempfile::tempdir().unwrap();
    // Every probe loss is above 0: attempt 1 stalls at step 1, attempt 2 (the last) is kept.
    let report = run_with(
        a.path(),
        &[
            "model.curriculum_patience=1",
            "model.curriculum_stall_probe=0",
            "model.curriculum_restarts=1",
            "stage1.edit_drills=6",
        ],
    );
    // The edit drills join the stage-1 training data (not the curated teacher examples), each
    // answered by a SEARCH/REPLACE block of a line its prompt shows.
    let train = std::fs::read_to_string(a.path().join("stage1_train.jsonl")).unwrap();
    let curated = std::fs::read_to_string(a.path().join("stage1_sft.jsonl")).unwrap();
    let drills: Vec<serde_json::Value> = train
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| {
            v["messages"][1]["content"]
                .as_str()
                .is_some_and(|a| a.contains("does what the issue asks"))
        })
        .collect();
    assert_eq!(drills.len(), 6, "{train}");
    assert!(!curated.contains("does what the issue asks"));
    for d in &drills {
        let answer = d["messages"][1]["content"].as_str().unwrap();
        let search = answer
            .split("<<<<<<< SEARCH\n")
            .nth(1)
            .and_then(|r| r.split("\n=======").next())
            .unwrap();
        let prompt = d["messages"][0]["content"].as_str().unwrap();
        assert!(
            prompt.contains(&format!("{search}\n")),
            "{prompt}\n{answer}"
        );
    }
    let text = std::fs::read_to_string(a.path().join("curriculum_attempts.json")).unwrap();
    let attempts: serde_json::Value = serde_json::from_str(&text).unwrap();
    let attempts = attempts.as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{text}");
    assert_eq!(attempts[0]["stalled"][0], 1, "{text}");
    assert!(attempts[1]["stalled"].is_null(), "{text}");
    assert_ne!(attempts[0]["seed"], attempts[1]["seed"]);
    assert_eq!(attempts[1]["init"], "models/random-r1");
    assert!(a.path().join("models/random-r1/model.safetensors").exists());
    assert!(a
        .path()
        .join("curriculum-r1/final/model.safetensors")
        .exists());
    assert!(report.contains("Attempt 1 stalled"), "{report}");
}
