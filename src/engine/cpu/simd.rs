//! Vector kernels with run-time CPU dispatch: AVX2+FMA code where the processor has it, portable
//! code otherwise. The summation order is fixed, so a result depends only on its inputs.

use std::sync::OnceLock;

/// Whether this CPU runs AVX2 and FMA code (checked once).
pub(crate) fn has_avx2_fma() -> bool {
    static FLAG: OnceLock<bool> = OnceLock::new();
    *FLAG.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

#[inline(always)]
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 16];
    let ca = a.chunks_exact(16);
    let cb = b.chunks_exact(16);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    let mut s = 0.0f32;
    for l in 0..8 {
        s += acc[l] + acc[l + 8];
    }
    for (x, y) in ra.iter().zip(rb) {
        s = x.mul_add(*y, s);
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_portable(a, b)
}

/// Dot product of two equally long slices (extra elements of the longer one are ignored).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { dot_avx2(a, b) };
    }
    dot_portable(a, b)
}

#[inline(always)]
fn axpy_portable(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = alpha.mul_add(x, *y);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(y: &mut [f32], alpha: f32, x: &[f32]) {
    axpy_portable(y, alpha, x)
}

/// `y += alpha * x`.
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { axpy_avx2(y, alpha, x) };
    }
    axpy_portable(y, alpha, x)
}

/// Dots of `R` rows of `x` with `C` rows of `w` (all of length `k`): `out[r][c] = x_r . w_c`.
/// Each dot is accumulated in eight lanes over `k` in steps of eight, then reduced in a fixed
/// order, so its value does not depend on `R`, `C` or the neighbouring rows.
#[inline]
pub fn dot_block<const R: usize, const C: usize>(
    x: [&[f32]; R],
    w: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above).
        return unsafe { dot_block_avx2(x, w, k) };
    }
    dot_block_portable(x, w, k)
}

#[inline(always)]
fn reduce8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

#[inline(always)]
fn dot_block_portable<const R: usize, const C: usize>(
    x: [&[f32]; R],
    w: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    let mut acc = [[[0.0f32; 8]; C]; R];
    let full = k / 8 * 8;
    let mut p = 0;
    while p < full {
        for r in 0..R {
            for c in 0..C {
                for l in 0..8 {
                    acc[r][c][l] = x[r][p + l].mul_add(w[c][p + l], acc[r][c][l]);
                }
            }
        }
        p += 8;
    }
    let mut out = [[0.0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let mut s = reduce8(acc[r][c]);
            for q in full..k {
                s = x[r][q].mul_add(w[c][q], s);
            }
            out[r][c] = s;
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_block_avx2<const R: usize, const C: usize>(
    x: [&[f32]; R],
    w: [&[f32]; C],
    k: usize,
) -> [[f32; C]; R] {
    use std::arch::x86_64::*;
    let full = k / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut p = 0;
    while p < full {
        let mut wv = [_mm256_setzero_ps(); C];
        for c in 0..C {
            // SAFETY: p + 8 <= full <= k <= w[c].len() (checked by the caller's shape checks).
            wv[c] = _mm256_loadu_ps(w[c].as_ptr().add(p));
        }
        for r in 0..R {
            let xv = _mm256_loadu_ps(x[r].as_ptr().add(p));
            for c in 0..C {
                acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
            }
        }
        p += 8;
    }
    let mut out = [[0.0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][c]);
            let mut s = reduce8(lanes);
            for q in full..k {
                s = x[r][q].mul_add(w[c][q], s);
            }
            out[r][c] = s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_match_naive() {
        for n in [0usize, 1, 7, 16, 33, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.31).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.17).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-4, "n={n}");
            let mut y = b.clone();
            axpy(&mut y, 0.5, &a);
            for i in 0..n {
                assert!((y[i] - (b[i] + 0.5 * a[i])).abs() < 1e-6);
            }
        }
    }
}
