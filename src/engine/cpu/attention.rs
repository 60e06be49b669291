//! Attention over a KV cache on the CPU.

use rayon::prelude::*;

use super::simd::{axpy, dot};
use super::{f32s, f32s_mut, tensor_f32, u32s, Cpu};
use crate::engine::backend::AttentionShape;
use crate::engine::error::{EngineError, Result};
use crate::engine::Tensor;

fn dims3(t: &Tensor<Cpu>, op: &'static str) -> Result<(usize, usize, usize)> {
    match t.shape()[..] {
        [a, b, c] => Ok((a, b, c)),
        _ => Err(EngineError::Shape {
            op,
            detail: format!("expected [slots, max_seq, features], got {:?}", t.shape()),
        }),
    }
}

/// Checks slot/position indices against the cache bounds.
fn check_index(op: &'static str, slots: &[u32], pos: &[u32], s: usize, m: usize) -> Result<()> {
    for (&sl, &p) in slots.iter().zip(pos) {
        if sl as usize >= s {
            return Err(EngineError::Index {
                op,
                index: sl as usize,
                limit: s,
            });
        }
        if p as usize >= m {
            return Err(EngineError::Index {
                op,
                index: p as usize,
                limit: m,
            });
        }
    }
    Ok(())
}

/// Writes rows of `src` into the cache at (slot, position).
pub fn kv_write(
    cache: &mut Tensor<Cpu>,
    src: &Tensor<Cpu>,
    slots: &Tensor<Cpu>,
    positions: &Tensor<Cpu>,
) -> Result<()> {
    let (s, m, f) = dims3(cache, "kv_write")?;
    let (t, f2) = src.dims2("kv_write")?;
    if f != f2 || slots.numel() != t || positions.numel() != t {
        return Err(EngineError::Shape {
            op: "kv_write",
            detail: format!(
                "cache {:?}, rows {:?}, {} slots, {} positions",
                cache.shape(),
                src.shape(),
                slots.numel(),
                positions.numel()
            ),
        });
    }
    let sl = u32s(slots, "kv_write")?.to_vec();
    let ps = u32s(positions, "kv_write")?.to_vec();
    check_index("kv_write", &sl, &ps, s, m)?;
    let x = f32s(src, "kv_write")?.to_vec();
    let c = f32s_mut(cache, "kv_write")?;
    for i in 0..t {
        let dst = (sl[i] as usize * m + ps[i] as usize) * f;
        c[dst..dst + f].copy_from_slice(&x[i * f..(i + 1) * f]);
    }
    Ok(())
}

/// Causal attention of each query row over its slot's cached positions `0..=position`.
pub fn attention(
    q: &Tensor<Cpu>,
    k_cache: &Tensor<Cpu>,
    v_cache: &Tensor<Cpu>,
    slots: &Tensor<Cpu>,
    positions: &Tensor<Cpu>,
    sh: AttentionShape,
) -> Result<Tensor<Cpu>> {
    let (t, qf) = q.dims2("attention")?;
    let (s, m, kf) = dims3(k_cache, "attention")?;
    let d = sh.head_dim;
    let ok = sh.n_kv_heads > 0
        && sh.n_heads % sh.n_kv_heads == 0
        && qf == sh.n_heads * d
        && kf == sh.n_kv_heads * d
        && v_cache.shape() == k_cache.shape()
        && slots.numel() == t
        && positions.numel() == t;
    if !ok {
        return Err(EngineError::Shape {
            op: "attention",
            detail: format!(
                "q {:?}, k cache {:?}, v cache {:?}, {sh:?}",
                q.shape(),
                k_cache.shape(),
                v_cache.shape()
            ),
        });
    }
    let sl = u32s(slots, "attention")?;
    let ps = u32s(positions, "attention")?;
    check_index("attention", sl, ps, s, m)?;
    let qs = f32s(q, "attention")?;
    let kc = f32s(k_cache, "attention")?;
    let vc = f32s(v_cache, "attention")?;
    let group = sh.n_heads / sh.n_kv_heads;
    let mut out = vec![0.0f32; t * qf];
    out.par_chunks_mut(d)
        .enumerate()
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (i, o)| {
            let (row, h) = (i / sh.n_heads, i % sh.n_heads);
            let kvh = h / group;
            let base = sl[row] as usize * m * kf + kvh * d;
            let n = ps[row] as usize + 1;
            let qv = &qs[row * qf + h * d..row * qf + (h + 1) * d];
            scores.clear();
            let mut mx = f32::NEG_INFINITY;
            for j in 0..n {
                let kv = &kc[base + j * kf..base + j * kf + d];
                let sc = dot(qv, kv) * sh.scale;
                mx = mx.max(sc);
                scores.push(sc);
            }
            let mut sum = 0.0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - mx).exp();
                sum += *sc;
            }
            let inv = 1.0 / sum;
            for (j, &p) in scores.iter().enumerate() {
                let vv = &vc[base + j * kf..base + j * kf + d];
                axpy(o, p * inv, vv);
            }
        });
    Ok(tensor_f32(out, &[t, qf]))
}
