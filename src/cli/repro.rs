//! `sorft repro`: the whole SoRFT reproduction on the embedded default.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use sorft::pipeline::config::ReproConfig;
use sorft::pipeline::repro::run_repro;

/// Arguments of `sorft repro`.
#[derive(Args, Debug)]
pub struct ReproArgs {
    /// Output folder (report.md, metrics.jsonl, plots, models, data).
    #[arg(long, default_value = "runs/repro")]
    pub out: PathBuf,
    /// TOML configuration (any subset of the keys `--print-config` shows).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one key, e.g. `--set stage2.steps=4` (repeatable).
    #[arg(long = "set")]
    pub sets: Vec<String>,
    /// The 2-minute variant (tiny model, a handful of instances).
    #[arg(long)]
    pub quick: bool,
    /// Seed of every random choice (same as `--set seed=N`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Continue an interrupted run in --out: finished phases are reused, unfinished ones resume
    /// from their checkpoints (the configuration must be the same).
    #[arg(long)]
    pub resume: bool,
    /// Print the effective configuration and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// Runs `sorft repro`.
pub fn run(a: ReproArgs) -> Result<()> {
    let mut sets = a.sets.clone();
    if let Some(s) = a.seed {
        sets.push(format!("seed={s}"));
    }
    let cfg = ReproConfig::load(a.quick, a.config.as_deref(), &sets)?;
    if a.print_config {
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    eprintln!(
        "effective configuration (saved as {}):\n{}",
        a.out.join("config.toml").display(),
        cfg.to_toml()
    );
    let t = std::time::Instant::now();
    super::interrupt::install();
    let s = run_repro(&cfg, &a.out, a.resume, &super::interrupt::STOP)?;
    let report = std::fs::read_to_string(a.out.join("report.md")).unwrap_or_default();
    println!("{report}");
    eprintln!(
        "done in {:.0} s: {} stages evaluated; report at {}",
        t.elapsed().as_secs_f64(),
        s.stages.len(),
        a.out.join("report.md").display()
    );
    Ok(())
}
