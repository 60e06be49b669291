//! Estimators of KL(policy || reference) from samples of the policy (Schulman's k1, k2, k3),
//! per token, with their derivatives with respect to the policy log-probability.

use serde::{Deserialize, Serialize};

/// Which estimator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KlEstimator {
    /// `log p - log q` (unbiased, high variance, can be negative).
    K1,
    /// `(log p - log q)^2 / 2` (biased, low variance).
    K2,
    /// `exp(log q - log p) - 1 - (log q - log p)` (unbiased, non-negative).
    K3,
}

impl KlEstimator {
    /// The estimate for one token from the policy and reference log-probabilities.
    pub fn value(self, logp: f32, ref_logp: f32) -> f32 {
        let d = logp - ref_logp;
        match self {
            KlEstimator::K1 => d,
            KlEstimator::K2 => 0.5 * d * d,
            KlEstimator::K3 => (-d).exp() - 1.0 + d,
        }
    }

    /// Derivative of [`Self::value`] with respect to `logp`.
    pub fn grad(self, logp: f32, ref_logp: f32) -> f32 {
        let d = logp - ref_logp;
        match self {
            KlEstimator::K1 => 1.0,
            KlEstimator::K2 => d,
            KlEstimator::K3 => 1.0 - (-d).exp(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimators_at_equal_distributions_are_zero_and_k3_is_nonnegative() {
        for k in [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3] {
            assert_eq!(k.value(-1.3, -1.3), 0.0);
        }
        for d in [-3.0f32, -0.5, 0.2, 4.0] {
            assert!(KlEstimator::K3.value(d, 0.0) >= 0.0);
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        for k in [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3] {
            for &(p, q) in &[(-1.0f32, -2.0f32), (-0.3, -0.1), (-4.0, -1.0)] {
                let h = 1e-3;
                let fd = (k.value(p + h, q) - k.value(p - h, q)) / (2.0 * h);
                assert!(
                    (fd - k.grad(p, q)).abs() < 1e-2 * (1.0 + fd.abs()),
                    "{k:?} {p} {q}"
                );
            }
        }
    }

    #[test]
    fn k1_and_k3_are_unbiased_for_a_known_pair_of_distributions() {
        // p = (0.7, 0.3), q = (0.4, 0.6): KL(p||q) = sum p log(p/q).
        let p = [0.7f32, 0.3];
        let q = [0.4f32, 0.6];
        let kl: f32 = p.iter().zip(&q).map(|(a, b)| a * (a / b).ln()).sum();
        for k in [KlEstimator::K1, KlEstimator::K3] {
            let e: f32 = p
                .iter()
                .zip(&q)
                .map(|(a, b)| a * k.value(a.ln(), b.ln()))
                .sum();
            assert!((e - kl).abs() < 1e-5, "{k:?}: {e} vs {kl}");
        }
    }
}
