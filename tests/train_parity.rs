//! Parity of the loss and of every parameter's gradient with PyTorch autograd on the committed
//! transformers fixtures (`scripts/parity_fixtures.py --train-only`).

use std::path::Path;

use sorft::engine::{Backend, Cpu, HostData};
use sorft::model::Model;
use sorft::train::backward::backward;
use sorft::train::checkpoint::read_f32_tensors;
use sorft::train::forward::{forward, Batch, ForwardOptions, Sequence};
use sorft::train::params::model_params;
use sorft::train::Grads;

const VARIANTS: [&str; 5] = [
    "qwen2_gqa_tied",
    "qwen2_mha_untied_sharded",
    "llama_mha_untied",
    "llama_gqa_bias_tied",
    "qwen2_bf16",
];

fn check_variant(name: &str, recompute: bool) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(name);
    let refj: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("train_reference.json")).unwrap())
            .unwrap();
    let want_grads = read_f32_tensors(&dir.join("train_grads.safetensors")).unwrap();
    let model = Model::load(&Cpu, &dir).unwrap();
    let ids: Vec<Vec<u32>> = serde_json::from_value(refj["sequences"].clone()).unwrap();
    let masks: Vec<Vec<u8>> = serde_json::from_value(refj["masks"].clone()).unwrap();
    let weights: Vec<f32> = serde_json::from_value(refj["weights"].clone()).unwrap();
    let beta = refj["beta"].as_f64().unwrap();
    let norm = refj["normaliser"].as_f64().unwrap();
    let seqs: Vec<Sequence> = ids
        .into_iter()
        .zip(masks)
        .zip(weights)
        .map(|((ids, mask), weight)| Sequence { ids, mask, weight })
        .collect();
    let batch = Batch::pack(&seqs).unwrap();
    let t = batch.len();
    let opts = ForwardOptions {
        recompute,
        chunk_rows: 5,
        temperature: 1.0,
    };
    let fwd = forward(&model, None, &batch, opts).unwrap();
    let logp = Cpu.to_host_f32(&fwd.logp).unwrap();
    let ent = Cpu.to_host_f32(&fwd.entropy).unwrap();
    let mut loss = 0.0f64;
    let mut gl = vec![0.0f32; t];
    let mut ge = vec![0.0f32; t];
    for i in 0..t {
        if batch.weights[i] != 0.0 {
            loss += (-(batch.weights[i] as f64) * logp[i] as f64 + beta * ent[i] as f64) / norm;
            gl[i] = (-(batch.weights[i] as f64) / norm) as f32;
            ge[i] = (beta / norm) as f32;
        }
    }
    let want_loss = refj["loss"].as_f64().unwrap();
    assert!(
        (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
        "{name}: loss {loss} vs PyTorch {want_loss}"
    );
    let mut grads = Grads::new(&model, None).unwrap();
    let gl = Cpu.upload(HostData::F32(&gl), &[t]).unwrap();
    let ge = Cpu.upload(HostData::F32(&ge), &[t]).unwrap();
    backward(&model, None, fwd, &gl, &ge, &mut grads).unwrap();
    let got = model_params(grads.full.as_ref().unwrap());
    assert_eq!(got.len(), want_grads.len(), "{name}: parameter count");
    for (pname, g) in got {
        let (shape, want) = want_grads
            .get(&pname)
            .unwrap_or_else(|| panic!("{name}: PyTorch has no gradient for {pname}"));
        assert_eq!(g.shape(), &shape[..], "{name}: {pname} shape");
        let g = Cpu.to_host_f32(g).unwrap();
        let diff: f64 = g
            .iter()
            .zip(want)
            .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let norm: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum::<f64>().sqrt();
        assert!(norm > 0.0, "{name}: {pname} has a zero reference gradient");
        assert!(
            diff <= 1e-4 * norm,
            "{name}: {pname}: relative error {} of the gradient",
            diff / norm
        );
    }
}

#[test]
fn loss_and_every_gradient_match_pytorch_on_all_fixtures() {
    for v in VARIANTS {
        check_variant(v, false);
    }
}

#[test]
fn recomputed_blocks_match_pytorch_too() {
    check_variant("llama_gqa_bias_tied", true);
}
