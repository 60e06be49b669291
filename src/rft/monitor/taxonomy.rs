//! The fault taxonomy of RFT-FM: five families and the fault types sorft detects, diagnoses,
//! injects (faultbench) and remediates. See `docs/faultbench/README.md` for the table.

use serde::{Deserialize, Serialize};

/// A family of RL fine-tuning faults (the RFT-FaultBench codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum FaultFamily {
    /// Reward faults: the reward no longer measures what it should.
    RF,
    /// Policy-gradient / optimisation faults: the update is wrong or wrongly sized.
    PG,
    /// Output degeneration: what the policy writes collapses.
    OD,
    /// Credit assignment / data faults: rewards, log-probs or prompts reach the wrong tokens.
    CA,
    /// Tool / environment faults: the sandbox or test runner fails.
    TE,
}

impl FaultFamily {
    /// All families in table order.
    pub const ALL: [FaultFamily; 5] = [Self::RF, Self::PG, Self::OD, Self::CA, Self::TE];

    /// The two-letter code.
    pub fn code(self) -> &'static str {
        match self {
            Self::RF => "RF",
            Self::PG => "PG",
            Self::OD => "OD",
            Self::CA => "CA",
            Self::TE => "TE",
        }
    }
}

/// One fault type. Each belongs to one family ([`FaultType::family`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultType {
    /// RF: the reward's sign is flipped.
    RewardSignFlip,
    /// RF: large zero-mean noise is added to every reward.
    RewardNoise,
    /// RF: the reward is multiplied by a large factor (scale blow-up).
    RewardScale,
    /// RF: a lenient, hackable reward (any non-empty answer scores: SoRFT's "hit score" done wrong).
    RewardLenient,
    /// RF: rewards are computed against another instance's ground truth (stale or mismatched truth).
    RewardStaleTruth,
    /// PG: the learning rate is far too high.
    LrTooHigh,
    /// PG: the learning rate is zero (nothing learns).
    LrZero,
    /// PG: the advantages' sign is flipped (the policy is pushed away from good answers).
    AdvantageSignFlip,
    /// PG: the ratio clipping is off.
    ClipOff,
    /// PG: the KL coefficient is huge (the policy is pinned to the reference).
    KlHuge,
    /// PG: non-finite values (NaN / inf) reach the loss.
    NonFinite,
    /// OD: the sampling distribution collapses (entropy collapse).
    EntropyCollapse,
    /// OD: responses degenerate into repetition loops.
    RepetitionLoop,
    /// OD: responses collapse to a few tokens.
    LengthCollapse,
    /// OD: responses never stop (length explosion, truncation).
    LengthExplosion,
    /// OD: many responses are empty.
    EmptyOutputs,
    /// CA: the old log-probabilities are stale (taken from another policy than the sampler's).
    StaleLogprobs,
    /// CA: rewards are attached to the wrong responses (shuffled prompt/answer pairs).
    ShuffledPairs,
    /// CA: the batch is filled with duplicates of one prompt.
    DuplicatedPrompts,
    /// TE: sandbox workers fail (errors instead of test results).
    SandboxFailure,
    /// TE: test runs time out.
    SandboxTimeout,
    /// TE: tests are flaky (the same answer passes or fails at random).
    FlakyTests,
}

impl FaultType {
    /// Every fault type, in table order.
    pub const ALL: [FaultType; 22] = [
        Self::RewardSignFlip,
        Self::RewardNoise,
        Self::RewardScale,
        Self::RewardLenient,
        Self::RewardStaleTruth,
        Self::LrTooHigh,
        Self::LrZero,
        Self::AdvantageSignFlip,
        Self::ClipOff,
        Self::KlHuge,
        Self::NonFinite,
        Self::EntropyCollapse,
        Self::RepetitionLoop,
        Self::LengthCollapse,
        Self::LengthExplosion,
        Self::EmptyOutputs,
        Self::StaleLogprobs,
        Self::ShuffledPairs,
        Self::DuplicatedPrompts,
        Self::SandboxFailure,
        Self::SandboxTimeout,
        Self::FlakyTests,
    ];

    /// The family.
    pub fn family(self) -> FaultFamily {
        use FaultType::*;
        match self {
            RewardSignFlip | RewardNoise | RewardScale | RewardLenient | RewardStaleTruth => {
                FaultFamily::RF
            }
            LrTooHigh | LrZero | AdvantageSignFlip | ClipOff | KlHuge | NonFinite => {
                FaultFamily::PG
            }
            EntropyCollapse | RepetitionLoop | LengthCollapse | LengthExplosion | EmptyOutputs => {
                FaultFamily::OD
            }
            StaleLogprobs | ShuffledPairs | DuplicatedPrompts => FaultFamily::CA,
            SandboxFailure | SandboxTimeout | FlakyTests => FaultFamily::TE,
        }
    }

    /// The stable snake_case name (records, CLI).
    pub fn name(self) -> &'static str {
        use FaultType::*;
        match self {
            RewardSignFlip => "reward_sign_flip",
            RewardNoise => "reward_noise",
            RewardScale => "reward_scale",
            RewardLenient => "reward_lenient",
            RewardStaleTruth => "reward_stale_truth",
            LrTooHigh => "lr_too_high",
            LrZero => "lr_zero",
            AdvantageSignFlip => "advantage_sign_flip",
            ClipOff => "clip_off",
            KlHuge => "kl_huge",
            NonFinite => "non_finite",
            EntropyCollapse => "entropy_collapse",
            RepetitionLoop => "repetition_loop",
            LengthCollapse => "length_collapse",
            LengthExplosion => "length_explosion",
            EmptyOutputs => "empty_outputs",
            StaleLogprobs => "stale_logprobs",
            ShuffledPairs => "shuffled_pairs",
            DuplicatedPrompts => "duplicated_prompts",
            SandboxFailure => "sandbox_failure",
            SandboxTimeout => "sandbox_timeout",
            FlakyTests => "flaky_tests",
        }
    }

    /// The fault type named `s` ([`FaultType::name`]).
    pub fn parse(s: &str) -> Option<FaultType> {
        Self::ALL.into_iter().find(|f| f.name() == s)
    }

    /// Whether a remediation can bring the run back (the cause is a corrupted setting or a broken
    /// worker that a rollback or a restart undoes); the others end with a stop and a report.
    pub fn recoverable(self) -> bool {
        use FaultType::*;
        matches!(
            self,
            LrTooHigh
                | LrZero
                | ClipOff
                | KlHuge
                | NonFinite
                | EntropyCollapse
                | LengthCollapse
                | LengthExplosion
                | EmptyOutputs
                | DuplicatedPrompts
                | SandboxFailure
                | SandboxTimeout
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_types_and_names_round_trip() {
        assert!(FaultType::ALL.len() >= 16);
        for fam in FaultFamily::ALL {
            assert!(FaultType::ALL.iter().any(|t| t.family() == fam), "{fam:?}");
        }
        for t in FaultType::ALL {
            assert_eq!(FaultType::parse(t.name()), Some(t));
        }
        assert_eq!(FaultType::parse("nope"), None);
    }
}
