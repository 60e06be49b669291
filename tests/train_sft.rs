//! Supervised fine-tuning end to end: learning a synthetic task, exact resume (in process and
//! after SIGKILL of the binary), corrupt checkpoints, Ctrl-C.

mod train_util;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use sorft::engine::Cpu;
use sorft::model::Model;
use sorft::train::data::{encode_examples, read_chat_jsonl};
use sorft::train::sft::{eval_loss, greedy_exact_match, run_sft, Resume, SftConfig};
use sorft::train::TrainError;
use train_util::*;

fn config(root: &Path, out: &str) -> SftConfig {
    let mut c = SftConfig {
        model: root.join("base"),
        data: root.join("train.jsonl"),
        eval_data: Some(root.join("eval.jsonl")),
        out: root.join(out),
        epochs: 3,
        batch_tokens: 384,
        save_every: 0,
        keep_last: 2,
        seed: 3,
        ..SftConfig::default()
    };
    c.optim.lr = 5e-3;
    c
}

fn setup(n_train: usize) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    tiny_preset(&root.path().join("base"), 1);
    std::fs::write(root.path().join("train.jsonl"), animal_jsonl(n_train, 10)).unwrap();
    std::fs::write(root.path().join("eval.jsonl"), animal_jsonl(24, 999)).unwrap();
    root
}

fn quiet() -> impl FnMut(sorft::train::sft::SftEvent) {
    |_| {}
}

#[test]
fn sft_lowers_held_out_loss_and_beats_the_untrained_model_on_exact_match() {
    let root = setup(320);
    let r = root.path();
    let cfg = config(r, "run");
    let stop = AtomicBool::new(false);
    let base = Model::load(&Cpu, &cfg.model).unwrap();
    let tok = sorft::model::Tokenizer::from_file(&cfg.model.join("tokenizer.json")).unwrap();
    let held = read_chat_jsonl(&r.join("eval.jsonl")).unwrap();
    let (held_seqs, _) = encode_examples(&tok, &held, 512).unwrap();
    let (before, n) = eval_loss(&base, None, &held_seqs, 512, 64).unwrap();
    assert!(n > 0);
    let em_before = greedy_exact_match(&base, &tok, &held, 4).unwrap();

    let out = run_sft(&Cpu, &cfg, Resume::No, &stop, &mut quiet()).unwrap();
    assert_eq!(out.steps_done, out.total_steps);
    let trained = Model::load(&Cpu, out.final_dir.as_ref().unwrap()).unwrap();
    let (after, _) = eval_loss(&trained, None, &held_seqs, 512, 64).unwrap();
    let em_after = greedy_exact_match(&trained, &tok, &held, 4).unwrap();
    assert!(after < 0.5 * before, "held-out loss {before} -> {after}");
    assert!(
        em_after > em_before && em_after >= 0.5,
        "exact match {em_before} -> {em_after}"
    );
    // The run's own held-out number agrees with a fresh evaluation of the export.
    assert!((out.eval_loss.unwrap() - after).abs() < 1e-4);
    // Metrics: one line per step plus the eval, losses finite and decreasing overall.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(cfg.out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let losses: Vec<f64> = lines.iter().filter_map(|v| v["loss"].as_f64()).collect();
    assert_eq!(losses.len() as u64, out.total_steps);
    assert!(losses.last().unwrap() < &losses[0]);
    assert!(lines.iter().any(|v| v["eval_loss"].is_number()));
}

fn weights_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("model.safetensors")).unwrap()
}

#[test]
fn stopping_and_resuming_gives_bit_identical_weights() {
    let root = setup(64);
    let r = root.path();
    let stop = AtomicBool::new(false);
    let mut cfg = config(r, "full");
    cfg.grad_accum = 2;
    cfg.optim.weight_decay = 0.01;
    cfg.warmup_ratio = 0.3;
    let a = run_sft(&Cpu, &cfg, Resume::No, &stop, &mut quiet()).unwrap();
    assert!(a.total_steps >= 4, "{} steps", a.total_steps);

    let mut cfg_b = config(r, "split");
    cfg_b.grad_accum = 2;
    cfg_b.optim.weight_decay = 0.01;
    cfg_b.warmup_ratio = 0.3;
    cfg_b.max_steps = 2;
    let b1 = run_sft(&Cpu, &cfg_b, Resume::No, &stop, &mut quiet()).unwrap();
    assert_eq!(b1.steps_done, 2);
    assert!(b1.final_dir.is_none());
    cfg_b.max_steps = 0;
    let b2 = run_sft(
        &Cpu,
        &cfg_b,
        Resume::Latest { fallback: false },
        &stop,
        &mut quiet(),
    )
    .unwrap();
    assert_eq!(b2.steps_done, a.steps_done);
    assert_eq!(
        weights_bytes(a.final_dir.as_ref().unwrap()),
        weights_bytes(b2.final_dir.as_ref().unwrap())
    );
    // Metrics of the resumed run continue from the checkpoint without duplicates.
    let steps: Vec<u64> = std::fs::read_to_string(cfg_b.out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["loss"].is_number())
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (1..=a.total_steps).collect::<Vec<_>>());
}

fn eval_losses(out: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| Some((v["step"].as_u64()?, v["eval_loss"].as_f64()?)))
        .collect()
}

#[test]
fn an_eval_loss_under_the_limit_ends_the_run_early_and_resuming_ends_it_at_the_same_step() {
    let root = setup(96);
    let r = root.path();
    let stop = AtomicBool::new(false);
    let mut cfg = config(r, "full");
    cfg.eval_every = 2;
    let full = run_sft(&Cpu, &cfg, Resume::No, &stop, &mut quiet()).unwrap();
    let evals = eval_losses(&cfg.out);
    assert!(evals.len() >= 3, "{evals:?}");
    // The limit: just above the first evaluation that beats every earlier one, before the end.
    let (k, limit) = evals
        .iter()
        .enumerate()
        .skip(1)
        .find(|(i, (s, l))| *s < full.total_steps && evals[..*i].iter().all(|(_, e)| e > l))
        .map(|(_, (s, l))| (*s, l + 1e-9))
        .expect("held-out loss never improved");

    let mut early = config(r, "early");
    early.eval_every = 2;
    early.stop_below_eval = Some(limit);
    let a = run_sft(&Cpu, &early, Resume::No, &stop, &mut quiet()).unwrap();
    assert_eq!(a.steps_done, k);
    assert!(a.steps_done < a.total_steps);
    assert!(!a.interrupted);
    let final_a = weights_bytes(a.final_dir.as_ref().unwrap());
    assert_ne!(final_a, weights_bytes(full.final_dir.as_ref().unwrap()));
    // Resuming the finished run from its checkpoint stops at once with the same model.
    let b = run_sft(
        &Cpu,
        &early,
        Resume::Latest { fallback: false },
        &stop,
        &mut quiet(),
    )
    .unwrap();
    assert_eq!(b.steps_done, k);
    assert_eq!(final_a, weights_bytes(b.final_dir.as_ref().unwrap()));
    // A limit never reached runs every step.
    let mut never = config(r, "never");
    never.eval_every = 2;
    never.stop_below_eval = Some(0.0);
    let c = run_sft(&Cpu, &never, Resume::No, &stop, &mut quiet()).unwrap();
    assert_eq!(c.steps_done, full.total_steps);
    assert_eq!(
        weights_bytes(c.final_dir.as_ref().unwrap()),
        weights_bytes(full.final_dir.as_ref().unwrap())
    );
}

#[test]
fn a_corrupt_checkpoint_is_refused_and_fallback_uses_the_previous_good_one() {
    let root = setup(64);
    let r = root.path();
    let stop = AtomicBool::new(false);
    let mut cfg = config(r, "run");
    cfg.save_every = 1;
    cfg.keep_last = 3;
    cfg.max_steps = 3;
    run_sft(&Cpu, &cfg, Resume::No, &stop, &mut quiet()).unwrap();
    let ckpts = sorft::train::checkpoint::list(&cfg.out.join("checkpoints")).unwrap();
    assert_eq!(ckpts.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    let bad = ckpts[2].1.join("model.safetensors");
    let mut bytes = std::fs::read(&bad).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&bad, bytes).unwrap();
    cfg.max_steps = 0;
    let err = run_sft(
        &Cpu,
        &cfg,
        Resume::Latest { fallback: false },
        &stop,
        &mut quiet(),
    )
    .expect_err("a corrupt checkpoint must be refused");
    let msg = err.to_string();
    assert!(matches!(err, TrainError::Corrupt { .. }), "{msg}");
    assert!(
        msg.contains("step-00000003") && msg.contains("model.safetensors"),
        "{msg}"
    );
    let mut events = Vec::new();
    let out = run_sft(
        &Cpu,
        &cfg,
        Resume::Latest { fallback: true },
        &stop,
        &mut |e| events.push(format!("{e:?}")),
    )
    .unwrap();
    assert_eq!(out.steps_done, out.total_steps);
    assert!(
        events
            .iter()
            .any(|e| e.contains("Start") && e.contains("start_step: 2")),
        "{events:?}"
    );
    // Keep-last pruning left at most three checkpoints.
    assert!(
        sorft::train::checkpoint::list(&cfg.out.join("checkpoints"))
            .unwrap()
            .len()
            <= 3
    );
}

fn sorft() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sorft"));
    c.arg("--threads").arg("2");
    c
}

fn sft_args(out: &str, save_every: u32) -> Vec<String> {
    [
        "sft",
        "--model",
        "base",
        "--data",
        "train.jsonl",
        "--eval-data",
        "eval.jsonl",
        "--out",
        out,
        "--epochs",
        "2",
        "--batch-tokens",
        "128",
        "--lr",
        "3e-3",
        "--seed",
        "5",
        "--keep-last",
        "50",
        "--no-progress",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["--save-every".to_string(), save_every.to_string()])
    .collect()
}

fn wait_for(p: &Path, limit: Duration) {
    let t0 = Instant::now();
    while !p.exists() {
        assert!(t0.elapsed() < limit, "{} did not appear", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn final_weights(dir: &Path) -> Vec<u8> {
    weights_bytes(&dir.join("final"))
}

#[test]
fn sigkill_then_resume_gives_bit_identical_weights() {
    // Enough steps (about 80) that the run is still going when it is killed at step 3.
    let root = setup(200);
    let r = root.path();
    let st = sorft()
        .current_dir(r)
        .args(sft_args("a", 0))
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let total = sorft::train::checkpoint::list(&r.join("a/checkpoints")).unwrap()[0].0;
    assert!(total >= 40, "{total} steps");

    let mut child = sorft()
        .current_dir(r)
        .args(sft_args("b", 3))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        &r.join("b/checkpoints/step-00000003"),
        Duration::from_secs(60),
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !r.join("b/final").exists(),
        "the run finished before it was killed"
    );
    let st = sorft()
        .current_dir(r)
        .args(sft_args("b", 3))
        .arg("--resume")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(st.status.success(), "{err}");
    assert!(!err.contains("starting at step 0"), "{err}");
    assert_eq!(final_weights(&r.join("a")), final_weights(&r.join("b")));
}

#[test]
fn ctrl_c_saves_a_checkpoint_and_exits_cleanly() {
    let root = setup(200);
    let r = root.path();
    let child = sorft()
        .current_dir(r)
        .args(sft_args("c", 3))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(
        &r.join("c/checkpoints/step-00000003"),
        Duration::from_secs(60),
    );
    // SAFETY: plain kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("interrupted at step"), "{err}");
    let last = sorft::train::checkpoint::list(&r.join("c/checkpoints"))
        .unwrap()
        .last()
        .cloned()
        .unwrap();
    sorft::train::checkpoint::verify(&last.1).unwrap();
    assert!(!r.join("c/final").exists());
}

#[test]
fn bad_data_is_a_one_line_error_naming_file_line_and_field() {
    let root = setup(8);
    let r = root.path();
    std::fs::write(
        r.join("bad.jsonl"),
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\"}]}\n{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}\n",
    )
    .unwrap();
    let out = sorft()
        .current_dir(r)
        .args([
            "sft",
            "--model",
            "base",
            "--data",
            "bad.jsonl",
            "--out",
            "o",
            "--no-progress",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap();
    assert!(
        last.starts_with("error:")
            && last.contains("bad.jsonl")
            && last.contains("line 2: messages[0].role"),
        "{err}"
    );
}
