//! Element-wise, row-wise and GEMM-shaped operations of the CUDA backend: host-side shape and
//! index checks, dtype dispatch, launches.

use super::gemm::{gemm, Operand};
use super::launch::{grid_for, BLOCK};
use super::{Arg, Cuda};
use crate::engine::backend::AdamWParams;
use crate::engine::error::{EngineError, Result};
use crate::engine::{DType, Tensor};

pub(crate) fn shape_err(op: &'static str, detail: String) -> EngineError {
    EngineError::Shape { op, detail }
}

pub(crate) fn same_shape(op: &'static str, a: &Tensor<Cuda>, b: &Tensor<Cuda>) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(shape_err(op, format!("{:?} vs {:?}", a.shape(), b.shape())));
    }
    Ok(())
}

/// A tensor operand either borrowed as is or converted to another dtype.
pub(crate) enum Held<'a> {
    /// The caller's tensor.
    Borrowed(&'a Tensor<Cuda>),
    /// A converted copy.
    Owned(Tensor<Cuda>),
}

impl std::ops::Deref for Held<'_> {
    type Target = Tensor<Cuda>;
    fn deref(&self) -> &Tensor<Cuda> {
        match self {
            Held::Borrowed(t) => t,
            Held::Owned(t) => t,
        }
    }
}

/// `t` in `dtype`, converting when needed.
pub(crate) fn coerce<'a>(be: &Cuda, t: &'a Tensor<Cuda>, dtype: DType) -> Result<Held<'a>> {
    Ok(match be.cast(t, dtype)? {
        Some(c) => Held::Owned(c),
        None => Held::Borrowed(t),
    })
}

/// The floating dtype of `t`, or a dtype error.
pub(crate) fn float_dtype(op: &'static str, t: &Tensor<Cuda>) -> Result<DType> {
    Cuda::suffix(op, t.dtype()).map(|_| t.dtype())
}

/// Index values of a u32 tensor on the host (for validation and launch tables): the host copy
/// kept at upload when there is one (no device-to-host transfer), else a download.
pub(crate) fn host_u32(be: &Cuda, t: &Tensor<Cuda>, op: &'static str) -> Result<Vec<u32>> {
    if t.dtype() != DType::U32 {
        return Err(EngineError::DType {
            op,
            dtype: t.dtype(),
        });
    }
    if let Some(h) = &t.storage().host_index {
        if h.len() == t.numel() {
            return Ok(h.to_vec());
        }
    }
    let b = be.download_bytes(t)?;
    Ok(b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Checks every index is below `limit`.
pub(crate) fn check_below(op: &'static str, v: &[u32], limit: usize) -> Result<()> {
    match v.iter().find(|&&i| i as usize >= limit) {
        Some(&bad) => Err(EngineError::Index {
            op,
            index: bad as usize,
            limit,
        }),
        None => Ok(()),
    }
}

fn elementwise(be: &Cuda, name: &str, n: usize, args: &[Arg]) -> Result<()> {
    be.launch(name, (grid_for(n), 1), BLOCK, args)
}

/// `x *= s` over `n` elements at `ptr` (`s == 0` writes zeros, NaN included).
pub(crate) fn scale_raw(be: &Cuda, ptr: u64, dtype: DType, n: usize, s: f32) -> Result<()> {
    let sfx = Cuda::suffix("scale", dtype)?;
    if s == 0.0 {
        elementwise(
            be,
            &format!("fill_{sfx}"),
            n,
            &[Arg::P(ptr), Arg::L(n as u64), Arg::F(0.0)],
        )
    } else {
        elementwise(
            be,
            &format!("scale_{sfx}"),
            n,
            &[Arg::P(ptr), Arg::L(n as u64), Arg::F(s)],
        )
    }
}

pub(crate) fn fill(be: &Cuda, x: &mut Tensor<Cuda>, v: f32) -> Result<()> {
    let sfx = Cuda::suffix("fill", x.dtype())?;
    let n = x.numel();
    elementwise(
        be,
        &format!("fill_{sfx}"),
        n,
        &[Arg::P(be.ptr(x)), Arg::L(n as u64), Arg::F(v)],
    )
}

pub(crate) fn scale(be: &Cuda, x: &mut Tensor<Cuda>, s: f32) -> Result<()> {
    let sfx = Cuda::suffix("scale", x.dtype())?;
    let n = x.numel();
    elementwise(
        be,
        &format!("scale_{sfx}"),
        n,
        &[Arg::P(be.ptr(x)), Arg::L(n as u64), Arg::F(s)],
    )
}

pub(crate) fn axpy(be: &Cuda, y: &mut Tensor<Cuda>, a: f32, x: &Tensor<Cuda>) -> Result<()> {
    same_shape("axpy", y, x)?;
    let dt = float_dtype("axpy", y)?;
    let x = coerce(be, x, dt)?;
    let n = y.numel();
    elementwise(
        be,
        &format!("axpy_{}", Cuda::suffix("axpy", dt)?),
        n,
        &[
            Arg::P(be.ptr(y)),
            Arg::P(be.ptr(&x)),
            Arg::L(n as u64),
            Arg::F(a),
        ],
    )
}

pub(crate) fn add_assign(be: &Cuda, dst: &mut Tensor<Cuda>, src: &Tensor<Cuda>) -> Result<()> {
    same_shape("add_assign", dst, src)?;
    let dt = float_dtype("add_assign", dst)?;
    let src = coerce(be, src, dt)?;
    let n = dst.numel();
    elementwise(
        be,
        &format!("add_assign_{}", Cuda::suffix("add_assign", dt)?),
        n,
        &[Arg::P(be.ptr(dst)), Arg::P(be.ptr(&src)), Arg::L(n as u64)],
    )
}

pub(crate) fn swiglu(be: &Cuda, gate: &Tensor<Cuda>, up: &Tensor<Cuda>) -> Result<Tensor<Cuda>> {
    same_shape("swiglu", gate, up)?;
    let dt = float_dtype("swiglu", gate)?;
    let up = coerce(be, up, dt)?;
    let out = be.alloc(gate.shape(), dt, false)?;
    let n = gate.numel();
    elementwise(
        be,
        &format!("swiglu_{}", Cuda::suffix("swiglu", dt)?),
        n,
        &[
            Arg::P(be.ptr(&out)),
            Arg::P(be.ptr(gate)),
            Arg::P(be.ptr(&up)),
            Arg::L(n as u64),
        ],
    )?;
    Ok(out)
}

pub(crate) fn swiglu_backward(
    be: &Cuda,
    gate: &Tensor<Cuda>,
    up: &Tensor<Cuda>,
    dout: &Tensor<Cuda>,
) -> Result<(Tensor<Cuda>, Tensor<Cuda>)> {
    same_shape("swiglu_backward", gate, up)?;
    same_shape("swiglu_backward", gate, dout)?;
    let dt = float_dtype("swiglu_backward", gate)?;
    let up = coerce(be, up, dt)?;
    let dout = coerce(be, dout, dt)?;
    let dg = be.alloc(gate.shape(), dt, false)?;
    let du = be.alloc(gate.shape(), dt, false)?;
    let n = gate.numel();
    elementwise(
        be,
        &format!("swiglu_backward_{}", Cuda::suffix("swiglu_backward", dt)?),
        n,
        &[
            Arg::P(be.ptr(&dg)),
            Arg::P(be.ptr(&du)),
            Arg::P(be.ptr(gate)),
            Arg::P(be.ptr(&up)),
            Arg::P(be.ptr(&dout)),
            Arg::L(n as u64),
        ],
    )?;
    Ok((dg, du))
}

/// Rows of `table` selected by `ids` (embedding and gather_rows).
pub(crate) fn embedding(
    be: &Cuda,
    op: &'static str,
    table: &Tensor<Cuda>,
    ids: &Tensor<Cuda>,
) -> Result<Tensor<Cuda>> {
    let (v, d) = table.dims2(op)?;
    let t = ids.dims1(op)?;
    let dt = float_dtype(op, table)?;
    check_below(op, &host_u32(be, ids, op)?, v)?;
    let out = be.alloc(&[t, d], dt, false)?;
    elementwise(
        be,
        &format!("embedding_{}", Cuda::suffix(op, dt)?),
        t * d,
        &[
            Arg::P(be.ptr(&out)),
            Arg::P(be.ptr(table)),
            Arg::P(be.ptr(ids)),
            Arg::U(t as u32),
            Arg::U(d as u32),
        ],
    )?;
    Ok(out)
}

pub(crate) fn embedding_backward(
    be: &Cuda,
    dtable: &mut Tensor<Cuda>,
    ids: &Tensor<Cuda>,
    dx: &Tensor<Cuda>,
) -> Result<()> {
    let op = "embedding_backward";
    let (v, d) = dtable.dims2(op)?;
    let (t, d2) = dx.dims2(op)?;
    if d != d2 || ids.numel() != t {
        return Err(shape_err(
            op,
            format!(
                "table {:?}, rows {:?}, {} ids",
                dtable.shape(),
                dx.shape(),
                ids.numel()
            ),
        ));
    }
    if dtable.dtype() != DType::F32 {
        return Err(EngineError::DType {
            op,
            dtype: dtable.dtype(),
        });
    }
    check_below(op, &host_u32(be, ids, op)?, v)?;
    let dt = float_dtype(op, dx)?;
    elementwise(
        be,
        &format!("embedding_backward_{}", Cuda::suffix(op, dt)?),
        d, // one thread per column, tokens in order (deterministic)
        &[
            Arg::P(be.ptr(dtable)),
            Arg::P(be.ptr(dx)),
            Arg::P(be.ptr(ids)),
            Arg::U(t as u32),
            Arg::U(d as u32),
        ],
    )
}

pub(crate) fn rms_norm(
    be: &Cuda,
    x: &Tensor<Cuda>,
    w: &Tensor<Cuda>,
    eps: f32,
) -> Result<Tensor<Cuda>> {
    let (t, d) = x.dims2("rms_norm")?;
    if w.dims1("rms_norm")? != d {
        return Err(shape_err(
            "rms_norm",
            format!("weight {:?} for rows of {d}", w.shape()),
        ));
    }
    let dt = float_dtype("rms_norm", x)?;
    let w = coerce(be, w, dt)?;
    let out = be.alloc(&[t, d], dt, false)?;
    if t == 0 {
        return Ok(out);
    }
    be.launch(
        &format!("rms_norm_{}", Cuda::suffix("rms_norm", dt)?),
        (t as u32, 1),
        256,
        &[
            Arg::P(be.ptr(&out)),
            Arg::P(be.ptr(x)),
            Arg::P(be.ptr(&w)),
            Arg::U(d as u32),
            Arg::F(eps),
        ],
    )?;
    Ok(out)
}

pub(crate) fn rms_norm_backward(
    be: &Cuda,
    x: &Tensor<Cuda>,
    w: &Tensor<Cuda>,
    dy: &Tensor<Cuda>,
    eps: f32,
    dweight: Option<&mut Tensor<Cuda>>,
) -> Result<Tensor<Cuda>> {
    let op = "rms_norm_backward";
    let (t, d) = x.dims2(op)?;
    same_shape(op, x, dy)?;
    let dw_ok = dweight.as_ref().is_none_or(|g| g.shape() == w.shape());
    if w.dims1(op)? != d || !dw_ok {
        return Err(shape_err(
            op,
            format!("weight {:?} for rows of {d}", w.shape()),
        ));
    }
    let dt = float_dtype(op, x)?;
    let sfx = Cuda::suffix(op, dt)?;
    let w = coerce(be, w, dt)?;
    let dy = coerce(be, dy, dt)?;
    let dx = be.alloc(&[t, d], dt, false)?;
    let rstd = be.alloc(&[t], DType::F32, false)?;
    if t == 0 {
        return Ok(dx);
    }
    be.launch(
        &format!("rms_norm_backward_{sfx}"),
        (t as u32, 1),
        256,
        &[
            Arg::P(be.ptr(&dx)),
            Arg::P(be.ptr(&rstd)),
            Arg::P(be.ptr(x)),
            Arg::P(be.ptr(&w)),
            Arg::P(be.ptr(&dy)),
            Arg::U(d as u32),
            Arg::F(eps),
        ],
    )?;
    if let Some(dweight) = dweight {
        // The column pass accumulates in f32: into the gradient itself when it is f32 (always,
        // in training), else into an f32 buffer added afterwards.
        let mut own = None;
        let target_ptr = if dweight.dtype() == DType::F32 {
            be.ptr(dweight)
        } else {
            let z = be.alloc(&[d], DType::F32, true)?;
            let p = be.ptr(&z);
            own = Some(z);
            p
        };
        be.launch(
            &format!("rms_norm_dweight_{sfx}"),
            ((d as u32).div_ceil(256), 1),
            256,
            &[
                Arg::P(target_ptr),
                Arg::P(be.ptr(x)),
                Arg::P(be.ptr(&dy)),
                Arg::P(be.ptr(&rstd)),
                Arg::U(t as u32),
                Arg::U(d as u32),
            ],
        )?;
        if let Some(z) = own {
            add_assign(be, dweight, &z)?;
        }
    }
    Ok(dx)
}

pub(crate) fn rope(
    be: &Cuda,
    op: &'static str,
    x: &mut Tensor<Cuda>,
    positions: &Tensor<Cuda>,
    head_dim: usize,
    theta: f32,
    sign: f32,
) -> Result<()> {
    let (t, f) = x.dims2(op)?;
    if head_dim == 0 || head_dim % 2 != 0 || f % head_dim != 0 {
        return Err(shape_err(
            op,
            format!("row of {f} features with head_dim {head_dim}"),
        ));
    }
    if positions.dims1(op)? != t || positions.dtype() != DType::U32 {
        return Err(shape_err(
            op,
            format!("{} positions for {t} rows", positions.numel()),
        ));
    }
    let dt = float_dtype(op, x)?;
    elementwise(
        be,
        &format!("rope_{}", Cuda::suffix(op, dt)?),
        t * f / 2,
        &[
            Arg::P(be.ptr(x)),
            Arg::P(be.ptr(positions)),
            Arg::U(t as u32),
            Arg::U(f as u32),
            Arg::U(head_dim as u32),
            Arg::F(theta),
            Arg::F(sign),
        ],
    )
}

pub(crate) fn kv_write(
    be: &Cuda,
    cache: &mut Tensor<Cuda>,
    src: &Tensor<Cuda>,
    slots: &Tensor<Cuda>,
    positions: &Tensor<Cuda>,
) -> Result<()> {
    let op = "kv_write";
    let (s, m, f) = match cache.shape()[..] {
        [a, b, c] => (a, b, c),
        _ => return Err(shape_err(op, format!("cache {:?}", cache.shape()))),
    };
    let (t, f2) = src.dims2(op)?;
    if f != f2 || slots.numel() != t || positions.numel() != t {
        return Err(shape_err(
            op,
            format!(
                "cache {:?}, rows {:?}, {} slots, {} positions",
                cache.shape(),
                src.shape(),
                slots.numel(),
                positions.numel()
            ),
        ));
    }
    check_below(op, &host_u32(be, slots, op)?, s)?;
    check_below(op, &host_u32(be, positions, op)?, m)?;
    let dt = float_dtype(op, cache)?;
    let src = coerce(be, src, dt)?;
    elementwise(
        be,
        &format!("kv_write_{}", Cuda::suffix(op, dt)?),
        t * f,
        &[
            Arg::P(be.ptr(cache)),
            Arg::P(be.ptr(&src)),
            Arg::P(be.ptr(slots)),
            Arg::P(be.ptr(positions)),
            Arg::U(t as u32),
            Arg::U(m as u32),
            Arg::U(f as u32),
        ],
    )
}

pub(crate) fn linear(
    be: &Cuda,
    x: &Tensor<Cuda>,
    w: &Tensor<Cuda>,
    bias: Option<&Tensor<Cuda>>,
) -> Result<Tensor<Cuda>> {
    let (t, k) = x.dims2("linear")?;
    let (n, k2) = w.dims2("linear")?;
    if k != k2 || bias.is_some_and(|b| b.shape() != [n]) {
        return Err(shape_err(
            "linear",
            format!(
                "x {:?} @ w {:?}^T, bias {:?}",
                x.shape(),
                w.shape(),
                bias.map(|b| b.shape().to_vec())
            ),
        ));
    }
    let dt = float_dtype("linear", x)?;
    let w = coerce(be, w, dt)?;
    let out = be.alloc(&[t, n], dt, false)?;
    gemm(
        be,
        t,
        n,
        k,
        Operand {
            ptr: be.ptr(x),
            dtype: dt,
            trans: false,
            ld: k,
        },
        Operand {
            ptr: be.ptr(&w),
            dtype: dt,
            trans: true,
            ld: k,
        },
        Operand {
            ptr: be.ptr(&out),
            dtype: dt,
            trans: false,
            ld: n,
        },
        1.0,
        0.0,
    )?;
    if let Some(b) = bias {
        let b = coerce(be, b, dt)?;
        elementwise(
            be,
            &format!("add_bias_{}", Cuda::suffix("linear", dt)?),
            t * n,
            &[
                Arg::P(be.ptr(&out)),
                Arg::P(be.ptr(&b)),
                Arg::U(t as u32),
                Arg::U(n as u32),
            ],
        )?;
    }
    Ok(out)
}

pub(crate) fn matmul(
    be: &Cuda,
    a: &Tensor<Cuda>,
    trans_a: bool,
    b: &Tensor<Cuda>,
    trans_b: bool,
    c: &mut Tensor<Cuda>,
    accumulate: bool,
) -> Result<()> {
    let (m, k, n) = crate::engine::shapes::matmul_dims(a, trans_a, b, trans_b, c)?;
    // Stored column counts (leading dimensions); both are matrices now.
    let (ac, bc) = (a.shape()[1], b.shape()[1]);
    let dt = float_dtype("matmul", a)?;
    // C may be f32 over bf16 inputs; an f32 product into a bf16 C goes through bf16 copies of A, B.
    let ab_dt = if c.dtype() == DType::BF16 {
        DType::BF16
    } else {
        dt
    };
    let a = coerce(be, a, ab_dt)?;
    let b = coerce(be, b, ab_dt)?;
    gemm(
        be,
        m,
        n,
        k,
        Operand {
            ptr: be.ptr(&a),
            dtype: ab_dt,
            trans: trans_a,
            ld: ac,
        },
        Operand {
            ptr: be.ptr(&b),
            dtype: ab_dt,
            trans: trans_b,
            ld: bc,
        },
        Operand {
            ptr: be.ptr(c),
            dtype: c.dtype(),
            trans: false,
            ld: n,
        },
        1.0,
        if accumulate { 1.0 } else { 0.0 },
    )
}

pub(crate) fn sum_rows(
    be: &Cuda,
    x: &Tensor<Cuda>,
    out: &mut Tensor<Cuda>,
    accumulate: bool,
) -> Result<()> {
    let (t, n) = x.dims2("sum_rows")?;
    if out.dims1("sum_rows")? != n {
        return Err(shape_err(
            "sum_rows",
            format!("{:?} into {:?}", x.shape(), out.shape()),
        ));
    }
    let dt = float_dtype("sum_rows", out)?;
    let x = coerce(be, x, dt)?;
    be.launch(
        &format!("sum_rows_{}", Cuda::suffix("sum_rows", dt)?),
        ((n as u32).div_ceil(256), 1),
        256,
        &[
            Arg::P(be.ptr(&x)),
            Arg::P(be.ptr(out)),
            Arg::U(t as u32),
            Arg::U(n as u32),
            Arg::I(accumulate as i32),
        ],
    )
}

/// Blocks of the sum-of-squares kernel: fixed, so the f64 partials add in a fixed order.
const SUMSQ_BLOCKS: u32 = 256;

/// Queues the sum-of-squares kernel of `x`, writing its [`SUMSQ_BLOCKS`] f64 partials at `out`.
fn sum_squares_partials(be: &Cuda, x: &Tensor<Cuda>, out: u64) -> Result<()> {
    let dt = float_dtype("sum_squares", x)?;
    let n = x.numel();
    be.launch(
        &format!("sum_squares_{}", Cuda::suffix("sum_squares", dt)?),
        (SUMSQ_BLOCKS, 1),
        256,
        &[Arg::P(be.ptr(x)), Arg::L(n as u64), Arg::P(out)],
    )
}

/// f64 values of downloaded bytes.
fn f64s(bytes: &[u8]) -> impl Iterator<Item = f64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
}

pub(crate) fn sum_squares(be: &Cuda, x: &Tensor<Cuda>) -> Result<f64> {
    sum_squares_all(be, &[x])
}

/// The sum of squares of every element of every tensor with one device-to-host transfer: each
/// tensor's partials go to its own slice of one buffer; the host adds them per tensor, then the
/// tensors in order (the same value as adding [`sum_squares`] of each).
pub(crate) fn sum_squares_all(be: &Cuda, xs: &[&Tensor<Cuda>]) -> Result<f64> {
    if xs.is_empty() {
        return Ok(0.0);
    }
    let per = SUMSQ_BLOCKS as usize;
    let partial = be.alloc(&[per * 2 * xs.len()], DType::F32, true)?;
    let base = be.ptr(&partial);
    for (i, x) in xs.iter().enumerate() {
        sum_squares_partials(be, x, base + (i * per * 8) as u64)?;
    }
    let bytes = be.download_bytes(&partial)?;
    Ok(bytes
        .chunks_exact(per * 8)
        .map(|c| f64s(c).sum::<f64>())
        .sum())
}

/// The kernel scalars of an AdamW step: `(step_size, bc2_sqrt, decay)`.
fn adamw_scalars(hp: &AdamWParams) -> (f32, f32, f32) {
    let step = hp.step.max(1) as i32;
    let bc1 = 1.0 - (hp.beta1 as f64).powi(step);
    let bc2 = 1.0 - (hp.beta2 as f64).powi(step);
    let step_size = (hp.lr as f64 / bc1) as f32;
    (step_size, bc2.sqrt() as f32, 1.0 - hp.lr * hp.weight_decay)
}

/// Checks the shapes of an AdamW update and that the f32 state tensors (moments, master copy)
/// are f32.
fn adamw_check(
    op: &'static str,
    param: &Tensor<Cuda>,
    grad: &Tensor<Cuda>,
    f32s: &[&Tensor<Cuda>],
) -> Result<()> {
    same_shape(op, param, grad)?;
    for t in f32s {
        same_shape(op, param, t)?;
        if t.dtype() != DType::F32 {
            return Err(EngineError::DType {
                op,
                dtype: t.dtype(),
            });
        }
    }
    Ok(())
}

pub(crate) fn adamw_step(
    be: &Cuda,
    param: &mut Tensor<Cuda>,
    grad: &Tensor<Cuda>,
    m: &mut Tensor<Cuda>,
    v: &mut Tensor<Cuda>,
    hp: AdamWParams,
) -> Result<()> {
    let op = "adamw_step";
    adamw_check(op, param, grad, &[m, v])?;
    let dt = float_dtype(op, param)?;
    let grad = coerce(be, grad, DType::F32)?;
    let (step_size, bc2_sqrt, decay) = adamw_scalars(&hp);
    let n = param.numel();
    elementwise(
        be,
        &format!("adamw_{}", Cuda::suffix(op, dt)?),
        n,
        &[
            Arg::P(be.ptr(param)),
            Arg::P(be.ptr(&grad)),
            Arg::P(be.ptr(m)),
            Arg::P(be.ptr(v)),
            Arg::L(n as u64),
            Arg::F(hp.beta1),
            Arg::F(hp.beta2),
            Arg::F(hp.eps),
            Arg::F(decay),
            Arg::F(step_size),
            Arg::F(bc2_sqrt),
        ],
    )
}

/// An f32 master copy of a bf16 weight (`None` for an f32 weight, which needs none).
pub(crate) fn master_copy(be: &Cuda, param: &Tensor<Cuda>) -> Result<Option<Tensor<Cuda>>> {
    match param.dtype() {
        DType::BF16 => be.cast(param, DType::F32),
        _ => Ok(None),
    }
}

/// AdamW on the f32 `master` copy of the bf16 `param`; `param` becomes the rounded master.
pub(crate) fn adamw_step_master(
    be: &Cuda,
    param: &mut Tensor<Cuda>,
    master: &mut Tensor<Cuda>,
    grad: &Tensor<Cuda>,
    m: &mut Tensor<Cuda>,
    v: &mut Tensor<Cuda>,
    hp: AdamWParams,
) -> Result<()> {
    let op = "adamw_step_master";
    adamw_check(op, param, grad, &[master, m, v])?;
    if param.dtype() != DType::BF16 {
        return Err(EngineError::DType {
            op,
            dtype: param.dtype(),
        });
    }
    let grad = coerce(be, grad, DType::F32)?;
    let (step_size, bc2_sqrt, decay) = adamw_scalars(&hp);
    let n = param.numel();
    elementwise(
        be,
        "adamw_master_bf16",
        n,
        &[
            Arg::P(be.ptr(param)),
            Arg::P(be.ptr(master)),
            Arg::P(be.ptr(&grad)),
            Arg::P(be.ptr(m)),
            Arg::P(be.ptr(v)),
            Arg::L(n as u64),
            Arg::F(hp.beta1),
            Arg::F(hp.beta2),
            Arg::F(hp.eps),
            Arg::F(decay),
            Arg::F(step_size),
            Arg::F(bc2_sqrt),
        ],
    )
}
