//! `sorft monitor`: RFT-FM's detector and diagnosis on an external run's step or trajectory
//! JSONL (OpenRLHF / veRL / TRL-style metric names, RFT-FaultBench records, or sorft's own
//! metrics.jsonl).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use sorft::rft::monitor::detect::{Detector, RobustConfig, RobustDetector};
use sorft::rft::monitor::diagnose::diagnose;
use sorft::rft::monitor::features::{aggregate_trajectories, StepRecord};

/// Arguments of `sorft monitor`.
#[derive(Args, Debug)]
pub struct MonitorArgs {
    /// The run's JSONL log (one object per step, or per trajectory).
    #[arg(long)]
    pub log: PathBuf,
    /// What a line is: step, trajectory, or auto (trajectory when steps repeat).
    #[arg(long, default_value = "auto")]
    pub kind: String,
    /// The range rewards must stay in, as LO,HI (unchecked when absent).
    #[arg(long)]
    pub reward_range: Option<String>,
    /// |z| that alarms at once.
    #[arg(long, default_value_t = 5.0)]
    pub z: f64,
}

fn range(s: &str) -> Result<(f64, f64)> {
    let (a, b) = s
        .split_once(',')
        .with_context(|| format!("--reward-range {s:?}: expected LO,HI"))?;
    let lo: f64 = a
        .trim()
        .parse()
        .with_context(|| format!("--reward-range: {a:?}"))?;
    let hi: f64 = b
        .trim()
        .parse()
        .with_context(|| format!("--reward-range: {b:?}"))?;
    anyhow::ensure!(lo < hi, "--reward-range: {lo} is not below {hi}");
    Ok((lo, hi))
}

/// Runs `sorft monitor`.
pub fn run(a: MonitorArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.log).with_context(|| format!("{}", a.log.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}: line {}: not JSON", a.log.display(), i + 1))?;
        anyhow::ensure!(
            v.is_object(),
            "{}: line {}: expected a JSON object",
            a.log.display(),
            i + 1
        );
        if v.get("event").is_some() {
            // sorft's own metrics.jsonl opens each (re)start with an event line (the device).
            continue;
        }
        rows.push(StepRecord::from_json(&v, rows.len() + 1));
    }
    anyhow::ensure!(!rows.is_empty(), "{}: no records", a.log.display());
    let repeats = rows.windows(2).any(|w| w[0].step == w[1].step);
    let steps = match a.kind.as_str() {
        "step" => rows,
        "trajectory" => aggregate_trajectories(&rows),
        "auto" if repeats => aggregate_trajectories(&rows),
        "auto" => rows,
        other => anyhow::bail!("--kind {other:?}: expected step, trajectory or auto"),
    };
    let mut det = RobustDetector::new(RobustConfig {
        z_threshold: a.z,
        reward_range: a.reward_range.as_deref().map(range).transpose()?,
        ..RobustConfig::default()
    });
    let mut alarms = 0;
    for s in &steps {
        if let Some(al) = det.observe(s) {
            alarms += 1;
            let d = diagnose(&al);
            let sig: Vec<String> = al
                .signals
                .iter()
                .take(3)
                .map(|x| format!("{} {:?} ({:?} {:.1})", x.feature, x.dir, x.rule, x.score))
                .collect();
            println!(
                "step {}: {} [{}] - {}; signals: {}",
                s.step,
                d.fault.map(|f| f.name()).unwrap_or("unknown"),
                d.family.map(|f| f.code()).unwrap_or("?"),
                d.evidence,
                sig.join(", ")
            );
        }
    }
    println!(
        "monitor: {} steps, {alarms} anomalous{}",
        steps.len(),
        if alarms == 0 { " (healthy)" } else { "" }
    );
    Ok(())
}
