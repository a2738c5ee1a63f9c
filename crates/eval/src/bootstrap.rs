//! Percentile bootstrap confidence intervals. Seeded, so a report is reproducible: the same
//! values, resamples and seed give the same interval on every machine.

use serde::Serialize;

/// How intervals are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bootstrap {
    pub resamples: usize,
    pub seed: u64,
    /// Coverage in percent (95 for a 95% interval).
    pub level_percent: u32,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Bootstrap {
            resamples: 1_000,
            seed: 0x5EED_2026,
            level_percent: 95,
        }
    }
}

/// A figure with its confidence interval over `n` observations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Estimate {
    pub value: f64,
    pub lo: f64,
    pub hi: f64,
    pub n: usize,
}

/// SplitMix64: small, fast and good enough to draw resample indices.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0); Lemire's multiply-shift, bias negligible for n ≪ 2^64.
    fn below(&mut self, n: usize) -> usize {
        ((self.next() as u128 * n as u128) >> 64) as usize
    }
}

/// The mean of `values` with a percentile bootstrap interval; `None` when there are no values.
pub fn mean(values: &[f64], b: &Bootstrap) -> Option<Estimate> {
    if values.is_empty() {
        return None;
    }
    let n = values.len();
    let value = values.iter().sum::<f64>() / n as f64;
    let resamples = b.resamples.max(1);
    let mut rng = SplitMix(b.seed ^ (n as u64).rotate_left(32));
    let mut means: Vec<f64> = (0..resamples)
        .map(|_| (0..n).map(|_| values[rng.below(n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    let tail = (100.0 - f64::from(b.level_percent.min(100))) / 200.0;
    Some(Estimate {
        value,
        lo: quantile(&means, tail),
        hi: quantile(&means, 1.0 - tail),
        n,
    })
}

/// The share of `true` with a percentile bootstrap interval; `None` when empty.
pub fn proportion(hits: &[bool], b: &Bootstrap) -> Option<Estimate> {
    let values: Vec<f64> = hits.iter().map(|&h| if h { 1.0 } else { 0.0 }).collect();
    mean(&values, b)
}

/// Linear interpolation between order statistics of sorted data (the "type 7" definition).
fn quantile(sorted: &[f64], p: f64) -> f64 {
    let pos = p.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (i, frac) = (pos.floor() as usize, pos.fract());
    match sorted.get(i + 1) {
        Some(next) => sorted[i] + frac * (next - sorted[i]),
        None => sorted[i],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_input_has_no_estimate() {
        assert_eq!(proportion(&[], &Bootstrap::default()), None);
    }

    #[test]
    fn constant_data_has_a_degenerate_interval() {
        let e = proportion(&[true; 20], &Bootstrap::default()).unwrap();
        assert_eq!((e.value, e.lo, e.hi, e.n), (1.0, 1.0, 1.0, 20));
    }

    #[test]
    fn interval_contains_the_estimate_and_is_reproducible() {
        let hits: Vec<bool> = (0..40).map(|i| i % 4 != 0).collect(); // 30 of 40
        let b = Bootstrap::default();
        let e = proportion(&hits, &b).unwrap();
        assert_eq!(e.value, 0.75);
        assert!(e.lo < 0.75 && 0.75 < e.hi, "{e:?}");
        // Binomial standard error ≈ 0.068: the 95% interval is about ±0.13.
        assert!(e.lo > 0.55 && e.hi < 0.92, "{e:?}");
        assert_eq!(proportion(&hits, &b), Some(e));
        let other = proportion(&hits, &Bootstrap { seed: 1, ..b }).unwrap();
        assert_eq!(other.value, e.value);
    }

    #[test]
    fn wider_level_gives_a_wider_interval() {
        let values: Vec<f64> = (0..30).map(|i| (i % 7) as f64).collect();
        let b95 = Bootstrap::default();
        let b50 = Bootstrap {
            level_percent: 50,
            ..b95
        };
        let (w, n) = (mean(&values, &b95).unwrap(), mean(&values, &b50).unwrap());
        assert!(w.hi - w.lo > n.hi - n.lo);
        assert!((w.value - 85.0 / 30.0).abs() < 1e-12);
    }

    #[test]
    fn quantiles_interpolate() {
        let data = [0.0, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&data, 0.5), 2.0);
        assert_eq!(quantile(&data, 0.125), 0.5);
        assert_eq!(quantile(&data, 1.0), 4.0);
    }
}
