//! `sorft sandbox gold` on the task generator's output: every gold patch must resolve its
//! instance inside the sandbox.

use std::process::Command;

#[test]
fn gold_patches_of_generated_instances_all_resolve() {
    let base = sorft::sandbox::workspace::default_base();
    let d = tempfile::Builder::new()
        .prefix("sorft-gold-")
        .tempdir_in(base.parent().unwrap())
        .unwrap();
    let cfg = sorft::swe::synth::SynthConfig {
        n: 6,
        seed: 7,
        ..Default::default()
    };
    let report = sorft::swe::synth::generate(&cfg, d.path(), &|_| {}).unwrap();
    assert_eq!(report.instances.len(), 6);
    let out = d.path().join("gold.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["sandbox", "gold", "--timeout", "60", "--instances"])
        .arg(d.path().join("instances.jsonl"))
        .arg("--repos")
        .arg(d.path().join("repos"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("100.0% resolved"), "{stdout}");
    let results = std::fs::read_to_string(&out).unwrap();
    assert_eq!(results.lines().count(), 6);
    for line in results.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["status"], "resolved", "{line}");
        assert_eq!(
            v["process"]["layers"]["missing"].as_array().map(Vec::len),
            Some(0)
        );
    }
}
