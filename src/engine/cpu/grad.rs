//! CPU operations of training: transposed matrix products, the backward of every forward layer,
//! packed causal attention with saved softmax statistics, the chunked token loss, and the
//! optimizer's element-wise updates. Reductions run over fixed blocks summed in a fixed order, so
//! results do not depend on rayon's scheduling.

use rayon::prelude::*;

use super::attn_train::{self, Packed};
use super::matmul::{gemm, gemm_new, gemm_new_threads, gemm_threads, MatRef};
use super::vexp;
use super::{f32s, f32s_mut, tensor_f32, u32s, Cpu};
use crate::engine::backend::{AdamWParams, AttentionShape, IGNORE_TARGET};
use crate::engine::error::{EngineError, Result};
use crate::engine::Tensor;

/// Rows per block of the deterministic row reductions.
const ROW_BLOCK: usize = 64;
/// Elements per block of the deterministic element reductions.
const ELEM_BLOCK: usize = 16 * 1024;

fn shape_err(op: &'static str, detail: String) -> EngineError {
    EngineError::Shape { op, detail }
}

fn same_shape(op: &'static str, a: &Tensor<Cpu>, b: &Tensor<Cpu>) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(shape_err(op, format!("{:?} vs {:?}", a.shape(), b.shape())));
    }
    Ok(())
}

/// `c (+)= op(a) @ op(b)`.
pub fn matmul(
    a: &Tensor<Cpu>,
    trans_a: bool,
    b: &Tensor<Cpu>,
    trans_b: bool,
    c: &mut Tensor<Cpu>,
    accumulate: bool,
) -> Result<()> {
    let (m, k, n) = crate::engine::shapes::matmul_dims(a, trans_a, b, trans_b, c)?;
    // Stored column counts (leading dimensions); both are matrices now.
    let (ac, bc) = (a.shape()[1], b.shape()[1]);
    let ad = f32s(a, "matmul")?;
    let bd = f32s(b, "matmul")?;
    let am = if trans_a {
        MatRef::col_major(ad, ac)
    } else {
        MatRef::row_major(ad, ac)
    };
    let bm = if trans_b {
        MatRef::col_major(bd, bc)
    } else {
        MatRef::row_major(bd, bc)
    };
    let cd = f32s_mut(c, "matmul")?;
    gemm(m, n, k, am, bm, cd, accumulate);
    Ok(())
}

/// `dx += dy W` and `dw += dy^T x` (the backward of `y = x W^T`), the two products at once, each
/// on half of the threads. The gemm crate's sums do not depend on its parallelism, so the result
/// is the same as [`matmul`]'s in turn.
pub fn linear_backward(
    x: &Tensor<Cpu>,
    w: &Tensor<Cpu>,
    dy: &Tensor<Cpu>,
    dx: &mut Tensor<Cpu>,
    dw: Option<&mut Tensor<Cpu>>,
) -> Result<()> {
    let threads = rayon::current_num_threads();
    let dw = match dw {
        Some(dw) if threads > 1 => dw,
        dw => {
            matmul(dy, false, w, false, dx, true)?;
            return match dw {
                Some(dw) => matmul(dy, true, x, false, dw, true),
                None => Ok(()),
            };
        }
    };
    let op = "linear_backward";
    let (m1, k1, n1) = crate::engine::shapes::matmul_dims(dy, false, w, false, dx)?;
    let (m2, k2, n2) = crate::engine::shapes::matmul_dims(dy, true, x, false, dw)?;
    let (o, i) = (w.shape()[0], w.shape()[1]);
    let (dys, ws, xs) = (f32s(dy, op)?, f32s(w, op)?, f32s(x, op)?);
    let (dxs, dws) = (f32s_mut(dx, op)?, f32s_mut(dw, op)?);
    let half = threads / 2;
    rayon::join(
        || {
            let a = MatRef::row_major(dys, o);
            let b = MatRef::row_major(ws, i);
            gemm_threads(m1, n1, k1, a, b, dxs, true, half);
        },
        || {
            let a = MatRef::col_major(dys, o);
            let b = MatRef::row_major(xs, i);
            gemm_threads(m2, n2, k2, a, b, dws, true, threads - half);
        },
    );
    Ok(())
}

/// Column sums of `x [T, N]` into `out [N]`.
pub fn sum_rows(x: &Tensor<Cpu>, out: &mut Tensor<Cpu>, accumulate: bool) -> Result<()> {
    let (_, n) = x.dims2("sum_rows")?;
    if out.dims1("sum_rows")? != n {
        return Err(shape_err(
            "sum_rows",
            format!("{:?} into {:?}", x.shape(), out.shape()),
        ));
    }
    let xs = f32s(x, "sum_rows")?;
    let partial: Vec<Vec<f32>> = xs
        .par_chunks((ROW_BLOCK * n).max(1))
        .map(|blk| {
            let mut acc = vec![0.0f32; n];
            for row in blk.chunks_exact(n.max(1)) {
                acc.iter_mut().zip(row).for_each(|(a, &r)| *a += r);
            }
            acc
        })
        .collect();
    let o = f32s_mut(out, "sum_rows")?;
    if !accumulate {
        o.iter_mut().for_each(|v| *v = 0.0);
    }
    for p in partial {
        o.iter_mut().zip(&p).for_each(|(a, &b)| *a += b);
    }
    Ok(())
}

/// Backward of RMSNorm: `dx`, and `dweight += sum_t dy * x * rstd`.
pub fn rms_norm_backward(
    x: &Tensor<Cpu>,
    weight: &Tensor<Cpu>,
    dy: &Tensor<Cpu>,
    eps: f32,
    dweight: Option<&mut Tensor<Cpu>>,
) -> Result<Tensor<Cpu>> {
    let (t, d) = x.dims2("rms_norm_backward")?;
    same_shape("rms_norm_backward", x, dy)?;
    let dw_ok = dweight.as_ref().is_none_or(|w| w.shape() == weight.shape());
    if weight.dims1("rms_norm_backward")? != d || !dw_ok {
        return Err(shape_err(
            "rms_norm_backward",
            format!("weight {:?} for rows of {d}", weight.shape()),
        ));
    }
    let xs = f32s(x, "rms_norm_backward")?;
    let w = f32s(weight, "rms_norm_backward")?;
    let dys = f32s(dy, "rms_norm_backward")?;
    let mut dx = vec![0.0f32; t * d];
    let blk = (ROW_BLOCK * d).max(1);
    let partial: Vec<Vec<f32>> = dx
        .par_chunks_mut(blk)
        .zip(xs.par_chunks(blk).zip(dys.par_chunks(blk)))
        .map(|(dxb, (xb, dyb))| {
            let mut dw = vec![0.0f32; d];
            for ((dxr, xr), dyr) in dxb
                .chunks_exact_mut(d)
                .zip(xb.chunks_exact(d))
                .zip(dyb.chunks_exact(d))
            {
                let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
                let r = 1.0 / (ss + eps).sqrt();
                let mut c = 0.0f32;
                for i in 0..d {
                    c += dyr[i] * w[i] * xr[i];
                    dw[i] += dyr[i] * xr[i] * r;
                }
                let k = c * r * r * r / d as f32;
                for i in 0..d {
                    dxr[i] = dyr[i] * w[i] * r - xr[i] * k;
                }
            }
            dw
        })
        .collect();
    if let Some(dweight) = dweight {
        let dws = f32s_mut(dweight, "rms_norm_backward")?;
        for p in partial {
            dws.iter_mut().zip(&p).for_each(|(a, &b)| *a += b);
        }
    }
    Ok(tensor_f32(dx, &[t, d]))
}

/// Inverse rotary rotation in place.
pub fn rope_backward(
    dx: &mut Tensor<Cpu>,
    positions: &Tensor<Cpu>,
    head_dim: usize,
    theta: f32,
) -> Result<()> {
    let (t, f) = dx.dims2("rope_backward")?;
    if head_dim == 0 || head_dim % 2 != 0 || f % head_dim != 0 || positions.numel() != t {
        return Err(shape_err(
            "rope_backward",
            format!(
                "rows {:?}, head_dim {head_dim}, {} positions",
                dx.shape(),
                positions.numel()
            ),
        ));
    }
    let pos = u32s(positions, "rope_backward")?.to_vec();
    super::ops::rotate(
        f32s_mut(dx, "rope_backward")?,
        f,
        &pos,
        head_dim,
        theta,
        true,
    );
    Ok(())
}

/// Validated `cu_seqlens`: increasing, from 0 to `t`.
fn seq_bounds(cu: &Tensor<Cpu>, t: usize, op: &'static str) -> Result<Vec<(usize, usize)>> {
    let c = u32s(cu, op)?;
    if c.len() < 2 || c[0] != 0 || c[c.len() - 1] as usize != t || c.windows(2).any(|w| w[1] < w[0])
    {
        return Err(shape_err(
            op,
            format!("cu_seqlens {c:?} do not partition {t} rows"),
        ));
    }
    Ok(c.windows(2)
        .filter(|w| w[1] > w[0])
        .map(|w| (w[0] as usize, w[1] as usize))
        .collect())
}

fn check_attn(
    op: &'static str,
    q: &Tensor<Cpu>,
    k: &Tensor<Cpu>,
    v: &Tensor<Cpu>,
    sh: AttentionShape,
) -> Result<(usize, usize, usize)> {
    crate::engine::shapes::attention_train_dims(op, q, k, v, &sh)
}

/// Packed causal attention with the log-sum-exp of each softmax.
pub fn attention_train(
    q: &Tensor<Cpu>,
    k: &Tensor<Cpu>,
    v: &Tensor<Cpu>,
    cu_seqlens: &Tensor<Cpu>,
    sh: AttentionShape,
) -> Result<(Tensor<Cpu>, Tensor<Cpu>)> {
    let op = "attention_train";
    let (t, qf, _) = check_attn(op, q, k, v, sh)?;
    let seqs = seq_bounds(cu_seqlens, t, op)?;
    let x = Packed {
        q: f32s(q, op)?,
        k: f32s(k, op)?,
        v: f32s(v, op)?,
        sh,
    };
    let (out, lse) = attn_train::forward(x, &seqs, t);
    Ok((tensor_f32(out, &[t, qf]), tensor_f32(lse, &[t, sh.n_heads])))
}

/// Backward of packed causal attention; parallel over (sequence, kv head).
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    q: &Tensor<Cpu>,
    k: &Tensor<Cpu>,
    v: &Tensor<Cpu>,
    out: &Tensor<Cpu>,
    lse: &Tensor<Cpu>,
    dout: &Tensor<Cpu>,
    cu_seqlens: &Tensor<Cpu>,
    sh: AttentionShape,
) -> Result<(Tensor<Cpu>, Tensor<Cpu>, Tensor<Cpu>)> {
    let op = "attention_backward";
    let (t, qf, kf) = check_attn(op, q, k, v, sh)?;
    same_shape(op, q, out)?;
    same_shape(op, q, dout)?;
    let nh = sh.n_heads;
    if lse.shape() != [t, nh] {
        return Err(shape_err(
            op,
            format!("lse {:?} for [{t}, {nh}]", lse.shape()),
        ));
    }
    let seqs = seq_bounds(cu_seqlens, t, op)?;
    let x = Packed {
        q: f32s(q, op)?,
        k: f32s(k, op)?,
        v: f32s(v, op)?,
        sh,
    };
    let saved = attn_train::Saved {
        out: f32s(out, op)?,
        lse: f32s(lse, op)?,
        dout: f32s(dout, op)?,
    };
    let (dq, dk, dv) = attn_train::backward(x, saved, &seqs, t);
    Ok((
        tensor_f32(dq, &[t, qf]),
        tensor_f32(dk, &[t, kf]),
        tensor_f32(dv, &[t, kf]),
    ))
}

/// Backward of `silu(gate) * up`.
pub fn swiglu_backward(
    gate: &Tensor<Cpu>,
    up: &Tensor<Cpu>,
    dout: &Tensor<Cpu>,
) -> Result<(Tensor<Cpu>, Tensor<Cpu>)> {
    same_shape("swiglu_backward", gate, up)?;
    same_shape("swiglu_backward", gate, dout)?;
    let g = f32s(gate, "swiglu_backward")?;
    let u = f32s(up, "swiglu_backward")?;
    let dm = f32s(dout, "swiglu_backward")?;
    let mut dg = vec![0.0f32; g.len()];
    let mut du = vec![0.0f32; g.len()];
    dg.par_chunks_mut(4096)
        .zip(du.par_chunks_mut(4096))
        .zip(
            g.par_chunks(4096)
                .zip(u.par_chunks(4096))
                .zip(dm.par_chunks(4096)),
        )
        .for_each(|((dg, du), ((g, u), dm))| vexp::swiglu_backward(g, u, dm, dg, du));
    Ok((tensor_f32(dg, gate.shape()), tensor_f32(du, gate.shape())))
}

/// Scatter-add of rows of `dx` into `dtable` at `ids`.
pub fn embedding_backward(
    dtable: &mut Tensor<Cpu>,
    ids: &Tensor<Cpu>,
    dx: &Tensor<Cpu>,
) -> Result<()> {
    let (v, d) = dtable.dims2("embedding_backward")?;
    let (t, d2) = dx.dims2("embedding_backward")?;
    if d != d2 || ids.numel() != t {
        return Err(shape_err(
            "embedding_backward",
            format!(
                "table {:?}, rows {:?}, {} ids",
                dtable.shape(),
                dx.shape(),
                ids.numel()
            ),
        ));
    }
    let idv = u32s(ids, "embedding_backward")?;
    if let Some(&bad) = idv.iter().find(|&&i| i as usize >= v) {
        return Err(EngineError::Index {
            op: "embedding_backward",
            index: bad as usize,
            limit: v,
        });
    }
    let idv = idv.to_vec();
    let xs = f32s(dx, "embedding_backward")?.to_vec();
    let tab = f32s_mut(dtable, "embedding_backward")?;
    // Tokens in order: the same sums whatever the thread count (T * D adds, cheap).
    for (r, &id) in idv.iter().enumerate() {
        let id = id as usize;
        tab[id * d..(id + 1) * d]
            .iter_mut()
            .zip(&xs[r * d..(r + 1) * d])
            .for_each(|(a, &b)| *a += b);
    }
    Ok(())
}

fn check_loss(
    op: &'static str,
    h: &Tensor<Cpu>,
    head: &Tensor<Cpu>,
    targets: &Tensor<Cpu>,
) -> Result<(usize, usize, usize)> {
    let (t, d, v) = crate::engine::shapes::token_loss_dims(op, h, head, targets)?;
    crate::engine::shapes::check_targets(op, u32s(targets, op)?, v)?;
    Ok((t, d, v))
}

/// Rows of `h` whose target is not ignored, grouped in chunks of at most `chunk_rows`.
fn active_chunks(targets: &[u32], chunk_rows: usize) -> Vec<Vec<usize>> {
    let rows: Vec<usize> = (0..targets.len())
        .filter(|&i| targets[i] != IGNORE_TARGET)
        .collect();
    rows.chunks(chunk_rows.max(1)).map(|c| c.to_vec()).collect()
}

/// Logits `[rows.len(), v]` of the chosen rows of `hs` and the gathered rows `[rows.len(), d]`.
fn chunk_logits(
    hs: &[f32],
    head: &[f32],
    rows: &[usize],
    d: usize,
    v: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut hb = Vec::with_capacity(rows.len() * d);
    for &r in rows {
        hb.extend_from_slice(&hs[r * d..(r + 1) * d]);
    }
    let h = MatRef::row_major(&hb, d);
    let wt = MatRef::col_major(head, d);
    (gemm_new(rows.len(), v, d, h, wt), hb)
}

/// Turns a logits row into probabilities in place; returns `(logsumexp, entropy)`.
fn softmax_row(row: &mut [f32]) -> (f32, f32) {
    let m = vexp::max(row);
    // A -inf logit contributes 0 to `sz` (not exp(-inf) * -inf = NaN).
    let (s, sz) = vexp::exp_shifted_sums(row, m);
    let inv = 1.0 / s;
    vexp::scale_f64(row, inv);
    let lse = m as f64 + s.ln();
    // H = log s - E[z - m].
    let ent = s.ln() - sz * inv;
    (lse as f32, ent as f32)
}

/// Per-token log-probabilities and entropies, chunk by chunk.
pub fn token_logprobs(
    h: &Tensor<Cpu>,
    head: &Tensor<Cpu>,
    targets: &Tensor<Cpu>,
    chunk_rows: usize,
) -> Result<(Tensor<Cpu>, Tensor<Cpu>)> {
    let op = "token_logprobs";
    let (t, d, v) = check_loss(op, h, head, targets)?;
    let hs = f32s(h, op)?;
    let ws = f32s(head, op)?;
    let tg = u32s(targets, op)?;
    let mut logp = vec![0.0f32; t];
    let mut ent = vec![0.0f32; t];
    for rows in active_chunks(tg, chunk_rows) {
        let (mut logits, _) = chunk_logits(hs, ws, &rows, d, v);
        let res: Vec<(f32, f32)> = logits
            .par_chunks_mut(v)
            .zip(rows.par_iter())
            .map(|(row, &r)| {
                let zt = row[tg[r] as usize];
                let (lse, e) = softmax_row(row);
                (zt - lse, e)
            })
            .collect();
        for (&r, (lp, e)) in rows.iter().zip(res) {
            logp[r] = lp;
            ent[r] = e;
        }
    }
    Ok((tensor_f32(logp, &[t]), tensor_f32(ent, &[t])))
}

/// Backward of the chunked token log-probabilities and entropies.
#[allow(clippy::too_many_arguments)]
pub fn token_logprobs_backward(
    h: &Tensor<Cpu>,
    head: &Tensor<Cpu>,
    targets: &Tensor<Cpu>,
    g_logp: &Tensor<Cpu>,
    g_entropy: &Tensor<Cpu>,
    chunk_rows: usize,
    dhead: Option<&mut Tensor<Cpu>>,
) -> Result<Tensor<Cpu>> {
    let op = "token_logprobs_backward";
    let (t, d, v) = check_loss(op, h, head, targets)?;
    crate::engine::shapes::token_loss_backward_dims(
        op,
        t,
        g_logp,
        g_entropy,
        head,
        dhead.as_deref(),
    )?;
    let hs = f32s(h, op)?;
    let ws = f32s(head, op)?;
    let tg = u32s(targets, op)?;
    let gl = f32s(g_logp, op)?;
    let ge = f32s(g_entropy, op)?;
    let mut dh = vec![0.0f32; t * d];
    let mut dw_acc: Vec<f32> = Vec::new();
    for rows in active_chunks(tg, chunk_rows) {
        let (mut logits, hb) = chunk_logits(hs, ws, &rows, d, v);
        // dlogits in place: g_logp (onehot - p) - g_ent p (log p + H).
        logits
            .par_chunks_mut(v)
            .zip(rows.par_iter())
            .for_each(|(row, &r)| {
                let zt = tg[r] as usize;
                let (_, ent) = softmax_row(row);
                let (a, b) = (gl[r], ge[r]);
                for p in row.iter_mut() {
                    let pj = *p;
                    let ent_term = if b != 0.0 && pj > 0.0 {
                        -b * pj * (pj.ln() + ent)
                    } else {
                        0.0
                    };
                    *p = -a * pj + ent_term;
                }
                row[zt] += a;
            });
        if dhead.is_some() && dw_acc.is_empty() {
            dw_acc = vec![0.0f32; v * d];
        }
        let dw = dhead.is_some().then_some(&mut dw_acc[..]);
        let dhb = head_products(&logits, &hb, ws, (rows.len(), d, v), dw);
        for (i, &r) in rows.iter().enumerate() {
            dh[r * d..(r + 1) * d].copy_from_slice(&dhb[i * d..(i + 1) * d]);
        }
    }
    if let (false, Some(dhead)) = (dw_acc.is_empty(), dhead) {
        let dw = f32s_mut(dhead, op)?;
        dw.par_chunks_mut(4096)
            .zip(dw_acc.par_chunks(4096))
            .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, &b)| *a += b));
    }
    Ok(tensor_f32(dh, &[t, d]))
}

/// The head's backward products for one chunk of `n` rows: returns `dh = dlogits head` `[n, d]`
/// and adds `dlogits^T h` to `dw` when given, the two at once on halves of the threads.
fn head_products(
    dlogits: &[f32],
    hb: &[f32],
    head: &[f32],
    (n, d, v): (usize, usize, usize),
    dw: Option<&mut [f32]>,
) -> Vec<f32> {
    let dl = MatRef::row_major(dlogits, v);
    let dl_t = MatRef::col_major(dlogits, v);
    let w = MatRef::row_major(head, d);
    let h = MatRef::row_major(hb, d);
    let threads = rayon::current_num_threads();
    match dw {
        Some(dw) if threads > 1 => {
            let half = threads / 2;
            rayon::join(
                || gemm_new_threads(n, d, v, dl, w, half),
                || gemm_threads(v, d, n, dl_t, h, dw, true, threads - half),
            )
            .0
        }
        dw => {
            let dh = gemm_new(n, d, v, dl, w);
            if let Some(dw) = dw {
                gemm(v, d, n, dl_t, h, dw, true);
            }
            dh
        }
    }
}

/// Sets every element.
pub fn fill(x: &mut Tensor<Cpu>, value: f32) -> Result<()> {
    f32s_mut(x, "fill")?
        .par_chunks_mut(ELEM_BLOCK)
        .for_each(|c| c.iter_mut().for_each(|v| *v = value));
    Ok(())
}

/// `x *= s`.
pub fn scale(x: &mut Tensor<Cpu>, s: f32) -> Result<()> {
    f32s_mut(x, "scale")?
        .par_chunks_mut(ELEM_BLOCK)
        .for_each(|c| c.iter_mut().for_each(|v| *v *= s));
    Ok(())
}

/// `y += a * x`.
pub fn axpy(y: &mut Tensor<Cpu>, a: f32, x: &Tensor<Cpu>) -> Result<()> {
    same_shape("axpy", y, x)?;
    let xs = f32s(x, "axpy")?;
    let ys = f32s_mut(y, "axpy")?;
    ys.par_chunks_mut(ELEM_BLOCK)
        .zip(xs.par_chunks(ELEM_BLOCK))
        .for_each(|(y, x)| y.iter_mut().zip(x).for_each(|(y, &x)| *y += a * x));
    Ok(())
}

/// Sum of squares in f64 over fixed blocks.
pub fn sum_squares(x: &Tensor<Cpu>) -> Result<f64> {
    let xs = f32s(x, "sum_squares")?;
    let parts: Vec<f64> = xs
        .par_chunks(ELEM_BLOCK)
        .map(|c| c.iter().map(|&v| v as f64 * v as f64).sum::<f64>())
        .collect();
    Ok(parts.iter().sum())
}

/// One AdamW update, PyTorch's formulation.
pub fn adamw_step(
    param: &mut Tensor<Cpu>,
    grad: &Tensor<Cpu>,
    m: &mut Tensor<Cpu>,
    v: &mut Tensor<Cpu>,
    hp: AdamWParams,
) -> Result<()> {
    same_shape("adamw_step", param, grad)?;
    same_shape("adamw_step", param, m)?;
    same_shape("adamw_step", param, v)?;
    let step = hp.step.max(1) as i32;
    let bc1 = 1.0 - (hp.beta1 as f64).powi(step);
    let bc2 = 1.0 - (hp.beta2 as f64).powi(step);
    let step_size = (hp.lr as f64 / bc1) as f32;
    let bc2_sqrt = bc2.sqrt() as f32;
    let decay = 1.0 - hp.lr * hp.weight_decay;
    let g = f32s(grad, "adamw_step")?;
    let ms = f32s_mut(m, "adamw_step")?;
    let vs = f32s_mut(v, "adamw_step")?;
    let ps = f32s_mut(param, "adamw_step")?;
    ps.par_chunks_mut(ELEM_BLOCK)
        .zip(g.par_chunks(ELEM_BLOCK))
        .zip(
            ms.par_chunks_mut(ELEM_BLOCK)
                .zip(vs.par_chunks_mut(ELEM_BLOCK)),
        )
        .for_each(|((p, g), (m, v))| {
            // Zipped iterators (no bounds checks) so that the loop vectorises.
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                *m = hp.beta1 * *m + (1.0 - hp.beta1) * g;
                *v = hp.beta2 * *v + (1.0 - hp.beta2) * g * g;
                let denom = v.sqrt() / bc2_sqrt + hp.eps;
                *p = *p * decay - step_size * *m / denom;
            }
        });
    Ok(())
}
