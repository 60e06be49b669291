//! `impl Backend for Cuda`: memory operations here, everything else delegated to the op modules.

use half::{bf16, f16};

use super::{attention, display_name, loss, ops, restrict, sampling, Cuda, CudaStorage};
use crate::engine::backend::{AdamWParams, AttentionShape, Backend, HostData, MappedBytes};
use crate::engine::cpu::bytes_to_f32;
use crate::engine::error::{EngineError, Result};
use crate::engine::sampling::{MaskedSample, Sampled, SamplingParams};
use crate::engine::{DType, Tensor};

fn check_len(len: usize, shape: &[usize]) -> Result<()> {
    let n: usize = shape.iter().product();
    if n != len {
        return Err(EngineError::HostData(format!(
            "{len} elements do not fill shape {shape:?} ({n} elements)"
        )));
    }
    Ok(())
}

impl Cuda {
    /// Uploads f32 values in the compute dtype.
    fn upload_f32s(&self, x: &[f32], shape: &[usize]) -> Result<Tensor<Self>> {
        match self.dtype() {
            DType::BF16 => {
                let v: Vec<bf16> = x.iter().map(|&f| bf16::from_f32(f)).collect();
                self.upload_bytes(bytemuck::cast_slice(&v), shape, DType::BF16)
            }
            _ => self.upload_bytes(bytemuck::cast_slice(x), shape, DType::F32),
        }
    }
}

impl Backend for Cuda {
    type Storage = CudaStorage;

    fn name(&self) -> String {
        display_name(self.inner.ordinal, &self.inner.gpu_name)
    }

    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor<Self>> {
        let dt = if dtype == DType::F16 {
            self.dtype()
        } else {
            dtype
        };
        self.alloc(shape, dt, true)
    }

    fn upload(&self, data: HostData<'_>, shape: &[usize]) -> Result<Tensor<Self>> {
        check_len(data.len(), shape)?;
        match data {
            HostData::F32(x) => self.upload_f32s(x, shape),
            HostData::BF16(x) if self.dtype() == DType::BF16 => {
                self.upload_bytes(bytemuck::cast_slice(x), shape, DType::BF16)
            }
            HostData::BF16(x) => {
                let v: Vec<f32> = x.iter().map(|b| b.to_f32()).collect();
                self.upload_f32s(&v, shape)
            }
            HostData::F16(x) => {
                let v: Vec<f32> = x.iter().map(|h: &f16| h.to_f32()).collect();
                self.upload_f32s(&v, shape)
            }
            HostData::U32(x) => self.upload_index(x, shape),
        }
    }

    fn upload_f32_exact(&self, x: &[f32], shape: &[usize]) -> Result<Tensor<Self>> {
        check_len(x.len(), shape)?;
        self.upload_bytes(bytemuck::cast_slice(x), shape, DType::F32)
    }

    fn upload_weight(
        &self,
        src: MappedBytes,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor<Self>> {
        let bytes = src.bytes();
        if dtype == DType::U32 || bytes.len() % dtype.size() != 0 {
            return Err(EngineError::HostData(format!(
                "weight of {} bytes is not a whole number of {dtype} elements",
                bytes.len()
            )));
        }
        check_len(bytes.len() / dtype.size(), shape)?;
        if dtype == self.dtype() && cfg!(target_endian = "little") {
            return self.upload_bytes(bytes, shape, dtype);
        }
        self.upload_f32s(&bytes_to_f32(bytes, dtype)?, shape)
    }

    fn to_host_f32(&self, t: &Tensor<Self>) -> Result<Vec<f32>> {
        let b = self.download_bytes(t)?;
        match t.dtype() {
            DType::F32 => Ok(bytes_to_f32(&b, DType::F32)?),
            DType::BF16 => Ok(bytes_to_f32(&b, DType::BF16)?),
            dtype => Err(EngineError::DType {
                op: "to_host_f32",
                dtype,
            }),
        }
    }

    fn to_host_u32(&self, t: &Tensor<Self>) -> Result<Vec<u32>> {
        ops::host_u32(self, t, "to_host_u32")
    }

    fn copy(&self, t: &Tensor<Self>) -> Result<Tensor<Self>> {
        let data = self
            .stream()
            .clone_dtod(&t.storage().data)
            .map_err(|e| EngineError::Device(format!("device copy: {e:?}")))?;
        Ok(Tensor::from_parts(
            CudaStorage {
                data,
                dtype: t.dtype(),
                host_index: t.storage().host_index.clone(),
            },
            t.shape().to_vec(),
            t.dtype(),
        ))
    }

    fn embedding(&self, table: &Tensor<Self>, ids: &Tensor<Self>) -> Result<Tensor<Self>> {
        ops::embedding(self, "embedding", table, ids)
    }

    fn rms_norm(&self, x: &Tensor<Self>, weight: &Tensor<Self>, eps: f32) -> Result<Tensor<Self>> {
        ops::rms_norm(self, x, weight, eps)
    }

    fn linear(
        &self,
        x: &Tensor<Self>,
        w: &Tensor<Self>,
        bias: Option<&Tensor<Self>>,
    ) -> Result<Tensor<Self>> {
        ops::linear(self, x, w, bias)
    }

    fn add_assign(&self, dst: &mut Tensor<Self>, src: &Tensor<Self>) -> Result<()> {
        ops::add_assign(self, dst, src)
    }

    fn swiglu(&self, gate: &Tensor<Self>, up: &Tensor<Self>) -> Result<Tensor<Self>> {
        ops::swiglu(self, gate, up)
    }

    fn rope(
        &self,
        x: &mut Tensor<Self>,
        positions: &Tensor<Self>,
        head_dim: usize,
        theta: f32,
    ) -> Result<()> {
        ops::rope(self, "rope", x, positions, head_dim, theta, 1.0)
    }

    fn kv_write(
        &self,
        cache: &mut Tensor<Self>,
        src: &Tensor<Self>,
        slots: &Tensor<Self>,
        positions: &Tensor<Self>,
    ) -> Result<()> {
        ops::kv_write(self, cache, src, slots, positions)
    }

    fn attention(
        &self,
        q: &Tensor<Self>,
        k_cache: &Tensor<Self>,
        v_cache: &Tensor<Self>,
        slots: &Tensor<Self>,
        positions: &Tensor<Self>,
        shape: AttentionShape,
    ) -> Result<Tensor<Self>> {
        attention::attention(self, q, k_cache, v_cache, slots, positions, shape)
    }

    fn gather_rows(&self, x: &Tensor<Self>, rows: &Tensor<Self>) -> Result<Tensor<Self>> {
        ops::embedding(self, "gather_rows", x, rows)
    }

    fn log_softmax(&self, logits: &Tensor<Self>) -> Result<Tensor<Self>> {
        loss::log_softmax(self, logits)
    }

    fn sample(
        &self,
        logits: &Tensor<Self>,
        params: &[SamplingParams],
        counters: &[u64],
    ) -> Result<Vec<Sampled>> {
        sampling::sample(self, logits, params, counters)
    }

    fn sample_masked(
        &self,
        logits: &Tensor<Self>,
        params: &[SamplingParams],
        counters: &[u64],
        masks: &[Option<&[u32]>],
    ) -> Result<Vec<Option<MaskedSample>>> {
        sampling::sample_masked(self, logits, params, counters, masks)
    }

    fn masked_logprobs(
        &self,
        logits: &Tensor<Self>,
        masks: &[&[u32]],
        targets: &[u32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        restrict::masked_logprobs(self, logits, masks, targets)
    }

    fn masked_dlogits(
        &self,
        logits: &Tensor<Self>,
        masks: &[&[u32]],
        targets: &[u32],
        g: &[f32],
        g_ent: &[f32],
    ) -> Result<Tensor<Self>> {
        restrict::masked_dlogits(self, logits, masks, targets, g, g_ent)
    }

    fn matmul(
        &self,
        a: &Tensor<Self>,
        trans_a: bool,
        b: &Tensor<Self>,
        trans_b: bool,
        c: &mut Tensor<Self>,
        accumulate: bool,
    ) -> Result<()> {
        ops::matmul(self, a, trans_a, b, trans_b, c, accumulate)
    }

    fn sum_rows(&self, x: &Tensor<Self>, out: &mut Tensor<Self>, accumulate: bool) -> Result<()> {
        ops::sum_rows(self, x, out, accumulate)
    }

    fn rms_norm_backward(
        &self,
        x: &Tensor<Self>,
        weight: &Tensor<Self>,
        dy: &Tensor<Self>,
        eps: f32,
        dweight: Option<&mut Tensor<Self>>,
    ) -> Result<Tensor<Self>> {
        ops::rms_norm_backward(self, x, weight, dy, eps, dweight)
    }

    fn rope_backward(
        &self,
        dx: &mut Tensor<Self>,
        positions: &Tensor<Self>,
        head_dim: usize,
        theta: f32,
    ) -> Result<()> {
        ops::rope(self, "rope_backward", dx, positions, head_dim, theta, -1.0)
    }

    fn attention_train(
        &self,
        q: &Tensor<Self>,
        k: &Tensor<Self>,
        v: &Tensor<Self>,
        cu_seqlens: &Tensor<Self>,
        shape: AttentionShape,
    ) -> Result<(Tensor<Self>, Tensor<Self>)> {
        attention::attention_train(self, q, k, v, cu_seqlens, shape)
    }

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
    ) -> Result<(Tensor<Self>, Tensor<Self>, Tensor<Self>)> {
        attention::attention_backward(self, q, k, v, out, lse, dout, cu_seqlens, shape)
    }

    fn swiglu_backward(
        &self,
        gate: &Tensor<Self>,
        up: &Tensor<Self>,
        dout: &Tensor<Self>,
    ) -> Result<(Tensor<Self>, Tensor<Self>)> {
        ops::swiglu_backward(self, gate, up, dout)
    }

    fn embedding_backward(
        &self,
        dtable: &mut Tensor<Self>,
        ids: &Tensor<Self>,
        dx: &Tensor<Self>,
    ) -> Result<()> {
        if dtable.dtype() == DType::BF16 {
            // A bf16 table: the hidden-state gradient of bf16 compute, into which the restricted
            // rows of constrained decoding are scattered. Accumulate in f32, round once.
            if let Some(mut acc) = self.cast(dtable, DType::F32)? {
                ops::embedding_backward(self, &mut acc, ids, dx)?;
                if let Some(back) = self.cast(&acc, DType::BF16)? {
                    *dtable = back;
                }
                return Ok(());
            }
        }
        ops::embedding_backward(self, dtable, ids, dx)
    }

    fn token_logprobs(
        &self,
        h: &Tensor<Self>,
        head: &Tensor<Self>,
        targets: &Tensor<Self>,
        chunk_rows: usize,
    ) -> Result<(Tensor<Self>, Tensor<Self>)> {
        loss::token_logprobs(self, h, head, targets, chunk_rows)
    }

    fn token_logprobs_backward(
        &self,
        h: &Tensor<Self>,
        head: &Tensor<Self>,
        targets: &Tensor<Self>,
        g_logp: &Tensor<Self>,
        g_entropy: &Tensor<Self>,
        chunk_rows: usize,
        dhead: Option<&mut Tensor<Self>>,
    ) -> Result<Tensor<Self>> {
        loss::token_logprobs_backward(self, h, head, targets, g_logp, g_entropy, chunk_rows, dhead)
    }

    fn fill(&self, x: &mut Tensor<Self>, value: f32) -> Result<()> {
        ops::fill(self, x, value)
    }

    fn scale(&self, x: &mut Tensor<Self>, s: f32) -> Result<()> {
        ops::scale(self, x, s)
    }

    fn axpy(&self, y: &mut Tensor<Self>, a: f32, x: &Tensor<Self>) -> Result<()> {
        ops::axpy(self, y, a, x)
    }

    fn sum_squares(&self, x: &Tensor<Self>) -> Result<f64> {
        ops::sum_squares(self, x)
    }

    fn sum_squares_all(&self, xs: &[&Tensor<Self>]) -> Result<f64> {
        ops::sum_squares_all(self, xs)
    }

    fn master_copy(&self, param: &Tensor<Self>) -> Result<Option<Tensor<Self>>> {
        ops::master_copy(self, param)
    }

    fn adamw_step_master(
        &self,
        param: &mut Tensor<Self>,
        master: &mut Tensor<Self>,
        grad: &Tensor<Self>,
        m: &mut Tensor<Self>,
        v: &mut Tensor<Self>,
        hp: AdamWParams,
    ) -> Result<()> {
        ops::adamw_step_master(self, param, master, grad, m, v, hp)
    }

    fn adamw_step(
        &self,
        param: &mut Tensor<Self>,
        grad: &Tensor<Self>,
        m: &mut Tensor<Self>,
        v: &mut Tensor<Self>,
        hp: AdamWParams,
    ) -> Result<()> {
        ops::adamw_step(self, param, grad, m, v, hp)
    }
}
