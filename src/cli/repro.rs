//! `sorft repro`: the whole SoRFT reproduction on the embedded default.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use sorft::engine::device::DeviceInfo;
use sorft::engine::{Backend, Cuda};
use sorft::pipeline::config::ReproConfig;
use sorft::pipeline::repro::run_repro;

use super::device::{dispatch, pick, pick_with, DTypeChoice, DeviceChoice, Job, Picked};

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
    /// Run whole reproductions for these seeds (e.g. `0,1,2`), each into `--out`/seed-N, and
    /// write `--out`/seeds.md with the mean ± std of every stage-to-stage delta.
    #[arg(long, value_delimiter = ',', conflicts_with = "seed")]
    pub seeds: Vec<u64>,
    /// Continue an interrupted run in --out: finished phases are reused, unfinished ones resume
    /// from their checkpoints (the configuration must be the same); with `--seeds`, a seed whose
    /// run finished is not run again.
    #[arg(long)]
    pub resume: bool,
    /// Print the effective configuration (and the device it resolves to) and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Where to run (same as `--set device=...`; default: the configuration's, `auto`).
    #[arg(long, value_enum)]
    pub device: Option<DeviceChoice>,
    /// GPU compute dtype (same as `--set dtype=...`; default: the configuration's, `bf16`).
    #[arg(long, value_enum)]
    pub dtype: Option<DTypeChoice>,
}

/// The device line `--print-config` adds as a TOML comment: what `device` resolves to here.
fn device_comment(cfg: &ReproConfig) -> String {
    match pick_with(cfg.device, cfg.dtype.dtype(), |d| Cuda::new(0, d)) {
        Ok(Picked::Cpu(why)) => format!(
            "# device: {}\n",
            DeviceInfo::cpu(&sorft::engine::Cpu, why).summary()
        ),
        Ok(Picked::Cuda(c)) => format!("# device: {}\n", DeviceInfo::cuda(&c).summary()),
        Err(e) => format!("# device: unavailable ({e})\n"),
    }
}

/// The reproduction as work for the picked backend.
struct Repro {
    args: ReproArgs,
    cfg: ReproConfig,
}

impl Job for Repro {
    type Output = sorft::pipeline::repro::ReproSummary;
    fn run<B: Backend>(self, be: &B, dev: &DeviceInfo) -> Result<Self::Output> {
        eprintln!("repro: on {}", dev.summary());
        let a = &self.args;
        run_repro(
            be,
            dev,
            &self.cfg,
            &a.out,
            a.resume,
            &super::interrupt::STOP,
        )
    }
}

/// Runs `sorft repro`.
pub fn run(a: ReproArgs) -> Result<()> {
    let mut sets = a.sets.clone();
    if let Some(s) = a.seed {
        sets.push(format!("seed={s}"));
    }
    if let Some(d) = a.device {
        sets.push(format!("device=\"{}\"", choice_name(d)));
    }
    if let Some(d) = a.dtype {
        sets.push(format!("dtype=\"{}\"", choice_name(d)));
    }
    let cfg = ReproConfig::load(a.quick, a.config.as_deref(), &sets)?;
    if !a.seeds.is_empty() && !a.print_config {
        return run_seeds(a, cfg);
    }
    if a.print_config {
        super::print_out(&format!("{}{}", cfg.to_toml(), device_comment(&cfg)))?;
        return Ok(());
    }
    // The device first: `--device cuda` without a GPU is one line, before anything else.
    let picked = pick(cfg.device, cfg.dtype.dtype())?;
    eprintln!(
        "effective configuration (saved as {}):\n{}",
        a.out.join("config.toml").display(),
        cfg.to_toml()
    );
    let t = std::time::Instant::now();
    super::interrupt::install();
    let out = a.out.clone();
    let s = dispatch(picked, Repro { args: a, cfg })?;
    let report = std::fs::read_to_string(out.join("report.md")).unwrap_or_default();
    super::print_out(&format!("{report}\n"))?;
    eprintln!(
        "done in {:.0} s: {} stages evaluated; report at {}",
        t.elapsed().as_secs_f64(),
        s.stages.len(),
        out.join("report.md").display()
    );
    Ok(())
}

/// `--seeds`: one whole run per seed, then the table of deltas over seeds.
fn run_seeds(a: ReproArgs, cfg: ReproConfig) -> Result<()> {
    super::interrupt::install();
    let mut runs = Vec::new();
    for &seed in &a.seeds {
        let mut c = cfg.clone();
        c.seed = seed;
        let out = a.out.join(format!("seed-{seed}"));
        if a.resume {
            if let Some(deltas) = sorft::pipeline::compare::finished_deltas(&out, &c.to_toml()) {
                eprintln!("repro: seed {seed} finished in {} (reused)", out.display());
                runs.push((seed, deltas));
                continue;
            }
        }
        eprintln!("repro: seed {seed} into {}", out.display());
        let picked = pick(c.device, c.dtype.dtype())?;
        let args = ReproArgs {
            out,
            config: None,
            sets: Vec::new(),
            quick: a.quick,
            seed: Some(seed),
            seeds: Vec::new(),
            resume: a.resume,
            print_config: false,
            device: None,
            dtype: None,
        };
        let s = dispatch(picked, Repro { args, cfg: c })?;
        runs.push((seed, s.deltas));
    }
    let md = sorft::pipeline::compare::seeds_section(&runs);
    let path = a.out.join("seeds.md");
    std::fs::write(&path, &md).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    super::print_out(&md)?;
    eprintln!("seeds table at {}", path.display());
    Ok(())
}

/// The lowercase name clap and the configuration use for a choice.
fn choice_name(v: impl clap::ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}
