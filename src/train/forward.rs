//! The training forward: the same transformer as `model::transformer`, run over packed
//! sequences with causal attention inside each sequence, keeping what backward needs in named
//! structs (or only each block's input, when blocks are recomputed).

use crate::engine::backend::IGNORE_TARGET;
use crate::engine::{Backend, HostData, Tensor};
use crate::model::constraint::TokenSet;
use crate::model::transformer::{Block, Model};
use crate::train::error::{Result, TrainError};
use crate::train::lora::{Adapter, Lora, LoraTarget};
use crate::train::restrict::Restricted;

/// One training sequence: token ids, a mask of the tokens to predict, and a loss weight.
#[derive(Clone, Debug, PartialEq)]
pub struct Sequence {
    /// Token ids.
    pub ids: Vec<u32>,
    /// 1 where the token is predicted (trained on), 0 elsewhere.
    pub mask: Vec<u8>,
    /// Weight of this sequence's tokens in the loss.
    pub weight: f32,
}

/// Packed sequences on the host: rows `cu_seqlens[s]..cu_seqlens[s+1]` are sequence `s`.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Token ids `[T]`.
    pub ids: Vec<u32>,
    /// Position of each row in its sequence.
    pub positions: Vec<u32>,
    /// Sequence boundaries `[S+1]`.
    pub cu_seqlens: Vec<u32>,
    /// The token row `t` predicts, or [`IGNORE_TARGET`].
    pub targets: Vec<u32>,
    /// Loss weight of row `t` (0 where ignored).
    pub weights: Vec<f32>,
    /// Rows whose distribution is restricted to an allowed set ([`Batch::restrict`]).
    pub restricted: Vec<(usize, TokenSet)>,
}

impl Batch {
    /// Packs sequences: row `i` of a sequence predicts token `i+1` when `mask[i+1]` is set.
    pub fn pack(seqs: &[Sequence]) -> Result<Self> {
        let mut b = Batch {
            ids: Vec::new(),
            positions: Vec::new(),
            cu_seqlens: vec![0],
            targets: Vec::new(),
            weights: Vec::new(),
            restricted: Vec::new(),
        };
        for (n, s) in seqs.iter().enumerate() {
            if s.mask.len() != s.ids.len() {
                return Err(TrainError::Input(format!(
                    "sequence {n}: {} ids but {} mask entries",
                    s.ids.len(),
                    s.mask.len()
                )));
            }
            let len = s.ids.len();
            for i in 0..len {
                b.ids.push(s.ids[i]);
                b.positions.push(i as u32);
                let trained = i + 1 < len && s.mask[i + 1] != 0;
                b.targets
                    .push(if trained { s.ids[i + 1] } else { IGNORE_TARGET });
                b.weights.push(if trained { s.weight } else { 0.0 });
            }
            b.cu_seqlens.push(b.ids.len() as u32);
        }
        Ok(b)
    }

    /// Rows.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Restricts the distribution predicting token `token` of sequence `seq` to `set`: its
    /// log-probability (and gradient) become those of the model renormalised on the set, the
    /// distribution constrained decoding sampled it from ([`crate::train::restrict`]). A token
    /// without a target (masked out) is left alone.
    pub fn restrict(&mut self, seq: usize, token: usize, set: TokenSet) -> Result<()> {
        let (a, z) = match (self.cu_seqlens.get(seq), self.cu_seqlens.get(seq + 1)) {
            (Some(&a), Some(&z)) => (a as usize, z as usize),
            _ => {
                return Err(TrainError::Input(format!(
                    "restrict: no sequence {seq} in a batch of {}",
                    self.cu_seqlens.len().saturating_sub(1)
                )))
            }
        };
        if token == 0 || a + token >= z {
            return Err(TrainError::Input(format!(
                "restrict: sequence {seq} has no predicted token {token}"
            )));
        }
        let row = a + token - 1;
        if self.targets[row] != IGNORE_TARGET {
            self.restricted.push((row, set));
        }
        Ok(())
    }

    /// Rows with a target.
    pub fn trained_tokens(&self) -> usize {
        self.targets.iter().filter(|&&t| t != IGNORE_TARGET).count()
    }
}

/// Options of the training forward.
#[derive(Clone, Copy, Debug)]
pub struct ForwardOptions {
    /// Keep only each block's input and recompute the block in backward (bounds memory).
    pub recompute: bool,
    /// Rows of logits computed at once by the token loss.
    pub chunk_rows: usize,
    /// Sampling temperature of the modelled distribution: log-probabilities and entropies are
    /// those of `softmax(logits / temperature)` (RL rollouts sampled at a temperature below 1 stay
    /// on-policy). 1 for plain training.
    pub temperature: f32,
}

impl Default for ForwardOptions {
    fn default() -> Self {
        Self {
            recompute: false,
            chunk_rows: 256,
            temperature: 1.0,
        }
    }
}

/// The batch on the backend.
pub struct DeviceBatch<B: Backend> {
    /// Token ids `[T]`.
    pub ids: Tensor<B>,
    /// Positions `[T]`.
    pub positions: Tensor<B>,
    /// Sequence boundaries `[S+1]`.
    pub cu_seqlens: Tensor<B>,
    /// Targets `[T]`.
    pub targets: Tensor<B>,
}

impl<B: Backend> DeviceBatch<B> {
    /// Uploads a host batch.
    pub fn upload(backend: &B, b: &Batch) -> Result<Self> {
        let t = b.len();
        Ok(Self {
            ids: backend.upload(HostData::U32(&b.ids), &[t])?,
            positions: backend.upload(HostData::U32(&b.positions), &[t])?,
            cu_seqlens: backend.upload(HostData::U32(&b.cu_seqlens), &[b.cu_seqlens.len()])?,
            targets: backend.upload(HostData::U32(&b.targets), &[t])?,
        })
    }
}

/// Activations of one block that backward needs.
pub struct BlockActs<B: Backend> {
    /// Block input (residual stream) `[T, D]`.
    pub x_in: Tensor<B>,
    /// After the attention residual `[T, D]`.
    pub x_mid: Tensor<B>,
    /// Normed input of attention `[T, D]`.
    pub h1: Tensor<B>,
    /// Queries after RoPE.
    pub q: Tensor<B>,
    /// Keys after RoPE.
    pub k: Tensor<B>,
    /// Values.
    pub v: Tensor<B>,
    /// Attention output (before o_proj).
    pub att: Tensor<B>,
    /// Softmax log-sum-exp `[T, H]`.
    pub lse: Tensor<B>,
    /// Normed input of the MLP.
    pub h2: Tensor<B>,
    /// Gate projection.
    pub g: Tensor<B>,
    /// Up projection.
    pub u: Tensor<B>,
    /// `silu(g) * u`.
    pub m: Tensor<B>,
}

/// What a block keeps: everything, or only its input (recomputed in backward).
pub enum Saved<B: Backend> {
    /// All activations.
    Full(Box<BlockActs<B>>),
    /// The block input only.
    Input(Tensor<B>),
}

/// The result of a training forward.
pub struct Forward<B: Backend> {
    /// The batch on the backend.
    pub batch: DeviceBatch<B>,
    /// Per-block saved activations.
    pub blocks: Vec<Saved<B>>,
    /// Residual stream after the last block `[T, D]`.
    pub x_final: Tensor<B>,
    /// After the final norm `[T, D]`.
    pub h_final: Tensor<B>,
    /// Per-row log-probability of the target (0 where ignored) `[T]`.
    pub logp: Tensor<B>,
    /// Per-row entropy of the next-token distribution (0 where ignored; on restricted rows the
    /// restricted distribution's) `[T]`.
    pub entropy: Tensor<B>,
    /// The options used.
    pub opts: ForwardOptions,
    /// The batch's restricted rows (their `logp` is the restricted log-probability).
    pub restricted: Option<Restricted>,
    /// `(row, entropy)` of the restricted rows' renormalised distributions (also written into
    /// `entropy`, whose gradient on those rows is the restricted one's).
    pub restricted_entropy: Vec<(u32, f32)>,
}

impl<B: Backend> Forward<B> {
    /// Bytes of the activations this forward keeps for backward (f32 elements).
    pub fn saved_bytes(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|s| match s {
                Saved::Input(x) => x.numel(),
                Saved::Full(a) => [
                    &a.x_in, &a.x_mid, &a.h1, &a.q, &a.k, &a.v, &a.att, &a.lse, &a.h2, &a.g, &a.u,
                    &a.m,
                ]
                .iter()
                .map(|t| t.numel())
                .sum(),
            })
            .sum();
        4 * (blocks + self.x_final.numel() + self.h_final.numel() + 2 * self.logp.numel())
    }
}

/// The head's input for logits divided by `temperature` (`logits / T = (h / T) head^T`): a scaled
/// copy of `h`, or `None` at temperature 1 (use `h` itself).
pub(crate) fn tempered<B: Backend>(
    be: &B,
    h: &Tensor<B>,
    temperature: f32,
) -> Result<Option<Tensor<B>>> {
    if temperature == 1.0 {
        return Ok(None);
    }
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err(TrainError::Input(format!(
            "training temperature must be positive and finite, got {temperature}"
        )));
    }
    let mut t = be.copy(h)?;
    be.scale(&mut t, 1.0 / temperature)?;
    Ok(Some(t))
}

/// `x W^T (+ b) + s (x A^T) B^T`.
pub(crate) fn project<B: Backend>(
    be: &B,
    x: &Tensor<B>,
    w: &Tensor<B>,
    bias: Option<&Tensor<B>>,
    ad: Option<&Adapter<B>>,
    s: f32,
) -> Result<Tensor<B>> {
    let mut y = be.linear(x, w, bias)?;
    if let Some(ad) = ad {
        let u = be.linear(x, &ad.a, None)?;
        let z = be.linear(&u, &ad.b, None)?;
        be.axpy(&mut y, s, &z)?;
    }
    Ok(y)
}

/// Runs one block; returns its output and activations.
pub(crate) fn block_forward<B: Backend>(
    model: &Model<B>,
    lora: Option<&Lora<B>>,
    l: usize,
    x_in: Tensor<B>,
    batch: &DeviceBatch<B>,
) -> Result<(Tensor<B>, BlockActs<B>)> {
    let be = &model.backend;
    let c = &model.config;
    let blk: &Block<B> = &model.blocks[l];
    let ad = |t: LoraTarget| lora.and_then(|lo| lo.adapter(l, t));
    let s = lora.map(|lo| lo.scale()).unwrap_or(0.0);
    let h1 = be.rms_norm(&x_in, &blk.input_norm, c.rms_norm_eps)?;
    let mut q = project(be, &h1, &blk.q, blk.q_bias.as_ref(), ad(LoraTarget::Q), s)?;
    let (mut k, v) = match (ad(LoraTarget::K), ad(LoraTarget::V)) {
        (None, None) => be.linear_pair(
            &h1,
            (&blk.k, blk.k_bias.as_ref()),
            (&blk.v, blk.v_bias.as_ref()),
        )?,
        _ => (
            project(be, &h1, &blk.k, blk.k_bias.as_ref(), ad(LoraTarget::K), s)?,
            project(be, &h1, &blk.v, blk.v_bias.as_ref(), ad(LoraTarget::V), s)?,
        ),
    };
    be.rope(&mut q, &batch.positions, c.head_dim, c.rope_theta)?;
    be.rope(&mut k, &batch.positions, c.head_dim, c.rope_theta)?;
    let (att, lse) = be.attention_train(&q, &k, &v, &batch.cu_seqlens, model.attention_shape())?;
    let o = project(be, &att, &blk.o, blk.o_bias.as_ref(), ad(LoraTarget::O), s)?;
    let mut x = be.copy(&x_in)?;
    be.add_assign(&mut x, &o)?;
    let x_mid = be.copy(&x)?;
    let h2 = be.rms_norm(&x_mid, &blk.post_norm, c.rms_norm_eps)?;
    let (g, u) = match (ad(LoraTarget::Gate), ad(LoraTarget::Up)) {
        (None, None) => be.linear_pair(&h2, (&blk.gate, None), (&blk.up, None))?,
        (ag, au) => (
            project(be, &h2, &blk.gate, None, ag, s)?,
            project(be, &h2, &blk.up, None, au, s)?,
        ),
    };
    let m = be.swiglu(&g, &u)?;
    let dn = project(be, &m, &blk.down, None, ad(LoraTarget::Down), s)?;
    be.add_assign(&mut x, &dn)?;
    Ok((
        x,
        BlockActs {
            x_in,
            x_mid,
            h1,
            q,
            k,
            v,
            att,
            lse,
            h2,
            g,
            u,
            m,
        },
    ))
}

fn check_batch<B: Backend>(model: &Model<B>, b: &Batch) -> Result<()> {
    let c = &model.config;
    if b.is_empty() {
        return Err(TrainError::Input("empty batch".into()));
    }
    if let Some(&bad) = b.ids.iter().find(|&&t| t as usize >= c.vocab_size) {
        return Err(TrainError::Input(format!(
            "token id {bad} is out of range for a vocabulary of {}",
            c.vocab_size
        )));
    }
    if let Some(&bad) = b
        .positions
        .iter()
        .find(|&&p| p as usize >= c.max_position_embeddings)
    {
        return Err(TrainError::Input(format!(
            "position {bad} exceeds max_position_embeddings {}",
            c.max_position_embeddings
        )));
    }
    if b.targets.len() != b.len() || b.positions.len() != b.len() || b.weights.len() != b.len() {
        return Err(TrainError::Input("batch fields differ in length".into()));
    }
    Ok(())
}

/// The training forward over a packed batch, with optional LoRA adapters.
pub fn forward<B: Backend>(
    model: &Model<B>,
    lora: Option<&Lora<B>>,
    batch: &Batch,
    opts: ForwardOptions,
) -> Result<Forward<B>> {
    check_batch(model, batch)?;
    let be = &model.backend;
    let c = &model.config;
    let db = DeviceBatch::upload(be, batch)?;
    let mut x = be.embedding(&model.embed, &db.ids)?;
    let mut blocks = Vec::with_capacity(model.blocks.len());
    for l in 0..model.blocks.len() {
        let (y, acts) = block_forward(model, lora, l, x, &db)?;
        blocks.push(if opts.recompute {
            Saved::Input(acts.x_in)
        } else {
            Saved::Full(Box::new(acts))
        });
        x = y;
    }
    let h_final = be.rms_norm(&x, &model.norm, c.rms_norm_eps)?;
    let scaled = tempered(be, &h_final, opts.temperature)?;
    let hin = scaled.as_ref().unwrap_or(&h_final);
    let (mut logp, mut entropy) =
        be.token_logprobs(hin, model.head(), &db.targets, opts.chunk_rows)?;
    let mut restricted_entropy = Vec::new();
    let restricted = if batch.restricted.is_empty() {
        None
    } else {
        let mut r = Restricted::new(&batch.restricted, &batch.targets, model.head().shape()[0])?;
        let (lp, ent) = r.logprobs(be, hin, model.head())?;
        let mut host = be.to_host_f32(&logp)?;
        r.full_logp = r.rows.iter().map(|&row| host[row as usize]).collect();
        let mut host_ent = be.to_host_f32(&entropy)?;
        for ((&row, &v), &e) in r.rows.iter().zip(&lp).zip(&ent) {
            host[row as usize] = v;
            host_ent[row as usize] = e;
        }
        restricted_entropy = r.rows.iter().copied().zip(ent).collect();
        logp = be.upload(HostData::F32(&host), &[host.len()])?;
        entropy = be.upload(HostData::F32(&host_ent), &[host_ent.len()])?;
        Some(r)
    };
    drop(scaled);
    Ok(Forward {
        batch: db,
        blocks,
        x_final: x,
        h_final,
        logp,
        entropy,
        opts,
        restricted,
        restricted_entropy,
    })
}
