//! Attention over a KV cache on the CPU.

use rayon::prelude::*;

use super::kv_rows::{axpy_rows, dot_rows};
use super::matmul::{gemm, MatRef};
use super::prefix_attn;
use super::{f32s, f32s_mut, tensor_f32, u32s, Cpu};
use crate::engine::backend::{AttentionShape, SharedPrefix};
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
    attention_with(q, k_cache, v_cache, slots, positions, None, sh)
}

/// [`attention`] where a row with `prefix[t] = Some(p)` reads its positions `0..p.len` from slot
/// `p.slot`; rows that share a prompt read its keys and values once for all of them.
pub fn attention_shared(
    q: &Tensor<Cpu>,
    k_cache: &Tensor<Cpu>,
    v_cache: &Tensor<Cpu>,
    slots: &Tensor<Cpu>,
    positions: &Tensor<Cpu>,
    prefix: &[Option<SharedPrefix>],
    sh: AttentionShape,
) -> Result<Tensor<Cpu>> {
    attention_with(q, k_cache, v_cache, slots, positions, Some(prefix), sh)
}

fn attention_with(
    q: &Tensor<Cpu>,
    k_cache: &Tensor<Cpu>,
    v_cache: &Tensor<Cpu>,
    slots: &Tensor<Cpu>,
    positions: &Tensor<Cpu>,
    prefix: Option<&[Option<SharedPrefix>]>,
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
        && positions.numel() == t
        && prefix.is_none_or(|p| p.len() == t);
    if !ok {
        return Err(EngineError::Shape {
            op: "attention",
            detail: format!(
                "q {:?}, k cache {:?}, v cache {:?}, {sh:?}, {} prefixes for {t} rows",
                q.shape(),
                k_cache.shape(),
                v_cache.shape(),
                prefix.map_or(t, <[_]>::len)
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
    // Runs of rows that are consecutive positions of one slot (a prefill) go through GEMMs; the
    // other rows (decode steps) are done one by one.
    let mut runs = Vec::new();
    let mut i = 0;
    while i < t {
        let mut j = i + 1;
        while j < t && sl[j] == sl[i] && ps[j] == ps[j - 1] + 1 {
            j += 1;
        }
        runs.push((i, j));
        i = j;
    }
    let mut in_gemm_run = vec![false; t];
    for &(a, b) in &runs {
        if b - a >= GEMM_MIN_ROWS {
            in_gemm_run[a..b].iter_mut().for_each(|x| *x = true);
        }
    }
    let groups = match prefix {
        Some(p) => prefix_attn::groups(p, sl, ps, &in_gemm_run, s)?,
        None => Vec::new(),
    };
    let mut elsewhere = in_gemm_run.clone();
    for g in &groups {
        g.rows.iter().for_each(|&r| elsewhere[r] = true);
    }
    let mut out = vec![0.0f32; t * qf];
    out.par_chunks_mut(d)
        .enumerate()
        .with_min_len(4)
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (i, o)| {
            let (row, h) = (i / sh.n_heads, i % sh.n_heads);
            if elsewhere[row] {
                return;
            }
            let kvh = h / group;
            let base = sl[row] as usize * m * kf + kvh * d;
            let n = ps[row] as usize + 1;
            let qv = &qs[row * qf + h * d..row * qf + (h + 1) * d];
            attend_row(qv, kc, vc, base, kf, n, sh.scale, scores, o);
        });
    for &(a, b) in runs.iter().filter(|(a, b)| b - a >= GEMM_MIN_ROWS) {
        let heads: Vec<(usize, Vec<f32>)> = (0..sh.n_heads)
            .into_par_iter()
            .map(|h| {
                let kvh = h / group;
                let base = sl[a] as usize * m * kf + kvh * d;
                (
                    h,
                    prefill_head(
                        qs,
                        kc,
                        vc,
                        a,
                        b,
                        ps[a] as usize,
                        base,
                        qf,
                        kf,
                        h * d,
                        d,
                        sh.scale,
                    ),
                )
            })
            .collect();
        for (h, oh) in heads {
            for r in 0..b - a {
                let dst = (a + r) * qf + h * d;
                out[dst..dst + d].copy_from_slice(&oh[r * d..(r + 1) * d]);
            }
        }
    }
    let cache = prefix_attn::Cache {
        qs,
        kc,
        vc,
        sl,
        ps,
        max_seq: m,
        shape: sh,
    };
    for (row, h, o) in prefix_attn::attend_groups(&cache, &groups) {
        let dst = row * qf + h * d;
        out[dst..dst + d].copy_from_slice(&o);
    }
    Ok(tensor_f32(out, &[t, qf]))
}

/// Prefill runs at least this long use the GEMM path.
const GEMM_MIN_ROWS: usize = 16;

/// Causal attention of one head for rows `a..b` (positions `p0..p0 + b - a` of one slot) with
/// two GEMMs: scores `Q K^T` over cache positions `0..p0 + (b - a)`, masked softmax, then `P V`.
#[allow(clippy::too_many_arguments)]
fn prefill_head(
    qs: &[f32],
    kc: &[f32],
    vc: &[f32],
    a: usize,
    b: usize,
    p0: usize,
    base: usize,
    qf: usize,
    kf: usize,
    q_off: usize,
    d: usize,
    scale: f32,
) -> Vec<f32> {
    let l = b - a;
    let s = p0 + l;
    let mut scores = vec![0.0f32; l * s];
    gemm(
        l,
        s,
        d,
        MatRef::row_major(&qs[a * qf + q_off..], qf),
        MatRef::col_major(&kc[base..], kf),
        &mut scores,
        false,
    );
    for (r, row) in scores.chunks_mut(s).enumerate() {
        let visible = p0 + r + 1;
        let mut mx = f32::NEG_INFINITY;
        for x in row[..visible].iter_mut() {
            *x *= scale;
            mx = mx.max(*x);
        }
        let mut sum = 0.0f32;
        for x in row[..visible].iter_mut() {
            *x = (*x - mx).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        row[..visible].iter_mut().for_each(|x| *x *= inv);
        row[visible..].iter_mut().for_each(|x| *x = 0.0);
    }
    let mut out = vec![0.0f32; l * d];
    gemm(
        l,
        d,
        s,
        MatRef::row_major(&scores, s),
        MatRef::row_major(&vc[base..], kf),
        &mut out,
        false,
    );
    out
}

/// Softmax attention of one query row `q` over `n` key/value rows that start at `base` in `keys`
/// and `values` with row stride `stride`; adds the result to `out` and returns the log-sum-exp
/// of the scaled scores. `scores` is scratch space.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_row(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    base: usize,
    stride: usize,
    n: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> f32 {
    scores.clear();
    dot_rows(q, keys, base, stride, n, scale, scores);
    let (mx, sum) = softmax_weights(scores);
    axpy_rows(out, scores, 1.0 / sum, values, base, stride);
    mx + sum.ln()
}

/// Replaces scaled scores by `exp(score - max)` in place; returns the max and the sum of the
/// exponentials (taken in order).
pub(crate) fn softmax_weights(scores: &mut [f32]) -> (f32, f32) {
    let mut mx = f32::NEG_INFINITY;
    for &sc in scores.iter() {
        mx = mx.max(sc);
    }
    let mut sum = 0.0f32;
    for sc in scores.iter_mut() {
        *sc = exp_or_zero(*sc - mx);
        sum += *sc;
    }
    (mx, sum)
}

/// `x.exp()`, without the library's slow underflow path where the result is exactly 0: glibc's
/// `expf` returns +0 for every input below about -103.97 (checked for every f32 below -104).
#[inline]
fn exp_or_zero(x: f32) -> f32 {
    if x < -104.0 {
        0.0
    } else {
        x.exp()
    }
}

#[cfg(test)]
mod tests {
    use super::exp_or_zero;

    /// Around and below the cut-off the shortcut gives the library's bits (a cut-off above the
    /// point where `expf` rounds to 0 would fail here).
    #[test]
    fn exp_shortcut_has_the_library_bits() {
        let lo = (-200.0f32).to_bits();
        let hi = (-60.0f32).to_bits();
        // Negative floats: larger bit patterns are further from zero.
        for b in (hi..=lo).step_by(211) {
            let x = f32::from_bits(b);
            assert_eq!(exp_or_zero(x).to_bits(), x.exp().to_bits(), "x = {x}");
        }
        for x in [f32::NEG_INFINITY, f32::NAN, -104.0, -103.9, 0.0] {
            assert_eq!(exp_or_zero(x).to_bits(), x.exp().to_bits(), "x = {x}");
        }
    }
}
