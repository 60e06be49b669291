//! Token losses over the per-row log-probabilities and entropies of a training forward.
//!
//! The backend computes `logp` and `entropy` in vocabulary-sized chunks of rows; a loss here only
//! turns per-token weights into the coefficients `dL/dlogp` and `dL/dentropy` that
//! [`crate::train::backward::backward`] consumes. The PPO loss of the RL stage does the same with
//! its own coefficients.

use crate::engine::{Backend, HostData, Tensor};
use crate::train::error::{Result, TrainError};
use crate::train::forward::Forward;

/// A loss value and the gradients backward needs.
pub struct LossGrad<B: Backend> {
    /// The loss (already divided by the normaliser).
    pub loss: f64,
    /// Tokens with a non-zero weight.
    pub tokens: usize,
    /// `dL/dlogp` per row `[T]`.
    pub g_logp: Tensor<B>,
    /// `dL/dentropy` per row `[T]`.
    pub g_entropy: Tensor<B>,
}

/// Per-row log-probabilities and entropies of a forward, on the host.
pub fn token_stats<B: Backend>(be: &B, fwd: &Forward<B>) -> Result<(Vec<f32>, Vec<f32>)> {
    Ok((be.to_host_f32(&fwd.logp)?, be.to_host_f32(&fwd.entropy)?))
}

/// Weighted masked cross-entropy `L = -sum_t w_t logp_t / norm`: rows with zero weight (prompt
/// tokens) do not count. `norm` is usually the number of trained tokens of the whole optimizer
/// step, so that micro-batches add up to the mean over the step.
pub fn cross_entropy<B: Backend>(
    be: &B,
    fwd: &Forward<B>,
    weights: &[f32],
    norm: f64,
) -> Result<LossGrad<B>> {
    let logp = be.to_host_f32(&fwd.logp)?;
    if weights.len() != logp.len() {
        return Err(TrainError::Input(format!(
            "{} loss weights for {} rows",
            weights.len(),
            logp.len()
        )));
    }
    if !(norm > 0.0 && norm.is_finite()) {
        return Err(TrainError::Input(format!(
            "loss normaliser {norm} is not positive"
        )));
    }
    let mut loss = 0.0f64;
    let mut tokens = 0;
    let mut g = vec![0.0f32; logp.len()];
    for ((&w, &lp), g) in weights.iter().zip(&logp).zip(g.iter_mut()) {
        if w != 0.0 {
            loss -= w as f64 * lp as f64;
            tokens += 1;
            *g = (-(w as f64) / norm) as f32;
        }
    }
    let n = logp.len();
    Ok(LossGrad {
        loss: loss / norm,
        tokens,
        g_logp: be.upload(HostData::F32(&g), &[n])?,
        g_entropy: be.upload(HostData::F32(&vec![0.0; n]), &[n])?,
    })
}
