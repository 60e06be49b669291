//! Log-probabilities under a distribution restricted to an allowed set of tokens.
//!
//! Constrained decoding samples a token from the policy renormalised on what the grammar allows,
//! `pi_c(a) = pi(a) / pi(A)`. RL must score the token under that distribution: the full
//! log-probability's gradient `head_a - E_pi[head]` also pushes mass off tokens the grammar
//! would never let through, and where the grammar overruled the policy (little mass on `A`) it is
//! dominated by that push. For the rows a batch restricts, the forward replaces the full
//! log-probability with `logit_a - logsumexp_{b in A} logit_b` and the backward uses its exact
//! gradient `head_a - E_{pi_c}[head]` (and the matching head gradient). The entropy of such a row
//! (logged, and the entropy bonus) is the restricted distribution's too, and so is its gradient
//! `-pi_c(b) (log pi_c(b) + H_c)` on the allowed logits. Logits of the restricted
//! rows are computed with the backend's GEMMs, `CHUNK` rows at a time, and reduced by the
//! backend's `masked_logprobs` / `masked_dlogits` (on a GPU they never leave the device; the host
//! reference is `engine::restricted`).

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
    /// The full (unrestricted) log-probability of each row's target, filled by the forward:
    /// `full_logp - restricted logp` is the log of the mass the policy put on the allowed set.
    pub full_logp: Vec<f32>,
    /// `dL/dlogp_full` per row, set before the backward by a loss on the full distribution of
    /// these rows (the grammar-distillation term `-log pi(A) = logp_c - logp_full`); empty: 0.
    pub full_grad: Vec<f32>,
}

impl Restricted {
    /// Checks the rows against the batch (`targets` of every row, `vocab` of the head).
    pub fn new(rows: &[(usize, TokenSet)], targets: &[u32], vocab: usize) -> Result<Self> {
        let mut out = Restricted {
            rows: Vec::with_capacity(rows.len()),
            sets: Vec::with_capacity(rows.len()),
            targets: Vec::with_capacity(rows.len()),
            full_logp: Vec::new(),
            full_grad: Vec::new(),
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

    /// Logits `[c, V]` of rows `a..z` from head inputs `h [T, D]` (on the backend), the rows
    /// tensor and the gathered inputs.
    fn logits<B: Backend>(
        &self,
        be: &B,
        h: &Tensor<B>,
        head: &Tensor<B>,
        a: usize,
        z: usize,
    ) -> Result<(Tensor<B>, Tensor<B>, Tensor<B>)> {
        let rows = be.upload(HostData::U32(&self.rows[a..z]), &[z - a])?;
        let hs = be.gather_rows(h, &rows)?;
        let logits = be.linear(&hs, head, None)?;
        Ok((rows, hs, logits))
    }

    /// The allowed sets of rows `a..z` as bitsets.
    fn masks(&self, a: usize, z: usize) -> Vec<&[u32]> {
        self.sets[a..z].iter().map(|s| s.words()).collect()
    }

    /// The restricted log-probability of each row's target, and the entropy of each row's
    /// restricted distribution (the one constrained decoding sampled from).
    pub fn logprobs<B: Backend>(
        &self,
        be: &B,
        h: &Tensor<B>,
        head: &Tensor<B>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let mut out = Vec::with_capacity(self.rows.len());
        let mut ent = Vec::with_capacity(self.rows.len());
        for a in (0..self.rows.len()).step_by(CHUNK) {
            let z = (a + CHUNK).min(self.rows.len());
            let (_, _, logits) = self.logits(be, h, head, a, z)?;
            let (lp, e) = be.masked_logprobs(&logits, &self.masks(a, z), &self.targets[a..z])?;
            out.extend(lp);
            ent.extend(e);
        }
        Ok((out, ent))
    }

    /// Backward for `dL/dlogp_c = g[k]` and `dL/dH_c = g_ent[k]` per restricted row: adds the
    /// head gradient to `dhead` and returns the `(rows, dh_rows)` chunks to scatter-add into `dh`.
    pub fn backward<B: Backend>(
        &self,
        be: &B,
        h: &Tensor<B>,
        head: &Tensor<B>,
        g: &[f32],
        g_ent: &[f32],
        mut dhead: Option<&mut Tensor<B>>,
    ) -> Result<Vec<(Tensor<B>, Tensor<B>)>> {
        let d = head.shape()[1];
        let n = self.rows.len();
        if g.len() != n || g_ent.len() != n {
            return Err(TrainError::Input(format!(
                "{n} restricted rows but {} log-probability and {} entropy gradients",
                g.len(),
                g_ent.len()
            )));
        }
        let mut out = Vec::new();
        for a in (0..n).step_by(CHUNK) {
            let z = (a + CHUNK).min(n);
            if (a..z).all(|k| g[k] == 0.0 && g_ent[k] == 0.0) {
                continue;
            }
            let (rows, hs, logits) = self.logits(be, h, head, a, z)?;
            let dlt = be.masked_dlogits(
                &logits,
                &self.masks(a, z),
                &self.targets[a..z],
                &g[a..z],
                &g_ent[a..z],
            )?;
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

/// Backward of the head's per-row log-probabilities and entropies `dL/dlogp = g_logp`,
/// `dL/dH = g_entropy` (`[T]` each) for head inputs `h` (already tempered): rows in `restricted`
/// take the exact gradients of their restricted distribution (log-probability *and* entropy),
/// every other row the full softmax's. Adds the head gradient to `dhead`; returns `dL/dh`.
#[allow(clippy::too_many_arguments)]
pub fn head_backward<B: Backend>(
    be: &B,
    restricted: Option<&Restricted>,
    h: &Tensor<B>,
    head: &Tensor<B>,
    targets: &Tensor<B>,
    g_logp: &Tensor<B>,
    g_entropy: &Tensor<B>,
    chunk_rows: usize,
    mut dhead: Option<&mut Tensor<B>>,
) -> Result<Tensor<B>> {
    let Some(r) = restricted else {
        return Ok(
            be.token_logprobs_backward(h, head, targets, g_logp, g_entropy, chunk_rows, dhead)?
        );
    };
    // Move the restricted rows' coefficients out of the full-softmax backward.
    let mut gl = be.to_host_f32(g_logp)?;
    let mut ge = be.to_host_f32(g_entropy)?;
    let take = |g: &mut Vec<f32>| -> Result<Vec<f32>> {
        r.rows
            .iter()
            .map(|&row| {
                g.get_mut(row as usize).map(std::mem::take).ok_or_else(|| {
                    TrainError::Input(format!("restricted row {row} outside the gradient"))
                })
            })
            .collect()
    };
    let (gr, gre) = (take(&mut gl)?, take(&mut ge)?);
    if !r.full_grad.is_empty() && r.full_grad.len() != r.rows.len() {
        return Err(TrainError::Input(format!(
            "{} restricted rows but {} full-distribution gradients",
            r.rows.len(),
            r.full_grad.len()
        )));
    }
    // A loss on these rows' full distributions goes through the full-softmax backward.
    for (&row, &g) in r.rows.iter().zip(&r.full_grad) {
        gl[row as usize] = g;
    }
    let extra = r.backward(be, h, head, &gr, &gre, dhead.as_deref_mut())?;
    let gl = be.upload(HostData::F32(&gl), &[gl.len()])?;
    let ge = be.upload(HostData::F32(&ge), &[ge.len()])?;
    let mut dh = be.token_logprobs_backward(h, head, targets, &gl, &ge, chunk_rows, dhead)?;
    for (rows, dhs) in &extra {
        be.embedding_backward(&mut dh, rows, dhs)?;
    }
    Ok(dh)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Cpu;

    const H: [f64; 6] = [0.3, -0.2, 0.5, 0.1, 0.4, -0.3];
    const HEAD: [f64; 15] = [
        0.8, -0.1, 0.3, -0.5, 0.6, 0.2, 0.4, 0.4, -0.7, 0.1, -0.9, 0.5, -0.2, 0.3, 0.6,
    ];
    const TARGETS: [u32; 2] = [2, 4];
    const ALLOWED: [u32; 3] = [0, 2, 3];
    const G_LOGP: [f32; 2] = [0.7, -0.4];
    const G_ENT: [f32; 2] = [0.9, 0.5];

    /// `sum_r g_logp[r] logp_r + g_ent[r] H_r` in f64, row 0 over `row0` (restricted) and row 1
    /// over the full vocabulary.
    fn loss(x: &[f64], row0: &[u32]) -> f64 {
        let (h, head) = x.split_at(6);
        let mut l = 0.0;
        for r in 0..2 {
            let logits: Vec<f64> = (0..5)
                .map(|b| (0..3).map(|j| h[r * 3 + j] * head[b * 3 + j]).sum())
                .collect();
            let set: Vec<usize> = match r {
                0 => row0.iter().map(|&b| b as usize).collect(),
                _ => (0..5).collect(),
            };
            let lse = set.iter().map(|&b| logits[b].exp()).sum::<f64>().ln();
            let ent: f64 = set
                .iter()
                .map(|&b| -(logits[b] - lse) * (logits[b] - lse).exp())
                .sum();
            let lp = logits[TARGETS[r] as usize] - lse;
            l += G_LOGP[r] as f64 * lp + G_ENT[r] as f64 * ent;
        }
        l
    }

    /// Central differences of [`loss`] over `h` then `head`.
    fn numeric(row0: &[u32]) -> Vec<f64> {
        numeric_of(|x| loss(x, row0))
    }

    /// Central differences of `f` over `h` then `head`.
    fn numeric_of(f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
        let x: Vec<f64> = H.iter().chain(&HEAD).copied().collect();
        (0..x.len())
            .map(|i| {
                let (mut p, mut m) = (x.clone(), x.clone());
                p[i] += 1e-5;
                m[i] -= 1e-5;
                (f(&p) - f(&m)) / 2e-5
            })
            .collect()
    }

    /// Row 0's full (unrestricted) log-probability of its target.
    fn full_logp_row0(x: &[f64]) -> f64 {
        let (h, head) = x.split_at(6);
        let logits: Vec<f64> = (0..5)
            .map(|b| (0..3).map(|j| h[j] * head[b * 3 + j]).sum())
            .collect();
        let lse = logits.iter().map(|l| l.exp()).sum::<f64>().ln();
        logits[TARGETS[0] as usize] - lse
    }

    fn up(v: &[f64], shape: &[usize]) -> Tensor<Cpu> {
        let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        Cpu.upload(HostData::F32(&f), shape).unwrap()
    }

    /// `[dL/dh, dL/dhead]` from [`head_backward`] with row 0 restricted to [`ALLOWED`].
    fn analytic() -> Vec<f64> {
        analytic_with(&[])
    }

    /// [`analytic`] with `full_grad` as the restricted row's full-distribution gradient.
    fn analytic_with(full_grad: &[f32]) -> Vec<f64> {
        let set = TokenSet::from_fn(5, |i| ALLOWED.contains(&i));
        let mut r = Restricted::new(&[(0, set)], &TARGETS, 5).unwrap();
        r.full_grad = full_grad.to_vec();
        let (h, head) = (up(&H, &[2, 3]), up(&HEAD, &[5, 3]));
        let targets = Cpu.upload(HostData::U32(&TARGETS), &[2]).unwrap();
        let (gl, ge) = (
            Cpu.upload(HostData::F32(&G_LOGP), &[2]).unwrap(),
            Cpu.upload(HostData::F32(&G_ENT), &[2]).unwrap(),
        );
        let mut dhead = Cpu.zeros(&[5, 3], crate::engine::DType::F32).unwrap();
        let dh = head_backward(
            &Cpu,
            Some(&r),
            &h,
            &head,
            &targets,
            &gl,
            &ge,
            1,
            Some(&mut dhead),
        )
        .unwrap();
        let mut g = Cpu.to_host_f32(&dh).unwrap();
        g.extend(Cpu.to_host_f32(&dhead).unwrap());
        g.into_iter().map(f64::from).collect()
    }

    fn max_diff(a: &[f64], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    }

    #[test]
    fn restricted_entropy_gradient_is_the_restricted_distributions() {
        let got = analytic();
        let want = numeric(&ALLOWED);
        assert!(max_diff(&got, &want) < 1e-4, "{got:?}\nvs\n{want:?}");
        // The full softmax's entropy gradient on row 0 (the old behaviour) is far from it.
        let full: Vec<f64> = {
            let mut only_lp = numeric(&ALLOWED);
            let ent_restricted = numeric_entropy_row0(&ALLOWED);
            let ent_full = numeric_entropy_row0(&[0, 1, 2, 3, 4]);
            for ((x, a), b) in only_lp.iter_mut().zip(&ent_restricted).zip(&ent_full) {
                *x += G_ENT[0] as f64 * (b - a);
            }
            only_lp
        };
        assert!(
            max_diff(&full, &want) > 1e-2,
            "the check cannot tell them apart"
        );
    }

    /// Central differences of row 0's entropy over `set`.
    fn numeric_entropy_row0(set: &[u32]) -> Vec<f64> {
        let x: Vec<f64> = H.iter().chain(&HEAD).copied().collect();
        let ent = |x: &[f64]| {
            let (h, head) = x.split_at(6);
            let logits: Vec<f64> = set
                .iter()
                .map(|&b| (0..3).map(|j| h[j] * head[b as usize * 3 + j]).sum())
                .collect();
            let lse = logits.iter().map(|l| l.exp()).sum::<f64>().ln();
            logits
                .iter()
                .map(|l| -(l - lse) * (l - lse).exp())
                .sum::<f64>()
        };
        (0..x.len())
            .map(|i| {
                let (mut p, mut m) = (x.to_vec(), x.to_vec());
                p[i] += 1e-5;
                m[i] -= 1e-5;
                (ent(&p) - ent(&m)) / 2e-5
            })
            .collect()
    }

    #[test]
    fn a_loss_on_a_restricted_rows_full_distribution_gets_its_gradient() {
        // The grammar-distillation term's shape: a coefficient on row 0's full log-probability
        // beside the restricted one's.
        const G_FULL: f64 = -0.6;
        let want = numeric_of(|x| loss(x, &ALLOWED) + G_FULL * full_logp_row0(x));
        let got = analytic_with(&[G_FULL as f32]);
        assert!(max_diff(&got, &want) < 1e-4, "{got:?}\nvs\n{want:?}");
        assert!(
            max_diff(&analytic(), &want) > 1e-2,
            "the check cannot tell the term from its absence"
        );
    }

    #[test]
    fn restricted_backward_rejects_mismatched_gradients() {
        let set = TokenSet::from_fn(5, |i| ALLOWED.contains(&i));
        let r = Restricted::new(&[(0, set)], &TARGETS, 5).unwrap();
        let (h, head) = (up(&H, &[2, 3]), up(&HEAD, &[5, 3]));
        let e = r.backward(&Cpu, &h, &head, &[1.0], &[], None).err();
        assert!(e.is_some_and(|e| e.to_string().contains("entropy gradients")));
    }
}
