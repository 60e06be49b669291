//! LoRA: adapter gradients are the full gradient projected through the adapter, the merged
//! export reproduces the adapted model, PEFT files round-trip, the base stays frozen and mapped.

mod train_util;

use std::sync::atomic::AtomicBool;

use sorft::engine::cpu::CpuStorage;
use sorft::engine::rng::SplitMix;
use sorft::engine::{Backend, Cpu, HostData, Tensor};
use sorft::model::Model;
use sorft::train::backward::backward;
use sorft::train::forward::{forward, Batch, ForwardOptions, Sequence};
use sorft::train::lora::{Lora, LoraConfig, LoraTarget};
use sorft::train::optim::{AdamW, OptimConfig};
use sorft::train::sft::{run_sft, Resume, SftConfig};
use sorft::train::Grads;
use train_util::*;

fn host(t: &Tensor<Cpu>) -> Vec<f32> {
    Cpu.to_host_f32(t).unwrap()
}

fn batch() -> Batch {
    Batch::pack(&[
        Sequence {
            ids: vec![3, 9, 1, 4, 22, 30, 7],
            mask: vec![0, 0, 1, 1, 1, 1, 1],
            weight: 1.0,
        },
        Sequence {
            ids: vec![5, 6, 17, 8],
            mask: vec![0, 1, 1, 1],
            weight: 1.0,
        },
    ])
    .unwrap()
}

/// Adapters on every target with random (non-zero) `B`.
fn random_lora(model: &Model<Cpu>, seed: u64) -> Lora<Cpu> {
    let cfg = LoraConfig {
        rank: 3,
        alpha: 6.0,
        targets: LoraTarget::ALL.to_vec(),
    };
    let mut l = Lora::new(&Cpu, &model.config, cfg, seed).unwrap();
    let mut r = SplitMix::new(seed + 1);
    for (name, t) in l.params_mut() {
        if name.contains("lora_B") {
            let v: Vec<f32> = randn(&mut r, t.numel()).iter().map(|x| 0.3 * x).collect();
            *t = Cpu.upload(HostData::F32(&v), t.shape()).unwrap();
        }
    }
    l
}

fn grads_of(model: &Model<Cpu>, lora: Option<&Lora<Cpu>>, b: &Batch) -> Grads<Cpu> {
    let t = b.len();
    let a: Vec<f32> = b.weights.iter().map(|&w| -w).collect();
    let e: Vec<f32> = (0..t).map(|i| 0.05 * (i % 3) as f32).collect();
    let fwd = forward(model, lora, b, ForwardOptions::default()).unwrap();
    let mut g = Grads::new(model, lora).unwrap();
    let ga = Cpu.upload(HostData::F32(&a), &[t]).unwrap();
    let ge = Cpu.upload(HostData::F32(&e), &[t]).unwrap();
    backward(model, lora, fwd, &ga, &ge, &mut g).unwrap();
    g
}

/// `c [m, n] = a [m, k] @ b [k, n]` on the host in f64.
fn mm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum();
        }
    }
    c
}

fn transpose(x: &[f32], r: usize, c: usize) -> Vec<f32> {
    let mut o = vec![0.0; r * c];
    for i in 0..r {
        for j in 0..c {
            o[j * r + i] = x[i * c + j];
        }
    }
    o
}

fn assert_close(name: &str, got: &[f32], want: &[f64]) {
    let diff: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = want.iter().map(|b| b * b).sum::<f64>().sqrt();
    assert!(norm > 0.0, "{name}: zero reference");
    assert!(
        diff <= 1e-4 * norm,
        "{name}: relative error {}",
        diff / norm
    );
}

#[test]
fn adapter_gradient_is_the_full_gradient_projected_through_the_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), false, 31);
    let lora = random_lora(&model, 32);
    let b = batch();
    let lg = grads_of(&model, Some(&lora), &b);
    assert!(lg.full.is_none());
    let mut merged = Model::load(&Cpu, dir.path()).unwrap();
    lora.merge_into(&mut merged).unwrap();
    let fg = grads_of(&merged, None, &b);
    let full = fg.full.as_ref().unwrap();
    let s = lora.scale() as f64;
    let lgr = lg.lora.as_ref().unwrap();
    for l in 0..model.config.num_layers {
        for t in LoraTarget::ALL {
            let ad = lora.adapter(l, t).unwrap();
            let gad = lgr.adapter(l, t).unwrap();
            let fb = &full.blocks[l];
            let gw = match t {
                LoraTarget::Q => &fb.q,
                LoraTarget::K => &fb.k,
                LoraTarget::V => &fb.v,
                LoraTarget::O => &fb.o,
                LoraTarget::Gate => &fb.gate,
                LoraTarget::Up => &fb.up,
                LoraTarget::Down => &fb.down,
            };
            let (out, inp) = t.dims(&model.config);
            let r = lora.config.rank;
            let (g, a, bm) = (host(gw), host(&ad.a), host(&ad.b));
            // dB = s G A^T  [out, r];  dA = s B^T G  [r, in].
            let want_b: Vec<f64> = mm(&g, &transpose(&a, r, inp), out, inp, r)
                .iter()
                .map(|x| s * x)
                .collect();
            let want_a: Vec<f64> = mm(&transpose(&bm, out, r), &g, r, out, inp)
                .iter()
                .map(|x| s * x)
                .collect();
            assert_close(&format!("layer {l} {t:?} B"), &host(&gad.b), &want_b);
            assert_close(&format!("layer {l} {t:?} A"), &host(&gad.a), &want_a);
        }
    }
}

#[test]
fn merged_weights_reproduce_the_adapted_models_log_probs() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), true, 41);
    let lora = random_lora(&model, 42);
    let b = batch();
    let with = forward(&model, Some(&lora), &b, ForwardOptions::default()).unwrap();
    let base = forward(&model, None, &b, ForwardOptions::default()).unwrap();
    let mut merged = Model::load(&Cpu, dir.path()).unwrap();
    lora.merge_into(&mut merged).unwrap();
    let m = forward(&merged, None, &b, ForwardOptions::default()).unwrap();
    let (lw, lb, lm) = (host(&with.logp), host(&base.logp), host(&m.logp));
    assert!(
        lw.iter().zip(&lb).any(|(a, b)| (a - b).abs() > 1e-3),
        "the adapter changes nothing"
    );
    for (a, b) in lw.iter().zip(&lm) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn peft_adapter_round_trips_with_peft_names_and_config() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(&dir.path().join("m"), false, 51);
    let mut lora = random_lora(&model, 52);
    lora.config.targets = vec![LoraTarget::Q, LoraTarget::V, LoraTarget::Down];
    for slots in lora.layers.iter_mut() {
        for (i, s) in slots.iter_mut().enumerate() {
            if ![0usize, 2, 6].contains(&i) {
                *s = None;
            }
        }
    }
    let out = dir.path().join("adapter");
    lora.save_peft(&Cpu, &out, "base/model").unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["peft_type"], "LORA");
    assert_eq!(cfg["r"], 3);
    assert_eq!(cfg["lora_alpha"].as_f64(), Some(6.0));
    assert_eq!(
        cfg["target_modules"],
        serde_json::json!(["q_proj", "v_proj", "down_proj"])
    );
    let names =
        sorft::train::checkpoint::read_f32_tensors(&out.join("adapter_model.safetensors")).unwrap();
    assert!(names.contains_key("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"));
    assert!(names.contains_key("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"));
    assert_eq!(names.len(), 2 * 2 * 3);
    let back = Lora::load_peft(&Cpu, &out, &model.config).unwrap();
    assert_eq!(back.config, lora.config);
    let (p1, p2) = (lora.params(), back.params());
    assert_eq!(p1.len(), p2.len());
    for ((n1, t1), (n2, t2)) in p1.iter().zip(&p2) {
        assert_eq!(n1, n2);
        assert_eq!(host(t1), host(t2));
    }
    // A missing tensor is a clear error naming the file and tensor.
    std::fs::write(
        out.join("adapter_config.json"),
        std::fs::read_to_string(out.join("adapter_config.json"))
            .unwrap()
            .replace("\"down_proj\"", "\"up_proj\""),
    )
    .unwrap();
    let err = Lora::load_peft(&Cpu, &out, &model.config)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("adapter_model.safetensors") && err.contains("up_proj.lora_A"),
        "{err}"
    );
}

#[test]
fn lora_training_keeps_the_base_frozen_and_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path(), false, 61);
    let before = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let cfg = LoraConfig {
        rank: 2,
        alpha: 4.0,
        targets: vec![LoraTarget::Q, LoraTarget::Up],
    };
    let mut lora = Lora::new(&Cpu, &model.config, cfg, 7).unwrap();
    let oc = OptimConfig {
        lr: 1e-2,
        total_steps: 3,
        ..OptimConfig::default()
    };
    let mut opt = AdamW::new(&Cpu, oc, &lora.params()).unwrap();
    let b = batch();
    let mut losses = Vec::new();
    for _ in 0..3 {
        let fwd = forward(&model, Some(&lora), &b, ForwardOptions::default()).unwrap();
        let lg =
            sorft::train::loss::cross_entropy(&Cpu, &fwd, &b.weights, b.trained_tokens() as f64)
                .unwrap();
        losses.push(lg.loss);
        let mut g = Grads::new(&model, Some(&lora)).unwrap();
        backward(&model, Some(&lora), fwd, &lg.g_logp, &lg.g_entropy, &mut g).unwrap();
        opt.step(&Cpu, lora.params_mut(), &mut g).unwrap();
    }
    assert!(losses[2] < losses[0], "{losses:?}");
    for blk in &model.blocks {
        for t in [&blk.q, &blk.k, &blk.up, &blk.down] {
            assert!(matches!(t.storage(), CpuStorage::Mapped(_)));
        }
    }
    assert_eq!(
        std::fs::read(dir.path().join("model.safetensors")).unwrap(),
        before
    );
}

#[test]
fn lora_sft_exports_a_peft_adapter_and_an_equivalent_merged_model() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    tiny_preset(&r.join("base"), 1);
    std::fs::write(r.join("train.jsonl"), animal_jsonl(48, 4)).unwrap();
    let mut cfg = SftConfig {
        model: r.join("base"),
        data: r.join("train.jsonl"),
        out: r.join("out"),
        batch_tokens: 256,
        lora_rank: 4,
        eval_fraction: 0.2,
        save_every: 0,
        ..SftConfig::default()
    };
    cfg.optim.lr = 1e-2;
    let out = run_sft(&Cpu, &cfg, Resume::No, &AtomicBool::new(false), &mut |_| {}).unwrap();
    let fin = out.final_dir.unwrap();
    let base = Model::load(&Cpu, &cfg.model).unwrap();
    let lora = Lora::load_peft(&Cpu, &r.join("out/adapter"), &base.config).unwrap();
    let merged = Model::load(&Cpu, &fin).unwrap();
    let b = batch();
    let x = host(
        &forward(&base, Some(&lora), &b, ForwardOptions::default())
            .unwrap()
            .logp,
    );
    let y = host(
        &forward(&merged, None, &b, ForwardOptions::default())
            .unwrap()
            .logp,
    );
    let z = host(
        &forward(&base, None, &b, ForwardOptions::default())
            .unwrap()
            .logp,
    );
    assert!(
        x.iter().zip(&z).any(|(a, b)| (a - b).abs() > 1e-3),
        "training changed nothing"
    );
    for (a, b) in x.iter().zip(&y) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
    assert!(fin.join("tokenizer.json").exists() && fin.join("config.json").exists());
}
