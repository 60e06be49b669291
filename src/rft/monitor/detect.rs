//! Online anomaly detectors over step records (no future data). [`RobustDetector`] is RFT-FM's:
//! hard rules (non-finite values, rewards outside their range, settings that jump, sandbox
//! errors), robust z-scores against a rolling median / MAD baseline of the healthy steps with a
//! warm-up and per-feature noise floors (small batches are noisy), and a CUSUM per feature for
//! drifts. [`StaticDetector`] (per-metric thresholds) and [`ZScoreDetector`] (plain z-score) are
//! the baselines of `sorft faultbench`.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::features::StepRecord;

/// Which way a feature moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    /// Above its baseline.
    Up,
    /// Below its baseline.
    Down,
}

/// The rule that fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// A hard rule (no baseline needed).
    Hard,
    /// A robust z-score beyond the threshold.
    RobustZ,
    /// A CUSUM drift beyond its limit.
    Cusum,
    /// A static threshold (baseline detector).
    Static,
    /// A plain z-score (baseline detector).
    ZScore,
}

/// One feature's anomaly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Signal {
    /// The feature.
    pub feature: String,
    /// Its direction.
    pub dir: Dir,
    /// How anomalous (z-score, CUSUM sum, or the value for hard rules).
    pub score: f64,
    /// The rule.
    pub rule: Rule,
}

/// An alarm: the step and the signals that raised it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alarm {
    /// The step.
    pub step: usize,
    /// The anomalous features, strongest first.
    pub signals: Vec<Signal>,
    /// The robust z-score of every watched feature with a baseline at this step, under the
    /// threshold or not: sub-threshold evidence for the diagnosis (a length that fell by 4.5
    /// sigma while the truncation rule fired). Empty for the baseline detectors.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub context: BTreeMap<String, f64>,
}

impl Alarm {
    /// An alarm of `signals` at `step` without sub-threshold context.
    pub fn new(step: usize, signals: Vec<Signal>) -> Self {
        Self {
            step,
            signals,
            context: BTreeMap::new(),
        }
    }

    /// The signal of `feature` in direction `dir`, if any.
    pub fn has(&self, feature: &str, dir: Dir) -> bool {
        self.signals
            .iter()
            .any(|s| s.feature == feature && s.dir == dir)
    }

    /// Whether `feature` moved in direction `dir` by more than `min_z` robust z units at this
    /// step (sub-threshold included), or raised a signal that way.
    pub fn leans(&self, feature: &str, dir: Dir, min_z: f64) -> bool {
        let z = self.context.get(feature).copied().unwrap_or(0.0);
        let zd = if dir == Dir::Up { z } else { -z };
        zd > min_z || self.has(feature, dir)
    }
}

/// An online detector: sees one step at a time, never the future.
pub trait Detector {
    /// A short name (tables).
    fn name(&self) -> &'static str;
    /// Reads the next step; an alarm when it is anomalous.
    fn observe(&mut self, r: &StepRecord) -> Option<Alarm>;
}

/// How a feature is watched: its noise floors and the directions that matter.
#[derive(Clone, Copy, Debug)]
pub struct Watch {
    /// The feature.
    pub name: &'static str,
    /// Smallest scale (absolute).
    pub abs_floor: f64,
    /// Smallest scale relative to the baseline's magnitude.
    pub rel_floor: f64,
    /// Rises matter.
    pub up: bool,
    /// Falls matter.
    pub down: bool,
    /// Judged on the log scale (multiplicative, heavy-tailed features such as the largest
    /// ratio of a step); the floors are then in natural-log units.
    pub log: bool,
    /// With `log`, the judged value is `ln(max(x, 0) + shift)` when `shift > 0`: for features
    /// that start at 0 and grow (KL to the reference), so that steady growth is judged as a
    /// ratio and a value near 0 is not `-inf`.
    pub shift: f64,
    /// A CUSUM watches it for drifts (off: only jumps beyond the z threshold alarm).
    pub drift: bool,
}

const fn w(name: &'static str, abs_floor: f64, rel_floor: f64, up: bool, down: bool) -> Watch {
    Watch {
        name,
        abs_floor,
        rel_floor,
        up,
        down,
        log: false,
        shift: 0.0,
        drift: true,
    }
}

/// A feature judged on the log scale (see [`Watch::log`]).
const fn wlog(name: &'static str, abs_floor: f64, up: bool, down: bool) -> Watch {
    Watch {
        name,
        abs_floor,
        rel_floor: 0.0,
        up,
        down,
        log: true,
        shift: 0.0,
        drift: true,
    }
}

/// A feature judged by its jumps only, without a CUSUM (see [`Watch::drift`]).
const fn jumps_only(wch: Watch) -> Watch {
    Watch {
        drift: false,
        ..wch
    }
}

/// A feature that starts at 0 and grows judged as `ln(max(x, 0) + shift)` (see [`Watch::shift`]).
const fn wlog_shift(name: &'static str, abs_floor: f64, shift: f64, up: bool) -> Watch {
    Watch {
        shift,
        ..wlog(name, abs_floor, up, false)
    }
}

impl Watch {
    /// The value the detector judges: `x`, or `ln x` on the log scale (`None` for `x <= 0`).
    pub fn judged(&self, x: f64) -> Option<f64> {
        if !x.is_finite() {
            None
        } else if self.log && self.shift > 0.0 {
            Some((x.max(0.0) + self.shift).ln())
        } else if self.log {
            (x > 0.0).then(|| x.ln())
        } else {
            Some(x)
        }
    }
}

/// Features computed by the update (from its ratios, gradients and the updated sequences'
/// log-probabilities). A step that updated nothing (every group tied) has no values for them;
/// its `entropy` is the rollouts' mean surprisal, another estimate, judged as `surprisal`.
pub const UPDATE_FEATURES: &[&str] = &[
    "kl",
    "kl_k3",
    "clip_frac",
    "max_ratio",
    "approx_kl",
    "grad_norm",
    "adv_std",
    "adv_reward_corr",
    "logprob_mismatch",
];

/// The record as RFT-FM judges it: on a step that updated no sequence (`trained_sequences`
/// recorded as 0), the update's features are dropped and `entropy` becomes `surprisal`; on a
/// step whose every group tied (`zero_std_frac` 1: no advantage), the gradient norm measures
/// only the entropy and KL terms, a regime 10-100x below the others, and the advantages'
/// correlation with the rewards is undefined (recorded as 0): both are dropped. Where the
/// record has `prompt_dup_chance`, `prompt_unique_frac` is left to the chance rule (a batch of
/// two prompts drawn from a dozen repeats one in 1 step of 12 by chance).
pub fn judged_record(r: &StepRecord) -> std::borrow::Cow<'_, StepRecord> {
    let tied = r.get("zero_std_frac") == Some(1.0);
    let untrained = r.get("trained_sequences") == Some(0.0);
    let by_chance = r.get("prompt_dup_chance").is_some();
    let drops: &[&str] = match (untrained, tied) {
        (true, _) => UPDATE_FEATURES,
        // No advantage: the gradient norm is another regime and the correlation undefined.
        (false, true) => &["grad_norm", "adv_reward_corr"],
        (false, false) => &[],
    };
    let touched = drops.iter().any(|f| r.values.contains_key(*f))
        || (by_chance && r.values.contains_key("prompt_unique_frac"));
    if !touched {
        return std::borrow::Cow::Borrowed(r);
    }
    let mut out = r.clone();
    for f in drops {
        out.values.remove(*f);
    }
    // Repeated prompts are judged by their chance under uniform draws where it is recorded.
    if by_chance {
        out.values.remove("prompt_unique_frac");
    }
    if untrained {
        if let Some(e) = out.values.remove("entropy") {
            out.values.insert("surprisal".into(), e);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The features RFT-FM watches, with noise floors set for batches of a few to a few dozen
/// responses: the mean and spread of a handful of 0/1-ish rewards move by 0.25 between healthy
/// steps, the gradient norm by a factor of e; the entropy is judged on the log scale (a collapse
/// is a fall by a factor; a healthy run at lr 1e-3 with an entropy bonus can triple it in five
/// steps, hence the floor 0.35); all 4 responses of two long prompts can hit the token budget
/// in a healthy step, so one such step is 5 sigma of truncation, not more, and it takes a
/// second (the CUSUM) to alarm. KL to the reference
/// grows steadily from 0 in a healthy run (roughly by 0.1 a step at lr 1e-3), so it is judged on
/// the log scale, shifted by 0.05: a doubling is ordinary, a tenfold jump is not. The gradient
/// norm drifts in a healthy run as the policy moves (a CUSUM on it alarmed on a clean tuning run
/// of the 8-step faultbench, and its one other catch, a hard empty-outputs run, drifted the same
/// way as that run's clean twin), so only its jumps count.
pub const WATCHED: &[Watch] = &[
    w("reward_mean", 0.25, 0.0, true, true),
    w("reward_std", 0.25, 0.0, true, true),
    w("zero_std_frac", 0.3, 0.0, true, false),
    w("prompt_unique_frac", 0.1, 0.0, false, true),
    wlog("entropy", 0.35, true, true),
    wlog("surprisal", 0.25, true, true),
    wlog_shift("kl", 0.7, KL_SHIFT, true),
    wlog_shift("kl_k3", 0.7, KL_SHIFT, true),
    w("clip_frac", 0.05, 0.5, true, true),
    wlog("max_ratio", 0.5, true, false),
    w("approx_kl", 0.02, 0.5, true, false),
    w("logprob_mismatch", 0.02, 0.5, true, false),
    jumps_only(wlog("grad_norm", 1.0, true, true)),
    w("response_len", 1.0, 0.2, true, true),
    w("trunc_rate", 0.2, 0.0, true, false),
    w("repetition", 0.1, 0.0, true, false),
    w("unique_ratio", 0.1, 0.0, false, true),
    w("empty_rate", 0.15, 0.0, true, false),
    w("format_error_rate", 0.2, 0.0, true, false),
    w("invented_rate", 0.2, 0.0, true, false),
    w("adv_std", 0.2, 0.3, true, true),
    w("adv_reward_corr", 0.25, 0.0, false, true),
    w("sandbox_error_rate", 0.05, 0.0, true, false),
    w("timeout_rate", 0.05, 0.0, true, false),
];

/// The shift of the KL features' log scale (see [`Watch::shift`]).
pub const KL_SHIFT: f64 = 0.05;

/// How the audited rewards disagree (read by the diagnosis; see
/// [`super::features::RewardAudit`]).
pub const AUDIT_PATTERN: &[&str] = &["audit_up", "audit_down", "audit_offgrid", "audit_permuted"];

/// Settings read by the hard rules: they jump rather than drift.
pub const SETTINGS: &[&str] = &["lr", "kl_coef", "clip_eps", "temperature"];

/// Tunables of [`RobustDetector`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RobustConfig {
    /// Healthy steps needed before z-scores count.
    pub warmup: usize,
    /// Healthy steps in the rolling baseline.
    pub window: usize,
    /// |z| beyond this alarms at once.
    pub z_threshold: f64,
    /// CUSUM allowance (z units per step that do not accumulate).
    pub cusum_k: f64,
    /// CUSUM limit.
    pub cusum_h: f64,
    /// The range rewards must stay in, when known (`None`: not checked).
    pub reward_range: Option<(f64, f64)>,
    /// A setting changing by more than this factor in one step is a fault.
    pub setting_jump: f64,
    /// Sandbox error or timeout rate that alarms regardless of baseline.
    pub sandbox_limit: f64,
    /// Consecutive steps whose every reward is 0, after healthy steps whose rewards had spread,
    /// that mean a silent scorer (a missing test runner, a reward service answering 0); 0: off.
    pub silent_steps: usize,
    /// Share of identical answers to one prompt scored differently above which the scorer is
    /// judged flaky (`answer_disagree`; a deterministic scorer gives 0); negative: off.
    pub disagree_limit: f64,
    /// Mean gap between the rewards and their audit (`audit_gap`; 0 in a healthy step) above
    /// which the reward path is judged faulty; negative: off.
    pub audit_limit: f64,
    /// Chance under uniform draws of a run of batches repeating prompts this much
    /// (`prompt_dup_chance` multiplied over consecutive steps with repeats) below which the
    /// prompts are judged duplicated; 0: off.
    pub dup_alpha: f64,
}

impl Default for RobustConfig {
    fn default() -> Self {
        Self {
            warmup: 3,
            window: 8,
            z_threshold: 5.0,
            cusum_k: 3.0,
            cusum_h: 3.0,
            reward_range: None,
            setting_jump: 2.0,
            sandbox_limit: 0.25,
            silent_steps: 3,
            disagree_limit: 0.0,
            audit_limit: 1e-6,
            dup_alpha: 1e-3,
        }
    }
}

/// RFT-FM's detector (see the module doc).
#[derive(Clone, Debug)]
pub struct RobustDetector {
    /// Its settings.
    pub cfg: RobustConfig,
    history: BTreeMap<&'static str, VecDeque<f64>>,
    cusum: BTreeMap<(&'static str, bool), f64>,
    settings: BTreeMap<&'static str, f64>,
    /// A healthy step's rewards had spread (so a scorer that answers 0 to all is news).
    spread_seen: bool,
    /// Consecutive steps whose every reward was 0.
    zero_run: usize,
    /// Steps with rewards seen so far, and how many of them had every reward 0 (the chance of
    /// an all-zero step of this run, for the silent-scorer rule).
    scored: usize,
    /// See `scored`.
    zeros: usize,
    /// Product of `prompt_dup_chance` over the current run of steps that repeated prompts.
    dup_run: f64,
    /// The z-scores of the current step (see [`Alarm::context`]).
    context: BTreeMap<String, f64>,
}

/// Chance, under the run's own rate of all-zero steps, below which a run of all-zero steps is
/// judged a silent scorer rather than bad luck.
const SILENT_ALPHA: f64 = 0.01;

/// Reward spread (standard deviation) of a healthy step that shows the scorer discriminates.
const SPREAD: f64 = 0.05;

/// A z-score or CUSUM sum must exceed its limit by more than this to alarm. Rate features move
/// in whole responses (k of n), and a noise floor can put one such move exactly on the limit
/// (3 truncated responses of 4 over the floor 0.15 is 5.0 sigma): whether it alarms must not be
/// decided by the rounding of `0.75 / 0.15` to `5.000000000000001`.
pub const LIMIT_TIE: f64 = 1e-9;

/// Correlation between a step's per-sequence advantages and rewards below which the advantages
/// have the wrong sign. With advantages baselined within each group (GRPO, RLOO) the covariance
/// is a sum of within-group covariances, each >= 0 (the between-group term vanishes because
/// every group's advantages sum to 0), so a clearly negative correlation is a sign bug, not
/// noise; a step whose groups all tied has correlation 0.
pub const ADV_ANTI_CORR: f64 = -0.25;

/// Chance of `run` all-zero steps in a row for a run that had `zeros` of them in `before` steps:
/// the posterior predictive under a uniform prior on the rate (`prod_i (zeros + 1 + i) /
/// (before + 2 + i)`), not the plug-in rate, which after three healthy steps of a small batch
/// is far too sure that zeros are rare.
pub fn silent_run_chance(zeros: usize, before: usize, run: usize) -> f64 {
    (0..run)
        .map(|i| (zeros + 1 + i) as f64 / (before + 2 + i) as f64)
        .product()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Median and MAD-based scale (1.4826 MAD) of a window.
pub fn median_scale(values: &VecDeque<f64>) -> (f64, f64) {
    let mut v: Vec<f64> = values.iter().copied().collect();
    let m = median(&mut v);
    let mut dev: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
    (m, 1.4826 * median(&mut dev))
}

fn sort_signals(s: &mut [Signal]) {
    s.sort_by(|a, b| b.score.abs().total_cmp(&a.score.abs()));
}

impl RobustDetector {
    /// A detector with settings `cfg`.
    pub fn new(cfg: RobustConfig) -> Self {
        Self {
            cfg,
            history: BTreeMap::new(),
            cusum: BTreeMap::new(),
            settings: BTreeMap::new(),
            spread_seen: false,
            zero_run: 0,
            scored: 0,
            zeros: 0,
            dup_run: 1.0,
            context: BTreeMap::new(),
        }
    }

    /// Forgets the baselines (after a remediation changed the run).
    pub fn reset(&mut self) {
        self.history.clear();
        self.cusum.clear();
        self.settings.clear();
        self.spread_seen = false;
        self.zero_run = 0;
        self.scored = 0;
        self.zeros = 0;
        self.dup_run = 1.0;
        self.context.clear();
    }

    /// The silent-scorer rule: every reward 0 for `silent_steps` steps in a row after a healthy
    /// step with reward spread, and for long enough that the run's own history of all-zero
    /// steps makes such a run less likely than [`SILENT_ALPHA`] ([`silent_run_chance`]): a
    /// policy that often scores nothing on a small batch is not a silent scorer after three
    /// zeros, nor is a run that has seen only three healthy steps.
    /// Counts the run of all-zero steps.
    fn silent_scorer(&mut self, r: &StepRecord, out: &mut Vec<Signal>) {
        let zero = |k: &str| r.get(k).is_some_and(|x| x.abs() < 1e-12);
        if zero("reward_min") && zero("reward_max") {
            self.zero_run += 1;
            self.scored += 1;
            self.zeros += 1;
        } else if r.get("reward_max").is_some() {
            self.zero_run = 0;
            self.scored += 1;
        }
        let n = self.cfg.silent_steps;
        if n == 0 || !self.spread_seen {
            return;
        }
        // The steps before the current run of all-zero steps, and how many of them were too.
        let before = self.scored.saturating_sub(self.zero_run);
        let zeros_before = self.zeros.saturating_sub(self.zero_run);
        if self.zero_run >= n
            && silent_run_chance(zeros_before, before, self.zero_run) < SILENT_ALPHA
        {
            out.push(Signal {
                feature: "scorer_silent".into(),
                dir: Dir::Up,
                score: self.zero_run as f64,
                rule: Rule::Hard,
            });
        }
    }

    /// The duplicated-prompts rule: the chance of the current run of batches that repeated
    /// prompts, under uniform draws, below `dup_alpha`; an alarm starts a new run.
    fn duplicate_run(&mut self, r: &StepRecord, out: &mut Vec<Signal>) {
        let Some(c) = r.get("prompt_dup_chance") else {
            return;
        };
        self.dup_run = if c < 1.0 - 1e-12 {
            self.dup_run * c.max(0.0)
        } else {
            1.0
        };
        if self.dup_run < self.cfg.dup_alpha {
            out.push(Signal {
                feature: "prompt_dup_chance".into(),
                dir: Dir::Down,
                score: self.dup_run,
                rule: Rule::Hard,
            });
            // The run is reported: later steps (after a quarantine, say) build their own case.
            self.dup_run = 1.0;
        }
    }

    /// The reward-audit rule: rewards that differ from the rule score of their own answer.
    fn audit(&self, r: &StepRecord, out: &mut Vec<Signal>) {
        if self.cfg.audit_limit < 0.0 {
            return;
        }
        let Some(gap) = r.get("audit_gap").filter(|x| *x > self.cfg.audit_limit) else {
            return;
        };
        let sig = |feature: &str, score| Signal {
            feature: feature.to_string(),
            dir: Dir::Up,
            score,
            rule: Rule::Hard,
        };
        out.push(sig("audit_gap", gap));
        for f in AUDIT_PATTERN {
            if let Some(x) = r.get(f).filter(|x| *x > 0.0) {
                out.push(sig(f, x));
            }
        }
    }

    fn hard_rules(&self, r: &StepRecord, out: &mut Vec<Signal>) {
        let hard = |feature: &str, dir, score| Signal {
            feature: feature.to_string(),
            dir,
            score,
            rule: Rule::Hard,
        };
        let bad = r.values.iter().filter(|(_, v)| !v.is_finite()).count() as f64
            + r.get("nonfinite").unwrap_or(0.0);
        if bad > 0.0 {
            out.push(hard("nonfinite", Dir::Up, bad));
        }
        if let Some((lo, hi)) = self.cfg.reward_range {
            let tol = 1e-6 * (hi - lo).abs().max(1.0);
            if let Some(x) = r.get("reward_min").filter(|x| *x < lo - tol) {
                out.push(hard("reward_min", Dir::Down, x));
            }
            if let Some(x) = r.get("reward_max").filter(|x| *x > hi + tol) {
                out.push(hard("reward_max", Dir::Up, x));
            }
        }
        for name in SETTINGS {
            if let (Some(prev), Some(x)) = (self.settings.get(name), r.get(name)) {
                let j = self.cfg.setting_jump;
                if *prev > 0.0 && (x > prev * j || x < prev / j) {
                    let dir = if x > *prev { Dir::Up } else { Dir::Down };
                    out.push(hard(name, dir, x));
                }
            }
        }
        // A batch of at least four prompts that are all one (or 8 with two distinct): a data fault
        // (chance for 4 uniform draws from N prompts: 1/N^3).
        if let Some(x) = r.get("prompt_unique_frac").filter(|x| *x <= 0.25) {
            out.push(hard("prompt_unique_frac", Dir::Down, x));
        }
        if let Some(x) = r.get("adv_reward_corr").filter(|x| *x < ADV_ANTI_CORR) {
            out.push(hard("adv_reward_corr", Dir::Down, x));
        }
        for name in ["sandbox_error_rate", "timeout_rate"] {
            if let Some(x) = r.get(name).filter(|x| *x >= self.cfg.sandbox_limit) {
                out.push(hard(name, Dir::Up, x));
            }
        }
        if self.cfg.disagree_limit >= 0.0 {
            if let Some(x) = r
                .get("answer_disagree")
                .filter(|x| *x > self.cfg.disagree_limit)
            {
                out.push(hard("answer_disagree", Dir::Up, x));
            }
        }
    }

    /// Z-scores and CUSUMs; returns the features whose value looked suspicious (|z| beyond the
    /// CUSUM allowance), which stay out of the baseline.
    fn statistical(&mut self, r: &StepRecord, out: &mut Vec<Signal>) -> Vec<&'static str> {
        let mut suspicious = Vec::new();
        self.context.clear();
        for wch in WATCHED {
            let Some(x) = r.get(wch.name).and_then(|x| wch.judged(x)) else {
                continue;
            };
            let Some(h) = self
                .history
                .get(wch.name)
                .filter(|h| h.len() >= self.cfg.warmup)
            else {
                continue;
            };
            let (m, s) = median_scale(h);
            let scale = s.max(wch.abs_floor).max(wch.rel_floor * m.abs());
            let z = (x - m) / scale;
            self.context.insert(wch.name.to_string(), z);
            if z.abs() > self.cfg.cusum_k {
                suspicious.push(wch.name);
            }
            for (up, on) in [(true, wch.up), (false, wch.down)] {
                if !on {
                    continue;
                }
                let zd = if up { z } else { -z };
                let dir = if up { Dir::Up } else { Dir::Down };
                // A jump the z-score flags adds at most the z threshold to the drift sum, so
                // one spike does not keep the CUSUM alarming for the steps after it.
                let c = if wch.drift {
                    let c = self.cusum.entry((wch.name, up)).or_insert(0.0);
                    *c = (*c + zd.min(self.cfg.z_threshold) - self.cfg.cusum_k).max(0.0);
                    *c
                } else {
                    0.0
                };
                if zd > self.cfg.z_threshold + LIMIT_TIE {
                    out.push(Signal {
                        feature: wch.name.to_string(),
                        dir,
                        score: zd,
                        rule: Rule::RobustZ,
                    });
                } else if c > self.cfg.cusum_h + LIMIT_TIE {
                    out.push(Signal {
                        feature: wch.name.to_string(),
                        dir,
                        score: c,
                        rule: Rule::Cusum,
                    });
                }
            }
        }
        suspicious
    }

    fn accept(&mut self, r: &StepRecord, suspicious: &[&'static str]) {
        for wch in WATCHED {
            if suspicious.contains(&wch.name) {
                continue;
            }
            if let Some(x) = r.get(wch.name).and_then(|x| wch.judged(x)) {
                let h = self.history.entry(wch.name).or_default();
                h.push_back(x);
                while h.len() > self.cfg.window.max(1) {
                    h.pop_front();
                }
            }
        }
        for name in SETTINGS {
            if let Some(x) = r.get(name).filter(|x| x.is_finite()) {
                self.settings.insert(name, x);
            }
        }
    }
}

/// The state of a [`RobustDetector`] (baselines, CUSUM sums, last settings), as saved with a
/// checkpoint. Values are stored as their IEEE bits so that a resumed detector is exact.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DetectorState {
    /// Feature -> healthy values of the rolling baseline, oldest first.
    pub history: BTreeMap<String, Vec<u64>>,
    /// (feature, upward) -> CUSUM sum.
    pub cusum: Vec<(String, bool, u64)>,
    /// Setting -> last healthy value.
    pub settings: BTreeMap<String, u64>,
    /// A healthy step's rewards had spread.
    pub spread_seen: bool,
    /// Consecutive steps whose every reward was 0.
    pub zero_run: usize,
    /// Steps with rewards seen.
    #[serde(default)]
    pub scored: usize,
    /// Of them, steps whose every reward was 0.
    #[serde(default)]
    pub zeros: usize,
    /// Bits of the chance of the current run of batches that repeated prompts (absent: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dup_run: Option<u64>,
}

fn watched_name(name: &str) -> anyhow::Result<&'static str> {
    WATCHED
        .iter()
        .map(|w| w.name)
        .chain(SETTINGS.iter().copied())
        .find(|n| *n == name)
        .ok_or_else(|| anyhow::anyhow!("monitor state: unknown feature {name:?}"))
}

impl RobustDetector {
    /// Its state (see [`DetectorState`]).
    pub fn state(&self) -> DetectorState {
        DetectorState {
            history: self
                .history
                .iter()
                .map(|(k, h)| (k.to_string(), h.iter().map(|x| x.to_bits()).collect()))
                .collect(),
            cusum: self
                .cusum
                .iter()
                .map(|((k, up), c)| (k.to_string(), *up, c.to_bits()))
                .collect(),
            settings: self
                .settings
                .iter()
                .map(|(k, x)| (k.to_string(), x.to_bits()))
                .collect(),
            spread_seen: self.spread_seen,
            zero_run: self.zero_run,
            scored: self.scored,
            zeros: self.zeros,
            dup_run: (self.dup_run != 1.0).then(|| self.dup_run.to_bits()),
        }
    }

    /// Restores a state saved by [`RobustDetector::state`] (its settings stay).
    pub fn restore(&mut self, s: &DetectorState) -> anyhow::Result<()> {
        self.reset();
        for (k, h) in &s.history {
            let h = h.iter().map(|b| f64::from_bits(*b)).collect();
            self.history.insert(watched_name(k)?, h);
        }
        for (k, up, c) in &s.cusum {
            self.cusum
                .insert((watched_name(k)?, *up), f64::from_bits(*c));
        }
        for (k, x) in &s.settings {
            self.settings.insert(watched_name(k)?, f64::from_bits(*x));
        }
        self.spread_seen = s.spread_seen;
        self.zero_run = s.zero_run;
        self.scored = s.scored;
        self.zeros = s.zeros;
        self.dup_run = s.dup_run.map_or(1.0, f64::from_bits);
        Ok(())
    }
}

impl Detector for RobustDetector {
    fn name(&self) -> &'static str {
        "rft-fm"
    }

    fn observe(&mut self, r: &StepRecord) -> Option<Alarm> {
        let r = &*judged_record(r);
        let mut signals = Vec::new();
        self.hard_rules(r, &mut signals);
        self.audit(r, &mut signals);
        self.duplicate_run(r, &mut signals);
        self.silent_scorer(r, &mut signals);
        let suspicious = self.statistical(r, &mut signals);
        if signals.is_empty() {
            if r.get("reward_std").is_some_and(|x| x > SPREAD) {
                self.spread_seen = true;
            }
            // Only healthy steps feed the baseline: a fault never becomes the new normal.
            self.accept(r, &suspicious);
            return None;
        }
        sort_signals(&mut signals);
        Some(Alarm {
            step: r.step,
            signals,
            context: self.context.clone(),
        })
    }
}

/// Baseline: fixed per-metric bounds (for example the range of clean runs widened by a margin).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StaticDetector {
    /// Feature -> (low, high) bounds.
    pub bounds: BTreeMap<String, (f64, f64)>,
}

/// The features the baseline detectors watch: RFT-FM's watched ones and the reward audit's
/// gap (so that the audit's evidence is not RFT-FM's alone in the benchmark's table).
pub fn baseline_features() -> impl Iterator<Item = &'static str> {
    WATCHED.iter().map(|w| w.name).chain(["audit_gap"])
}

impl StaticDetector {
    /// Bounds from the range of each watched feature over `clean` records, widened by `margin`
    /// times the range (plus a small absolute slack).
    pub fn fit(clean: &[StepRecord], margin: f64) -> Self {
        let mut bounds = BTreeMap::new();
        for name in baseline_features() {
            let v: Vec<f64> = clean
                .iter()
                .filter_map(|r| r.get(name))
                .filter(|x| x.is_finite())
                .collect();
            if v.is_empty() {
                continue;
            }
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let pad = margin * (hi - lo) + 1e-9;
            bounds.insert(name.to_string(), (lo - pad, hi + pad));
        }
        Self { bounds }
    }
}

impl Detector for StaticDetector {
    fn name(&self) -> &'static str {
        "static-threshold"
    }

    fn observe(&mut self, r: &StepRecord) -> Option<Alarm> {
        let mut signals = Vec::new();
        for (k, &(lo, hi)) in &self.bounds {
            let Some(x) = r.get(k) else { continue };
            let (dir, score) = if !x.is_finite() || x > hi {
                (Dir::Up, x)
            } else if x < lo {
                (Dir::Down, x)
            } else {
                continue;
            };
            signals.push(Signal {
                feature: k.clone(),
                dir,
                score,
                rule: Rule::Static,
            });
        }
        (!signals.is_empty()).then(|| Alarm::new(r.step, signals))
    }
}

/// Baseline: plain z-score of each watched feature against the mean and standard deviation of
/// all earlier steps (after a warm-up).
#[derive(Clone, Debug)]
pub struct ZScoreDetector {
    /// |z| that alarms.
    pub threshold: f64,
    /// Steps before z-scores count.
    pub warmup: usize,
    seen: BTreeMap<&'static str, Vec<f64>>,
}

impl ZScoreDetector {
    /// A z-score detector.
    pub fn new(threshold: f64, warmup: usize) -> Self {
        Self {
            threshold,
            warmup,
            seen: BTreeMap::new(),
        }
    }
}

impl Detector for ZScoreDetector {
    fn name(&self) -> &'static str {
        "z-score"
    }

    fn observe(&mut self, r: &StepRecord) -> Option<Alarm> {
        let mut signals = Vec::new();
        for name in baseline_features() {
            let Some(x) = r.get(name) else { continue };
            let h = self.seen.entry(name).or_default();
            if h.len() >= self.warmup.max(2) {
                let m = h.iter().sum::<f64>() / h.len() as f64;
                let sd = (h.iter().map(|v| (v - m).powi(2)).sum::<f64>() / h.len() as f64).sqrt();
                let z = if !x.is_finite() {
                    f64::INFINITY
                } else if sd > 1e-12 {
                    (x - m) / sd
                } else if (x - m).abs() > 1e-12 {
                    f64::INFINITY * (x - m).signum()
                } else {
                    0.0
                };
                if z.abs() > self.threshold {
                    signals.push(Signal {
                        feature: name.to_string(),
                        dir: if z > 0.0 { Dir::Up } else { Dir::Down },
                        score: z,
                        rule: Rule::ZScore,
                    });
                }
            }
            if x.is_finite() {
                h.push(x);
            }
        }
        sort_signals(&mut signals);
        (!signals.is_empty()).then(|| Alarm::new(r.step, signals))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(step: usize, kv: &[(&str, f64)]) -> StepRecord {
        StepRecord {
            step,
            values: kv.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    fn noisy_reward(step: usize) -> f64 {
        // Deterministic small-batch noise around 0.4.
        0.4 + 0.06 * ((step * 7919 % 13) as f64 / 13.0 - 0.5)
    }

    #[test]
    fn a_noisy_clean_series_raises_no_alarm() {
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=60 {
            let r = rec(
                s,
                &[
                    ("reward_mean", noisy_reward(s)),
                    ("entropy", 2.0),
                    ("lr", 1e-4),
                ],
            );
            assert!(d.observe(&r).is_none(), "step {s}");
        }
    }

    #[test]
    fn hard_rules_fire_without_warm_up() {
        let mut d = RobustDetector::new(RobustConfig {
            reward_range: Some((0.0, 1.0)),
            ..RobustConfig::default()
        });
        let a = d.observe(&rec(1, &[("nonfinite", 2.0)])).unwrap();
        assert!(a.has("nonfinite", Dir::Up));
        let a = d.observe(&rec(2, &[("kl", f64::NAN)])).unwrap();
        assert!(a.has("nonfinite", Dir::Up));
        let a = d.observe(&rec(3, &[("reward_min", -0.5)])).unwrap();
        assert!(a.has("reward_min", Dir::Down));
        let a = d.observe(&rec(4, &[("reward_max", 40.0)])).unwrap();
        assert!(a.has("reward_max", Dir::Up));
        let a = d.observe(&rec(5, &[("prompt_unique_frac", 0.25)])).unwrap();
        assert!(a.has("prompt_unique_frac", Dir::Down));
        let a = d.observe(&rec(5, &[("sandbox_error_rate", 0.5)])).unwrap();
        assert!(a.has("sandbox_error_rate", Dir::Up));
        let a = d.observe(&rec(5, &[("timeout_rate", 0.25)])).unwrap();
        assert!(a.has("timeout_rate", Dir::Up));
        // Under the limits: nothing.
        assert!(d
            .observe(&rec(5, &[("timeout_rate", 0.2), ("reward_max", 1.0)]))
            .is_none());
        for (k, hi) in [("kl_coef", 5.0), ("clip_eps", 10.0), ("temperature", 0.1)] {
            assert!(d.observe(&rec(5, &[(k, 0.5)])).is_none(), "{k}");
            let a = d.observe(&rec(6, &[(k, hi)])).unwrap();
            let dir = if hi > 0.5 { Dir::Up } else { Dir::Down };
            assert!(a.has(k, dir), "{k}: {a:?}");
        }
        assert!(d.observe(&rec(6, &[("lr", 1e-4)])).is_none());
        let a = d.observe(&rec(7, &[("lr", 1e-2)])).unwrap();
        assert!(a.has("lr", Dir::Up));
        let a = d.observe(&rec(8, &[("lr", 0.0)])).unwrap();
        assert!(a.has("lr", Dir::Down));
    }

    /// A healthy step of a run whose scorer discriminates: rewards with spread.
    fn scored(step: usize) -> StepRecord {
        let m = noisy_reward(step);
        rec(
            step,
            &[
                ("reward_mean", m),
                ("reward_std", 0.3),
                ("reward_min", 0.0),
                ("reward_max", 1.0),
                ("zero_std_frac", 0.2),
                ("entropy", 2.0 + 0.05 * (m - 0.4)),
            ],
        )
    }

    /// A step of a silent scorer (every reward 0).
    fn silent(step: usize) -> StepRecord {
        rec(
            step,
            &[
                ("reward_mean", 0.0),
                ("reward_std", 0.0),
                ("reward_min", 0.0),
                ("reward_max", 0.0),
                ("zero_std_frac", 1.0),
                ("entropy", 2.0),
            ],
        )
    }

    #[test]
    fn a_silent_scorer_is_caught_late_in_a_run_and_zero_rewards_from_the_start_are_not() {
        // The planted fault: from step 41 the scorer answers 0 to everything.
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=40 {
            assert!(d.observe(&scored(s)).is_none(), "false alarm at {s}");
        }
        let first = (41..=50)
            .find_map(|s| d.observe(&silent(s)))
            .expect("the silent scorer was caught");
        assert_eq!(first.step, 43, "{first:?}");
        assert!(first.has("scorer_silent", Dir::Up), "{first:?}");
        let dg = super::super::diagnose::diagnose(&first);
        assert_eq!(
            dg.fault,
            Some(super::super::taxonomy::FaultType::SandboxFailure)
        );
        // One all-zero step between scored ones is no fault.
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=30 {
            let r = if s % 7 == 0 { silent(s) } else { scored(s) };
            assert!(d.observe(&r).is_none(), "false alarm at {s}");
        }
        // A policy that never earned a reward (a fresh model): zeros are its normal, not news.
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=30 {
            assert!(d.observe(&silent(s)).is_none(), "false alarm at {s}");
        }
        // The rule off: the same late fault goes unseen by it.
        let mut d = RobustDetector::new(RobustConfig {
            silent_steps: 0,
            ..RobustConfig::default()
        });
        for s in 1..=40 {
            assert!(d.observe(&scored(s)).is_none());
        }
        assert!(!(41..=43).any(|s| d
            .observe(&silent(s))
            .is_some_and(|a| a.has("scorer_silent", Dir::Up))));
    }

    #[test]
    fn a_short_healthy_history_needs_a_longer_run_of_zeros() {
        // After 3 healthy steps, 3 zeros in a row have a predictive chance of 1/5 * 2/6 * 3/7
        // (2.9 %): not yet a silent scorer; the 5th (0.8 %) is. The plug-in rate 1/5 would have
        // alarmed at the 3rd (0.8 %).
        assert!((silent_run_chance(0, 3, 3) - 1.0 / 35.0).abs() < 1e-12);
        assert!(silent_run_chance(0, 3, 4) > SILENT_ALPHA);
        assert!(silent_run_chance(0, 3, 5) < SILENT_ALPHA);
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=3 {
            assert!(d.observe(&scored(s)).is_none(), "false alarm at {s}");
        }
        let first = (4..=12)
            .find_map(|s| {
                d.observe(&silent(s))
                    .filter(|a| a.has("scorer_silent", Dir::Up))
            })
            .expect("the silent scorer was caught");
        assert_eq!(first.step, 8, "{first:?}");
    }

    #[test]
    fn the_gradient_norm_alarms_on_a_jump_not_on_a_drift() {
        // Steps whose groups tied have tiny gradients; once rewards spread, the norm sits ~60x
        // higher (ln 60 = 4.1 sigma on the log floor 1): a drift a CUSUM would add up to an
        // alarm after two steps, and an ordinary run of a policy that starts to earn rewards.
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=4 {
            assert!(d.observe(&rec(s, &[("grad_norm", 0.01)])).is_none());
        }
        for s in 5..=9 {
            let a = d.observe(&rec(s, &[("grad_norm", 0.6)]));
            assert!(a.is_none(), "drift alarmed at {s}: {a:?}");
        }
        // The planted fault: a 1000x spike.
        let a = d
            .observe(&rec(10, &[("grad_norm", 10.0)]))
            .expect("the spike alarms");
        assert!(a.has("grad_norm", Dir::Up), "{a:?}");
        // Another drifting feature still adds up (the CUSUM is off for the gradient norm only).
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=4 {
            assert!(d.observe(&rec(s, &[("response_len", 50.0)])).is_none());
        }
        let drift = (5..=9).find_map(|s| d.observe(&rec(s, &[("response_len", 90.0)])));
        assert!(drift.is_some_and(|a| a.has("response_len", Dir::Up)));
    }

    #[test]
    fn tied_steps_gradients_stay_out_of_the_gradient_norm_baseline() {
        // Tied steps (every group's rewards equal) have only the entropy and KL gradients.
        let step = |s: usize, tied: bool, g: f64| {
            rec(
                s,
                &[
                    ("grad_norm", g),
                    ("zero_std_frac", if tied { 1.0 } else { 0.5 }),
                    ("trained_sequences", 4.0),
                ],
            )
        };
        // A policy that starts to earn rewards: tied steps first, spread steps among them.
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=8 {
            let tied = !(4..=6).contains(&s);
            let a = d.observe(&step(s, tied, if tied { 0.01 } else { 0.5 }));
            assert!(a.is_none(), "{s}: {a:?}");
        }
        // 10x a spread step's norm: ordinary against spread steps (ln 10 = 2.3 sigma), 500x
        // (6.2 sigma) against a baseline of the tied ones.
        assert!(d.observe(&step(9, false, 5.0)).is_none());
        // The planted fault: a 1000x spike still alarms.
        let a = d
            .observe(&step(10, false, 500.0))
            .expect("the spike alarms");
        assert!(a.has("grad_norm", Dir::Up), "{a:?}");
    }

    #[test]
    fn one_step_all_at_the_token_budget_is_not_a_fault_and_two_are() {
        let step = |s: usize, t: f64| rec(s, &[("trunc_rate", t)]);
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=4 {
            assert!(d.observe(&step(s, 0.0)).is_none());
        }
        assert!(d.observe(&step(5, 1.0)).is_none(), "one step alarmed");
        assert!(d.observe(&step(6, 0.0)).is_none());
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=4 {
            assert!(d.observe(&step(s, 0.0)).is_none());
        }
        assert!(d.observe(&step(5, 1.0)).is_none());
        let a = d.observe(&step(6, 1.0)).expect("two steps alarm");
        assert!(a.has("trunc_rate", Dir::Up), "{a:?}");
    }

    #[test]
    fn late_onsets_are_caught_at_their_step_after_a_long_clean_stretch() {
        // A jump (entropy collapse) at step 57, after 56 noisy clean steps: no alarm before, an
        // alarm at the onset, whatever the baseline window forgot.
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=56 {
            assert!(d.observe(&scored(s)).is_none(), "false alarm at {s}");
        }
        let mut late = scored(57);
        late.values.insert("entropy".into(), 0.2);
        let a = d.observe(&late).expect("late jump caught");
        assert!(a.has("entropy", Dir::Down));
        assert_eq!(a.signals[0].rule, Rule::RobustZ);
        // A slow late drift (response length about +4.4 z-units a step from step 61, under the
        // z threshold of 5): CUSUM, within
        // three steps of the onset.
        let mut d = RobustDetector::new(RobustConfig::default());
        let len = |s: usize| 40.0 + (s % 3) as f64;
        for s in 1..=60 {
            let mut r = scored(s);
            r.values.insert("response_len".into(), len(s));
            assert!(d.observe(&r).is_none(), "false alarm at {s}");
        }
        let mut fired = None;
        for s in 61..=70 {
            let mut r = scored(s);
            r.values.insert("response_len".into(), len(s) + 36.0);
            if let Some(a) = d.observe(&r) {
                fired = Some(a);
                break;
            }
        }
        let a = fired.expect("late drift caught");
        assert!(a.step <= 63, "{a:?}");
        assert!(a.has("response_len", Dir::Up));
        assert_eq!(a.signals[0].rule, Rule::Cusum);
    }

    #[test]
    fn a_restored_detector_continues_exactly() {
        let mut a = RobustDetector::new(RobustConfig::default());
        for s in 1..=12 {
            assert!(a.observe(&scored(s)).is_none());
        }
        assert!(a.observe(&silent(13)).is_none());
        let st: DetectorState =
            serde_json::from_str(&serde_json::to_string(&a.state()).unwrap()).unwrap();
        let mut b = RobustDetector::new(RobustConfig::default());
        b.restore(&st).unwrap();
        assert_eq!(b.state(), a.state());
        for s in 14..=20 {
            let r = if s < 16 { silent(s) } else { scored(s) };
            assert_eq!(a.observe(&r), b.observe(&r), "step {s}");
        }
        let bad = DetectorState {
            settings: [("nope".to_string(), 0u64)].into_iter().collect(),
            ..DetectorState::default()
        };
        assert!(b.restore(&bad).unwrap_err().to_string().contains("nope"));
    }

    /// Steps of a clean 6-step bench run at lr 1e-3 (seed 1's `reward_stale_truth` clean
    /// twin, rounded): KL to the reference grows from 0, the gradient norm swings by 25x, the
    /// rewards of four prompts jump by 0.25-0.5, the entropy by a third.
    fn bench_clean(step: usize, kl: f64) -> StepRecord {
        let i = step - 1;
        let reward = [0.25, 0.5, 0.25, 0.0, 0.5, 0.25][i % 6];
        let std = [0.433, 0.5, 0.433, 0.0, 0.5, 0.433][i % 6];
        rec(
            step,
            &[
                ("kl", kl),
                ("kl_k3", kl * 0.9),
                ("entropy", [0.502, 0.287, 0.397, 0.601, 0.338, 0.481][i % 6]),
                (
                    "grad_norm",
                    [0.684, 0.052, 0.680, 0.086, 1.295, 1.152][i % 6],
                ),
                ("reward_mean", reward),
                ("reward_std", std),
                ("reward_min", 0.0),
                ("reward_max", if std > 0.0 { 1.0 } else { 0.0 }),
            ],
        )
    }

    const CLEAN_KL: [f64; 6] = [0.0, 0.028, 0.210, 0.496, 0.651, 0.32];

    #[test]
    fn steady_kl_growth_is_quiet_and_a_kl_blow_up_is_caught() {
        // Clean: KL 0 -> 0.65 over six steps (0.50 against a 3-step baseline of median 0.03
        // was a 9-sigma KL alarm on the linear scale) raises nothing.
        let mut d = RobustDetector::new(RobustConfig::default());
        for (i, kl) in CLEAN_KL.iter().enumerate() {
            let a = d.observe(&bench_clean(i + 1, *kl));
            assert!(a.is_none(), "clean step {}: {a:?}", i + 1);
        }
        // The same run going on with KL levelling off at ~0.65, then blowing up to 30 at step
        // 10 (lr too high, KL coefficient gone: the bench's lr fault takes KL from 0.4 to 10-17
        // in one step; a 10x jump is within the log scale's noise floor after a 6-step rise).
        let mut d = RobustDetector::new(RobustConfig::default());
        let mut caught = None;
        let kls = CLEAN_KL.iter().chain(&[0.65, 0.67, 0.70, 30.0]);
        for (i, kl) in kls.enumerate() {
            if let Some(a) = d.observe(&bench_clean(i + 1, *kl)) {
                caught.get_or_insert(a);
            }
        }
        let a = caught.expect("a KL blow-up is caught");
        assert_eq!(a.step, 10);
        assert!(a.has("kl", Dir::Up) && a.has("kl_k3", Dir::Up), "{a:?}");
        // On the log scale a value at 0 (or a k1 estimate slightly below it) stays finite.
        let kl = WATCHED.iter().find(|w| w.name == "kl").expect("kl watched");
        assert!(kl.judged(-1e-8).is_some_and(f64::is_finite));
    }

    #[test]
    fn tiny_batch_noise_is_quiet_and_big_jumps_still_alarm() {
        // Clean: two cycles of the bench's noisy rewards, gradient norms and entropies.
        let kl = |s: usize| 0.1 * s as f64;
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=12 {
            let a = d.observe(&bench_clean(s, kl(s)));
            assert!(a.is_none(), "clean step {s}: {a:?}");
        }
        // Planted: a gradient norm of 1e5 (against clean ones swinging from 0.05 to 1.3),
        // an entropy collapse to 0.02, rewards of mean 5 (reward scale).
        let cases: [(&str, f64, &str, Dir); 3] = [
            ("grad_norm", 1e5, "grad_norm", Dir::Up),
            ("entropy", 0.02, "entropy", Dir::Down),
            ("reward_mean", 5.0, "reward_mean", Dir::Up),
        ];
        for (key, x, feature, dir) in cases {
            let mut d = RobustDetector::new(RobustConfig::default());
            for s in 1..=4 {
                assert!(d.observe(&bench_clean(s, kl(s))).is_none());
            }
            let mut r = bench_clean(5, kl(5));
            r.values.insert(key.to_string(), x);
            let a = d.observe(&r).expect("the jump alarms");
            assert!(a.has(feature, dir), "{key}: {a:?}");
        }
    }

    #[test]
    fn a_sparse_scorer_is_not_silent_but_a_scorer_that_always_spread_is() {
        // A policy that scores nothing on many small batches: zero, spread, then four zeros.
        // Half its steps before the zeros were all-zero, so four more are bad luck, not a fault.
        let mut d = RobustDetector::new(RobustConfig::default());
        assert!(d.observe(&silent(1)).is_none());
        assert!(d.observe(&scored(2)).is_none());
        for s in 3..=6 {
            let a = d.observe(&silent(s));
            assert!(a.is_none(), "step {s}: {a:?}");
        }
        // A scorer whose every one of 10 steps had rewards goes silent: caught after 3 zeros
        // (the minimum, `silent_steps`).
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=10 {
            assert!(d.observe(&scored(s)).is_none());
        }
        assert!(d.observe(&silent(11)).is_none());
        assert!(d.observe(&silent(12)).is_none());
        let a = d.observe(&silent(13)).expect("silent scorer caught");
        assert!(a.has("scorer_silent", Dir::Up));
    }

    #[test]
    fn robust_z_catches_a_jump_after_warm_up_only() {
        let mut d = RobustDetector::new(RobustConfig::default());
        // A jump during warm-up is not judged.
        assert!(d.observe(&rec(1, &[("entropy", 2.0)])).is_none());
        assert!(d.observe(&rec(2, &[("entropy", 2.02)])).is_none());
        assert!(d.observe(&rec(3, &[("entropy", 1.98)])).is_none());
        let a = d.observe(&rec(4, &[("entropy", 0.1)])).unwrap();
        assert_eq!(a.signals[0].feature, "entropy");
        assert_eq!(a.signals[0].rule, Rule::RobustZ);
        assert_eq!(a.signals[0].dir, Dir::Down);
        // The faulty value did not enter the baseline: still anomalous next step.
        assert!(d.observe(&rec(5, &[("entropy", 0.1)])).is_some());
    }

    /// A clean step of a stage-2 run: `trained` sequences updated (0: every group tied).
    fn stage2_step(step: usize, trained: f64, entropy: f64, max_ratio: f64) -> StepRecord {
        let mut kv = vec![
            ("reward_mean", noisy_reward(step)),
            ("trained_sequences", trained),
            ("entropy", entropy),
        ];
        if trained > 0.0 {
            kv.extend([("max_ratio", max_ratio), ("grad_norm", 1.0)]);
        } else {
            kv.extend([("max_ratio", 0.0), ("grad_norm", 0.0)]);
        }
        rec(step, &kv)
    }

    #[test]
    fn a_step_without_update_is_judged_on_its_own_estimates() {
        // Clean: entropy ~0.2 on updated steps; a tied step reports the rollouts' surprisal
        // (~1.5) and zero ratios and gradients. Seen in a real 48-step run (session 39).
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=30 {
            let r = if s % 5 == 0 {
                stage2_step(s, 0.0, 1.5 + 0.01 * (s % 3) as f64, 0.0)
            } else {
                stage2_step(s, 16.0, 0.2 + 0.01 * (s % 3) as f64, 2.0)
            };
            assert!(d.observe(&r).is_none(), "clean step {s}");
        }
        // The surprisal has its own baseline: its collapse on a tied step is still caught.
        let a = d.observe(&stage2_step(35, 0.0, 0.05, 0.0)).unwrap();
        assert_eq!(
            (a.signals[0].feature.as_str(), a.signals[0].dir),
            ("surprisal", Dir::Down)
        );
        // Without the record of updated sequences (an external log) entropy is judged as before.
        assert_eq!(
            judged_record(&rec(1, &[("entropy", 1.0)])).get("entropy"),
            Some(1.0)
        );
    }

    #[test]
    fn heavy_tailed_ratios_are_judged_on_the_log_scale() {
        // The largest ratio of a clean step varies by ~10x (1.4 to 17 in a real run) ...
        let mut d = RobustDetector::new(RobustConfig::default());
        let clean = [1.5, 2.6, 17.3, 4.2, 1.4, 16.8, 2.0, 1.7, 3.3, 6.0, 1.9, 2.4];
        for (k, x) in clean.iter().enumerate() {
            assert!(
                d.observe(&stage2_step(k + 1, 16.0, 0.2, *x)).is_none(),
                "{x}"
            );
        }
        // ... while clipping switched off lets it run away by orders of magnitude.
        let a = d.observe(&stage2_step(13, 16.0, 0.2, 5e3)).unwrap();
        assert_eq!(
            (a.signals[0].feature.as_str(), a.signals[0].rule),
            ("max_ratio", Rule::RobustZ)
        );
    }

    #[test]
    fn one_spike_is_one_alarm_not_a_run_of_cusum_alarms() {
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=8 {
            assert!(d.observe(&rec(s, &[("entropy", 0.2)])).is_none());
        }
        assert!(d.observe(&rec(9, &[("entropy", 1.6)])).is_some());
        for s in 10..=14 {
            assert!(
                d.observe(&rec(s, &[("entropy", 0.2)])).is_none(),
                "step {s}"
            );
        }
        // Two large steps in a row (x4.85, z 4.5 on the log scale, under the z threshold)
        // still accumulate: the CUSUM's job.
        assert!(d.observe(&rec(15, &[("entropy", 0.97)])).is_none());
        let a = d.observe(&rec(16, &[("entropy", 0.97)])).unwrap();
        assert_eq!(a.signals[0].rule, Rule::Cusum);
    }

    #[test]
    fn cusum_catches_a_drift_a_single_z_misses() {
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=4 {
            assert!(d.observe(&rec(s, &[("response_len", 40.0)])).is_none());
        }
        // Scale floor 0.2 * 40 = 8: +5 z-units per step stays at the z threshold of 5 but
        // accumulates 2 per step above k = 3, past the CUSUM limit of 3 at the second step.
        let mut fired = None;
        for s in 5..=12 {
            if let Some(a) = d.observe(&rec(s, &[("response_len", 80.0)])) {
                fired = Some(a);
                break;
            }
        }
        let a = fired.expect("cusum fired");
        assert_eq!(a.signals[0].rule, Rule::Cusum);
        assert!(a.has("response_len", Dir::Up));
    }

    #[test]
    fn baselines_fire_on_their_rules() {
        let clean: Vec<StepRecord> = (1..=10)
            .map(|s| rec(s, &[("kl", 0.01 * s as f64)]))
            .collect();
        let mut st = StaticDetector::fit(&clean, 0.1);
        assert!(st.observe(&rec(1, &[("kl", 0.05)])).is_none());
        assert!(st
            .observe(&rec(2, &[("kl", 0.5)]))
            .unwrap()
            .has("kl", Dir::Up));
        let mut z = ZScoreDetector::new(3.0, 3);
        for s in 1..=5 {
            assert!(z
                .observe(&rec(s, &[("kl", 0.01 * (s % 2) as f64)]))
                .is_none());
        }
        assert!(z
            .observe(&rec(6, &[("kl", 1.0)]))
            .unwrap()
            .has("kl", Dir::Up));
    }

    #[test]
    fn a_rate_move_exactly_on_the_threshold_does_not_alarm_and_a_full_one_does() {
        // Four responses a step: 3 of 4 empty over the floor 0.15 is 5.0 sigma (rounded to
        // 5.000000000000001), on the limit, not beyond it.
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=4 {
            assert!(d.observe(&rec(s, &[("empty_rate", 0.0)])).is_none());
        }
        assert!(d.observe(&rec(5, &[("empty_rate", 0.75)])).is_none());
        assert!(d.observe(&rec(6, &[("empty_rate", 0.0)])).is_none());
        let a = d.observe(&rec(7, &[("empty_rate", 1.0)])).expect("4 of 4");
        assert!(a.has("empty_rate", Dir::Up));
    }

    #[test]
    fn anti_correlated_advantages_alarm_without_a_baseline() {
        let mut d = RobustDetector::new(RobustConfig::default());
        // Clean: group-baselined advantages correlate positively with rewards, 0 when tied.
        for (s, c) in [0.816, 0.0, 1.0, 0.0, 0.816, 0.762].into_iter().enumerate() {
            assert!(d.observe(&rec(s + 1, &[("adv_reward_corr", c)])).is_none());
        }
        let mut fresh = RobustDetector::new(RobustConfig::default());
        assert!(fresh
            .observe(&rec(1, &[("adv_reward_corr", 0.0)]))
            .is_none());
        let a = fresh
            .observe(&rec(2, &[("adv_reward_corr", -0.816)]))
            .expect("flipped");
        assert!(a.has("adv_reward_corr", Dir::Down));
        assert_eq!(a.signals[0].rule, Rule::Hard);
    }

    #[test]
    fn an_alarm_carries_the_sub_threshold_z_scores_of_its_step() {
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=4 {
            let r = rec(s, &[("empty_rate", 0.0), ("response_len", 70.0)]);
            assert!(d.observe(&r).is_none());
        }
        // Length 70 -> 7 with floor 0.2 * 70 = 14: z -4.5, under the threshold.
        let a = d
            .observe(&rec(5, &[("empty_rate", 1.0), ("response_len", 7.0)]))
            .expect("empty responses");
        assert!(!a.has("response_len", Dir::Down));
        let z = a.context.get("response_len").copied().unwrap_or(0.0);
        assert!((z + 4.5).abs() < 1e-9, "{z}");
        assert!(a.leans("response_len", Dir::Down, 2.0));
        assert!(!a.leans("response_len", Dir::Up, 2.0));
    }

    #[test]
    fn rewards_off_their_audit_alarm_at_once_and_a_clean_audit_never() {
        use super::super::diagnose::diagnose;
        use super::super::taxonomy::FaultType;
        let step = |s: usize, audit: &[(&str, f64)]| {
            let mut kv = vec![("reward_mean", noisy_reward(s)), ("audit_gap", 0.0)];
            kv.extend_from_slice(audit);
            rec(s, &kv)
        };
        let mut d = RobustDetector::new(RobustConfig::default());
        for s in 1..=30 {
            assert!(d.observe(&step(s, &[])).is_none(), "false alarm at {s}");
        }
        // The planted fault: one response in four paid 1 though its answer scored 0.
        let a = d
            .observe(&step(31, &[("audit_gap", 0.25), ("audit_up", 0.25)]))
            .expect("the lenient reward was caught");
        assert!(
            a.has("audit_gap", Dir::Up) && a.has("audit_up", Dir::Up),
            "{a:?}"
        );
        assert_eq!(diagnose(&a).fault, Some(FaultType::RewardLenient));
        let a = d
            .observe(&step(
                32,
                &[
                    ("audit_gap", 0.5),
                    ("audit_up", 0.25),
                    ("audit_down", 0.25),
                    ("audit_permuted", 1.0),
                ],
            ))
            .expect("the shuffled rewards were caught");
        assert_eq!(diagnose(&a).fault, Some(FaultType::ShuffledPairs));
        // Off: the same step passes.
        let mut off = RobustDetector::new(RobustConfig {
            audit_limit: -1.0,
            ..RobustConfig::default()
        });
        for s in 1..=30 {
            assert!(off.observe(&step(s, &[])).is_none());
        }
        assert!(off
            .observe(&step(31, &[("audit_gap", 0.25), ("audit_up", 0.25)]))
            .is_none());
    }

    #[test]
    fn repeated_prompts_alarm_on_a_run_too_unlikely_for_chance_only() {
        use super::super::diagnose::diagnose;
        use super::super::taxonomy::FaultType;
        let step = |s: usize, chance: f64| {
            rec(
                s,
                &[
                    ("reward_mean", noisy_reward(s)),
                    ("prompt_unique_frac", if chance < 1.0 { 0.5 } else { 1.0 }),
                    ("prompt_dup_chance", chance),
                ],
            )
        };
        // A clean run of 2-prompt batches from 12 prompts repeats one now and then, twice in
        // a row at most: no alarm (the unique fraction's fall alone would be a 5-sigma move).
        let mut d = RobustDetector::new(RobustConfig::default());
        let dups = [4, 9, 10, 17, 25, 26, 33];
        for s in 1..=40 {
            let c = if dups.contains(&s) { 1.0 / 12.0 } else { 1.0 };
            assert!(d.observe(&step(s, c)).is_none(), "false alarm at {s}");
        }
        // The planted fault: every batch one prompt, from step 41; 3 in a row: 1/1728.
        let first = (41..=50)
            .find_map(|s| d.observe(&step(s, 1.0 / 12.0)))
            .expect("the duplicated prompts were caught");
        assert_eq!(first.step, 43, "{first:?}");
        assert!(first.has("prompt_dup_chance", Dir::Down));
        assert_eq!(diagnose(&first).fault, Some(FaultType::DuplicatedPrompts));
        // Off: never.
        let mut off = RobustDetector::new(RobustConfig {
            dup_alpha: 0.0,
            ..RobustConfig::default()
        });
        for s in 1..=50 {
            let c = if s > 40 { 1.0 / 12.0 } else { 1.0 };
            assert!(off.observe(&step(s, c)).is_none(), "step {s}");
        }
    }

    #[test]
    fn a_tied_step_leaves_the_advantage_correlation_out() {
        // The clean series of the 8-step bench that alarmed (seed 5): the correlation is 0 by
        // definition on steps whose groups all tied, which a CUSUM read as a fall.
        let corr = [1.0, 1.0, 0.82, 0.0, 0.0, 0.0, 0.0, 0.82];
        let tied = [0.0, 0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.5];
        let mut d = RobustDetector::new(RobustConfig::default());
        for (i, (c, t)) in corr.iter().zip(tied).enumerate() {
            let r = rec(i + 1, &[("adv_reward_corr", *c), ("zero_std_frac", t)]);
            assert!(d.observe(&r).is_none(), "false alarm at {}", i + 1);
        }
        let r = rec(3, &[("adv_reward_corr", 0.0), ("zero_std_frac", 1.0)]);
        assert!(judged_record(&r).get("adv_reward_corr").is_none());
        let r = rec(3, &[("adv_reward_corr", 0.0), ("zero_std_frac", 0.5)]);
        assert_eq!(judged_record(&r).get("adv_reward_corr"), Some(0.0));
    }
}
