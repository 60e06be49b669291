//! `sorft faultbench`: the fault-injection benchmark of the RFT-FM monitor (short stage-2 runs of
//! a small model on the CPU, clean or with one injected fault; detection, diagnosis and
//! remediation scored on held-out seeds against two baselines).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use sorft::engine::Cpu;
use sorft::model::init::{init_model, Preset, EMBEDDED_CORPUS};
use sorft::rft::monitor::bench::{
    evaluate, load_records, remediate_phase, run_bench, warm_policy, write_report, BenchConfig,
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
    /// Steps per run (default 8; --quick: 6).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Onset steps, comma-separated; each run draws one (default 5,6; --quick: 4,5). Each must
    /// leave the detector's 3 warm-up steps before it and lie within the run.
    #[arg(long)]
    pub onsets: Option<String>,
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
    /// Also re-run the faults no remediation can fix in the remediation phase (to count the
    /// runs the monitor stops with a report).
    #[arg(long)]
    pub rerun_unrecoverable: bool,
    /// Only the remediation phase, on the records already under --out (tuned on them); with
    /// --faults, only those faults' runs are re-run.
    #[arg(long, conflicts_with = "score_only")]
    pub remediate_only: bool,
    /// New tokens per response (default 96; the constrained answer gets half).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Run only shard K of N of the detection runs (`K/N`, K from 0), e.g. in two processes
    /// sharing one --out; runs already recorded there are read back, not re-run.
    #[arg(long)]
    pub shard: Option<String>,
}

/// Parses `K/N` with `K < N`.
fn shard(s: &str) -> Result<(usize, usize)> {
    let bad = || format!("--shard {s:?}: expected K/N with 0 <= K < N, e.g. 0/2");
    let (k, n) = s.split_once('/').with_context(bad)?;
    let (k, n): (usize, usize) = (
        k.trim().parse().with_context(bad)?,
        n.trim().parse().with_context(bad)?,
    );
    anyhow::ensure!(k < n, "{}", bad());
    Ok((k, n))
}

/// The benchmark's prompts: `--instances` synthetic instances generated under `out/data`.
fn bench_items(a: &FaultbenchArgs) -> Result<Vec<sorft::rft::rl::RlItem>> {
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
    Ok(items)
}

/// `--remediate-only`: tunes on the records under `--out`, re-runs the test seeds' faults with
/// remediation from the model the detection phase used, and rewrites the report.
fn remediate_only(a: &FaultbenchArgs, cfg: &BenchConfig) -> Result<()> {
    let recs = load_records(&a.out)?;
    anyhow::ensure!(
        !recs.is_empty(),
        "{}: no complete run pairs to remediate",
        a.out.display()
    );
    let model = match &a.model {
        Some(m) => m.clone(),
        None if a.out.join("policy-sft").exists() => anyhow::bail!(
            "{}: a warmed-up policy; pass it with --model",
            a.out.display()
        ),
        None => a.out.join("model"),
    };
    anyhow::ensure!(
        model.join("tokenizer.json").exists(),
        "{}: no model (run the detection phase first, or pass --model)",
        model.display()
    );
    let items = bench_items(a)?;
    let t = std::time::Instant::now();
    let (reference, tok) = sorft::model::load_dir(&Cpu, &model)?;
    let tok = tok.with_context(|| format!("{}: no tokenizer.json", model.display()))?;
    let mut r = evaluate(&recs, cfg);
    let robust = r.robust.clone().unwrap_or_default();
    r.remediation = Some(remediate_phase(
        &Cpu,
        &model,
        &reference,
        &tok,
        &items,
        cfg,
        &recs,
        &robust,
        &a.out,
        &mut |l| eprintln!("{l}"),
    )?);
    r.wall_s = recs.iter().map(|x| x.wall_s).sum::<f64>() + t.elapsed().as_secs_f64();
    write_report(&a.out, &r, cfg)?;
    print!("{}", std::fs::read_to_string(a.out.join("report.md"))?);
    Ok(())
}

/// Parses `--onsets`: steps after the detector's warm-up (3 steps) and within a run of `steps`.
fn onsets(s: &str, steps: usize) -> Result<Vec<usize>> {
    let v: Vec<usize> = s
        .split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .with_context(|| format!("--onsets: {x:?} is not a step"))
        })
        .collect::<Result<_>>()?;
    anyhow::ensure!(!v.is_empty(), "--onsets {s:?}: no onset step");
    for &o in &v {
        anyhow::ensure!(
            (4..steps).contains(&o),
            "--onsets: {o} must be at least 4 (after 3 warm-up steps) and below --steps ({steps})"
        );
    }
    Ok(v)
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
    if let Some(o) = &a.onsets {
        cfg.onsets = onsets(o, cfg.steps)?;
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
    cfg.rerun_unrecoverable |= a.rerun_unrecoverable;
    if let Some(s) = &a.shard {
        cfg.shard = shard(s)?;
    }
    if let Some(n) = a.max_new_tokens {
        anyhow::ensure!(
            (8..=4096).contains(&n),
            "--max-new-tokens {n}: between 8 and 4096"
        );
        cfg.rl.max_new_tokens = n;
    }
    anyhow::ensure!(
        !cfg.tune_seeds.is_empty() && !cfg.test_seeds.is_empty(),
        "faultbench needs at least one tuning and one test seed"
    );
    if a.remediate_only {
        return remediate_only(&a, &cfg);
    }
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
    let items = bench_items(&a)?;
    let model = match &a.model {
        Some(m) => m.clone(),
        None => {
            let m = a.out.join("model");
            // Another shard's process may have made it already (the same seed gives the same model).
            if !m.join("tokenizer.json").exists() {
                init_model(Preset::Tiny, &m, 1, &[EMBEDDED_CORPUS.to_string()])?;
            }
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

#[cfg(test)]
mod tests {
    use super::onsets;

    #[test]
    fn onsets_must_follow_the_warm_up_and_lie_within_the_run() {
        assert_eq!(onsets("5, 6", 8).ok(), Some(vec![5, 6]));
        for bad in ["3", "8", "5,x", "", ","] {
            let e = onsets(bad, 8).expect_err(bad).to_string();
            assert!(e.starts_with("--onsets"), "{bad:?}: {e}");
        }
    }
}
