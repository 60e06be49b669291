//! Parity with Hugging Face transformers: log-probabilities and greedy continuations of tiny random
//! Qwen2 and Llama models made by `scripts/parity_fixtures.py` (GQA, multi-head, tied and untied
//! embeddings, QKV bias, a sharded checkpoint, bf16 weights).

use std::path::PathBuf;

use serde::Deserialize;
use sorft::engine::{Cpu, SamplingParams};
use sorft::model::generate::{generate, GenOptions, GenRequest};
use sorft::model::Model;

#[derive(Deserialize)]
struct Greedy {
    prompt: Vec<u32>,
    output: Vec<u32>,
}

#[derive(Deserialize)]
struct Reference {
    sequences: Vec<Vec<u32>>,
    logprobs: Vec<Vec<Option<f64>>>,
    greedy: Vec<Greedy>,
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(name)
}

fn check(name: &str, tol: f64) {
    let dir = fixture(name);
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let r: Reference = serde_json::from_str(&text).unwrap();
    let model = Model::load(&Cpu, &dir).unwrap();
    let mut worst = 0.0f64;
    for (ids, want) in r.sequences.iter().zip(&r.logprobs) {
        let (got, _) = model.score(ids).unwrap();
        assert_eq!(got.len() + 1, want.len());
        for (g, w) in got.iter().zip(&want[1..]) {
            let w = w.unwrap();
            worst = worst.max((*g as f64 - w).abs());
        }
    }
    assert!(
        worst < tol,
        "{name}: max |logprob difference| {worst} >= {tol}"
    );
    let reqs: Vec<GenRequest> = r
        .greedy
        .iter()
        .map(|g| GenRequest {
            prompt: g.prompt.clone(),
            params: SamplingParams::greedy(),
            max_new_tokens: g.output.len(),
            ..Default::default()
        })
        .collect();
    let outs = generate(&model, None, &reqs, &GenOptions::default()).unwrap();
    for (o, g) in outs.iter().zip(&r.greedy) {
        assert_eq!(
            o.ids, g.output,
            "{name}: greedy continuation differs from transformers"
        );
    }
}

#[test]
fn qwen2_gqa_tied_matches_transformers() {
    check("qwen2_gqa_tied", 1e-4);
}

#[test]
fn qwen2_sharded_untied_matches_transformers() {
    check("qwen2_mha_untied_sharded", 1e-4);
}

#[test]
fn llama_mha_untied_matches_transformers() {
    check("llama_mha_untied", 1e-4);
}

#[test]
fn llama_gqa_with_bias_matches_transformers() {
    check("llama_gqa_bias_tied", 1e-4);
}

#[test]
fn bf16_weights_match_transformers_loosely() {
    check("qwen2_bf16", 5e-4);
}
