//! The hand-written backward of the training forward, layer by layer in reverse (the llm.c way):
//! LM head and final norm, then per block the MLP (down, SwiGLU, gate/up, norm) and attention
//! (o_proj, packed causal attention, RoPE, q/k/v with biases, norm), residual adds, embedding.

use crate::engine::{Backend, DType, Tensor};
use crate::model::transformer::Model;
use crate::train::error::Result;
use crate::train::forward::{block_forward, tempered, BlockActs, Forward, Saved};
use crate::train::lora::{Adapter, Lora, LoraTarget};
use crate::train::params::Grads;
use crate::train::restrict::head_backward;

/// Where the gradient of one projection goes.
struct ProjGrad<'a, B: Backend> {
    w: Option<&'a mut Tensor<B>>,
    bias: Option<&'a mut Tensor<B>>,
    adapter: Option<&'a mut Adapter<B>>,
}

/// Backward of `y = x W^T (+ b) + s (x A^T) B^T`: `dx += dy W + s (dy B) A`, and the requested
/// parameter gradients.
#[allow(clippy::too_many_arguments)]
fn project_backward<B: Backend>(
    be: &B,
    x: &Tensor<B>,
    w: &Tensor<B>,
    ad: Option<&Adapter<B>>,
    s: f32,
    dy: &Tensor<B>,
    dx: &mut Tensor<B>,
    g: ProjGrad<'_, B>,
) -> Result<()> {
    be.linear_backward(x, w, dy, dx, g.w)?;
    if let Some(gb) = g.bias {
        be.sum_rows(dy, gb, true)?;
    }
    if let Some(ad) = ad {
        let t = x.shape()[0];
        let r = ad.a.shape()[0];
        // u = x A^T, du = s dy B.
        let u = be.linear(x, &ad.a, None)?;
        let mut du = be.zeros(&[t, r], DType::F32)?;
        be.matmul(dy, false, &ad.b, false, &mut du, false)?;
        be.scale(&mut du, s)?;
        be.matmul(&du, false, &ad.a, false, dx, true)?;
        if let Some(ga) = g.adapter {
            let mut gb = be.zeros(ad.b.shape(), DType::F32)?;
            be.matmul(dy, true, &u, false, &mut gb, false)?;
            be.axpy(&mut ga.b, s, &gb)?;
            be.matmul(&du, true, x, false, &mut ga.a, true)?;
        }
    }
    Ok(())
}

/// Backward of the whole model for a loss whose gradients with respect to the per-row
/// log-probabilities and entropies of `fwd` are `g_logp` and `g_entropy` (`[T]` each). Adds the
/// gradients of the trained parameters to `grads` (accumulation across micro-batches).
pub fn backward<B: Backend>(
    model: &Model<B>,
    lora: Option<&Lora<B>>,
    fwd: Forward<B>,
    g_logp: &Tensor<B>,
    g_entropy: &Tensor<B>,
    grads: &mut Grads<B>,
) -> Result<()> {
    let be = &model.backend;
    let c = &model.config;
    let Forward {
        batch,
        mut blocks,
        x_final,
        h_final,
        opts,
        restricted,
        ..
    } = fwd;
    let t = batch.ids.shape()[0];
    let d = c.hidden_size;
    let s = lora.map(|l| l.scale()).unwrap_or(0.0);

    // LM head and final norm.
    let mut dx = {
        let dhead = grads
            .full
            .as_mut()
            .map(|gm| gm.lm_head.as_mut().unwrap_or(&mut gm.embed));
        let scaled = tempered(be, &h_final, opts.temperature)?;
        let hin = scaled.as_ref().unwrap_or(&h_final);
        // Restricted rows: their restricted distribution's exact gradients (log-probability
        // and entropy); the other rows the full softmax's.
        let mut dh = head_backward(
            be,
            restricted.as_ref(),
            hin,
            model.head(),
            &batch.targets,
            g_logp,
            g_entropy,
            opts.chunk_rows,
            dhead,
        )?;
        if opts.temperature != 1.0 {
            be.scale(&mut dh, 1.0 / opts.temperature)?;
        }
        let gnorm = grads.full.as_mut().map(|gm| &mut gm.norm);
        be.rms_norm_backward(&x_final, &model.norm, &dh, c.rms_norm_eps, gnorm)?
    };
    drop(h_final);
    drop(x_final);

    for l in (0..model.blocks.len()).rev() {
        let saved = blocks.pop().expect("one saved entry per block");
        let a: BlockActs<B> = match saved {
            Saved::Full(a) => *a,
            Saved::Input(x_in) => block_forward(model, lora, l, x_in, &batch)?.1,
        };
        let blk = &model.blocks[l];
        let ad = |t: LoraTarget| lora.and_then(|lo| lo.adapter(l, t));
        // Split the gradient sets into per-projection destinations.
        let mut full = grads.full.as_mut().map(|gm| &mut gm.blocks[l]);
        let mut lg = grads.lora.as_mut();
        macro_rules! pg {
            ($w:ident, $target:expr) => {
                ProjGrad {
                    w: full.as_deref_mut().map(|b| &mut b.$w),
                    bias: None,
                    adapter: lg.as_deref_mut().and_then(|g| g.adapter_mut(l, $target)),
                }
            };
        }
        let fh = |x: &Tensor<B>| be.zeros(x.shape(), DType::F32);

        // MLP.
        let mut dm = fh(&a.m)?;
        project_backward(
            be,
            &a.m,
            &blk.down,
            ad(LoraTarget::Down),
            s,
            &dx,
            &mut dm,
            pg!(down, LoraTarget::Down),
        )?;
        drop(a.m);
        let (dg, du) = be.swiglu_backward(&a.g, &a.u, &dm)?;
        drop(dm);
        let mut dh2 = be.zeros(&[t, d], DType::F32)?;
        project_backward(
            be,
            &a.h2,
            &blk.gate,
            ad(LoraTarget::Gate),
            s,
            &dg,
            &mut dh2,
            pg!(gate, LoraTarget::Gate),
        )?;
        project_backward(
            be,
            &a.h2,
            &blk.up,
            ad(LoraTarget::Up),
            s,
            &du,
            &mut dh2,
            pg!(up, LoraTarget::Up),
        )?;
        drop((dg, du));
        let gpost = full.as_deref_mut().map(|b| &mut b.post_norm);
        let dxm = be.rms_norm_backward(&a.x_mid, &blk.post_norm, &dh2, c.rms_norm_eps, gpost)?;
        be.add_assign(&mut dx, &dxm)?;
        drop(dh2);

        // Attention.
        let mut datt = fh(&a.att)?;
        let go = ProjGrad {
            w: full.as_deref_mut().map(|b| &mut b.o),
            bias: None,
            adapter: lg
                .as_deref_mut()
                .and_then(|g| g.adapter_mut(l, LoraTarget::O)),
        };
        project_backward(be, &a.att, &blk.o, ad(LoraTarget::O), s, &dx, &mut datt, go)?;
        if let Some(gb) = full.as_deref_mut().and_then(|b| b.o_bias.as_mut()) {
            be.sum_rows(&dx, gb, true)?;
        }
        let (mut dq, mut dk, dv) = be.attention_backward(
            &a.q,
            &a.k,
            &a.v,
            &a.att,
            &a.lse,
            &datt,
            &batch.cu_seqlens,
            model.attention_shape(),
        )?;
        drop(datt);
        be.rope_backward(&mut dq, &batch.positions, c.head_dim, c.rope_theta)?;
        be.rope_backward(&mut dk, &batch.positions, c.head_dim, c.rope_theta)?;
        let mut dh1 = be.zeros(&[t, d], DType::F32)?;
        for (target, dy) in [
            (LoraTarget::Q, &dq),
            (LoraTarget::K, &dk),
            (LoraTarget::V, &dv),
        ] {
            let (w, gsel) = match target {
                LoraTarget::Q => (
                    &blk.q,
                    full.as_deref_mut().map(|b| (&mut b.q, b.q_bias.as_mut())),
                ),
                LoraTarget::K => (
                    &blk.k,
                    full.as_deref_mut().map(|b| (&mut b.k, b.k_bias.as_mut())),
                ),
                _ => (
                    &blk.v,
                    full.as_deref_mut().map(|b| (&mut b.v, b.v_bias.as_mut())),
                ),
            };
            let (gw, gb) = match gsel {
                Some((w, b)) => (Some(w), b),
                None => (None, None),
            };
            let g = ProjGrad {
                w: gw,
                bias: gb,
                adapter: lg.as_deref_mut().and_then(|g| g.adapter_mut(l, target)),
            };
            project_backward(be, &a.h1, w, ad(target), s, dy, &mut dh1, g)?;
        }
        drop((dq, dk, dv));
        let gin = full.map(|b| &mut b.input_norm);
        let dxi = be.rms_norm_backward(&a.x_in, &blk.input_norm, &dh1, c.rms_norm_eps, gin)?;
        be.add_assign(&mut dx, &dxi)?;
    }
    if let Some(gm) = grads.full.as_mut() {
        be.embedding_backward(&mut gm.embed, &batch.ids, &dx)?;
    }
    Ok(())
}
