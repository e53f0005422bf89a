//! Latency summaries: nearest-rank percentiles over samples kept in full.
//!
//! Runs are bounded (a few thousand messages), so every sample is kept and sorted;
//! no histogram approximation is needed.

use serde::Serialize;

/// A summary of latency samples, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    /// How many samples the summary is over.
    pub samples: usize,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
    /// Arithmetic mean.
    pub mean_ms: f64,
}

impl Latency {
    /// Summarizes samples given in nanoseconds (any order).
    pub fn from_nanos(mut v: Vec<u64>) -> Latency {
        if v.is_empty() {
            return Latency::default();
        }
        v.sort_unstable();
        let ms = |n: u64| n as f64 / 1e6;
        let sum: u128 = v.iter().map(|&n| n as u128).sum();
        Latency {
            samples: v.len(),
            p50_ms: ms(percentile(&v, 50.0)),
            p90_ms: ms(percentile(&v, 90.0)),
            p99_ms: ms(percentile(&v, 99.0)),
            max_ms: ms(*v.last().expect("non-empty")),
            mean_ms: sum as f64 / v.len() as f64 / 1e6,
        }
    }
}

/// Nearest-rank percentile of sorted samples (0 for none).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median of a few values (start-up times), 0 for none.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Largest of a few values, 0 for none.
pub fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// Smallest of a few values, 0 for none.
pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().reduce(f64::min).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        let l = Latency::from_nanos(vec![3_000_000, 1_000_000, 2_000_000]);
        assert_eq!(l.samples, 3);
        assert_eq!(l.p50_ms, 2.0);
        assert_eq!(l.max_ms, 3.0);
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
    }
}
