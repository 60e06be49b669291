//! Sampling on the GPU: per-row parameters packed into the kernel's `SampleParams` records, one
//! block per row (see kernels/sampling.cu for the algorithm), ids and log-probs copied back.

use super::ops::{float_dtype, shape_err};
use super::{Arg, Cuda};
use crate::engine::error::{EngineError, Result};
use crate::engine::sampling::{MaskedSample, Sampled, SamplingParams};
use crate::engine::{DType, Tensor};

/// Bytes of one `SampleParams` record (f32, f32, u32, u32 pad, u64, u64).
pub(crate) const RECORD: usize = 32;

/// The kernel's parameter record of one row.
pub(crate) fn pack(p: &SamplingParams, counter: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[0..4].copy_from_slice(&p.temperature.to_le_bytes());
    r[4..8].copy_from_slice(&p.top_p.to_le_bytes());
    r[8..12].copy_from_slice(&(p.top_k.min(u32::MAX as usize) as u32).to_le_bytes());
    r[16..24].copy_from_slice(&p.seed.to_le_bytes());
    r[24..32].copy_from_slice(&counter.to_le_bytes());
    r
}

/// Checks the rows' shapes and parameters; `(rows, vocab)`.
fn check(
    op: &'static str,
    logits: &Tensor<Cuda>,
    params: &[SamplingParams],
    counters: &[u64],
) -> Result<(usize, usize)> {
    let (b, v) = logits.dims2(op)?;
    if params.len() != b || counters.len() != b {
        return Err(shape_err(
            op,
            format!(
                "{b} rows but {} parameter sets and {} counters",
                params.len(),
                counters.len()
            ),
        ));
    }
    if b > 0 && v == 0 {
        return Err(shape_err(op, "empty vocabulary".into()));
    }
    for p in params {
        p.validate()
            .map_err(|e| EngineError::HostData(format!("sampling parameters: {e}")))?;
    }
    Ok((b, v))
}

/// The parameter records of all rows, in one byte buffer.
fn records(params: &[SamplingParams], counters: &[u64]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(params.len() * RECORD);
    for (p, &c) in params.iter().zip(counters) {
        bytes.extend_from_slice(&pack(p, c));
    }
    bytes
}

/// Little-endian u32 / f32 words of a downloaded buffer.
fn words(bytes: &[u8]) -> impl Iterator<Item = [u8; 4]> + '_ {
    bytes.chunks_exact(4).map(|w| [w[0], w[1], w[2], w[3]])
}

/// One block per row of `logits [B, V]`; ids and log-probabilities copied back in one download.
pub(crate) fn sample(
    be: &Cuda,
    logits: &Tensor<Cuda>,
    params: &[SamplingParams],
    counters: &[u64],
) -> Result<Vec<Sampled>> {
    let op = "sample";
    let (b, v) = check(op, logits, params, counters)?;
    if b == 0 {
        return Ok(Vec::new());
    }
    let dt = float_dtype(op, logits)?;
    let recs = be.upload_bytes(&records(params, counters), &[b * RECORD / 4], DType::U32)?;
    // Ids and log-probabilities in one buffer (ids, then f32 log-probs): one download.
    let out = be.alloc(&[2 * b], DType::U32, false)?;
    let ids = be.ptr(&out);
    let lps = ids + 4 * b as u64;
    be.launch(
        &format!("sample_{}", Cuda::suffix(op, dt)?),
        (b as u32, 1),
        1024,
        &[
            Arg::P(be.ptr(logits)),
            Arg::P(be.ptr(&recs)),
            Arg::P(ids),
            Arg::P(lps),
            Arg::U(v as u32),
        ],
    )?;
    let bytes = be.download_bytes(&out)?;
    let (ib, lb) = bytes.split_at(4 * b);
    Ok(words(ib)
        .zip(words(lb))
        .map(|(i, l)| Sampled {
            id: u32::from_le_bytes(i),
            logprob: f32::from_le_bytes(l),
        })
        .collect())
}

/// Parameter records then `[B, ceil(V/32)]` mask words (all ones for a row without a mask;
/// words a short mask lacks are 0, as the host reference reads them): one upload.
fn records_and_masks(
    params: &[SamplingParams],
    counters: &[u64],
    masks: &[Option<&[u32]>],
    words_per_row: usize,
) -> Vec<u8> {
    let mut bytes = records(params, counters);
    bytes.reserve(masks.len() * words_per_row * 4);
    for m in masks {
        for w in 0..words_per_row {
            let word = match m {
                None => u32::MAX,
                Some(m) => m.get(w).copied().unwrap_or(0),
            };
            bytes.extend_from_slice(&word.to_le_bytes());
        }
    }
    bytes
}

/// [`crate::engine::Backend::sample_masked`] on the device: the masks go up with the parameter
/// records in one upload; ids, log-probabilities and allowed log-masses come back in one download.
pub(crate) fn sample_masked(
    be: &Cuda,
    logits: &Tensor<Cuda>,
    params: &[SamplingParams],
    counters: &[u64],
    masks: &[Option<&[u32]>],
) -> Result<Vec<Option<MaskedSample>>> {
    let op = "sample_masked";
    let (b, v) = check(op, logits, params, counters)?;
    if masks.len() != b {
        return Err(shape_err(op, format!("{b} rows but {} masks", masks.len())));
    }
    if b == 0 {
        return Ok(Vec::new());
    }
    let dt = float_dtype(op, logits)?;
    let w = v.div_ceil(32);
    let bytes = records_and_masks(params, counters, masks, w);
    let up = be.upload_bytes(&bytes, &[bytes.len() / 4], DType::U32)?;
    let recs = be.ptr(&up);
    let mask_words = recs + (b * RECORD) as u64;
    // ids, log-probs, log-masses: one buffer, one download
    let out = be.alloc(&[3 * b], DType::U32, false)?;
    let ids = be.ptr(&out);
    let lps = ids + 4 * b as u64;
    let lms = lps + 4 * b as u64;
    be.launch(
        &format!("sample_masked_{}", Cuda::suffix(op, dt)?),
        (b as u32, 1),
        1024,
        &[
            Arg::P(be.ptr(logits)),
            Arg::P(recs),
            Arg::P(ids),
            Arg::P(lps),
            Arg::U(v as u32),
            Arg::P(mask_words),
            Arg::U(w as u32),
            Arg::P(lms),
        ],
    )?;
    let bytes = be.download_bytes(&out)?;
    let (ib, rest) = bytes.split_at(4 * b);
    let (lb, mb) = rest.split_at(4 * b);
    Ok(words(ib)
        .zip(words(lb))
        .zip(words(mb))
        .zip(masks)
        .map(|(((i, l), m), mask)| {
            let id = u32::from_le_bytes(i);
            (id != u32::MAX).then(|| MaskedSample {
                sampled: Sampled {
                    id,
                    logprob: f32::from_le_bytes(l),
                },
                log_mass: if mask.is_some() {
                    f32::from_le_bytes(m)
                } else {
                    0.0
                },
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_match_the_kernel_layout() {
        let p = SamplingParams {
            temperature: 0.5,
            top_k: 7,
            top_p: 0.9,
            seed: 0x0102_0304_0506_0708,
        };
        let r = pack(&p, 3);
        assert_eq!(f32::from_le_bytes(r[0..4].try_into().unwrap()), 0.5);
        assert_eq!(f32::from_le_bytes(r[4..8].try_into().unwrap()), 0.9);
        assert_eq!(u32::from_le_bytes(r[8..12].try_into().unwrap()), 7);
        assert_eq!(&r[12..16], &[0, 0, 0, 0]);
        assert_eq!(u64::from_le_bytes(r[16..24].try_into().unwrap()), p.seed);
        assert_eq!(u64::from_le_bytes(r[24..32].try_into().unwrap()), 3);
        let big = SamplingParams {
            top_k: usize::MAX,
            ..p
        };
        assert_eq!(
            u32::from_le_bytes(pack(&big, 0)[8..12].try_into().unwrap()),
            u32::MAX
        );
    }
}
