//! Shared helpers of the training tests: tiny random models written to a temporary directory.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use sorft::engine::rng::SplitMix;
use sorft::engine::Cpu;
use sorft::model::config::{Family, ModelConfig};
use sorft::model::weights::{save_safetensors, HostTensor};
use sorft::model::Model;

/// A tiny Qwen2-style config (GQA, QKV bias), tied or untied.
pub fn tiny_config(tied: bool) -> ModelConfig {
    ModelConfig {
        family: Family::Qwen2,
        vocab_size: 40,
        hidden_size: 16,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 4,
        intermediate_size: 24,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: tied,
        qkv_bias: true,
        o_bias: false,
        max_position_embeddings: 128,
        eos_token_ids: vec![1],
        bos_token_id: None,
    }
}

/// Random weights with O(1) activations: matrices ~ N(0, 1/sqrt(fan_in)), norms ~ 1 + N(0, 0.1),
/// biases ~ N(0, 0.1).
pub fn random_weights(cfg: &ModelConfig, seed: u64) -> BTreeMap<String, HostTensor> {
    let mut w = sorft::model::init::random_weights(cfg, seed);
    let mut r = SplitMix::new(seed ^ 77);
    for (name, t) in w.iter_mut() {
        let n: usize = t.shape.iter().product();
        let v: Vec<f32> = if name.ends_with("norm.weight") {
            (0..n).map(|_| 1.0 + 0.1 * r.next_normal() as f32).collect()
        } else if name.ends_with(".bias") {
            (0..n).map(|_| 0.1 * r.next_normal() as f32).collect()
        } else {
            let fan_in = *t.shape.last().unwrap() as f64;
            let s = if name.contains("embed") || name.contains("lm_head") {
                1.0
            } else {
                1.0 / fan_in.sqrt()
            };
            (0..n).map(|_| (s * r.next_normal()) as f32).collect()
        };
        *t = HostTensor::f32(&t.shape, &v);
    }
    w
}

/// Writes a model directory (config.json + model.safetensors).
pub fn write_model(dir: &Path, cfg: &ModelConfig, w: &BTreeMap<String, HostTensor>) {
    std::fs::create_dir_all(dir).unwrap();
    save_safetensors(&dir.join("model.safetensors"), w).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&cfg.to_hf_json()).unwrap(),
    )
    .unwrap();
}

/// A tiny random model loaded on the CPU (the directory must outlive the model's maps).
pub fn tiny_model(dir: &Path, tied: bool, seed: u64) -> Model<Cpu> {
    let cfg = tiny_config(tied);
    write_model(dir, &cfg, &random_weights(&cfg, seed));
    Model::load(&Cpu, dir).unwrap()
}

/// Random f32 values ~ N(0, 1).
pub fn randn(r: &mut SplitMix, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.next_normal() as f32).collect()
}

/// Animals and the sounds they make: the synthetic SFT task maps the animal named in a prompt with
/// random filler words to its sound.
pub const ANIMALS: [(&str, &str); 8] = [
    ("cat", "meow"),
    ("dog", "woof"),
    ("cow", "moo"),
    ("duck", "quack"),
    ("owl", "hoot"),
    ("bee", "buzz"),
    ("frog", "croak"),
    ("lion", "roar"),
];

const FILLER: [&str; 16] = [
    "the", "a", "of", "and", "to", "in", "is", "it", "for", "on", "with", "as", "by", "at", "from",
    "this",
];

/// `n` chat JSONL lines of the synthetic task.
pub fn animal_jsonl(n: usize, seed: u64) -> String {
    let mut r = SplitMix::new(seed);
    let mut out = String::new();
    for _ in 0..n {
        let (k, v) = ANIMALS[r.below(ANIMALS.len() as u64) as usize];
        let words: Vec<&str> = (0..1 + r.below(4))
            .map(|_| FILLER[r.below(FILLER.len() as u64) as usize])
            .collect();
        let line = serde_json::json!({"messages": [
            {"role": "user", "content": format!("{} {k} says?", words.join(" "))},
            {"role": "assistant", "content": v},
        ]});
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// A tiny-preset model directory with its BPE tokenizer.
pub fn tiny_preset(dir: &Path, seed: u64) {
    sorft::model::init::init_model(
        sorft::model::init::Preset::Tiny,
        dir,
        seed,
        &[sorft::model::init::EMBEDDED_CORPUS.to_string()],
    )
    .unwrap();
}

/// The RL items (subtask records with their issue) of two generated instances (seed 5).
pub fn rl_items(dir: &Path) -> Vec<sorft::rft::rl::RlItem> {
    let report = sorft::swe::synth::generate(
        &sorft::swe::synth::SynthConfig {
            n: 2,
            seed: 5,
            ..Default::default()
        },
        dir,
        &|_| {},
    )
    .unwrap();
    let store = sorft::swe::repo::RepoStore::new(dir.join("repos"));
    let mut out = Vec::new();
    for inst in &report.instances {
        let snap = store.snapshot(&inst.repo, &inst.base_commit).unwrap();
        let gt = sorft::swe::truth::ground_truth(&inst.patch, &snap).unwrap();
        for r in sorft::swe::subtask::training_records(inst, &snap, &gt) {
            out.push(sorft::rft::rl::RlItem {
                record: r,
                problem: inst.problem_statement.clone(),
            });
        }
    }
    out
}
