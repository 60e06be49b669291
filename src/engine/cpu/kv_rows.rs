//! Decode attention's two passes over the rows of a KV cache, each as one call: the dots of a query
//! with `n` key rows, and the weighted sum of `n` value rows. They give the same bits as calling
//! [`dot`] once per key and [`axpy`] once per value (the same fused multiply-adds and additions in
//! the same order per output), so a decode step does not change when these kernels replace the
//! per-row calls; they only keep the accumulators in registers and work on four keys at a time.

#[cfg(target_arch = "x86_64")]
use super::simd::has_avx2_fma;
use super::simd::{axpy, dot};

/// The rows `base + j * stride .. + d` for `j < n` all lie inside `rows`.
fn rows_fit(rows: &[f32], base: usize, stride: usize, n: usize, d: usize) -> bool {
    n == 0
        || (n - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(base))
            .and_then(|x| x.checked_add(d))
            .is_some_and(|end| end <= rows.len())
}

/// Appends to `out`, for `j < n`, `dot(q, key_j) * scale` where key `j` is
/// `rows[base + j * stride..][..q.len()]`; each value has the bits of that expression.
pub fn dot_rows(
    q: &[f32],
    rows: &[f32],
    base: usize,
    stride: usize,
    n: usize,
    scale: f32,
    out: &mut Vec<f32>,
) {
    let d = q.len();
    #[cfg(target_arch = "x86_64")]
    if d > 0 && d % 16 == 0 && has_avx2_fma() && rows_fit(rows, base, stride, n, d) {
        out.reserve(n);
        // SAFETY: AVX2 and FMA are present; every key row lies inside `rows` and `d` is a
        // multiple of 16 (checked above).
        unsafe { dot_rows_avx2(q, rows, base, stride, n, scale, out) };
        return;
    }
    for j in 0..n {
        let at = base + j * stride;
        out.push(dot(q, &rows[at..at + d]) * scale);
    }
}

/// [`dot_rows`] of several queries (all of one length) over the same key rows: `out[i]` gets
/// query `i`'s values, each with the bits of [`dot_rows`] for that query alone.
pub fn dot_rows_multi(
    qs: &[&[f32]],
    rows: &[f32],
    base: usize,
    stride: usize,
    n: usize,
    scale: f32,
    out: &mut [Vec<f32>],
) {
    let d = qs.first().map_or(0, |q| q.len());
    #[cfg(target_arch = "x86_64")]
    if d > 0
        && d % 16 == 0
        && qs.iter().all(|q| q.len() == d)
        && out.len() >= qs.len()
        && has_avx2_fma()
        && rows_fit(rows, base, stride, n, d)
    {
        // SAFETY: AVX2 and FMA are present; every query has `d` floats, every key row lies inside
        // `rows` and `d` is a multiple of 16 (checked above).
        unsafe { dot_rows_multi_avx2(qs, d, rows, base, stride, n, scale, out) };
        return;
    }
    for (q, o) in qs.iter().zip(out.iter_mut()) {
        dot_rows(q, rows, base, stride, n, scale, o);
    }
}

/// `out += (p_j * inv) * value_j` for `j` in order, value `j` being
/// `rows[base + j * stride..][..out.len()]`: the bits of one [`axpy`] per value row in turn.
pub fn axpy_rows(out: &mut [f32], p: &[f32], inv: f32, rows: &[f32], base: usize, stride: usize) {
    let d = out.len();
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() && rows_fit(rows, base, stride, p.len(), d) {
        // SAFETY: AVX2 and FMA are present; every value row lies inside `rows` (checked above).
        unsafe { axpy_rows_avx2(out, p, inv, rows, base, stride) };
        return;
    }
    for (j, &pj) in p.iter().enumerate() {
        let at = base + j * stride;
        axpy(out, pj * inv, &rows[at..at + d]);
    }
}

/// Four keys at a time ([`dot4`]), the last few one by one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_rows_avx2(
    q: &[f32],
    rows: &[f32],
    base: usize,
    stride: usize,
    n: usize,
    scale: f32,
    out: &mut Vec<f32>,
) {
    let d = q.len();
    let rp = rows.as_ptr();
    let mut j = 0;
    while j + 4 <= n {
        let k: [*const f32; 4] = std::array::from_fn(|i| rp.add(base + (j + i) * stride));
        out.extend_from_slice(&dot4(q.as_ptr(), d, k, scale));
        j += 4;
    }
    while j < n {
        let at = base + j * stride;
        out.push(dot(q, &rows[at..at + d]) * scale);
        j += 1;
    }
}

/// [`dot_rows_avx2`] for several queries: each block of four keys is read from memory once and
/// serves every query from the L1 cache.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows_multi_avx2(
    qs: &[&[f32]],
    d: usize,
    rows: &[f32],
    base: usize,
    stride: usize,
    n: usize,
    scale: f32,
    out: &mut [Vec<f32>],
) {
    let rp = rows.as_ptr();
    let mut j = 0;
    while j + 4 <= n {
        let k: [*const f32; 4] = std::array::from_fn(|i| rp.add(base + (j + i) * stride));
        for (q, o) in qs.iter().zip(out.iter_mut()) {
            o.extend_from_slice(&dot4(q.as_ptr(), d, k, scale));
        }
        j += 4;
    }
    for (q, o) in qs.iter().zip(out.iter_mut()) {
        for jj in j..n {
            let at = base + jj * stride;
            o.push(dot(q, &rows[at..at + d]) * scale);
        }
    }
}

/// The dots of the `d` floats at `q` with those at each of the four `k`, times `scale` ([`dot`]'s
/// bits): per key two 8-lane accumulators (lanes `l` and `l + 8` of [`dot`]'s sixteen), added
/// pairwise, then summed lane by lane in order as [`dot`] reduces. `d` is a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot4(qp: *const f32, d: usize, k: [*const f32; 4], scale: f32) -> [f32; 4] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut c = 0;
    while c < d {
        let q0 = _mm256_loadu_ps(qp.add(c));
        let q1 = _mm256_loadu_ps(qp.add(c + 8));
        for i in 0..4 {
            acc[i][0] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k[i].add(c)), acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(k[i].add(c + 8)), acc[i][1]);
        }
        c += 16;
    }
    let t: [__m256; 4] = std::array::from_fn(|i| _mm256_add_ps(acc[i][0], acc[i][1]));
    // Transpose: lane i of `cols[l]` is lane l of key i's pairwise sums.
    let a = _mm256_unpacklo_ps(t[0], t[1]);
    let b = _mm256_unpackhi_ps(t[0], t[1]);
    let e = _mm256_unpacklo_ps(t[2], t[3]);
    let f = _mm256_unpackhi_ps(t[2], t[3]);
    let c04 = _mm256_shuffle_ps::<0x44>(a, e);
    let c15 = _mm256_shuffle_ps::<0xEE>(a, e);
    let c26 = _mm256_shuffle_ps::<0x44>(b, f);
    let c37 = _mm256_shuffle_ps::<0xEE>(b, f);
    let cols = [
        _mm256_castps256_ps128(c04),
        _mm256_castps256_ps128(c15),
        _mm256_castps256_ps128(c26),
        _mm256_castps256_ps128(c37),
        _mm256_extractf128_ps::<1>(c04),
        _mm256_extractf128_ps::<1>(c15),
        _mm256_extractf128_ps::<1>(c26),
        _mm256_extractf128_ps::<1>(c37),
    ];
    let mut s = _mm_setzero_ps();
    for col in cols {
        s = _mm_add_ps(s, col);
    }
    s = _mm_mul_ps(s, _mm_set1_ps(scale));
    let mut four = [0.0f32; 4];
    _mm_storeu_ps(four.as_mut_ptr(), s);
    four
}

/// Output lanes in blocks of 64 (eight registers) held across all value rows, then blocks of 8,
/// then single lanes; each lane takes the same fused multiply-adds in the same order as [`axpy`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_rows_avx2(
    out: &mut [f32],
    p: &[f32],
    inv: f32,
    rows: &[f32],
    base: usize,
    stride: usize,
) {
    use std::arch::x86_64::*;
    let d = out.len();
    let op = out.as_mut_ptr();
    let rp = rows.as_ptr().add(base);
    let mut c = 0;
    while c + 64 <= d {
        let mut acc: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(op.add(c + 8 * i)));
        for (j, &pj) in p.iter().enumerate() {
            let alpha = _mm256_set1_ps(pj * inv);
            let v = rp.add(j * stride + c);
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(alpha, _mm256_loadu_ps(v.add(8 * i)), *a);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(op.add(c + 8 * i), *a);
        }
        c += 64;
    }
    while c + 8 <= d {
        let mut a = _mm256_loadu_ps(op.add(c));
        for (j, &pj) in p.iter().enumerate() {
            a = _mm256_fmadd_ps(
                _mm256_set1_ps(pj * inv),
                _mm256_loadu_ps(rp.add(j * stride + c)),
                a,
            );
        }
        _mm256_storeu_ps(op.add(c), a);
        c += 8;
    }
    for (l, o) in out.iter_mut().enumerate().skip(c) {
        for (j, &pj) in p.iter().enumerate() {
            *o = (pj * inv).mul_add(*rp.add(j * stride + l), *o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rng::SplitMix;

    fn filled(r: &mut SplitMix, n: usize) -> Vec<f32> {
        (0..n).map(|_| r.next_f64() as f32 * 2.0 - 1.0).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every head size and key count (blocks of four and the tail) gives the bits of one `dot` /
    /// `axpy` per row.
    #[test]
    fn row_kernels_match_one_call_per_row_bit_for_bit() {
        let mut r = SplitMix::new(7);
        for d in [16usize, 24, 64, 72, 128, 136, 5] {
            for n in [0usize, 1, 3, 4, 5, 9, 37] {
                let stride = d * 3 + 1;
                let base = 2;
                let rows = filled(&mut r, base + n * stride + d);
                let q = filled(&mut r, d);
                let mut got = vec![9.0];
                dot_rows(&q, &rows, base, stride, n, 0.125, &mut got);
                let mut want = vec![9.0];
                for j in 0..n {
                    let at = base + j * stride;
                    want.push(dot(&q, &rows[at..at + d]) * 0.125);
                }
                assert_eq!(bits(&got), bits(&want), "dots d={d} n={n}");
                let q2 = filled(&mut r, d);
                let mut both = vec![vec![9.0], Vec::new()];
                dot_rows_multi(&[&q, &q2], &rows, base, stride, n, 0.125, &mut both);
                let mut second = Vec::new();
                dot_rows(&q2, &rows, base, stride, n, 0.125, &mut second);
                assert_eq!(
                    bits(&both[0]),
                    bits(&want),
                    "first of two queries d={d} n={n}"
                );
                assert_eq!(bits(&both[1]), bits(&second), "second of two d={d} n={n}");

                let p: Vec<f32> = (0..n).map(|_| r.next_f64() as f32).collect();
                let start = filled(&mut r, d);
                let mut got = start.clone();
                axpy_rows(&mut got, &p, 0.37, &rows, base, stride);
                let mut want = start;
                for (j, &pj) in p.iter().enumerate() {
                    let at = base + j * stride;
                    axpy(&mut want, pj * 0.37, &rows[at..at + d]);
                }
                assert_eq!(bits(&got), bits(&want), "sums d={d} n={n}");
            }
        }
    }
}
