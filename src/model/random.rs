//! Models with random weights of a given configuration, made directly in the backend's memory:
//! speed and memory measurements at a real size (a 7B shape) without a download or a checkpoint
//! on disk. The values are deterministic by seed; they are not meant to be trained or read.

use half::bf16;
use rayon::prelude::*;

use super::config::ModelConfig;
use super::error::Result;
use super::transformer::Model;
use crate::engine::backend::{Backend, HostData};
use crate::engine::rng::random_u64;

/// Elements generated per parallel chunk.
const CHUNK: usize = 1 << 20;

/// The model of `config` with random bf16 weights: norms 1, biases 0, matrices uniform with the
/// standard deviation 0.02 of Qwen2's initialiser. Each tensor is made on the host in bf16 and
/// uploaded (one tensor at a time: host memory holds at most one tensor).
pub fn random_model<B: Backend>(backend: &B, config: ModelConfig, seed: u64) -> Result<Model<B>> {
    let mut index = 0u64;
    Model::from_loader(backend, config, &mut |name, shape| {
        index += 1;
        let n: usize = shape.iter().product();
        let values = random_values(name, n, seed, index);
        Ok(backend.upload(HostData::BF16(&values), shape)?)
    })
}

/// The values of one tensor (see [`random_model`]).
fn random_values(name: &str, n: usize, seed: u64, stream: u64) -> Vec<bf16> {
    if name.ends_with("norm.weight") {
        return vec![bf16::ONE; n];
    }
    if name.ends_with(".bias") {
        return vec![bf16::ZERO; n];
    }
    // Uniform on [-a, a] has standard deviation a / sqrt(3).
    let a = 0.02f32 * 3f32.sqrt();
    let mut v = vec![bf16::ZERO; n];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        for (i, x) in chunk.iter_mut().enumerate() {
            let r = random_u64(seed, stream, (c * CHUNK + i) as u64);
            let u = (r >> 40) as f32 / (1u64 << 24) as f32;
            *x = bf16::from_f32((2.0 * u - 1.0) * a);
        }
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Cpu;
    use crate::model::config::ModelConfig;

    #[test]
    fn random_model_is_deterministic_and_runs() {
        let json = serde_json::json!({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 64,
            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 48, "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "max_position_embeddings": 128
        });
        let cfg =
            ModelConfig::from_json(&json, std::path::Path::new("config.json")).expect("config");
        let be = Cpu;
        let a = random_model(&be, cfg.clone(), 7).expect("model");
        let b = random_model(&be, cfg.clone(), 7).expect("model");
        let c = random_model(&be, cfg, 8).expect("model");
        let (la, _) = a.score(&[1, 2, 3, 4]).expect("score");
        let (lb, _) = b.score(&[1, 2, 3, 4]).expect("score");
        let (lc, _) = c.score(&[1, 2, 3, 4]).expect("score");
        assert_eq!(la, lb);
        assert_ne!(la, lc);
        assert!(la.iter().all(|x| x.is_finite() && *x < 0.0));
        // Norms are one, biases zero, matrices small and centred.
        let w = random_values("model.layers.0.mlp.up_proj.weight", 10_000, 7, 3);
        let mean: f32 = w.iter().map(|x| x.to_f32()).sum::<f32>() / 1e4;
        let sd = (w.iter().map(|x| x.to_f32().powi(2)).sum::<f32>() / 1e4).sqrt();
        assert!(mean.abs() < 2e-3 && (sd - 0.02).abs() < 2e-3, "{mean} {sd}");
        assert!(random_values("model.norm.weight", 3, 7, 1)
            .iter()
            .all(|x| x.to_f32() == 1.0));
    }
}
