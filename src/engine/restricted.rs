//! Host reference of log-probabilities under a distribution restricted to an allowed set of
//! tokens (grammar-constrained RL rows, see `train::restrict`): the default of
//! [`crate::engine::Backend::masked_logprobs`] / [`crate::engine::Backend::masked_dlogits`] and
//! the reference the device kernels (`kernels/restrict.cu`) are checked against. A row's allowed
//! set is a bitset (bit `i % 32` of word `i / 32`), as in grammar-masked sampling; words a
//! short mask lacks are 0. An allowed token whose logit is -inf has probability 0: it adds
//! nothing to the sums and gets a zero gradient (as in the kernels), never `-inf * 0 = NaN`.
//! A row with no finite allowed logit has `lse = -inf`, entropy 0 and the log-probability
//! `logit[target] + inf` (+inf, or NaN for a -inf target).

use crate::engine::error::{EngineError, Result};
use crate::engine::sampling::mask_bit;

/// The allowed logits of `row` with probability above 0: ids in `mask`, logit not -inf.
fn allowed<'a>(row: &'a [f32], mask: &'a [u32]) -> impl Iterator<Item = (usize, f64)> + 'a {
    row.iter()
        .enumerate()
        .filter(move |&(i, &x)| x != f32::NEG_INFINITY && mask_bit(mask, i))
        .map(|(i, &x)| (i, x as f64))
}

/// `logsumexp` of `row` over the ids in `mask` (-inf when no allowed logit is finite).
pub fn set_lse(row: &[f32], mask: &[u32]) -> f64 {
    let m = allowed(row, mask).fold(f64::NEG_INFINITY, |a, (_, v)| a.max(v));
    if m == f64::NEG_INFINITY {
        return m;
    }
    let s: f64 = allowed(row, mask).map(|(_, v)| (v - m).exp()).sum();
    m + s.ln()
}

/// Entropy of `row`'s distribution restricted to `mask`, given its [`set_lse`].
pub fn set_entropy(row: &[f32], mask: &[u32], lse: f64) -> f64 {
    allowed(row, mask)
        .map(|(_, x)| {
            let lp = x - lse;
            -lp * lp.exp()
        })
        .sum()
}

/// The restricted log-probability of `target` and the restricted entropy of one row.
pub fn row_logprob(row: &[f32], mask: &[u32], target: u32) -> (f32, f32) {
    let lse = set_lse(row, mask);
    let lp = row[target as usize] as f64 - lse;
    (lp as f32, set_entropy(row, mask, lse) as f32)
}

/// `dL/dlogits` of one row into `dst` (zeros expected), for `dL/dlogp_c = g` and
/// `dL/dH_c = g_ent`: `g (onehot - pi_c) - g_ent pi_c (log pi_c + H_c)` on the allowed set, 0
/// elsewhere.
pub fn row_dlogits(row: &[f32], mask: &[u32], target: u32, g: f32, g_ent: f32, dst: &mut [f32]) {
    if g == 0.0 && g_ent == 0.0 {
        return;
    }
    let lse = set_lse(row, mask);
    // The entropy costs a pass over the vocabulary: only when its gradient is wanted.
    let entropy = if g_ent == 0.0 {
        0.0
    } else {
        set_entropy(row, mask, lse)
    };
    for (b, x) in allowed(row, mask) {
        let lp = x - lse;
        let p = lp.exp();
        dst[b] = (-(g as f64) * p - g_ent as f64 * p * (lp + entropy)) as f32;
    }
    dst[target as usize] += g;
}

/// Checks `c` rows of `v` logits against their masks, targets and (when given) gradient
/// coefficients.
pub fn check_rows(
    op: &'static str,
    (c, v): (usize, usize),
    masks: &[&[u32]],
    targets: &[u32],
    grads: Option<(&[f32], &[f32])>,
) -> Result<()> {
    let err = |detail: String| Err(EngineError::Shape { op, detail });
    if masks.len() != c || targets.len() != c {
        return err(format!(
            "{c} rows but {} masks and {} targets",
            masks.len(),
            targets.len()
        ));
    }
    if let Some((g, ge)) = grads {
        if g.len() != c || ge.len() != c {
            return err(format!(
                "{c} rows but {} log-probability and {} entropy gradients",
                g.len(),
                ge.len()
            ));
        }
    }
    if let Some(t) = targets.iter().find(|&&t| t as usize >= v) {
        return err(format!("target {t} outside a vocabulary of {v}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NI: f32 = f32::NEG_INFINITY;

    #[test]
    fn an_allowed_minus_infinity_logit_has_probability_zero_not_nan() {
        let mask = [0b1111u32];
        let with = [1.0, NI, 0.5, -2.0];
        let without = [1.0, 0.5, -2.0];
        let (lp, h) = row_logprob(&with, &mask, 2);
        let (lp0, h0) = row_logprob(&without, &[0b111], 1);
        assert_eq!((lp, h), (lp0, h0));
        assert!(h > 0.0);
        let mut d = [0.0f32; 4];
        row_dlogits(&with, &mask, 2, 0.7, -0.3, &mut d);
        let mut d0 = [0.0f32; 3];
        row_dlogits(&without, &[0b111], 1, 0.7, -0.3, &mut d0);
        assert_eq!(d, [d0[0], 0.0, d0[1], d0[2]]);
    }

    #[test]
    fn a_row_without_a_finite_allowed_logit_has_lse_minus_infinity_and_entropy_zero() {
        let row = [NI, 3.0, NI];
        let mask = [0b101u32];
        assert_eq!(set_lse(&row, &mask), f64::NEG_INFINITY);
        let (lp, h) = row_logprob(&row, &mask, 1);
        assert_eq!((lp, h), (f32::INFINITY, 0.0));
        assert!(row_logprob(&row, &mask, 0).0.is_nan());
        let mut d = [0.0f32; 3];
        row_dlogits(&row, &mask, 0, 0.5, 0.25, &mut d);
        assert_eq!(d, [0.5, 0.0, 0.0]);
        assert_eq!(row_logprob(&row, &[], 1), (f32::INFINITY, 0.0));
    }

    #[test]
    fn the_gradient_is_the_onehot_minus_the_restricted_softmax_plus_the_entropy_term() {
        let row = [0.3f32, -1.0, 2.0, 0.0, 5.0];
        let mask = [0b01111u32]; // token 4 (the largest logit) is not allowed
        let (g, ge) = (0.8f32, -0.4f32);
        let mut d = [0.0f32; 5];
        row_dlogits(&row, &mask, 1, g, ge, &mut d);
        // Central differences of g * logp + ge * H over the allowed logits.
        let f = |r: &[f32]| {
            let (lp, h) = row_logprob(r, &mask, 1);
            g as f64 * lp as f64 + ge as f64 * h as f64
        };
        for b in 0..5 {
            let (mut up, mut dn) = (row, row);
            up[b] += 1e-2;
            dn[b] -= 1e-2;
            let fd = (f(&up) - f(&dn)) / 2e-2;
            assert!((d[b] as f64 - fd).abs() < 1e-3, "{b}: {} vs {fd}", d[b]);
        }
        assert_eq!(d[4], 0.0);
    }
}
