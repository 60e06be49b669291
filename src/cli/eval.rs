//! `sorft eval`: the Agentless pipeline end to end on a model and a set of instances.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use sorft::engine::device::DeviceInfo;
use sorft::engine::Backend;
use sorft::model::load_dir;
use sorft::rft::eval::{evaluate_with, EvalConfig, ModelAnswerer};
use sorft::rft::regression::RegressionSuites;
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
    /// Edit samples per instance: the greedy edit, then samples at --temperature; %Resolved is
    /// also reported for the first 1, 2, 4, ... of them.
    #[arg(long, default_value_t = 8)]
    pub samples: usize,
    /// Localization answers per stage (greedy, then samples at --temperature), merged by votes.
    #[arg(long, default_value_t = 4)]
    pub loc_samples: usize,
    /// Temperature of the sampled edits and localizations.
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
    /// Folder keeping each repository's regression tests (those passing at the base commit)
    /// between runs; by default they are found again every run.
    #[arg(long)]
    pub regression_cache: Option<PathBuf>,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Runs `sorft eval`.
pub fn run(a: EvalArgs) -> Result<()> {
    if a.samples == 0 || a.loc_samples == 0 {
        anyhow::bail!("--samples and --loc-samples must be at least 1");
    }
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
        loc_samples: a.loc_samples,
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
    let t0 = std::time::Instant::now();
    let mut suites = RegressionSuites::new(a.regression_cache.clone());
    let (outcomes, summary) = evaluate_with(
        &mut ans,
        &instances,
        &a.repos,
        &cfg,
        &mut suites,
        &mut |s| eprintln!("{s}"),
    )?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "eval: {} instances in {secs:.1} s ({:.2} s per instance)",
        instances.len(),
        secs / instances.len().max(1) as f64
    );
    for (k, r) in &summary.resolved_curve {
        eprintln!("eval: %Resolved with {k} edit samples: {r:.1}");
    }
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
