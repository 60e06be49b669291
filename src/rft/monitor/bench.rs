//! RFT-FaultBench on sorft: many short stage-2 runs of a small model, each clean or with one
//! injected fault ([`super::inject`]) at an easy or hard strength from an onset step; records in
//! an RFT-FaultBench-like layout; detection, diagnosis and remediation scored against matched
//! clean runs, with thresholds tuned on some seeds and reported on others, beside two baselines
//! (static thresholds and a plain z-score).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::detect::{
    Alarm, Detector, RobustConfig, RobustDetector, StaticDetector, ZScoreDetector,
};
use super::diagnose::diagnose;
use super::features::StepRecord;
use super::inject::{Injection, Strength};
use super::supervisor::{reward_range, Supervisor, Verdict};
use super::taxonomy::{FaultFamily, FaultType};
use super::{MonitorEvent, MonitorMode};
use crate::engine::rng::random_u64;
use crate::engine::Backend;
use crate::model::{Model, Tokenizer};
use crate::rft::rl::{RlConfig, RlItem, RlTrainer};

/// New tokens per response of the benchmark's runs: with 32 every step of the tiny model was
/// truncated with reward 0 (measured, notes/faultbench.md), so reward faults were invisible; 96
/// leaves room for the thought and the constrained answer.
pub const TOKENS: usize = 96;

/// What the benchmark runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchConfig {
    /// Steps per run.
    pub steps: usize,
    /// Onset steps faults are injected at (each run draws one).
    pub onsets: Vec<usize>,
    /// Seeds the detector is tuned on.
    pub tune_seeds: Vec<u64>,
    /// Seeds the numbers are reported on.
    pub test_seeds: Vec<u64>,
    /// Fault types injected.
    pub faults: Vec<FaultType>,
    /// Strengths injected on the test seeds.
    pub strengths: Vec<Strength>,
    /// Strengths injected on the tuning seeds.
    pub tune_strengths: Vec<Strength>,
    /// Stage-2 settings of every run (seed and steps are set per run).
    pub rl: RlConfig,
    /// Re-run the test seeds' recoverable faults with the monitor remediating.
    pub remediation: bool,
    /// Also re-run the faults no remediation can fix (to count the runs the monitor stops).
    pub rerun_unrecoverable: bool,
    /// A remediated run recovers when its final reward is within this of its clean twin's.
    pub tolerance: f64,
    /// Run only shard `.0` of `.1` of the detection runs (a faulty run and its clean twin stay
    /// in one shard), so that several processes can share the work; (0, 1): all.
    #[serde(default = "all_shards")]
    pub shard: (usize, usize),
}

fn all_shards() -> (usize, usize) {
    (0, 1)
}

impl BenchConfig {
    /// The tiny stage-2 settings of the benchmark's runs.
    pub fn tiny_rl() -> RlConfig {
        RlConfig {
            prompts_per_step: 2,
            group_size: 2,
            ppo_epochs: 1,
            minibatch: 4,
            lr: 1e-3,
            // Enough for the constrained answer after the forced `</think>` (half the budget is
            // kept for it): the fresh model then names shown paths and earns rewards, and a
            // response that closes its answer stops before the budget.
            max_new_tokens: TOKENS,
            max_prompt_tokens: 2048,
            temperature: 1.0,
            // Grammar-constrained answers ([`crate::swe::grammar`]): positive rewards even for
            // the fresh tiny model, so reward faults change the run.
            constrain: true,
            // Updates every step even when a group's rewards tie (tiny models often score 0).
            entropy_coef: 0.01,
            skip_uniform_groups: false,
            save_every: 0,
            monitor: MonitorMode::Off,
            ..RlConfig::default()
        }
    }

    /// The CI variant (about two minutes on two cores): four fault types, one per family but
    /// CA, easy, on one tuning and one test seed, with their clean twins.
    pub fn quick() -> Self {
        Self {
            steps: 6,
            onsets: vec![4, 5],
            tune_seeds: vec![1],
            test_seeds: vec![2],
            faults: vec![
                FaultType::RewardNoise,
                FaultType::LrTooHigh,
                FaultType::EmptyOutputs,
                FaultType::SandboxFailure,
            ],
            strengths: vec![Strength::Easy],
            tune_strengths: vec![Strength::Easy],
            rl: Self::tiny_rl(),
            remediation: false,
            rerun_unrecoverable: false,
            tolerance: 0.1,
            shard: all_shards(),
        }
    }

    /// The benchmark: every fault type, easy and hard on the tuning seed and on two held-out
    /// test seeds, clean twins, remediation re-runs. Runs of 8 steps with onsets 5 or 6: a
    /// baseline of 4-5 healthy steps and 3-4 faulty ones (runs of 6 with onsets 4-5 left one
    /// or two faulty steps, too few to see a fault that touches a third of 4 responses).
    pub fn full() -> Self {
        Self {
            steps: 8,
            onsets: vec![5, 6],
            faults: FaultType::ALL.to_vec(),
            test_seeds: vec![2, 3],
            strengths: vec![Strength::Easy, Strength::Hard],
            tune_strengths: vec![Strength::Easy, Strength::Hard],
            remediation: true,
            ..Self::quick()
        }
    }
}

/// Which seeds a run belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Tuning seeds.
    Tune,
    /// Test seeds (reported).
    Test,
}

/// One run of the benchmark.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// Unique id (directory name).
    pub id: String,
    /// The benchmark seed.
    pub seed: u64,
    /// Tuning or test.
    pub split: Split,
    /// The RL seed (shared with the clean twin).
    pub rl_seed: u64,
    /// The family (of the fault, or of the faulty twin for a clean run).
    pub family: FaultFamily,
    /// The injected fault (`None`: clean).
    pub fault: Option<FaultType>,
    /// Its strength (of the twin for a clean run).
    pub strength: Strength,
    /// The onset step (of the twin for a clean run).
    pub onset: usize,
}

/// What one run left.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run.
    pub spec: RunSpec,
    /// The monitor mode it ran with.
    pub mode: MonitorMode,
    /// Step records.
    pub steps: Vec<StepRecord>,
    /// Mean reward of the last three steps.
    pub final_reward: f64,
    /// Monitor events (remediation runs).
    pub events: Vec<MonitorEvent>,
    /// The monitor stopped the run.
    pub stopped: bool,
    /// The run failed with this error.
    pub error: Option<String>,
    /// Seconds.
    pub wall_s: f64,
}

/// Every run of `cfg`: each fault type at each strength on each seed, with its clean twin.
pub fn specs(cfg: &BenchConfig) -> Vec<RunSpec> {
    let mut out = Vec::new();
    let seeds = cfg
        .tune_seeds
        .iter()
        .map(|&s| (s, Split::Tune))
        .chain(cfg.test_seeds.iter().map(|&s| (s, Split::Test)));
    for (seed, split) in seeds {
        let strengths = match split {
            Split::Tune => &cfg.tune_strengths,
            Split::Test => &cfg.strengths,
        };
        for (fi, &fault) in cfg.faults.iter().enumerate() {
            for (si, &strength) in strengths.iter().enumerate() {
                let k = (fi * 2 + si) as u64;
                let rl_seed = random_u64(seed, 0xfb, k) % 1_000_000;
                let onset = cfg.onsets
                    [(random_u64(seed, 0x05e7, k) % cfg.onsets.len().max(1) as u64) as usize];
                let sname = match strength {
                    Strength::Easy => "easy",
                    Strength::Hard => "hard",
                };
                for f in [Some(fault), None] {
                    out.push(RunSpec {
                        id: format!(
                            "s{seed}-{}-{sname}-{}",
                            fault.name(),
                            if f.is_some() { "fault" } else { "clean" }
                        ),
                        seed,
                        split,
                        rl_seed,
                        family: fault.family(),
                        fault: f,
                        strength,
                        onset,
                    });
                }
            }
        }
    }
    out
}

/// Runs one benchmark run from the model `policy_dir` (also the reference, given loaded).
#[allow(clippy::too_many_arguments)]
pub fn run_one<B: Backend>(
    be: &B,
    policy_dir: &Path,
    reference: &Model<B>,
    tok: &Tokenizer,
    items: &[RlItem],
    cfg: &BenchConfig,
    spec: &RunSpec,
    mode: MonitorMode,
    detector: &RobustConfig,
) -> anyhow::Result<RunRecord> {
    let t = Instant::now();
    let (mut policy, _) = crate::model::load_dir(be, policy_dir)?;
    let rl = RlConfig {
        seed: spec.rl_seed,
        steps: cfg.steps,
        monitor: mode,
        ..cfg.rl.clone()
    };
    let mut trainer = RlTrainer::new(&policy, tok, items, rl.clone())?;
    trainer.fault = spec
        .fault
        .map(|f| Injection::new(f, spec.strength, spec.onset, spec.rl_seed ^ 0xfa));
    let mut sup = Supervisor::with_detector(
        mode,
        RobustDetector::new(RobustConfig {
            reward_range: Some(reward_range(&rl)),
            ..detector.clone()
        }),
    );
    sup.start(&trainer, &policy)?;
    let mut steps = Vec::new();
    let (mut stopped, mut error) = (false, None);
    while trainer.step < cfg.steps {
        let mut m = match trainer.step(&mut policy, reference, tok, items) {
            Ok(m) => m,
            Err(e) => {
                error = Some(format!("step {}: {e:#}", trainer.step));
                break;
            }
        };
        let verdict = sup.after_step(&mut trainer, &mut policy, &mut m)?;
        steps.push(StepRecord::from_json(&serde_json::to_value(&m)?, m.step));
        if let Verdict::Stop(_) = verdict {
            stopped = true;
            break;
        }
    }
    let tail: Vec<f64> = steps
        .iter()
        .rev()
        .take(3)
        .filter_map(|s| s.get("reward_mean"))
        .collect();
    Ok(RunRecord {
        spec: spec.clone(),
        mode,
        steps,
        final_reward: tail.iter().sum::<f64>() / tail.len().max(1) as f64,
        events: sup.events,
        stopped,
        error,
        wall_s: t.elapsed().as_secs_f64(),
    })
}

/// Writes a run's records: `runs/<id>/step_records.jsonl` and `meta.json`.
pub fn write_record(out: &Path, r: &RunRecord, suffix: &str) -> anyhow::Result<()> {
    let dir = out.join("runs").join(format!("{}{suffix}", r.spec.id));
    std::fs::create_dir_all(&dir)?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("step_records.jsonl"))?);
    for s in &r.steps {
        let mut v = serde_json::to_value(&s.values)?;
        v["step"] = s.step.into();
        v["label"] = match r.spec.fault {
            Some(ft) if s.step >= r.spec.onset => ft.name().into(),
            _ => "normal".into(),
        };
        writeln!(f, "{v}")?;
    }
    f.flush()?;
    let meta = serde_json::json!({
        "spec": r.spec, "mode": r.mode, "final_reward": r.final_reward, "stopped": r.stopped,
        "error": r.error, "wall_s": r.wall_s, "events": r.events,
    });
    std::fs::write(dir.join("meta.json"), serde_json::to_string_pretty(&meta)?)?;
    Ok(())
}

/// How a detector did on one run.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    /// First alarm at or after the onset (faulty runs), or any alarm (clean runs).
    pub first: Option<Alarm>,
    /// An alarm came before the onset (faulty runs) or at all (clean runs).
    pub false_alarm: bool,
    /// Alarmed steps among the clean steps.
    pub clean_alarms: usize,
    /// Clean steps (all of a clean run, those before the onset of a faulty one).
    pub clean_steps: usize,
}

/// Replays `det` over a run's steps.
pub fn replay(det: &mut dyn Detector, r: &RunRecord) -> Replay {
    let mut out = Replay::default();
    for s in &r.steps {
        let clean = r.spec.fault.is_none() || s.step < r.spec.onset;
        let alarm = det.observe(s);
        if clean {
            out.clean_steps += 1;
        }
        if let Some(a) = alarm {
            if clean {
                out.clean_alarms += 1;
                out.false_alarm = true;
            } else if out.first.is_none() {
                out.first = Some(a);
            }
        }
    }
    out
}

/// Precision, recall, F1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Prf {
    /// Precision.
    pub p: f64,
    /// Recall.
    pub r: f64,
    /// F1.
    pub f1: f64,
    /// Faulty runs.
    pub n: usize,
}

fn prf(tp: usize, fp: usize, n_faulty: usize) -> Prf {
    let p = if tp + fp > 0 {
        tp as f64 / (tp + fp) as f64
    } else {
        0.0
    };
    let r = tp as f64 / n_faulty.max(1) as f64;
    let f1 = if p + r > 0.0 {
        2.0 * p * r / (p + r)
    } else {
        0.0
    };
    Prf {
        p,
        r,
        f1,
        n: n_faulty,
    }
}

/// A detector's scores on a set of runs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Scores {
    /// Detector name.
    pub detector: String,
    /// (family code, strength) -> P/R/F1 over that family's faulty runs and their clean twins.
    pub by_family: BTreeMap<String, Prf>,
    /// Mean F1 over families, easy.
    pub f1_easy: f64,
    /// Mean F1 over families, hard.
    pub f1_hard: f64,
    /// Over all runs.
    pub overall: Prf,
    /// Alarms per 1,000 clean steps.
    pub false_alarms_per_1000: f64,
    /// One-sided 95% upper bound of that rate (exact binomial, Clopper-Pearson).
    #[serde(default)]
    pub false_alarms_upper95: f64,
    /// Clean steps the rate is over.
    #[serde(default)]
    pub clean_steps: usize,
    /// Mean detection delay (steps after the onset) of the detected faults.
    pub mean_delay: f64,
    /// Fault-type accuracy of the diagnosis on detected faults.
    pub type_accuracy: f64,
    /// Family accuracy of the diagnosis on detected faults.
    pub family_accuracy: f64,
    /// Fault type -> (faulty runs, detected).
    pub by_type: BTreeMap<String, (usize, usize)>,
    /// True type -> diagnosed type ("unknown" when none) -> count.
    pub confusion: BTreeMap<String, BTreeMap<String, usize>>,
}

/// Scores the detector `make()` builds on `runs`.
pub fn score(runs: &[&RunRecord], make: &dyn Fn() -> Box<dyn Detector>) -> Scores {
    let mut s = Scores::default();
    let mut counts: BTreeMap<(String, Strength), (usize, usize, usize)> = BTreeMap::new();
    let (mut tp_all, mut fp_all, mut nf_all) = (0, 0, 0);
    let (mut clean_alarms, mut clean_steps) = (0usize, 0usize);
    let (mut delays, mut type_ok, mut fam_ok, mut diagnosed) = (Vec::new(), 0, 0, 0);
    for r in runs {
        let mut det = make();
        s.detector = det.name().to_string();
        let rp = replay(det.as_mut(), r);
        clean_alarms += rp.clean_alarms;
        clean_steps += rp.clean_steps;
        let c = counts
            .entry((r.spec.family.code().to_string(), r.spec.strength))
            .or_default();
        match r.spec.fault {
            None => {
                if rp.false_alarm {
                    c.1 += 1;
                    fp_all += 1;
                }
            }
            Some(ft) => {
                c.2 += 1;
                nf_all += 1;
                let bt = s.by_type.entry(ft.name().to_string()).or_default();
                bt.0 += 1;
                bt.1 += usize::from(!rp.false_alarm && rp.first.is_some());
                if rp.false_alarm {
                    c.1 += 1;
                    fp_all += 1;
                } else if let Some(a) = &rp.first {
                    c.0 += 1;
                    tp_all += 1;
                    delays.push((a.step - r.spec.onset) as f64);
                    let d = diagnose(a);
                    diagnosed += 1;
                    type_ok += usize::from(d.fault == Some(ft));
                    fam_ok += usize::from(d.family == Some(ft.family()));
                    *s.confusion
                        .entry(ft.name().to_string())
                        .or_default()
                        .entry(d.fault.map(|f| f.name()).unwrap_or("unknown").to_string())
                        .or_default() += 1;
                }
            }
        }
    }
    for ((fam, st), (tp, fp, n)) in &counts {
        let key = format!(
            "{fam}/{}",
            if *st == Strength::Easy {
                "easy"
            } else {
                "hard"
            }
        );
        s.by_family.insert(key, prf(*tp, *fp, *n));
    }
    let mean_f1 = |st: &str| {
        let v: Vec<f64> = s
            .by_family
            .iter()
            .filter(|(k, _)| k.ends_with(st))
            .map(|(_, p)| p.f1)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64 + 0.0
    };
    s.f1_easy = mean_f1("easy");
    s.f1_hard = mean_f1("hard");
    s.overall = prf(tp_all, fp_all, nf_all);
    s.false_alarms_per_1000 = 1000.0 * clean_alarms as f64 / clean_steps.max(1) as f64;
    s.false_alarms_upper95 = 1000.0 * binomial_upper95(clean_alarms, clean_steps);
    s.clean_steps = clean_steps;
    s.mean_delay = delays.iter().sum::<f64>() / delays.len().max(1) as f64;
    s.type_accuracy = type_ok as f64 / diagnosed.max(1) as f64;
    s.family_accuracy = fam_ok as f64 / diagnosed.max(1) as f64;
    s
}

/// ln C(n, k) + k ln p + (n - k) ln (1 - p), the log-probability of `k` events in `n` trials.
fn ln_binom_pmf(k: usize, n: usize, p: f64) -> f64 {
    let ln_choose: f64 = (0..k)
        .map(|i| ((n - i) as f64).ln() - ((i + 1) as f64).ln())
        .sum();
    let tail = if n > k {
        (n - k) as f64 * (-p).ln_1p()
    } else {
        0.0
    };
    ln_choose + if k > 0 { k as f64 * p.ln() } else { 0.0 } + tail
}

/// The one-sided 95% upper bound of a rate seen `k` times in `n` trials: the `p` at which
/// `P(X <= k) = 0.05` (Clopper-Pearson; `k = 0` gives `1 - 0.05^(1/n)`, about `3 / n`).
pub fn binomial_upper95(k: usize, n: usize) -> f64 {
    if n == 0 {
        return 1.0;
    }
    if k >= n {
        return 1.0;
    }
    let cdf = |p: f64| -> f64 { (0..=k).map(|i| ln_binom_pmf(i, n, p).exp()).sum() };
    let (mut lo, mut hi) = (k as f64 / n as f64, 1.0);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if cdf(mid) > 0.05 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// The objective of tuning: mean F1 (easy and hard), heavily penalised above 1 false alarm per
/// 1,000 clean steps.
fn objective(s: &Scores) -> f64 {
    let fa_pen = (s.false_alarms_per_1000 - 1.0).max(0.0) * 0.01;
    (s.f1_easy + s.f1_hard) / 2.0 - fa_pen
}

/// Tuned detectors: RFT-FM's z-threshold and CUSUM limit, the z-score baseline's threshold, the
/// static baseline's bounds and margin — all from the tuning runs only.
pub struct Tuned {
    /// RFT-FM settings.
    pub robust: RobustConfig,
    /// z-score threshold.
    pub z: f64,
    /// Static bounds.
    pub fixed: StaticDetector,
    /// Static margin.
    pub margin: f64,
}

/// Tunes every detector on `tune` (grid search on [`objective`]).
pub fn tune(tune: &[&RunRecord], reward: (f64, f64)) -> Tuned {
    let mut best = (f64::NEG_INFINITY, RobustConfig::default());
    let grid = [3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .into_iter()
        .flat_map(|z| [3.0, 4.0, 6.0, 10.0, 1e9].map(|h| (z, h)))
        .flat_map(|(z, h)| [3.0, 2.0, 1.5].map(|k| (z, h, k)))
        .flat_map(|(z, h, k)| [0.0, 0.5, -1.0].map(|d| (z, h, k, d)));
    for (z, h, k, d) in grid {
        let c = RobustConfig {
            z_threshold: z,
            cusum_h: h,
            cusum_k: k,
            disagree_limit: d,
            reward_range: Some(reward),
            ..RobustConfig::default()
        };
        let cc = c.clone();
        let s = score(tune, &move || Box::new(RobustDetector::new(cc.clone())));
        let o = objective(&s);
        if o > best.0 {
            best = (o, c);
        }
    }
    let mut bz = (f64::NEG_INFINITY, 3.0);
    for z in [2.0, 3.0, 4.0, 6.0, 8.0] {
        let s = score(tune, &move || Box::new(ZScoreDetector::new(z, 3)));
        let o = objective(&s);
        if o > bz.0 {
            bz = (o, z);
        }
    }
    let clean: Vec<StepRecord> = tune
        .iter()
        .filter(|r| r.spec.fault.is_none())
        .flat_map(|r| r.steps.iter().cloned())
        .collect();
    let mut bs = (f64::NEG_INFINITY, 0.0);
    for m in [0.0, 0.1, 0.25, 0.5, 1.0, 2.0] {
        let det = StaticDetector::fit(&clean, m);
        let s = score(tune, &move || Box::new(det.clone()));
        let o = objective(&s);
        if o > bs.0 {
            bs = (o, m);
        }
    }
    Tuned {
        robust: best.1,
        z: bz.1,
        fixed: StaticDetector::fit(&clean, bs.1),
        margin: bs.1,
    }
}

/// Remediation results on the test seeds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RemediationScores {
    /// Faulty runs of recoverable types re-run with remediation.
    pub runs: usize,
    /// Those whose final reward ended within the tolerance of the clean twin's.
    pub recovered: usize,
    /// The same faulty runs without remediation, within the tolerance.
    pub recovered_without: usize,
    /// Non-recoverable faulty runs the monitor stopped.
    pub stopped_unrecoverable: usize,
    /// Non-recoverable faulty runs re-run.
    pub unrecoverable_runs: usize,
    /// Per fault type: (runs, recovered).
    pub by_type: BTreeMap<String, (usize, usize)>,
}

/// Everything the benchmark measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BenchReport {
    /// The configuration.
    pub steps: usize,
    /// Runs in all (detection phase).
    pub runs: usize,
    /// Runs that failed with an error.
    pub errors: usize,
    /// Test-seed scores of each detector.
    pub scores: Vec<Scores>,
    /// The same on the test runs whose fault left a trace ([`inert_runs`] left out).
    #[serde(default)]
    pub effective: Vec<Scores>,
    /// Test-seed faulty runs whose injection changed nothing (ids).
    #[serde(default)]
    pub inert: Vec<String>,
    /// Tuning-seed scores of RFT-FM (for comparison).
    pub tune_scores: Option<Scores>,
    /// Tuned RFT-FM settings.
    pub robust: Option<RobustConfig>,
    /// Tuned z-score threshold and static margin.
    pub baselines: (f64, f64),
    /// Remediation.
    pub remediation: Option<RemediationScores>,
    /// Per fault type, what the injection changed against the clean twins (all seeds).
    #[serde(default)]
    pub effects: BTreeMap<String, Effect>,
    /// Mean reward over every step of the clean runs (is there a reward to corrupt?).
    #[serde(default)]
    pub clean_reward_mean: f64,
    /// Share of the clean runs' steps with a reward spread (some response scored above another).
    #[serde(default)]
    pub clean_spread_frac: f64,
    /// Wall seconds.
    pub wall_s: f64,
}

/// What a fault type's injection changed, over its faulty runs and their clean twins.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    /// Faulty runs with a clean twin.
    pub runs: usize,
    /// Those whose records from the onset on differ from the twin's (timings aside).
    pub changed: usize,
    /// Those whose step rewards from the onset on differ from the twin's.
    pub reward_changed: usize,
    /// Mean final reward of the faulty runs.
    pub final_faulty: f64,
    /// Mean final reward of their clean twins.
    pub final_clean: f64,
}

/// Timings and memory differ between any two runs: not an effect of the fault.
fn is_timing(key: &str) -> bool {
    key.starts_with("time_") || key == "rollout_tokens_per_s" || key == "peak_rss_mib"
}

fn differs(a: &StepRecord, b: &StepRecord, only: Option<&str>) -> bool {
    let keys = a.values.keys().chain(b.values.keys());
    keys.filter(|k| !is_timing(k) && only.is_none_or(|o| k.as_str() == o))
        .any(|k| match (a.values.get(k), b.values.get(k)) {
            (Some(x), Some(y)) => (x - y).abs() > 1e-9 * (1.0 + x.abs().max(y.abs())),
            _ => true,
        })
}

/// The clean twin of faulty run `r` (same seed, RL seed and strength), if recorded.
fn twin_of<'a>(records: &'a [RunRecord], r: &RunRecord) -> Option<&'a RunRecord> {
    records.iter().find(|c| {
        c.spec.fault.is_none()
            && c.spec.seed == r.spec.seed
            && c.spec.rl_seed == r.spec.rl_seed
            && c.spec.strength == r.spec.strength
    })
}

/// Whether faulty run `r`'s records from its onset on differ from its twin `c`'s (in `only`, or
/// in any value but timings).
fn changed(r: &RunRecord, c: &RunRecord, only: Option<&str>) -> bool {
    let after = |x: &'_ RunRecord| -> Vec<StepRecord> {
        x.steps
            .iter()
            .filter(|s| s.step >= r.spec.onset)
            .cloned()
            .collect()
    };
    let (fa, ca) = (after(r), after(c));
    fa.len() != ca.len() || fa.iter().zip(&ca).any(|(a, b)| differs(a, b, only))
}

/// Ids of the faulty runs whose injection left no trace: every record from the onset on equals
/// the clean twin's, timings aside (a shuffle of equal scores, flaky verdicts that happened to
/// agree, a non-finite value on a step that was not drawn). No detector can tell such a run
/// from its twin, so the benchmark scores them apart ([`BenchReport::effective`]).
pub fn inert_runs(records: &[RunRecord]) -> std::collections::BTreeSet<String> {
    records
        .iter()
        .filter(|r| r.spec.fault.is_some())
        .filter(|r| twin_of(records, r).is_some_and(|c| !changed(r, c, None)))
        .map(|r| r.spec.id.clone())
        .collect()
}

/// Per fault type, how its faulty runs differ from their clean twins (same seed and RL seed).
pub fn effects(records: &[RunRecord]) -> BTreeMap<String, Effect> {
    let mut out: BTreeMap<String, Effect> = BTreeMap::new();
    for r in records {
        let Some(ft) = r.spec.fault else { continue };
        let Some(c) = twin_of(records, r) else {
            continue;
        };
        let e = out.entry(ft.name().to_string()).or_default();
        e.runs += 1;
        e.changed += usize::from(changed(r, c, None));
        e.reward_changed +=
            usize::from(changed(r, c, Some("reward_mean")) || changed(r, c, Some("reward_std")));
        e.final_faulty += r.final_reward;
        e.final_clean += c.final_reward;
    }
    for e in out.values_mut() {
        e.final_faulty /= e.runs.max(1) as f64;
        e.final_clean /= e.runs.max(1) as f64;
    }
    out
}

/// Mean reward of the clean runs' steps and the share of those steps whose rewards spread.
pub fn clean_rewards(records: &[RunRecord]) -> (f64, f64) {
    let steps: Vec<&StepRecord> = records
        .iter()
        .filter(|r| r.spec.fault.is_none())
        .flat_map(|r| &r.steps)
        .collect();
    let n = steps.len().max(1) as f64;
    let mean = steps
        .iter()
        .filter_map(|s| s.get("reward_mean"))
        .sum::<f64>()
        / n;
    let spread = steps
        .iter()
        .filter(|s| s.get("reward_std").is_some_and(|x| x > 1e-9))
        .count() as f64
        / n;
    (mean, spread)
}

/// Runs the benchmark: all runs (monitor off, records written under `out`), tuning, scoring,
/// then remediation re-runs; writes `report.md` and `summary.json`.
#[allow(clippy::too_many_arguments)]
pub fn run_bench<B: Backend>(
    be: &B,
    model_dir: &Path,
    items: &[RlItem],
    cfg: &BenchConfig,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<BenchReport> {
    let t = Instant::now();
    std::fs::create_dir_all(out)?;
    let (reference, tok) = crate::model::load_dir(be, model_dir)?;
    let tok = tok.ok_or_else(|| anyhow::anyhow!("{}: no tokenizer.json", model_dir.display()))?;
    let (k, n) = (cfg.shard.0, cfg.shard.1.max(1));
    let all: Vec<RunSpec> = specs(cfg)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| (i / 2) % n == k)
        .map(|(_, s)| s)
        .collect();
    let mut records = Vec::new();
    for (i, spec) in all.iter().enumerate() {
        if let Some(r) = load_record(&out.join("runs").join(&spec.id))? {
            // The split is a label of the seed, not part of the run: a seed moved from the test
            // to the tuning seeds keeps its records.
            let same_run = RunSpec {
                split: spec.split,
                ..r.spec.clone()
            };
            if same_run == *spec {
                progress(&format!("[{}/{}] {} recorded", i + 1, all.len(), spec.id));
                records.push(r);
                continue;
            }
        }
        let r = run_one(
            be,
            model_dir,
            &reference,
            &tok,
            items,
            cfg,
            spec,
            MonitorMode::Off,
            &RobustConfig::default(),
        )?;
        write_record(out, &r, "")?;
        progress(&format!(
            "[{}/{}] {} final reward {:.3}{} ({:.1}s)",
            i + 1,
            all.len(),
            spec.id,
            r.final_reward,
            r.error
                .as_deref()
                .map(|e| format!(" error: {e}"))
                .unwrap_or_default(),
            r.wall_s
        ));
        records.push(r);
    }
    let mut report = evaluate(&records, cfg);
    if cfg.remediation {
        let robust = report.robust.clone().unwrap_or_default();
        report.remediation = Some(remediate_phase(
            be, model_dir, &reference, &tok, items, cfg, &records, &robust, out, progress,
        )?);
    }
    report.wall_s = t.elapsed().as_secs_f64();
    write_report(out, &report, cfg)?;
    Ok(report)
}

/// Writes `summary.json` and `report.md`.
pub fn write_report(out: &Path, report: &BenchReport, cfg: &BenchConfig) -> anyhow::Result<()> {
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    std::fs::write(out.join("report.md"), markdown(report, cfg))?;
    Ok(())
}

/// Tunes the detectors on the tuning runs of `records` and scores them on the test runs.
pub fn evaluate(records: &[RunRecord], cfg: &BenchConfig) -> BenchReport {
    let reward = reward_range(&cfg.rl);
    let inert = inert_runs(records);
    // The split of a run is its seed's in `cfg` (records of other seeds are left out), not the
    // one stored with it: the same records can be scored with other seeds held out.
    let split_of = |r: &RunRecord| {
        if cfg.test_seeds.contains(&r.spec.seed) {
            Some(Split::Test)
        } else if cfg.tune_seeds.contains(&r.spec.seed) {
            Some(Split::Tune)
        } else {
            None
        }
    };
    let split = |sp: Split, all: bool| -> Vec<&RunRecord> {
        records
            .iter()
            .filter(|r| split_of(r) == Some(sp) && (all || !inert.contains(&r.spec.id)))
            .collect()
    };
    let (tune_runs, test_runs) = (split(Split::Tune, false), split(Split::Test, true));
    let effective_test = split(Split::Test, false);
    // Tuned on the tuning runs whose fault changed something: an inert run only teaches a
    // detector to alarm on clean-looking steps.
    let tuned = tune(&tune_runs, reward);
    let rc = tuned.robust.clone();
    let robust = move || -> Box<dyn Detector> { Box::new(RobustDetector::new(rc.clone())) };
    let z = tuned.z;
    let fixed = tuned.fixed.clone();
    let zscore = move || -> Box<dyn Detector> { Box::new(ZScoreDetector::new(z, 3)) };
    let fixed = move || -> Box<dyn Detector> { Box::new(fixed.clone()) };
    let all = |runs: &[&RunRecord]| {
        vec![
            score(runs, &robust),
            score(runs, &zscore),
            score(runs, &fixed),
        ]
    };
    let scores = all(&test_runs);
    let effective = all(&effective_test);
    let inert_ids: Vec<String> = test_runs
        .iter()
        .filter(|r| inert.contains(&r.spec.id))
        .map(|r| r.spec.id.clone())
        .collect();
    let (clean_reward_mean, clean_spread_frac) = clean_rewards(records);
    BenchReport {
        steps: cfg.steps,
        effects: effects(records),
        clean_reward_mean,
        clean_spread_frac,
        runs: records.len(),
        errors: records.iter().filter(|r| r.error.is_some()).count(),
        tune_scores: Some(score(&tune_runs, &robust)),
        scores,
        effective,
        inert: inert_ids,
        robust: Some(tuned.robust.clone()),
        baselines: (tuned.z, tuned.margin),
        remediation: None,
        wall_s: 0.0,
    }
}

/// Reads back one detection-phase run directory as [`write_record`] wrote it; `None` when it
/// has no `meta.json` (a run killed before it finished).
pub fn load_record(d: &Path) -> anyhow::Result<Option<RunRecord>> {
    let mp = d.join("meta.json");
    let Ok(text) = std::fs::read_to_string(&mp) else {
        return Ok(None);
    };
    let meta: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", mp.display()))?;
    let spec: RunSpec = serde_json::from_value(meta["spec"].clone())
        .map_err(|e| anyhow::anyhow!("{}: spec: {e}", mp.display()))?;
    let sp = d.join("step_records.jsonl");
    let st = std::fs::read_to_string(&sp).map_err(|e| anyhow::anyhow!("{}: {e}", sp.display()))?;
    let mut steps = Vec::new();
    for (i, l) in st.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l)
            .map_err(|e| anyhow::anyhow!("{}: line {}: {e}", sp.display(), i + 1))?;
        steps.push(StepRecord::from_json(&v, i + 1));
    }
    Ok(Some(RunRecord {
        spec,
        mode: MonitorMode::Off,
        steps,
        final_reward: meta["final_reward"].as_f64().unwrap_or(0.0),
        events: Vec::new(),
        stopped: meta["stopped"].as_bool().unwrap_or(false),
        error: meta["error"].as_str().map(str::to_string),
        wall_s: meta["wall_s"].as_f64().unwrap_or(0.0),
    }))
}

/// Reads back the detection-phase records under `out/runs` (as [`write_record`] wrote them),
/// keeping only faulty runs whose clean twin is there too and vice versa (a benchmark stopped
/// part-way scores its complete pairs).
pub fn load_records(out: &Path) -> anyhow::Result<Vec<RunRecord>> {
    let runs = out.join("runs");
    let mut dirs: Vec<_> = std::fs::read_dir(&runs)
        .map_err(|e| anyhow::anyhow!("{}: {e}", runs.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| !p.to_string_lossy().ends_with("-remediate"))
        .collect();
    dirs.sort();
    let mut recs = Vec::new();
    for d in dirs {
        recs.extend(load_record(&d)?);
    }
    let key = |r: &RunRecord| (r.spec.seed, r.spec.rl_seed, r.spec.strength);
    let keep: Vec<bool> = recs
        .iter()
        .map(|r| {
            let has = |faulty: bool| {
                recs.iter()
                    .any(|o| key(o) == key(r) && o.spec.fault.is_some() == faulty)
            };
            has(true) && has(false)
        })
        .collect();
    Ok(recs
        .into_iter()
        .zip(keep)
        .filter_map(|(r, k)| k.then_some(r))
        .collect())
}

/// Re-runs the test seeds' faulty runs of `records` whose fault is in `cfg.faults` (and
/// recoverable, unless `cfg.rerun_unrecoverable`) with the monitor remediating (detector
/// `robust`), each against its clean twin; writes `runs/<id>-remediate`.
#[allow(clippy::too_many_arguments)]
pub fn remediate_phase<B: Backend>(
    be: &B,
    model_dir: &Path,
    reference: &Model<B>,
    tok: &Tokenizer,
    items: &[RlItem],
    cfg: &BenchConfig,
    records: &[RunRecord],
    robust: &RobustConfig,
    out: &Path,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<RemediationScores> {
    let mut rs = RemediationScores::default();
    let faulty: Vec<&RunRecord> = records
        .iter()
        .filter(|r| cfg.test_seeds.contains(&r.spec.seed))
        .filter(|r| {
            r.spec.fault.is_some_and(|f| {
                cfg.faults.contains(&f) && (f.recoverable() || cfg.rerun_unrecoverable)
            })
        })
        .collect();
    for (i, r) in faulty.iter().enumerate() {
        let Some(ft) = r.spec.fault else { continue };
        let Some(clean) = twin_of(records, r) else {
            continue;
        };
        let m = run_one(
            be,
            model_dir,
            reference,
            tok,
            items,
            cfg,
            &r.spec,
            MonitorMode::Remediate,
            robust,
        )?;
        write_record(out, &m, "-remediate")?;
        let ok = |x: &RunRecord| {
            !x.stopped
                && x.error.is_none()
                && (x.final_reward - clean.final_reward).abs() <= cfg.tolerance
        };
        if ft.recoverable() {
            rs.runs += 1;
            let e = rs.by_type.entry(ft.name().to_string()).or_default();
            e.0 += 1;
            if ok(&m) {
                rs.recovered += 1;
                e.1 += 1;
            }
            if ok(r) {
                rs.recovered_without += 1;
            }
        } else {
            rs.unrecoverable_runs += 1;
            if m.stopped {
                rs.stopped_unrecoverable += 1;
            }
        }
        progress(&format!(
            "remediation [{}/{}] {}: final {:.3} vs clean {:.3}{}",
            i + 1,
            faulty.len(),
            r.spec.id,
            m.final_reward,
            clean.final_reward,
            if m.stopped { " (stopped)" } else { "" }
        ));
    }
    Ok(rs)
}

fn pct(x: f64) -> String {
    format!("{:.1}", 100.0 * x)
}

/// One detection table: a row per detector.
fn detection_table(md: &mut String, scores: &[Scores]) {
    md.push_str("| detector | F1 easy | F1 hard | P | R | F1 | false alarms / 1000 clean steps (95% upper bound; clean steps) | mean delay (steps) | type acc. | family acc. |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for s in scores {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.1} (<= {:.1}; {}) | {:.2} | {} | {} |\n",
            s.detector,
            pct(s.f1_easy),
            pct(s.f1_hard),
            pct(s.overall.p),
            pct(s.overall.r),
            pct(s.overall.f1),
            s.false_alarms_per_1000,
            s.false_alarms_upper95,
            s.clean_steps,
            s.mean_delay,
            pct(s.type_accuracy),
            pct(s.family_accuracy)
        ));
    }
}

/// The report's tables in Markdown.
pub fn markdown(r: &BenchReport, cfg: &BenchConfig) -> String {
    let mut md = String::from("# sorft faultbench\n\n");
    md.push_str(&format!(
        "{} runs of {} steps ({} with errors); faults at onsets {:?}; tuned on seeds {:?}, reported on seeds {:?}; wall time {:.0} s.\n\n",
        r.runs, r.steps, r.errors, cfg.onsets, cfg.tune_seeds, cfg.test_seeds, r.wall_s
    ));
    md.push_str("## Detection (test seeds, every faulty run)\n\n");
    detection_table(&mut md, &r.scores);
    if !r.effective.is_empty() {
        md.push_str(&format!(
            "\n## Detection on the faults that left a trace (test seeds)\n\n{} of the test seeds' faulty runs changed nothing: from the onset on their records equal their clean twin's (timings aside), so no detector can tell them apart; they are left out here{}{}.\n\n",
            r.inert.len(),
            if r.inert.is_empty() { "" } else { ": " },
            r.inert.join(", ")
        ));
        detection_table(&mut md, &r.effective);
    }
    if let Some(t) = &r.tune_scores {
        md.push_str(&format!(
            "\nRFT-FM on its tuning seeds (the runs whose fault left a trace): F1 easy {} / hard {}, false alarms {:.1} per 1000. Tuned: z {} / CUSUM k {} h {} / answer-disagreement limit {}; z-score baseline threshold {}; static margin {}.\n",
            pct(t.f1_easy), pct(t.f1_hard), t.false_alarms_per_1000,
            r.robust.as_ref().map(|c| c.z_threshold).unwrap_or(0.0),
            r.robust.as_ref().map(|c| c.cusum_k).unwrap_or(0.0),
            r.robust.as_ref().map(|c| c.cusum_h).unwrap_or(0.0),
            r.robust.as_ref().map(|c| c.disagree_limit).unwrap_or(0.0),
            r.baselines.0, r.baselines.1
        ));
    }
    md.push_str("\n## Per family (test seeds): P / R / F1\n\n| family | detector | easy | hard |\n|---|---|---|---|\n");
    for fam in FaultFamily::ALL {
        for s in &r.scores {
            let cell = |st: &str| {
                s.by_family
                    .get(&format!("{}/{st}", fam.code()))
                    .map(|p| format!("{} / {} / {}", pct(p.p), pct(p.r), pct(p.f1)))
                    .unwrap_or_else(|| "-".into())
            };
            md.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                fam.code(),
                s.detector,
                cell("easy"),
                cell("hard")
            ));
        }
    }
    if let Some(s) = r.scores.first() {
        md.push_str("\n## Detection per fault type (RFT-FM, test seeds)\n\n| fault | family | runs | detected |\n|---|---|---|---|\n");
        for (t, (n, k)) in &s.by_type {
            let fam = FaultType::parse(t)
                .map(|f| f.family().code())
                .unwrap_or("?");
            md.push_str(&format!("| {t} | {fam} | {n} | {k} |\n"));
        }
        md.push_str("\n## Diagnosis confusion (RFT-FM, detected faults of the test seeds)\n\n| true type | diagnosed as |\n|---|---|\n");
        for (t, row) in &s.confusion {
            let cells: Vec<String> = row.iter().map(|(k, n)| format!("{k} x{n}")).collect();
            md.push_str(&format!("| {t} | {} |\n", cells.join(", ")));
        }
    }
    md.push_str(&format!(
        "\n## Does each injection change the run? (all seeds, faulty vs clean twin from the onset)\n\nClean runs: mean step reward {:.3}, steps with a reward spread {}%.\n\n| fault | runs | records changed | rewards changed | final reward faulty | final reward clean |\n|---|---|---|---|---|---|\n",
        r.clean_reward_mean,
        pct(r.clean_spread_frac)
    ));
    for (t, e) in &r.effects {
        md.push_str(&format!(
            "| {t} | {} | {} | {} | {:.3} | {:.3} |\n",
            e.runs, e.changed, e.reward_changed, e.final_faulty, e.final_clean
        ));
    }
    if let Some(rm) = &r.remediation {
        md.push_str(&format!(
            "\n## Remediation (test seeds)\n\nRecoverable faulty runs: {} of {} ({}%) ended within {} of their clean twin's final reward with remediation, {} without. Non-recoverable faulty runs stopped by the monitor: {} of {}.\n\n| fault | runs | recovered |\n|---|---|---|\n",
            rm.recovered, rm.runs, pct(rm.recovered as f64 / rm.runs.max(1) as f64), cfg.tolerance,
            rm.recovered_without, rm.stopped_unrecoverable, rm.unrecoverable_runs
        ));
        for (t, (n, k)) in &rm.by_type {
            md.push_str(&format!("| {t} | {n} | {k} |\n"));
        }
    }
    md
}

/// A starting policy that earns rewards (a fresh tiny model never writes a parsable answer):
/// the built-in teacher's answers that pass the ground-truth filter, reduced to their final
/// answer (no chain of thought, so short rollouts reach it), fine-tuned into `base` for `epochs`.
/// Returns the fine-tuned model directory (`out/policy`).
pub fn warm_policy<B: Backend>(
    be: &B,
    base: &Path,
    items: &[RlItem],
    out: &Path,
    epochs: u64,
) -> anyhow::Result<std::path::PathBuf> {
    use crate::rft::teacher::{rejection_filter, BuiltinTeacher, Teacher, TeacherItem};
    use crate::train::sft::{run_sft, Resume, SftConfig};
    let titems: Vec<TeacherItem> = items
        .iter()
        .map(|i| TeacherItem {
            record: &i.record,
            problem: &i.problem,
        })
        .collect();
    let samples = BuiltinTeacher { temperature: 0.5 }.sample(&titems, 4, 11)?;
    let (convs, _) = rejection_filter(
        &titems,
        &samples,
        crate::swe::subtask::EditReward::LineFbeta,
    );
    anyhow::ensure!(
        !convs.is_empty(),
        "the teacher answered no prompt correctly"
    );
    std::fs::create_dir_all(out)?;
    let data = out.join("answers.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&data)?);
    for mut c in convs {
        if let Some(last) = c.last_mut() {
            last.content = crate::swe::answer::final_part(&last.content)
                .trim()
                .to_string();
        }
        writeln!(f, "{}", serde_json::json!({ "messages": c }))?;
    }
    f.flush()?;
    drop(f);
    let sft_out = out.join("policy-sft");
    if sft_out.exists() {
        std::fs::remove_dir_all(&sft_out)?;
    }
    let cfg = SftConfig {
        model: base.to_path_buf(),
        data,
        out: sft_out.clone(),
        epochs,
        max_len: 2048,
        batch_tokens: 4096,
        eval_fraction: 0.0,
        save_every: 0,
        optim: crate::train::optim::OptimConfig {
            lr: 3e-3,
            weight_decay: 0.0,
            ..Default::default()
        },
        ..SftConfig::default()
    };
    let never = std::sync::atomic::AtomicBool::new(false);
    let res = run_sft(be, &cfg, Resume::No, &never, &mut |_| {})?;
    res.final_dir
        .ok_or_else(|| anyhow::anyhow!("{}: the warm-up exported no model", sft_out.display()))
}
