//! `sorft faultbench --quick` end to end (the CI-sized benchmark): 16 short runs of a fresh tiny
//! model, four faults injected and their clean twins, scored against the two baselines. The
//! faults caught by hard rules (a learning-rate jump, sandbox errors) must be caught whatever the
//! CPU's rounding does to the rollouts; the report and the records must be complete.

use std::process::Command;

#[test]
fn the_quick_benchmark_runs_scores_and_catches_the_planted_settings_and_sandbox_faults() {
    let out = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["faultbench", "--quick", "--threads", "2", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["runs"], 16, "{summary}");
    assert_eq!(summary["errors"], 0);
    let rft = summary["scores"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["detector"] == "rft-fm")
        .expect("an RFT-FM row");
    // by_type: fault -> [runs, detected] on the test seed.
    for fault in ["lr_too_high", "sandbox_failure"] {
        assert_eq!(
            rft["by_type"][fault],
            serde_json::json!([1, 1]),
            "{fault}: {rft}"
        );
    }
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    for needle in [
        "| rft-fm |",
        "| z-score |",
        "| static-threshold |",
        "confusion",
    ] {
        assert!(report.contains(needle), "{needle} missing from the report");
    }
    let runs = std::fs::read_dir(out.path().join("runs")).unwrap().count();
    assert_eq!(runs, 16);
}
