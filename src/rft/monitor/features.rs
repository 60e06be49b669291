//! Features of RL steps: the health numbers a step records beside its metrics ([`Health`]), the
//! per-trajectory statistics they are made of, and the flat named view ([`StepRecord`]) that the
//! detectors read, from sorft's own metrics or from an external run's JSONL.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::generate::{FinishReason, GenOutput};

/// Health numbers of one RL step, cheap to compute from what the step already has.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Health {
    /// Smallest reward of the step.
    pub reward_min: f64,
    /// Largest reward of the step.
    pub reward_max: f64,
    /// Share of groups whose responses all scored the same (no learning signal).
    pub zero_std_frac: f64,
    /// Share of distinct prompts among the step's groups.
    pub prompt_unique_frac: f64,
    /// Mean per-token k3 estimate of KL(policy || reference).
    pub kl_k3: f64,
    /// Largest probability ratio new/old over the update's tokens.
    pub max_ratio: f64,
    /// Mean |new - old| log-probability of the first minibatch before any update: the
    /// sampler / trainer mismatch.
    pub logprob_mismatch: f64,
    /// Learning rate the optimizer used.
    pub lr: f64,
    /// KL coefficient in force.
    pub kl_coef: f64,
    /// Clip range in force.
    pub clip_eps: f64,
    /// Rollout temperature in force.
    pub temperature: f64,
    /// Share of responses cut at `max_new_tokens`.
    pub trunc_rate: f64,
    /// Mean repetition ratio of the responses ([`repetition_ratio`]).
    pub repetition: f64,
    /// Mean unique-token ratio of the responses ([`unique_token_ratio`]).
    pub unique_ratio: f64,
    /// Share of empty responses.
    pub empty_rate: f64,
    /// Share of responses whose answer had no parsable format.
    pub format_error_rate: f64,
    /// Share of responses naming a target the prompt did not show.
    pub invented_rate: f64,
    /// Standard deviation of the trained tokens' advantages.
    pub adv_std: f64,
    /// Correlation of the sequences' advantages with their rewards (about +1 when healthy).
    pub adv_reward_corr: f64,
    /// Non-finite values seen in rewards, log-probabilities or advantages (they are zeroed).
    pub nonfinite: f64,
    /// Share of responses whose scoring failed in the sandbox.
    pub sandbox_error_rate: f64,
    /// Share of identical answers to the same prompt that scored differently (0 when no two
    /// answers were identical): a deterministic scorer never disagrees with itself.
    pub answer_disagree: f64,
    /// Share of responses whose scoring timed out.
    pub timeout_rate: f64,
    /// The reward audit ([`RewardAudit`]) of the responses whose reward is the rule score
    /// (all 0 when none is).
    #[serde(flatten)]
    pub audit: RewardAudit,
    /// The chance that uniform draws of the step's prompts from the prompt set repeat prompts
    /// at least as much as this batch did ([`duplicate_chance`]); absent when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_dup_chance: Option<f64>,
}

/// The reward audit: each response's reward as the update saw it against the rule score of
/// its answer recomputed from its own record's truth (where the rule score is the reward; a
/// clean step's gap is exactly 0).
/// A fault between the scorer and the update (a lenient or noisy reward service, a mismatched
/// truth table, flaky verdicts, rewards paired with the wrong responses) shows as a gap; a
/// fault inside the scorer or the record's truth does not.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RewardAudit {
    /// Mean |reward - audit| over the audited responses.
    pub audit_gap: f64,
    /// Share of audited responses rewarded above their audit.
    pub audit_up: f64,
    /// Share of audited responses rewarded below their audit.
    pub audit_down: f64,
    /// Share of audited responses whose reward disagrees with the audit and is neither 0 nor 1
    /// (noise; verdicts and a lenient reward give 0 or 1).
    pub audit_offgrid: f64,
    /// 1 when the rewards disagree with the audit yet are the audit's own values in another
    /// order (rewards paired with the wrong responses), else 0.
    pub audit_permuted: f64,
}

/// Audits `scores` against `audit` (the rule score of response `i`, `None` where the reward
/// comes from elsewhere, such as execution); all 0 when nothing was audited.
pub fn reward_audit(scores: &[f32], audit: &[Option<f64>]) -> RewardAudit {
    const TOL: f64 = 1e-6;
    let pairs: Vec<(f64, f64)> = scores
        .iter()
        .zip(audit)
        .filter_map(|(&s, a)| a.map(|a| (s as f64, (a as f32) as f64)))
        .filter(|(s, a)| s.is_finite() && a.is_finite())
        .collect();
    if pairs.is_empty() {
        return RewardAudit::default();
    }
    let n = pairs.len() as f64;
    let share =
        |f: &dyn Fn(f64, f64) -> bool| pairs.iter().filter(|(s, a)| f(*s, *a)).count() as f64 / n;
    let off = |s: f64, a: f64| (s - a).abs() > TOL;
    let mut sorted_s: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let mut sorted_a: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    sorted_s.sort_by(f64::total_cmp);
    sorted_a.sort_by(f64::total_cmp);
    let gap = pairs.iter().map(|(s, a)| (s - a).abs()).sum::<f64>() / n;
    let same_values = sorted_s.iter().zip(&sorted_a).all(|(s, a)| !off(*s, *a));
    RewardAudit {
        audit_gap: gap,
        audit_up: share(&|s, a| s > a + TOL),
        audit_down: share(&|s, a| s < a - TOL),
        audit_offgrid: share(&|s, a| off(s, a) && s.abs() > TOL && (s - 1.0).abs() > TOL),
        audit_permuted: f64::from(u8::from(gap > TOL && same_values)),
    }
}

/// The chance that `n` uniform draws (with replacement) from `pool` prompts give at most
/// `distinct` distinct prompts: 1 for a batch without repeats, about `1 / pool` for a batch of
/// two that drew one prompt twice.
pub fn duplicate_chance(n: usize, distinct: usize, pool: usize) -> f64 {
    if pool == 0 || n == 0 || distinct >= n.min(pool) {
        return 1.0;
    }
    // p[k]: the chance of k distinct prompts after the draws so far.
    let mut p = vec![0.0f64; n + 1];
    p[0] = 1.0;
    let m = pool as f64;
    for _ in 0..n {
        for k in (0..=n).rev() {
            let stay = p[k] * k as f64 / m;
            let grow = if k > 0 {
                p[k - 1] * (m - (k - 1) as f64) / m
            } else {
                0.0
            };
            p[k] = stay + grow;
        }
    }
    p[..=distinct].iter().sum::<f64>().min(1.0)
}

/// Share of a response's token 3-grams that repeat an earlier 3-gram of the same response.
pub fn repetition_ratio(ids: &[u32]) -> f64 {
    if ids.len() < 4 {
        return 0.0;
    }
    let mut seen = std::collections::HashSet::new();
    let mut rep = 0usize;
    let grams = ids.windows(3);
    let n = grams.len();
    for g in grams {
        if !seen.insert(g) {
            rep += 1;
        }
    }
    rep as f64 / n as f64
}

/// Distinct tokens over tokens of a response (1 for an empty one).
pub fn unique_token_ratio(ids: &[u32]) -> f64 {
    if ids.is_empty() {
        return 1.0;
    }
    let set: std::collections::HashSet<u32> = ids.iter().copied().collect();
    set.len() as f64 / ids.len() as f64
}

/// Share of groups (given as group ids per response) whose scores are all equal.
pub fn zero_std_fraction(scores: &[f32], groups: &[usize]) -> f64 {
    let mut by: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
    for (&s, &g) in scores.iter().zip(groups) {
        by.entry(g).or_default().push(s);
    }
    if by.is_empty() {
        return 0.0;
    }
    let uniform = by.values().filter(|v| v.iter().all(|&x| x == v[0])).count();
    uniform as f64 / by.len() as f64
}

/// Among pairs of responses to the same prompt (`prompt_of[i]`) with the same non-empty final
/// answer (after `</think>`, trimmed), the share whose scores differ; 0 when there is no such
/// pair. Any value above 0 means the same answer was judged two ways (flaky tests, noise).
pub fn answer_disagreement(texts: &[&str], scores: &[f32], prompt_of: &[usize]) -> f64 {
    let answers: Vec<&str> = texts
        .iter()
        .map(|t| crate::swe::answer::final_part(t).trim())
        .collect();
    let n = answers.len().min(scores.len()).min(prompt_of.len());
    let (mut same, mut differ) = (0usize, 0usize);
    for i in 0..n {
        for j in i + 1..n {
            if prompt_of[i] != prompt_of[j] || answers[i].is_empty() || answers[i] != answers[j] {
                continue;
            }
            same += 1;
            let (a, b) = (scores[i], scores[j]);
            differ += usize::from(a.is_finite() && b.is_finite() && (a - b).abs() > 1e-6);
        }
    }
    if same == 0 {
        0.0
    } else {
        differ as f64 / same as f64
    }
}

/// Pearson correlation of two series (0 when either is constant or they are empty).
pub fn correlation(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    if n < 2 {
        return 0.0;
    }
    let ma = a[..n].iter().sum::<f64>() / n as f64;
    let mb = b[..n].iter().sum::<f64>() / n as f64;
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let (x, y) = (a[i] - ma, b[i] - mb);
        sab += x * y;
        saa += x * x;
        sbb += y * y;
    }
    if saa <= 1e-12 || sbb <= 1e-12 {
        0.0
    } else {
        sab / (saa * sbb).sqrt()
    }
}

/// Mean k3 estimate of KL(pi || ref) from per-token `log pi - log ref` of samples of pi.
pub fn kl_k3(diffs: &[f32]) -> f64 {
    if diffs.is_empty() {
        return 0.0;
    }
    diffs
        .iter()
        .map(|&d| {
            let r = -(d as f64);
            r.exp() - 1.0 - r
        })
        .sum::<f64>()
        / diffs.len() as f64
}

/// Standard deviation of a series (population).
pub fn std_dev(x: &[f64]) -> f64 {
    if x.is_empty() {
        return 0.0;
    }
    let m = x.iter().sum::<f64>() / x.len() as f64;
    (x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
}

/// The rollout part of a step's health: rewards (`scores`, response `i` in group
/// `i / group_size` of prompt `chosen[group]`, drawn from `pool` prompts), lengths,
/// repetition, empty and failed answers (from the zero-reward reason counts).
pub fn rollout_health(
    outs: &[GenOutput],
    scores: &[f32],
    chosen: &[usize],
    (group_size, pool): (usize, usize),
    zero_reasons: &BTreeMap<String, usize>,
) -> Health {
    let n = outs.len().max(1) as f64;
    let finite: Vec<f64> = scores
        .iter()
        .filter(|s| s.is_finite())
        .map(|&s| s as f64)
        .collect();
    let groups: Vec<usize> = (0..scores.len()).map(|i| i / group_size.max(1)).collect();
    let distinct: std::collections::BTreeSet<usize> = chosen.iter().copied().collect();
    let texts: Vec<&GenOutput> = outs.iter().filter(|o| !o.text.trim().is_empty()).collect();
    let mean_over = |f: &dyn Fn(&GenOutput) -> f64| {
        texts.iter().map(|o| f(o)).sum::<f64>() / texts.len().max(1) as f64
    };
    let rate = |k: &str| zero_reasons.get(k).copied().unwrap_or(0) as f64 / n;
    Health {
        reward_min: finite
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
            .min(f64::MAX),
        reward_max: finite
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
            .max(f64::MIN),
        zero_std_frac: zero_std_fraction(scores, &groups),
        prompt_unique_frac: distinct.len() as f64 / chosen.len().max(1) as f64,
        prompt_dup_chance: Some(duplicate_chance(chosen.len(), distinct.len(), pool)),
        trunc_rate: outs
            .iter()
            .filter(|o| o.finish == FinishReason::Length)
            .count() as f64
            / n,
        repetition: mean_over(&|o| repetition_ratio(&o.ids)),
        unique_ratio: if texts.is_empty() {
            1.0
        } else {
            mean_over(&|o| unique_token_ratio(&o.ids))
        },
        empty_rate: (outs.len() - texts.len()) as f64 / n,
        format_error_rate: rate("format_error"),
        invented_rate: rate("invented_target"),
        sandbox_error_rate: rate("sandbox_error"),
        timeout_rate: rate("timeout"),
        answer_disagree: answer_disagreement(
            &outs.iter().map(|o| o.text.as_str()).collect::<Vec<_>>(),
            scores,
            &groups
                .iter()
                .map(|&g| chosen.get(g).copied().unwrap_or(usize::MAX - g))
                .collect::<Vec<_>>(),
        ),
        nonfinite: (scores.len() - finite.len()) as f64,
        ..Health::default()
    }
}

/// The advantage part of a step's health; non-finite advantages are counted and zeroed.
pub fn advantage_health(h: &mut Health, adv: &mut [Vec<f32>], scores: &[f32]) {
    let mut flat = Vec::new();
    let mut per_seq = Vec::new();
    for a in adv.iter_mut() {
        for x in a.iter_mut() {
            if !x.is_finite() {
                h.nonfinite += 1.0;
                *x = 0.0;
            }
            flat.push(*x as f64);
        }
        per_seq.push(a.iter().map(|&x| x as f64).sum::<f64>() / a.len().max(1) as f64);
    }
    h.adv_std = std_dev(&flat);
    let s: Vec<f64> = scores.iter().map(|&x| x as f64).collect();
    h.adv_reward_corr = correlation(&per_seq, &s);
}

/// The least importance weight `old / sampler` of a token whose ratio counts in `max_ratio`:
/// the sampler (a grammar) left at least half the old policy's mass.
pub const ON_POLICY_WEIGHT: f32 = 0.5;

/// The ratio part of a step's health from one minibatch's new and old log-probabilities;
/// `before_update`: no optimizer step yet, so the gap is the sampler / trainer mismatch.
/// `weights` (see [`crate::rft::ppo::approx_kl`]): the largest ratio is taken over the tokens
/// drawn from (close to) the old policy, weight at least [`ON_POLICY_WEIGHT`]; a forced token
/// scored under the full distribution moves by a large ratio whenever the policy gave it a tiny
/// probability, however small the update.
pub fn ratio_health(
    h: &mut Health,
    new_lp: &[f32],
    old_lp: &[f32],
    weights: Option<&[f32]>,
    before_update: bool,
) {
    let mut gap = 0.0;
    for (t, (n, o)) in new_lp.iter().zip(old_lp).enumerate() {
        let d = (n - o) as f64;
        let w = weights.and_then(|w| w.get(t)).copied().unwrap_or(1.0);
        if w >= ON_POLICY_WEIGHT {
            h.max_ratio = h.max_ratio.max(d.exp());
        }
        gap += d.abs();
    }
    if before_update {
        h.logprob_mismatch = gap / new_lp.len().max(1) as f64;
    }
}

/// One step as the detectors see it: named numeric features.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step (1-based).
    pub step: usize,
    /// Feature name -> value.
    pub values: BTreeMap<String, f64>,
}

impl StepRecord {
    /// The value of feature `name`, if recorded.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.get(name).copied()
    }

    /// A record from a JSON object: numbers at the top level and in nested objects (`health`
    /// fields keep their names, other nested keys become `outer/inner`), with the aliases of
    /// other engines' logs mapped to sorft's names ([`canonical_name`]). The step is read from
    /// `step`, `global_step` or `train/global_step`, else `fallback_step`.
    pub fn from_json(v: &serde_json::Value, fallback_step: usize) -> StepRecord {
        let mut values = BTreeMap::new();
        flatten("", v, &mut values);
        let step = ["step", "global_step", "train/global_step", "iteration"]
            .iter()
            .find_map(|k| values.get(*k).copied())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| s as usize)
            .unwrap_or(fallback_step);
        let values = values
            .into_iter()
            .map(|(k, x)| (canonical_name(&k).to_string(), x))
            .collect();
        StepRecord { step, values }
    }
}

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, f64>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, x) in map {
                let key = if prefix.is_empty() || prefix == "health" {
                    k.clone()
                } else {
                    format!("{prefix}/{k}")
                };
                flatten(&key, x, out);
            }
        }
        serde_json::Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                out.insert(prefix.to_string(), x);
            }
        }
        // JSON has no NaN; loggers write it as a string.
        serde_json::Value::String(s) => {
            let l = s.to_ascii_lowercase();
            if matches!(
                l.as_str(),
                "nan" | "inf" | "-inf" | "infinity" | "-infinity"
            ) {
                out.insert(prefix.to_string(), f64::NAN);
            }
        }
        _ => {}
    }
}

/// sorft's name of a metric written by another engine (OpenRLHF, veRL, TRL, RFT-FaultBench
/// records); unknown names pass through.
pub fn canonical_name(k: &str) -> &str {
    match k {
        "reward" | "rewards" | "critic/score/mean" | "train/reward" | "reward/mean" => {
            "reward_mean"
        }
        "reward_std" | "critic/score/std" | "train/reward_std" => "reward_std",
        "policy_entropy" | "entropy_loss" | "actor/entropy" | "actor/entropy_loss"
        | "train/entropy" => "entropy",
        "kl" | "actor/kl_loss" | "actor/ppo_kl_ref" | "train/kl" | "objective/kl" => "kl",
        "ppo_clip_ratio" | "clip_ratio" | "actor/pg_clipfrac" | "train/clip_ratio/region_mean" => {
            "clip_frac"
        }
        "actor/ppo_kl" | "approx_kl" => "approx_kl",
        "actor/grad_norm" | "grad_norm" | "train/grad_norm" => "grad_norm",
        "actor_lr" | "actor/lr" | "learning_rate" | "train/learning_rate" => "lr",
        "response_length"
        | "response_length/mean"
        | "generate_length"
        | "train/completions/mean_length" => "response_len",
        "response_length/clip_ratio" | "truncated" => "trunc_rate",
        "critic_loss" | "critic/vf_loss" => "value_loss",
        "critic/vf_explained_var" => "explained_variance",
        "advantage_std" => "adv_std",
        "repetition_ratio" => "repetition",
        "unique_token_ratio" => "unique_ratio",
        "tool_error_rate" => "sandbox_error_rate",
        other => other,
    }
}

/// Step records from trajectory records (one JSON object per response, with a step and any of
/// `reward`, `response_length`, `advantage_std`, `advantage`, `repetition_ratio`,
/// `unique_token_ratio`, `tool_call_count`, `tool_error_count`, `empty`, `long`): means per
/// step, plus the reward's std, min and max and the rate of tool errors.
pub fn aggregate_trajectories(rows: &[StepRecord]) -> Vec<StepRecord> {
    let mut by: BTreeMap<usize, Vec<&StepRecord>> = BTreeMap::new();
    for r in rows {
        by.entry(r.step).or_default().push(r);
    }
    let mut out = Vec::new();
    for (step, rs) in by {
        let mut values = BTreeMap::new();
        let col = |k: &str| -> Vec<f64> { rs.iter().filter_map(|r| r.get(k)).collect() };
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        for (src, dst) in [
            ("reward_mean", "reward_mean"),
            ("response_len", "response_len"),
            ("adv_std", "adv_std"),
            ("repetition", "repetition"),
            ("unique_ratio", "unique_ratio"),
            ("empty", "empty_rate"),
            ("long", "trunc_rate"),
        ] {
            let v = col(src);
            if !v.is_empty() {
                values.insert(dst.to_string(), mean(&v));
            }
        }
        let rw = col("reward_mean");
        if !rw.is_empty() {
            values.insert("reward_std".into(), std_dev(&rw));
            values.insert(
                "reward_min".into(),
                rw.iter().copied().fold(f64::INFINITY, f64::min),
            );
            values.insert(
                "reward_max".into(),
                rw.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            );
            let bad = rw.iter().filter(|x| !x.is_finite()).count();
            values.insert("nonfinite".into(), bad as f64);
        }
        let (calls, errs) = (col("tool_call_count"), col("tool_error_count"));
        if !errs.is_empty() {
            let c: f64 = calls.iter().sum();
            let e: f64 = errs.iter().sum();
            values.insert("sandbox_error_rate".into(), e / c.max(1.0));
        }
        out.push(StepRecord { step, values });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_ratio_skips_tokens_a_grammar_drew_from_little_mass() {
        let (new, old) = ([-2.0f32, -0.4], [-12.0f32, -0.5]);
        let mut h = Health::default();
        ratio_health(&mut h, &new, &old, Some(&[1e-5, 1.0]), false);
        assert!((h.max_ratio - 0.1f64.exp()).abs() < 1e-5, "{}", h.max_ratio);
        // Drawn from the old policy itself, the same token's ratio counts.
        let mut h = Health::default();
        ratio_health(&mut h, &new, &old, None, true);
        assert!(h.max_ratio > 2e4, "{}", h.max_ratio);
        assert!(
            (h.logprob_mismatch - 5.05).abs() < 1e-5,
            "{}",
            h.logprob_mismatch
        );
    }

    #[test]
    fn trajectory_statistics() {
        assert_eq!(repetition_ratio(&[1, 2, 3, 4, 5, 6]), 0.0);
        // 1 2 1 2 1 2 1 2: grams (1,2,1),(2,1,2) then all repeat -> 4 of 6.
        let r = repetition_ratio(&[1, 2, 1, 2, 1, 2, 1, 2]);
        assert!((r - 4.0 / 6.0).abs() < 1e-12, "{r}");
        assert_eq!(unique_token_ratio(&[7, 7, 7, 8]), 0.5);
        assert_eq!(zero_std_fraction(&[1.0, 1.0, 0.0, 1.0], &[0, 0, 1, 1]), 0.5);
        assert!((correlation(&[1.0, 2.0, 3.0], &[2.0, 4.0, 6.0]) - 1.0).abs() < 1e-12);
        assert!((correlation(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        assert!(kl_k3(&[0.0, 0.0]).abs() < 1e-12);
        assert!(kl_k3(&[0.5, -0.5]) > 0.0);
    }

    #[test]
    fn external_records_map_to_sorft_names() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"global_step": 7, "reward": 0.5, "policy_entropy": 1.2, "kl": "nan", "health": {"lr": 0.1}, "reward_by_subtask": {"file": 0.3}}"#,
        )
        .unwrap();
        let r = StepRecord::from_json(&v, 0);
        assert_eq!(r.step, 7);
        assert_eq!(r.get("reward_mean"), Some(0.5));
        assert_eq!(r.get("entropy"), Some(1.2));
        assert!(r.get("kl").unwrap().is_nan());
        assert_eq!(r.get("lr"), Some(0.1));
        assert_eq!(r.get("reward_by_subtask/file"), Some(0.3));
    }

    #[test]
    fn trajectories_aggregate_per_step() {
        let rows: Vec<StepRecord> = [(1, 1.0, 0.0), (1, 0.0, 1.0), (2, 0.5, 0.0)]
            .iter()
            .map(|&(s, r, e)| StepRecord {
                step: s,
                values: [
                    ("reward_mean".to_string(), r),
                    ("tool_error_count".into(), e),
                    ("tool_call_count".into(), 1.0),
                ]
                .into_iter()
                .collect(),
            })
            .collect();
        let agg = aggregate_trajectories(&rows);
        assert_eq!(agg.len(), 2);
        assert_eq!(agg[0].get("reward_mean"), Some(0.5));
        assert_eq!(agg[0].get("reward_std"), Some(0.5));
        assert_eq!(agg[0].get("sandbox_error_rate"), Some(0.5));
        assert_eq!(agg[1].get("sandbox_error_rate"), Some(0.0));
    }

    #[test]
    fn the_audit_reads_how_rewards_left_their_rule_scores() {
        let a = [Some(0.0), Some(0.5), Some(1.0), None];
        // Clean: the rewards are the rule scores (the unaudited one may be anything).
        assert_eq!(
            reward_audit(&[0.0, 0.5, 1.0, 0.7], &a),
            RewardAudit::default()
        );
        // Lenient: a wrong answer paid in full.
        let l = reward_audit(&[1.0, 0.5, 1.0, 0.0], &a);
        assert!((l.audit_gap - 1.0 / 3.0).abs() < 1e-9, "{l:?}");
        assert_eq!(
            (l.audit_up, l.audit_down, l.audit_offgrid),
            (1.0 / 3.0, 0.0, 0.0)
        );
        assert_eq!(l.audit_permuted, 0.0);
        // Rewards paired with the wrong responses: the same values in another order.
        let p = reward_audit(&[1.0, 0.0, 0.5, 0.0], &a);
        assert_eq!(p.audit_permuted, 1.0, "{p:?}");
        assert!(p.audit_up > 0.0 && p.audit_down > 0.0);
        // Noise: values no verdict gives.
        let n = reward_audit(&[0.2, 0.5, 0.9, 0.0], &a);
        assert_eq!(n.audit_offgrid, 2.0 / 3.0, "{n:?}");
        assert_eq!(n.audit_permuted, 0.0);
        // Nothing audited, non-finite rewards left out.
        assert_eq!(reward_audit(&[1.0], &[None]), RewardAudit::default());
        assert_eq!(
            reward_audit(&[f32::NAN, 0.5], &[Some(0.0), Some(0.5)]),
            RewardAudit::default()
        );
    }

    #[test]
    fn duplicate_chance_is_the_occupancy_tail_of_uniform_draws() {
        // Two draws from 12: one prompt twice with chance 1/12.
        assert!((duplicate_chance(2, 1, 12) - 1.0 / 12.0).abs() < 1e-12);
        assert_eq!(duplicate_chance(2, 2, 12), 1.0);
        // Four draws all one prompt: 1/N^3.
        assert!((duplicate_chance(4, 1, 10) - 1e-3).abs() < 1e-12);
        // At most 2 distinct of 3 draws from 3: 1 - 3!/27.
        assert!((duplicate_chance(3, 2, 3) - (1.0 - 6.0 / 27.0)).abs() < 1e-12);
        // A pool smaller than the batch must repeat.
        assert_eq!(duplicate_chance(4, 2, 2), 1.0);
        assert_eq!(duplicate_chance(0, 0, 5), 1.0);
        assert_eq!(duplicate_chance(3, 1, 0), 1.0);
    }
}
