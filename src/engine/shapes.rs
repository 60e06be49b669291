//! Backend-independent shape checks of the operations whose operands relate in more than one
//! dimension, shared by every backend so that the same bad call gets the same error everywhere.

use crate::engine::backend::IGNORE_TARGET;
use crate::engine::error::{EngineError, Result};
use crate::engine::{AttentionShape, Backend, Tensor};

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

/// `(t, q_features, kv_features)` of packed training attention over `q [T, H*hd]` and
/// `k`, `v [T, Hkv*hd]` (see [`Backend::attention_train`]), or a shape error.
pub fn attention_train_dims<B: Backend>(
    op: &'static str,
    q: &Tensor<B>,
    k: &Tensor<B>,
    v: &Tensor<B>,
    sh: &AttentionShape,
) -> Result<(usize, usize, usize)> {
    let (t, qf) = q.dims2(op)?;
    let (tk, kf) = k.dims2(op)?;
    let ok = sh.n_kv_heads > 0
        && sh.n_heads % sh.n_kv_heads == 0
        && qf == sh.n_heads * sh.head_dim
        && kf == sh.n_kv_heads * sh.head_dim
        && tk == t
        && v.shape() == k.shape();
    if !ok {
        return Err(shape_err(
            op,
            format!(
                "q {:?}, k {:?}, v {:?}, {sh:?}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    Ok((t, qf, kf))
}

/// Checks the loss coefficients `g_logp`, `g_entropy` (one per row of `t`) and the head gradient
/// of a token-loss backward.
pub fn token_loss_backward_dims<B: Backend>(
    op: &'static str,
    t: usize,
    g_logp: &Tensor<B>,
    g_entropy: &Tensor<B>,
    head: &Tensor<B>,
    dhead: Option<&Tensor<B>>,
) -> Result<()> {
    let dh_ok = dhead.is_none_or(|w| w.shape() == head.shape());
    if g_logp.numel() != t || g_entropy.numel() != t || !dh_ok {
        return Err(shape_err(
            op,
            format!(
                "{} and {} coefficients for {t} rows, head {:?}",
                g_logp.numel(),
                g_entropy.numel(),
                head.shape()
            ),
        ));
    }
    Ok(())
}
