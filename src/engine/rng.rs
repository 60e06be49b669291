//! Counter-based random numbers: a value depends only on (seed, stream, counter), so results do not
//! depend on batch composition, thread count or backend. The same mixing runs in the CUDA kernels.

/// The splitmix64 finaliser: a bijective 64-bit mix with good avalanche.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A 64-bit random word for (seed, stream, counter).
#[inline]
pub fn random_u64(seed: u64, stream: u64, counter: u64) -> u64 {
    mix64(mix64(seed ^ mix64(stream)) ^ counter.wrapping_mul(0xD6E8_FEB8_6659_FD93))
}

/// A uniform double in [0, 1) for (seed, stream, counter), with 53 random bits.
#[inline]
pub fn uniform(seed: u64, stream: u64, counter: u64) -> f64 {
    (random_u64(seed, stream, counter) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A small sequential generator for host-side choices (initialisation, shuffles), seeded explicitly.
#[derive(Clone, Debug)]
pub struct SplitMix {
    state: u64,
}

impl SplitMix {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64-bit word.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state.wrapping_sub(0x9E37_79B9_7F4A_7C15))
    }

    /// A uniform double in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A standard normal sample (Box-Muller).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// A uniform integer in [0, n); `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        // Lemire's multiply-shift; the bias is below 2^-64 * n, irrelevant here.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_in_range_and_depends_on_every_input() {
        let a = uniform(1, 2, 3);
        assert!((0.0..1.0).contains(&a));
        assert_ne!(a, uniform(2, 2, 3));
        assert_ne!(a, uniform(1, 3, 3));
        assert_ne!(a, uniform(1, 2, 4));
        assert_eq!(a, uniform(1, 2, 3));
    }

    #[test]
    fn uniform_mean_is_about_half() {
        let n = 100_000;
        let mean: f64 = (0..n).map(|i| uniform(7, 0, i)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn normal_has_unit_variance() {
        let mut r = SplitMix::new(3);
        let xs: Vec<f64> = (0..50_000).map(|_| r.next_normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "{mean} {var}"
        );
    }
}
