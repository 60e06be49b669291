//! Matrix products on the CPU.
//!
//! Large products go through the `gemm` crate. In isolation `matrixmultiply` measured 10-15%
//! faster at the small preset's prefill shapes (`benches/gemm.rs`), but end to end (`sorft bench
//! model`, alternating runs) prefill was faster with `gemm`, whose threads are rayon's: a second
//! thread pool competes with rayon's for the same cores. Products with few rows (decode steps) use a dot-product kernel whose result
//! for a row does not depend on how many rows are batched with it, so a batch of sequences decodes
//! to exactly the tokens each sequence gets alone.

use rayon::prelude::*;

use super::simd::dot_block;
use super::{f32s, tensor_f32, Cpu};
use crate::engine::error::{EngineError, Result};
use crate::engine::Tensor;

/// Up to this many rows, `linear` uses the row-independent dot-product kernel.
pub const SMALL_M: usize = 16;

/// Output columns handled by one task of the small-row kernel.
const COLS_PER_TASK: usize = 32;

/// A strided view of a row-major or transposed matrix operand.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    /// The elements.
    pub data: &'a [f32],
    /// Stride between rows.
    pub rs: usize,
    /// Stride between columns.
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major matrix whose rows are `rs` elements apart.
    pub fn row_major(data: &'a [f32], rs: usize) -> Self {
        Self { data, rs, cs: 1 }
    }

    /// A column-major matrix (the transpose of a row-major one) whose columns are `cs` apart.
    pub fn col_major(data: &'a [f32], cs: usize) -> Self {
        Self { data, rs: 1, cs }
    }
}

/// `c [m, n] (+)= a [m, k] @ b [k, n]` through the gemm crate; `c` is row-major and contiguous.
pub fn gemm(m: usize, n: usize, k: usize, a: MatRef, b: MatRef, c: &mut [f32], accumulate: bool) {
    gemm_with(
        m,
        n,
        k,
        a,
        b,
        c,
        accumulate,
        par_for(m, n, k, rayon::current_num_threads()),
    );
}

/// [`gemm`] on the calling thread only: for products inside tasks that are already parallel.
pub fn gemm_serial(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: &mut [f32],
    accumulate: bool,
) {
    gemm_threads(m, n, k, a, b, c, accumulate, 1);
}

/// [`gemm`] on at most `threads` of rayon's threads (for products run beside others).
#[allow(clippy::too_many_arguments)]
pub fn gemm_threads(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: &mut [f32],
    accumulate: bool,
    threads: usize,
) {
    gemm_with(m, n, k, a, b, c, accumulate, par_for(m, n, k, threads));
}

/// [`gemm`] into a new row-major `[m, n]` buffer, written without being zero-filled first.
pub fn gemm_new(m: usize, n: usize, k: usize, a: MatRef, b: MatRef) -> Vec<f32> {
    gemm_new_threads(m, n, k, a, b, rayon::current_num_threads())
}

/// [`gemm_new`] on at most `threads` of rayon's threads.
pub fn gemm_new_threads(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    threads: usize,
) -> Vec<f32> {
    if m == 0 || n == 0 || k == 0 {
        return vec![0.0f32; m * n];
    }
    let mut c: Vec<f32> = Vec::with_capacity(m * n);
    // SAFETY: as in `gemm_with`; with `read_dst` false the crate writes all `m * n` elements of
    // the buffer (k > 0) without reading them, so the length can then cover them.
    unsafe {
        gemm_raw(
            m,
            n,
            k,
            a,
            b,
            c.as_mut_ptr(),
            false,
            par_for(m, n, k, threads),
        );
        c.set_len(m * n);
    }
    c
}

/// Rayon parallelism on `threads` threads for products big enough to pay for it.
fn par_for(m: usize, n: usize, k: usize, threads: usize) -> gemm::Parallelism {
    if threads > 1 && m * n * k >= 32 * 32 * 32 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    }
}

#[allow(clippy::too_many_arguments)]
fn gemm_with(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: &mut [f32],
    accumulate: bool,
    par: gemm::Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c.iter_mut().for_each(|x| *x = 0.0);
        }
        return;
    }
    // SAFETY: the slices outlive the call, the strides address only elements inside them (checked
    // by the callers' shape checks), and `c` is not aliased by `a` or `b`.
    unsafe { gemm_raw(m, n, k, a, b, c.as_mut_ptr(), accumulate, par) }
}

/// The gemm crate's product into `m * n` contiguous row-major elements at `c`.
///
/// # Safety
/// `c` must be valid for `m * n` writes (and reads when `accumulate`), not aliased by `a` or `b`,
/// and the strides of `a` and `b` must address elements inside their slices.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: *mut f32,
    accumulate: bool,
    par: gemm::Parallelism,
) {
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// `x [m, k] @ w [n, k]^T (+ bias)`.
pub fn linear(x: &Tensor<Cpu>, w: &Tensor<Cpu>, bias: Option<&Tensor<Cpu>>) -> Result<Tensor<Cpu>> {
    let (m, k) = x.dims2("linear")?;
    let (n, k2) = w.dims2("linear")?;
    if k != k2 {
        return Err(EngineError::Shape {
            op: "linear",
            detail: format!("input {:?} with weight {:?}", x.shape(), w.shape()),
        });
    }
    let bias = match bias {
        Some(b) => {
            if b.dims1("linear")? != n {
                return Err(EngineError::Shape {
                    op: "linear",
                    detail: format!("bias {:?} for {n} outputs", b.shape()),
                });
            }
            Some(f32s(b, "linear")?)
        }
        None => None,
    };
    let xs = f32s(x, "linear")?;
    let ws = f32s(w, "linear")?;
    let mut out = if m <= SMALL_M {
        linear_small(xs, ws, m, n, k)
    } else {
        let x = MatRef::row_major(xs, k);
        let wt = MatRef::col_major(ws, k);
        gemm_new(m, n, k, x, wt)
    };
    if let Some(b) = bias {
        out.par_chunks_mut(n.max(1)).for_each(|row| {
            row.iter_mut().zip(b).for_each(|(o, &b)| *o += b);
        });
    }
    Ok(tensor_f32(out, &[m, n]))
}

/// A weight and its optional bias.
pub type Proj<'a> = (&'a Tensor<Cpu>, Option<&'a Tensor<Cpu>>);

/// [`linear`] with `p1` and with `p2`: with more than one thread and more than [`SMALL_M`] rows,
/// the two products at once, each on half of the threads (the same sums as [`linear`]'s).
pub fn linear_pair(x: &Tensor<Cpu>, p1: Proj, p2: Proj) -> Result<(Tensor<Cpu>, Tensor<Cpu>)> {
    let threads = rayon::current_num_threads();
    let (m, k) = x.dims2("linear")?;
    if threads < 2 || m <= SMALL_M {
        return Ok((linear(x, p1.0, p1.1)?, linear(x, p2.0, p2.1)?));
    }
    let xs = f32s(x, "linear")?;
    let (a, b) = (weights(p1, k)?, weights(p2, k)?);
    let half = threads / 2;
    let (y1, y2) = rayon::join(
        || project_on(xs, m, k, a, half),
        || project_on(xs, m, k, b, threads - half),
    );
    Ok((y1, y2))
}

/// A weight's elements, its bias's, and its output count.
type Weights<'a> = (&'a [f32], Option<&'a [f32]>, usize);

/// The checked slices of a weight `[n, k]` and its bias `[n]`.
fn weights<'a>(p: Proj<'a>, k: usize) -> Result<Weights<'a>> {
    let (n, k2) = p.0.dims2("linear")?;
    let bad = |detail: String| EngineError::Shape {
        op: "linear",
        detail,
    };
    if k2 != k {
        return Err(bad(format!("weight {:?} for inputs of {k}", p.0.shape())));
    }
    let bias = match p.1 {
        Some(b) if b.dims1("linear")? != n => {
            return Err(bad(format!("bias {:?} for {n} outputs", b.shape())))
        }
        Some(b) => Some(f32s(b, "linear")?),
        None => None,
    };
    Ok((f32s(p.0, "linear")?, bias, n))
}

/// `x [m, k] w^T (+ bias)` on at most `threads` threads (the bias added on the calling one).
fn project_on(
    xs: &[f32],
    m: usize,
    k: usize,
    (ws, bias, n): Weights,
    threads: usize,
) -> Tensor<Cpu> {
    let x = MatRef::row_major(xs, k);
    let wt = MatRef::col_major(ws, k);
    let mut out = gemm_new_threads(m, n, k, x, wt, threads);
    if let Some(b) = bias {
        for row in out.chunks_exact_mut(n.max(1)) {
            row.iter_mut().zip(b).for_each(|(o, &b)| *o += b);
        }
    }
    tensor_f32(out, &[m, n])
}

/// The small-row kernel: every output is one fixed-order dot of a row of `x` with a row of `w`,
/// computed in register blocks of two rows by four columns.
fn linear_small(xs: &[f32], ws: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    if m == 0 || n == 0 {
        return out;
    }
    let blocks: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(COLS_PER_TASK))
        .into_par_iter()
        .with_min_len(if m * n * k < 1 << 16 { usize::MAX } else { 1 })
        .map(|task| {
            let j0 = task * COLS_PER_TASK;
            let j1 = (j0 + COLS_PER_TASK).min(n);
            let cols = j1 - j0;
            let mut part = vec![0.0f32; m * cols];
            let row = |i: usize| &xs[i * k..(i + 1) * k];
            let wrow = |j: usize| &ws[j * k..(j + 1) * k];
            let mut j = j0;
            while j < j1 {
                if j + 4 <= j1 {
                    let w4 = [wrow(j), wrow(j + 1), wrow(j + 2), wrow(j + 3)];
                    let mut i = 0;
                    while i + 2 <= m {
                        let o = dot_block::<2, 4>([row(i), row(i + 1)], w4, k);
                        for r in 0..2 {
                            part[(i + r) * cols + (j - j0)..(i + r) * cols + (j - j0) + 4]
                                .copy_from_slice(&o[r]);
                        }
                        i += 2;
                    }
                    if i < m {
                        let o = dot_block::<1, 4>([row(i)], w4, k);
                        part[i * cols + (j - j0)..i * cols + (j - j0) + 4].copy_from_slice(&o[0]);
                    }
                    j += 4;
                } else {
                    for i in 0..m {
                        part[i * cols + (j - j0)] = dot_block::<1, 1>([row(i)], [wrow(j)], k)[0][0];
                    }
                    j += 1;
                }
            }
            (j0, part)
        })
        .collect();
    for (j0, part) in blocks {
        let cols = part.len() / m;
        for i in 0..m {
            out[i * n + j0..i * n + j0 + cols].copy_from_slice(&part[i * cols..(i + 1) * cols]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rng::SplitMix;

    fn naive(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut o = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                o[i * n + j] = (0..k)
                    .map(|p| x[i * k + p] as f64 * w[j * k + p] as f64)
                    .sum::<f64>() as f32;
            }
        }
        o
    }

    #[test]
    fn linear_matches_naive_for_small_and_large_m() {
        let mut r = SplitMix::new(5);
        for &(m, n, k) in &[
            (1, 7, 5),
            (3, 33, 17),
            (16, 64, 40),
            (17, 65, 33),
            (70, 90, 129),
        ] {
            let x: Vec<f32> = (0..m * k).map(|_| r.next_normal() as f32).collect();
            let w: Vec<f32> = (0..n * k).map(|_| r.next_normal() as f32).collect();
            let xt = tensor_f32(x.clone(), &[m, k]);
            let wt = tensor_f32(w.clone(), &[n, k]);
            let got = linear(&xt, &wt, None).unwrap();
            let got = f32s(&got, "t").unwrap();
            let want = naive(&x, &w, m, n, k);
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-4 * (1.0 + b.abs()),
                    "{m}x{n}x{k}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn small_kernel_rows_do_not_depend_on_batch() {
        let mut r = SplitMix::new(9);
        let (n, k) = (50, 77);
        let x: Vec<f32> = (0..8 * k).map(|_| r.next_normal() as f32).collect();
        let w: Vec<f32> = (0..n * k).map(|_| r.next_normal() as f32).collect();
        let batch = linear_small(&x, &w, 8, n, k);
        for i in 0..8 {
            let one = linear_small(&x[i * k..(i + 1) * k], &w, 1, n, k);
            assert_eq!(&batch[i * n..(i + 1) * n], &one[..]);
        }
    }

    #[test]
    fn gemm_new_matches_gemm_into_zeros() {
        let mut r = SplitMix::new(11);
        for &(m, n, k) in &[(40, 50, 60), (33, 7, 1), (5, 3, 0)] {
            let a: Vec<f32> = (0..m * k).map(|_| r.next_normal() as f32).collect();
            let b: Vec<f32> = (0..k * n).map(|_| r.next_normal() as f32).collect();
            let am = MatRef::row_major(&a, k);
            let bm = MatRef::row_major(&b, n);
            let mut want = vec![0.0f32; m * n];
            gemm(m, n, k, am, bm, &mut want, false);
            assert_eq!(gemm_new(m, n, k, am, bm), want, "{m}x{n}x{k}");
        }
    }

    fn rand_tensor(r: &mut SplitMix, shape: &[usize]) -> Tensor<Cpu> {
        let n = shape.iter().product();
        tensor_f32((0..n).map(|_| r.next_normal() as f32).collect(), shape)
    }

    fn bits(t: &Tensor<Cpu>) -> Vec<u32> {
        f32s(t, "t").unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// `linear_pair` and `linear_backward` (the products run at once) give the bits of the
    /// products in turn, on one thread and on three.
    #[test]
    fn concurrent_products_match_the_products_in_turn() {
        use crate::engine::Backend;
        let mut r = SplitMix::new(21);
        let (t, i, o1, o2) = (70, 48, 40, 24);
        let x = rand_tensor(&mut r, &[t, i]);
        let (w1, w2) = (rand_tensor(&mut r, &[o1, i]), rand_tensor(&mut r, &[o2, i]));
        let b1 = rand_tensor(&mut r, &[o1]);
        let dy = rand_tensor(&mut r, &[t, o1]);
        let dx0 = rand_tensor(&mut r, &[t, i]);
        let dw0 = rand_tensor(&mut r, &[o1, i]);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("thread pool");
            pool.install(|| {
                let (y1, y2) = Cpu.linear_pair(&x, (&w1, Some(&b1)), (&w2, None)).unwrap();
                assert_eq!(bits(&y1), bits(&linear(&x, &w1, Some(&b1)).unwrap()));
                assert_eq!(bits(&y2), bits(&linear(&x, &w2, None).unwrap()));
                let (mut dx, mut dw) = (Cpu.copy(&dx0).unwrap(), Cpu.copy(&dw0).unwrap());
                Cpu.linear_backward(&x, &w1, &dy, &mut dx, Some(&mut dw))
                    .unwrap();
                let (mut dx2, mut dw2) = (Cpu.copy(&dx0).unwrap(), Cpu.copy(&dw0).unwrap());
                Cpu.matmul(&dy, false, &w1, false, &mut dx2, true).unwrap();
                Cpu.matmul(&dy, true, &x, false, &mut dw2, true).unwrap();
                assert_eq!(bits(&dx), bits(&dx2));
                assert_eq!(bits(&dw), bits(&dw2));
                [y1, y2, dx, dw].map(|t| bits(&t))
            })
        };
        assert_eq!(run(1), run(3));
        let bad = rand_tensor(&mut r, &[o2, i + 1]);
        assert!(Cpu.linear_pair(&x, (&w1, None), (&bad, None)).is_err());
    }

    #[test]
    fn shape_mismatch_is_an_error() {
        let x = tensor_f32(vec![0.0; 6], &[2, 3]);
        let w = tensor_f32(vec![0.0; 8], &[2, 4]);
        assert!(linear(&x, &w, None).is_err());
    }
}
