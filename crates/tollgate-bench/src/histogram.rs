//! A log-bucketed latency histogram in the HDR style.
//!
//! Why not keep every sample: a bench may run for an hour at tens of thousands of requests per
//! second, so memory must not grow with the request count. Values below 128 get a bucket each;
//! above that every power of two is split into 64 buckets, so a bucket's width is at most 1/64
//! of its lower bound (about 1.6 %), whatever the magnitude. Quantiles answer the upper bound
//! of the bucket holding the requested rank (never an optimistic value), clamped to the largest
//! value recorded.

/// Values below this get one bucket each.
const LINEAR: u64 = 128;
/// Buckets per power of two above `LINEAR`.
const SUB_BUCKETS: u64 = 64;
/// log2 of `SUB_BUCKETS`.
const SUB_BITS: u32 = 6;

/// Counts of values (microseconds in this tool) in log-sized buckets.
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    min: u64,
    max: u64,
}

/// The bucket index of `value`.
fn index_of(value: u64) -> usize {
    if value < LINEAR {
        return value as usize;
    }
    let msb = 63 - value.leading_zeros();
    let shift = msb - SUB_BITS;
    let top = value >> shift; // in [64, 128)
    (LINEAR + u64::from(shift - 1) * SUB_BUCKETS + (top - SUB_BUCKETS)) as usize
}

/// The largest value that lands in bucket `index`.
fn upper_bound_of(index: usize) -> u64 {
    let index = index as u64;
    if index < LINEAR {
        return index;
    }
    let shift = (index - LINEAR) / SUB_BUCKETS + 1;
    let top = (index - LINEAR) % SUB_BUCKETS + SUB_BUCKETS;
    let upper = u128::from(top + 1) << shift;
    u64::try_from(upper - 1).unwrap_or(u64::MAX)
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one value.
    pub fn record(&mut self, value: u64) {
        let index = index_of(value);
        if self.counts.len() <= index {
            self.counts.resize(index + 1, 0);
        }
        self.counts[index] += 1;
        if self.total == 0 || value < self.min {
            self.min = value;
        }
        self.max = self.max.max(value);
        self.total += 1;
        self.sum += u128::from(value);
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The smallest value recorded (0 when empty).
    pub fn min(&self) -> u64 {
        self.min
    }

    /// The largest value recorded (0 when empty).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The exact mean of the recorded values (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        self.sum as f64 / self.total as f64
    }

    /// The value at quantile `q` (0.0..=1.0): the upper bound of the bucket that holds rank
    /// `ceil(q * count)`, at most the maximum recorded. 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let q = q.clamp(0.0, 1.0);
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (index, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return upper_bound_of(index).clamp(self.min, self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_lands_in_a_bucket_whose_bounds_contain_it() {
        let mut value = 0u64;
        while value < u64::MAX / 3 {
            let index = index_of(value);
            assert!(value <= upper_bound_of(index), "value {value}");
            if index > 0 {
                assert!(value > upper_bound_of(index - 1), "value {value}");
            }
            value += value / 4 + 1;
        }
        assert_eq!(upper_bound_of(index_of(u64::MAX)), u64::MAX);
    }

    #[test]
    fn bucket_width_is_within_two_percent_of_the_value() {
        for value in [128u64, 1_000, 12_345, 999_999, 3_600_000_000] {
            let upper = upper_bound_of(index_of(value));
            let error = (upper - value) as f64 / value as f64;
            assert!(error <= 1.0 / 64.0, "value {value}: upper {upper}");
        }
    }

    #[test]
    fn small_values_are_exact() {
        let mut histogram = Histogram::new();
        for value in 1..=100 {
            histogram.record(value);
        }
        assert_eq!(histogram.quantile(0.5), 50);
        assert_eq!(histogram.quantile(0.9), 90);
        assert_eq!(histogram.quantile(0.99), 99);
        assert_eq!(histogram.quantile(1.0), 100);
        assert_eq!(histogram.quantile(0.0), 1);
        assert_eq!(histogram.min(), 1);
        assert_eq!(histogram.max(), 100);
        assert!((histogram.mean() - 50.5).abs() < 1e-9);
    }

    #[test]
    fn quantiles_match_sorted_samples_within_bucket_precision() {
        // A deterministic spread over six orders of magnitude.
        let mut samples: Vec<u64> = (0..10_000u64)
            .map(|i| (i * 7919 % 10_007) * (1 + i % 97) * 3 + 1)
            .collect();
        let mut histogram = Histogram::new();
        for value in &samples {
            histogram.record(*value);
        }
        samples.sort_unstable();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let rank = (q * samples.len() as f64).ceil() as usize;
            let exact = samples[rank - 1];
            let estimate = histogram.quantile(q);
            assert!(estimate >= exact, "q {q}: {estimate} < {exact}");
            assert!(
                (estimate - exact) as f64 <= exact as f64 / 64.0,
                "q {q}: {estimate} vs {exact}"
            );
        }
    }

    #[test]
    fn an_empty_histogram_answers_zero() {
        let histogram = Histogram::new();
        assert_eq!(histogram.quantile(0.99), 0);
        assert_eq!(histogram.count(), 0);
        assert_eq!(histogram.mean(), 0.0);
    }
}
