//! `sorft bench kernels`: timings of the CUDA kernels with CUDA events (warm-up, median of many
//! repeats, inputs rotated across several copies so that the L2 cache does not serve them), as
//! achieved TFLOP/s or GB/s beside ceilings measured in the same run (a large device-to-device
//! copy and a large bf16 GEMM). Prints one JSON object per line.

use anyhow::{bail, Result};
use cudarc::driver::sys::CUevent_flags;

use sorft::engine::backend::{AttentionShape, Backend, HostData, IGNORE_TARGET};
use sorft::engine::cuda::memory::MemoryPlan;
use sorft::engine::rng::SplitMix;
use sorft::engine::{Cuda, DType, SamplingParams, Tensor};

/// Warm-up launches before timing.
const WARMUP: usize = 3;
/// Timed repeats (the median is reported).
const REPEATS: usize = 25;
/// Bytes of inputs to rotate through (about four times an H100/H200 L2).
const ROTATE_BYTES: usize = 200 << 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Copies of an input so that consecutive repeats read different memory.
fn copies(set_bytes: usize) -> usize {
    ROTATE_BYTES.div_ceil(set_bytes.max(1)).clamp(1, 8)
}

/// Times `f(i)` (i = repeat index) with CUDA events; returns the median in seconds.
fn time(be: &Cuda, mut f: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    let ctx = be.stream().context();
    let mut times = Vec::with_capacity(REPEATS);
    for i in 0..WARMUP {
        f(i)?;
    }
    for i in 0..REPEATS {
        let a = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let b = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        a.record(be.stream())?;
        f(i)?;
        b.record(be.stream())?;
        b.synchronize()?;
        times.push(a.elapsed_ms(&b)? as f64 / 1e3);
    }
    Ok(median(times))
}

fn rand_tensor(be: &Cuda, rng: &mut SplitMix, shape: &[usize], scale: f32) -> Result<Tensor<Cuda>> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.next_normal() as f32 * scale).collect();
    Ok(be.upload(HostData::F32(&v), shape)?)
}

fn line(name: &str, secs: f64, work: f64, unit: &str, ceiling: f64) {
    let per_unit = if unit == "GB/s" { 1e9 } else { 1e12 };
    let rate = work / secs / per_unit;
    let frac = if ceiling > 0.0 { rate / ceiling } else { 0.0 };
    println!(
        "{}",
        serde_json::json!({
            "kernel": name, "ms": secs * 1e3, unit: rate, "ceiling": ceiling,
            "fraction_of_ceiling": frac,
        })
    );
}

/// FLOPs of a causal forward (two matrix products over the lower triangle, diagonal included).
fn causal_fwd_flops(seqs: usize, len: usize, n_heads: usize, head_dim: usize) -> f64 {
    let pairs = (len * (len + 1) / 2) as f64;
    4.0 * seqs as f64 * pairs * (head_dim * n_heads) as f64
}

/// Attention forward rows: the tensor-core kernel (kernels/attn_mma.cu) at the shapes
/// (causal, bf16, 4k-16k tokens), and the scalar kernel beside it (`SORFT_ATTN_KERNEL=scalar`)
/// at one shape, in TFLOP/s against the bf16 GEMM ceiling `tf`.
fn attention_rows(be: &Cuda, rng: &mut SplitMix, tf: f64) -> Result<()> {
    let shapes = [
        (4, 4096, 32, 8, 128),
        (1, 16384, 32, 8, 128),
        (4, 4096, 28, 4, 128),
        (4, 4096, 32, 8, 64),
    ];
    for (i, &(seqs, len, n_heads, n_kv_heads, head_dim)) in shapes.iter().enumerate() {
        let sh = AttentionShape {
            n_heads,
            n_kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        let tt = seqs * len;
        let q = rand_tensor(be, rng, &[tt, n_heads * head_dim], 1.0)?;
        let k = rand_tensor(be, rng, &[tt, n_kv_heads * head_dim], 1.0)?;
        let v = rand_tensor(be, rng, &[tt, n_kv_heads * head_dim], 1.0)?;
        let cu: Vec<u32> = (0..=seqs as u32).map(|s| s * len as u32).collect();
        let cu_t = be.upload(HostData::U32(&cu), &[cu.len()])?;
        let kernels: &[&str] = if i == 0 { &["mma", "scalar"] } else { &["mma"] };
        for &kernel in kernels {
            let prev = std::env::var_os("SORFT_ATTN_KERNEL");
            std::env::set_var("SORFT_ATTN_KERNEL", kernel);
            let s = time(be, |_| {
                be.attention_train(&q, &k, &v, &cu_t, sh)?;
                Ok(())
            });
            match prev {
                Some(p) => std::env::set_var("SORFT_ATTN_KERNEL", p),
                None => std::env::remove_var("SORFT_ATTN_KERNEL"),
            }
            line(
                &format!(
                    "attention fwd causal bf16 {kernel} {seqs}x{len} h{n_heads}/{n_kv_heads} hd{head_dim}"
                ),
                s?,
                causal_fwd_flops(seqs, len, n_heads, head_dim),
                "TFLOP/s",
                tf,
            );
        }
    }
    Ok(())
}

/// Runs `sorft bench kernels`.
pub fn run() -> Result<()> {
    use super::device::{pick, DeviceChoice, Picked};
    let be = match pick(DeviceChoice::Cuda, DType::BF16) {
        Ok(Picked::Cuda(b)) => b,
        Ok(Picked::Cpu(_)) => bail!("no usable GPU, cannot benchmark kernels"),
        Err(e) => bail!("no usable GPU, cannot benchmark kernels ({e})"),
    };
    let (free, total) = be.mem_info()?;
    let mut plan = MemoryPlan::new();
    plan.add("copy ceiling", 2 << 30)
        .add("gemm ceiling", 3 * 8192 * 8192 * 2);
    plan.check(free, total, 1 << 30)?;
    println!(
        "{}",
        serde_json::json!({"device": be.name(), "setup": be.load_summary(), "repeats": REPEATS})
    );
    let mut rng = SplitMix::new(42);

    // ceilings
    let n_copy = 1usize << 30;
    let src = be.zeros(&[n_copy / 2], DType::BF16)?;
    let mut dst = be.zeros(&[n_copy / 2], DType::BF16)?;
    // Into a destination allocated once: timing `copy` (which allocates) measured the allocator.
    let copy_s = time(&be, |_| {
        be.stream()
            .memcpy_dtod(&src.storage().data, &mut dst.storage_mut().data)
            .map_err(|e| anyhow::anyhow!("device copy: {e:?}"))
    })?;
    drop(dst);
    let bw = 2.0 * n_copy as f64 / copy_s / 1e9;
    println!(
        "{}",
        serde_json::json!({"ceiling": "device-to-device copy", "GB/s": bw})
    );
    let g = 8192;
    let a = rand_tensor(&be, &mut rng, &[g, g], 1.0)?;
    let b = rand_tensor(&be, &mut rng, &[g, g], 1.0)?;
    let mut c = be.zeros(&[g, g], DType::BF16)?;
    let gemm_s = time(&be, |_| Ok(be.matmul(&a, false, &b, true, &mut c, false)?))?;
    let tf = 2.0 * (g as f64).powi(3) / gemm_s / 1e12;
    println!(
        "{}",
        serde_json::json!({"ceiling": "bf16 GEMM 8192^3", "TFLOP/s": tf})
    );
    drop((a, b, c, src));

    // memory-bound kernels
    let (t, d) = (16_384usize, 4096usize);
    let set = t * d * 2;
    let xs: Vec<Tensor<Cuda>> = (0..copies(set))
        .map(|_| rand_tensor(&be, &mut rng, &[t, d], 1.0))
        .collect::<Result<_>>()?;
    let w = rand_tensor(&be, &mut rng, &[d], 1.0)?;
    let s = time(&be, |i| {
        be.rms_norm(&xs[i % xs.len()], &w, 1e-6)?;
        Ok(())
    })?;
    line("rms_norm bf16 16384x4096", s, 2.0 * set as f64, "GB/s", bw);
    let s = time(&be, |i| {
        be.swiglu(&xs[i % xs.len()], &xs[(i + 1) % xs.len()])?;
        Ok(())
    })?;
    line("swiglu bf16 16384x4096", s, 3.0 * set as f64, "GB/s", bw);
    let pos = be.upload(HostData::U32(&(0..t as u32).collect::<Vec<_>>()), &[t])?;
    let mut xr: Vec<Tensor<Cuda>> = xs;
    let s = time(&be, |i| {
        let n = xr.len();
        be.rope(&mut xr[i % n], &pos, 128, 1e6)?;
        Ok(())
    })?;
    line(
        "rope bf16 16384x4096 hd128",
        s,
        2.0 * set as f64,
        "GB/s",
        bw,
    );
    drop(xr);

    // attention: 4 sequences of 2048, 32 heads, 8 kv heads, hd 128
    let sh = AttentionShape {
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
        scale: 1.0 / 128f32.sqrt(),
    };
    let (seqs, len) = (4usize, 2048usize);
    let tt = seqs * len;
    let q = rand_tensor(&be, &mut rng, &[tt, 32 * 128], 1.0)?;
    let k = rand_tensor(&be, &mut rng, &[tt, 8 * 128], 1.0)?;
    let v = rand_tensor(&be, &mut rng, &[tt, 8 * 128], 1.0)?;
    let cu: Vec<u32> = (0..=seqs as u32).map(|s| s * len as u32).collect();
    let cu_t = be.upload(HostData::U32(&cu), &[cu.len()])?;
    let causal_flops = 4.0 * (seqs * len * len / 2) as f64 * 128.0 * 32.0;
    let mut saved = None;
    let s = time(&be, |_| {
        saved = Some(be.attention_train(&q, &k, &v, &cu_t, sh)?);
        Ok(())
    })?;
    line(
        "flash_fwd bf16 4x2048 h32/8 hd128",
        s,
        causal_flops,
        "TFLOP/s",
        tf,
    );
    if let Some((o, lse)) = &saved {
        let s = time(&be, |_| {
            be.attention_backward(&q, &k, &v, o, lse, o, &cu_t, sh)?;
            Ok(())
        })?;
        line(
            "flash_bwd bf16 4x2048 h32/8 hd128",
            s,
            2.5 * causal_flops,
            "TFLOP/s",
            tf,
        );
    }
    drop((q, k, v, saved));
    attention_rows(&be, &mut rng, tf)?;

    // decode: 64 sequences at 4096 positions of a slot cache
    let (bsz, ctxlen) = (64usize, 4096usize);
    let kc = rand_tensor(&be, &mut rng, &[bsz, ctxlen, 8 * 128], 1.0)?;
    let vc = rand_tensor(&be, &mut rng, &[bsz, ctxlen, 8 * 128], 1.0)?;
    let qd = rand_tensor(&be, &mut rng, &[bsz, 32 * 128], 1.0)?;
    let slots = be.upload(HostData::U32(&(0..bsz as u32).collect::<Vec<_>>()), &[bsz])?;
    let posd = be.upload(HostData::U32(&vec![ctxlen as u32 - 1; bsz]), &[bsz])?;
    let s = time(&be, |_| {
        be.attention(&qd, &kc, &vc, &slots, &posd, sh)?;
        Ok(())
    })?;
    line(
        "decode attention bf16 64x4096 h32/8 hd128",
        s,
        2.0 * (bsz * ctxlen * 8 * 128 * 2) as f64,
        "GB/s",
        bw,
    );
    drop((kc, vc, qd));

    // sampling over the Qwen vocabulary
    let vocab = 151_936usize;
    let logits = rand_tensor(&be, &mut rng, &[bsz, vocab], 3.0)?;
    let params = vec![
        SamplingParams {
            temperature: 0.8,
            top_k: 50,
            top_p: 0.95,
            seed: 1
        };
        bsz
    ];
    let counters: Vec<u64> = (0..bsz as u64).collect();
    let s = time(&be, |_| {
        be.sample(&logits, &params, &counters)?;
        Ok(())
    })?;
    line(
        "sample bf16 64x151936 top-k 50 top-p 0.95",
        s,
        (bsz * vocab * 2) as f64,
        "GB/s",
        bw,
    );
    drop(logits);

    // token log-probs (the GEMM dominates)
    let (tl, dl) = (4096usize, 2048usize);
    let h = rand_tensor(&be, &mut rng, &[tl, dl], 1.0)?;
    let head = rand_tensor(&be, &mut rng, &[vocab, dl], 0.02)?;
    let tg: Vec<u32> = (0..tl as u32)
        .map(|i| {
            if i % 10 == 0 {
                IGNORE_TARGET
            } else {
                i * 7 % vocab as u32
            }
        })
        .collect();
    let tg_t = be.upload(HostData::U32(&tg), &[tl])?;
    let s = time(&be, |_| {
        be.token_logprobs(&h, &head, &tg_t, 1024)?;
        Ok(())
    })?;
    line(
        "token_logprobs bf16 4096x2048 V151936",
        s,
        2.0 * (tl * vocab * dl) as f64,
        "TFLOP/s",
        tf,
    );
    drop((h, head));

    // AdamW over 64M parameters (f32 master copy and moments)
    let f32be = be.with_dtype(DType::F32)?;
    let np = 64usize << 20;
    let mut p = f32be.zeros(&[np], DType::F32)?;
    let gr = f32be.zeros(&[np], DType::F32)?;
    let mut m = f32be.zeros(&[np], DType::F32)?;
    let mut vv = f32be.zeros(&[np], DType::F32)?;
    let hp = sorft::engine::backend::AdamWParams {
        lr: 1e-4,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 1,
    };
    let s = time(&f32be, |_| {
        Ok(f32be.adamw_step(&mut p, &gr, &mut m, &mut vv, hp)?)
    })?;
    line("adamw f32 64M params", s, (7 * 4 * np) as f64, "GB/s", bw);
    Ok(())
}
