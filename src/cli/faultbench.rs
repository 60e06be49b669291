//! `sorft faultbench`: the fault-injection benchmark of the RFT-FM monitor (short stage-2 runs of
//! a small model on the CPU, clean or with one injected fault; detection, diagnosis and
//! remediation scored on held-out seeds against two baselines).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use sorft::engine::Cpu;
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::rft::monitor::bench::{
    evaluate, load_records, run_bench, warm_policy, write_report, BenchConfig,
};
use sorft::rft::monitor::taxonomy::FaultType;
use sorft::rft::rl_run::load_items;
use sorft::swe::synth::{generate, SynthConfig};

/// Arguments of `sorft faultbench`.
#[derive(Args, Debug)]
pub struct FaultbenchArgs {
    /// The CI variant (four fault types, easy, one tuning and one test seed, no remediation).
    #[arg(long)]
    pub quick: bool,
    /// Output directory (records under runs/, report.md, summary.json).
    #[arg(long, default_value = "faultbench-out")]
    pub out: PathBuf,
    /// Start every run from this model directory instead of a fresh tiny model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Synthetic instances the prompts come from.
    #[arg(long, default_value_t = 4)]
    pub instances: usize,
    /// Steps per run (default 6).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Tuning seeds, comma-separated.
    #[arg(long)]
    pub tune_seeds: Option<String>,
    /// Test seeds, comma-separated.
    #[arg(long)]
    pub test_seeds: Option<String>,
    /// Only these fault types (comma-separated names).
    #[arg(long)]
    pub faults: Option<String>,
    /// Epochs of the answer-only warm-up of the fresh tiny model (ignored with --model).
    #[arg(long, default_value_t = 0)]
    pub warm_epochs: u64,
    /// Only score the records already under --out (e.g. of a benchmark stopped part-way).
    #[arg(long)]
    pub score_only: bool,
    /// Re-run the test seeds' faults with remediation (default: on for the full benchmark).
    #[arg(long)]
    pub remediation: Option<bool>,
}

fn seeds(s: &str, flag: &str) -> Result<Vec<u64>> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            x.trim()
                .parse::<u64>()
                .with_context(|| format!("{flag}: {x:?} is not a seed"))
        })
        .collect()
}

/// Runs `sorft faultbench`.
pub fn run(a: FaultbenchArgs) -> Result<()> {
    let mut cfg = if a.quick {
        BenchConfig::quick()
    } else {
        BenchConfig::full()
    };
    if let Some(s) = a.steps {
        anyhow::ensure!(s >= 4, "--steps {s}: at least 4 (warm-up and an onset)");
        cfg.steps = s;
        cfg.onsets.retain(|&o| o < s);
        if cfg.onsets.is_empty() {
            cfg.onsets = vec![s / 2];
        }
    }
    if let Some(s) = &a.tune_seeds {
        cfg.tune_seeds = seeds(s, "--tune-seeds")?;
    }
    if let Some(s) = &a.test_seeds {
        cfg.test_seeds = seeds(s, "--test-seeds")?;
    }
    if let Some(f) = &a.faults {
        cfg.faults = f
            .split(',')
            .map(|x| {
                FaultType::parse(x.trim()).with_context(|| {
                    format!(
                        "--faults: unknown fault {x:?}; known: {}",
                        FaultType::ALL.map(|f| f.name()).join(", ")
                    )
                })
            })
            .collect::<Result<_>>()?;
    }
    if let Some(r) = a.remediation {
        cfg.remediation = r;
    }
    anyhow::ensure!(
        !cfg.tune_seeds.is_empty() && !cfg.test_seeds.is_empty(),
        "faultbench needs at least one tuning and one test seed"
    );
    if a.score_only {
        let recs = load_records(&a.out)?;
        anyhow::ensure!(
            !recs.is_empty(),
            "{}: no complete run pairs to score",
            a.out.display()
        );
        let mut r = evaluate(&recs, &cfg);
        r.wall_s = recs.iter().map(|x| x.wall_s).sum();
        write_report(&a.out, &r, &cfg)?;
        print!("{}", std::fs::read_to_string(a.out.join("report.md"))?);
        return Ok(());
    }
    std::fs::create_dir_all(&a.out).with_context(|| a.out.display().to_string())?;
    let data = a.out.join("data");
    let report = generate(
        &SynthConfig {
            n: a.instances,
            seed: 5,
            ..Default::default()
        },
        &data,
        &|_| {},
    )?;
    let items = load_items(&report.instances, &data.join("repos"))?;
    anyhow::ensure!(!items.is_empty(), "the synthetic instances gave no prompt");
    let model = match &a.model {
        Some(m) => m.clone(),
        None => {
            let m = a.out.join("model");
            init_model(Preset::Tiny, &m, 1, &[EMBEDDED_CORPUS.to_string()])?;
            if a.warm_epochs == 0 {
                m
            } else {
                let t = std::time::Instant::now();
                let w = warm_policy(&Cpu, &m, &items, &a.out, a.warm_epochs)?;
                eprintln!("faultbench: warm-up SFT {:.0} s", t.elapsed().as_secs_f64());
                w
            }
        }
    };
    let r = run_bench(&Cpu, &model, &items, &cfg, &a.out, &mut |line| {
        eprintln!("{line}")
    })?;
    print!("{}", std::fs::read_to_string(a.out.join("report.md"))?);
    eprintln!(
        "faultbench: {} runs in {:.0} s; records and report in {}",
        r.runs,
        r.wall_s,
        a.out.display()
    );
    Ok(())
}
