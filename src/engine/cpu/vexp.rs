//! A vectorised `exp` and the element-wise kernels built on it: SwiGLU and its backward, the
//! exponentials of softmax rows. Every kernel is one loop of IEEE operations (fused multiply-adds,
//! no reassociation) that the compiler vectorises for AVX-512 or AVX2 where the CPU has them; the
//! portable build of the same loop gives the same bits, so a value depends only on its inputs.

use std::sync::OnceLock;

/// The instruction sets a kernel can be compiled for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Isa {
    Avx512,
    Avx2,
    Portable,
}

fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let fma = std::arch::is_x86_feature_detected!("fma");
            if fma && std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if fma && std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    })
}

/// Runs `$body`, a function of the listed arguments, compiled for the best instruction set of
/// this CPU.
macro_rules! dispatch {
    (( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)? $body:block) => {{
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn on_avx512($($arg: $ty),*) $(-> $ret)? $body
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn on_avx2($($arg: $ty),*) $(-> $ret)? $body
        #[inline(always)]
        fn portable($($arg: $ty),*) $(-> $ret)? $body
        match isa() {
            // SAFETY: the CPU has the enabled features (checked by `isa`).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { on_avx512($($arg),*) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { on_avx2($($arg),*) },
            _ => portable($($arg),*),
        }
    }};
}

/// Below this `exp` is taken as 0 (the result would be subnormal).
const EXP_LO: f32 = -87.33;
/// Above this `exp` is taken as infinite.
const EXP_HI: f32 = 88.72;
/// `1.5 * 2^23`: adding it rounds a float of magnitude below `2^22` to an integer, which then
/// sits in the low bits of the sum.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `exp(x)` within about 2 ulp for normal results (Cody-Waite reduction `x = n ln 2 + r`, the
/// Cephes polynomial for `exp(r)`, scaled by `2^n` through the exponent bits); 0 below
/// [`EXP_LO`], infinity above [`EXP_HI`], NaN for NaN.
#[inline(always)]
// `max`/`min` rather than `clamp`: a NaN becomes a number here and is restored at the end.
#[allow(clippy::manual_clamp)]
pub fn exp(x: f32) -> f32 {
    let xc = x.max(EXP_LO).min(88.0);
    let t = xc.mul_add(std::f32::consts::LOG2_E, ROUND_MAGIC);
    let n = t - ROUND_MAGIC;
    let r = n.mul_add(-0.693_359_4, xc);
    let r = n.mul_add(2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let y = (p * r).mul_add(r, r) + 1.0;
    let pow2 = f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23);
    let y = y * pow2;
    let y = if x < EXP_LO { 0.0 } else { y };
    let y = if x > EXP_HI { f32::INFINITY } else { y };
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// `x = exp(a * x - b)` for every element.
pub fn exp_affine(xs: &mut [f32], a: f32, b: f32) {
    dispatch!((xs: &mut [f32], a: f32, b: f32) {
        for x in xs.iter_mut() {
            *x = exp(*x * a - b);
        }
    })
}

/// `out = silu(g) * u = g / (1 + exp(-g)) * u`, element-wise.
pub fn swiglu(g: &[f32], u: &[f32], out: &mut [f32]) {
    dispatch!((g: &[f32], u: &[f32], out: &mut [f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + exp(-g)) * u;
        }
    })
}

/// Backward of [`swiglu`]: `du = dm silu(g)`, `dg = dm u sig(g) (1 + g (1 - sig(g)))`.
pub fn swiglu_backward(g: &[f32], u: &[f32], dm: &[f32], dg: &mut [f32], du: &mut [f32]) {
    dispatch!((g: &[f32], u: &[f32], dm: &[f32], dg: &mut [f32], du: &mut [f32]) {
        let n = g.len().min(u.len()).min(dm.len()).min(dg.len()).min(du.len());
        for i in 0..n {
            let sig = 1.0 / (1.0 + exp(-g[i]));
            let silu = g[i] * sig;
            du[i] = dm[i] * silu;
            dg[i] = dm[i] * u[i] * sig * (1.0 + g[i] * (1.0 - sig));
        }
    })
}

/// The maximum element (`-inf` when empty; NaN is skipped, as by `f32::max`).
pub fn max(xs: &[f32]) -> f32 {
    dispatch!((xs: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; LANES];
        let mut chunks = xs.chunks_exact(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                acc[l] = acc[l].max(c[l]);
            }
        }
        for (l, &x) in chunks.remainder().iter().enumerate() {
            acc[l] = acc[l].max(x);
        }
        acc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
    })
}

/// `x *= a` for every element; returns the maximum of the results (`-inf` when empty; NaN is
/// skipped, as by `f32::max`).
pub fn scale_max(xs: &mut [f32], a: f32) -> f32 {
    dispatch!((xs: &mut [f32], a: f32) -> f32 {
        let mut acc = [f32::NEG_INFINITY; LANES];
        let mut chunks = xs.chunks_exact_mut(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                c[l] *= a;
                acc[l] = acc[l].max(c[l]);
            }
        }
        for (l, x) in chunks.into_remainder().iter_mut().enumerate() {
            *x *= a;
            acc[l] = acc[l].max(*x);
        }
        acc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
    })
}

/// One row of the attention backward: `p = exp(p * scale - lse)` (the probabilities from the
/// saved log-sum-exp) and `ds = p (ds - d) scale` (the scores' gradient from `ds = dO V^T`).
pub fn softmax_grad_row(p: &mut [f32], ds: &mut [f32], scale: f32, lse: f32, d: f32) {
    dispatch!((p: &mut [f32], ds: &mut [f32], scale: f32, lse: f32, d: f32) {
        for (p, ds) in p.iter_mut().zip(ds.iter_mut()) {
            *p = exp(*p * scale - lse);
            *ds = *p * (*ds - d) * scale;
        }
    })
}

/// Lanes of the fixed-order partial sums of [`exp_shifted_sums`].
const LANES: usize = 16;

/// `z = exp(z - m)` for every element of a logits row (`m` its maximum), returning
/// `(sum e, sum e (z - m))` in f64, each summed in [`LANES`] lanes reduced in a fixed order
/// (an element with `e = 0` adds nothing to the second sum, so a `-inf` logit gives 0, not NaN).
pub fn exp_shifted_sums(row: &mut [f32], m: f32) -> (f64, f64) {
    dispatch!((row: &mut [f32], m: f32) -> (f64, f64) {
        let mut s = [0.0f64; LANES];
        let mut sz = [0.0f64; LANES];
        let mut chunks = row.chunks_exact_mut(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                let d = c[l] - m;
                let e = exp(d);
                s[l] += e as f64;
                sz[l] += if e > 0.0 { e as f64 * d as f64 } else { 0.0 };
                c[l] = e;
            }
        }
        for (l, z) in chunks.into_remainder().iter_mut().enumerate() {
            let d = *z - m;
            let e = exp(d);
            s[l] += e as f64;
            sz[l] += if e > 0.0 { e as f64 * d as f64 } else { 0.0 };
            *z = e;
        }
        (reduce(&s), reduce(&sz))
    })
}

/// Pairwise sum of the lanes in a fixed tree.
#[inline(always)]
fn reduce<T: Copy + std::ops::AddAssign>(a: &[T; LANES]) -> T {
    let mut w = *a;
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            w[i] += w[i + n];
        }
    }
    w[0]
}

/// `x = (x * inv) as f32` in f64 for every element.
pub fn scale_f64(xs: &mut [f32], inv: f64) {
    dispatch!((xs: &mut [f32], inv: f64) {
        for x in xs.iter_mut() {
            *x = (*x as f64 * inv) as f32;
        }
    })
}

/// Sum in [`LANES`] f32 lanes reduced in a fixed order.
pub fn sum(xs: &[f32]) -> f32 {
    dispatch!((xs: &[f32]) -> f32 {
        let mut acc = [0.0f32; LANES];
        let mut chunks = xs.chunks_exact(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                acc[l] += c[l];
            }
        }
        for (l, &x) in chunks.remainder().iter().enumerate() {
            acc[l] += x;
        }
        reduce(&acc)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_a_few_ulp_of_libm() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x), (x as f64).exp() as f32);
            worst = worst.max(ulps(got, want));
            x += 0.000_97;
        }
        assert!(worst <= 3, "worst {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn vector_kernels_match_the_scalar_formulas() {
        let n = 1000;
        let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 9.0).collect();
        let u: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() * 2.0).collect();
        let dm: Vec<f32> = (0..n).map(|i| (i as f32 * 0.05).sin()).collect();
        let mut out = vec![0.0; n];
        swiglu(&g, &u, &mut out);
        let (mut dg, mut du) = (vec![0.0; n], vec![0.0; n]);
        swiglu_backward(&g, &u, &dm, &mut dg, &mut du);
        for i in 0..n {
            let (g, u, dm) = (g[i] as f64, u[i] as f64, dm[i] as f64);
            let sig = 1.0 / (1.0 + (-g).exp());
            let close = |a: f32, b: f64| (a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs());
            assert!(close(out[i], g * sig * u), "swiglu {i}");
            assert!(close(du[i], dm * g * sig), "du {i}");
            assert!(
                close(dg[i], dm * u * sig * (1.0 + g * (1.0 - sig))),
                "dg {i}"
            );
        }
        let mut row: Vec<f32> = (0..77).map(|i| (i as f32 * 0.7).sin() * 5.0).collect();
        row[3] = f32::NEG_INFINITY;
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let want_s: f64 = row.iter().map(|&z| ((z - m) as f64).exp()).sum();
        let want_sz: f64 = row
            .iter()
            .filter(|z| z.is_finite())
            .map(|&z| ((z - m) as f64).exp() * (z - m) as f64)
            .sum();
        let (s, sz) = exp_shifted_sums(&mut row, m);
        assert!((s - want_s).abs() < 1e-6 * want_s);
        assert!((sz - want_sz).abs() < 1e-5 * (1.0 + want_sz.abs()));
        assert_eq!(row[3], 0.0);
        let xs: Vec<f32> = (0..37).map(|i| i as f32 * 0.5).collect();
        assert_eq!(sum(&xs), xs.iter().sum::<f32>());
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let xs: Vec<f32> = (0..4099).map(|i| (i as f32 * 0.013).sin() * 40.0).collect();
        let mut v = xs.clone();
        exp_affine(&mut v, 1.0, 0.0);
        for (x, e) in xs.iter().zip(&v) {
            assert_eq!(e.to_bits(), exp(*x).to_bits(), "x = {x}");
        }
    }
}
