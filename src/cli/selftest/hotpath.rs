//! Selftest checks of the GPU hot path: fp32 master weights (updates below bf16 resolution
//! accumulate), device-to-host transfers per decode step and per training step (held to fixed
//! limits that do not grow with the layer or tensor count), and empty batches (no launch of a
//! zero-sized grid).

use std::path::Path;

use anyhow::Result;

use sorft::engine::backend::{AttentionShape, Backend, HostData};
use sorft::engine::sampling::SamplingParams;
use sorft::engine::{Cpu, Cuda, DType};
use sorft::model::transformer::Step;
use sorft::model::{KvCache, Model};
use sorft::train::optim::{AdamW, OptimConfig};

use super::Checks;

/// Most device-to-host transfers of one decode step (forward of one token per sequence and
/// sampling): the sampled ids and log-probabilities, in one copy.
pub const DECODE_D2H_LIMIT: u64 = 1;
/// Most device-to-host transfers of one training step of the tiny model (forward, loss,
/// backward, optimizer step): the loss's per-token values and the gradient norm (one reduction
/// over every tensor), none per layer or per tensor.
pub const TRAIN_D2H_LIMIT: u64 = 2;

/// Runs every hot-path check on `gpu`.
pub fn checks(gpu: &Cuda, c: &mut Checks) -> Result<()> {
    master_weight_check(gpu, c)?;
    empty_batch_checks(&gpu.with_dtype(DType::F32)?, "f32", c)?;
    empty_batch_checks(&gpu.with_dtype(DType::BF16)?, "bf16", c)?;
    Ok(())
}

/// Runs `steps` AdamW steps (lr 2^-12, constant gradient 1, no clipping) on a weight of ones
/// through the optimizer the trainers use; `master` false takes the plain bf16 update instead
/// (the fault the master copy fixes). Returns the weight's values afterwards.
fn descend<B: Backend>(be: &B, n: usize, steps: usize, master: bool) -> Result<Vec<f32>> {
    let ones = vec![1.0f32; n];
    let mut w = be.upload(HostData::F32(&ones), &[n])?;
    let mut g = be.zeros(&[n], DType::F32)?;
    be.fill(&mut g, 1.0)?;
    let cfg = OptimConfig {
        lr: 1.0 / 4096.0,
        max_grad_norm: 0.0,
        ..OptimConfig::default()
    };
    let mut opt = AdamW::new(be, cfg, &[("w".to_string(), &w)])?;
    if !master {
        opt.master = vec![None];
    }
    for _ in 0..steps {
        opt.step_with_lr(
            be,
            vec![("w".to_string(), &mut w)],
            vec![("w".to_string(), &mut g)],
            1.0 / 4096.0,
        )?;
    }
    Ok(be.to_host_f32(&w)?)
}

/// bf16 weights with fp32 master weights: 64 updates of 2^-12 (each below 2^-9 of the weight,
/// lost when written straight into bf16) move the weight by 2^-6, as on the CPU in f32.
fn master_weight_check(gpu: &Cuda, c: &mut Checks) -> Result<()> {
    let bf = gpu.with_dtype(DType::BF16)?;
    let (n, steps) = (1000, 64);
    let want = 1.0 - steps as f32 / 4096.0;
    let got = descend(&bf, n, steps, true)?;
    let cpu = descend(&Cpu, n, steps, true)?;
    let lost = descend(&bf, n, steps, false)?;
    let worst = got.iter().map(|&x| (x - want).abs()).fold(0.0f32, f32::max);
    let cpu_worst = cpu.iter().map(|&x| (x - want).abs()).fold(0.0f32, f32::max);
    // The master copy must move the weight; the plain bf16 update must not (else the check
    // could not tell the two apart).
    let pass = worst <= 1e-3 && cpu_worst <= 1e-4 && lost.iter().all(|&x| x == 1.0);
    c.push(
        "adamw bf16 fp32 master weights: tiny updates accumulate",
        pass,
        format!(
            "{steps} steps of 2^-12: weight {} (want {want}, CPU {}), without master {}",
            got.first().copied().unwrap_or(f32::NAN),
            cpu.first().copied().unwrap_or(f32::NAN),
            lost.first().copied().unwrap_or(f32::NAN)
        ),
    );
    Ok(())
}

/// Ops on zero rows: empty results, the weight gradient untouched, no kernel launched (a grid
/// rounded up to one block would read row 0 of an empty tensor).
fn empty_batch_checks(g: &Cuda, tag: &str, c: &mut Checks) -> Result<()> {
    let (d, v, h, hd) = (32usize, 40usize, 2usize, 16usize);
    let x = g.zeros(&[0, d], g.dtype())?;
    let w = g.upload(HostData::F32(&vec![1.0; d]), &[d])?;
    let head = g.upload(HostData::F32(&vec![0.5; v * d]), &[v, d])?;
    let mut dw = g.zeros(&[d], DType::F32)?;
    g.fill(&mut dw, 3.0)?;
    let empty_idx = g.upload(HostData::U32(&[]), &[0])?;
    let cu = g.upload(HostData::U32(&[0, 0]), &[2])?;
    let q = g.zeros(&[0, h * hd], g.dtype())?;
    let sh = AttentionShape {
        n_heads: h,
        n_kv_heads: h,
        head_dim: hd,
        scale: 0.25,
    };
    let mut shapes = Vec::new();
    shapes.push(g.rms_norm(&x, &w, 1e-6)?.shape().to_vec());
    shapes.push(
        g.log_softmax(&g.zeros(&[0, v], g.dtype())?)?
            .shape()
            .to_vec(),
    );
    shapes.push(
        g.rms_norm_backward(&x, &w, &x, 1e-6, Some(&mut dw))?
            .shape()
            .to_vec(),
    );
    let (lp, en) = g.token_logprobs(&x, &head, &empty_idx, 8)?;
    shapes.push(lp.shape().to_vec());
    shapes.push(en.shape().to_vec());
    let (o, lse) = g.attention_train(&q, &q, &q, &cu, sh)?;
    shapes.push(o.shape().to_vec());
    shapes.push(lse.shape().to_vec());
    shapes.push(g.linear(&x, &head, None)?.shape().to_vec());
    let sampled = g.sample(&g.zeros(&[0, v], g.dtype())?, &[], &[])?;
    let dw_host = g.to_host_f32(&dw)?;
    let shapes_ok = shapes.iter().all(|s| s.first() == Some(&0));
    let pass = shapes_ok && sampled.is_empty() && dw_host.iter().all(|&x| x == 3.0);
    c.push(
        format!("empty batch (0 rows) through every row op {tag}"),
        pass,
        if pass {
            format!("{} ops", shapes.len())
        } else {
            format!(
                "shapes {shapes:?}, sampled {}, dweight changed",
                sampled.len()
            )
        },
    );
    Ok(())
}

/// Device-to-host transfers of one decode step and one training step of the tiny model at `dir`
/// on `gpu` (bf16), against [`DECODE_D2H_LIMIT`] and [`TRAIN_D2H_LIMIT`].
pub fn transfer_checks(gpu: &Cuda, dir: &Path, c: &mut Checks) -> Result<()> {
    let be = gpu.with_dtype(DType::BF16)?;
    let m = Model::load(&be, dir)?;
    let vocab = m.config.vocab_size as u32;
    let layers = m.config.num_layers;
    let b = 4usize;
    let mut cache = KvCache::new(&be, &m.config, b, 32)?;
    // Prefill 8 tokens per sequence, then one decode step of one token per sequence.
    let ids: Vec<u32> = (0..8 * b as u32).map(|i| (i * 37 + 11) % vocab).collect();
    let slots: Vec<u32> = (0..8 * b as u32).map(|i| i / 8).collect();
    let pos: Vec<u32> = (0..8 * b as u32).map(|i| i % 8).collect();
    let rows: Vec<u32> = (0..b as u32).map(|s| s * 8 + 7).collect();
    let step = Step {
        ids: &ids,
        slots: &slots,
        positions: &pos,
        logit_rows: &rows,
    };
    let params = vec![SamplingParams::default(); b];
    let logits = m.forward(&mut cache, &step)?;
    let first = be.sample(&logits, &params, &[0; 4])?;
    let next: Vec<u32> = first.iter().map(|s| s.id).collect();
    let dslots: Vec<u32> = (0..b as u32).collect();
    let dpos = vec![8u32; b];
    let drows: Vec<u32> = (0..b as u32).collect();
    let before = gpu.d2h_transfers();
    let logits = m.forward(
        &mut cache,
        &Step {
            ids: &next,
            slots: &dslots,
            positions: &dpos,
            logit_rows: &drows,
        },
    )?;
    be.sample(&logits, &params, &[1; 4])?;
    let decode = gpu.d2h_transfers().since(before);
    c.push(
        format!("device-to-host transfers per decode step ({layers} layers, batch {b})"),
        decode.count <= DECODE_D2H_LIMIT,
        format!(
            "{} transfers, {} bytes (limit {DECODE_D2H_LIMIT})",
            decode.count, decode.bytes
        ),
    );
    drop(m);
    let mut m = Model::load(&be, dir)?;
    let n_tensors = sorft::train::params::model_params(&m).len();
    let before = gpu.d2h_transfers();
    train_step(&be, &mut m)?;
    let train = gpu.d2h_transfers().since(before);
    c.push(
        format!("device-to-host transfers per train step ({layers} layers, {n_tensors} tensors)"),
        train.count <= TRAIN_D2H_LIMIT,
        format!(
            "{} transfers, {} bytes (limit {TRAIN_D2H_LIMIT})",
            train.count, train.bytes
        ),
    );
    Ok(())
}

/// One full training step (forward, loss, backward, AdamW) of `m` on a packed batch of two
/// sequences.
fn train_step<B: Backend>(be: &B, m: &mut Model<B>) -> Result<()> {
    use sorft::train::backward::backward;
    use sorft::train::forward::{forward, Batch, ForwardOptions, Sequence};
    use sorft::train::loss::cross_entropy;
    use sorft::train::params::{model_params, model_params_mut, Grads};
    let vocab = m.config.vocab_size as u32;
    let ids: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % vocab).collect();
    let seqs = [
        Sequence {
            ids: ids[..24].to_vec(),
            mask: vec![1; 24],
            weight: 1.0,
        },
        Sequence {
            ids: ids[16..].to_vec(),
            mask: [vec![0u8; 8], vec![1u8; 16]].concat(),
            weight: 0.5,
        },
    ];
    let batch = Batch::pack(&seqs)?;
    let fwd = forward(m, None, &batch, ForwardOptions::default())?;
    let lg = cross_entropy(be, &fwd, &batch.weights, batch.trained_tokens() as f64)?;
    let mut grads = Grads::new(m, None)?;
    backward(m, None, fwd, &lg.g_logp, &lg.g_entropy, &mut grads)?;
    let mut opt = AdamW::new(be, OptimConfig::default(), &model_params(m))?;
    opt.step(be, model_params_mut(m), &mut grads)?;
    Ok(())
}
