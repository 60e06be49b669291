//! The PPO objective per token, named after the paper's terms, with analytic gradients with
//! respect to the policy's token log-probabilities and the value predictions. The training engine
//! back-propagates `dlogp` through the LM head (a weighted log-likelihood) and `dvalue` through
//! the value head. GRPO uses the same clipped surrogate with a KL term in the loss.

use serde::{Deserialize, Serialize};

use crate::rft::kl::KlEstimator;

/// Hyper-parameters of the policy loss.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicyLossConfig {
    /// Clip range of the probability ratio (`1 - eps, 1 + eps`).
    pub clip_eps: f32,
    /// Coefficient of a KL-to-reference term added to the loss (GRPO); 0 for PPO, which puts the
    /// KL penalty in the reward instead.
    pub kl_coef: f32,
    /// Estimator of that KL term.
    pub kl_estimator: KlEstimator,
    /// Dual clip (Ye et al. 2020; veRL's `clip_ratio_c`): with a negative advantage the loss is
    /// capped at `dual_clip * |A|`, so a token whose ratio ran past `dual_clip` gets no
    /// gradient instead of one growing with the ratio. 0: off (must otherwise exceed 1).
    #[serde(default)]
    pub dual_clip: f32,
}

/// The policy loss of a minibatch (token mean) and its gradient.
#[derive(Clone, Debug, Default)]
pub struct PolicyLoss {
    /// Clipped surrogate loss plus the KL term, averaged over tokens.
    pub loss: f64,
    /// d loss / d logp for every token.
    pub dlogp: Vec<f32>,
    /// Fraction of tokens whose ratio was clipped.
    pub clip_frac: f64,
    /// `mean((ratio - 1) - log ratio)`: the approximate KL between old and new policy
    /// ([`approx_kl`] with every token drawn from the old policy).
    pub approx_kl: f64,
    /// Mean KL to the reference (when given).
    pub ref_kl: f64,
}

/// The clipped surrogate `max(-A r, -A clip(r, 1-eps, 1+eps))` averaged over tokens, plus
/// `kl_coef * KL(policy || reference)` when reference log-probs are given.
pub fn policy_loss(
    cfg: &PolicyLossConfig,
    logp: &[f32],
    old_logp: &[f32],
    advantages: &[f32],
    ref_logp: Option<&[f32]>,
) -> PolicyLoss {
    let n = logp.len().min(old_logp.len()).min(advantages.len());
    if n == 0 {
        return PolicyLoss::default();
    }
    let inv_n = 1.0 / n as f64;
    let mut out = PolicyLoss {
        dlogp: vec![0.0; logp.len()],
        ..Default::default()
    };
    let (lo, hi) = (1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps);
    out.approx_kl = approx_kl(&logp[..n], &old_logp[..n], None);
    for t in 0..n {
        let log_ratio = logp[t] - old_logp[t];
        let ratio = log_ratio.exp();
        let a = advantages[t];
        let unclipped = -a * ratio;
        let clipped = -a * ratio.clamp(lo, hi);
        let (mut term, mut grad) = if unclipped >= clipped {
            (unclipped, -a * ratio)
        } else {
            // The clipped branch is active: its derivative is zero outside the clip range.
            let inside = ratio > lo && ratio < hi;
            (clipped, if inside { -a * ratio } else { 0.0 })
        };
        if a < 0.0 && cfg.dual_clip > 1.0 && term > -a * cfg.dual_clip {
            (term, grad) = (-a * cfg.dual_clip, 0.0);
        }
        if (ratio < lo && a < 0.0) || (ratio > hi && a > 0.0) {
            out.clip_frac += inv_n;
        }
        out.loss += term as f64 * inv_n;
        out.dlogp[t] = (grad as f64 * inv_n) as f32;
        if let Some(r) = ref_logp {
            let k = cfg.kl_estimator.value(logp[t], r[t]);
            out.ref_kl += k as f64 * inv_n;
            if cfg.kl_coef != 0.0 {
                out.loss += (cfg.kl_coef * k) as f64 * inv_n;
                out.dlogp[t] += (cfg.kl_coef as f64
                    * cfg.kl_estimator.grad(logp[t], r[t]) as f64
                    * inv_n) as f32;
            }
        }
    }
    out
}

/// The k3 estimate of KL(old || new), `mean(w ((r - 1) - log r))` with `r = exp(logp -
/// old_logp)`, from tokens drawn from a sampling distribution `q`, each weighted by `w = old /
/// q` (`None`: every `w` is 1, the tokens were drawn from the old policy). A token a grammar
/// forced but the update scores under the full distribution was drawn from the renormalised
/// `q`, not from the old policy: unweighted, its ratio (large when the old policy gave it a tiny
/// probability) would count as a KL the policy never moved by.
pub fn approx_kl(logp: &[f32], old_logp: &[f32], weights: Option<&[f32]>) -> f64 {
    let n = logp.len().min(old_logp.len());
    if n == 0 {
        return 0.0;
    }
    let sum: f64 = (0..n)
        .map(|t| {
            let lr = (logp[t] - old_logp[t]) as f64;
            let w = weights.and_then(|w| w.get(t)).map_or(1.0, |&w| w as f64);
            w * (lr.exp() - 1.0 - lr)
        })
        .sum();
    sum / n as f64
}

/// The clipped value loss `0.5 * max((v - R)^2, (v_old + clip(v - v_old, -eps, eps) - R)^2)`
/// averaged over tokens, its gradient with respect to `values`, and the clipped fraction.
pub fn value_loss(
    values: &[f32],
    old_values: &[f32],
    returns: &[f32],
    clip: f32,
) -> (f64, Vec<f32>, f64) {
    let n = values.len().min(old_values.len()).min(returns.len());
    let mut grad = vec![0.0f32; values.len()];
    if n == 0 {
        return (0.0, grad, 0.0);
    }
    let inv_n = 1.0 / n as f64;
    let (mut loss, mut frac) = (0.0f64, 0.0f64);
    for t in 0..n {
        let (v, vo, r) = (values[t], old_values[t], returns[t]);
        let delta = v - vo;
        let vc = vo + delta.clamp(-clip, clip);
        let l1 = (v - r) * (v - r);
        let l2 = (vc - r) * (vc - r);
        if l1 >= l2 {
            loss += 0.5 * l1 as f64 * inv_n;
            grad[t] = ((v - r) as f64 * inv_n) as f32;
        } else {
            frac += inv_n;
            loss += 0.5 * l2 as f64 * inv_n;
            let inside = delta > -clip && delta < clip;
            grad[t] = if inside {
                ((vc - r) as f64 * inv_n) as f32
            } else {
                0.0
            };
        }
    }
    (loss, grad, frac)
}

/// Fraction of the variance of `returns` that `values` explain: `1 - Var(R - V) / Var(R)`.
pub fn explained_variance(values: &[f32], returns: &[f32]) -> f64 {
    let n = values.len().min(returns.len());
    if n < 2 {
        return 0.0;
    }
    let var = |x: &mut dyn Iterator<Item = f64>| {
        let v: Vec<f64> = x.collect();
        let m = v.iter().sum::<f64>() / v.len() as f64;
        v.iter().map(|a| (a - m).powi(2)).sum::<f64>() / v.len() as f64
    };
    let vr = var(&mut returns[..n].iter().map(|&r| r as f64));
    if vr == 0.0 {
        return 0.0;
    }
    let vd = var(&mut (0..n).map(|i| (returns[i] - values[i]) as f64));
    1.0 - vd / vr
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(kl: f32) -> PolicyLossConfig {
        PolicyLossConfig {
            clip_eps: 0.2,
            kl_coef: kl,
            kl_estimator: KlEstimator::K3,
            dual_clip: 0.0,
        }
    }

    #[test]
    fn dual_clip_stops_the_gradient_of_a_runaway_ratio_with_a_negative_advantage() {
        // Ratios e^2.3 ~ 10 and e^0.5 ~ 1.6, advantages -1 and +1 and -1.
        let (old, logp, adv) = (
            [-3.0f32, -3.0, -3.0],
            [-0.7f32, -0.7, -2.5],
            [-1.0f32, 1.0, -1.0],
        );
        let plain = policy_loss(&cfg(0.0), &logp, &old, &adv, None);
        let dual = policy_loss(
            &PolicyLossConfig {
                dual_clip: 3.0,
                ..cfg(0.0)
            },
            &logp,
            &old,
            &adv,
            None,
        );
        // Without it the negative advantage's gradient grows with the ratio (~10 / 3 tokens).
        assert!(plain.dlogp[0] > 3.0, "{:?}", plain.dlogp);
        assert_eq!(dual.dlogp[0], 0.0);
        let r = (2.3f64).exp();
        assert!((plain.loss - dual.loss - (r - 3.0) / 3.0).abs() < 1e-4);
        // A positive advantage, and a ratio under the cap, are untouched.
        assert_eq!(dual.dlogp[1], plain.dlogp[1]);
        assert_eq!(dual.dlogp[2], plain.dlogp[2]);
    }

    #[test]
    fn policy_gradient_matches_finite_differences_everywhere_off_the_kinks() {
        let old = [-1.0f32, -2.0, -0.5, -3.0, -1.5, -0.2];
        // ratios inside, above and below the clip range, positive and negative advantages
        let logp = [-0.9f32, -1.5, -0.9, -3.05, -1.1, -0.45];
        let adv = [1.0f32, 1.0, -1.0, -0.5, -2.0, 0.7];
        let refl = [-1.1f32, -1.8, -0.6, -2.9, -1.4, -0.3];
        for kl in [0.0, 0.1] {
            let c = cfg(kl);
            let base = policy_loss(&c, &logp, &old, &adv, Some(&refl));
            for t in 0..logp.len() {
                let h = 1e-3f32;
                let mut p = logp;
                p[t] += h;
                let up = policy_loss(&c, &p, &old, &adv, Some(&refl)).loss;
                p[t] -= 2.0 * h;
                let down = policy_loss(&c, &p, &old, &adv, Some(&refl)).loss;
                let fd = (up - down) / (2.0 * h as f64);
                assert!(
                    (fd - base.dlogp[t] as f64).abs() < 2e-3,
                    "token {t}, kl {kl}: fd {fd} vs {}",
                    base.dlogp[t]
                );
            }
        }
    }

    #[test]
    fn clipping_zeroes_the_gradient_where_the_ratio_left_the_trust_region() {
        // ratio e^0.5 > 1.2 with positive advantage: clipped, no gradient.
        let l = policy_loss(&cfg(0.0), &[-0.5], &[-1.0], &[1.0], None);
        assert_eq!(l.dlogp[0], 0.0);
        assert!((l.clip_frac - 1.0).abs() < 1e-12);
        assert!((l.loss + 1.2).abs() < 1e-6);
        // same ratio with negative advantage: unclipped branch, gradient -A r / n.
        let l = policy_loss(&cfg(0.0), &[-0.5], &[-1.0], &[-1.0], None);
        assert!((l.dlogp[0] - 0.5f32.exp()).abs() < 1e-6);
        assert_eq!(l.clip_frac, 0.0);
    }

    #[test]
    fn approx_kl_weights_tokens_drawn_off_the_old_policy() {
        // A forced token the old policy gave e^-12 rose to e^-2: ratio e^10.
        let (new, old) = ([-2.0f32, -0.5], [-12.0f32, -0.5]);
        let plain = approx_kl(&new, &old, None);
        assert!(plain > 1e4, "{plain}");
        // Drawn from a grammar whose allowed set held e^-12 of the old policy's mass.
        let w = [(-12.0f32).exp(), 1.0];
        let weighted = approx_kl(&new, &old, Some(&w));
        assert!(weighted > 0.0 && weighted < 1.0, "{weighted}");
        // Weights of 1 are the plain estimate.
        assert_eq!(approx_kl(&new, &old, Some(&[1.0, 1.0])), plain);
    }

    #[test]
    fn approx_kl_is_zero_on_policy() {
        let l = policy_loss(&cfg(0.0), &[-1.0, -2.0], &[-1.0, -2.0], &[1.0, -1.0], None);
        assert!(l.approx_kl.abs() < 1e-12);
        assert!((l.loss - 0.0).abs() < 1e-6); // -(1*1 + -1*1)/2
    }

    #[test]
    fn value_loss_gradient_matches_finite_differences() {
        let v = [0.5f32, 1.5, -0.2, 0.9];
        let vo = [0.4f32, 1.0, 0.3, 0.9];
        let r = [1.0f32, 0.0, -1.0, 0.95];
        let (_, g, _) = value_loss(&v, &vo, &r, 0.2);
        for t in 0..4 {
            let h = 1e-3f32;
            let mut a = v;
            a[t] += h;
            let up = value_loss(&a, &vo, &r, 0.2).0;
            a[t] -= 2.0 * h;
            let down = value_loss(&a, &vo, &r, 0.2).0;
            let fd = (up - down) / (2.0 * h as f64);
            assert!(
                (fd - g[t] as f64).abs() < 1e-3,
                "token {t}: {fd} vs {}",
                g[t]
            );
        }
    }

    #[test]
    fn explained_variance_is_one_for_perfect_values() {
        let r = [1.0f32, 2.0, 3.0];
        assert!((explained_variance(&r, &r) - 1.0).abs() < 1e-12);
        assert!(explained_variance(&[0.0, 0.0, 0.0], &r).abs() < 1e-12);
    }
}
