//! Remediation: the action a diagnosis calls for, closed loop (the supervisor applies it, watches
//! the next steps, escalates when the alarm comes back, and stops when nothing safe remains).

use serde::{Deserialize, Serialize};

use super::diagnose::Diagnosis;
use super::taxonomy::FaultType;

/// A remediation action.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Restore the last healthy weights and settings, reset the optimizer's moments, and scale
    /// the learning rate by `lr_factor`.
    Rollback {
        /// Learning-rate factor (1: the healthy rate).
        lr_factor: f32,
    },
    /// Roll back, halve the learning rate and multiply the KL coefficient by `factor`.
    RaiseKl {
        /// KL coefficient factor.
        factor: f32,
    },
    /// Roll back, restore the healthy temperature and add an entropy bonus.
    RestoreEntropy {
        /// Entropy bonus added to the loss.
        entropy_bonus: f32,
    },
    /// Keep the prompts that dominate the batch out of later steps.
    QuarantinePrompts {
        /// Prompt indices quarantined.
        prompts: Vec<usize>,
    },
    /// Restart the sandbox and rollout workers.
    RestartWorkers,
    /// Stop the run (at its last healthy weights) with a report.
    Stop {
        /// Why.
        reason: String,
    },
}

impl Action {
    /// A short description (reports).
    pub fn describe(&self) -> String {
        match self {
            Action::Rollback { lr_factor } => {
                format!("roll back to the last healthy step, learning rate x{lr_factor}")
            }
            Action::RaiseKl { factor } => {
                format!("roll back, learning rate x0.5, KL coefficient x{factor}")
            }
            Action::RestoreEntropy { entropy_bonus } => {
                format!("roll back, restore the temperature, entropy bonus +{entropy_bonus}")
            }
            Action::QuarantinePrompts { prompts } => {
                format!("quarantine prompts {prompts:?}")
            }
            Action::RestartWorkers => "restart sandbox and rollout workers".into(),
            Action::Stop { reason } => format!("stop: {reason}"),
        }
    }
}

/// The first action for a diagnosis. `dominant_prompt` is the prompt filling most of the batch
/// (for quarantines). Faults no action can fix, and unexplained anomalies seen again after a
/// remediation (`attempt > 0`), stop the run.
pub fn plan(d: &Diagnosis, attempt: usize, dominant_prompt: Option<usize>) -> Action {
    use FaultType::*;
    let stop = |why: &str| Action::Stop {
        reason: why.to_string(),
    };
    if attempt >= 2 {
        return stop("the anomaly came back after two remediations");
    }
    let Some(f) = d.fault else {
        return if attempt == 0 {
            Action::Rollback { lr_factor: 0.5 }
        } else {
            stop("an unexplained anomaly persists after a rollback")
        };
    };
    match f {
        LrTooHigh | NonFinite if attempt == 0 => Action::Rollback { lr_factor: 0.5 },
        LrTooHigh | NonFinite => Action::RaiseKl { factor: 2.0 },
        LrZero | ClipOff | LengthCollapse | LengthExplosion => Action::Rollback { lr_factor: 1.0 },
        KlHuge => Action::Rollback { lr_factor: 1.0 },
        EntropyCollapse => Action::RestoreEntropy {
            entropy_bonus: 0.01,
        },
        SandboxFailure | SandboxTimeout | EmptyOutputs => {
            if attempt == 0 {
                Action::RestartWorkers
            } else {
                stop("workers keep failing after a restart")
            }
        }
        DuplicatedPrompts => match dominant_prompt {
            Some(p) => Action::QuarantinePrompts { prompts: vec![p] },
            None => stop("duplicated prompts, none identified"),
        },
        RewardSignFlip | RewardNoise | RewardScale | RewardLenient | RewardStaleTruth => stop(
            "the reward function is broken; fix it and restart from the last healthy checkpoint",
        ),
        AdvantageSignFlip => stop("advantages are anti-correlated with rewards (an objective bug)"),
        StaleLogprobs | ShuffledPairs => stop(
            "credit assignment is broken (log-probabilities or rewards reach the wrong tokens)",
        ),
        FlakyTests => stop("the tests are flaky: the reward is noise"),
        RepetitionLoop => stop("responses loop; the sampler or the policy is degenerate"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diag(f: Option<FaultType>) -> Diagnosis {
        Diagnosis {
            fault: f,
            family: f.map(|f| f.family()),
            evidence: String::new(),
        }
    }

    #[test]
    fn recoverable_faults_get_a_remedy_and_the_rest_a_stop() {
        for f in FaultType::ALL {
            let a = plan(&diag(Some(f)), 0, Some(3));
            assert_eq!(
                !matches!(a, Action::Stop { .. }),
                f.recoverable(),
                "{f:?}: {a:?}"
            );
        }
        assert_eq!(
            plan(&diag(Some(FaultType::LrTooHigh)), 0, None),
            Action::Rollback { lr_factor: 0.5 }
        );
        assert_eq!(
            plan(&diag(Some(FaultType::DuplicatedPrompts)), 0, Some(7)),
            Action::QuarantinePrompts { prompts: vec![7] }
        );
        assert_eq!(
            plan(&diag(Some(FaultType::SandboxFailure)), 0, None),
            Action::RestartWorkers
        );
        assert!(matches!(
            plan(&diag(Some(FaultType::SandboxFailure)), 1, None),
            Action::Stop { .. }
        ));
        assert!(matches!(
            plan(&diag(Some(FaultType::EntropyCollapse)), 0, None),
            Action::RestoreEntropy { .. }
        ));
        assert_eq!(
            plan(&diag(None), 0, None),
            Action::Rollback { lr_factor: 0.5 }
        );
        assert!(matches!(plan(&diag(None), 1, None), Action::Stop { .. }));
        assert_eq!(
            plan(&diag(Some(FaultType::LrTooHigh)), 1, None),
            Action::RaiseKl { factor: 2.0 }
        );
        assert!(matches!(
            plan(&diag(Some(FaultType::LrTooHigh)), 2, None),
            Action::Stop { .. }
        ));
    }
}
