//! Selftest checks of the grammar-masked sampler (`Backend::sample_masked`, kernels
//! `sample_masked_*`) against the host reference (the CPU backend) on the same logits: the same
//! token (greedy; untruncated rows by Gumbel-max, bit for bit; top-k / top-p by inverse CDF, whose
//! candidates take the kernel's exact path here), tokens always inside the mask, unconstrained log-probabilities
//! and allowed log-masses within tolerance, rows that allow no finite logit reported as such,
//! a chi-square test of the frequencies under a three-token mask, and one device-to-host copy
//! per call (the logits stay on the device).

use anyhow::Result;

use sorft::engine::backend::{Backend, HostData};
use sorft::engine::rng::SplitMix;
use sorft::engine::sampling::{
    inv_temperature, log_sum_exp, mask_bit, MaskedSample, SamplingParams,
};
use sorft::engine::{Cpu, Cuda, DType};

use super::Checks;

/// Sampling modes checked: (temperature, top-k, top-p).
const MODES: [(f32, usize, f32); 5] = [
    (0.0, 0, 1.0),
    (1.0, 0, 1.0),
    (1.0, 5, 1.0),
    (0.8, 0, 0.9),
    (0.7, 20, 0.5),
];

/// Runs every masked-sampler check on `gpu`, in f32 and bf16.
pub fn checks(gpu: &Cuda, seed: u64, c: &mut Checks) -> Result<()> {
    for dtype in [DType::F32, DType::BF16] {
        let be = gpu.with_dtype(dtype)?;
        for vocab in [1000usize, 1057] {
            agreement(&be, vocab, seed, c)?;
        }
        frequencies(&be, seed, c)?;
    }
    transfers(gpu, c)
}

/// Logits of `rows` rows over `vocab` (normal, scale 2; every 7th token -inf), rounded to the
/// backend's dtype so that both backends see the same values.
fn logits(vocab: usize, rows: usize, dtype: DType, rng: &mut SplitMix) -> Vec<f32> {
    (0..rows * vocab)
        .map(|i| {
            if (i % vocab) % 7 == 0 {
                return f32::NEG_INFINITY;
            }
            let x = 2.0 * rng.next_normal() as f32;
            if dtype == DType::BF16 {
                half::bf16::from_f32(x).to_f32()
            } else {
                x
            }
        })
        .collect()
}

/// One bitset over `vocab` from a predicate.
fn bits(vocab: usize, f: impl Fn(usize) -> bool) -> Vec<u32> {
    let mut w = vec![0u32; vocab.div_ceil(32)];
    for i in (0..vocab).filter(|&i| f(i)) {
        w[i / 32] |= 1 << (i % 32);
    }
    w
}

/// The rows' masks: unmasked, a random third, one token, nothing, only -inf logits, only the
/// last 40 tokens (the partial last word), a short mask (two words), everything.
fn masks(vocab: usize, rng: &mut SplitMix) -> Vec<Option<Vec<u32>>> {
    let third: Vec<bool> = (0..vocab).map(|_| rng.below(3) == 0).collect();
    vec![
        None,
        Some(bits(vocab, |i| third[i])),
        Some(bits(vocab, |i| i == vocab / 2 + 1)),
        Some(bits(vocab, |_| false)),
        Some(bits(vocab, |i| i % 7 == 0)),
        Some(bits(vocab, |i| i + 40 >= vocab)),
        Some(bits(64, |i| i % 2 == 1)),
        Some(bits(vocab, |_| true)),
    ]
}

/// `x / T - logsumexp(row / T)` for token `id` (the unconstrained log-probability), in f64.
fn full_logprob(row: &[f32], id: usize, temperature: f32) -> f64 {
    let inv_t = inv_temperature(temperature);
    row[id] as f64 * inv_t - log_sum_exp(row, inv_t)
}

/// Device and host results of every mode on the rows of [`masks`].
fn agreement(be: &Cuda, vocab: usize, seed: u64, c: &mut Checks) -> Result<()> {
    let dtype = be.dtype();
    let mut rng = SplitMix::new(seed ^ 0x6D61_736B ^ vocab as u64);
    let ms = masks(vocab, &mut rng);
    let rows = ms.len();
    let host = logits(vocab, rows, dtype, &mut rng);
    let dev = be.upload(HostData::F32(&host), &[rows, vocab])?;
    let cpu = Cpu.upload(HostData::F32(&host), &[rows, vocab])?;
    let refs: Vec<Option<&[u32]>> = ms.iter().map(|m| m.as_deref()).collect();
    let counters: Vec<u64> = (0..rows as u64).map(|r| r * 3 + 1).collect();
    for (temperature, top_k, top_p) in MODES {
        let p = SamplingParams {
            temperature,
            top_k,
            top_p,
            seed: seed + 5,
        };
        let params = vec![p; rows];
        let got = be.sample_masked(&dev, &params, &counters, &refs)?;
        let want = Cpu.sample_masked(&cpu, &params, &counters, &refs)?;
        let bad = row_errors(&host, vocab, &refs, &got, &want, p);
        c.push(
            format!(
                "sample_masked V={vocab} T={temperature} top-k={top_k} top-p={top_p} {}",
                dtype.name()
            ),
            bad.is_empty(),
            if bad.is_empty() {
                format!("{rows} rows agree with the host")
            } else {
                bad.join("; ")
            },
        );
    }
    Ok(())
}

/// What is wrong with each device row against the host's (empty when everything agrees).
fn row_errors(
    host: &[f32],
    vocab: usize,
    masks: &[Option<&[u32]>],
    got: &[Option<MaskedSample>],
    want: &[Option<MaskedSample>],
    p: SamplingParams,
) -> Vec<String> {
    let mut bad = Vec::new();
    if got.len() != want.len() {
        return vec![format!("{} rows vs {}", got.len(), want.len())];
    }
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        let row = &host[r * vocab..(r + 1) * vocab];
        let (g, w) = match (g, w) {
            (None, None) => continue,
            (Some(g), Some(w)) => (g, w),
            _ => {
                bad.push(format!("row {r}: device {g:?} host {w:?}"));
                continue;
            }
        };
        let id = g.sampled.id as usize;
        let inside = id < vocab && row[id].is_finite() && masks[r].is_none_or(|m| mask_bit(m, id));
        if !inside {
            bad.push(format!("row {r}: token {id} outside the mask"));
            continue;
        }
        if g.sampled.id != w.sampled.id {
            bad.push(format!("row {r}: token {id} vs {}", w.sampled.id));
        }
        let lp = full_logprob(row, id, p.temperature);
        if (g.sampled.logprob as f64 - lp).abs() > 2e-3 {
            bad.push(format!("row {r}: logprob {} vs {lp}", g.sampled.logprob));
        }
        if (g.log_mass as f64 - w.log_mass as f64).abs() > 2e-3 {
            bad.push(format!(
                "row {r}: log-mass {} vs {}",
                g.log_mass, w.log_mass
            ));
        }
    }
    bad
}

/// 384 rows of one logit vector under a three-token mask (the allowed tokens hold about 3% of
/// the mass): the sampled frequencies against the renormalised allowed distribution, chi-square
/// with 2 degrees of freedom below 13.8 (p = 0.001), untruncated and with top-k 2.
fn frequencies(be: &Cuda, seed: u64, c: &mut Checks) -> Result<()> {
    let (vocab, rows) = (1000usize, 384usize);
    let allowed = [17usize, 500, 999];
    let mut row = vec![0.0f32; vocab];
    row[3] = 6.0;
    row[17] = 1.0;
    row[500] = 0.0;
    row[999] = -0.5;
    let data: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let dev = be.upload(HostData::F32(&data), &[rows, vocab])?;
    let mask = bits(vocab, |i| allowed.contains(&i));
    let masks = vec![Some(mask.as_slice()); rows];
    let counters: Vec<u64> = (0..rows as u64).collect();
    for top_k in [0usize, 2] {
        let p = SamplingParams {
            temperature: 1.0,
            top_k,
            top_p: 1.0,
            seed: seed + 9,
        };
        let out = be.sample_masked(&dev, &vec![p; rows], &counters, &masks)?;
        let kept = if top_k == 2 {
            &allowed[..2]
        } else {
            &allowed[..]
        };
        let z: f64 = kept.iter().map(|&i| (row[i] as f64).exp()).sum();
        let mut count = vec![0usize; kept.len()];
        let mut outside = 0usize;
        for s in out.iter().flatten() {
            match kept.iter().position(|&i| i == s.sampled.id as usize) {
                Some(k) => count[k] += 1,
                None => outside += 1,
            }
        }
        let n = out.iter().flatten().count() as f64;
        let chi2: f64 = kept
            .iter()
            .zip(&count)
            .map(|(&i, &o)| {
                let e = n * (row[i] as f64).exp() / z;
                (o as f64 - e).powi(2) / e
            })
            .sum();
        let limit = if kept.len() == 3 { 13.8 } else { 10.8 };
        c.push(
            format!(
                "sample_masked 3-token mask top-k={top_k} chi-square {}",
                be.dtype().name()
            ),
            outside == 0 && n as usize == rows && chi2 < limit,
            format!("counts {count:?}, {outside} outside, chi2 {chi2:.2} (limit {limit})"),
        );
    }
    Ok(())
}

/// A masked sampling call copies one buffer back (ids, log-probs, log-masses), like an
/// unmasked one: the logits never leave the device.
fn transfers(gpu: &Cuda, c: &mut Checks) -> Result<()> {
    let be = gpu.with_dtype(DType::BF16)?;
    let (vocab, rows) = (1057usize, 4usize);
    let mut rng = SplitMix::new(7);
    let host = logits(vocab, rows, DType::BF16, &mut rng);
    let dev = be.upload(HostData::F32(&host), &[rows, vocab])?;
    let mask = bits(vocab, |i| i % 3 == 1);
    let masks = [Some(mask.as_slice()), None, Some(mask.as_slice()), None];
    let params = vec![SamplingParams::default(); rows];
    let counters = vec![0u64; rows];
    let before = gpu.d2h_transfers();
    be.sample(&dev, &params, &counters)?;
    let plain = gpu.d2h_transfers().since(before);
    let before = gpu.d2h_transfers();
    be.sample_masked(&dev, &params, &counters, &masks)?;
    let masked = gpu.d2h_transfers().since(before);
    c.push(
        "device-to-host transfers per masked sampling call",
        masked.count == plain.count && masked.count == 1,
        format!(
            "{} transfers, {} bytes (unmasked: {}, {} bytes; the logits are {} bytes)",
            masked.count,
            masked.bytes,
            plain.count,
            plain.bytes,
            rows * vocab * 2
        ),
    );
    Ok(())
}
