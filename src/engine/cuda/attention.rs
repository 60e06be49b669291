//! Attention on the GPU: cache attention (split-K decode, also used for prefill), packed causal
//! training attention with saved log-sum-exp, and its backward (bf16 at head dim 64/128: the
//! tensor-core kernels of `kernels/attn_mma.cu`; otherwise the scalar ones of `attention.cu`;
//! bf16 cache attention at head dim 64/128 uses the GQA decode kernel of `kernels/decode.cu`). Index tensors are validated on
//! the host, where the launch tables (tiles, splits) are computed.

use super::launch::{
    attention_tiles, check_cu_seqlens, decode_splits, BWD_ROWS, FWD_ROWS, HEAD_DIMS,
};
use super::ops::{check_below, coerce, float_dtype, host_u32, same_shape, shape_err};
use super::{Arg, Cuda};
use crate::engine::backend::AttentionShape;
use crate::engine::error::{EngineError, Result};
use crate::engine::{DType, Tensor};

fn check_head_dim(op: &'static str, sh: &AttentionShape) -> Result<()> {
    if HEAD_DIMS.contains(&sh.head_dim) {
        Ok(())
    } else {
        Err(shape_err(
            op,
            format!(
                "head_dim {} (the CUDA kernels support {HEAD_DIMS:?})",
                sh.head_dim
            ),
        ))
    }
}

/// M rows ((query row, query head of the group) pairs) per block of the tensor-core forward.
const MMA_ROWS: u32 = 64;

/// Head dimensions of the tensor-core forward (`kernels/attn_mma.cu`).
pub const MMA_HEAD_DIMS: [usize; 2] = [64, 128];

/// Whether packed training attention (forward and backward) uses the tensor-core kernels: bf16,
/// head dim 64 or 128, unless `SORFT_ATTN_KERNEL=scalar` selects the scalar kernels of
/// `kernels/attention.cu`.
fn use_mma(dt: DType, head_dim: usize) -> bool {
    dt == DType::BF16
        && MMA_HEAD_DIMS.contains(&head_dim)
        && std::env::var("SORFT_ATTN_KERNEL").map_or(true, |v| v != "scalar")
}

/// Head dimensions of the GQA decode kernel (`kernels/decode.cu`).
pub const DECODE_GQA_HEAD_DIMS: [usize; 2] = [64, 128];

/// Largest group of query heads per kv head the GQA decode kernel handles (`DG_MAX_GROUP`).
pub const DECODE_GQA_MAX_GROUP: usize = 8;

/// Whether cache attention uses the GQA decode kernel of `kernels/decode.cu` (one read of each
/// K/V row for all query heads of a group): a bf16 cache, head dim 64 or 128, at most
/// `DECODE_GQA_MAX_GROUP` query heads per kv head, unless `SORFT_DECODE_KERNEL=scalar` selects
/// the per-head kernel of `kernels/attention.cu`.
fn use_decode_gqa(dt: DType, sh: &AttentionShape) -> bool {
    dt == DType::BF16
        && DECODE_GQA_HEAD_DIMS.contains(&sh.head_dim)
        && sh.n_heads / sh.n_kv_heads <= DECODE_GQA_MAX_GROUP
        && std::env::var("SORFT_DECODE_KERNEL").map_or(true, |v| v != "scalar")
}

/// The block list of the tensor-core forward: `(seq_start, seq_end, first M row)` triples, where
/// the M rows of a sequence of `n` rows are its `n * g` (row, head-in-group) pairs in row-major
/// order and a block owns `rows` of them. Blocks with the most key tiles come first (causal work
/// grows with the row), so the GPU's tail is short.
fn mma_tiles(cu: &[u32], g: u32, rows: u32) -> Vec<u32> {
    let mut t: Vec<[u32; 3]> = Vec::new();
    for w in cu.windows(2) {
        let (s, e) = (w[0], w[1]);
        let n = (e - s) * g;
        t.extend((0..n).step_by(rows as usize).map(|f| [s, e, f]));
    }
    // Keys a block reads: up to its last row.
    t.sort_by_key(|&[s, e, f]| std::cmp::Reverse(((f + rows).min((e - s) * g) - 1) / g));
    t.into_iter().flatten().collect()
}

/// Whole groups of query heads per key/value head, at least one: the kernels compute
/// `h / (n_heads / n_kv_heads)`, which divides by zero when `n_heads < n_kv_heads` (0 included).
fn heads_ok(sh: &AttentionShape) -> bool {
    sh.n_kv_heads > 0 && sh.n_heads >= sh.n_kv_heads && sh.n_heads % sh.n_kv_heads == 0
}

pub(crate) fn attention(
    be: &Cuda,
    q: &Tensor<Cuda>,
    k_cache: &Tensor<Cuda>,
    v_cache: &Tensor<Cuda>,
    slots: &Tensor<Cuda>,
    positions: &Tensor<Cuda>,
    sh: AttentionShape,
) -> Result<Tensor<Cuda>> {
    let op = "attention";
    let (t, qf) = q.dims2(op)?;
    let (s, m, kf) = match k_cache.shape()[..] {
        [a, b, c] => (a, b, c),
        _ => return Err(shape_err(op, format!("k cache {:?}", k_cache.shape()))),
    };
    let d = sh.head_dim;
    let ok = heads_ok(&sh)
        && qf == sh.n_heads * d
        && kf == sh.n_kv_heads * d
        && v_cache.shape() == k_cache.shape()
        && slots.numel() == t
        && positions.numel() == t;
    if !ok {
        return Err(shape_err(
            op,
            format!(
                "q {:?}, k cache {:?}, v cache {:?}, {sh:?}",
                q.shape(),
                k_cache.shape(),
                v_cache.shape()
            ),
        ));
    }
    check_head_dim(op, &sh)?;
    let sl = host_u32(be, slots, op)?;
    let ps = host_u32(be, positions, op)?;
    check_below(op, &sl, s)?;
    check_below(op, &ps, m)?;
    // Computed in the cache's dtype: converting the few query rows is cheap, converting the
    // cache on every call is not (a bf16 model may keep an f32 cache).
    let dt = float_dtype(op, k_cache)?;
    let sfx = Cuda::suffix(op, dt)?;
    let q_dt = float_dtype(op, q)?;
    let q = coerce(be, q, dt)?;
    let kc = coerce(be, k_cache, dt)?;
    let vc = coerce(be, v_cache, dt)?;
    let out = be.alloc(&[t, qf], dt, false)?;
    if t == 0 {
        return Ok(be.cast(&out, q_dt)?.unwrap_or(out));
    }
    let max_len = ps.iter().copied().max().unwrap_or(0) + 1;
    let rh = (t * sh.n_heads) as u32;
    let gqa = use_decode_gqa(dt, &sh);
    // The GQA kernel has one block per (row, kv head), the scalar one per (row, query head).
    let blocks = if gqa { (t * sh.n_kv_heads) as u32 } else { rh };
    let (splits, chunk) = decode_splits(max_len, blocks, be.sm_count());
    let parts = rh as usize * splits as usize;
    let pm = be.alloc(&[parts], DType::F32, false)?;
    let pl = be.alloc(&[parts], DType::F32, false)?;
    let pacc = be.alloc(&[parts * d], DType::F32, false)?;
    let partial = if gqa {
        format!("decode_gqa_bf16_hd{d}")
    } else {
        format!("decode_partial_{sfx}_hd{d}")
    };
    be.launch(
        &partial,
        (blocks, splits),
        128,
        &[
            Arg::P(be.ptr(&q)),
            Arg::P(be.ptr(&kc)),
            Arg::P(be.ptr(&vc)),
            Arg::P(be.ptr(slots)),
            Arg::P(be.ptr(positions)),
            Arg::P(be.ptr(&pm)),
            Arg::P(be.ptr(&pl)),
            Arg::P(be.ptr(&pacc)),
            Arg::U(sh.n_heads as u32),
            Arg::U(sh.n_kv_heads as u32),
            Arg::U(m as u32),
            Arg::U(chunk),
            Arg::F(sh.scale),
        ],
    )?;
    be.launch(
        &format!("decode_combine_{sfx}_hd{d}"),
        ((rh * 32).div_ceil(128), 1),
        128,
        &[
            Arg::P(be.ptr(&pm)),
            Arg::P(be.ptr(&pl)),
            Arg::P(be.ptr(&pacc)),
            Arg::P(be.ptr(&out)),
            Arg::U(rh),
            Arg::U(splits),
        ],
    )?;
    Ok(be.cast(&out, q_dt)?.unwrap_or(out))
}

fn check_train(
    op: &'static str,
    q: &Tensor<Cuda>,
    k: &Tensor<Cuda>,
    v: &Tensor<Cuda>,
    sh: &AttentionShape,
) -> Result<(usize, usize, usize)> {
    let (t, qf, kf) = crate::engine::shapes::attention_train_dims(op, q, k, v, sh)?;
    check_head_dim(op, sh)?;
    Ok((t, qf, kf))
}

pub(crate) fn attention_train(
    be: &Cuda,
    q: &Tensor<Cuda>,
    k: &Tensor<Cuda>,
    v: &Tensor<Cuda>,
    cu_seqlens: &Tensor<Cuda>,
    sh: AttentionShape,
) -> Result<(Tensor<Cuda>, Tensor<Cuda>)> {
    let op = "attention_train";
    let (t, qf, _) = check_train(op, q, k, v, &sh)?;
    let cu = host_u32(be, cu_seqlens, op)?;
    check_cu_seqlens(&cu, t, op)?;
    let dt = float_dtype(op, q)?;
    let sfx = Cuda::suffix(op, dt)?;
    let k = coerce(be, k, dt)?;
    let v = coerce(be, v, dt)?;
    let out = be.alloc(&[t, qf], dt, false)?;
    let lse = be.alloc(&[t, sh.n_heads], DType::F32, false)?;
    // The tensor-core kernel takes one block per M-row tile of a kv head (its group's query
    // heads packed as rows); the scalar kernel one block per row tile of a query head.
    let (name, tiles, heads) = if use_mma(dt, sh.head_dim) {
        let g = (sh.n_heads / sh.n_kv_heads) as u32;
        let name = format!("attn_mma_fwd_bf16_hd{}", sh.head_dim);
        (name, mma_tiles(&cu, g, MMA_ROWS), sh.n_kv_heads)
    } else {
        let name = format!("flash_fwd_{sfx}_hd{}", sh.head_dim);
        (name, attention_tiles(&cu, FWD_ROWS), sh.n_heads)
    };
    if tiles.is_empty() {
        return Ok((out, lse));
    }
    let tiles_dev = be.upload_u32(&tiles)?;
    be.launch(
        &name,
        ((tiles.len() / 3) as u32, heads as u32),
        128,
        &[
            Arg::P(be.ptr(q)),
            Arg::P(be.ptr(&k)),
            Arg::P(be.ptr(&v)),
            Arg::P(be.ptr(&out)),
            Arg::P(be.ptr(&lse)),
            Arg::P(be.ptr(&tiles_dev)),
            Arg::U(sh.n_heads as u32),
            Arg::U(sh.n_kv_heads as u32),
            Arg::F(sh.scale),
        ],
    )?;
    Ok((out, lse))
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward(
    be: &Cuda,
    q: &Tensor<Cuda>,
    k: &Tensor<Cuda>,
    v: &Tensor<Cuda>,
    out: &Tensor<Cuda>,
    lse: &Tensor<Cuda>,
    dout: &Tensor<Cuda>,
    cu_seqlens: &Tensor<Cuda>,
    sh: AttentionShape,
) -> Result<(Tensor<Cuda>, Tensor<Cuda>, Tensor<Cuda>)> {
    let op = "attention_backward";
    let (t, qf, kf) = check_train(op, q, k, v, &sh)?;
    same_shape(op, q, out)?;
    same_shape(op, q, dout)?;
    if lse.shape() != [t, sh.n_heads] {
        return Err(shape_err(
            op,
            format!("lse {:?} for [{t}, {}]", lse.shape(), sh.n_heads),
        ));
    }
    if lse.dtype() != DType::F32 {
        return Err(EngineError::DType {
            op,
            dtype: lse.dtype(),
        });
    }
    let cu = host_u32(be, cu_seqlens, op)?;
    check_cu_seqlens(&cu, t, op)?;
    let dt = float_dtype(op, q)?;
    let sfx = Cuda::suffix(op, dt)?;
    let hd = sh.head_dim;
    let (k, v) = (coerce(be, k, dt)?, coerce(be, v, dt)?);
    let (out, dout) = (coerce(be, out, dt)?, coerce(be, dout, dt)?);
    let dq = be.alloc(&[t, qf], dt, false)?;
    let dk = be.alloc(&[t, kf], dt, false)?;
    let dv = be.alloc(&[t, kf], dt, false)?;
    let mma = use_mma(dt, hd);
    let tiles = if mma {
        mma_tiles(&cu, (sh.n_heads / sh.n_kv_heads) as u32, MMA_ROWS)
    } else {
        attention_tiles(&cu, BWD_ROWS)
    };
    if tiles.is_empty() {
        return Ok((dq, dk, dv));
    }
    let n_tiles = (tiles.len() / 3) as u32;
    let tiles_dev = be.upload_u32(&tiles)?;
    let rh = (t * sh.n_heads) as u32;
    let dsum = be.alloc(&[t, sh.n_heads], DType::F32, false)?;
    be.launch(
        &format!("flash_bwd_pre_{sfx}_hd{hd}"),
        ((rh * 32).div_ceil(128), 1),
        128,
        &[
            Arg::P(be.ptr(&out)),
            Arg::P(be.ptr(&dout)),
            Arg::P(be.ptr(&dsum)),
            Arg::U(t as u32),
            Arg::U(sh.n_heads as u32),
        ],
    )?;
    let common = |g: &Tensor<Cuda>| {
        [
            Arg::P(be.ptr(q)),
            Arg::P(be.ptr(&k)),
            Arg::P(be.ptr(&v)),
            Arg::P(be.ptr(&dout)),
            Arg::P(be.ptr(lse)),
            Arg::P(be.ptr(&dsum)),
            Arg::P(be.ptr(g)),
        ]
    };
    let tail = [
        Arg::P(be.ptr(&tiles_dev)),
        Arg::U(sh.n_heads as u32),
        Arg::U(sh.n_kv_heads as u32),
        Arg::F(sh.scale),
    ];
    if mma {
        let mut args: Vec<Arg> = common(&dq).to_vec();
        args.extend_from_slice(&tail);
        be.launch(
            &format!("attn_mma_bwd_dq_bf16_hd{hd}"),
            (n_tiles, sh.n_kv_heads as u32),
            128,
            &args,
        )?;
        let key_tiles = attention_tiles(&cu, MMA_ROWS);
        let key_tiles_dev = be.upload_u32(&key_tiles)?;
        let mut args: Vec<Arg> = common(&dk).to_vec();
        args.push(Arg::P(be.ptr(&dv)));
        args.push(Arg::P(be.ptr(&key_tiles_dev)));
        args.extend_from_slice(&tail[1..]);
        be.launch(
            &format!("attn_mma_bwd_dkdv_bf16_hd{hd}"),
            ((key_tiles.len() / 3) as u32, sh.n_kv_heads as u32),
            128,
            &args,
        )?;
        return Ok((dq, dk, dv));
    }
    let mut args: Vec<Arg> = common(&dq).to_vec();
    args.extend_from_slice(&tail);
    be.launch(
        &format!("flash_bwd_dq_{sfx}_hd{hd}"),
        (n_tiles, sh.n_heads as u32),
        128,
        &args,
    )?;
    let mut args: Vec<Arg> = common(&dk).to_vec();
    args.push(Arg::P(be.ptr(&dv)));
    args.extend_from_slice(&tail);
    be.launch(
        &format!("flash_bwd_dkdv_{sfx}_hd{hd}"),
        (n_tiles, sh.n_kv_heads as u32),
        128,
        &args,
    )?;
    Ok((dq, dk, dv))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_counts_that_would_divide_by_zero_in_the_kernels_are_rejected() {
        let sh = |n_heads, n_kv_heads| AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim: 16,
            scale: 0.25,
        };
        assert!(heads_ok(&sh(8, 2)));
        assert!(heads_ok(&sh(4, 4)));
        assert!(!heads_ok(&sh(0, 2)), "0 query heads: h / (0 / 2)");
        assert!(
            !heads_ok(&sh(2, 4)),
            "fewer query heads than kv heads: h / 0"
        );
        assert!(!heads_ok(&sh(6, 4)));
        assert!(!heads_ok(&sh(4, 0)));
    }

    #[test]
    fn mma_tiles_cover_every_row_and_head_pair_once_longest_first() {
        let cu = [0u32, 5, 5, 40, 41];
        let g = 7;
        let t = mma_tiles(&cu, g, 64);
        let tiles: Vec<&[u32]> = t.chunks(3).collect();
        let mut covered = vec![0; 41 * 7];
        for tl in &tiles {
            let (s, e, f) = (tl[0], tl[1], tl[2]);
            assert!(s < e, "{tl:?}: an empty sequence has no block");
            for m in f..(f + 64).min((e - s) * g) {
                covered[(s * g + m) as usize] += 1;
            }
        }
        assert!(covered.iter().all(|&c| c == 1), "{covered:?}");
        // 5 rows x 7 = 35 pairs: one block; 35 x 7 = 245: four; 1 x 7: one.
        assert_eq!(tiles.len(), 6);
        let last_row = |tl: &[u32]| ((tl[2] + 64).min((tl[1] - tl[0]) * g) - 1) / g;
        assert!(tiles.windows(2).all(|w| last_row(w[0]) >= last_row(w[1])));
        assert_eq!(tiles[0], &[5, 40, 192]);
    }
}
