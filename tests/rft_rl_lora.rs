//! LoRA RL with the adapters-off reference: one copy of the base weights, a reference that is
//! exactly the base model, rollouts from the adapted policy, updates that touch only adapters,
//! bitwise resume, the PEFT export, one-line errors, and the sampler/trainer mismatch check.

mod train_util;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use sorft::engine::{Backend, Cpu, SamplingParams};
use sorft::model::adapter::Adapters;
use sorft::model::generate::{generate_adapted, GenOptions, GenRequest};
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::model::{load_dir, Model};
use sorft::rft::mismatch::{reconcile, Rescore};
use sorft::rft::monitor::MonitorMode;
use sorft::rft::rl::{Algorithm, RlConfig, RlTrainer};
use sorft::rft::rl_run::{run_rl, RlRun};
use sorft::train::forward::{forward, Batch, ForwardOptions, Sequence};
use sorft::train::lora::Lora;
use sorft::train::params::model_params;

fn cfg(alg: Algorithm) -> RlConfig {
    RlConfig {
        algorithm: alg,
        steps: 2,
        prompts_per_step: 2,
        group_size: 2,
        minibatch: 4,
        ppo_epochs: 1,
        lr: 2e-2,
        max_new_tokens: 6,
        entropy_coef: 0.01,
        save_every: 0,
        seed: 5,
        lora: 4,
        lora_alpha: 8.0,
        ..Default::default()
    }
}

fn tiny(seed: u64) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    init_model(Preset::Tiny, d.path(), seed, &[EMBEDDED_CORPUS.to_string()]).unwrap();
    d
}

fn host(m: &Model<Cpu>) -> Vec<Vec<f32>> {
    model_params(m)
        .into_iter()
        .map(|(_, t)| Cpu.to_host_f32(t).unwrap())
        .collect()
}

fn adapters(l: &Lora<Cpu>) -> Vec<Vec<f32>> {
    l.params()
        .into_iter()
        .map(|(_, t)| Cpu.to_host_f32(t).unwrap())
        .collect()
}

/// Per-row log-probabilities of `seqs` under the training forward of `m` (+ `lora`).
fn train_logp(m: &Model<Cpu>, lora: Option<&Lora<Cpu>>, seqs: &[Sequence]) -> Vec<f32> {
    let b = Batch::pack(seqs).unwrap();
    let f = forward(m, lora, &b, ForwardOptions::default()).unwrap();
    Cpu.to_host_f32(&f.logp).unwrap()
}

#[test]
fn lora_steps_change_only_adapters_and_the_reference_is_the_base_model_exactly() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tiny(1);
    for alg in [Algorithm::Grpo, Algorithm::Ppo] {
        let (mut base, tok) = load_dir(&Cpu, mdir.path()).unwrap();
        let tok = tok.unwrap();
        let (fresh, _) = load_dir(&Cpu, mdir.path()).unwrap();
        let mut tr = RlTrainer::new(&base, &tok, &items, cfg(alg)).unwrap();
        let a0 = adapters(tr.lora.as_ref().unwrap());
        let mut kls = Vec::new();
        for _ in 0..2 {
            let m = tr.step_adapters_off(&mut base, &tok, &items).unwrap();
            assert!(m.kl.is_finite() && m.reward_mean.is_finite());
            kls.push(m.kl);
        }
        // B starts at zero: the first rollouts come from the reference itself.
        assert!(kls[0].abs() < 1e-4, "{alg:?}: step-1 kl {}", kls[0]);
        assert!(kls[1..].iter().any(|k| k.abs() > 1e-6), "{alg:?}: {kls:?}");
        // The base weights are bit for bit those on disk; only the adapters moved.
        assert!(
            host(&base) == host(&fresh),
            "{alg:?}: a base weight changed"
        );
        let lora = tr.lora.as_ref().unwrap();
        let a1 = adapters(lora);
        assert!(a0 != a1, "{alg:?}: adapters unchanged");
        assert!(
            lora.params()
                .iter()
                .filter(|(n, _)| n.contains("lora_B"))
                .any(|(_, t)| Cpu.to_host_f32(t).unwrap().iter().any(|&x| x != 0.0)),
            "{alg:?}: every B still zero"
        );
        // The reference forward (adapters off) is the base model's, exactly; the policy's is not.
        let seq = Sequence {
            ids: vec![1, 5, 9, 40, 7, 3, 100, 2],
            mask: vec![0, 1, 1, 1, 1, 1, 1, 1],
            weight: 1.0,
        };
        let off = train_logp(&base, None, std::slice::from_ref(&seq));
        assert_eq!(off, train_logp(&fresh, None, std::slice::from_ref(&seq)));
        assert_ne!(
            off,
            train_logp(&base, Some(lora), std::slice::from_ref(&seq))
        );
        let (lp_off, _) = base.score(&seq.ids).unwrap();
        assert_eq!(lp_off, fresh.score(&seq.ids).unwrap().0);
    }
}

fn run(model: &Path, out: &Path, resume: bool) -> RlRun {
    RlRun {
        model: model.to_path_buf(),
        out: out.to_path_buf(),
        resume,
        device: None,
        ptx_data: None,
    }
}

#[test]
fn a_lora_run_holds_one_copy_resumes_bitwise_and_exports_a_peft_adapter() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tiny(2);
    let out = tempfile::tempdir().unwrap();
    let c = cfg(Algorithm::Ppo);
    let never = AtomicBool::new(false);
    let a = run_rl(
        &Cpu,
        &run(mdir.path(), &out.path().join("a"), false),
        &c,
        &items,
        &never,
        &mut |_| {},
    )
    .unwrap();
    // One copy: the base model's bytes plus the adapters', by hand for the tiny config.
    let (base, _) = load_dir(&Cpu, mdir.path()).unwrap();
    let base_bytes: u64 = model_params(&base)
        .iter()
        .map(|(_, t)| (t.numel() * t.dtype().size()) as u64)
        .sum();
    let mc = &base.config;
    let (d, q, kv, i) = (
        mc.hidden_size,
        mc.num_heads * mc.head_dim,
        mc.num_kv_heads * mc.head_dim,
        mc.intermediate_size,
    );
    // r * (in + out) per projection: q, k, v, o, gate, up, down.
    let per_layer = 4 * ((d + q) + 2 * (d + kv) + (q + d) + 2 * (d + i) + (i + d));
    let adapter_bytes = (4 * per_layer * mc.num_layers) as u64;
    assert_eq!(a.weight_bytes, base_bytes + adapter_bytes);
    let full = RlConfig {
        lora: 0,
        steps: 1,
        ..c.clone()
    };
    let f = run_rl(
        &Cpu,
        &run(mdir.path(), &out.path().join("full"), false),
        &full,
        &items,
        &never,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(
        f.weight_bytes,
        2 * base_bytes,
        "full fine-tuning holds two copies"
    );
    // Stopped after step 1, then resumed: the same adapters and merged model, bit for bit.
    let stop = AtomicBool::new(false);
    let b1 = run_rl(
        &Cpu,
        &run(mdir.path(), &out.path().join("b"), false),
        &c,
        &items,
        &stop,
        &mut |m| {
            if m.step == 1 {
                stop.store(true, Ordering::SeqCst)
            }
        },
    )
    .unwrap();
    assert!(b1.final_dir.is_none());
    let ck = std::fs::read_dir(out.path().join("b/checkpoints"))
        .unwrap()
        .count();
    assert!(ck >= 1);
    let b = run_rl(
        &Cpu,
        &run(mdir.path(), &out.path().join("b"), true),
        &c,
        &items,
        &never,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(b.resumed_from, 1);
    for (x, y) in a.metrics.iter().zip(&b.metrics) {
        assert_eq!((x.step, x.reward_mean, x.kl), (y.step, y.reward_mean, y.kl));
    }
    let read = |p: &Path| std::fs::read(p.join("adapter_model.safetensors")).unwrap();
    let (ad_a, ad_b) = (out.path().join("a/adapter"), out.path().join("b/adapter"));
    assert!(read(&ad_a) == read(&ad_b), "resumed adapters differ");
    let fa = std::fs::read(a.final_dir.unwrap().join("model.safetensors")).unwrap();
    let fb = std::fs::read(b.final_dir.unwrap().join("model.safetensors")).unwrap();
    assert!(fa == fb, "resumed merged model differs");
    // The PEFT adapter reads back; merged into the base it gives the exported model.
    let cfgj: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ad_a.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        (cfgj["r"].as_u64(), cfgj["lora_alpha"].as_f64()),
        (Some(4), Some(8.0))
    );
    assert_eq!(cfgj["target_modules"].as_array().unwrap().len(), 7);
    let lora = Lora::load_peft(&Cpu, &ad_a, mc).unwrap();
    let (mut merged, _) = load_dir(&Cpu, mdir.path()).unwrap();
    sorft::train::sft::own_weights(&mut merged).unwrap();
    lora.merge_into(&mut merged).unwrap();
    let (exported, _) = load_dir(&Cpu, &out.path().join("a/final")).unwrap();
    assert!(host(&merged) == host(&exported));
    assert!(
        host(&exported) != host(&base),
        "the merged policy did not move"
    );
}

#[test]
fn bad_lora_settings_give_one_line_errors() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tiny(3);
    let (base, tok) = load_dir(&Cpu, mdir.path()).unwrap();
    let tok = tok.unwrap();
    let hidden = base.config.hidden_size;
    let bad = [
        (
            RlConfig {
                lora: hidden + 1,
                ..cfg(Algorithm::Grpo)
            },
            "exceeds the model's hidden size",
        ),
        (
            RlConfig {
                lora_alpha: f32::NAN,
                ..cfg(Algorithm::Grpo)
            },
            "alpha",
        ),
        (
            RlConfig {
                monitor: MonitorMode::Remediate,
                ..cfg(Algorithm::Grpo)
            },
            "remediate",
        ),
        (
            RlConfig {
                tis_cap: 0.0,
                ..cfg(Algorithm::Grpo)
            },
            "tis_cap",
        ),
    ];
    let never = AtomicBool::new(false);
    for (k, (c, want)) in bad.iter().enumerate() {
        let e = RlTrainer::new(&base, &tok, &items, c.clone())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(want) && !e.contains('\n'), "case {k}: {e}");
        let out = tempfile::tempdir().unwrap();
        let e = run_rl(
            &Cpu,
            &run(mdir.path(), out.path(), false),
            c,
            &items,
            &never,
            &mut |_| {},
        )
        .err()
        .unwrap();
        assert!(format!("{e:#}").contains(want), "case {k}: {e:#}");
    }
    // The adapters-off reference without adapters is refused, not silently the policy itself.
    let mut full = RlTrainer::new(
        &base,
        &tok,
        &items,
        RlConfig {
            lora: 0,
            ..cfg(Algorithm::Grpo)
        },
    )
    .unwrap();
    let (mut p, _) = load_dir(&Cpu, mdir.path()).unwrap();
    let e = full
        .step_adapters_off(&mut p, &tok, &items)
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs LoRA"), "{e}");
    // The command line: rank 0 is refused before anything is loaded.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args([
            "rl",
            "--model",
            "/nonexistent",
            "--instances",
            "x",
            "--repos",
            "y",
        ])
        .args(["--out", "z", "--lora", "0", "--device", "cpu"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--lora"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Sampled (response) log-probabilities of a few rollouts of `m` with `gen` adapters, and the
/// training forward's of the same tokens with `lora`.
fn sampler_vs_trainer(
    m: &Model<Cpu>,
    gen: Option<&Lora<Cpu>>,
    lora: Option<&Lora<Cpu>>,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let prompts: Vec<Vec<u32>> = vec![vec![1, 17, 33, 8], vec![2, 90, 4, 4, 61]];
    let reqs: Vec<GenRequest> = prompts
        .iter()
        .enumerate()
        .map(|(k, p)| GenRequest {
            prompt: p.clone(),
            params: SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                seed: 11 + k as u64,
            },
            max_new_tokens: 8,
            ..Default::default()
        })
        .collect();
    let outs =
        generate_adapted(m, Adapters::new(gen), None, &reqs, &GenOptions::default()).unwrap();
    let mut sampler = Vec::new();
    let mut trainer = Vec::new();
    for (p, o) in prompts.iter().zip(&outs) {
        let mut ids = p.clone();
        ids.extend(&o.ids);
        let mut mask = vec![0u8; p.len()];
        mask.extend(vec![1u8; o.ids.len()]);
        let rows = train_logp(
            m,
            lora,
            &[Sequence {
                ids,
                mask,
                weight: 1.0,
            }],
        );
        trainer.push(rows[p.len() - 1..p.len() - 1 + o.ids.len()].to_vec());
        sampler.push(o.logprobs.clone());
    }
    (sampler, trainer)
}

#[test]
fn rollouts_see_the_lora_policy_and_a_planted_mismatch_is_caught() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tiny(4);
    let (mut base, tok) = load_dir(&Cpu, mdir.path()).unwrap();
    let tok = tok.unwrap();
    let c = RlConfig {
        rescore: Rescore::On,
        ..cfg(Algorithm::Grpo)
    };
    let mut tr = RlTrainer::new(&base, &tok, &items, c).unwrap();
    let mut maxes = Vec::new();
    for _ in 0..2 {
        let m = tr.step_adapters_off(&mut base, &tok, &items).unwrap();
        if m.trained_sequences > 0 {
            maxes.push(
                m.rollout_probs_diff_max
                    .expect("re-scored steps log the gap"),
            );
            assert!(m.rollout_probs_diff_mean.unwrap() <= m.rollout_probs_diff_max.unwrap());
        }
    }
    // On the CPU the sampler and the trainer agree, adapters included.
    assert!(
        !maxes.is_empty() && maxes.iter().all(|&x| x < 1e-3),
        "{maxes:?}"
    );
    let lora = tr.lora.as_ref().unwrap();
    // Rollouts through the adapted forward match the adapted trainer.
    let (s, t) = sampler_vs_trainer(&base, Some(lora), Some(lora));
    let ok = reconcile(s, Some(t), 2.0).unwrap();
    assert!(ok.diff.unwrap().max < 1e-3, "{:?}", ok.diff);
    // Planted fault: rollouts decoded from the base (adapters lost in generation) are caught.
    let (s, t) = sampler_vs_trainer(&base, None, Some(lora));
    let bad = reconcile(s, Some(t), 2.0).unwrap();
    let d = bad.diff.unwrap();
    assert!(d.max > 10.0 * ok.diff.unwrap().max.max(1e-5), "{d:?}");
    assert!(bad.weights.iter().flatten().all(|&w| w > 0.0 && w <= 2.0));
    // Without re-scoring on the CPU (auto) nothing is compared.
    let mut auto = RlTrainer::new(&base, &tok, &items, cfg(Algorithm::Grpo)).unwrap();
    let m = auto.step_adapters_off(&mut base, &tok, &items).unwrap();
    assert_eq!(m.rollout_probs_diff_max, None);
}

/// Step time and weight memory of full vs LoRA RL on the small preset, alternating in one
/// process (a measurement, not a check): `cargo test --test rft_rl_lora -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_full_vs_lora_steps_on_the_small_preset() {
    let data = tempfile::tempdir().unwrap();
    let items = train_util::rl_items(data.path());
    let mdir = tempfile::tempdir().unwrap();
    init_model(
        Preset::Small,
        mdir.path(),
        1,
        &[EMBEDDED_CORPUS.to_string()],
    )
    .unwrap();
    let c = RlConfig {
        steps: 100,
        prompts_per_step: 2,
        group_size: 4,
        minibatch: 8,
        ppo_epochs: 1,
        max_new_tokens: 32,
        entropy_coef: 0.01,
        seed: 1,
        ..Default::default()
    };
    let (mut policy, tok) = load_dir(&Cpu, mdir.path()).unwrap();
    let tok = tok.unwrap();
    sorft::train::sft::own_weights(&mut policy).unwrap();
    let (reference, _) = load_dir(&Cpu, mdir.path()).unwrap();
    let (mut base, _) = load_dir(&Cpu, mdir.path()).unwrap();
    let mut full = RlTrainer::new(&policy, &tok, &items, c.clone()).unwrap();
    let mut lora = RlTrainer::new(&base, &tok, &items, RlConfig { lora: 8, ..c }).unwrap();
    let bytes = |m: &Model<Cpu>| -> u64 {
        model_params(m)
            .iter()
            .map(|(_, t)| (t.numel() * t.dtype().size()) as u64)
            .sum()
    };
    let ad: u64 = lora
        .lora
        .as_ref()
        .unwrap()
        .params()
        .iter()
        .map(|(_, t)| 4 * t.numel() as u64)
        .sum();
    println!(
        "weights: full {} B (policy + reference), lora {} B (base + adapters)",
        2 * bytes(&policy),
        bytes(&base) + ad
    );
    let (mut tf, mut tl) = (Vec::new(), Vec::new());
    for round in 0..3 {
        let m = full.step(&mut policy, &reference, &tok, &items).unwrap();
        println!(
            "round {round} full: rollout {:.2}s train {:.2}s tok/s {:.0}",
            m.time_rollout, m.time_train, m.rollout_tokens_per_s
        );
        tf.push(m.time_rollout + m.time_train);
        let m = lora.step_adapters_off(&mut base, &tok, &items).unwrap();
        println!(
            "round {round} lora: rollout {:.2}s train {:.2}s tok/s {:.0}",
            m.time_rollout, m.time_train, m.rollout_tokens_per_s
        );
        tl.push(m.time_rollout + m.time_train);
    }
    println!(
        "mean step: full {:.2}s lora {:.2}s",
        tf.iter().sum::<f64>() / 3.0,
        tl.iter().sum::<f64>() / 3.0
    );
}
