//! The statistics `sluice compare` and `sluice bench` share: quantiles by
//! linear interpolation between order statistics, two-cluster detection,
//! and the median of paired differences with a seeded percentile bootstrap
//! confidence interval. Pure functions of the numbers given: nothing here
//! reads records, files or clocks, and the same input (and seed) always
//! gives the same answer.
//!
//! Two clusters: sorted values are split at the widest gap in log space
//! that leaves at least [`CLUSTER_MIN_FRACTION`] of the samples on each
//! side; it is two clusters when that gap is at least [`CLUSTER_MIN_GAP`]
//! (upper / lower neighbour) and the two clusters' medians differ by
//! [`CLUSTER_MIN_RATIO`], because then one median would describe neither.
//!
//! Paired difference: given d_i (one per pair, e.g. per batch or round),
//! the median of the d_i with a 95% percentile bootstrap interval
//! ([`BOOTSTRAP_RESAMPLES`] resamples of the d_i, ChaCha8 seeded). It needs
//! two pairs or more.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub(crate) const BOOTSTRAP_RESAMPLES: usize = 5000;
/// The seed `sluice compare` always uses (`sluice bench` takes `--seed`).
pub(crate) const BOOTSTRAP_SEED: u64 = 0x0051_1CE0_5EED;
pub(crate) const CLUSTER_MIN_FRACTION: f64 = 0.10;
pub(crate) const CLUSTER_MIN_GAP: f64 = 2.0;
pub(crate) const CLUSTER_MIN_RATIO: f64 = 3.0;

/// Quantile `q` of sorted values, interpolating between order statistics.
pub(crate) fn quantile_sorted(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

/// Quantile `q` of unsorted values.
pub(crate) fn quantile(v: &[f64], q: f64) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    quantile_sorted(&s, q)
}

/// Median of unsorted values.
pub(crate) fn median(v: &[f64]) -> Option<f64> {
    quantile(v, 0.5)
}

/// Count and median of one cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cluster {
    pub count: usize,
    pub median_us: f64,
}

/// The two clusters of sorted values, if they have two (module docs). The
/// values may be in any unit; `median_us` is in the same one.
pub fn two_clusters(sorted: &[f64]) -> Option<[Cluster; 2]> {
    let n = sorted.len();
    let min_side = ((n as f64) * CLUSTER_MIN_FRACTION).ceil().max(1.0) as usize;
    if n < 2 * min_side || n < 4 {
        return None;
    }
    let log = |x: f64| x.max(1.0).ln();
    let (mut best, mut best_gap) = (0, f64::NEG_INFINITY);
    for i in min_side..=(n - min_side) {
        let gap = log(sorted[i]) - log(sorted[i - 1]);
        if gap > best_gap {
            best_gap = gap;
            best = i;
        }
    }
    if best_gap < CLUSTER_MIN_GAP.ln() {
        return None;
    }
    let (lower, upper) = sorted.split_at(best);
    let (ml, mu) = (quantile_sorted(lower, 0.5)?, quantile_sorted(upper, 0.5)?);
    if mu < CLUSTER_MIN_RATIO * ml.max(1.0) {
        return None;
    }
    Some([
        Cluster {
            count: lower.len(),
            median_us: ml,
        },
        Cluster {
            count: upper.len(),
            median_us: mu,
        },
    ])
}

/// Median of paired differences, with its 95% bootstrap CI.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairedDiff {
    pub pairs: usize,
    pub median_diff_us: f64,
    pub ci_low_us: f64,
    pub ci_high_us: f64,
}

impl PairedDiff {
    /// Whether the interval leaves zero out (a difference, not noise).
    #[cfg(any(test, feature = "bench"))]
    pub(crate) fn excludes_zero(&self) -> bool {
        self.ci_low_us > 0.0 || self.ci_high_us < 0.0
    }
}

/// The median of `diffs` and its 95% percentile bootstrap interval, drawn
/// with ChaCha8 seeded with `seed`; None for fewer than two pairs.
pub(crate) fn paired_median_ci(diffs: &[f64], seed: u64) -> Option<PairedDiff> {
    if diffs.len() < 2 {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut sample = vec![0.0; diffs.len()];
    let mut medians = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    for _ in 0..BOOTSTRAP_RESAMPLES {
        for s in sample.iter_mut() {
            *s = diffs[rng.random_range(0..diffs.len())];
        }
        sample.sort_by(f64::total_cmp);
        medians.push(quantile_sorted(&sample, 0.5)?);
    }
    medians.sort_by(f64::total_cmp);
    Some(PairedDiff {
        pairs: diffs.len(),
        median_diff_us: median(diffs)?,
        ci_low_us: quantile_sorted(&medians, 0.025)?,
        ci_high_us: quantile_sorted(&medians, 0.975)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_order_statistics() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile_sorted(&v, 0.5), Some(2.5));
        assert_eq!(quantile_sorted(&v, 0.0), Some(1.0));
        assert_eq!(quantile_sorted(&v, 1.0), Some(4.0));
        assert_eq!(quantile(&[4.0, 1.0, 3.0, 2.0], 0.5), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn the_paired_interval_is_reproducible_and_brackets_the_median() {
        let diffs: Vec<f64> = (0..30).map(|i| 100.0 + (i % 7) as f64).collect();
        let a = paired_median_ci(&diffs, 7).unwrap();
        let b = paired_median_ci(&diffs, 7).unwrap();
        assert_eq!(a, b);
        assert!(a.ci_low_us <= a.median_diff_us && a.median_diff_us <= a.ci_high_us);
        assert!(a.excludes_zero());
        assert_eq!(a.pairs, 30);
        assert!(paired_median_ci(&[1.0], 7).is_none());
    }

    #[test]
    fn an_interval_around_zero_does_not_exclude_it() {
        let diffs = [-3.0, -1.0, 0.0, 1.0, 2.0, -2.0, 3.0, 0.5];
        assert!(!paired_median_ci(&diffs, 1).unwrap().excludes_zero());
    }
}
