//! `sorft bench`: speed measurements printed as JSON (prefill and decode tokens/s of a model).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::{Args, Subcommand};

use sorft::engine::device::DeviceInfo;
use sorft::engine::rng::SplitMix;
use sorft::engine::{Backend, SamplingParams};
use sorft::model::generate::{generate, generate_with_stats, GenOptions, GenRequest};
use sorft::model::kv_cache::KvCache;
use sorft::model::transformer::Step;
use sorft::model::Model;

use super::device::{run_on, DeviceArgs, Job};

/// Arguments of `sorft bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// What to measure.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Prefill and greedy-decode throughput of a model.
    Model {
        /// Model directory.
        #[arg(
            long,
            required_unless_present = "random_config",
            conflicts_with = "random_config"
        )]
        model: Option<PathBuf>,
        /// Instead of a model directory: a `config.json` whose shape is filled with random bf16
        /// weights made in memory (e.g. tests/fixtures/qwen2.5-coder-7b/config.json for 7B
        /// measurements without a download).
        #[arg(long)]
        random_config: Option<PathBuf>,
        /// Prompt length of the prefill measurement.
        #[arg(long, default_value_t = 512)]
        prompt_len: usize,
        /// Tokens generated per sequence in the decode measurement.
        #[arg(long, default_value_t = 128)]
        new_tokens: usize,
        /// Decode batch sizes, comma-separated.
        #[arg(long, default_value = "1,8", value_delimiter = ',')]
        batch: Vec<usize>,
        /// Repeats (the median is reported).
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Samples per prompt of the group rollout measurement (0: skip it).
        #[arg(long, default_value_t = 4)]
        group: usize,
        /// Distinct prompts of the group rollout measurement.
        #[arg(long, default_value_t = 8)]
        group_prompts: usize,
        #[command(flatten)]
        device: DeviceArgs,
    },
    /// CUDA kernel timings against copy and GEMM ceilings (needs a GPU).
    Kernels,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `sorft bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    match a.command {
        BenchCommand::Model {
            model,
            random_config,
            prompt_len,
            new_tokens,
            batch,
            repeats,
            group,
            group_prompts,
            device,
        } => run_on(
            device,
            ModelBench {
                source: match (model, random_config) {
                    (_, Some(c)) => ModelSource::Random(c),
                    (Some(d), None) => ModelSource::Dir(d),
                    (None, None) => anyhow::bail!("give --model DIR or --random-config FILE"),
                },
                prompt_len,
                new_tokens,
                batches: batch,
                repeats: repeats.max(1),
                group,
                group_prompts: group_prompts.max(1),
            },
        ),
        BenchCommand::Kernels => super::kernel_bench::run(),
    }
}

/// Where `sorft bench model` takes its model from.
enum ModelSource {
    /// A model directory.
    Dir(PathBuf),
    /// Random weights in the shape of this `config.json`.
    Random(PathBuf),
}

/// `sorft bench model`'s measurement.
struct ModelBench {
    source: ModelSource,
    prompt_len: usize,
    new_tokens: usize,
    batches: Vec<usize>,
    repeats: usize,
    group: usize,
    group_prompts: usize,
}

impl Job for ModelBench {
    type Output = ();
    fn run<B: Backend>(self, be: &B, dev: &DeviceInfo) -> Result<()> {
        bench_model(be, dev, &self)
    }
}

fn bench_model<B: Backend>(be: &B, dev: &DeviceInfo, b: &ModelBench) -> Result<()> {
    let (prompt_len, new_tokens, batches, repeats) =
        (b.prompt_len, b.new_tokens, &b.batches, b.repeats);
    let t_load = Instant::now();
    let m = match &b.source {
        ModelSource::Dir(dir) => Model::load(be, dir)?,
        ModelSource::Random(cfg) => {
            let config = sorft::model::ModelConfig::from_file(cfg)?;
            sorft::model::random::random_model(be, config, 0)?
        }
    };
    let load_s = t_load.elapsed().as_secs_f64();
    let v = m.config.vocab_size as u64;
    let mut rng = SplitMix::new(0);
    let prompt: Vec<u32> = (0..prompt_len.max(1))
        .map(|_| rng.below(v) as u32)
        .collect();
    let n = prompt.len();
    let slots = vec![0u32; n];
    let pos: Vec<u32> = (0..n as u32).collect();
    let mut times = Vec::new();
    for _ in 0..repeats + 1 {
        let mut cache = KvCache::new(&m.backend, &m.config, 1, n)?;
        let t = Instant::now();
        m.forward(
            &mut cache,
            &Step {
                ids: &prompt,
                slots: &slots,
                positions: &pos,
                logit_rows: &[n as u32 - 1],
            },
        )?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.remove(0); // warm-up
    let prefill = n as f64 / median(times);
    let mut decode = serde_json::Map::new();
    for &b in batches {
        let reqs: Vec<GenRequest> = (0..b.max(1))
            .map(|i| GenRequest {
                prompt: prompt[..16.min(n)]
                    .iter()
                    .map(|&t| (t + i as u32) % v as u32)
                    .collect(),
                params: SamplingParams::greedy(),
                max_new_tokens: new_tokens,
                ..Default::default()
            })
            .collect();
        let opts = GenOptions {
            max_batch: b.max(1),
            progress: false,
        };
        let mut times = Vec::new();
        for _ in 0..repeats.min(3) + 1 {
            let t = Instant::now();
            generate(&m, None, &reqs, &opts)?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.remove(0);
        let tps = (b.max(1) * new_tokens) as f64 / median(times);
        decode.insert(format!("batch_{b}"), serde_json::json!(tps));
    }
    let group = if b.group > 0 {
        group_rollout(&m, &prompt, b)?
    } else {
        serde_json::Value::Null
    };
    let out = serde_json::json!({
        "group_rollout": group,
        "backend": dev.device,
        "device": dev,
        "threads": rayon::current_num_threads(),
        "params": m.config.num_params(),
        "random_weights": matches!(b.source, ModelSource::Random(_)),
        "load_s": load_s,
        "prefill_tokens": n,
        "prefill_tokens_per_s": prefill,
        "decode_new_tokens": new_tokens,
        "decode_tokens_per_s": decode,
    });
    super::print_out(&format!("{out}\n"))?;
    Ok(())
}

/// A stage-2-like rollout (`group_prompts` prompts, `group` samples each at temperature 0.7,
/// 16 sequences decoded together) with a prefill per sample and with one shared prefill per
/// group, in the same run: generated tokens per second of wall time (prefill included) and the
/// prompt tokens prefilled.
fn group_rollout<B: Backend>(
    m: &Model<B>,
    prompt: &[u32],
    b: &ModelBench,
) -> Result<serde_json::Value> {
    let v = m.config.vocab_size as u32;
    let mut reqs = Vec::new();
    for p in 0..b.group_prompts {
        let ids: Vec<u32> = prompt.iter().map(|&t| (t + p as u32) % v).collect();
        for k in 0..b.group {
            reqs.push(GenRequest {
                prompt: ids.clone(),
                params: SamplingParams {
                    temperature: 0.7,
                    top_k: 0,
                    top_p: 1.0,
                    seed: (p * b.group + k) as u64,
                },
                max_new_tokens: b.new_tokens,
                ..Default::default()
            });
        }
    }
    let opts = GenOptions {
        max_batch: 16,
        progress: false,
    };
    let mut res = serde_json::Map::new();
    let mut tps = [0.0f64; 2];
    for (i, (name, share)) in [("separate", false), ("shared", true)]
        .into_iter()
        .enumerate()
    {
        let mut times = Vec::new();
        let mut stats = Default::default();
        for _ in 0..b.repeats.min(3) {
            let t = Instant::now();
            stats = generate_with_stats(m, None, &reqs, &opts, share)?.1;
            times.push(t.elapsed().as_secs_f64());
        }
        tps[i] = stats.generated_tokens as f64 / median(times);
        res.insert(
            name.to_string(),
            serde_json::json!({
                "generated_tokens_per_s": tps[i],
                "prefill_tokens": stats.prefill_tokens,
                "generated_tokens": stats.generated_tokens,
            }),
        );
    }
    res.insert("group".into(), serde_json::json!(b.group));
    res.insert("prompts".into(), serde_json::json!(b.group_prompts));
    res.insert(
        "speedup".into(),
        serde_json::json!(tps[1] / tps[0].max(1e-12)),
    );
    Ok(serde_json::Value::Object(res))
}
