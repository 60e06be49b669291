//! The sampler/trainer mismatch of stage 2. Rollouts are sampled by the generation engine and
//! trained on by the training forward; on a GPU (bf16 decode kernels against training kernels)
//! the two do not give identical log-probabilities, so the "old" policy of the PPO ratio is not
//! the distribution the tokens came from. With re-scoring on, the old log-probabilities are those
//! of the training forward, the per-token gap to the sampler's is logged (`rollout_probs_diff`,
//! on probabilities) and corrected by truncated importance sampling: each token's advantage is
//! weighted by `min(pi_train_old / pi_sampler, tis_cap)` (Yao et al., "off-policy RL from a
//! mismatched sampler").

use serde::{Deserialize, Serialize};

/// Whether stage 2 re-scores the sampler's log-probabilities with the training forward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rescore {
    /// On where the sampler and the trainer differ (a GPU backend), off on the CPU, where
    /// both are the same kernels and the numbers agree.
    #[default]
    Auto,
    /// Always re-score (one more forward over the rollouts per step).
    On,
    /// Never: the sampler's log-probabilities are the old ones.
    Off,
}

impl Rescore {
    /// Parses `auto`, `on` or `off`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            other => Err(format!("rescore {other:?}: expected auto, on or off")),
        }
    }

    /// Whether to re-score on a backend named `backend_name` (see `Backend::name`).
    pub fn enabled(self, backend_name: &str) -> bool {
        match self {
            Self::On => true,
            Self::Off => false,
            Self::Auto => !backend_name.starts_with("cpu"),
        }
    }
}

/// The gap between the sampler's and the trainer's probabilities of the sampled tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProbsDiff {
    /// Mean `|p_sampler - p_trainer|` over tokens.
    pub mean: f64,
    /// Largest `|p_sampler - p_trainer|`.
    pub max: f64,
    /// Tokens compared.
    pub tokens: usize,
}

/// The old log-probabilities a step trains against, with the mismatch it corrected.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reconciled {
    /// Old log-probabilities per sequence (the trainer's when re-scored, else the sampler's).
    pub old: Vec<Vec<f32>>,
    /// Per token: the truncated importance weight (1 everywhere without re-scoring).
    pub weights: Vec<Vec<f32>>,
    /// The measured gap, when re-scored.
    pub diff: Option<ProbsDiff>,
}

/// Compares the sampler's log-probabilities with the trainer's (same shapes) and picks the old
/// ones: the trainer's with truncated importance weights `min(exp(trainer - sampler), cap)` when
/// `trainer` is given, else the sampler's with unit weights. Errors when shapes differ or the cap
/// is not positive.
pub fn reconcile(
    sampler: Vec<Vec<f32>>,
    trainer: Option<Vec<Vec<f32>>>,
    cap: f32,
) -> Result<Reconciled, String> {
    if !(cap.is_finite() && cap > 0.0) {
        return Err(format!("stage2.tis_cap must be positive, got {cap}"));
    }
    let Some(trainer) = trainer else {
        let weights = sampler.iter().map(|s| vec![1.0; s.len()]).collect();
        return Ok(Reconciled {
            old: sampler,
            weights,
            diff: None,
        });
    };
    if trainer.len() != sampler.len() {
        return Err(format!(
            "re-scored {} sequences, sampled {}",
            trainer.len(),
            sampler.len()
        ));
    }
    let (mut sum, mut max, mut n) = (0.0f64, 0.0f64, 0usize);
    let mut weights = Vec::with_capacity(sampler.len());
    for (i, (s, t)) in sampler.iter().zip(&trainer).enumerate() {
        if s.len() != t.len() {
            return Err(format!(
                "sequence {i}: {} re-scored tokens, {} sampled",
                t.len(),
                s.len()
            ));
        }
        let mut w = Vec::with_capacity(s.len());
        for (&ls, &lt) in s.iter().zip(t) {
            let d = ((ls as f64).exp() - (lt as f64).exp()).abs();
            sum += d;
            max = max.max(d);
            n += 1;
            w.push(((lt - ls).exp()).min(cap));
        }
        weights.push(w);
    }
    Ok(Reconciled {
        old: trainer,
        weights,
        diff: Some(ProbsDiff {
            mean: sum / n.max(1) as f64,
            max,
            tokens: n,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescore_parses_and_auto_is_off_only_on_the_cpu() {
        assert_eq!(Rescore::parse("ON"), Ok(Rescore::On));
        assert!(Rescore::parse("sometimes").is_err());
        assert!(!Rescore::Auto.enabled("cpu (2 threads)"));
        assert!(Rescore::Auto.enabled("cuda:0 (NVIDIA H200)"));
        assert!(Rescore::On.enabled("cpu (2 threads)"));
        assert!(!Rescore::Off.enabled("cuda:0"));
    }

    #[test]
    fn a_planted_mismatch_is_measured_and_its_weights_are_truncated() {
        let trainer = vec![vec![-0.1f32, -2.0, -0.7], vec![-1.0]];
        // Planted: the sampler saw token 1 of sequence 0 as far less likely (ratio e^2 > cap),
        // and token 0 of sequence 1 as more likely (ratio e^-0.5).
        let mut sampler = trainer.clone();
        sampler[0][1] = -4.0;
        sampler[1][0] = -0.5;
        let r = reconcile(sampler.clone(), Some(trainer.clone()), 2.0).unwrap();
        assert_eq!(r.old, trainer);
        assert_eq!(r.weights[0][0], 1.0);
        assert_eq!(r.weights[0][1], 2.0, "capped");
        assert!((r.weights[1][0] - (-0.5f32).exp()).abs() < 1e-6);
        let d = r.diff.unwrap();
        let big = (-0.5f64).exp() - (-1.0f64).exp();
        assert!((d.max - big).abs() < 1e-6, "{d:?}");
        let small = (-2.0f64).exp() - (-4.0f64).exp();
        assert!((d.mean - (small + big) / 4.0).abs() < 1e-6, "{d:?}");
        assert_eq!(d.tokens, 4);
        // No mismatch: zero gap, unit weights.
        let same = reconcile(trainer.clone(), Some(trainer.clone()), 2.0).unwrap();
        assert_eq!(same.diff.unwrap().max, 0.0);
        assert!(same.weights.iter().flatten().all(|&w| w == 1.0));
    }

    #[test]
    fn without_rescoring_the_sampler_is_the_old_policy_and_bad_input_is_refused() {
        let s = vec![vec![-0.3f32, -0.2]];
        let r = reconcile(s.clone(), None, 2.0).unwrap();
        assert_eq!((r.old, r.diff), (s.clone(), None));
        assert_eq!(r.weights, vec![vec![1.0, 1.0]]);
        assert!(reconcile(s.clone(), None, 0.0).is_err());
        assert!(reconcile(s.clone(), Some(vec![vec![-0.3]]), 2.0).is_err());
        assert!(reconcile(s, Some(vec![]), 2.0).is_err());
    }
}
