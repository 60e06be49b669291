//! Honest statistics for stage-to-stage comparisons: paired cluster bootstrap intervals, McNemar's exact
//! test for paired hit rates, and mean ± std over seeds.
//!
//! A *cluster* is one benchmark instance with all its subtask scores (file, function, line, edit…); the
//! bootstrap resamples whole instances, so correlated subtasks of one instance never count as independent
//! evidence.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use thiserror::Error;

/// Why a statistic could not be computed.
#[derive(Debug, Error, PartialEq)]
pub enum StatsError {
    /// The two sides of a paired comparison do not have the same instances or the same subtasks.
    #[error("paired samples differ in shape: {0}")]
    Unpaired(String),
    /// There is nothing to compare.
    #[error("no instances to compare")]
    Empty,
}

/// A point estimate with a two-sided confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Interval {
    /// The estimate on the full sample.
    pub estimate: f64,
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
}

impl Interval {
    /// True when the interval excludes zero (the delta is significant at the interval's level).
    pub fn excludes_zero(&self) -> bool {
        self.lo > 0.0 || self.hi < 0.0
    }
}

impl std::fmt::Display for Interval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:+.3} [{:+.3}, {:+.3}]",
            self.estimate, self.lo, self.hi
        )
    }
}

fn check_paired(a: &[Vec<f64>], b: &[Vec<f64>]) -> Result<(), StatsError> {
    if a.is_empty() {
        return Err(StatsError::Empty);
    }
    if a.len() != b.len() {
        return Err(StatsError::Unpaired(format!(
            "{} vs {} instances",
            a.len(),
            b.len()
        )));
    }
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        if x.len() != y.len() {
            return Err(StatsError::Unpaired(format!(
                "instance {i}: {} vs {} scores",
                x.len(),
                y.len()
            )));
        }
    }
    if a.iter().all(|c| c.is_empty()) {
        return Err(StatsError::Empty);
    }
    Ok(())
}

/// Mean of `b - a` over all scores of the chosen instances (`picks` indexes clusters, with repeats).
fn delta_over(a: &[Vec<f64>], b: &[Vec<f64>], picks: impl Iterator<Item = usize>) -> f64 {
    let (mut sum, mut n) = (0.0, 0usize);
    for i in picks {
        for (x, y) in a[i].iter().zip(&b[i]) {
            sum += y - x;
            n += 1;
        }
    }
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

/// Percentile of a sorted slice (nearest rank on the closed interval).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = (q * (sorted.len() - 1) as f64).round() as usize;
    sorted[pos.min(sorted.len() - 1)]
}

/// Paired cluster bootstrap of the mean difference `b - a`.
///
/// `a[i]` and `b[i]` are the scores of instance `i` under the two models (same subtasks in the same order).
/// Instances are resampled with replacement `resamples` times; the interval is the percentile interval at
/// `level` (e.g. 0.95). Deterministic in `seed`.
pub fn paired_cluster_bootstrap(
    a: &[Vec<f64>],
    b: &[Vec<f64>],
    resamples: usize,
    level: f64,
    seed: u64,
) -> Result<Interval, StatsError> {
    check_paired(a, b)?;
    let n = a.len();
    let estimate = delta_over(a, b, 0..n);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut deltas: Vec<f64> = (0..resamples.max(1))
        .map(|_| {
            let picks: Vec<usize> = (0..n).map(|_| rng.random_range(0..n)).collect();
            delta_over(a, b, picks.into_iter())
        })
        .collect();
    deltas.sort_by(f64::total_cmp);
    let tail = (1.0 - level.clamp(0.0, 1.0)) / 2.0;
    Ok(Interval {
        estimate,
        lo: percentile(&deltas, tail),
        hi: percentile(&deltas, 1.0 - tail),
    })
}

/// McNemar's exact test on paired binary outcomes (e.g. a hit per instance, before and after).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct McNemar {
    /// Instances the first model got right and the second wrong.
    pub lost: usize,
    /// Instances the first model got wrong and the second right.
    pub gained: usize,
    /// Two-sided exact binomial p-value over the discordant pairs (1.0 when there are none).
    pub p_value: f64,
}

/// McNemar's exact test of `before` against `after` (same instances, same order).
pub fn mcnemar(before: &[bool], after: &[bool]) -> Result<McNemar, StatsError> {
    if before.is_empty() {
        return Err(StatsError::Empty);
    }
    if before.len() != after.len() {
        return Err(StatsError::Unpaired(format!(
            "{} vs {} instances",
            before.len(),
            after.len()
        )));
    }
    let lost = before
        .iter()
        .zip(after)
        .filter(|(x, y)| **x && !**y)
        .count();
    let gained = before
        .iter()
        .zip(after)
        .filter(|(x, y)| !**x && **y)
        .count();
    Ok(McNemar {
        lost,
        gained,
        p_value: binomial_two_sided(lost.min(gained), lost + gained),
    })
}

/// Two-sided exact binomial p-value for `k` successes or fewer out of `n` at p = 1/2, doubled and capped.
fn binomial_two_sided(k: usize, n: usize) -> f64 {
    if n == 0 {
        return 1.0;
    }
    // log C(n, i) accumulated incrementally; sum in probability space with a log-sum-exp guard.
    let ln_half_n = n as f64 * 0.5f64.ln();
    let mut ln_c = 0.0f64;
    let mut terms = Vec::with_capacity(k + 1);
    for i in 0..=k {
        if i > 0 {
            ln_c += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        terms.push(ln_c + ln_half_n);
    }
    let max = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let tail = max.exp() * terms.iter().map(|t| (t - max).exp()).sum::<f64>();
    (2.0 * tail).min(1.0)
}

/// Mean and sample standard deviation (n - 1); std is 0 for a single value. `None` when empty.
pub fn mean_std(xs: &[f64]) -> Option<(f64, f64)> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() == 1 {
        return Some((mean, 0.0));
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    Some((mean, var.sqrt()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_detects_a_real_shift_and_not_noise() {
        // 60 instances, 4 subtasks each: b is a + 0.2 on every score -> interval around 0.2, excludes 0.
        let a: Vec<Vec<f64>> = (0..60)
            .map(|i| {
                (0..4)
                    .map(|j| ((i * 7 + j * 3) % 10) as f64 / 10.0)
                    .collect()
            })
            .collect();
        let b: Vec<Vec<f64>> = a
            .iter()
            .map(|c| c.iter().map(|x| x + 0.2).collect())
            .collect();
        let iv = paired_cluster_bootstrap(&a, &b, 500, 0.95, 1).unwrap();
        assert!((iv.estimate - 0.2).abs() < 1e-12);
        assert!(iv.excludes_zero());
        // Symmetric noise: half the instances gain 0.5, half lose 0.5 -> interval straddles 0.
        let c: Vec<Vec<f64>> = a
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.iter()
                    .map(|x| x + if i % 2 == 0 { 0.5 } else { -0.5 })
                    .collect()
            })
            .collect();
        let iv = paired_cluster_bootstrap(&a, &c, 500, 0.95, 1).unwrap();
        assert!(iv.estimate.abs() < 1e-12);
        assert!(!iv.excludes_zero(), "{iv}");
    }

    #[test]
    fn bootstrap_is_wider_for_clustered_than_for_independent_gains() {
        // One instance gains on all 8 subtasks vs 8 instances gaining on one subtask each: the clustered
        // gain is one piece of evidence, so its interval must be wider.
        let zeros = |n: usize, m: usize| vec![vec![0.0; m]; n];
        let a = zeros(16, 8);
        let mut clustered = zeros(16, 8);
        clustered[0] = vec![1.0; 8];
        let mut spread = zeros(16, 8);
        for (i, row) in spread.iter_mut().enumerate().take(8) {
            row[i] = 1.0;
        }
        let w = |iv: Interval| iv.hi - iv.lo;
        let ic = paired_cluster_bootstrap(&a, &clustered, 2000, 0.95, 3).unwrap();
        let is = paired_cluster_bootstrap(&a, &spread, 2000, 0.95, 3).unwrap();
        assert!((ic.estimate - is.estimate).abs() < 1e-12);
        assert!(w(ic) > w(is), "clustered {ic} vs spread {is}");
    }

    #[test]
    fn bootstrap_rejects_unpaired_input() {
        let a = vec![vec![0.0, 1.0]];
        assert!(matches!(
            paired_cluster_bootstrap(&a, &[vec![0.0]], 10, 0.95, 0),
            Err(StatsError::Unpaired(_))
        ));
        assert!(matches!(
            paired_cluster_bootstrap(&a, &[], 10, 0.95, 0),
            Err(StatsError::Unpaired(_))
        ));
        assert_eq!(
            paired_cluster_bootstrap(&[], &[], 10, 0.95, 0),
            Err(StatsError::Empty)
        );
    }

    #[test]
    fn mcnemar_matches_the_binomial() {
        // 10 discordant pairs, 1 lost 9 gained: p = 2 * (1 + 10) / 1024.
        let before: Vec<bool> = (0..30).map(|i| i == 0 || i >= 20).collect();
        let after: Vec<bool> = (0..30).map(|i| (1..10).contains(&i) || i >= 20).collect();
        let m = mcnemar(&before, &after).unwrap();
        assert_eq!((m.lost, m.gained), (1, 9));
        assert!((m.p_value - 22.0 / 1024.0).abs() < 1e-12, "{}", m.p_value);
        // Balanced discordance is not significant; no discordance gives p = 1.
        let m = mcnemar(&[true, false], &[false, true]).unwrap();
        assert_eq!(m.p_value, 1.0);
        assert_eq!(mcnemar(&[true; 5], &[true; 5]).unwrap().p_value, 1.0);
        // Large n stays finite and tiny.
        let before = vec![false; 2000];
        let after = vec![true; 2000];
        let p = mcnemar(&before, &after).unwrap().p_value;
        assert!(p < 1e-100);
    }

    #[test]
    fn mean_std_of_seeds() {
        assert_eq!(mean_std(&[]), None);
        assert_eq!(mean_std(&[2.0]), Some((2.0, 0.0)));
        let (m, s) = mean_std(&[1.0, 2.0, 3.0]).unwrap();
        assert!((m - 2.0).abs() < 1e-12 && (s - 1.0).abs() < 1e-12);
    }
}
