//! Training throughput of one full fine-tuning step (forward, backward, AdamW) on a fixed packed
//! batch; prints one JSON line. `scripts/train_bench.sh` runs it beside the same step in PyTorch.
//!
//! Environment: `SORFT_BENCH_MODEL` (a model directory; default: a fresh `small` preset),
//! `SORFT_BENCH_SEQS` x `SORFT_BENCH_LEN` tokens per step (default 4 x 256),
//! `SORFT_BENCH_STEPS` (default 5, after one warmup step), `RAYON_NUM_THREADS`.

use std::time::Instant;

use sorft::engine::Cpu;
use sorft::model::Model;
use sorft::train::backward::backward;
use sorft::train::forward::{forward, Batch, ForwardOptions, Sequence};
use sorft::train::loss::cross_entropy;
use sorft::train::optim::{AdamW, OptimConfig};
use sorft::train::params::{model_params, model_params_mut};
use sorft::train::Grads;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Peak resident memory of this process in MiB (VmHWM).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn main() {
    sorft::engine::cpu::heap::keep_freed_buffers();
    let tmp = tempfile::tempdir().expect("temporary directory");
    let dir = match std::env::var("SORFT_BENCH_MODEL") {
        Ok(d) => std::path::PathBuf::from(d),
        Err(_) => {
            let d = tmp.path().join("small");
            sorft::model::init::init_model(
                sorft::model::init::Preset::Small,
                &d,
                0,
                &[sorft::model::init::EMBEDDED_CORPUS.to_string()],
            )
            .expect("init small model");
            d
        }
    };
    let (n_seq, len, steps) = (
        env("SORFT_BENCH_SEQS", 4),
        env("SORFT_BENCH_LEN", 256),
        env("SORFT_BENCH_STEPS", 5),
    );
    let mut model = Model::load(&Cpu, &dir).expect("load model");
    let v = model.config.vocab_size as u64;
    // The same token formula as scripts/train_bench_torch.py.
    let seqs: Vec<Sequence> = (0..n_seq)
        .map(|s| Sequence {
            ids: (0..len)
                .map(|i| ((s as u64 * 7919 + i as u64 * 104_729 + 13) % v) as u32)
                .collect(),
            mask: vec![1; len],
            weight: 1.0,
        })
        .collect();
    let batch = Batch::pack(&seqs).expect("batch");
    let mut opt = AdamW::new(
        &Cpu,
        OptimConfig {
            lr: 1e-4,
            total_steps: 1000,
            ..OptimConfig::default()
        },
        &model_params(&model),
    )
    .expect("optimizer");
    let mut grads = Grads::new(&model, None).expect("grads");
    let opts = ForwardOptions {
        recompute: std::env::var("SORFT_BENCH_RECOMPUTE").is_ok(),
        chunk_rows: 256,
        temperature: 1.0,
    };
    let mut times = Vec::new();
    let mut loss = 0.0;
    let mut saved = 0;
    for i in 0..=steps {
        let t0 = Instant::now();
        grads.zero(&Cpu).expect("zero");
        let fwd = forward(&model, None, &batch, opts).expect("forward");
        saved = fwd.saved_bytes();
        let lg =
            cross_entropy(&Cpu, &fwd, &batch.weights, batch.trained_tokens() as f64).expect("loss");
        loss = lg.loss;
        backward(&model, None, fwd, &lg.g_logp, &lg.g_entropy, &mut grads).expect("backward");
        opt.step(&Cpu, model_params_mut(&mut model), &mut grads)
            .expect("step");
        if i > 0 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let tokens = batch.len();
    println!(
        "{}",
        serde_json::json!({
            "impl": "sorft",
            "threads": rayon::current_num_threads(),
            "tokens_per_step": tokens,
            "step_s_median": median,
            "step_s_best": times[0],
            "tokens_per_s": tokens as f64 / median,
            "peak_rss_mib": peak_rss_mib(),
            "activations_mib": saved as f64 / (1024.0 * 1024.0),
            "recompute": opts.recompute,
            "loss_last": loss,
            "params": model.config.num_params(),
        })
    );
}
