//! The backend trait: every numeric operation of the model goes through it.
//!
//! Conventions: tensors are contiguous and row-major; activations are `[tokens, features]`
//! matrices in the backend's compute dtype; linear weights use the Hugging Face layout
//! `[out_features, in_features]`; index tensors (token ids, positions, KV-cache slots) are `U32`.

use std::sync::Arc;

use half::{bf16, f16};

use crate::engine::error::Result;
use crate::engine::sampling::{Sampled, SamplingParams};
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
    /// Makes a weight tensor from mapped bytes of `dtype`; zero-copy where the backend can.
    fn upload_weight(
        &self,
        src: MappedBytes,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor<Self>>;
    /// Copies a floating-point tensor to the host as f32.
    fn to_host_f32(&self, t: &Tensor<Self>) -> Result<Vec<f32>>;
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
}
