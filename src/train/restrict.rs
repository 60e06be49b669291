//! Log-probabilities under a distribution restricted to an allowed set of tokens.
//!
//! Constrained decoding samples a token from the policy renormalised on what the grammar allows,
//! `pi_c(a) = pi(a) / pi(A)`. RL must score the token under that distribution: the full
//! log-probability's gradient `head_a - E_pi[head]` also pushes mass off tokens the grammar
//! would never let through, and where the grammar overruled the policy (little mass on `A`) it is
//! dominated by that push. For the rows a batch restricts, the forward replaces the full
//! log-probability with `logit_a - logsumexp_{b in A} logit_b` and the backward uses its exact
//! gradient `head_a - E_{pi_c}[head]` (and the matching head gradient). Logits of the restricted
//! rows are computed with the backend's GEMMs, `CHUNK` rows at a time; the set arithmetic is on
//! the host.

use crate::engine::{Backend, HostData, Tensor};
use crate::model::constraint::TokenSet;
use crate::train::error::{Result, TrainError};

/// Rows whose logits are materialised at once.
const CHUNK: usize = 256;

/// The restricted rows of a batch, kept from the forward for the backward.
pub struct Restricted {
    /// Row indices.
    pub rows: Vec<u32>,
    /// The allowed set of each row.
    pub sets: Vec<TokenSet>,
    /// The target of each row.
    pub targets: Vec<u32>,
}

/// `logsumexp` of `row` over the ids in `set`.
fn set_lse(row: &[f32], set: &TokenSet) -> f64 {
    let m = row
        .iter()
        .enumerate()
        .filter(|&(i, _)| set.contains(i as u32))
        .fold(f64::NEG_INFINITY, |a, (_, &v)| a.max(v as f64));
    let s: f64 = row
        .iter()
        .enumerate()
        .filter(|&(i, _)| set.contains(i as u32))
        .map(|(_, &v)| (v as f64 - m).exp())
        .sum();
    m + s.ln()
}

impl Restricted {
    /// Checks the rows against the batch (`targets` of every row, `vocab` of the head).
    pub fn new(rows: &[(usize, TokenSet)], targets: &[u32], vocab: usize) -> Result<Self> {
        let mut out = Restricted {
            rows: Vec::with_capacity(rows.len()),
            sets: Vec::with_capacity(rows.len()),
            targets: Vec::with_capacity(rows.len()),
        };
        for (row, set) in rows {
            let t = *targets.get(*row).ok_or_else(|| {
                TrainError::Input(format!(
                    "restricted row {row} is outside a batch of {} rows",
                    targets.len()
                ))
            })?;
            if set.vocab() != vocab {
                return Err(TrainError::Input(format!(
                    "row {row}: allowed set over {} tokens for a head of {vocab}",
                    set.vocab()
                )));
            }
            if !set.contains(t) {
                return Err(TrainError::Input(format!(
                    "row {row}: target {t} is not in its allowed set"
                )));
            }
            out.rows.push(*row as u32);
            out.sets.push(set.clone());
            out.targets.push(t);
        }
        Ok(out)
    }

    /// Host logits `[c, V]` of rows `a..z` from head inputs `h [T, D]`, and the rows tensor.
    fn logits<B: Backend>(
        &self,
        be: &B,
        h: &Tensor<B>,
        head: &Tensor<B>,
        a: usize,
        z: usize,
    ) -> Result<(Tensor<B>, Tensor<B>, Vec<f32>)> {
        let rows = be.upload(HostData::U32(&self.rows[a..z]), &[z - a])?;
        let hs = be.gather_rows(h, &rows)?;
        let logits = be.linear(&hs, head, None)?;
        let host = be.to_host_f32(&logits)?;
        Ok((rows, hs, host))
    }

    /// The restricted log-probability of each row's target, and the entropy of each row's
    /// restricted distribution (the one constrained decoding sampled from).
    pub fn logprobs<B: Backend>(
        &self,
        be: &B,
        h: &Tensor<B>,
        head: &Tensor<B>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let v = head.shape()[0];
        let mut out = Vec::with_capacity(self.rows.len());
        let mut ent = Vec::with_capacity(self.rows.len());
        for a in (0..self.rows.len()).step_by(CHUNK) {
            let z = (a + CHUNK).min(self.rows.len());
            let (_, _, host) = self.logits(be, h, head, a, z)?;
            for k in a..z {
                let row = &host[(k - a) * v..(k - a + 1) * v];
                let lse = set_lse(row, &self.sets[k]);
                out.push((row[self.targets[k] as usize] as f64 - lse) as f32);
                let h: f64 = row
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| self.sets[k].contains(i as u32))
                    .map(|(_, &x)| {
                        let lp = x as f64 - lse;
                        -lp * lp.exp()
                    })
                    .sum();
                ent.push(h as f32);
            }
        }
        Ok((out, ent))
    }

    /// Backward for `dL/dlogp_c = g[k]` per restricted row: adds the head gradient to `dhead`
    /// and returns the `(rows, dh_rows)` chunks to scatter-add into `dh`.
    pub fn backward<B: Backend>(
        &self,
        be: &B,
        h: &Tensor<B>,
        head: &Tensor<B>,
        g: &[f32],
        mut dhead: Option<&mut Tensor<B>>,
    ) -> Result<Vec<(Tensor<B>, Tensor<B>)>> {
        let (v, d) = (head.shape()[0], head.shape()[1]);
        let mut out = Vec::new();
        for a in (0..self.rows.len()).step_by(CHUNK) {
            let z = (a + CHUNK).min(self.rows.len());
            if g[a..z].iter().all(|&x| x == 0.0) {
                continue;
            }
            let (rows, hs, host) = self.logits(be, h, head, a, z)?;
            let mut dl = vec![0.0f32; (z - a) * v];
            for k in a..z {
                if g[k] == 0.0 {
                    continue;
                }
                let row = &host[(k - a) * v..(k - a + 1) * v];
                let set = &self.sets[k];
                let lse = set_lse(row, set);
                let dst = &mut dl[(k - a) * v..(k - a + 1) * v];
                for (b, x) in dst.iter_mut().enumerate() {
                    if set.contains(b as u32) {
                        *x = -g[k] * (row[b] as f64 - lse).exp() as f32;
                    }
                }
                dst[self.targets[k] as usize] += g[k];
            }
            let dlt = be.upload(HostData::F32(&dl), &[z - a, v])?;
            let mut dhs = be.zeros(&[z - a, d], crate::engine::DType::F32)?;
            be.matmul(&dlt, false, head, false, &mut dhs, false)?;
            if let Some(dh) = dhead.as_deref_mut() {
                be.matmul(&dlt, true, &hs, false, dh, true)?;
            }
            out.push((rows, dhs));
        }
        Ok(out)
    }
}
