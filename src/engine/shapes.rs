//! Backend-independent shape checks of the operations whose operands relate in more than one
//! dimension, shared by every backend so that the same bad call gets the same error everywhere.

use crate::engine::backend::IGNORE_TARGET;
use crate::engine::error::{EngineError, Result};
use crate::engine::{Backend, Tensor};

/// A shape error of `op`.
pub fn shape_err(op: &'static str, detail: String) -> EngineError {
    EngineError::Shape { op, detail }
}

/// `(m, k, n)` of `c (+)= op(a) @ op(b)` (see [`Backend::matmul`]), or a shape error.
pub fn matmul_dims<B: Backend>(
    a: &Tensor<B>,
    trans_a: bool,
    b: &Tensor<B>,
    trans_b: bool,
    c: &Tensor<B>,
) -> Result<(usize, usize, usize)> {
    let (ar, ac) = a.dims2("matmul")?;
    let (br, bc) = b.dims2("matmul")?;
    let (m, k) = if trans_a { (ac, ar) } else { (ar, ac) };
    let (k2, n) = if trans_b { (bc, br) } else { (br, bc) };
    let (cm, cn) = c.dims2("matmul")?;
    if k != k2 || cm != m || cn != n {
        return Err(shape_err(
            "matmul",
            format!(
                "a {:?}{} @ b {:?}{} into c {:?}",
                a.shape(),
                if trans_a { "^T" } else { "" },
                b.shape(),
                if trans_b { "^T" } else { "" },
                c.shape()
            ),
        ));
    }
    Ok((m, k, n))
}

/// `(t, d, v)` of a token loss over hidden states `h [T, D]`, an LM head `[V, D]` and `T`
/// targets, or a shape error.
pub fn token_loss_dims<B: Backend>(
    op: &'static str,
    h: &Tensor<B>,
    head: &Tensor<B>,
    targets: &Tensor<B>,
) -> Result<(usize, usize, usize)> {
    let (t, d) = h.dims2(op)?;
    let (v, d2) = head.dims2(op)?;
    if d != d2 || targets.numel() != t {
        return Err(shape_err(
            op,
            format!(
                "hidden {:?}, head {:?}, {} targets",
                h.shape(),
                head.shape(),
                targets.numel()
            ),
        ));
    }
    Ok((t, d, v))
}

/// An index error for the first target that is neither [`IGNORE_TARGET`] nor below `v`.
pub fn check_targets(op: &'static str, targets: &[u32], v: usize) -> Result<()> {
    match targets
        .iter()
        .find(|&&x| x != IGNORE_TARGET && x as usize >= v)
    {
        Some(&bad) => Err(EngineError::Index {
            op,
            index: bad as usize,
            limit: v,
        }),
        None => Ok(()),
    }
}
