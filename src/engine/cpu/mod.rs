//! The CPU backend: f32 compute, multi-threaded with rayon, GEMMs through the `gemm` crate.
//! It is the reference every other backend is checked against.

mod attention;
mod attn_train;
mod grad;
pub mod heap;
mod kv_rows;
pub mod matmul;
mod ops;
mod prefix_attn;
pub mod simd;
mod vexp;

use std::sync::Arc;

use half::{bf16, f16};

use crate::engine::backend::{AdamWParams, AttentionShape, HostData, MappedBytes, SharedPrefix};
use crate::engine::error::{EngineError, Result};
use crate::engine::sampling::{sample_row, Sampled, SamplingParams};
use crate::engine::{Backend, DType, Tensor};

/// The CPU backend. Threads come from rayon's global pool (`--threads`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

/// Host storage of a CPU tensor.
pub enum CpuStorage {
    /// Owned f32 values.
    F32(Vec<f32>),
    /// Owned u32 values.
    U32(Vec<u32>),
    /// f32 values used in place from a memory-mapped file (zero-copy weights).
    Mapped(MappedBytes),
}

impl CpuStorage {
    /// The values as f32, if this is floating-point storage.
    pub fn f32(&self) -> Option<&[f32]> {
        match self {
            CpuStorage::F32(v) => Some(v),
            // Alignment and length were checked when the mapping was accepted.
            CpuStorage::Mapped(m) => Some(bytemuck::cast_slice(m.bytes())),
            CpuStorage::U32(_) => None,
        }
    }

    /// The values as mutable f32; mapped storage is copied into owned memory first.
    pub fn f32_mut(&mut self) -> Option<&mut [f32]> {
        if let CpuStorage::Mapped(m) = self {
            let owned: Vec<f32> = bytemuck::cast_slice(m.bytes()).to_vec();
            *self = CpuStorage::F32(owned);
        }
        match self {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The values as u32, if this is index storage.
    pub fn u32(&self) -> Option<&[u32]> {
        match self {
            CpuStorage::U32(v) => Some(v),
            _ => None,
        }
    }
}

/// The f32 values of a CPU tensor, or a dtype error naming `op`.
pub(crate) fn f32s<'a>(t: &'a Tensor<Cpu>, op: &'static str) -> Result<&'a [f32]> {
    t.storage().f32().ok_or(EngineError::DType {
        op,
        dtype: t.dtype(),
    })
}

/// The mutable f32 values of a CPU tensor, or a dtype error naming `op`.
pub(crate) fn f32s_mut<'a>(t: &'a mut Tensor<Cpu>, op: &'static str) -> Result<&'a mut [f32]> {
    let dtype = t.dtype();
    t.storage_mut()
        .f32_mut()
        .ok_or(EngineError::DType { op, dtype })
}

/// The u32 values of a CPU tensor, or a dtype error naming `op`.
pub(crate) fn u32s<'a>(t: &'a Tensor<Cpu>, op: &'static str) -> Result<&'a [u32]> {
    t.storage().u32().ok_or(EngineError::DType {
        op,
        dtype: t.dtype(),
    })
}

/// A new f32 CPU tensor.
pub(crate) fn tensor_f32(data: Vec<f32>, shape: &[usize]) -> Tensor<Cpu> {
    Tensor::from_parts(CpuStorage::F32(data), shape.to_vec(), DType::F32)
}

fn check_len(len: usize, shape: &[usize]) -> Result<()> {
    let n: usize = shape.iter().product();
    if n != len {
        return Err(EngineError::HostData(format!(
            "{len} elements do not fill shape {shape:?} ({n} elements)"
        )));
    }
    Ok(())
}

/// Decodes little-endian bytes of `dtype` into f32.
pub fn bytes_to_f32(bytes: &[u8], dtype: DType) -> Result<Vec<f32>> {
    if bytes.len() % dtype.size() != 0 {
        return Err(EngineError::HostData(format!(
            "{} bytes is not a whole number of {dtype} elements",
            bytes.len()
        )));
    }
    let v = match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::U32 => {
            return Err(EngineError::DType {
                op: "weight",
                dtype,
            })
        }
    };
    Ok(v)
}

impl Backend for Cpu {
    type Storage = CpuStorage;

    fn name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Tensor<Self>> {
        let n = shape.iter().product();
        let storage = match dtype {
            DType::U32 => CpuStorage::U32(vec![0; n]),
            _ => CpuStorage::F32(vec![0.0; n]),
        };
        let dt = if dtype == DType::U32 {
            DType::U32
        } else {
            DType::F32
        };
        Ok(Tensor::from_parts(storage, shape.to_vec(), dt))
    }

    fn upload(&self, data: HostData<'_>, shape: &[usize]) -> Result<Tensor<Self>> {
        check_len(data.len(), shape)?;
        Ok(match data {
            HostData::F32(x) => tensor_f32(x.to_vec(), shape),
            HostData::BF16(x) => tensor_f32(x.iter().map(|v| v.to_f32()).collect(), shape),
            HostData::F16(x) => tensor_f32(x.iter().map(|v| v.to_f32()).collect(), shape),
            HostData::U32(x) => {
                Tensor::from_parts(CpuStorage::U32(x.to_vec()), shape.to_vec(), DType::U32)
            }
        })
    }

    fn upload_weight(
        &self,
        src: MappedBytes,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Tensor<Self>> {
        let bytes = src.bytes();
        check_len(bytes.len() / dtype.size().max(1), shape)?;
        if bytes.len() % dtype.size() != 0 {
            return Err(EngineError::HostData("weight byte length".into()));
        }
        let little_endian = cfg!(target_endian = "little");
        if dtype == DType::F32 && little_endian && bytes.as_ptr().align_offset(4) == 0 {
            return Ok(Tensor::from_parts(
                CpuStorage::Mapped(src),
                shape.to_vec(),
                DType::F32,
            ));
        }
        Ok(tensor_f32(bytes_to_f32(bytes, dtype)?, shape))
    }

    fn to_host_f32(&self, t: &Tensor<Self>) -> Result<Vec<f32>> {
        Ok(f32s(t, "to_host_f32")?.to_vec())
    }

    fn host_f32<'a>(&self, t: &'a Tensor<Self>) -> Result<std::borrow::Cow<'a, [f32]>> {
        Ok(std::borrow::Cow::Borrowed(f32s(t, "host_f32")?))
    }

    fn own_weight(&self, t: &mut Tensor<Self>) -> Result<()> {
        let CpuStorage::Mapped(m) = t.storage() else {
            return Ok(());
        };
        let (map, start, len) = (Arc::clone(&m.map), m.start, m.end - m.start);
        f32s_mut(t, "own_weight")?;
        // SAFETY: the map is a read-only shared mapping of a file; dropping its pages only makes a
        // later read fault them in again from the file with the same contents.
        let _ =
            unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
        Ok(())
    }

    fn to_host_u32(&self, t: &Tensor<Self>) -> Result<Vec<u32>> {
        Ok(u32s(t, "to_host_u32")?.to_vec())
    }

    fn copy(&self, t: &Tensor<Self>) -> Result<Tensor<Self>> {
        let storage = match t.storage() {
            CpuStorage::F32(v) => CpuStorage::F32(v.clone()),
            CpuStorage::U32(v) => CpuStorage::U32(v.clone()),
            CpuStorage::Mapped(m) => CpuStorage::Mapped(MappedBytes {
                map: Arc::clone(&m.map),
                start: m.start,
                end: m.end,
            }),
        };
        Ok(Tensor::from_parts(storage, t.shape().to_vec(), t.dtype()))
    }

    fn embedding(&self, table: &Tensor<Self>, ids: &Tensor<Self>) -> Result<Tensor<Self>> {
        ops::embedding(table, ids)
    }

    fn rms_norm(&self, x: &Tensor<Self>, weight: &Tensor<Self>, eps: f32) -> Result<Tensor<Self>> {
        ops::rms_norm(x, weight, eps)
    }

    fn linear(
        &self,
        x: &Tensor<Self>,
        w: &Tensor<Self>,
        bias: Option<&Tensor<Self>>,
    ) -> Result<Tensor<Self>> {
        matmul::linear(x, w, bias)
    }

    fn linear_pair(
        &self,
        x: &Tensor<Self>,
        p1: (&Tensor<Self>, Option<&Tensor<Self>>),
        p2: (&Tensor<Self>, Option<&Tensor<Self>>),
    ) -> Result<(Tensor<Self>, Tensor<Self>)> {
        matmul::linear_pair(x, p1, p2)
    }

    fn add_assign(&self, dst: &mut Tensor<Self>, src: &Tensor<Self>) -> Result<()> {
        ops::add_assign(dst, src)
    }

    fn swiglu(&self, gate: &Tensor<Self>, up: &Tensor<Self>) -> Result<Tensor<Self>> {
        ops::swiglu(gate, up)
    }

    fn rope(
        &self,
        x: &mut Tensor<Self>,
        positions: &Tensor<Self>,
        head_dim: usize,
        theta: f32,
    ) -> Result<()> {
        ops::rope(x, positions, head_dim, theta)
    }

    fn kv_write(
        &self,
        cache: &mut Tensor<Self>,
        src: &Tensor<Self>,
        slots: &Tensor<Self>,
        positions: &Tensor<Self>,
    ) -> Result<()> {
        attention::kv_write(cache, src, slots, positions)
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
        attention::attention(q, k_cache, v_cache, slots, positions, shape)
    }

    fn shares_prefixes(&self) -> bool {
        true
    }

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
        attention::attention_shared(q, k_cache, v_cache, slots, positions, prefix, shape)
    }

    fn gather_rows(&self, x: &Tensor<Self>, rows: &Tensor<Self>) -> Result<Tensor<Self>> {
        ops::embedding(x, rows)
    }

    fn log_softmax(&self, logits: &Tensor<Self>) -> Result<Tensor<Self>> {
        ops::log_softmax(logits)
    }

    fn sample(
        &self,
        logits: &Tensor<Self>,
        params: &[SamplingParams],
        counters: &[u64],
    ) -> Result<Vec<Sampled>> {
        use rayon::prelude::*;
        let (b, v) = logits.dims2("sample")?;
        if params.len() != b || counters.len() != b {
            return Err(EngineError::Shape {
                op: "sample",
                detail: format!(
                    "{b} rows but {} parameter sets and {} counters",
                    params.len(),
                    counters.len()
                ),
            });
        }
        let x = f32s(logits, "sample")?;
        Ok(x.par_chunks(v.max(1))
            .zip(params.par_iter().zip(counters.par_iter()))
            .map(|(row, (p, &c))| sample_row(row, p, c))
            .collect())
    }

    // ---- training ----

    fn matmul(
        &self,
        a: &Tensor<Self>,
        trans_a: bool,
        b: &Tensor<Self>,
        trans_b: bool,
        c: &mut Tensor<Self>,
        accumulate: bool,
    ) -> Result<()> {
        grad::matmul(a, trans_a, b, trans_b, c, accumulate)
    }

    fn linear_backward(
        &self,
        x: &Tensor<Self>,
        w: &Tensor<Self>,
        dy: &Tensor<Self>,
        dx: &mut Tensor<Self>,
        dw: Option<&mut Tensor<Self>>,
    ) -> Result<()> {
        grad::linear_backward(x, w, dy, dx, dw)
    }

    fn sum_rows(&self, x: &Tensor<Self>, out: &mut Tensor<Self>, accumulate: bool) -> Result<()> {
        grad::sum_rows(x, out, accumulate)
    }

    fn rms_norm_backward(
        &self,
        x: &Tensor<Self>,
        weight: &Tensor<Self>,
        dy: &Tensor<Self>,
        eps: f32,
        dweight: Option<&mut Tensor<Self>>,
    ) -> Result<Tensor<Self>> {
        grad::rms_norm_backward(x, weight, dy, eps, dweight)
    }

    fn rope_backward(
        &self,
        dx: &mut Tensor<Self>,
        positions: &Tensor<Self>,
        head_dim: usize,
        theta: f32,
    ) -> Result<()> {
        grad::rope_backward(dx, positions, head_dim, theta)
    }

    fn attention_train(
        &self,
        q: &Tensor<Self>,
        k: &Tensor<Self>,
        v: &Tensor<Self>,
        cu_seqlens: &Tensor<Self>,
        shape: AttentionShape,
    ) -> Result<(Tensor<Self>, Tensor<Self>)> {
        grad::attention_train(q, k, v, cu_seqlens, shape)
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
        grad::attention_backward(q, k, v, out, lse, dout, cu_seqlens, shape)
    }

    fn swiglu_backward(
        &self,
        gate: &Tensor<Self>,
        up: &Tensor<Self>,
        dout: &Tensor<Self>,
    ) -> Result<(Tensor<Self>, Tensor<Self>)> {
        grad::swiglu_backward(gate, up, dout)
    }

    fn embedding_backward(
        &self,
        dtable: &mut Tensor<Self>,
        ids: &Tensor<Self>,
        dx: &Tensor<Self>,
    ) -> Result<()> {
        grad::embedding_backward(dtable, ids, dx)
    }

    fn token_logprobs(
        &self,
        h: &Tensor<Self>,
        head: &Tensor<Self>,
        targets: &Tensor<Self>,
        chunk_rows: usize,
    ) -> Result<(Tensor<Self>, Tensor<Self>)> {
        grad::token_logprobs(h, head, targets, chunk_rows)
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
        grad::token_logprobs_backward(h, head, targets, g_logp, g_entropy, chunk_rows, dhead)
    }

    fn fill(&self, x: &mut Tensor<Self>, value: f32) -> Result<()> {
        grad::fill(x, value)
    }

    fn scale(&self, x: &mut Tensor<Self>, s: f32) -> Result<()> {
        grad::scale(x, s)
    }

    fn axpy(&self, y: &mut Tensor<Self>, a: f32, x: &Tensor<Self>) -> Result<()> {
        grad::axpy(y, a, x)
    }

    fn sum_squares(&self, x: &Tensor<Self>) -> Result<f64> {
        grad::sum_squares(x)
    }

    fn adamw_step(
        &self,
        param: &mut Tensor<Self>,
        grad: &Tensor<Self>,
        m: &mut Tensor<Self>,
        v: &mut Tensor<Self>,
        hp: AdamWParams,
    ) -> Result<()> {
        grad::adamw_step(param, grad, m, v, hp)
    }
}
