//! `sorft selftest --attention ci|full`: the tensor-core attention of `kernels/attn_mma.cu`
//! (bf16, head dims 64 and 128, GQA, packed sequences) against the CPU backend on the same
//! bf16-rounded inputs: every output, every saved log-sum-exp, and dQ, dK, dV.
//!
//! `ci` runs small shapes that still cross every code path (sequences of 1 row, sequences that
//! end inside a key tile and inside a block, groups of 1, 2 and 7 query heads, the diagonal);
//! `full` runs realistic ones (head dim 128, 28 query / 4 kv heads, sequences up to 1,500 rows
//! packed together, logits up to about +-20). On the software GPU of `tests/softgpu` `ci` takes
//! seconds, `full` minutes.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::ValueEnum;

use sorft::engine::backend::{AttentionShape, Backend, HostData};
use sorft::engine::rng::SplitMix;
use sorft::engine::{Cpu, Cuda, DType};

use super::{tolerance, Checks};

/// Tolerance of the gradients (the measure of `Checks::close`): the tensor-core backward feeds P
/// and dS to the mma in bf16, as FlashAttention-2 does, which cost up to 1.6e-2 against the f32
/// CPU reference on the `ci` shapes (measured on the software GPU); the forward keeps
/// `tolerance(BF16)`.
pub const GRAD_TOL: f64 = 4e-2;

/// Which shapes `--attention` checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Small shapes crossing every code path (seconds on the software GPU).
    Ci,
    /// Realistic shapes: head dim 128, 28/4 heads, long packed sequences, logits up to +-20.
    Full,
}

/// One attention shape to check.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// Lengths of the packed sequences.
    pub seqs: Vec<u32>,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Standard deviation of the logits `q . k * scale` (q is scaled by it; q, k ~ N(0, 1)).
    pub logit_std: f32,
}

impl Case {
    fn name(&self) -> String {
        format!(
            "attn_mma hd{} h{}/{} seqs {:?} logit std {}",
            self.head_dim, self.n_heads, self.n_kv_heads, self.seqs, self.logit_std
        )
    }
}

/// The shapes of a mode.
pub fn cases(mode: Mode) -> Vec<Case> {
    let c = |seqs: &[u32], n_heads, n_kv_heads, head_dim, logit_std| Case {
        seqs: seqs.to_vec(),
        n_heads,
        n_kv_heads,
        head_dim,
        logit_std,
    };
    match mode {
        Mode::Ci => vec![
            c(&[1, 70, 130], 4, 2, 64, 1.0),
            c(&[3, 41], 28, 4, 128, 5.0),
            c(&[65, 1], 2, 2, 128, 1.0),
        ],
        Mode::Full => vec![
            c(&[1500, 37, 700, 1], 28, 4, 128, 5.0),
            c(&[1024, 257], 16, 2, 64, 5.0),
            c(&[333], 8, 8, 128, 1.0),
        ],
    }
}

/// Runs one case on both backends and records the comparisons.
pub fn check_case(gpu: &Cuda, case: &Case, seed: u64, c: &mut Checks) -> Result<()> {
    let sh = AttentionShape {
        n_heads: case.n_heads,
        n_kv_heads: case.n_kv_heads,
        head_dim: case.head_dim,
        scale: 1.0 / (case.head_dim as f32).sqrt(),
    };
    let t: usize = case.seqs.iter().map(|&s| s as usize).sum();
    let mut cu = vec![0u32];
    for &s in &case.seqs {
        cu.push(cu[cu.len() - 1] + s);
    }
    let mut rng = SplitMix::new(seed ^ 0xa77e);
    let mut bf16_vals = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| half::bf16::from_f32(rng.next_normal() as f32 * scale).to_f32())
            .collect()
    };
    let (qf, kf) = (
        case.n_heads * case.head_dim,
        case.n_kv_heads * case.head_dim,
    );
    let q = bf16_vals(t * qf, case.logit_std);
    let k = bf16_vals(t * kf, 1.0);
    let v = bf16_vals(t * kf, 1.0);
    let up_g = |x: &[f32], f: usize| gpu.upload(HostData::F32(x), &[t, f]);
    let up_c = |x: &[f32], f: usize| Cpu.upload(HostData::F32(x), &[t, f]);
    let (q_g, k_g, v_g) = (up_g(&q, qf)?, up_g(&k, kf)?, up_g(&v, kf)?);
    let (q_c, k_c, v_c) = (up_c(&q, qf)?, up_c(&k, kf)?, up_c(&v, kf)?);
    let cu_g = gpu.upload(HostData::U32(&cu), &[cu.len()])?;
    let cu_c = Cpu.upload(HostData::U32(&cu), &[cu.len()])?;
    let started = Instant::now();
    let (o_gt, lse_gt) = gpu.attention_train(&q_g, &k_g, &v_g, &cu_g, sh)?;
    let o_g = gpu.to_host_f32(&o_gt)?;
    let lse_g = gpu.to_host_f32(&lse_gt)?;
    let gpu_s = started.elapsed().as_secs_f64();
    let (o_c, lse_c) = Cpu.attention_train(&q_c, &k_c, &v_c, &cu_c, sh)?;
    let name = case.name();
    c.close(
        format!("{name} out"),
        &o_g,
        &Cpu.to_host_f32(&o_c)?,
        tolerance(DType::BF16),
    );
    c.close(
        format!("{name} lse"),
        &lse_g,
        &Cpu.to_host_f32(&lse_c)?,
        1e-4,
    );
    // The backward with the same output gradient, from the GPU's (bf16) output on both sides:
    // D = rowsum(dO * O) of a peaked softmax is a difference of near-equal numbers, where the
    // rounding of O to bf16 alone moves dQ by a few percent.
    let dout = bf16_vals(t * qf, 1.0);
    let (do_g, do_c) = (up_g(&dout, qf)?, up_c(&dout, qf)?);
    let o_c = up_c(&o_g, qf)?;
    let started = Instant::now();
    let (dq_g, dk_g, dv_g) =
        gpu.attention_backward(&q_g, &k_g, &v_g, &o_gt, &lse_gt, &do_g, &cu_g, sh)?;
    let grads_g = [
        gpu.to_host_f32(&dq_g)?,
        gpu.to_host_f32(&dk_g)?,
        gpu.to_host_f32(&dv_g)?,
    ];
    let bwd_s = started.elapsed().as_secs_f64();
    let (dq_c, dk_c, dv_c) =
        Cpu.attention_backward(&q_c, &k_c, &v_c, &o_c, &lse_c, &do_c, &cu_c, sh)?;
    for (i, (what, want)) in [("dq", dq_c), ("dk", dk_c), ("dv", dv_c)]
        .into_iter()
        .enumerate()
    {
        c.close(
            format!("{name} {what}"),
            &grads_g[i],
            &Cpu.to_host_f32(&want)?,
            GRAD_TOL,
        );
    }
    println!("     {name}: {t} rows, gpu forward {gpu_s:.2} s, backward {bwd_s:.2} s");
    Ok(())
}

/// Runs `sorft selftest --attention MODE`.
pub fn run(mode: Mode, seed: u64) -> Result<()> {
    if std::env::var("SORFT_ATTN_KERNEL").is_ok_and(|v| v == "scalar") {
        bail!("selftest --attention checks the tensor-core kernel: unset SORFT_ATTN_KERNEL=scalar");
    }
    let gpu = match Cuda::new(0, DType::BF16) {
        Ok(g) => g,
        Err(e) => bail!("no usable GPU, cannot run the attention selftest: {e}"),
    };
    println!(
        "selftest --attention on {} ({})",
        gpu.name(),
        gpu.load_summary()
    );
    gpu.set_poison(true);
    let mut checks = Checks::default();
    for case in cases(mode) {
        check_case(&gpu, &case, seed, &mut checks)?;
    }
    for case in super::decode::decode_cases() {
        super::decode::check_decode(&gpu, &case, seed, &mut checks)?;
    }
    let failed = checks.outcomes.iter().filter(|o| !o.pass).count();
    println!(
        "{} passed, {} failed",
        checks.outcomes.len() - failed,
        failed
    );
    if failed > 0 {
        bail!("selftest --attention: {failed} check(s) failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_modes_cover_the_issue_shapes_and_every_supported_head_dim() {
        for mode in [Mode::Ci, Mode::Full] {
            let cs = cases(mode);
            for hd in [64, 128] {
                assert!(cs.iter().any(|c| c.head_dim == hd), "{mode:?} hd {hd}");
            }
            assert!(cs.iter().any(|c| c.n_heads == 28 && c.n_kv_heads == 4));
            assert!(cs.iter().any(|c| c.n_heads == c.n_kv_heads));
            assert!(cs.iter().any(|c| c.seqs.contains(&1)));
            for c in &cs {
                assert_eq!(c.n_heads % c.n_kv_heads, 0, "{c:?}");
            }
        }
        let full = cases(Mode::Full);
        assert!(full
            .iter()
            .any(|c| c.seqs.iter().any(|&s| s >= 1024) && c.head_dim == 128));
        assert!(full.iter().any(|c| c.logit_std >= 5.0));
    }

    #[test]
    fn without_a_gpu_the_attention_selftest_is_a_one_line_error() {
        if Cuda::new(0, DType::BF16).is_ok() {
            return;
        }
        let e = run(Mode::Ci, 1).unwrap_err().to_string();
        assert!(e.starts_with("no usable GPU"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
