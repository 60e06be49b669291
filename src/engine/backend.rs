//! The backend trait: every numeric operation of the model goes through it.
//!
//! Conventions: tensors are contiguous and row-major; activations are `[tokens, features]`
//! matrices in the backend's compute dtype; linear weights use the Hugging Face layout
//! `[out_features, in_features]`; index tensors (token ids, positions, KV-cache slots) are `U32`.

use std::sync::Arc;

use half::{bf16, f16};

use crate::engine::error::EngineError;
use crate::engine::error::Result;
use crate::engine::sampling::{MaskedSample, Sampled, SamplingParams};
use crate::engine::{DType, Tensor};

/// Host data handed to a backend for upload.
#[derive(Clone, Copy, Debug)]
pub enum HostData<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values.
    BF16(&'a [bf16]),
    /// f16 values.
    F16(&'a [f16]),
    /// u32 values (indices).
    U32(&'a [u32]),
}

impl HostData<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(x) => x.len(),
            HostData::BF16(x) => x.len(),
            HostData::F16(x) => x.len(),
            HostData::U32(x) => x.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::BF16(_) => DType::BF16,
            HostData::F16(_) => DType::F16,
            HostData::U32(_) => DType::U32,
        }
    }
}

/// Raw little-endian bytes of a weight tensor, borrowed from a memory map so that a backend that
/// can use them in place (the CPU with f32 weights) does not copy them.
#[derive(Clone, Debug)]
pub struct MappedBytes {
    /// The mapped file.
    pub map: Arc<memmap2::Mmap>,
    /// First byte of the tensor.
    pub start: usize,
    /// One past the last byte of the tensor.
    pub end: usize,
}

impl MappedBytes {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

/// Head layout of an attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// Softmax scale, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

/// Where a sequence's first cached positions live when its prompt is kept once for several
/// sequences: positions `0..len` of the sequence are read from slot `slot` of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedPrefix {
    /// The slot that holds the prompt's keys and values.
    pub slot: u32,
    /// Positions read from that slot.
    pub len: u32,
}

/// Hyper-parameters of one AdamW update (PyTorch semantics: decoupled weight decay, bias
/// correction of both moments).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWParams {
    /// Learning rate of this step.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// The 1-based step number (for bias correction).
    pub step: u64,
}

/// Target id that marks a row the token-loss operations skip (zero log-prob, entropy and gradient).
pub const IGNORE_TARGET: u32 = u32::MAX;

/// A compute backend. Implementations own tensor storage and run every numeric operation.
pub trait Backend: Clone + Send + Sync + Sized + 'static {
    /// Storage of one tensor.
    type Storage: Send + Sync;

    /// A human-readable name (`cpu`, `cuda:0 (NVIDIA H200)`).
    fn name(&self) -> String;

    // ---- memory ----

    /// A tensor of zeros.
    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor<Self>>;
    /// Copies host data into a new tensor of the given shape (the dtype may be widened to the
    /// backend's compute dtype for floating-point data).
    fn upload(&self, data: HostData<'_>, shape: &[usize]) -> Result<Tensor<Self>>;
    /// Copies f32 host data into a new f32 tensor, never narrowed to the compute dtype (optimizer
    /// state: moments and master weights restored from a checkpoint). The default is
    /// [`Backend::upload`], right for backends that compute in f32.
    fn upload_f32_exact(&self, x: &[f32], shape: &[usize]) -> Result<Tensor<Self>> {
        self.upload(HostData::F32(x), shape)
    }
    /// Makes a weight tensor from mapped bytes of `dtype`; zero-copy where the backend can.
    fn upload_weight(
        &self,
        src: MappedBytes,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor<Self>>;
    /// Copies a floating-point tensor to the host as f32.
    fn to_host_f32(&self, t: &Tensor<Self>) -> Result<Vec<f32>>;
    /// The values of a floating-point tensor as f32 on the host: borrowed where the backend keeps
    /// them there (no copy, e.g. for streaming a checkpoint), otherwise copied.
    fn host_f32<'a>(&self, t: &'a Tensor<Self>) -> Result<std::borrow::Cow<'a, [f32]>> {
        Ok(std::borrow::Cow::Owned(self.to_host_f32(t)?))
    }
    /// Makes a weight used in place from a memory map owned memory and releases its mapped pages,
    /// so that a trained weight is not resident twice (map and copy); a no-op where weights are
    /// owned already.
    fn own_weight(&self, _t: &mut Tensor<Self>) -> Result<()> {
        Ok(())
    }
    /// Copies an index tensor to the host.
    fn to_host_u32(&self, t: &Tensor<Self>) -> Result<Vec<u32>>;
    /// A deep copy.
    fn copy(&self, t: &Tensor<Self>) -> Result<Tensor<Self>>;

    // ---- transformer forward ----

    /// Rows of `table` `[V, D]` selected by `ids` `[T]`: `[T, D]`. Ids out of range are an error.
    fn embedding(&self, table: &Tensor<Self>, ids: &Tensor<Self>) -> Result<Tensor<Self>>;
    /// RMSNorm over the last dimension: `x / sqrt(mean(x^2) + eps) * weight`.
    fn rms_norm(&self, x: &Tensor<Self>, weight: &Tensor<Self>, eps: f32) -> Result<Tensor<Self>>;
    /// `x [T, K] @ w [N, K]^T (+ bias [N])`: `[T, N]`.
    fn linear(
        &self,
        x: &Tensor<Self>,
        w: &Tensor<Self>,
        bias: Option<&Tensor<Self>>,
    ) -> Result<Tensor<Self>>;
    /// Two projections of the same input, [`Backend::linear`] with `(w1, b1)` and with `(w2, b2)`.
    /// A backend may run the two at once; the default runs them in turn.
    fn linear_pair(
        &self,
        x: &Tensor<Self>,
        (w1, b1): (&Tensor<Self>, Option<&Tensor<Self>>),
        (w2, b2): (&Tensor<Self>, Option<&Tensor<Self>>),
    ) -> Result<(Tensor<Self>, Tensor<Self>)> {
        Ok((self.linear(x, w1, b1)?, self.linear(x, w2, b2)?))
    }
    /// `dst += src`, same shapes.
    fn add_assign(&self, dst: &mut Tensor<Self>, src: &Tensor<Self>) -> Result<()>;
    /// `silu(gate) * up`, same shapes.
    fn swiglu(&self, gate: &Tensor<Self>, up: &Tensor<Self>) -> Result<Tensor<Self>>;
    /// Rotary embedding in place on `x [T, heads * head_dim]` at `positions [T]`, in the
    /// half-split layout of Hugging Face Llama/Qwen2 (`rotate_half`).
    fn rope(
        &self,
        x: &mut Tensor<Self>,
        positions: &Tensor<Self>,
        head_dim: usize,
        theta: f32,
    ) -> Result<()>;
    /// Writes rows of `src [T, F]` into `cache [slots, max_seq, F]` at `(slots[t], positions[t])`.
    fn kv_write(
        &self,
        cache: &mut Tensor<Self>,
        src: &Tensor<Self>,
        slots: &Tensor<Self>,
        positions: &Tensor<Self>,
    ) -> Result<()>;
    /// Attention of queries `q [T, n_heads * head_dim]` over a KV cache: token `t` attends to the
    /// cached positions `0..=positions[t]` of slot `slots[t]` (causal prefill and batched decode
    /// alike). Returns `[T, n_heads * head_dim]`.
    fn attention(
        &self,
        q: &Tensor<Self>,
        k_cache: &Tensor<Self>,
        v_cache: &Tensor<Self>,
        slots: &Tensor<Self>,
        positions: &Tensor<Self>,
        shape: AttentionShape,
    ) -> Result<Tensor<Self>>;
    /// Whether [`Backend::attention_shared`] is implemented.
    fn shares_prefixes(&self) -> bool {
        false
    }
    /// [`Backend::attention`] where row `t` with `prefix[t] = Some(p)` reads its positions
    /// `0..p.len` from slot `p.slot` and the rest from its own slot (one host-side entry per row).
    /// Only backends whose [`Backend::shares_prefixes`] is true implement it.
    #[allow(clippy::too_many_arguments)]
    fn attention_shared(
        &self,
        q: &Tensor<Self>,
        k_cache: &Tensor<Self>,
        v_cache: &Tensor<Self>,
        slots: &Tensor<Self>,
        positions: &Tensor<Self>,
        prefix: &[Option<SharedPrefix>],
        shape: AttentionShape,
    ) -> Result<Tensor<Self>> {
        let _ = (q, k_cache, v_cache, slots, positions, prefix, shape);
        Err(EngineError::Device(
            "attention over shared prompt prefixes is not implemented by this backend".into(),
        ))
    }
    /// Rows of `x [T, D]` selected by `rows [R]`: `[R, D]`.
    fn gather_rows(&self, x: &Tensor<Self>, rows: &Tensor<Self>) -> Result<Tensor<Self>>;

    // ---- heads ----

    /// Log-softmax over the last dimension of `logits [R, V]`.
    fn log_softmax(&self, logits: &Tensor<Self>) -> Result<Tensor<Self>>;
    /// Samples one token per row of `logits [B, V]` with per-row parameters; `counters[b]` is the
    /// number of tokens row `b`'s sequence has sampled before (the random stream position).
    fn sample(
        &self,
        logits: &Tensor<Self>,
        params: &[SamplingParams],
        counters: &[u64],
    ) -> Result<Vec<Sampled>>;

    /// [`Backend::sample`] with an optional allowed-token bitset per row (`masks[b]`: bit `i % 32`
    /// of word `i / 32` allows token `i`; `None`: the row is unconstrained). Masked rows sample
    /// only allowed, finite logits and also return the allowed set's log-mass; `None` where a
    /// mask allows no finite logit. The default downloads the logits and samples on the host
    /// ([`crate::engine::sampling::sample_rows_masked`]); a device backend samples in place.
    fn sample_masked(
        &self,
        logits: &Tensor<Self>,
        params: &[SamplingParams],
        counters: &[u64],
        masks: &[Option<&[u32]>],
    ) -> Result<Vec<Option<MaskedSample>>> {
        let (b, v) = logits.dims2("sample_masked")?;
        if params.len() != b || counters.len() != b || masks.len() != b {
            return Err(EngineError::Shape {
                op: "sample_masked",
                detail: format!(
                    "{b} rows but {} parameter sets, {} counters and {} masks",
                    params.len(),
                    counters.len(),
                    masks.len()
                ),
            });
        }
        let host = self.to_host_f32(logits)?;
        Ok(crate::engine::sampling::sample_rows_masked(
            &host, v, params, counters, masks,
        ))
    }

    /// Per row of `logits [c, V]`: the log-probability of `targets[r]` and the entropy of the
    /// distribution restricted to the allowed set `masks[r]` (bitsets as in
    /// [`Backend::sample_masked`]). The default computes on the host
    /// ([`crate::engine::restricted`]); a device backend keeps the logits on the device.
    fn masked_logprobs(
        &self,
        logits: &Tensor<Self>,
        masks: &[&[u32]],
        targets: &[u32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (c, v) = logits.dims2("masked_logprobs")?;
        crate::engine::restricted::check_rows("masked_logprobs", (c, v), masks, targets, None)?;
        let host = self.to_host_f32(logits)?;
        Ok(host
            .chunks_exact(v.max(1))
            .zip(masks.iter().zip(targets))
            .map(|(row, (m, &t))| crate::engine::restricted::row_logprob(row, m, t))
            .unzip())
    }
    /// `dL/dlogits [c, V]` (the logits' dtype) of [`Backend::masked_logprobs`] for
    /// `dL/dlogp = g[r]` and `dL/dentropy = g_ent[r]`: 0 outside each row's allowed set.
    fn masked_dlogits(
        &self,
        logits: &Tensor<Self>,
        masks: &[&[u32]],
        targets: &[u32],
        g: &[f32],
        g_ent: &[f32],
    ) -> Result<Tensor<Self>> {
        let (c, v) = logits.dims2("masked_dlogits")?;
        crate::engine::restricted::check_rows(
            "masked_dlogits",
            (c, v),
            masks,
            targets,
            Some((g, g_ent)),
        )?;
        let host = self.to_host_f32(logits)?;
        let mut dl = vec![0.0f32; c * v];
        for (r, (row, dst)) in host
            .chunks_exact(v.max(1))
            .zip(dl.chunks_exact_mut(v.max(1)))
            .enumerate()
        {
            crate::engine::restricted::row_dlogits(row, masks[r], targets[r], g[r], g_ent[r], dst);
        }
        self.upload(HostData::F32(&dl), &[c, v])
    }

    // ---- training ----

    /// `c [m, n] (+)= op(a) @ op(b)` where `op` transposes when asked (`a` is `[m, k]` or, with
    /// `trans_a`, `[k, m]`; `b` is `[k, n]` or, with `trans_b`, `[n, k]`). Accumulates into `c`
    /// when `accumulate`, else overwrites it.
    fn matmul(
        &self,
        a: &Tensor<Self>,
        trans_a: bool,
        b: &Tensor<Self>,
        trans_b: bool,
        c: &mut Tensor<Self>,
        accumulate: bool,
    ) -> Result<()>;
    /// Both products of the backward of `y = x W^T`: `dx += dy W` and, when `dw` is given,
    /// `dw += dy^T x`. A backend may run the two at once; the default runs them in turn.
    fn linear_backward(
        &self,
        x: &Tensor<Self>,
        w: &Tensor<Self>,
        dy: &Tensor<Self>,
        dx: &mut Tensor<Self>,
        dw: Option<&mut Tensor<Self>>,
    ) -> Result<()> {
        self.matmul(dy, false, w, false, dx, true)?;
        if let Some(dw) = dw {
            self.matmul(dy, true, x, false, dw, true)?;
        }
        Ok(())
    }
    /// Column sums of `x [T, N]` into `out [N]` (bias gradients), accumulating when asked.
    fn sum_rows(&self, x: &Tensor<Self>, out: &mut Tensor<Self>, accumulate: bool) -> Result<()>;
    /// Backward of [`Backend::rms_norm`]: returns `dx [T, D]` and adds the weight gradient to
    /// `dweight [D]` when given (a frozen weight needs none).
    fn rms_norm_backward(
        &self,
        x: &Tensor<Self>,
        weight: &Tensor<Self>,
        dy: &Tensor<Self>,
        eps: f32,
        dweight: Option<&mut Tensor<Self>>,
    ) -> Result<Tensor<Self>>;
    /// Backward of [`Backend::rope`] in place: rotates `dx` by the negative angles.
    fn rope_backward(
        &self,
        dx: &mut Tensor<Self>,
        positions: &Tensor<Self>,
        head_dim: usize,
        theta: f32,
    ) -> Result<()>;
    /// Causal attention over packed variable-length sequences: sequence `s` occupies rows
    /// `cu_seqlens[s]..cu_seqlens[s+1]` of `q [T, H*hd]`, `k`, `v [T, Hkv*hd]`, and each row
    /// attends to the rows of its sequence up to itself. Returns the output `[T, H*hd]` and the
    /// log-sum-exp of every (row, head) softmax `[T, H]`, which the backward needs.
    fn attention_train(
        &self,
        q: &Tensor<Self>,
        k: &Tensor<Self>,
        v: &Tensor<Self>,
        cu_seqlens: &Tensor<Self>,
        shape: AttentionShape,
    ) -> Result<(Tensor<Self>, Tensor<Self>)>;
    /// Backward of [`Backend::attention_train`]: `(dq, dk, dv)` from the forward's inputs,
    /// output, log-sum-exp and the output gradient `dout`.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        q: &Tensor<Self>,
        k: &Tensor<Self>,
        v: &Tensor<Self>,
        out: &Tensor<Self>,
        lse: &Tensor<Self>,
        dout: &Tensor<Self>,
        cu_seqlens: &Tensor<Self>,
        shape: AttentionShape,
    ) -> Result<(Tensor<Self>, Tensor<Self>, Tensor<Self>)>;
    /// Backward of [`Backend::swiglu`]: `(dgate, dup)`.
    fn swiglu_backward(
        &self,
        gate: &Tensor<Self>,
        up: &Tensor<Self>,
        dout: &Tensor<Self>,
    ) -> Result<(Tensor<Self>, Tensor<Self>)>;
    /// Backward of [`Backend::embedding`]: adds row `t` of `dx [T, D]` to row `ids[t]` of
    /// `dtable [V, D]`.
    fn embedding_backward(
        &self,
        dtable: &mut Tensor<Self>,
        ids: &Tensor<Self>,
        dx: &Tensor<Self>,
    ) -> Result<()>;
    /// Per-token log-probability of `targets [T]` and entropy of the next-token distribution,
    /// from hidden states `h [T, D]` and the LM head `[V, D]`, computed `chunk_rows` rows at a
    /// time so that at most `[chunk_rows, V]` logits exist at once. Rows whose target is
    /// [`IGNORE_TARGET`] are skipped (0 and 0). Returns `(logp [T], entropy [T])`.
    fn token_logprobs(
        &self,
        h: &Tensor<Self>,
        head: &Tensor<Self>,
        targets: &Tensor<Self>,
        chunk_rows: usize,
    ) -> Result<(Tensor<Self>, Tensor<Self>)>;
    /// Backward of [`Backend::token_logprobs`] for a loss with `dL/dlogp = g_logp [T]` and
    /// `dL/dentropy = g_entropy [T]`: returns `dh [T, D]` and adds the head gradient to
    /// `dhead [V, D]` when given. Logits are recomputed chunk by chunk.
    #[allow(clippy::too_many_arguments)]
    fn token_logprobs_backward(
        &self,
        h: &Tensor<Self>,
        head: &Tensor<Self>,
        targets: &Tensor<Self>,
        g_logp: &Tensor<Self>,
        g_entropy: &Tensor<Self>,
        chunk_rows: usize,
        dhead: Option<&mut Tensor<Self>>,
    ) -> Result<Tensor<Self>>;
    /// Sets every element of `x` to `value`.
    fn fill(&self, x: &mut Tensor<Self>, value: f32) -> Result<()>;
    /// `x *= s`.
    fn scale(&self, x: &mut Tensor<Self>, s: f32) -> Result<()>;
    /// `y += a * x`, same shapes.
    fn axpy(&self, y: &mut Tensor<Self>, a: f32, x: &Tensor<Self>) -> Result<()>;
    /// The sum of squares of the elements (accumulated in f64, deterministic order).
    fn sum_squares(&self, x: &Tensor<Self>) -> Result<f64>;
    /// The sum of squares of every element of every tensor (a global gradient norm), as the sum
    /// of [`Backend::sum_squares`] of each in order; a GPU does it with one transfer.
    fn sum_squares_all(&self, xs: &[&Tensor<Self>]) -> Result<f64> {
        let mut ss = 0.0;
        for x in xs {
            ss += self.sum_squares(x)?;
        }
        Ok(ss)
    }
    /// One AdamW update of `param` from `grad` with moments `m`, `v` (all the same shape).
    fn adamw_step(
        &self,
        param: &mut Tensor<Self>,
        grad: &Tensor<Self>,
        m: &mut Tensor<Self>,
        v: &mut Tensor<Self>,
        hp: AdamWParams,
    ) -> Result<()>;
    /// An f32 master copy of a trained weight stored in a narrower dtype (bf16 on a GPU), for
    /// [`Backend::adamw_step_master`]; `None` where the weight is f32 already (the default).
    fn master_copy(&self, _param: &Tensor<Self>) -> Result<Option<Tensor<Self>>> {
        Ok(None)
    }
    /// One AdamW update applied to the f32 `master` copy of `param` (so that updates below the
    /// resolution of `param`'s dtype accumulate), after which `param` is `master` in its own
    /// dtype. The default updates `master` with [`Backend::adamw_step`] and re-uploads it.
    fn adamw_step_master(
        &self,
        param: &mut Tensor<Self>,
        master: &mut Tensor<Self>,
        grad: &Tensor<Self>,
        m: &mut Tensor<Self>,
        v: &mut Tensor<Self>,
        hp: AdamWParams,
    ) -> Result<()> {
        self.adamw_step(master, grad, m, v, hp)?;
        let host = self.to_host_f32(master)?;
        *param = self.upload(HostData::F32(&host), param.shape())?;
        Ok(())
    }
}
