//! Token log-probabilities and entropies from hidden states and the LM head, a chunk of rows at a
//! time: a GEMM makes `[chunk, V]` f32 logits (never `[T, V]`), a kernel reduces each row; the
//! backward recomputes the chunk's logits, turns them into logit gradients in place, and two GEMMs
//! give the hidden-state and head gradients. Also the row log-softmax.

use super::gemm::{gemm, Operand};
use super::ops::{coerce, float_dtype, host_u32, shape_err};
use super::{Arg, Cuda};
use crate::engine::backend::IGNORE_TARGET;
use crate::engine::error::{EngineError, Result};
use crate::engine::{DType, Tensor};

/// Threads per row of the loss kernels.
const ROW_THREADS: u32 = 512;

fn check(
    be: &Cuda,
    op: &'static str,
    h: &Tensor<Cuda>,
    head: &Tensor<Cuda>,
    targets: &Tensor<Cuda>,
) -> Result<(usize, usize, usize, Vec<u32>)> {
    let (t, d, v) = crate::engine::shapes::token_loss_dims(op, h, head, targets)?;
    let tg = host_u32(be, targets, op)?;
    crate::engine::shapes::check_targets(op, &tg, v)?;
    Ok((t, d, v, tg))
}

/// Row chunks `[c0, c1)` that contain at least one non-ignored target.
fn chunks(tg: &[u32], chunk_rows: usize) -> Vec<(usize, usize)> {
    let c = chunk_rows.max(1);
    (0..tg.len())
        .step_by(c)
        .map(|a| (a, (a + c).min(tg.len())))
        .filter(|&(a, b)| tg[a..b].iter().any(|&x| x != IGNORE_TARGET))
        .collect()
}

pub(crate) fn token_logprobs(
    be: &Cuda,
    h: &Tensor<Cuda>,
    head: &Tensor<Cuda>,
    targets: &Tensor<Cuda>,
    chunk_rows: usize,
) -> Result<(Tensor<Cuda>, Tensor<Cuda>)> {
    let op = "token_logprobs";
    let (t, d, v, tg) = check(be, op, h, head, targets)?;
    let dt = float_dtype(op, h)?;
    let head = coerce(be, head, dt)?;
    let logp = be.alloc(&[t], DType::F32, true)?;
    let ent = be.alloc(&[t], DType::F32, true)?;
    let rows_max = chunk_rows.max(1).min(t.max(1));
    let logits = be.alloc(&[rows_max, v], DType::F32, false)?;
    let es = dt.size() as u64;
    for (a, b) in chunks(&tg, chunk_rows) {
        let rows = b - a;
        gemm(
            be,
            rows,
            v,
            d,
            Operand {
                ptr: be.ptr(h) + (a * d) as u64 * es,
                dtype: dt,
                trans: false,
                ld: d,
            },
            Operand {
                ptr: be.ptr(&head),
                dtype: dt,
                trans: true,
                ld: d,
            },
            Operand {
                ptr: be.ptr(&logits),
                dtype: DType::F32,
                trans: false,
                ld: v,
            },
            1.0,
            0.0,
        )?;
        be.launch(
            "token_stats",
            (rows as u32, 1),
            ROW_THREADS,
            &[
                Arg::P(be.ptr(&logits)),
                Arg::P(be.ptr(targets) + 4 * a as u64),
                Arg::P(be.ptr(&logp) + 4 * a as u64),
                Arg::P(be.ptr(&ent) + 4 * a as u64),
                Arg::U(v as u32),
            ],
        )?;
    }
    Ok((logp, ent))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn token_logprobs_backward(
    be: &Cuda,
    h: &Tensor<Cuda>,
    head: &Tensor<Cuda>,
    targets: &Tensor<Cuda>,
    g_logp: &Tensor<Cuda>,
    g_entropy: &Tensor<Cuda>,
    chunk_rows: usize,
    dhead: Option<&mut Tensor<Cuda>>,
) -> Result<Tensor<Cuda>> {
    let op = "token_logprobs_backward";
    let (t, d, v, tg) = check(be, op, h, head, targets)?;
    crate::engine::shapes::token_loss_backward_dims(
        op,
        t,
        g_logp,
        g_entropy,
        head,
        dhead.as_deref(),
    )?;
    let dt = float_dtype(op, h)?;
    let sfx = Cuda::suffix(op, dt)?;
    let head = coerce(be, head, dt)?;
    let gl = coerce(be, g_logp, DType::F32)?;
    let ge = coerce(be, g_entropy, DType::F32)?;
    let dh = be.alloc(&[t, d], dt, true)?;
    let rows_max = chunk_rows.max(1).min(t.max(1));
    let logits = be.alloc(&[rows_max, v], DType::F32, false)?;
    // The logit gradients, in the GEMM dtype (in place over the f32 logits when that is f32).
    let own_dlogits = if dt == DType::F32 {
        None
    } else {
        Some(be.alloc(&[rows_max, v], dt, false)?)
    };
    let dl_ptr = own_dlogits
        .as_ref()
        .map(|x| be.ptr(x))
        .unwrap_or_else(|| be.ptr(&logits));
    let dhead_ptr = match &dhead {
        Some(w) if w.dtype() == DType::F32 || w.dtype() == dt => Some((be.ptr(w), w.dtype())),
        Some(w) => {
            return Err(EngineError::DType {
                op,
                dtype: w.dtype(),
            })
        }
        None => None,
    };
    let es = dt.size() as u64;
    for (a, b) in chunks(&tg, chunk_rows) {
        let rows = b - a;
        let h_chunk = Operand {
            ptr: be.ptr(h) + (a * d) as u64 * es,
            dtype: dt,
            trans: false,
            ld: d,
        };
        gemm(
            be,
            rows,
            v,
            d,
            h_chunk,
            Operand {
                ptr: be.ptr(&head),
                dtype: dt,
                trans: true,
                ld: d,
            },
            Operand {
                ptr: be.ptr(&logits),
                dtype: DType::F32,
                trans: false,
                ld: v,
            },
            1.0,
            0.0,
        )?;
        be.launch(
            &format!("token_grad_{sfx}"),
            (rows as u32, 1),
            ROW_THREADS,
            &[
                Arg::P(be.ptr(&logits)),
                Arg::P(dl_ptr),
                Arg::P(be.ptr(targets) + 4 * a as u64),
                Arg::P(be.ptr(&gl) + 4 * a as u64),
                Arg::P(be.ptr(&ge) + 4 * a as u64),
                Arg::U(v as u32),
            ],
        )?;
        let dl = Operand {
            ptr: dl_ptr,
            dtype: dt,
            trans: false,
            ld: v,
        };
        gemm(
            be,
            rows,
            d,
            v,
            dl,
            Operand {
                ptr: be.ptr(&head),
                dtype: dt,
                trans: false,
                ld: d,
            },
            Operand {
                ptr: be.ptr(&dh) + (a * d) as u64 * es,
                dtype: dt,
                trans: false,
                ld: d,
            },
            1.0,
            0.0,
        )?;
        if let Some((p, wdt)) = dhead_ptr {
            gemm(
                be,
                v,
                d,
                rows,
                Operand { trans: true, ..dl },
                h_chunk,
                Operand {
                    ptr: p,
                    dtype: wdt,
                    trans: false,
                    ld: d,
                },
                1.0,
                1.0,
            )?;
        }
    }
    Ok(dh)
}

pub(crate) fn log_softmax(be: &Cuda, logits: &Tensor<Cuda>) -> Result<Tensor<Cuda>> {
    let (r, v) = logits.dims2("log_softmax")?;
    let dt = float_dtype("log_softmax", logits)?;
    let out = be.alloc(&[r, v], dt, false)?;
    if r == 0 {
        return Ok(out);
    }
    be.launch(
        &format!("log_softmax_{}", Cuda::suffix("log_softmax", dt)?),
        (r as u32, 1),
        ROW_THREADS,
        &[
            Arg::P(be.ptr(logits)),
            Arg::P(be.ptr(&out)),
            Arg::U(v as u32),
        ],
    )?;
    Ok(out)
}

impl Cuda {
    /// Fused per-token PPO loss on token log-probabilities `[T]` (all f32): ratio
    /// `exp(logp - old_logp)`, clipped surrogate `-min(r A, clip(r, 1 - eps, 1 + eps) A)`, k3 KL
    /// estimator to `ref_logp` times `kl_coef`, times `weight`. Returns the per-token loss and its
    /// gradient with respect to `logp` (feed that to
    /// [`crate::engine::Backend::token_logprobs_backward`]).
    #[allow(clippy::too_many_arguments)]
    pub fn ppo_token_loss(
        &self,
        logp: &Tensor<Cuda>,
        old_logp: &Tensor<Cuda>,
        ref_logp: &Tensor<Cuda>,
        advantages: &Tensor<Cuda>,
        weight: &Tensor<Cuda>,
        clip_eps: f32,
        kl_coef: f32,
    ) -> Result<(Tensor<Cuda>, Tensor<Cuda>)> {
        let op = "ppo_token_loss";
        let t = logp.dims1(op)?;
        let ins = [logp, old_logp, ref_logp, advantages, weight];
        if ins.iter().any(|x| x.shape() != [t]) {
            return Err(shape_err(op, format!("inputs must all be [{t}]")));
        }
        let ins: Vec<_> = ins
            .iter()
            .map(|x| coerce(self, x, DType::F32))
            .collect::<Result<_>>()?;
        let loss = self.alloc(&[t], DType::F32, false)?;
        let grad = self.alloc(&[t], DType::F32, false)?;
        if t == 0 {
            return Ok((loss, grad));
        }
        let mut args: Vec<Arg> = ins.iter().map(|x| Arg::P(self.ptr(x))).collect();
        args.extend([
            Arg::P(self.ptr(&loss)),
            Arg::P(self.ptr(&grad)),
            Arg::U(t as u32),
            Arg::F(clip_eps),
            Arg::F(kl_coef),
        ]);
        self.launch("ppo_token_loss", ((t as u32).div_ceil(256), 1), 256, &args)?;
        Ok((loss, grad))
    }
}

impl Cuda {
    /// The PPO loss from final hidden states and the LM head, chunked over the vocabulary (no
    /// `[T, V]` logits): per-token log-probs and entropies ([`token_logprobs`]), the fused
    /// clipped-surrogate + KL loss ([`Cuda::ppo_token_loss`]), then the backward to the hidden
    /// states (returned) and to the head (added to `dhead`). Returns `(loss [T], logp [T],
    /// entropy [T], dh [T, D])`. With zero advantages, a KL coefficient of 0 and `old = logp`
    /// the loss is zero; SFT cross-entropy is the same path with `dL/dlogp = -weight`
    /// ([`crate::engine::Backend::token_logprobs_backward`] directly).
    #[allow(clippy::too_many_arguments)]
    pub fn ppo_loss_from_hidden(
        &self,
        h: &Tensor<Cuda>,
        head: &Tensor<Cuda>,
        targets: &Tensor<Cuda>,
        old_logp: &Tensor<Cuda>,
        ref_logp: &Tensor<Cuda>,
        advantages: &Tensor<Cuda>,
        weight: &Tensor<Cuda>,
        clip_eps: f32,
        kl_coef: f32,
        chunk_rows: usize,
        dhead: Option<&mut Tensor<Cuda>>,
    ) -> Result<PpoOutput> {
        let (logp, entropy) = token_logprobs(self, h, head, targets, chunk_rows)?;
        let (loss, g_logp) = self.ppo_token_loss(
            &logp, old_logp, ref_logp, advantages, weight, clip_eps, kl_coef,
        )?;
        let g_ent = self.alloc(&[logp.numel()], DType::F32, true)?;
        let dh =
            token_logprobs_backward(self, h, head, targets, &g_logp, &g_ent, chunk_rows, dhead)?;
        Ok(PpoOutput {
            loss,
            logp,
            entropy,
            dh,
        })
    }
}

/// Outputs of [`Cuda::ppo_loss_from_hidden`].
pub struct PpoOutput {
    /// Per-token loss `[T]` (f32).
    pub loss: Tensor<Cuda>,
    /// Per-token log-probability of the target `[T]` (f32).
    pub logp: Tensor<Cuda>,
    /// Per-token entropy `[T]` (f32).
    pub entropy: Tensor<Cuda>,
    /// Gradient of the summed loss with respect to the hidden states `[T, D]`.
    pub dh: Tensor<Cuda>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_skip_fully_ignored_ones() {
        let i = IGNORE_TARGET;
        assert_eq!(chunks(&[1, 2, i, i, i, 3], 2), vec![(0, 2), (4, 6)]);
        assert_eq!(chunks(&[i, i], 0), Vec::<(usize, usize)>::new());
        assert_eq!(chunks(&[5], 0), vec![(0, 1)]);
    }
}
