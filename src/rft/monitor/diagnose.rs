//! Diagnosis: from an alarm's signals (and the step's record) to a fault type of the taxonomy,
//! by ordered rules from the most specific evidence (a hard rule on one feature) to the least.

use serde::{Deserialize, Serialize};

use super::detect::{Alarm, Dir};
use super::taxonomy::{FaultFamily, FaultType};

/// The monitor's verdict on an alarm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The most likely fault type (`None`: an anomaly no rule explains).
    pub fault: Option<FaultType>,
    /// Its family (for an unexplained anomaly, the family of the strongest signal's feature).
    pub family: Option<FaultFamily>,
    /// The evidence, in words.
    pub evidence: String,
}

/// The family a feature's anomaly points to when no specific rule matched.
pub fn feature_family(feature: &str) -> Option<FaultFamily> {
    Some(match feature {
        f if f.starts_with("reward") || f == "zero_std_frac" => FaultFamily::RF,
        "lr" | "kl_coef" | "clip_eps" | "kl" | "kl_k3" | "clip_frac" | "max_ratio"
        | "approx_kl" | "grad_norm" | "adv_std" | "adv_reward_corr" | "nonfinite" => {
            FaultFamily::PG
        }
        "entropy" | "surprisal" | "temperature" | "response_len" | "trunc_rate" | "repetition"
        | "unique_ratio" | "empty_rate" | "format_error_rate" => FaultFamily::OD,
        "logprob_mismatch" | "prompt_unique_frac" | "prompt_dup_chance" | "invented_rate"
        | "audit_permuted" => FaultFamily::CA,
        f if f.starts_with("audit") => FaultFamily::RF,
        "sandbox_error_rate" | "timeout_rate" | "scorer_silent" | "answer_disagree" => {
            FaultFamily::TE
        }
        _ => return None,
    })
}

/// A sub-threshold robust z-score (see [`Alarm::context`]) that tips a diagnosis between two
/// fault types the alarmed signals alone cannot tell apart. Used where the two types move the
/// feature differently, so a modest move one way is evidence enough: a budget that shrank cuts
/// responses short, ignored stop tokens run them long; a sign flip keeps the rewards' spread,
/// noise widens it (rewards in [0, 1] of a batch spread by at most 0.5, 2 floors of 0.25).
pub const LEAN_Z: f64 = 2.0;

/// Diagnoses `alarm`.
pub fn diagnose(alarm: &Alarm) -> Diagnosis {
    use Dir::{Down, Up};
    use FaultType::*;
    let up = |f: &str| alarm.has(f, Up);
    let down = |f: &str| alarm.has(f, Down);
    // (condition, fault, evidence), most specific first.
    let rules: [(bool, FaultType, &str); 32] = [
        (up("nonfinite"), NonFinite, "non-finite values in the step"),
        (up("sandbox_error_rate"), SandboxFailure, "sandbox errors"),
        (
            up("scorer_silent"),
            SandboxFailure,
            "the scorer went silent: every reward 0 for several steps (a missing test runner?)",
        ),
        (up("timeout_rate"), SandboxTimeout, "sandbox timeouts"),
        (up("lr"), LrTooHigh, "the learning rate jumped up"),
        (down("lr"), LrZero, "the learning rate dropped (to zero)"),
        (up("kl_coef"), KlHuge, "the KL coefficient jumped up"),
        (
            up("clip_eps"),
            ClipOff,
            "the clip range jumped up (clipping off)",
        ),
        (
            down("temperature"),
            EntropyCollapse,
            "the sampling temperature dropped",
        ),
        (
            down("prompt_unique_frac") || down("prompt_dup_chance"),
            DuplicatedPrompts,
            "few distinct prompts in the batch",
        ),
        (
            down("reward_min") && up("reward_max"),
            RewardNoise,
            "rewards beyond both ends of their range",
        ),
        (
            down("reward_min") && alarm.leans("reward_std", Up, LEAN_Z),
            RewardNoise,
            "rewards below their range and spread wider than any in-range batch (noise)",
        ),
        (
            up("reward_max"),
            RewardScale,
            "rewards above their range (scale blow-up)",
        ),
        (
            down("reward_min"),
            RewardSignFlip,
            "rewards below their range (sign flip)",
        ),
        (
            up("audit_permuted"),
            ShuffledPairs,
            "the rewards are the audit's own values paired with other responses",
        ),
        (
            up("audit_offgrid"),
            RewardNoise,
            "rewards off their audit by amounts no verdict gives (noise)",
        ),
        (
            up("audit_up") && up("audit_down"),
            FlakyTests,
            "verdicts off their audit both ways (flaky tests)",
        ),
        (
            up("audit_up"),
            RewardLenient,
            "answers the audit finds wrong paid in full (a lenient, hackable reward)",
        ),
        (
            up("audit_down"),
            RewardStaleTruth,
            "answers the audit pays scored lower (judged against other targets)",
        ),
        (
            up("answer_disagree"),
            FlakyTests,
            "the same answer to the same prompt scored differently (flaky tests)",
        ),
        (up("empty_rate"), EmptyOutputs, "empty responses"),
        (
            up("trunc_rate") && alarm.leans("response_len", Down, LEAN_Z),
            LengthCollapse,
            "responses cut at a token budget that shrank (shorter and truncated)",
        ),
        (
            up("trunc_rate"),
            LengthExplosion,
            "responses cut at the token budget",
        ),
        (
            up("repetition") || down("unique_ratio"),
            RepetitionLoop,
            "repetitive responses",
        ),
        (
            down("response_len"),
            LengthCollapse,
            "responses collapsed in length",
        ),
        (
            up("response_len"),
            LengthExplosion,
            "responses grew in length",
        ),
        (
            up("logprob_mismatch"),
            StaleLogprobs,
            "old log-probabilities disagree with the policy",
        ),
        (
            down("adv_reward_corr"),
            AdvantageSignFlip,
            "advantages anti-correlated with rewards",
        ),
        (
            up("invented_rate") && down("reward_mean"),
            RewardStaleTruth,
            "answers judged against targets their prompt never showed",
        ),
        (
            up("reward_mean") && up("zero_std_frac"),
            RewardLenient,
            "reward jumped and groups turned uniform (hackable reward)",
        ),
        (
            down("zero_std_frac") && up("reward_mean"),
            FlakyTests,
            "identical answers score differently (flaky tests)",
        ),
        (
            down("entropy") || down("surprisal"),
            EntropyCollapse,
            "entropy collapsed",
        ),
    ];
    if let Some((_, f, ev)) = rules.iter().find(|r| r.0) {
        return Diagnosis {
            fault: Some(*f),
            family: Some(f.family()),
            evidence: ev.to_string(),
        };
    }
    let second: [(bool, FaultType, &str); 8] = [
        (
            down("zero_std_frac") || up("reward_std"),
            ShuffledPairs,
            "rewards no longer follow the groups' answers",
        ),
        (up("reward_mean"), RewardLenient, "reward jumped"),
        (down("reward_mean"), RewardStaleTruth, "reward fell"),
        (
            down("clip_frac") && up("max_ratio"),
            ClipOff,
            "ratios grew while nothing was clipped",
        ),
        (
            down("kl") || down("grad_norm") && !up("kl"),
            KlHuge,
            "the policy stopped moving away from the reference",
        ),
        (
            up("clip_frac") || up("max_ratio") || up("approx_kl"),
            StaleLogprobs,
            "ratios far from 1 before the update",
        ),
        (
            up("grad_norm") || up("kl") || up("kl_k3"),
            LrTooHigh,
            "updates too large",
        ),
        (
            up("entropy") || up("surprisal"),
            LengthExplosion,
            "entropy rose",
        ),
    ];
    if let Some((_, f, ev)) = second.iter().find(|r| r.0) {
        return Diagnosis {
            fault: Some(*f),
            family: Some(f.family()),
            evidence: ev.to_string(),
        };
    }
    let top = alarm.signals.first();
    Diagnosis {
        fault: None,
        family: top.and_then(|s| feature_family(&s.feature)),
        evidence: top
            .map(|s| format!("unexplained anomaly of {} ({:?})", s.feature, s.dir))
            .unwrap_or_else(|| "no signal".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rft::monitor::detect::{Rule, Signal};

    fn alarm(sigs: &[(&str, Dir)]) -> Alarm {
        Alarm::new(
            5,
            sigs.iter()
                .map(|(f, d)| Signal {
                    feature: f.to_string(),
                    dir: *d,
                    score: 10.0,
                    rule: Rule::RobustZ,
                })
                .collect(),
        )
    }

    #[test]
    fn each_signature_maps_to_its_fault() {
        use Dir::*;
        use FaultType::*;
        let cases: Vec<(Vec<(&str, Dir)>, FaultType)> = vec![
            (vec![("nonfinite", Up), ("reward_mean", Down)], NonFinite),
            (vec![("sandbox_error_rate", Up)], SandboxFailure),
            (vec![("timeout_rate", Up)], SandboxTimeout),
            (vec![("lr", Up), ("kl", Up)], LrTooHigh),
            (vec![("lr", Down)], LrZero),
            (vec![("kl_coef", Up)], KlHuge),
            (vec![("clip_eps", Up)], ClipOff),
            (
                vec![("temperature", Down), ("entropy", Down)],
                EntropyCollapse,
            ),
            (vec![("prompt_unique_frac", Down)], DuplicatedPrompts),
            (vec![("reward_min", Down), ("reward_max", Up)], RewardNoise),
            (vec![("reward_max", Up)], RewardScale),
            (vec![("reward_min", Down)], RewardSignFlip),
            (
                vec![("empty_rate", Up), ("response_len", Down)],
                EmptyOutputs,
            ),
            (vec![("trunc_rate", Up)], LengthExplosion),
            (vec![("repetition", Up)], RepetitionLoop),
            (vec![("response_len", Down)], LengthCollapse),
            (vec![("logprob_mismatch", Up)], StaleLogprobs),
            (vec![("adv_reward_corr", Down)], AdvantageSignFlip),
            (
                vec![("invented_rate", Up), ("reward_mean", Down)],
                RewardStaleTruth,
            ),
            (
                vec![("reward_mean", Up), ("zero_std_frac", Up)],
                RewardLenient,
            ),
            (
                vec![("zero_std_frac", Down), ("reward_mean", Up)],
                FlakyTests,
            ),
            (vec![("zero_std_frac", Down)], ShuffledPairs),
            (vec![("entropy", Down)], EntropyCollapse),
            (vec![("prompt_dup_chance", Down)], DuplicatedPrompts),
            (
                vec![
                    ("audit_gap", Up),
                    ("audit_up", Up),
                    ("audit_down", Up),
                    ("audit_permuted", Up),
                ],
                ShuffledPairs,
            ),
            (
                vec![("audit_gap", Up), ("audit_up", Up), ("audit_offgrid", Up)],
                RewardNoise,
            ),
            (
                vec![("audit_gap", Up), ("audit_up", Up), ("audit_down", Up)],
                FlakyTests,
            ),
            (vec![("audit_gap", Up), ("audit_up", Up)], RewardLenient),
            (
                vec![("audit_gap", Up), ("audit_down", Up)],
                RewardStaleTruth,
            ),
        ];
        for (sigs, want) in cases {
            let d = diagnose(&alarm(&sigs));
            assert_eq!(d.fault, Some(want), "{sigs:?}: {}", d.evidence);
            assert_eq!(d.family, Some(want.family()));
        }
        let d = diagnose(&alarm(&[("some_custom_metric", Up)]));
        assert_eq!(d.fault, None);
    }

    #[test]
    fn truncation_is_told_apart_by_the_length_under_the_threshold() {
        let with_len = |z: f64| {
            let mut a = alarm(&[("trunc_rate", Dir::Up), ("entropy", Dir::Down)]);
            a.context.insert("response_len".into(), z);
            a.context.insert("trunc_rate".into(), 6.7);
            diagnose(&a).fault
        };
        assert_eq!(with_len(-4.5), Some(FaultType::LengthCollapse));
        assert_eq!(with_len(3.0), Some(FaultType::LengthExplosion));
        // A healthy wobble of the length does not tip it.
        assert_eq!(with_len(-1.0), Some(FaultType::LengthExplosion));
        let plain = diagnose(&alarm(&[("trunc_rate", Dir::Up)]));
        assert_eq!(plain.fault, Some(FaultType::LengthExplosion));
    }

    #[test]
    fn rewards_below_range_are_noise_when_they_spread_and_a_flip_when_they_do_not() {
        let with_std = |z: f64| {
            let mut a = alarm(&[("reward_min", Dir::Down)]);
            a.context.insert("reward_std".into(), z);
            diagnose(&a).fault
        };
        // Noise: spread 1.09 against a baseline of 0 over the floor 0.25.
        assert_eq!(with_std(4.4), Some(FaultType::RewardNoise));
        // A flip keeps the spread of an in-range batch (at most 0.5 / 0.25 = 2).
        assert_eq!(with_std(2.0), Some(FaultType::RewardSignFlip));
        assert_eq!(with_std(0.0), Some(FaultType::RewardSignFlip));
    }
}
