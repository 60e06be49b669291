//! `sorft selftest --device cuda|cpu`: checks a backend against references.
//!
//! `--device cuda` runs every CUDA kernel on fresh random inputs (never zeros; outputs poisoned
//! with NaN first) against the CPU backend on the same (bf16-rounded where bf16) inputs, with
//! per-dtype tolerances, then whole-model checks on the tiny preset (log-probs, every gradient,
//! one AdamW step, GPU vs CPU), then sampling: greedy equality and chi-square tests of the
//! sampled frequencies against the exact truncated distribution. `--device cpu` runs the sampling
//! chi-square tests on the CPU backend. Exits non-zero on any mismatch.

use std::path::Path;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};

use sorft::engine::backend::{AdamWParams, AttentionShape, Backend, HostData, IGNORE_TARGET};
use sorft::engine::rng::SplitMix;
use sorft::engine::sampling::{sample_row, truncated_distribution, untruncated, SamplingParams};
use sorft::engine::{Cpu, Cuda, DType, Tensor};

pub mod attention;
pub mod decode;
mod gemm;
mod hotpath;
mod masked;
mod realistic;
mod restrict;

/// Which backend to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The CPU backend (sampling statistics).
    Cpu,
    /// The CUDA backend against the CPU backend.
    Cuda,
}

/// One group of the CUDA checks, run alone (`sorft selftest --only`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Only {
    /// The grammar-masked sampler (`selftest/masked.rs`).
    Masked,
    /// Restricted log-probabilities and their gradients (`selftest/restrict.rs`).
    Restrict,
}

/// Arguments of `sorft selftest`.
#[derive(Args, Debug)]
pub struct SelftestArgs {
    /// Backend to check.
    #[arg(long, value_enum, default_value = "cuda")]
    pub device: Device,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Skip the whole-model checks.
    #[arg(long)]
    pub no_model: bool,
    /// Smaller sampling checks (64 rows x 6 draws over a 4,096-token vocabulary instead of
    /// 512 x 40 over 151,936), for the software GPU of tests/softgpu that runs kernels on the CPU.
    #[arg(long)]
    pub quick: bool,
    /// Only the tensor-core attention checks (kernels/attn_mma.cu) and the GQA decode checks
    /// (kernels/decode.cu): `ci` or `full` shapes.
    #[arg(long, value_enum)]
    pub attention: Option<attention::Mode>,
    /// The GEMM of the CUDA checks: cuBLAS when loaded (auto), cuBLAS, or the built-in kernel.
    #[arg(long, value_enum, default_value = "auto")]
    pub gemm: gemm::GemmChoice,
    /// Run the realistic-shape cases at full size (T 4,096, vocabulary 151,936).
    #[arg(long)]
    pub realistic: bool,
    /// With `--device cuda`: only this group of checks (the software-GPU tests of one kernel
    /// file run in seconds instead of the whole selftest).
    #[arg(long, value_enum)]
    pub only: Option<Only>,
}

/// Relative tolerance of a dtype (`|got - want| <= tol * (|want| + rms(want))`).
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2e-2,
        _ => 2e-5,
    }
}

/// One check's outcome.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// What was checked.
    pub name: String,
    /// Whether it passed.
    pub pass: bool,
    /// The measured error or statistic, in words.
    pub detail: String,
}

/// Collected outcomes.
#[derive(Default)]
pub struct Checks {
    /// All outcomes in order.
    pub outcomes: Vec<Outcome>,
}

impl Checks {
    fn push(&mut self, name: impl Into<String>, pass: bool, detail: String) {
        let o = Outcome {
            name: name.into(),
            pass,
            detail,
        };
        println!(
            "{} {:<44} {}",
            if o.pass { "ok  " } else { "FAIL" },
            o.name,
            o.detail
        );
        self.outcomes.push(o);
    }

    /// Compares `got` with `want` at relative tolerance `tol`.
    pub fn close(&mut self, name: impl Into<String>, got: &[f32], want: &[f32], tol: f64) {
        let name = name.into();
        if got.len() != want.len() {
            self.push(
                name,
                false,
                format!("{} values vs {}", got.len(), want.len()),
            );
            return;
        }
        let rms = (want.iter().map(|&w| (w as f64).powi(2)).sum::<f64>()
            / want.len().max(1) as f64)
            .sqrt();
        let mut worst = 0.0f64;
        let mut at = 0;
        let mut nan = 0usize;
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            if !w.is_finite() {
                continue;
            }
            if !g.is_finite() {
                nan += 1;
                continue;
            }
            let e = (g as f64 - w as f64).abs() / ((w as f64).abs() + rms + 1e-30);
            if e > worst {
                worst = e;
                at = i;
            }
        }
        let pass = nan == 0 && worst <= tol;
        let detail = if nan > 0 {
            format!("{nan} non-finite outputs (unwritten or overflow)")
        } else {
            format!(
                "max rel err {worst:.2e} (tol {tol:.0e}) at {at}: {} vs {}",
                got.get(at).copied().unwrap_or(0.0),
                want.get(at).copied().unwrap_or(0.0)
            )
        };
        self.push(name, pass, detail);
    }

    /// Whether every check passed.
    pub fn all_passed(&self) -> bool {
        self.outcomes.iter().all(|o| o.pass)
    }
}

/// Runs `sorft selftest`.
pub fn run(a: SelftestArgs) -> Result<()> {
    if let Some(mode) = a.attention {
        return attention::run(mode, a.seed);
    }
    let mut checks = Checks::default();
    match a.device {
        Device::Cpu => {
            if a.only.is_some() {
                bail!("selftest --only selects CUDA checks: use it with --device cuda");
            }
            sampling_checks(&Cpu, "cpu", 4096, (512, 40), a.seed, &mut checks)?;
            masked_sampling_checks(&Cpu, "cpu", a.seed, &mut checks)?;
            topk_topp_check(&Cpu, "cpu", a.seed, &mut checks)?;
        }
        Device::Cuda => {
            let gpu = match Cuda::new(0, DType::F32) {
                Ok(g) => g,
                Err(e) => bail!("no usable GPU, cannot run the CUDA selftest: {e}"),
            };
            gemm::apply(&gpu, a.gemm)?;
            println!("selftest on {} ({})", gpu.name(), gpu.load_summary());
            match a.only {
                Some(Only::Masked) => masked::checks(&gpu, a.seed, &mut checks)?,
                Some(Only::Restrict) => restrict::checks(&gpu, a.seed, &mut checks)?,
                None => all_cuda_checks(&gpu, &a, &mut checks)?,
            }
        }
    }
    let failed = checks.outcomes.iter().filter(|o| !o.pass).count();
    println!(
        "{} passed, {} failed",
        checks.outcomes.len() - failed,
        failed
    );
    if !checks.all_passed() {
        bail!("selftest: {failed} check(s) failed");
    }
    Ok(())
}

/// Every CUDA check (kernels, sampling, masked sampling, restricted log-probabilities, hot
/// paths, realistic shapes, then the whole model unless `--no-model`).
fn all_cuda_checks(gpu: &Cuda, a: &SelftestArgs, checks: &mut Checks) -> Result<()> {
    for dtype in [DType::F32, DType::BF16] {
        let be = gpu.with_dtype(dtype)?;
        be.set_poison(true);
        kernel_checks(&be, a.seed, checks)?;
    }
    let be = gpu.with_dtype(DType::BF16)?;
    let (vocab, rows_draws) = if a.quick {
        (4096, (64, 6))
    } else {
        (151_936, (512, 40))
    };
    sampling_checks(&be, "cuda", vocab, rows_draws, a.seed, checks)?;
    masked_sampling_checks(&be, "cuda", a.seed, checks)?;
    topk_topp_check(&be, "cuda", a.seed, checks)?;
    masked::checks(gpu, a.seed, checks)?;
    restrict::checks(gpu, a.seed, checks)?;
    hotpath::checks(gpu, checks)?;
    realistic::checks(gpu, a.realistic, a.seed, checks)?;
    if !a.no_model {
        model_checks(gpu, checks)?;
    }
    Ok(())
}

/// Random values (never all zeros), rounded to bf16 when the dtype is bf16 so that both backends
/// see identical inputs.
fn rand_vals(rng: &mut SplitMix, n: usize, scale: f32, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let x = rng.next_normal() as f32 * scale;
            if dtype == DType::BF16 {
                half::bf16::from_f32(x).to_f32()
            } else {
                x
            }
        })
        .collect()
}

/// The same host data on both backends.
struct Pair<'a> {
    gpu: &'a Cuda,
    rng: SplitMix,
    dtype: DType,
}

impl Pair<'_> {
    fn f(&mut self, shape: &[usize], scale: f32) -> Result<(Tensor<Cuda>, Tensor<Cpu>)> {
        let n = shape.iter().product();
        let v = rand_vals(&mut self.rng, n, scale, self.dtype);
        Ok((
            self.gpu.upload(HostData::F32(&v), shape)?,
            Cpu.upload(HostData::F32(&v), shape)?,
        ))
    }

    fn f32_both(&mut self, shape: &[usize], scale: f32) -> Result<(Tensor<Cuda>, Tensor<Cpu>)> {
        // Always f32 on the GPU (gradients, optimizer moments), whatever the compute dtype.
        let n = shape.iter().product();
        let v = rand_vals(&mut self.rng, n, scale, self.dtype);
        let mut g = self.gpu.zeros(shape, DType::F32)?;
        let up = self
            .gpu
            .with_dtype(DType::F32)?
            .upload(HostData::F32(&v), shape)?;
        self.gpu.add_assign(&mut g, &up)?;
        Ok((g, Cpu.upload(HostData::F32(&v), shape)?))
    }

    fn u(&self, v: &[u32]) -> Result<(Tensor<Cuda>, Tensor<Cpu>)> {
        Ok((
            self.gpu.upload(HostData::U32(v), &[v.len()])?,
            Cpu.upload(HostData::U32(v), &[v.len()])?,
        ))
    }
}

/// Token log-probabilities and entropies of rows where one vocabulary entry's logit is -inf (a
/// head row holding -inf, positive hidden states): `exp(-inf) * -inf` must count as 0, not NaN.
fn masked_logit_check(g: &Cuda, tol: f64, tag: &str, c: &mut Checks) -> Result<()> {
    let (t, d, v) = (6usize, 8usize, 16usize);
    let h: Vec<f32> = (0..t * d)
        .map(|i| 0.125 + 0.0625 * ((i * 3) % 7) as f32)
        .collect();
    let mut head: Vec<f32> = (0..v * d)
        .map(|i| 0.125 * ((i / d + i % d) % 5) as f32 - 0.25)
        .collect();
    head[5 * d] = f32::NEG_INFINITY;
    let targets: Vec<u32> = (0..t).map(|i| (i * 3 % 4) as u32).collect();
    let up = |data: &[f32], shape: &[usize]| -> Result<(Tensor<Cuda>, Tensor<Cpu>)> {
        Ok((
            g.upload(HostData::F32(data), shape)?,
            Cpu.upload(HostData::F32(data), shape)?,
        ))
    };
    let (h_g, h_c) = up(&h, &[t, d])?;
    let (w_g, w_c) = up(&head, &[v, d])?;
    let tg_g = g.upload(HostData::U32(&targets), &[t])?;
    let tg_c = Cpu.upload(HostData::U32(&targets), &[t])?;
    let (lp_g, en_g) = g.token_logprobs(&h_g, &w_g, &tg_g, 4)?;
    let (lp_c, en_c) = Cpu.token_logprobs(&h_c, &w_c, &tg_c, 4)?;
    let (lp_c, en_c) = (host(&Cpu, &lp_c)?, host(&Cpu, &en_c)?);
    let finite = lp_c.iter().chain(&en_c).all(|x| x.is_finite());
    c.push(
        format!("token_logprobs with a -inf logit: CPU finite {tag}"),
        finite,
        if finite {
            String::new()
        } else {
            format!("logp {lp_c:?} entropy {en_c:?}")
        },
    );
    c.close(
        format!("token_logprobs with a -inf logit: logp {tag}"),
        &host(g, &lp_g)?,
        &lp_c,
        tol,
    );
    c.close(
        format!("token_logprobs with a -inf logit: entropy {tag}"),
        &host(g, &en_g)?,
        &en_c,
        tol,
    );
    Ok(())
}

fn host<B: Backend>(be: &B, t: &Tensor<B>) -> Result<Vec<f32>> {
    Ok(be.to_host_f32(t)?)
}

/// Every kernel of the backend against the CPU backend.
fn kernel_checks(gpu: &Cuda, seed: u64, c: &mut Checks) -> Result<()> {
    let dtype = gpu.dtype();
    let tol = tolerance(dtype);
    let tag = format!("{dtype}").to_lowercase();
    let mut p = Pair {
        gpu,
        rng: SplitMix::new(seed ^ 0x5e1f),
        dtype,
    };
    let g = gpu;
    let (t, d, v) = (37usize, 96usize, 1000usize);

    // embedding / gather_rows
    let (tab_g, tab_c) = p.f(&[v, d], 1.0)?;
    let ids: Vec<u32> = (0..t).map(|i| ((i * 7919) % v) as u32).collect();
    let (ids_g, ids_c) = p.u(&ids)?;
    let e_g = g.embedding(&tab_g, &ids_g)?;
    let e_c = Cpu.embedding(&tab_c, &ids_c)?;
    c.close(
        format!("embedding {tag}"),
        &host(g, &e_g)?,
        &host(&Cpu, &e_c)?,
        tol,
    );
    // rms_norm + backward
    let (x_g, x_c) = p.f(&[t, d], 1.0)?;
    let (w_g, w_c) = p.f(&[d], 1.0)?;
    let n_g = g.rms_norm(&x_g, &w_g, 1e-6)?;
    let n_c = Cpu.rms_norm(&x_c, &w_c, 1e-6)?;
    c.close(
        format!("rms_norm {tag}"),
        &host(g, &n_g)?,
        &host(&Cpu, &n_c)?,
        tol,
    );
    let (dy_g, dy_c) = p.f(&[t, d], 1.0)?;
    let (mut dw_g, mut dw_c) = p.f32_both(&[d], 1.0)?;
    let dx_g = g.rms_norm_backward(&x_g, &w_g, &dy_g, 1e-6, Some(&mut dw_g))?;
    let dx_c = Cpu.rms_norm_backward(&x_c, &w_c, &dy_c, 1e-6, Some(&mut dw_c))?;
    c.close(
        format!("rms_norm_backward dx {tag}"),
        &host(g, &dx_g)?,
        &host(&Cpu, &dx_c)?,
        tol,
    );
    c.close(
        format!("rms_norm_backward dweight {tag}"),
        &host(g, &dw_g)?,
        &host(&Cpu, &dw_c)?,
        // an f32 gradient summed in f32 from identical inputs: bf16 rounding shows as an error
        tol.min(1e-4),
    );
    // linear with bias, matmul in every transpose, sum_rows
    let n_out = 80;
    let (lw_g, lw_c) = p.f(&[n_out, d], 0.2)?;
    let (lb_g, lb_c) = p.f(&[n_out], 1.0)?;
    let l_g = g.linear(&x_g, &lw_g, Some(&lb_g))?;
    let l_c = Cpu.linear(&x_c, &lw_c, Some(&lb_c))?;
    c.close(
        format!("linear+bias {tag}"),
        &host(g, &l_g)?,
        &host(&Cpu, &l_c)?,
        tol,
    );
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let (m, k, n) = (33, 70, 45);
        let a_shape = if ta { [k, m] } else { [m, k] };
        let (a_g, a_c) = p.f(&a_shape, 1.0)?;
        let b_shape = if tb { [n, k] } else { [k, n] };
        let (b_g, b_c) = p.f(&b_shape, 1.0)?;
        let (mut c_g, mut c_c) = p.f32_both(&[m, n], 1.0)?;
        g.matmul(&a_g, ta, &b_g, tb, &mut c_g, true)?;
        Cpu.matmul(&a_c, ta, &b_c, tb, &mut c_c, true)?;
        c.close(
            format!("matmul ta={ta} tb={tb} accumulate {tag}"),
            &host(g, &c_g)?,
            &host(&Cpu, &c_c)?,
            tol,
        );
    }
    let (mut s_g, mut s_c) = p.f32_both(&[d], 1.0)?;
    g.sum_rows(&x_g, &mut s_g, true)?;
    Cpu.sum_rows(&x_c, &mut s_c, true)?;
    c.close(
        format!("sum_rows {tag}"),
        &host(g, &s_g)?,
        &host(&Cpu, &s_c)?,
        tol,
    );
    // add_assign, swiglu (+ backward), fill, scale, axpy, sum_squares
    let (mut a_g, mut a_c) = p.f(&[t, d], 1.0)?;
    g.add_assign(&mut a_g, &x_g)?;
    Cpu.add_assign(&mut a_c, &x_c)?;
    c.close(
        format!("add_assign {tag}"),
        &host(g, &a_g)?,
        &host(&Cpu, &a_c)?,
        tol,
    );
    let sw_g = g.swiglu(&x_g, &dy_g)?;
    let sw_c = Cpu.swiglu(&x_c, &dy_c)?;
    c.close(
        format!("swiglu {tag}"),
        &host(g, &sw_g)?,
        &host(&Cpu, &sw_c)?,
        tol,
    );
    let (do_g, do_c) = p.f(&[t, d], 1.0)?;
    let (dg_g, du_g) = g.swiglu_backward(&x_g, &dy_g, &do_g)?;
    let (dg_c, du_c) = Cpu.swiglu_backward(&x_c, &dy_c, &do_c)?;
    c.close(
        format!("swiglu_backward dgate {tag}"),
        &host(g, &dg_g)?,
        &host(&Cpu, &dg_c)?,
        tol,
    );
    c.close(
        format!("swiglu_backward dup {tag}"),
        &host(g, &du_g)?,
        &host(&Cpu, &du_c)?,
        tol,
    );
    g.scale(&mut a_g, 0.37)?;
    Cpu.scale(&mut a_c, 0.37)?;
    g.axpy(&mut a_g, -1.5, &x_g)?;
    Cpu.axpy(&mut a_c, -1.5, &x_c)?;
    c.close(
        format!("scale+axpy {tag}"),
        &host(g, &a_g)?,
        &host(&Cpu, &a_c)?,
        tol,
    );
    let ss_g = g.sum_squares(&a_g)?;
    let ss_c = Cpu.sum_squares(&a_c)?;
    c.close(
        format!("sum_squares {tag}"),
        &[ss_g as f32],
        &[ss_c as f32],
        tol,
    );
    g.fill(&mut a_g, 0.625)?;
    Cpu.fill(&mut a_c, 0.625)?;
    c.close(
        format!("fill {tag}"),
        &host(g, &a_g)?,
        &host(&Cpu, &a_c)?,
        0.0,
    );
    // rope (+ backward)
    for hd in [16usize, 64, 128] {
        let f = 2 * hd;
        let (mut r_g, mut r_c) = p.f(&[t, f], 1.0)?;
        let pos: Vec<u32> = (0..t as u32).map(|i| i * 13 + 5).collect();
        let (pos_g, pos_c) = p.u(&pos)?;
        g.rope(&mut r_g, &pos_g, hd, 10_000.0)?;
        Cpu.rope(&mut r_c, &pos_c, hd, 10_000.0)?;
        c.close(
            format!("rope hd={hd} {tag}"),
            &host(g, &r_g)?,
            &host(&Cpu, &r_c)?,
            tol.max(1e-4),
        );
        g.rope_backward(&mut r_g, &pos_g, hd, 10_000.0)?;
        Cpu.rope_backward(&mut r_c, &pos_c, hd, 10_000.0)?;
        c.close(
            format!("rope_backward hd={hd} {tag}"),
            &host(g, &r_g)?,
            &host(&Cpu, &r_c)?,
            tol.max(1e-4),
        );
    }
    // embedding backward (f32 table)
    let (mut et_g, mut et_c) = p.f32_both(&[v, d], 1.0)?;
    let rep: Vec<u32> = (0..t).map(|i| (i % 5) as u32 * 3).collect();
    let (rep_g, rep_c) = p.u(&rep)?;
    g.embedding_backward(&mut et_g, &rep_g, &x_g)?;
    Cpu.embedding_backward(&mut et_c, &rep_c, &x_c)?;
    let (eg, ec) = (host(g, &et_g)?, host(&Cpu, &et_c)?);
    c.close(format!("embedding_backward {tag}"), &eg, &ec, tol);
    // Tokens added in order on both backends: the same f32 sums, bit for bit, in any block order.
    let same = eg.iter().zip(&ec).all(|(a, b)| a.to_bits() == b.to_bits());
    c.push(
        format!("embedding_backward bit-identical to the CPU {tag}"),
        same,
        if same {
            String::new()
        } else {
            "sums differ in the last bits (order-dependent accumulation)".into()
        },
    );
    // embedding backward into a table of the compute dtype: the restricted rows' scatter-add
    // into a bf16 hidden-state gradient (accumulated in f32, rounded once)
    let (mut eb_g, mut eb_c) = p.f(&[v, d], 1.0)?;
    g.embedding_backward(&mut eb_g, &rep_g, &x_g)?;
    Cpu.embedding_backward(&mut eb_c, &rep_c, &x_c)?;
    c.close(
        format!("embedding_backward into a {tag} table"),
        &host(g, &eb_g)?,
        &host(&Cpu, &eb_c)?,
        tol,
    );
    // adamw (f32 moments; param in the compute dtype)
    let (mut pr_g, mut pr_c) = p.f(&[t, d], 1.0)?;
    let (gr_g, gr_c) = p.f32_both(&[t, d], 1.0)?;
    let (mut m_g, mut m_c) = p.f32_both(&[t, d], 0.1)?;
    let (mut v_g, mut v_c) = p.f32_both(&[t, d], 0.1)?;
    g.fill(&mut v_g, 0.01)?;
    Cpu.fill(&mut v_c, 0.01)?;
    let hp = AdamWParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        step: 3,
    };
    g.adamw_step(&mut pr_g, &gr_g, &mut m_g, &mut v_g, hp)?;
    Cpu.adamw_step(&mut pr_c, &gr_c, &mut m_c, &mut v_c, hp)?;
    c.close(
        format!("adamw param {tag}"),
        &host(g, &pr_g)?,
        &host(&Cpu, &pr_c)?,
        tol,
    );
    c.close(
        format!("adamw moments {tag}"),
        &host(g, &m_g)?,
        &host(&Cpu, &m_c)?,
        2e-5,
    );
    // log_softmax
    let (lg_g, lg_c) = p.f(&[5, v], 3.0)?;
    let ls_g = g.log_softmax(&lg_g)?;
    let ls_c = Cpu.log_softmax(&lg_c)?;
    c.close(
        format!("log_softmax {tag}"),
        &host(g, &ls_g)?,
        &host(&Cpu, &ls_c)?,
        tol,
    );
    // token log-probs (+ ignored rows) and backward
    let (h_g, h_c) = p.f(&[t, d], 1.0)?;
    let (hw_g, hw_c) = p.f(&[v, d], 0.3)?;
    let targets: Vec<u32> = (0..t)
        .map(|i| {
            if i % 6 == 2 {
                IGNORE_TARGET
            } else {
                ((i * 31) % v) as u32
            }
        })
        .collect();
    let (tg_g, tg_c) = p.u(&targets)?;
    let (lp_g, en_g) = g.token_logprobs(&h_g, &hw_g, &tg_g, 8)?;
    let (lp_c, en_c) = Cpu.token_logprobs(&h_c, &hw_c, &tg_c, 8)?;
    c.close(
        format!("token_logprobs logp {tag}"),
        &host(g, &lp_g)?,
        &host(&Cpu, &lp_c)?,
        tol,
    );
    c.close(
        format!("token_logprobs entropy {tag}"),
        &host(g, &en_g)?,
        &host(&Cpu, &en_c)?,
        tol,
    );
    let (gl_g, gl_c) = p.f32_both(&[t], 1.0)?;
    let (ge_g, ge_c) = p.f32_both(&[t], 0.5)?;
    let (mut dh_head_g, mut dh_head_c) = p.f32_both(&[v, d], 0.01)?;
    let dh_g =
        g.token_logprobs_backward(&h_g, &hw_g, &tg_g, &gl_g, &ge_g, 8, Some(&mut dh_head_g))?;
    let dh_c =
        Cpu.token_logprobs_backward(&h_c, &hw_c, &tg_c, &gl_c, &ge_c, 8, Some(&mut dh_head_c))?;
    c.close(
        format!("token_logprobs_backward dh {tag}"),
        &host(g, &dh_g)?,
        &host(&Cpu, &dh_c)?,
        tol,
    );
    c.close(
        format!("token_logprobs_backward dhead {tag}"),
        &host(g, &dh_head_g)?,
        &host(&Cpu, &dh_head_c)?,
        tol,
    );
    masked_logit_check(g, tol, &tag, c)?;
    // attention: packed training forward/backward, cache attention (prefill + decode batch)
    for (hd, nh, nkv) in [(16usize, 4usize, 2usize), (64, 4, 2), (128, 2, 1)] {
        let sh = AttentionShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let cu = [0u32, 3, 3, 40, 77];
        let tt = 77;
        let (q_g, q_c) = p.f(&[tt, nh * hd], 1.0)?;
        let (k_g, k_c) = p.f(&[tt, nkv * hd], 1.0)?;
        let (vv_g, vv_c) = p.f(&[tt, nkv * hd], 1.0)?;
        let (cu_g, cu_c) = p.u(&cu)?;
        let (o_g, lse_g) = g.attention_train(&q_g, &k_g, &vv_g, &cu_g, sh)?;
        let (o_c, lse_c) = Cpu.attention_train(&q_c, &k_c, &vv_c, &cu_c, sh)?;
        c.close(
            format!("attention_train out hd={hd} {tag}"),
            &host(g, &o_g)?,
            &host(&Cpu, &o_c)?,
            tol,
        );
        c.close(
            format!("attention_train lse hd={hd} {tag}"),
            &host(g, &lse_g)?,
            &host(&Cpu, &lse_c)?,
            tol.min(1e-4),
        );
        let (dout_g, dout_c) = p.f(&[tt, nh * hd], 1.0)?;
        let (dq_g, dk_g, dv_g) =
            g.attention_backward(&q_g, &k_g, &vv_g, &o_g, &lse_g, &dout_g, &cu_g, sh)?;
        // From the GPU's output on both sides: D = rowsum(dO * O) is sensitive to O's rounding.
        let o_c = Cpu.upload(HostData::F32(&host(g, &o_g)?), &[tt, nh * hd])?;
        let (dq_c, dk_c, dv_c) =
            Cpu.attention_backward(&q_c, &k_c, &vv_c, &o_c, &lse_c, &dout_c, &cu_c, sh)?;
        c.close(
            format!("attention_backward dq hd={hd} {tag}"),
            &host(g, &dq_g)?,
            &host(&Cpu, &dq_c)?,
            tol,
        );
        c.close(
            format!("attention_backward dk hd={hd} {tag}"),
            &host(g, &dk_g)?,
            &host(&Cpu, &dk_c)?,
            tol,
        );
        c.close(
            format!("attention_backward dv hd={hd} {tag}"),
            &host(g, &dv_g)?,
            &host(&Cpu, &dv_c)?,
            tol,
        );
        // cache: 3 slots of 1200 positions; prefill slot 0 rows 0..40, decode slots 1 and 2 at
        // different lengths (long enough to split).
        let (slots_n, max_seq) = (3usize, 1200usize);
        let (mut kc_g, mut kc_c) = p.f(&[slots_n, max_seq, nkv * hd], 1.0)?;
        let (mut vc_g, mut vc_c) = p.f(&[slots_n, max_seq, nkv * hd], 1.0)?;
        let rows = 42;
        let mut sl: Vec<u32> = vec![0; 40];
        let mut ps: Vec<u32> = (0..40).collect();
        sl.extend([1, 2]);
        ps.extend([1199, 700]);
        let (sl_g, sl_c) = p.u(&sl)?;
        let (ps_g, ps_c) = p.u(&ps)?;
        let (new_k_g, new_k_c) = p.f(&[rows, nkv * hd], 1.0)?;
        g.kv_write(&mut kc_g, &new_k_g, &sl_g, &ps_g)?;
        Cpu.kv_write(&mut kc_c, &new_k_c, &sl_c, &ps_c)?;
        g.kv_write(&mut vc_g, &new_k_g, &sl_g, &ps_g)?;
        Cpu.kv_write(&mut vc_c, &new_k_c, &sl_c, &ps_c)?;
        c.close(
            format!("kv_write hd={hd} {tag}"),
            &host(g, &kc_g)?,
            &host(&Cpu, &kc_c)?,
            0.0,
        );
        let (qa_g, qa_c) = p.f(&[rows, nh * hd], 1.0)?;
        let at_g = g.attention(&qa_g, &kc_g, &vc_g, &sl_g, &ps_g, sh)?;
        let at_c = Cpu.attention(&qa_c, &kc_c, &vc_c, &sl_c, &ps_c, sh)?;
        c.close(
            format!("attention (kv cache) hd={hd} {tag}"),
            &host(g, &at_g)?,
            &host(&Cpu, &at_c)?,
            tol,
        );
    }
    // fused PPO token loss (f32 on every dtype)
    if dtype == DType::F32 {
        let n = 301;
        let vals: Vec<Vec<f32>> = (0..5)
            .map(|i| rand_vals(&mut p.rng, n, if i < 3 { 0.3 } else { 1.0 }, DType::F32))
            .collect();
        let up: Vec<Tensor<Cuda>> = vals
            .iter()
            .map(|v| g.upload_f32(v, &[n]))
            .collect::<sorft::engine::error::Result<_>>()?;
        let (loss_g, grad_g) =
            g.ppo_token_loss(&up[0], &up[1], &up[2], &up[3], &up[4], 0.2, 0.05)?;
        let (loss_r, grad_r) = ppo_reference(&vals, 0.2, 0.05);
        c.close("ppo_token_loss loss", &host(g, &loss_g)?, &loss_r, 1e-5);
        c.close(
            "ppo_token_loss dloss/dlogp",
            &host(g, &grad_g)?,
            &grad_r,
            1e-5,
        );
        // the same loss from hidden states and the head, chunked over the vocabulary
        let tt = 29;
        let (hh_g, hh_c) = p.f(&[tt, d], 1.0)?;
        let tgt: Vec<u32> = (0..tt)
            .map(|i| {
                if i == 4 {
                    IGNORE_TARGET
                } else {
                    (i * 97 % v) as u32
                }
            })
            .collect();
        let (tgt_g, tgt_c) = p.u(&tgt)?;
        let extra: Vec<Vec<f32>> = (0..4)
            .map(|_| rand_vals(&mut p.rng, tt, 0.3, DType::F32))
            .collect();
        let (lp_c, _) = Cpu.token_logprobs(&hh_c, &hw_c, &tgt_c, 8)?;
        let lp_host = host(&Cpu, &lp_c)?;
        let old: Vec<f32> = lp_host.iter().zip(&extra[0]).map(|(a, b)| a + b).collect();
        let refl: Vec<f32> = lp_host.iter().zip(&extra[1]).map(|(a, b)| a - b).collect();
        let w: Vec<f32> = tgt
            .iter()
            .map(|&x| if x == IGNORE_TARGET { 0.0 } else { 1.0 })
            .collect();
        let inputs = [
            lp_host.clone(),
            old.clone(),
            refl.clone(),
            extra[2].clone(),
            w.clone(),
        ];
        let (loss_r, grad_r) = ppo_reference(&inputs, 0.2, 0.05);
        let gl_c = Cpu.upload(HostData::F32(&grad_r), &[tt])?;
        let ge_c = Cpu.zeros(&[tt], DType::F32)?;
        let dh_r = Cpu.token_logprobs_backward(&hh_c, &hw_c, &tgt_c, &gl_c, &ge_c, 8, None)?;
        let up = |x: &[f32]| g.upload_f32(x, &[tt]);
        let out = g.ppo_loss_from_hidden(
            &hh_g,
            &hw_g,
            &tgt_g,
            &up(&old)?,
            &up(&refl)?,
            &up(&extra[2])?,
            &up(&w)?,
            0.2,
            0.05,
            8,
            None,
        )?;
        c.close(
            "ppo_loss_from_hidden loss",
            &host(g, &out.loss)?,
            &loss_r,
            1e-4,
        );
        c.close(
            "ppo_loss_from_hidden dh",
            &host(g, &out.dh)?,
            &host(&Cpu, &dh_r)?,
            1e-4,
        );
    }
    // gather_rows and index errors are errors, not crashes
    let bad = p.u(&[v as u32])?;
    let err = g.embedding(&tab_g, &bad.0).is_err();
    c.push(
        format!("out-of-range id is an error {tag}"),
        err,
        String::new(),
    );
    Ok(())
}

/// Host reference of the fused PPO token loss: inputs logp, old, ref, advantage, weight.
#[allow(clippy::needless_range_loop)]
fn ppo_reference(v: &[Vec<f32>], eps: f64, kl_coef: f64) -> (Vec<f32>, Vec<f32>) {
    let mut loss = Vec::new();
    let mut grad = Vec::new();
    for i in 0..v[0].len() {
        let (lp, old, rf, a, w) = (
            v[0][i] as f64,
            v[1][i] as f64,
            v[2][i] as f64,
            v[3][i] as f64,
            v[4][i] as f64,
        );
        let r = (lp - old).exp();
        let (un, cl) = (r * a, r.clamp(1.0 - eps, 1.0 + eps) * a);
        let g = if un <= cl { -r * a } else { 0.0 };
        let dr = rf - lp;
        let kl = dr.exp() - dr - 1.0;
        loss.push(((-un.min(cl) + kl_coef * kl) * w) as f32);
        grad.push(((g + kl_coef * (1.0 - dr.exp())) * w) as f32);
    }
    (loss, grad)
}

/// Sampling statistics: greedy agrees with the reference, frequencies follow the truncated
/// distribution (chi-square), equal seeds give equal samples.
fn sampling_checks<B: Backend>(
    be: &B,
    tag: &str,
    vocab: usize,
    (rows, draws): (usize, usize),
    seed: u64,
    c: &mut Checks,
) -> Result<()> {
    let mut rng = SplitMix::new(seed ^ 0x5A3B_1E00);
    // a row with a clear head: a few large logits over a low noise floor, so that top-k/top-p
    // sets are small (the exact path of the GPU sampler)
    let mut row: Vec<f32> = (0..vocab).map(|_| rng.next_normal() as f32 - 8.0).collect();
    for (i, bump) in [
        (17usize, 6.0f32),
        (vocab / 2, 5.5),
        (vocab - 3, 5.0),
        (1234 % vocab, 4.8),
        (99, 4.5),
        (3000 % vocab, 4.2),
    ] {
        row[i] += bump;
    }
    let data: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let logits = be.upload(HostData::F32(&data), &[rows, vocab])?;
    let reference: Vec<f32> = match be.to_host_f32(&logits) {
        Ok(v) => v[..vocab].to_vec(),
        Err(e) => bail!("{e}"),
    };
    let cases = [
        ("greedy", SamplingParams::greedy()),
        (
            "T=0.8 top-k=5",
            SamplingParams {
                temperature: 0.8,
                top_k: 5,
                top_p: 1.0,
                seed: seed + 1,
            },
        ),
        (
            "T=1 top-p=0.9",
            SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 0.9,
                seed: seed + 2,
            },
        ),
        (
            "T=0.7 top-k=4 top-p=0.8",
            SamplingParams {
                temperature: 0.7,
                top_k: 4,
                top_p: 0.8,
                seed: seed + 3,
            },
        ),
        (
            "T=1 top-k=5 top-p=0.6",
            SamplingParams {
                temperature: 1.0,
                top_k: 5,
                top_p: 0.6,
                seed: seed + 5,
            },
        ),
        (
            "T=2 untruncated",
            SamplingParams {
                temperature: 2.0,
                top_k: 0,
                top_p: 1.0,
                seed: seed + 4,
            },
        ),
    ];
    for (name, p) in cases {
        let mut counts = std::collections::HashMap::<u32, u64>::new();
        let mut first = Vec::new();
        for batch in 0..draws {
            let counters: Vec<u64> = (0..rows as u64)
                .map(|r| batch as u64 * rows as u64 + r)
                .collect();
            let out = be.sample(&logits, &vec![p; rows], &counters)?;
            if batch == 0 {
                first = out.clone();
            }
            for s in out {
                *counts.entry(s.id).or_default() += 1;
            }
        }
        let n = (draws * rows) as f64;
        // logprob of the full temperature-scaled distribution
        let inv_t = if p.temperature > 0.0 {
            1.0 / p.temperature as f64
        } else {
            1.0
        };
        let m = reference.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64 * inv_t;
        let lse = m + reference
            .iter()
            .map(|&x| (x as f64 * inv_t - m).exp())
            .sum::<f64>()
            .ln();
        let lp_err = first
            .iter()
            .map(|s| (s.logprob as f64 - (reference[s.id as usize] as f64 * inv_t - lse)).abs())
            .fold(0.0, f64::max);
        c.push(
            format!("sample {name} logprob {tag}"),
            lp_err < 2e-3,
            format!("max err {lp_err:.1e}"),
        );
        // The host reference draws the same tokens: Gumbel-max untruncated (bit for bit) and
        // inverse CDF over the same candidates truncated (a cumulative sum rounded differently
        // may move a draw that lands on a boundary: at most 1% of rows). A truncated set too
        // large for the kernel's shared memory is drawn by Gumbel-max over its histogram bins
        // (see kernels/sampling.cu): no token-for-token comparison there.
        let exact = untruncated(&p, vocab)
            || p.temperature == 0.0
            || truncated_distribution(&reference, &p).len() <= 1024;
        if exact {
            let differ = first
                .iter()
                .enumerate()
                .filter(|(r, s)| sample_row(&reference, &p, *r as u64).id != s.id)
                .count();
            let allowed = if untruncated(&p, vocab) || p.temperature == 0.0 {
                0
            } else {
                rows / 100
            };
            c.push(
                format!("sample {name} same tokens as the host {tag}"),
                differ <= allowed,
                format!("{differ} of {rows} rows differ"),
            );
        }
        let again = be.sample(
            &logits,
            &vec![p; rows],
            &(0..rows as u64).collect::<Vec<_>>(),
        )?;
        c.push(
            format!("sample {name} reproducible {tag}"),
            again == first,
            String::new(),
        );
        if p.temperature == 0.0 {
            let argmax = reference
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |a, (i, &x)| if x > a.1 { (i, x) } else { a },
                )
                .0;
            let ok = counts.len() == 1 && counts.contains_key(&(argmax as u32));
            c.push(
                format!("sample greedy = argmax {tag}"),
                ok,
                format!("{counts:?}"),
            );
            continue;
        }
        // expected distribution; untruncated: bins for the head tokens plus one for the rest
        let dist = truncated_distribution(&reference, &p);
        let mut expected: Vec<(Option<u32>, f64)> = Vec::new();
        let mut rest = 0.0;
        for &(id, q) in &dist {
            if q * n >= 20.0 && expected.len() < 40 {
                expected.push((Some(id), q));
            } else {
                rest += q;
            }
        }
        if rest > 0.0 {
            expected.push((None, rest));
        }
        let kept: std::collections::HashSet<u32> = dist.iter().map(|x| x.0).collect();
        // The kernel's documented contract: where the tokens up to the top-k/top-p boundary do
        // not fit in shared memory (very flat rows), the boundary has the resolution of its
        // histogram bins (1/32 nat). A sample outside the exact set must lie within that bin.
        let boundary = dist
            .iter()
            .map(|x| reference[x.0 as usize] as f64 * inv_t)
            .fold(f64::INFINITY, f64::min);
        let in_boundary_bin =
            |id: u32| reference[id as usize] as f64 * inv_t >= boundary - 2.0 / 32.0;
        let outside: u64 = counts
            .iter()
            .filter(|(k, _)| !kept.contains(k) && !in_boundary_bin(**k))
            .map(|(_, v)| *v)
            .sum();
        let named: std::collections::HashSet<u32> = expected.iter().filter_map(|e| e.0).collect();
        let mut chi2 = 0.0;
        for &(id, q) in &expected {
            let e = q * n;
            let o = match id {
                Some(id) => *counts.get(&id).unwrap_or(&0) as f64,
                None => counts
                    .iter()
                    .filter(|(k, _)| !named.contains(k))
                    .map(|(_, v)| *v as f64)
                    .sum::<f64>(),
            };
            chi2 += (o - e).powi(2) / e.max(1e-12);
        }
        let df = (expected.len().max(2) - 1) as f64;
        // Far tail: P(chi2 > df + 6 sqrt(2 df) + 10) is below 1e-6 for these df.
        let limit = df + 6.0 * (2.0 * df).sqrt() + 10.0;
        c.push(
            format!("sample {name} chi-square {tag}"),
            chi2 < limit && outside == 0,
            format!(
                "chi2 {chi2:.1} (df {df}, limit {limit:.1}), {outside} outside the kept set's boundary bin"
            ),
        );
    }
    Ok(())
}

/// Top-k and top-p together on a row whose top-p cut falls inside the top-k set, over a flat
/// floor of 4,091 tokens (more candidates than the GPU sampler's shared memory holds): the
/// frequencies must follow top-k, then top-p over the renormalised top-k set.
fn topk_topp_check<B: Backend>(be: &B, tag: &str, seed: u64, c: &mut Checks) -> Result<()> {
    let (vocab, rows, draws) = (4096usize, 64usize, 6usize);
    let mut rng = SplitMix::new(seed ^ 0x7C9D);
    let mut row: Vec<f32> = (0..vocab)
        .map(|_| 0.5 * rng.next_normal() as f32 - 8.0)
        .collect();
    for (k, id) in [10usize, 20, 30, 40, 50].into_iter().enumerate() {
        row[id] = -0.1 * k as f32;
    }
    let data: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let logits = be.upload(HostData::F32(&data), &[rows, vocab])?;
    let reference: Vec<f32> = be.to_host_f32(&logits)?[..vocab].to_vec();
    let p = SamplingParams {
        temperature: 1.0,
        top_k: 5,
        top_p: 0.5,
        seed: seed + 21,
    };
    let mut counts = std::collections::HashMap::<u32, u64>::new();
    for batch in 0..draws {
        let counters: Vec<u64> = (0..rows as u64)
            .map(|r| (batch * rows) as u64 + r)
            .collect();
        for s in be.sample(&logits, &vec![p; rows], &counters)? {
            *counts.entry(s.id).or_default() += 1;
        }
    }
    let n = (rows * draws) as f64;
    let dist = truncated_distribution(&reference, &p);
    let outside: u64 = counts
        .iter()
        .filter(|(k, _)| !dist.iter().any(|d| d.0 == **k))
        .map(|(_, v)| *v)
        .sum();
    let chi2: f64 = dist
        .iter()
        .map(|&(id, q)| (*counts.get(&id).unwrap_or(&0) as f64 - q * n).powi(2) / (q * n))
        .sum();
    let df = (dist.len().max(2) - 1) as f64;
    let limit = df + 6.0 * (2.0 * df).sqrt() + 10.0;
    c.push(
        format!("sample top-k=5 top-p=0.5 cut inside top-k chi-square {tag}"),
        chi2 < limit && outside == 0 && dist.len() == 3,
        format!(
            "chi2 {chi2:.1} (limit {limit:.1}), {} kept, {outside} outside",
            dist.len()
        ),
    );
    Ok(())
}

/// Rows where a third of the logits are -inf (masked tokens, including each thread's first):
/// every sampling mode returns an unmasked token with the exact, finite log-probability.
fn masked_sampling_checks<B: Backend>(be: &B, tag: &str, seed: u64, c: &mut Checks) -> Result<()> {
    let (vocab, rows) = (2048usize, 8usize);
    let mut rng = SplitMix::new(seed ^ 0x3A5C);
    let row: Vec<f32> = (0..vocab)
        .map(|i| {
            if i % 3 == 0 {
                f32::NEG_INFINITY
            } else {
                2.0 * rng.next_normal() as f32
            }
        })
        .collect();
    let data: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let logits = be.upload(HostData::F32(&data), &[rows, vocab])?;
    let reference: Vec<f32> = be.to_host_f32(&logits)?[..vocab].to_vec();
    let modes = [
        (0.0, 0, 1.0),
        (1.0, 0, 1.0),
        (1.0, 50, 1.0),
        (1.0, 0, 0.9),
        (0.8, 20, 0.5),
    ];
    for (temperature, top_k, top_p) in modes {
        let p = SamplingParams {
            temperature,
            top_k,
            top_p,
            seed: seed + 11,
        };
        let out = be.sample(
            &logits,
            &vec![p; rows],
            &(0..rows as u64).collect::<Vec<_>>(),
        )?;
        let inv_t = if temperature > 0.0 {
            1.0 / temperature as f64
        } else {
            1.0
        };
        let m = reference
            .iter()
            .fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64 * inv_t));
        let lse = m + reference
            .iter()
            .map(|&x| (x as f64 * inv_t - m).exp())
            .sum::<f64>()
            .ln();
        let bad: Vec<String> = out
            .iter()
            .filter(|s| {
                let want = reference
                    .get(s.id as usize)
                    .map(|&x| x as f64 * inv_t - lse);
                s.id % 3 == 0
                    || want.is_none_or(|w| {
                        let e = (s.logprob as f64 - w).abs();
                        e.is_nan() || e >= 2e-3
                    })
            })
            .map(|s| format!("{}:{}", s.id, s.logprob))
            .collect();
        c.push(
            format!("sample T={temperature} top-k={top_k} top-p={top_p} with -inf logits {tag}"),
            bad.is_empty(),
            format!("bad samples {bad:?}"),
        );
    }
    Ok(())
}

/// What one backend produced for the whole-model checks.
struct ModelRun {
    score: Vec<f32>,
    grads: Vec<(String, Vec<f32>)>,
    params: Vec<(String, Vec<f32>)>,
}

/// Loads the model, scores a sequence, computes the gradients of a packed two-sequence batch
/// (recorded), then takes one AdamW step from `step_grads` when given (so that both backends step
/// from identical gradients: Adam's first step is sign-like and would amplify tiny differences)
/// or from its own gradients.
fn model_run<B: Backend>(
    be: &B,
    dir: &Path,
    step_grads: Option<&[(String, Vec<f32>)]>,
) -> Result<ModelRun> {
    use sorft::model::Model;
    use sorft::train::backward::backward;
    use sorft::train::forward::{forward, Batch, ForwardOptions, Sequence};
    use sorft::train::loss::cross_entropy;
    use sorft::train::optim::{AdamW, OptimConfig};
    use sorft::train::params::{model_params, model_params_mut, Grads};
    let mut m = Model::load(be, dir)?;
    let vocab = m.config.vocab_size as u32;
    let ids: Vec<u32> = (0..50u32).map(|i| (i * 37 + 11) % vocab).collect();
    let (score, _) = m.score(&ids)?;
    let seqs = [
        Sequence {
            ids: ids[..30].to_vec(),
            mask: vec![1; 30],
            weight: 1.0,
        },
        Sequence {
            ids: ids[20..].to_vec(),
            mask: [vec![0u8; 10], vec![1u8; 20]].concat(),
            weight: 0.5,
        },
    ];
    let batch = Batch::pack(&seqs)?;
    let fwd = forward(&m, None, &batch, ForwardOptions::default())?;
    let lg = cross_entropy(be, &fwd, &batch.weights, batch.trained_tokens() as f64)?;
    let mut grads = Grads::new(&m, None)?;
    backward(&m, None, fwd, &lg.g_logp, &lg.g_entropy, &mut grads)?;
    let named = grads.named();
    let mut gv = Vec::new();
    for (n, t) in named {
        gv.push((n, be.to_host_f32(t)?));
    }
    if let Some(sg) = step_grads {
        for ((name, t), (n2, vals)) in grads.named_mut().into_iter().zip(sg) {
            if &name != n2 {
                bail!("gradient order differs: {name} vs {n2}");
            }
            let up = be.upload(HostData::F32(vals), t.shape())?;
            be.fill(t, 0.0)?;
            be.axpy(t, 1.0, &up)?;
        }
    }
    let mut opt = AdamW::new(
        be,
        OptimConfig {
            lr: 1e-3,
            ..OptimConfig::default()
        },
        &model_params(&m),
    )?;
    opt.step(be, model_params_mut(&mut m), &mut grads)?;
    let mut pv = Vec::new();
    for (n, t) in model_params(&m) {
        pv.push((n, be.to_host_f32(t)?));
    }
    Ok(ModelRun {
        score,
        grads: gv,
        params: pv,
    })
}

/// The tiny model on the GPU (f32 and bf16) against the CPU.
fn model_checks(gpu: &Cuda, c: &mut Checks) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let corpus: Vec<String> = sorft::model::init::EMBEDDED_CORPUS
        .lines()
        .map(String::from)
        .collect();
    sorft::model::init::init_model(sorft::model::init::Preset::Tiny, dir.path(), 7, &corpus)?;
    let cpu = model_run(&Cpu, dir.path(), None)?;
    let g32 = model_run(&gpu.with_dtype(DType::F32)?, dir.path(), Some(&cpu.grads))?;
    c.close("model log-probs f32", &g32.score, &cpu.score, 1e-4);
    for ((n, gg), (_, gc)) in g32.grads.iter().zip(&cpu.grads) {
        c.close(format!("model gradient {n} f32"), gg, gc, 1e-3);
    }
    for ((n, pg), (_, pc)) in g32.params.iter().zip(&cpu.params) {
        c.close(
            format!("model AdamW step {n} f32 (same grads)"),
            pg,
            pc,
            1e-5,
        );
    }
    let bf = gpu.with_dtype(DType::BF16)?;
    let m = sorft::model::Model::load(&bf, dir.path())?;
    let vocab = m.config.vocab_size as u32;
    let ids: Vec<u32> = (0..50u32).map(|i| (i * 37 + 11) % vocab).collect();
    let (score, _) = m.score(&ids)?;
    c.close("model log-probs bf16", &score, &cpu.score, 5e-2);
    hotpath::transfer_checks(gpu, dir.path(), c)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_sampling_statistics_pass() {
        let mut c = Checks::default();
        sampling_checks(&Cpu, "cpu", 512, (512, 40), 3, &mut c).unwrap();
        assert!(
            c.all_passed(),
            "{:?}",
            c.outcomes.iter().filter(|o| !o.pass).collect::<Vec<_>>()
        );
        assert!(c.outcomes.len() >= 10);
    }

    #[test]
    fn comparison_catches_nan_and_large_errors() {
        let mut c = Checks::default();
        c.close("same", &[1.0, 2.0], &[1.0, 2.0], 1e-6);
        c.close("nan", &[f32::NAN, 2.0], &[1.0, 2.0], 1e-6);
        c.close("off", &[1.1, 2.0], &[1.0, 2.0], 1e-3);
        c.close("len", &[1.0], &[1.0, 2.0], 1e-3);
        let pass: Vec<bool> = c.outcomes.iter().map(|o| o.pass).collect();
        assert_eq!(pass, vec![true, false, false, false]);
    }

    #[test]
    fn cuda_selftest_without_a_gpu_is_a_one_line_error() {
        if Cuda::new(0, DType::F32).is_ok() {
            return; // a GPU is present: nothing to check here
        }
        let e = run(SelftestArgs {
            device: Device::Cuda,
            seed: 1,
            no_model: true,
            quick: true,
            attention: None,
            gemm: gemm::GemmChoice::Auto,
            realistic: false,
            only: None,
        })
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("no usable GPU"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }
}
