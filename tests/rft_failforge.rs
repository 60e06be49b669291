//! FailForge end to end: `sorft repro --quick` with `stage1.failforge = true` adds the recovered
//! examples to the stage-1 corpus and the section to the report; `sorft failforge` over a plain run
//! writes the library and corpora, stores recovered prompts exactly as unguided prompts, retries
//! through an OpenAI-compatible endpoint (a mock server here), and bad input is a one-line error.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

/// A mock OpenAI-compatible endpoint answering every request with `reply`; records the bodies.
fn serve(reply: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let b = bodies.clone();
    std::thread::spawn(move || {
        while let Ok((mut s, _)) = listener.accept() {
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut req = vec![0u8; len];
            let _ = r.read_exact(&mut req);
            b.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&req).to_string());
            let body = serde_json::json!({"choices": [{"message": {"role": "assistant", "content": reply}}]})
                .to_string();
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (format!("http://{addr}/v1"), bodies)
}

fn sorft(args: &[&str], out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(args)
        .arg(out)
        .args(["--device", "cpu"])
        .output()
        .unwrap()
}

fn lines(p: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn failforge_in_repro_and_over_a_finished_run() {
    let plain = tempfile::tempdir().unwrap();
    let o = sorft(&["repro", "--quick", "--out"], plain.path());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Standalone over the plain run.
    let ff = plain.path().join("ff");
    let o = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["failforge", "--device", "cpu", "--run"])
        .arg(plain.path())
        .arg("--out")
        .arg(&ff)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let md = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "## FailForge",
        "| all |",
        "Leakage:",
        "extra teacher samples",
    ] {
        assert!(md.contains(needle), "{needle}:\n{md}");
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ff.join("report.json")).unwrap()).unwrap();
    let failed: u64 = report["subtasks"]
        .as_object()
        .unwrap()
        .values()
        .map(|c| c["failed"].as_u64().unwrap())
        .sum();
    assert!(failed > 0, "{report}");
    // Recovered examples carry the unguided prompt: no skill section, and it is a training prompt.
    let recovered = lines(&ff.join("recovered.jsonl"));
    let kept = lines(&ff.join("skill_kept.jsonl"));
    assert_eq!(recovered.len(), kept.len());
    for (r, k) in recovered.iter().zip(&kept) {
        let p = r["messages"][0]["content"].as_str().unwrap();
        let g = k["messages"][0]["content"].as_str().unwrap();
        assert!(!p.contains("### Skill learned") && g.starts_with("### Skill learned"));
        assert!(g.ends_with(p));
    }
    let skills: BTreeSet<String> = lines(&ff.join("skills.jsonl"))
        .iter()
        .map(|s| s["text"].as_str().unwrap().to_string())
        .collect();
    assert!(!skills.is_empty());
    assert!(
        report["teacher"].as_str().unwrap().starts_with("follow"),
        "{report}"
    );

    // The retries through an OpenAI-compatible endpoint: guided prompts carry the skill section,
    // the plain second attempt's prompts do not.
    let (url, bodies) = serve("<think>t</think>\n```\nnot/a/file.py\n```");
    let ffe = plain.path().join("ff_endpoint");
    let o = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args([
            "failforge",
            "--device",
            "cpu",
            "--retry-teacher",
            "endpoint",
        ])
        .args(["--retry-endpoint-url", &url, "--run"])
        .arg(plain.path())
        .arg("--out")
        .arg(&ffe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ffe.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["teacher"], "endpoint");
    let bodies = bodies.lock().unwrap().clone();
    let guided = bodies
        .iter()
        .filter(|b| b.contains("### Skill learned"))
        .count();
    let retried: u64 = report["subtasks"]
        .as_object()
        .unwrap()
        .values()
        .map(|c| c["retried"].as_u64().unwrap())
        .sum();
    assert!(retried > 0, "{report}");
    assert_eq!((guided as u64, bodies.len() as u64), (retried, 2 * retried));
    // The endpoint's answers name a file no prompt shows: nothing is recovered.
    assert!(lines(&ffe.join("recovered.jsonl")).is_empty());

    // The hook: the same run with the stage on adds exactly the recovered examples (renamed twice).
    let with = tempfile::tempdir().unwrap();
    let o = sorft(
        &[
            "repro",
            "--quick",
            "--set",
            "stage1.failforge=true",
            "--out",
        ],
        with.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = std::fs::read_to_string(with.path().join("report.md")).unwrap();
    assert!(report.contains("## FailForge"), "{report}");
    let n_plain = lines(&plain.path().join("stage1_sft.jsonl")).len();
    let n_with = lines(&with.path().join("stage1_sft.jsonl")).len();
    let n_rec = lines(&with.path().join("failforge").join("recovered.jsonl")).len();
    assert_eq!(n_with, n_plain + 2 * n_rec);

    // A run that already used the stage is refused, with one line.
    let o = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["failforge", "--device", "cpu", "--run"])
        .arg(with.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("already used FailForge"), "{err}");
}

#[test]
fn bad_input_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["failforge", "--device", "cpu", "--run"])
        .arg(dir.path().join("missing"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("missing") && err.trim().lines().count() <= 2,
        "{err}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["failforge", "--diagnoser", "model", "--run"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(["failforge", "--retry-teacher", "endpoint", "--run"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}
