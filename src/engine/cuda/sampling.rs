//! Sampling on the GPU: per-row parameters packed into the kernel's `SampleParams` records, one
//! block per row (see kernels/sampling.cu for the algorithm), ids and log-probs copied back.

use super::ops::{float_dtype, shape_err};
use super::{Arg, Cuda};
use crate::engine::error::{EngineError, Result};
use crate::engine::sampling::{Sampled, SamplingParams};
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

pub(crate) fn sample(
    be: &Cuda,
    logits: &Tensor<Cuda>,
    params: &[SamplingParams],
    counters: &[u64],
) -> Result<Vec<Sampled>> {
    let op = "sample";
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
    if b == 0 {
        return Ok(Vec::new());
    }
    if v == 0 {
        return Err(shape_err(op, "empty vocabulary".into()));
    }
    for p in params {
        p.validate()
            .map_err(|e| EngineError::HostData(format!("sampling parameters: {e}")))?;
    }
    let dt = float_dtype(op, logits)?;
    let mut bytes = Vec::with_capacity(b * RECORD);
    for (p, &c) in params.iter().zip(counters) {
        bytes.extend_from_slice(&pack(p, c));
    }
    let recs = be.upload_bytes(&bytes, &[b * RECORD / 4], DType::U32)?;
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
    Ok(ib
        .chunks_exact(4)
        .zip(lb.chunks_exact(4))
        .map(|(i, l)| Sampled {
            id: u32::from_le_bytes([i[0], i[1], i[2], i[3]]),
            logprob: f32::from_le_bytes([l[0], l[1], l[2], l[3]]),
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
