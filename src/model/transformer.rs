//! The decoder-only transformer of the Qwen2 and Llama families: forward with a KV cache.

use std::path::Path;

use crate::engine::backend::AttentionShape;
use crate::engine::{Backend, HostData, Tensor};
use crate::model::adapter::Adapters;
use crate::model::config::ModelConfig;
use crate::model::error::{ModelError, Result};
use crate::model::kv_cache::KvCache;
use crate::model::weights::WeightFiles;
use crate::train::lora::LoraTarget as T;

/// Weights of one transformer block.
pub struct Block<B: Backend> {
    /// RMSNorm before attention.
    pub input_norm: Tensor<B>,
    /// Query projection `[heads*hd, d]`.
    pub q: Tensor<B>,
    /// Key projection `[kv_heads*hd, d]`.
    pub k: Tensor<B>,
    /// Value projection `[kv_heads*hd, d]`.
    pub v: Tensor<B>,
    /// Query bias.
    pub q_bias: Option<Tensor<B>>,
    /// Key bias.
    pub k_bias: Option<Tensor<B>>,
    /// Value bias.
    pub v_bias: Option<Tensor<B>>,
    /// Output projection `[d, heads*hd]`.
    pub o: Tensor<B>,
    /// Output bias (Llama with `attention_bias`).
    pub o_bias: Option<Tensor<B>>,
    /// RMSNorm before the MLP.
    pub post_norm: Tensor<B>,
    /// MLP gate `[i, d]`.
    pub gate: Tensor<B>,
    /// MLP up `[i, d]`.
    pub up: Tensor<B>,
    /// MLP down `[d, i]`.
    pub down: Tensor<B>,
}

/// A source of named weight tensors of an expected shape (see [`Model::from_loader`]).
pub type TensorLoader<'a, B> = dyn FnMut(&str, &[usize]) -> Result<Tensor<B>> + 'a;

/// A loaded model on a backend.
pub struct Model<B: Backend> {
    /// The configuration.
    pub config: ModelConfig,
    /// The backend holding the weights.
    pub backend: B,
    /// Token embedding `[vocab, d]`.
    pub embed: Tensor<B>,
    /// The blocks.
    pub blocks: Vec<Block<B>>,
    /// Final RMSNorm.
    pub norm: Tensor<B>,
    /// LM head `[vocab, d]`; `None` when tied to the embedding.
    pub lm_head: Option<Tensor<B>>,
}

/// The tokens of one forward step: token `i` is `ids[i]` at `positions[i]` of cache slot
/// `slots[i]`; logits are computed for the rows listed in `logit_rows`.
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    /// Token ids.
    pub ids: &'a [u32],
    /// Cache slot of each token.
    pub slots: &'a [u32],
    /// Position of each token in its sequence.
    pub positions: &'a [u32],
    /// Rows whose logits are wanted.
    pub logit_rows: &'a [u32],
}

impl<B: Backend> Model<B> {
    /// Loads `config.json` and the safetensors weights of a model directory.
    pub fn load(backend: &B, dir: &Path) -> Result<Self> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let files = WeightFiles::open(dir)?;
        Self::from_weights(backend, config, &files)
    }

    /// Builds the model from opened weight files.
    pub fn from_weights(backend: &B, config: ModelConfig, w: &WeightFiles) -> Result<Self> {
        Self::from_loader(backend, config, &mut |name, shape| {
            w.load(backend, name, shape)
        })
    }

    /// Builds the model from a loader that returns each named tensor of the expected shape
    /// (weight files, or random weights for measurements at a real size).
    pub fn from_loader(
        backend: &B,
        config: ModelConfig,
        load: &mut TensorLoader<'_, B>,
    ) -> Result<Self> {
        let c = &config;
        let (d, hd) = (c.hidden_size, c.head_dim);
        let (q, kv, i) = (c.num_heads * hd, c.num_kv_heads * hd, c.intermediate_size);
        let mut blocks = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let p = format!("model.layers.{l}");
            let qkv_bias = c.qkv_bias;
            let mut bias = |name: &str, n: usize| -> Result<Option<Tensor<B>>> {
                if qkv_bias {
                    Ok(Some(load(&format!("{p}.self_attn.{name}.bias"), &[n])?))
                } else {
                    Ok(None)
                }
            };
            let (q_bias, k_bias, v_bias) =
                (bias("q_proj", q)?, bias("k_proj", kv)?, bias("v_proj", kv)?);
            blocks.push(Block {
                input_norm: load(&format!("{p}.input_layernorm.weight"), &[d])?,
                q: load(&format!("{p}.self_attn.q_proj.weight"), &[q, d])?,
                k: load(&format!("{p}.self_attn.k_proj.weight"), &[kv, d])?,
                v: load(&format!("{p}.self_attn.v_proj.weight"), &[kv, d])?,
                q_bias,
                k_bias,
                v_bias,
                o: load(&format!("{p}.self_attn.o_proj.weight"), &[d, q])?,
                o_bias: if c.o_bias {
                    Some(load(&format!("{p}.self_attn.o_proj.bias"), &[d])?)
                } else {
                    None
                },
                post_norm: load(&format!("{p}.post_attention_layernorm.weight"), &[d])?,
                gate: load(&format!("{p}.mlp.gate_proj.weight"), &[i, d])?,
                up: load(&format!("{p}.mlp.up_proj.weight"), &[i, d])?,
                down: load(&format!("{p}.mlp.down_proj.weight"), &[d, i])?,
            });
        }
        let embed = load("model.embed_tokens.weight", &[c.vocab_size, d])?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(load("lm_head.weight", &[c.vocab_size, d])?)
        };
        let norm = load("model.norm.weight", &[d])?;
        Ok(Self {
            config,
            backend: backend.clone(),
            embed,
            blocks,
            norm,
            lm_head,
        })
    }

    /// The LM head matrix (the embedding when tied).
    pub fn head(&self) -> &Tensor<B> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// The attention layout of this model.
    pub fn attention_shape(&self) -> AttentionShape {
        let c = &self.config;
        AttentionShape {
            n_heads: c.num_heads,
            n_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        }
    }

    fn check_step(&self, cache: &KvCache<B>, s: &Step<'_>) -> Result<()> {
        let n = s.ids.len();
        if s.slots.len() != n || s.positions.len() != n {
            return Err(ModelError::Input(format!(
                "step has {n} ids, {} slots and {} positions",
                s.slots.len(),
                s.positions.len()
            )));
        }
        if let Some(&bad) = s
            .ids
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(ModelError::Input(format!(
                "token id {bad} is out of range for a vocabulary of {}",
                self.config.vocab_size
            )));
        }
        if let Some(&bad) = s.positions.iter().find(|&&p| p as usize >= cache.max_seq) {
            return Err(ModelError::Input(format!(
                "position {bad} exceeds the cache length {}",
                cache.max_seq
            )));
        }
        if let Some(&bad) = s.slots.iter().find(|&&x| x as usize >= cache.slots) {
            return Err(ModelError::Input(format!(
                "slot {bad} exceeds the cache's {} slots",
                cache.slots
            )));
        }
        if let Some(&bad) = s.logit_rows.iter().find(|&&r| r as usize >= n) {
            return Err(ModelError::Input(format!(
                "logit row {bad} of a {n}-token step"
            )));
        }
        Ok(())
    }

    /// Runs one step through the model, writing keys and values into `cache`; returns the logits
    /// `[logit_rows.len(), vocab]`.
    pub fn forward(&self, cache: &mut KvCache<B>, s: &Step<'_>) -> Result<Tensor<B>> {
        self.forward_adapted(cache, s, Adapters::off())
    }

    /// [`Model::forward`] with LoRA adapters applied on the fly (the base weights untouched);
    /// `Adapters::off()` is the base model.
    pub fn forward_adapted(
        &self,
        cache: &mut KvCache<B>,
        s: &Step<'_>,
        ad: Adapters<'_, B>,
    ) -> Result<Tensor<B>> {
        self.check_step(cache, s)?;
        let b = &self.backend;
        let c = &self.config;
        let n = s.ids.len();
        let ids = b.upload(HostData::U32(s.ids), &[n])?;
        let slots = b.upload(HostData::U32(s.slots), &[n])?;
        let pos = b.upload(HostData::U32(s.positions), &[n])?;
        let rows = b.upload(HostData::U32(s.logit_rows), &[s.logit_rows.len()])?;
        let shape = self.attention_shape();
        // Rows whose slot reads its prompt from another slot (generation shares prompts).
        let prefix: Option<Vec<_>> = cache.shared.iter().any(Option::is_some).then(|| {
            s.slots
                .iter()
                .map(|&x| cache.shared.get(x as usize).copied().flatten())
                .collect()
        });
        let mut x = b.embedding(&self.embed, &ids)?;
        for (l, blk) in self.blocks.iter().enumerate() {
            let h = b.rms_norm(&x, &blk.input_norm, c.rms_norm_eps)?;
            let mut q = ad.linear(b, &h, &blk.q, blk.q_bias.as_ref(), l, T::Q)?;
            let mut k = ad.linear(b, &h, &blk.k, blk.k_bias.as_ref(), l, T::K)?;
            let v = ad.linear(b, &h, &blk.v, blk.v_bias.as_ref(), l, T::V)?;
            b.rope(&mut q, &pos, c.head_dim, c.rope_theta)?;
            b.rope(&mut k, &pos, c.head_dim, c.rope_theta)?;
            b.kv_write(&mut cache.k[l], &k, &slots, &pos)?;
            b.kv_write(&mut cache.v[l], &v, &slots, &pos)?;
            let (kc, vc) = (&cache.k[l], &cache.v[l]);
            let a = match &prefix {
                Some(p) => b.attention_shared(&q, kc, vc, &slots, &pos, p, shape)?,
                None => b.attention(&q, kc, vc, &slots, &pos, shape)?,
            };
            let o = ad.linear(b, &a, &blk.o, blk.o_bias.as_ref(), l, T::O)?;
            b.add_assign(&mut x, &o)?;
            let h = b.rms_norm(&x, &blk.post_norm, c.rms_norm_eps)?;
            let g = ad.linear(b, &h, &blk.gate, None, l, T::Gate)?;
            let u = ad.linear(b, &h, &blk.up, None, l, T::Up)?;
            let m = b.swiglu(&g, &u)?;
            let dn = ad.linear(b, &m, &blk.down, None, l, T::Down)?;
            b.add_assign(&mut x, &dn)?;
        }
        let last = b.gather_rows(&x, &rows)?;
        let h = b.rms_norm(&last, &self.norm, c.rms_norm_eps)?;
        Ok(b.linear(&h, self.head(), None)?)
    }

    /// Log-probabilities of a token sequence: `out[i] = log p(ids[i] | ids[..i])` for `i >= 1`,
    /// and the full log-softmax rows `[n-1, vocab]` for the positions that predict them.
    pub fn score(&self, ids: &[u32]) -> Result<(Vec<f32>, Tensor<B>)> {
        let n = ids.len();
        if n < 2 {
            return Err(ModelError::Input(
                "scoring needs at least two tokens".into(),
            ));
        }
        if n > self.config.max_position_embeddings {
            return Err(ModelError::Input(format!(
                "{n} tokens exceed max_position_embeddings {}",
                self.config.max_position_embeddings
            )));
        }
        let mut cache = KvCache::new(&self.backend, &self.config, 1, n)?;
        let slots = vec![0u32; n];
        let positions: Vec<u32> = (0..n as u32).collect();
        let rows: Vec<u32> = (0..n as u32 - 1).collect();
        let logits = self.forward(
            &mut cache,
            &Step {
                ids,
                slots: &slots,
                positions: &positions,
                logit_rows: &rows,
            },
        )?;
        let lsm = self.backend.log_softmax(&logits)?;
        let host = self.backend.to_host_f32(&lsm)?;
        let v = self.config.vocab_size;
        let lps = (1..n)
            .map(|i| host[(i - 1) * v + ids[i] as usize])
            .collect();
        Ok((lps, lsm))
    }
}
