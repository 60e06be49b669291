//! `sorft eval`: the Agentless pipeline end to end on a model and a set of instances.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use sorft::engine::device::DeviceInfo;
use sorft::engine::Backend;
use sorft::model::load_dir;
use sorft::rft::eval::{evaluate, EvalConfig, ModelAnswerer};
use sorft::swe::instance::read_jsonl;

use super::device::{run_on, DeviceArgs, Job};

/// Arguments of `sorft eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Model directory.
    #[arg(long)]
    pub model: PathBuf,
    /// SWE-bench instances (JSONL).
    #[arg(long)]
    pub instances: PathBuf,
    /// Folder of git mirrors (`owner__name`).
    #[arg(long)]
    pub repos: PathBuf,
    /// Predictions in SWE-bench's format are written here; a summary and per-instance answers beside it.
    #[arg(long, default_value = "predictions.jsonl")]
    pub out: PathBuf,
    /// Edit samples per instance.
    #[arg(long, default_value_t = 4)]
    pub samples: usize,
    /// Temperature of the edit samples.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Most new tokens per answer.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Skip the repository tests (hit rates and %Applied only).
    #[arg(long)]
    pub no_tests: bool,
    /// Free decoding: do not constrain localization answers to what the prompt showed
    #[arg(long)]
    pub free: bool,
    /// Let quotes in the chain of thought name anything (by default they must copy the prompt)
    #[arg(long)]
    pub no_ground: bool,
    /// Let localization answers name targets the chain of thought did not quote
    #[arg(long)]
    pub no_faithful: bool,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Runs `sorft eval`.
pub fn run(a: EvalArgs) -> Result<()> {
    run_on(a.device, a)
}

impl Job for EvalArgs {
    type Output = ();
    fn run<B: Backend>(self, be: &B, dev: &DeviceInfo) -> Result<()> {
        eval_on(be, dev, self)
    }
}

fn eval_on<B: Backend>(be: &B, dev: &DeviceInfo, a: EvalArgs) -> Result<()> {
    eprintln!("eval: on {}", dev.summary());
    let (model, tok) = load_dir(be, &a.model)?;
    let tok = tok.with_context(|| format!("{}: tokenizer.json is needed", a.model.display()))?;
    let instances = read_jsonl(&a.instances)?;
    let cfg = EvalConfig {
        edit_samples: a.samples,
        temperature: a.temperature,
        max_new_tokens: a.max_new_tokens,
        run_tests: !a.no_tests,
        seed: a.seed,
        constrain: !a.free,
        ground: !a.no_ground,
        faithful: !a.no_faithful,
        ..EvalConfig::default()
    };
    let mut ans = ModelAnswerer {
        model: &model,
        tok: &tok,
        cfg: &cfg,
    };
    let (outcomes, summary) = evaluate(&mut ans, &instances, &a.repos, &cfg, &mut |s| {
        eprintln!("{s}")
    })?;
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(&a.out).with_context(|| a.out.display().to_string())?,
    );
    let name = a.model.display().to_string();
    for o in &outcomes {
        writeln!(
            f,
            "{}",
            serde_json::json!({"instance_id": o.instance_id, "model_name_or_path": name, "model_patch": o.patch})
        )?;
    }
    f.flush()?;
    let details = a.out.with_extension("details.jsonl");
    let mut d = std::io::BufWriter::new(
        std::fs::File::create(&details).with_context(|| details.display().to_string())?,
    );
    for o in &outcomes {
        writeln!(d, "{}", serde_json::to_string(o)?)?;
    }
    d.flush()?;
    let sum_path = a.out.with_extension("summary.json");
    let mut sum = serde_json::to_value(&summary)?;
    sum["device"] = serde_json::to_value(dev)?;
    std::fs::write(&sum_path, serde_json::to_string_pretty(&sum)?)?;
    super::print_out(&format!("{}\n", serde_json::to_string(&sum)?))?;
    Ok(())
}
