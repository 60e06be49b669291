//! Restricted (allowed-set) log-probabilities on the GPU (`kernels/restrict.cu`): the rows'
//! bitsets, targets and gradient coefficients go up in one upload, one block per row reduces
//! the logits in place, and only `[2c]` values (log-probabilities and entropies) come back, or
//! nothing: the logit gradients stay on the device for the head GEMMs.

use super::ops::{float_dtype, shape_err};
use super::{Arg, Cuda};
use crate::engine::error::Result;
use crate::engine::restricted::check_rows;
use crate::engine::{DType, Tensor};

/// Masks (`[c, ceil(V/32)]`; words a short mask lacks are 0), targets, then the optional
/// gradient coefficients as f32 bits: one buffer of u32 words.
fn pack(
    masks: &[&[u32]],
    targets: &[u32],
    words: usize,
    grads: Option<(&[f32], &[f32])>,
) -> Vec<u32> {
    let mut w = Vec::with_capacity(masks.len() * (words + 3));
    for m in masks {
        w.extend((0..words).map(|i| m.get(i).copied().unwrap_or(0)));
    }
    w.extend_from_slice(targets);
    if let Some((g, ge)) = grads {
        w.extend(g.iter().chain(ge).map(|x| x.to_bits()));
    }
    w
}

/// Uploads the packed inputs; returns the buffer and the device addresses of the masks, the
/// targets and the coefficients.
fn upload(be: &Cuda, words: &[u32], c: usize, w: usize) -> Result<(Tensor<Cuda>, u64, u64, u64)> {
    let bytes: Vec<u8> = words.iter().flat_map(|x| x.to_le_bytes()).collect();
    let up = be.upload_bytes(&bytes, &[words.len()], DType::U32)?;
    let masks = be.ptr(&up);
    let targets = masks + 4 * (c * w) as u64;
    let coef = targets + 4 * c as u64;
    Ok((up, masks, targets, coef))
}

/// [`crate::engine::Backend::masked_logprobs`] on the device.
pub(crate) fn masked_logprobs(
    be: &Cuda,
    logits: &Tensor<Cuda>,
    masks: &[&[u32]],
    targets: &[u32],
) -> Result<(Vec<f32>, Vec<f32>)> {
    let op = "masked_logprobs";
    let (c, v) = logits.dims2(op)?;
    check_rows(op, (c, v), masks, targets, None)?;
    if c == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    if v == 0 {
        return Err(shape_err(op, "empty vocabulary".into()));
    }
    let dt = float_dtype(op, logits)?;
    let w = v.div_ceil(32);
    let (_up, m, t, _) = upload(be, &pack(masks, targets, w, None), c, w)?;
    let out = be.alloc(&[2 * c], DType::F32, false)?;
    be.launch(
        &format!("masked_logprobs_{}", Cuda::suffix(op, dt)?),
        (c as u32, 1),
        1024,
        &[
            Arg::P(be.ptr(logits)),
            Arg::P(m),
            Arg::U(w as u32),
            Arg::P(t),
            Arg::P(be.ptr(&out)),
            Arg::U(v as u32),
            Arg::U(c as u32),
        ],
    )?;
    let bytes = be.download_bytes(&out)?;
    let vals: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let (lp, ent) = vals.split_at(c);
    Ok((lp.to_vec(), ent.to_vec()))
}

/// [`crate::engine::Backend::masked_dlogits`] on the device.
pub(crate) fn masked_dlogits(
    be: &Cuda,
    logits: &Tensor<Cuda>,
    masks: &[&[u32]],
    targets: &[u32],
    g: &[f32],
    g_ent: &[f32],
) -> Result<Tensor<Cuda>> {
    let op = "masked_dlogits";
    let (c, v) = logits.dims2(op)?;
    check_rows(op, (c, v), masks, targets, Some((g, g_ent)))?;
    let dt = float_dtype(op, logits)?;
    let dl = be.alloc(&[c, v], dt, false)?;
    if c == 0 {
        return Ok(dl);
    }
    if v == 0 {
        return Err(shape_err(op, "empty vocabulary".into()));
    }
    let w = v.div_ceil(32);
    let (_up, m, t, coef) = upload(be, &pack(masks, targets, w, Some((g, g_ent))), c, w)?;
    be.launch(
        &format!("masked_dlogits_{}", Cuda::suffix(op, dt)?),
        (c as u32, 1),
        1024,
        &[
            Arg::P(be.ptr(logits)),
            Arg::P(m),
            Arg::U(w as u32),
            Arg::P(t),
            Arg::P(coef),
            Arg::P(be.ptr(&dl)),
            Arg::U(v as u32),
            Arg::U(c as u32),
        ],
    )?;
    Ok(dl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_pads_short_masks_and_appends_targets_then_coefficients() {
        let a = [0b101u32];
        let b = [1u32, 2, 3];
        let w = pack(&[&a, &b], &[4, 5], 2, Some((&[1.5, -2.0], &[0.0, 0.25])));
        assert_eq!(&w[..4], &[0b101, 0, 1, 2]);
        assert_eq!(&w[4..6], &[4, 5]);
        let f: Vec<f32> = w[6..].iter().map(|&x| f32::from_bits(x)).collect();
        assert_eq!(f, vec![1.5, -2.0, 0.0, 0.25]);
    }
}
