//! Row-major GEMM `C = alpha * op(A) op(B) + beta * C` through cuBLAS (bf16 or f32 inputs, f32
//! accumulation, `cublasGemmEx`), or through the built-in tiled kernel when libcublas is absent.

use cudarc::cublas::sys;

use super::{Arg, Cuda};
use crate::engine::error::{EngineError, Result};
use crate::engine::DType;

/// One GEMM operand: a device address, its dtype, whether it is used transposed, and its row
/// stride (elements between consecutive stored rows).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operand {
    pub ptr: u64,
    pub dtype: DType,
    pub trans: bool,
    pub ld: usize,
}

fn cuda_type(d: DType) -> Result<sys::cudaDataType> {
    match d {
        DType::F32 => Ok(sys::cudaDataType::CUDA_R_32F),
        DType::BF16 => Ok(sys::cudaDataType::CUDA_R_16BF),
        dtype => Err(EngineError::DType { op: "gemm", dtype }),
    }
}

fn to_i32(x: usize) -> Result<i32> {
    i32::try_from(x).map_err(|_| EngineError::Shape {
        op: "gemm",
        detail: format!("dimension {x} exceeds the 32-bit GEMM interface"),
    })
}

/// `C [m, n] = alpha * op(A) [m, k] @ op(B) [k, n] + beta * C`; A and B share a dtype; C is the
/// same dtype or f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    be: &Cuda,
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
    c: Operand,
    alpha: f32,
    beta: f32,
) -> Result<()> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if a.dtype != b.dtype || !(c.dtype == a.dtype || c.dtype == DType::F32) {
        return Err(EngineError::Shape {
            op: "gemm",
            detail: format!("operand dtypes {} x {} -> {}", a.dtype, b.dtype, c.dtype),
        });
    }
    if k == 0 {
        // Nothing to multiply: C = beta * C.
        return super::ops::scale_raw(be, c.ptr, c.dtype, m * n, beta);
    }
    if let Some(blas) = be.cublas() {
        let blas = blas
            .lock()
            .map_err(|_| EngineError::Device("cuBLAS handle lock poisoned".into()))?;
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
        // SAFETY: pointers are live device buffers sized by the callers for these shapes.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                op(b.trans),
                op(a.trans),
                to_i32(n)?,
                to_i32(m)?,
                to_i32(k)?,
                (&alpha) as *const f32 as *const _,
                b.ptr as *const _,
                cuda_type(b.dtype)?,
                to_i32(b.ld)?,
                a.ptr as *const _,
                cuda_type(a.dtype)?,
                to_i32(a.ld)?,
                (&beta) as *const f32 as *const _,
                c.ptr as *mut _,
                cuda_type(c.dtype)?,
                to_i32(c.ld)?,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        }
        .map_err(|e| EngineError::Device(format!("cublasGemmEx {m}x{n}x{k}: {e:?}")))?;
        return Ok(());
    }
    let name = match (a.dtype, c.dtype) {
        (DType::F32, DType::F32) => "gemm_f32_f32",
        (DType::BF16, DType::BF16) => "gemm_bf16_bf16",
        (DType::BF16, DType::F32) => "gemm_bf16_f32",
        (_, dtype) => return Err(EngineError::DType { op: "gemm", dtype }),
    };
    let grid_y = u32::try_from(m.div_ceil(64))
        .ok()
        .filter(|&g| g <= 65_535)
        .ok_or_else(|| EngineError::Shape {
            op: "gemm",
            detail: format!("{m} rows exceed the built-in GEMM's grid"),
        })?;
    be.launch(
        name,
        (n.div_ceil(64) as u32, grid_y),
        256,
        &[
            Arg::P(a.ptr),
            Arg::P(b.ptr),
            Arg::P(c.ptr),
            Arg::U(m as u32),
            Arg::U(n as u32),
            Arg::U(k as u32),
            Arg::U(a.ld as u32),
            Arg::U(b.ld as u32),
            Arg::U(c.ld as u32),
            Arg::I(a.trans as i32),
            Arg::I(b.trans as i32),
            Arg::F(alpha),
            Arg::F(beta),
        ],
    )
}
