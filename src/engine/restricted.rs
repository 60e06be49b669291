//! Host reference of log-probabilities under a distribution restricted to an allowed set of
//! tokens (grammar-constrained RL rows, see `train::restrict`): the default of
//! [`crate::engine::Backend::masked_logprobs`] / [`crate::engine::Backend::masked_dlogits`] and
//! the reference the device kernels (`kernels/restrict.cu`) are checked against. A row's allowed
//! set is a bitset (bit `i % 32` of word `i / 32`), as in grammar-masked sampling.

use crate::engine::error::{EngineError, Result};
use crate::engine::sampling::mask_bit;

/// `logsumexp` of `row` over the ids in `mask`.
pub fn set_lse(row: &[f32], mask: &[u32]) -> f64 {
    let allowed = || row.iter().enumerate().filter(|&(i, _)| mask_bit(mask, i));
    let m = allowed().fold(f64::NEG_INFINITY, |a, (_, &v)| a.max(v as f64));
    let s: f64 = allowed().map(|(_, &v)| (v as f64 - m).exp()).sum();
    m + s.ln()
}

/// Entropy of `row`'s distribution restricted to `mask`, given its [`set_lse`].
pub fn set_entropy(row: &[f32], mask: &[u32], lse: f64) -> f64 {
    row.iter()
        .enumerate()
        .filter(|&(i, _)| mask_bit(mask, i))
        .map(|(_, &x)| {
            let lp = x as f64 - lse;
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
    for (b, (&x, d)) in row.iter().zip(dst.iter_mut()).enumerate() {
        if mask_bit(mask, b) {
            let lp = x as f64 - lse;
            let p = lp.exp();
            *d = (-(g as f64) * p - g_ent as f64 * p * (lp + entropy)) as f32;
        }
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
