//! Sampling parameters and the host reference sampler (used by the CPU backend and as the
//! reference the CUDA sampler is checked against).

use serde::{Deserialize, Serialize};

use crate::engine::rng;

/// How one sequence picks its next token.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` disables.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; `1` disables.
    pub top_p: f32,
    /// The sequence's random seed.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// Whether these parameters are usable (finite temperature >= 0, top-p in (0, 1]).
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        Ok(())
    }
}

/// One sampled token.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampled {
    /// The token id.
    pub id: u32,
    /// Its log-probability under the temperature-scaled full distribution
    /// (`log_softmax(logits / T)`, or `log_softmax(logits)` when greedy), before top-k/top-p
    /// truncation: the quantity a policy-gradient method needs.
    pub logprob: f32,
}

/// `1 / T` of a sampling temperature; `T <= 0` (greedy) reads as 1.
pub fn inv_temperature(temperature: f32) -> f64 {
    if temperature > 0.0 {
        1.0 / temperature as f64
    } else {
        1.0
    }
}

/// Log-sum-exp of `x / t` in f64 (`inv_t` = `1 / t`).
pub fn log_sum_exp(x: &[f32], inv_t: f64) -> f64 {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64 * inv_t;
    let s: f64 = x.iter().map(|&v| (v as f64 * inv_t - m).exp()).sum();
    m + s.ln()
}

/// The candidate set after top-k and top-p, as (token, probability) sorted by decreasing
/// probability (ties by increasing id), probabilities renormalised over the set.
pub fn truncated_distribution(logits: &[f32], p: &SamplingParams) -> Vec<(u32, f64)> {
    let inv_t = inv_temperature(p.temperature);
    let lse = log_sum_exp(logits, inv_t);
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit_desc = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if p.top_k > 0 && p.top_k < idx.len() {
        idx.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
        idx.truncate(p.top_k);
    }
    idx.sort_unstable_by(by_logit_desc);
    let mut probs: Vec<(u32, f64)> = idx
        .into_iter()
        .map(|i| (i, (logits[i as usize] as f64 * inv_t - lse).exp()))
        .collect();
    let total: f64 = probs.iter().map(|x| x.1).sum();
    for x in probs.iter_mut() {
        x.1 /= total;
    }
    if p.top_p < 1.0 {
        let mut cum = 0.0;
        let mut keep = probs.len();
        for (i, x) in probs.iter().enumerate() {
            cum += x.1;
            if cum >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep.max(1));
        let total: f64 = probs.iter().map(|x| x.1).sum();
        for x in probs.iter_mut() {
            x.1 /= total;
        }
    }
    probs
}

/// Samples one token from a row of logits (host reference implementation).
pub fn sample_row(logits: &[f32], p: &SamplingParams, counter: u64) -> Sampled {
    if logits.is_empty() {
        return Sampled {
            id: 0,
            logprob: f32::NEG_INFINITY,
        };
    }
    if p.temperature <= 0.0 {
        let mut best = 0usize;
        for (i, &v) in logits.iter().enumerate() {
            if v > logits[best] {
                best = i;
            }
        }
        let lse = log_sum_exp(logits, 1.0);
        return Sampled {
            id: best as u32,
            logprob: (logits[best] as f64 - lse) as f32,
        };
    }
    let inv_t = 1.0 / p.temperature as f64;
    let lse = log_sum_exp(logits, inv_t);
    if untruncated(p, logits.len()) {
        let id = gumbel_max(logits, 1.0 / p.temperature, p.seed, counter);
        return Sampled {
            id,
            logprob: (logits[id as usize] as f64 * inv_t - lse) as f32,
        };
    }
    let dist = truncated_distribution(logits, p);
    let u = rng::uniform(p.seed, 0, counter);
    let mut cum = 0.0;
    let mut id = dist[dist.len() - 1].0;
    for &(t, q) in &dist {
        cum += q;
        if u < cum {
            id = t;
            break;
        }
    }
    Sampled {
        id,
        logprob: (logits[id as usize] as f64 * inv_t - lse) as f32,
    }
}

/// Whether a sampled row keeps every token (no top-k below `v`, no top-p): such rows are drawn
/// by Gumbel-max, on the host exactly as the CUDA sampler draws them.
pub fn untruncated(p: &SamplingParams, v: usize) -> bool {
    (p.top_k == 0 || p.top_k >= v) && p.top_p >= 1.0
}

/// The Gumbel noise added to token `i`'s scaled logit at `counter`: `-ln(-ln u)` of the
/// counter-based uniform of stream `i + 1`, rounded to f32 (the CUDA kernels' `gumbel`).
pub fn gumbel(seed: u64, i: u32, counter: u64) -> f32 {
    let u = rng::uniform(seed, i as u64 + 1, counter);
    let u = if u <= 0.0 { 1e-300 } else { u };
    (-(-u.ln()).ln()) as f32
}

/// Gumbel-max over a whole row: the arg-max of `z * inv_t + gumbel` in f32 (products and sums
/// rounded once each, as the kernel's `__fmul_rn` / `__fadd_rn`), lowest id on ties, `-inf`
/// tokens never drawn; token 0 when no key is a number. Exact samples from `softmax(z * inv_t)`.
pub fn gumbel_max(logits: &[f32], inv_t: f32, seed: u64, counter: u64) -> u32 {
    let (mut best_key, mut best) = (f32::NEG_INFINITY, u32::MAX);
    for (i, &z) in logits.iter().enumerate() {
        let x = z * inv_t;
        if x == f32::NEG_INFINITY {
            continue;
        }
        let key = x + gumbel(seed, i as u32, counter);
        // Ascending ids: a tie keeps the lower id already held.
        if key > best_key || (key == best_key && best == u32::MAX) {
            (best_key, best) = (key, i as u32);
        }
    }
    if best == u32::MAX {
        0
    } else {
        best
    }
}

/// Whether bit `id` of a packed mask (bit `i % 32` of word `i / 32`) is set.
pub fn mask_bit(mask: &[u32], id: usize) -> bool {
    mask.get(id / 32).is_some_and(|w| w & (1 << (id % 32)) != 0)
}

/// Samples one row with the tokens outside the packed `mask` (see [`mask_bit`]) taken out, as a
/// constrained step hands it to the sampler; `None` when the mask leaves no finite logit. The
/// log-probability is the token's under the unmasked distribution at the temperature (the
/// caller subtracts the allowed set's log-mass for the renormalised one).
pub fn sample_row_masked(
    logits: &[f32],
    mask: &[u32],
    p: &SamplingParams,
    counter: u64,
) -> Option<Sampled> {
    let mut masked = logits.to_vec();
    let mut any = false;
    for (i, v) in masked.iter_mut().enumerate() {
        if mask_bit(mask, i) && v.is_finite() {
            any = true;
        } else {
            *v = f32::NEG_INFINITY;
        }
    }
    if !any {
        return None;
    }
    let s = sample_row(&masked, p, counter);
    let inv_t = inv_temperature(p.temperature);
    let lse = log_sum_exp(logits, inv_t);
    Some(Sampled {
        id: s.id,
        logprob: (logits[s.id as usize] as f64 * inv_t - lse) as f32,
    })
}

/// One row of [`crate::engine::Backend::sample_masked`]: the token, its log-probability under
/// the *unconstrained* distribution at the temperature, and the allowed set's log-probability mass
/// at that temperature (0 for a row without a mask). The renormalised log-probability RL scores a
/// constrained token under is `sampled.logprob - log_mass`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MaskedSample {
    /// The token and its unconstrained log-probability.
    pub sampled: Sampled,
    /// `log sum_{b allowed} softmax(row / T)_b`.
    pub log_mass: f32,
}

/// `log sum_{b in mask} softmax(row / T)_b` over the finite logits (`T <= 0` reads as 1, like
/// greedy log-probabilities); `mask` is the bitset layout of [`sample_row_masked`].
pub fn masked_log_mass(row: &[f32], mask: &[u32], temperature: f32) -> f64 {
    let inv_t = inv_temperature(temperature);
    let m = row
        .iter()
        .filter(|v| v.is_finite())
        .fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64 * inv_t));
    let (mut all, mut inside) = (0.0f64, 0.0f64);
    for (i, &v) in row.iter().enumerate() {
        if !v.is_finite() {
            continue;
        }
        let p = (v as f64 * inv_t - m).exp();
        all += p;
        if mask_bit(mask, i) {
            inside += p;
        }
    }
    (inside / all).ln()
}

/// The host reference of [`crate::engine::Backend::sample_masked`] over `logits [B, V]` (row
/// major, `v` per row): rows without a mask are sampled as [`sample_row`] does, rows with one as
/// [`sample_row_masked`] does plus their allowed log-mass; `None` where a mask allows no finite
/// logit.
pub fn sample_rows_masked(
    logits: &[f32],
    v: usize,
    params: &[SamplingParams],
    counters: &[u64],
    masks: &[Option<&[u32]>],
) -> Vec<Option<MaskedSample>> {
    use rayon::prelude::*;
    logits
        .par_chunks(v.max(1))
        .zip(params.par_iter().zip(counters.par_iter()))
        .zip(masks.par_iter())
        .map(|((row, (p, &c)), mask)| match mask {
            None => Some(MaskedSample {
                sampled: sample_row(row, p, c),
                log_mass: 0.0,
            }),
            Some(m) => sample_row_masked(row, m, p, c).map(|s| MaskedSample {
                sampled: s,
                log_mass: masked_log_mass(row, m, p.temperature) as f32,
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32, k: usize, p: f32) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            seed: 11,
        }
    }

    #[test]
    fn top_k_keeps_the_k_largest() {
        let logits = [0.0, 3.0, 1.0, 2.0, -1.0];
        let d = truncated_distribution(&logits, &params(1.0, 2, 1.0));
        let ids: Vec<u32> = d.iter().map(|x| x.0).collect();
        assert_eq!(ids, vec![1, 3]);
        let e = (1.0f64).exp();
        assert!((d[0].1 - e / (e + 1.0)).abs() < 1e-12);
    }

    #[test]
    fn top_p_keeps_the_smallest_prefix_reaching_p() {
        // probabilities 0.5, 0.25, 0.125, 0.125
        let l = [0.5f32.ln(), 0.25f32.ln(), 0.125f32.ln(), 0.125f32.ln()];
        let ids = |p: f32| -> Vec<u32> {
            truncated_distribution(&l, &params(1.0, 0, p))
                .iter()
                .map(|x| x.0)
                .collect()
        };
        assert_eq!(ids(0.5), vec![0]);
        assert_eq!(ids(0.6), vec![0, 1]);
        assert_eq!(ids(0.75), vec![0, 1]);
        assert_eq!(ids(0.8), vec![0, 1, 2]);
        assert_eq!(ids(0.01), vec![0]);
    }

    #[test]
    fn a_masked_row_samples_inside_the_mask_even_with_minus_infinity_logits() {
        let logits = [3.0f32, f32::NEG_INFINITY, 0.5, 1.0, -2.0];
        // Only token 2 and the -inf token 1 are in the mask: 2 always, with its full logprob.
        let mask = [0b00110u32];
        let lse = [3.0f64, 0.5, 1.0, -2.0]
            .iter()
            .map(|x| x.exp())
            .sum::<f64>()
            .ln();
        for c in 0..50 {
            let s = sample_row_masked(&logits, &mask, &params(1.0, 0, 1.0), c).expect("one");
            assert_eq!(s.id, 2);
            assert!((s.logprob as f64 - (0.5 - lse)).abs() < 1e-6);
        }
        assert!(sample_row_masked(&logits, &[0b00010], &params(1.0, 0, 1.0), 0).is_none());
        let g = sample_row_masked(&logits, &[0b11000], &SamplingParams::greedy(), 0);
        assert_eq!(g.map(|s| s.id), Some(3));
        assert!(!mask_bit(&mask, 40));
    }

    #[test]
    fn greedy_picks_argmax_with_full_logprob() {
        let logits = [0.1, 2.0, -3.0];
        let s = sample_row(&logits, &SamplingParams::greedy(), 0);
        assert_eq!(s.id, 1);
        let lse = logits.iter().map(|&x| (x as f64).exp()).sum::<f64>().ln();
        assert!((s.logprob as f64 - (2.0 - lse)).abs() < 1e-6);
    }

    #[test]
    fn sampled_frequencies_follow_the_distribution_chi_square() {
        // Target: softmax of these logits at T = 0.7 restricted to the top 4 tokens.
        let logits = [1.0f32, 0.5, 0.0, -0.5, -1.0, -2.0];
        let p = params(0.7, 4, 1.0);
        let dist = truncated_distribution(&logits, &p);
        let n = 40_000u64;
        let mut counts = [0u64; 6];
        for c in 0..n {
            counts[sample_row(&logits, &p, c).id as usize] += 1;
        }
        assert_eq!(counts[4] + counts[5], 0, "truncated tokens were sampled");
        let chi2: f64 = dist
            .iter()
            .map(|&(t, q)| {
                let e = q * n as f64;
                (counts[t as usize] as f64 - e).powi(2) / e
            })
            .sum();
        // 3 degrees of freedom: P(chi2 > 16.27) = 0.001.
        assert!(chi2 < 16.27, "chi2 {chi2}, counts {counts:?}");
    }

    #[test]
    fn untruncated_gumbel_max_draws_follow_the_softmax_chi_square() {
        let logits = [1.0f32, 0.5, 0.0, -0.5, f32::NEG_INFINITY, -1.5];
        let p = params(0.8, 0, 1.0);
        assert!(untruncated(&p, logits.len()) && !untruncated(&params(0.8, 3, 1.0), 6));
        let n = 40_000u64;
        let mut counts = [0u64; 6];
        for c in 0..n {
            counts[sample_row(&logits, &p, c).id as usize] += 1;
        }
        assert_eq!(counts[4], 0, "a -inf token was drawn");
        let lse = log_sum_exp(&logits, 1.25);
        let chi2: f64 = [0usize, 1, 2, 3, 5]
            .iter()
            .map(|&t| {
                let e = (logits[t] as f64 * 1.25 - lse).exp() * n as f64;
                (counts[t] as f64 - e).powi(2) / e
            })
            .sum();
        // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
        assert!(chi2 < 18.47, "chi2 {chi2}, counts {counts:?}");
        // A row with nothing finite draws token 0 instead of reading past the row.
        let none = [f32::NEG_INFINITY, f32::NAN];
        assert_eq!(sample_row(&none, &p, 0).id, 0);
    }

    #[test]
    fn same_seed_same_samples_other_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = params(1.0, 0, 0.95);
        let a: Vec<u32> = (0..64).map(|c| sample_row(&logits, &p, c).id).collect();
        let b: Vec<u32> = (0..64).map(|c| sample_row(&logits, &p, c).id).collect();
        let q = SamplingParams { seed: 12, ..p };
        let c: Vec<u32> = (0..64).map(|c| sample_row(&logits, &q, c).id).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
