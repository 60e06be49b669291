//! Parameters and gradients by their Hugging Face names, in one fixed order.

use crate::engine::{Backend, DType, Tensor};
use crate::model::transformer::{Block, Model};
use crate::train::error::Result;
use crate::train::lora::Lora;

/// The parameters of a model with their Hugging Face names, in a fixed order.
pub fn model_params<B: Backend>(m: &Model<B>) -> Vec<(String, &Tensor<B>)> {
    let mut out = vec![("model.embed_tokens.weight".to_string(), &m.embed)];
    for (l, b) in m.blocks.iter().enumerate() {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), &b.input_norm));
        out.push((format!("{p}.self_attn.q_proj.weight"), &b.q));
        out.push((format!("{p}.self_attn.k_proj.weight"), &b.k));
        out.push((format!("{p}.self_attn.v_proj.weight"), &b.v));
        if let Some(t) = &b.q_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), t));
        }
        if let Some(t) = &b.k_bias {
            out.push((format!("{p}.self_attn.k_proj.bias"), t));
        }
        if let Some(t) = &b.v_bias {
            out.push((format!("{p}.self_attn.v_proj.bias"), t));
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), &b.o));
        if let Some(t) = &b.o_bias {
            out.push((format!("{p}.self_attn.o_proj.bias"), t));
        }
        out.push((format!("{p}.post_attention_layernorm.weight"), &b.post_norm));
        out.push((format!("{p}.mlp.gate_proj.weight"), &b.gate));
        out.push((format!("{p}.mlp.up_proj.weight"), &b.up));
        out.push((format!("{p}.mlp.down_proj.weight"), &b.down));
    }
    out.push(("model.norm.weight".to_string(), &m.norm));
    if let Some(h) = &m.lm_head {
        out.push(("lm_head.weight".to_string(), h));
    }
    out
}

/// The parameters of a model, mutably, in the order of [`model_params`].
pub fn model_params_mut<B: Backend>(m: &mut Model<B>) -> Vec<(String, &mut Tensor<B>)> {
    let mut out = vec![("model.embed_tokens.weight".to_string(), &mut m.embed)];
    for (l, b) in m.blocks.iter_mut().enumerate() {
        let p = format!("model.layers.{l}");
        out.push((format!("{p}.input_layernorm.weight"), &mut b.input_norm));
        out.push((format!("{p}.self_attn.q_proj.weight"), &mut b.q));
        out.push((format!("{p}.self_attn.k_proj.weight"), &mut b.k));
        out.push((format!("{p}.self_attn.v_proj.weight"), &mut b.v));
        if let Some(t) = &mut b.q_bias {
            out.push((format!("{p}.self_attn.q_proj.bias"), t));
        }
        if let Some(t) = &mut b.k_bias {
            out.push((format!("{p}.self_attn.k_proj.bias"), t));
        }
        if let Some(t) = &mut b.v_bias {
            out.push((format!("{p}.self_attn.v_proj.bias"), t));
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), &mut b.o));
        if let Some(t) = &mut b.o_bias {
            out.push((format!("{p}.self_attn.o_proj.bias"), t));
        }
        out.push((
            format!("{p}.post_attention_layernorm.weight"),
            &mut b.post_norm,
        ));
        out.push((format!("{p}.mlp.gate_proj.weight"), &mut b.gate));
        out.push((format!("{p}.mlp.up_proj.weight"), &mut b.up));
        out.push((format!("{p}.mlp.down_proj.weight"), &mut b.down));
    }
    out.push(("model.norm.weight".to_string(), &mut m.norm));
    if let Some(h) = &mut m.lm_head {
        out.push(("lm_head.weight".to_string(), h));
    }
    out
}

fn zeros<B: Backend>(b: &B, t: &Tensor<B>) -> Result<Tensor<B>> {
    Ok(b.zeros(t.shape(), DType::F32)?)
}

fn zeros_opt<B: Backend>(b: &B, t: &Option<Tensor<B>>) -> Result<Option<Tensor<B>>> {
    t.as_ref().map(|t| zeros(b, t)).transpose()
}

/// A model-shaped set of zero tensors (the gradient of every parameter of `m`).
pub fn zeros_like_model<B: Backend>(m: &Model<B>) -> Result<Model<B>> {
    let b = &m.backend;
    let mut blocks = Vec::with_capacity(m.blocks.len());
    for k in &m.blocks {
        blocks.push(Block {
            input_norm: zeros(b, &k.input_norm)?,
            q: zeros(b, &k.q)?,
            k: zeros(b, &k.k)?,
            v: zeros(b, &k.v)?,
            q_bias: zeros_opt(b, &k.q_bias)?,
            k_bias: zeros_opt(b, &k.k_bias)?,
            v_bias: zeros_opt(b, &k.v_bias)?,
            o: zeros(b, &k.o)?,
            o_bias: zeros_opt(b, &k.o_bias)?,
            post_norm: zeros(b, &k.post_norm)?,
            gate: zeros(b, &k.gate)?,
            up: zeros(b, &k.up)?,
            down: zeros(b, &k.down)?,
        });
    }
    Ok(Model {
        config: m.config.clone(),
        backend: b.clone(),
        embed: zeros(b, &m.embed)?,
        blocks,
        norm: zeros(b, &m.norm)?,
        lm_head: zeros_opt(b, &m.lm_head)?,
    })
}

/// Gradients of what is being trained: every model parameter (full fine-tuning) or the LoRA
/// adapters only.
pub struct Grads<B: Backend> {
    /// Gradients of the model's parameters, when they are trained.
    pub full: Option<Model<B>>,
    /// Gradients of the adapters, when LoRA is trained.
    pub lora: Option<Lora<B>>,
}

impl<B: Backend> Grads<B> {
    /// Zero gradients for full fine-tuning of `model`, or for `lora` when given.
    pub fn new(model: &Model<B>, lora: Option<&Lora<B>>) -> Result<Self> {
        Ok(match lora {
            Some(l) => Self {
                full: None,
                lora: Some(l.zeros_like(&model.backend)?),
            },
            None => Self {
                full: Some(zeros_like_model(model)?),
                lora: None,
            },
        })
    }

    /// The gradients by parameter name, in the order of the trained parameters.
    pub fn named(&self) -> Vec<(String, &Tensor<B>)> {
        let mut v = Vec::new();
        if let Some(m) = &self.full {
            v.extend(model_params(m));
        }
        if let Some(l) = &self.lora {
            v.extend(l.params());
        }
        v
    }

    /// The gradients, mutably.
    pub fn named_mut(&mut self) -> Vec<(String, &mut Tensor<B>)> {
        let mut v = Vec::new();
        if let Some(m) = &mut self.full {
            v.extend(model_params_mut(m));
        }
        if let Some(l) = &mut self.lora {
            v.extend(l.params_mut());
        }
        v
    }

    /// Sets every gradient to zero.
    pub fn zero(&mut self, backend: &B) -> Result<()> {
        for (_, t) in self.named_mut() {
            backend.fill(t, 0.0)?;
        }
        Ok(())
    }

    /// The global L2 norm of all gradients.
    pub fn global_norm(&self, backend: &B) -> Result<f64> {
        let mut ss = 0.0f64;
        for (_, t) in self.named() {
            ss += backend.sum_squares(t)?;
        }
        Ok(ss.sqrt())
    }

    /// Multiplies every gradient by `s`.
    pub fn scale(&mut self, backend: &B, s: f32) -> Result<()> {
        for (_, t) in self.named_mut() {
            backend.scale(t, s)?;
        }
        Ok(())
    }
}
