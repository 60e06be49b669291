//! Packed causal attention of training on the CPU, GEMM-shaped (the flash-attention recipe on
//! matrix products): one task per (sequence, head) in the forward and per (sequence, key/value
//! head) in the backward, each walking its sequence in tiles of [`Q_TILE`] queries against the
//! keys those queries can see. Scores, probabilities and their gradients exist only for one tile
//! at a time (`Q_TILE` x sequence length), and every product runs on the task's own thread in a
//! fixed order, so results do not depend on the thread count.

use rayon::prelude::*;

use super::matmul::{gemm_serial, MatRef};
use super::simd::dot;
use super::vexp;
use crate::engine::backend::AttentionShape;

/// Queries per tile.
const Q_TILE: usize = 64;

/// One head's `d` columns of a packed row-major matrix, from the first row of a sequence.
#[derive(Clone, Copy)]
struct Head<'a> {
    data: &'a [f32],
    /// Row stride of the packed matrix.
    stride: usize,
    /// Offset of the head's first element (row 0 of the sequence, first column of the head).
    off: usize,
}

impl<'a> Head<'a> {
    /// Rows from `row` on, as an `[rows, d]` operand.
    fn rows(self, row: usize) -> MatRef<'a> {
        MatRef::row_major(&self.data[self.off + row * self.stride..], self.stride)
    }

    /// Rows from 0 on, transposed: a `[d, rows]` operand.
    fn cols(self) -> MatRef<'a> {
        MatRef::col_major(&self.data[self.off..], self.stride)
    }

    /// Row `row` of the head, `d` values.
    fn row(self, row: usize, d: usize) -> &'a [f32] {
        let at = self.off + row * self.stride;
        &self.data[at..at + d]
    }
}

/// Packed training inputs of attention: `q [T, H*d]`, `k`/`v [T, Hkv*d]`, and the shape.
#[derive(Clone, Copy)]
pub(super) struct Packed<'a> {
    /// Queries after RoPE.
    pub q: &'a [f32],
    /// Keys after RoPE.
    pub k: &'a [f32],
    /// Values.
    pub v: &'a [f32],
    /// Heads, head size and softmax scale.
    pub sh: AttentionShape,
}

impl<'a> Packed<'a> {
    fn qf(&self) -> usize {
        self.sh.n_heads * self.sh.head_dim
    }

    fn kf(&self) -> usize {
        self.sh.n_kv_heads * self.sh.head_dim
    }

    /// Query head `h` of the sequence starting at row `s`.
    fn q_head(&self, s: usize, h: usize) -> Head<'a> {
        let (qf, d) = (self.qf(), self.sh.head_dim);
        Head {
            data: self.q,
            stride: qf,
            off: s * qf + h * d,
        }
    }

    /// Key and value heads `g` of the sequence starting at row `s`.
    fn kv_heads(&self, s: usize, g: usize) -> (Head<'a>, Head<'a>) {
        let (kf, d) = (self.kf(), self.sh.head_dim);
        let at = |data| Head {
            data,
            stride: kf,
            off: s * kf + g * d,
        };
        (at(self.k), at(self.v))
    }
}

/// Scales a tile row of scores and turns its first `visible` entries into probabilities (the rest
/// into zeros); returns the log-sum-exp of the scaled scores.
fn softmax_causal(row: &mut [f32], visible: usize, scale: f32) -> f32 {
    let (seen, hidden) = row.split_at_mut(visible);
    let mx = vexp::scale_max(seen, scale);
    vexp::exp_affine(seen, 1.0, mx);
    let sum = vexp::sum(seen);
    let inv = 1.0 / sum;
    seen.iter_mut().for_each(|x| *x *= inv);
    hidden.iter_mut().for_each(|x| *x = 0.0);
    mx + sum.ln()
}

/// Forward of one query head over one sequence of `l` rows: its outputs `[l, d]` and the
/// log-sum-exp of each row's softmax.
fn head_forward(q: Head, k: Head, v: Head, l: usize, sh: AttentionShape) -> (Vec<f32>, Vec<f32>) {
    let d = sh.head_dim;
    let mut out = vec![0.0f32; l * d];
    let mut lse = vec![0.0f32; l];
    let mut scores = Vec::new();
    for i0 in (0..l).step_by(Q_TILE) {
        let i1 = (i0 + Q_TILE).min(l);
        // Queries i0..i1 see keys 0..i1.
        let (rows, n) = (i1 - i0, i1);
        scores.resize(rows * n, 0.0);
        gemm_serial(rows, n, d, q.rows(i0), k.cols(), &mut scores, false);
        for (r, row) in scores.chunks_exact_mut(n).enumerate() {
            lse[i0 + r] = softmax_causal(row, i0 + r + 1, sh.scale);
        }
        let p = MatRef::row_major(&scores, n);
        gemm_serial(rows, d, n, p, v.rows(0), &mut out[i0 * d..i1 * d], false);
    }
    (out, lse)
}

/// Packed causal attention: the outputs `[T, H*d]` and log-sum-exps `[T, H]`. `seqs` are the
/// non-empty `(start, end)` row ranges of the sequences.
pub(super) fn forward(x: Packed, seqs: &[(usize, usize)], t: usize) -> (Vec<f32>, Vec<f32>) {
    let (nh, d) = (x.sh.n_heads, x.sh.head_dim);
    let group = nh / x.sh.n_kv_heads;
    let tasks: Vec<(usize, usize, usize)> = seqs
        .iter()
        .flat_map(|&(s, e)| (0..nh).map(move |h| (s, e, h)))
        .collect();
    let parts: Vec<(Vec<f32>, Vec<f32>)> = tasks
        .par_iter()
        .map(|&(s, e, h)| {
            let (k, v) = x.kv_heads(s, h / group);
            head_forward(x.q_head(s, h), k, v, e - s, x.sh)
        })
        .collect();
    let qf = x.qf();
    let mut out = vec![0.0f32; t * qf];
    let mut lse = vec![0.0f32; t * nh];
    for (&(s, e, h), (o, l)) in tasks.iter().zip(parts) {
        for i in 0..e - s {
            let dst = (s + i) * qf + h * d;
            out[dst..dst + d].copy_from_slice(&o[i * d..(i + 1) * d]);
            lse[(s + i) * nh + h] = l[i];
        }
    }
    (out, lse)
}

/// What backward needs besides the inputs: the forward's outputs and log-sum-exps, and the
/// gradient of the outputs (all packed like `q`, `lse` as `[T, H]`).
#[derive(Clone, Copy)]
pub(super) struct Saved<'a> {
    /// Attention outputs.
    pub out: &'a [f32],
    /// Log-sum-exps.
    pub lse: &'a [f32],
    /// Gradient of the outputs.
    pub dout: &'a [f32],
}

/// Gradients of one key/value head over one sequence.
struct KvGrad {
    /// Per query head of the group, `[l, d]`.
    dq: Vec<Vec<f32>>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// Scratch tiles of one backward task.
#[derive(Default)]
struct Tiles {
    p: Vec<f32>,
    ds: Vec<f32>,
}

/// Backward of one query head `h` (of the sequence at row `s`, `l` rows) into its `dq` and the
/// shared `dk`, `dv` of its key/value head.
#[allow(clippy::too_many_arguments)]
fn head_backward(
    x: Packed,
    sv: Saved,
    s: usize,
    l: usize,
    h: usize,
    kv: (Head, Head),
    tiles: &mut Tiles,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let (d, nh, scale) = (x.sh.head_dim, x.sh.n_heads, x.sh.scale);
    let (k, v) = kv;
    let q = x.q_head(s, h);
    let o = Head { data: sv.out, ..q };
    let dout = Head { data: sv.dout, ..q };
    for i0 in (0..l).step_by(Q_TILE) {
        let i1 = (i0 + Q_TILE).min(l);
        let (rows, n) = (i1 - i0, i1);
        tiles.p.resize(rows * n, 0.0);
        tiles.ds.resize(rows * n, 0.0);
        gemm_serial(rows, n, d, q.rows(i0), k.cols(), &mut tiles.p, false);
        gemm_serial(rows, n, d, dout.rows(i0), v.cols(), &mut tiles.ds, false);
        let pairs = tiles
            .p
            .chunks_exact_mut(n)
            .zip(tiles.ds.chunks_exact_mut(n));
        for (r, (prow, dsrow)) in pairs.enumerate() {
            let i = i0 + r;
            let li = sv.lse[(s + i) * nh + h];
            let di = dot(dout.row(i, d), o.row(i, d));
            let (pv, ph) = prow.split_at_mut(i + 1);
            let (sv_, sh_) = dsrow.split_at_mut(i + 1);
            vexp::softmax_grad_row(pv, sv_, scale, li, di);
            ph.iter_mut().for_each(|x| *x = 0.0);
            sh_.iter_mut().for_each(|x| *x = 0.0);
        }
        let tile = |data| MatRef { data, rs: n, cs: 1 };
        let tile_t = |data| MatRef { data, rs: 1, cs: n };
        gemm_serial(
            rows,
            d,
            n,
            tile(&tiles.ds),
            k.rows(0),
            &mut dq[i0 * d..i1 * d],
            false,
        );
        gemm_serial(
            n,
            d,
            rows,
            tile_t(&tiles.ds),
            q.rows(i0),
            &mut dk[..n * d],
            true,
        );
        gemm_serial(
            n,
            d,
            rows,
            tile_t(&tiles.p),
            dout.rows(i0),
            &mut dv[..n * d],
            true,
        );
    }
}

/// Backward of packed causal attention: `(dq, dk, dv)`, packed like `q`, `k`, `v`.
pub(super) fn backward(
    x: Packed,
    sv: Saved,
    seqs: &[(usize, usize)],
    t: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (nh, nkv, d) = (x.sh.n_heads, x.sh.n_kv_heads, x.sh.head_dim);
    let group = nh / nkv;
    let tasks: Vec<(usize, usize, usize)> = seqs
        .iter()
        .flat_map(|&(s, e)| (0..nkv).map(move |g| (s, e, g)))
        .collect();
    let grads: Vec<KvGrad> = tasks
        .par_iter()
        .map(|&(s, e, g)| {
            let l = e - s;
            let mut kg = KvGrad {
                dq: vec![vec![0.0f32; l * d]; group],
                dk: vec![0.0f32; l * d],
                dv: vec![0.0f32; l * d],
            };
            let mut tiles = Tiles::default();
            for (hh, dq) in kg.dq.iter_mut().enumerate() {
                let kv = x.kv_heads(s, g);
                let h = g * group + hh;
                head_backward(x, sv, s, l, h, kv, &mut tiles, dq, &mut kg.dk, &mut kg.dv);
            }
            kg
        })
        .collect();
    let (qf, kf) = (x.qf(), x.kf());
    let mut dq = vec![0.0f32; t * qf];
    let mut dk = vec![0.0f32; t * kf];
    let mut dv = vec![0.0f32; t * kf];
    for (&(s, e, g), kg) in tasks.iter().zip(grads) {
        for i in 0..e - s {
            for (hh, dqh) in kg.dq.iter().enumerate() {
                let dst = (s + i) * qf + (g * group + hh) * d;
                dq[dst..dst + d].copy_from_slice(&dqh[i * d..(i + 1) * d]);
            }
            let dst = (s + i) * kf + g * d;
            dk[dst..dst + d].copy_from_slice(&kg.dk[i * d..(i + 1) * d]);
            dv[dst..dst + d].copy_from_slice(&kg.dv[i * d..(i + 1) * d]);
        }
    }
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rng::SplitMix;

    /// Naive f64 attention over the packed batch: `(out, lse)`.
    fn reference_forward(x: Packed, seqs: &[(usize, usize)], t: usize) -> (Vec<f64>, Vec<f64>) {
        let (nh, d) = (x.sh.n_heads, x.sh.head_dim);
        let group = nh / x.sh.n_kv_heads;
        let (qf, kf) = (x.qf(), x.kf());
        let mut out = vec![0.0f64; t * qf];
        let mut lse = vec![0.0f64; t * nh];
        for &(s, e) in seqs {
            for h in 0..nh {
                let ko = (h / group) * d;
                for i in s..e {
                    let sc: Vec<f64> = (s..=i)
                        .map(|j| {
                            (0..d)
                                .map(|c| {
                                    x.q[i * qf + h * d + c] as f64 * x.k[j * kf + ko + c] as f64
                                })
                                .sum::<f64>()
                                * x.sh.scale as f64
                        })
                        .collect();
                    let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = sc.iter().map(|v| (v - mx).exp()).sum();
                    lse[i * nh + h] = mx + z.ln();
                    for (j, v) in (s..=i).zip(&sc) {
                        let p = (v - mx).exp() / z;
                        for c in 0..d {
                            out[i * qf + h * d + c] += p * x.v[j * kf + ko + c] as f64;
                        }
                    }
                }
            }
        }
        (out, lse)
    }

    /// Naive f64 backward from the reference probabilities: `(dq, dk, dv)`.
    fn reference_backward(
        x: Packed,
        dout: &[f32],
        seqs: &[(usize, usize)],
        t: usize,
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (nh, d) = (x.sh.n_heads, x.sh.head_dim);
        let group = nh / x.sh.n_kv_heads;
        let (qf, kf) = (x.qf(), x.kf());
        let (_, lse) = reference_forward(x, seqs, t);
        let (mut dq, mut dk, mut dv) = (vec![0.0; t * qf], vec![0.0; t * kf], vec![0.0; t * kf]);
        let sc = x.sh.scale as f64;
        for &(s, e) in seqs {
            for h in 0..nh {
                let (qo, ko) = (h * d, (h / group) * d);
                let qv = |i: usize, c: usize| x.q[i * qf + qo + c] as f64;
                let kv = |j: usize, c: usize| x.k[j * kf + ko + c] as f64;
                let vv = |j: usize, c: usize| x.v[j * kf + ko + c] as f64;
                let gv = |i: usize, c: usize| dout[i * qf + qo + c] as f64;
                for i in s..e {
                    let p: Vec<f64> = (s..=i)
                        .map(|j| {
                            let z: f64 = (0..d).map(|c| qv(i, c) * kv(j, c)).sum();
                            (z * sc - lse[i * nh + h]).exp()
                        })
                        .collect();
                    let dp: Vec<f64> = (s..=i)
                        .map(|j| (0..d).map(|c| gv(i, c) * vv(j, c)).sum())
                        .collect();
                    let di: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                    for (n, j) in (s..=i).enumerate() {
                        let ds = p[n] * (dp[n] - di) * sc;
                        for c in 0..d {
                            dq[i * qf + qo + c] += ds * kv(j, c);
                            dk[j * kf + ko + c] += ds * qv(i, c);
                            dv[j * kf + ko + c] += p[n] * gv(i, c);
                        }
                    }
                }
            }
        }
        (dq, dk, dv)
    }

    fn close(got: &[f32], want: &[f64], what: &str) {
        assert_eq!(got.len(), want.len(), "{what} length");
        for (n, (a, b)) in got.iter().zip(want).enumerate() {
            let tol = 2e-4 * (1.0 + b.abs());
            assert!(
                (*a as f64 - b).abs() < tol,
                "{what}[{n}]: {a} vs reference {b}"
            );
        }
    }

    struct Case {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        dout: Vec<f32>,
        seqs: Vec<(usize, usize)>,
        t: usize,
        sh: AttentionShape,
    }

    impl Case {
        fn new(lens: &[usize], n_heads: usize, n_kv_heads: usize, d: usize, seed: u64) -> Self {
            let mut r = SplitMix::new(seed);
            let mut seqs = Vec::new();
            let mut t = 0;
            for &l in lens {
                seqs.push((t, t + l));
                t += l;
            }
            let mut fill =
                |n: usize| -> Vec<f32> { (0..n).map(|_| r.next_normal() as f32).collect() };
            let (qf, kf) = (n_heads * d, n_kv_heads * d);
            Case {
                q: fill(t * qf),
                k: fill(t * kf),
                v: fill(t * kf),
                dout: fill(t * qf),
                seqs,
                t,
                sh: AttentionShape {
                    n_heads,
                    n_kv_heads,
                    head_dim: d,
                    scale: 1.0 / (d as f32).sqrt(),
                },
            }
        }

        fn packed(&self) -> Packed<'_> {
            Packed {
                q: &self.q,
                k: &self.k,
                v: &self.v,
                sh: self.sh,
            }
        }

        /// The tiled forward and backward: `(out, lse, dq, dk, dv)`.
        fn run(&self) -> [Vec<f32>; 5] {
            let (out, lse) = forward(self.packed(), &self.seqs, self.t);
            let sv = Saved {
                out: &out,
                lse: &lse,
                dout: &self.dout,
            };
            let (dq, dk, dv) = backward(self.packed(), sv, &self.seqs, self.t);
            [out, lse, dq, dk, dv]
        }
    }

    #[test]
    fn tiled_attention_matches_naive_reference_with_gqa_and_odd_lengths() {
        for (lens, nh, nkv, d) in [
            (vec![1, 7, 65, 130], 4, 2, 16),
            (vec![130, 1, 7], 6, 2, 8),
            (vec![65], 3, 3, 5),
            (vec![1], 2, 1, 4),
        ] {
            let c = Case::new(&lens, nh, nkv, d, 11 + lens.len() as u64);
            let [out, lse, dq, dk, dv] = c.run();
            let (ro, rl) = reference_forward(c.packed(), &c.seqs, c.t);
            let (rq, rk, rv) = reference_backward(c.packed(), &c.dout, &c.seqs, c.t);
            let what = format!("lens {lens:?}, {nh}/{nkv} heads of {d}");
            close(&out, &ro, &format!("out, {what}"));
            close(&lse, &rl, &format!("lse, {what}"));
            close(&dq, &rq, &format!("dq, {what}"));
            close(&dk, &rk, &format!("dk, {what}"));
            close(&dv, &rv, &format!("dv, {what}"));
        }
    }

    #[test]
    fn tiled_attention_is_bitwise_identical_across_thread_counts() {
        let c = Case::new(&[130, 7, 65, 1], 4, 2, 16, 3);
        let runs: Vec<[Vec<f32>; 5]> = [1, 3]
            .iter()
            .map(|&n| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .expect("thread pool")
                    .install(|| c.run())
            })
            .collect();
        assert_eq!(runs[0], runs[1]);
    }
}
