//! Element-wise and row-wise CPU operations.

use rayon::prelude::*;

use super::{f32s, f32s_mut, tensor_f32, u32s, Cpu};
use crate::engine::error::{EngineError, Result};
use crate::engine::Tensor;

/// Rows per rayon task so that a task has enough work to pay for its dispatch.
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (16_384 / row_len.max(1)).max(1)
}

fn same_shape(op: &'static str, a: &Tensor<Cpu>, b: &Tensor<Cpu>) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(EngineError::Shape {
            op,
            detail: format!("{:?} vs {:?}", a.shape(), b.shape()),
        });
    }
    Ok(())
}

/// Rows of `table [V, D]` chosen by `ids [T]`.
pub fn embedding(table: &Tensor<Cpu>, ids: &Tensor<Cpu>) -> Result<Tensor<Cpu>> {
    let (v, d) = table.dims2("embedding")?;
    let t = ids.dims1("embedding")?;
    let w = f32s(table, "embedding")?;
    let ids = u32s(ids, "embedding")?;
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= v) {
        return Err(EngineError::Index {
            op: "embedding",
            index: bad as usize,
            limit: v,
        });
    }
    let mut out = vec![0.0f32; t * d];
    for (row, &id) in out.chunks_exact_mut(d.max(1)).zip(ids) {
        let s = id as usize * d;
        row.copy_from_slice(&w[s..s + d]);
    }
    Ok(tensor_f32(out, &[t, d]))
}

/// RMSNorm over rows.
pub fn rms_norm(x: &Tensor<Cpu>, weight: &Tensor<Cpu>, eps: f32) -> Result<Tensor<Cpu>> {
    let (t, d) = x.dims2("rms_norm")?;
    if weight.dims1("rms_norm")? != d {
        return Err(EngineError::Shape {
            op: "rms_norm",
            detail: format!("weight {:?} for rows of {d}", weight.shape()),
        });
    }
    let xs = f32s(x, "rms_norm")?;
    let w = f32s(weight, "rms_norm")?;
    let mut out = vec![0.0f32; t * d];
    out.par_chunks_mut(d.max(1))
        .zip(xs.par_chunks(d.max(1)))
        .with_min_len(rows_per_task(d))
        .for_each(|(o, r)| {
            let ss: f32 = r.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ss + eps).sqrt();
            for ((o, &v), &g) in o.iter_mut().zip(r).zip(w) {
                *o = v * inv * g;
            }
        });
    Ok(tensor_f32(out, &[t, d]))
}

/// `dst += src`.
pub fn add_assign(dst: &mut Tensor<Cpu>, src: &Tensor<Cpu>) -> Result<()> {
    same_shape("add_assign", dst, src)?;
    let s = f32s(src, "add_assign")?;
    let d = f32s_mut(dst, "add_assign")?;
    d.par_chunks_mut(4096)
        .zip(s.par_chunks(4096))
        .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(a, b)| *a += b));
    Ok(())
}

/// `silu(gate) * up`.
pub fn swiglu(gate: &Tensor<Cpu>, up: &Tensor<Cpu>) -> Result<Tensor<Cpu>> {
    same_shape("swiglu", gate, up)?;
    let g = f32s(gate, "swiglu")?;
    let u = f32s(up, "swiglu")?;
    let mut out = vec![0.0f32; g.len()];
    out.par_chunks_mut(4096)
        .zip(g.par_chunks(4096).zip(u.par_chunks(4096)))
        .for_each(|(o, (g, u))| super::vexp::swiglu(g, u, o));
    Ok(tensor_f32(out, gate.shape()))
}

/// The inverse frequencies of rotary embedding for one head.
pub fn rope_inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
    let half = head_dim / 2;
    (0..half)
        .map(|i| 1.0 / (theta as f64).powf(2.0 * i as f64 / head_dim as f64) as f32)
        .collect()
}

/// Rotates every head of rows of `f` features by its position's angles (half-split layout);
/// `inverse` rotates by the negative angles (the backward of the rotation).
pub(crate) fn rotate(
    xs: &mut [f32],
    f: usize,
    pos: &[u32],
    head_dim: usize,
    theta: f32,
    inverse: bool,
) {
    let inv = rope_inv_freq(head_dim, theta);
    let half = head_dim / 2;
    let sign = if inverse { -1.0f32 } else { 1.0 };
    xs.par_chunks_mut(f)
        .zip(pos.par_iter())
        .with_min_len(rows_per_task(f))
        .for_each(|(row, &p)| {
            let (sin, cos): (Vec<f32>, Vec<f32>) = inv
                .iter()
                .map(|&w| {
                    let a = p as f32 * w;
                    (sign * a.sin(), a.cos())
                })
                .unzip();
            for head in row.chunks_exact_mut(head_dim) {
                let (a, b) = head.split_at_mut(half);
                for i in 0..half {
                    let (x1, x2) = (a[i], b[i]);
                    a[i] = x1 * cos[i] - x2 * sin[i];
                    b[i] = x2 * cos[i] + x1 * sin[i];
                }
            }
        });
}

/// Rotary embedding in place (half-split layout).
pub fn rope(
    x: &mut Tensor<Cpu>,
    positions: &Tensor<Cpu>,
    head_dim: usize,
    theta: f32,
) -> Result<()> {
    let (t, f) = x.dims2("rope")?;
    if head_dim == 0 || head_dim % 2 != 0 || f % head_dim != 0 {
        return Err(EngineError::Shape {
            op: "rope",
            detail: format!("row of {f} features with head_dim {head_dim}"),
        });
    }
    if positions.dims1("rope")? != t {
        return Err(EngineError::Shape {
            op: "rope",
            detail: format!("{} positions for {t} rows", positions.numel()),
        });
    }
    let pos = u32s(positions, "rope")?.to_vec();
    rotate(f32s_mut(x, "rope")?, f, &pos, head_dim, theta, false);
    Ok(())
}

/// Log-softmax over rows.
pub fn log_softmax(logits: &Tensor<Cpu>) -> Result<Tensor<Cpu>> {
    let (r, v) = logits.dims2("log_softmax")?;
    let x = f32s(logits, "log_softmax")?;
    let mut out = vec![0.0f32; r * v];
    out.par_chunks_mut(v.max(1))
        .zip(x.par_chunks(v.max(1)))
        .for_each(|(o, row)| {
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let s: f64 = row.iter().map(|&z| ((z - m) as f64).exp()).sum();
            let lse = m as f64 + s.ln();
            for (o, &z) in o.iter_mut().zip(row) {
                *o = (z as f64 - lse) as f32;
            }
        });
    Ok(tensor_f32(out, &[r, v]))
}
