//! Quantiles from the store latency histogram, the way Prometheus' `histogram_quantile`
//! estimates them: find the bucket holding the rank, interpolate linearly inside it.

use tollgate::metrics::LATENCY_BUCKETS;

/// The `q` quantile (0..=1) in milliseconds of `count` observations spread over `buckets`
/// (per-bucket counts for [`LATENCY_BUCKETS`]; observations above the last bound are in
/// `count` only). `None` without observations. A rank above the last bound reports the last
/// bound, as `histogram_quantile` does.
pub fn quantile_ms(buckets: &[u64; LATENCY_BUCKETS.len()], count: u64, q: f64) -> Option<f64> {
    if count == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * count as f64;
    let mut below = 0u64;
    let mut lower_us = 0u64;
    for (&n, upper) in buckets.iter().zip(LATENCY_BUCKETS) {
        let upper_us = u64::try_from(upper.as_micros()).unwrap_or(u64::MAX);
        let through = below + n;
        if n > 0 && through as f64 >= rank {
            let inside = (rank - below as f64) / n as f64;
            let us = lower_us as f64 + (upper_us - lower_us) as f64 * inside;
            return Some(round_ms(us));
        }
        below = through;
        lower_us = upper_us;
    }
    Some(round_ms(lower_us as f64))
}

/// Microseconds to milliseconds, to the microsecond.
fn round_ms(us: f64) -> f64 {
    us.round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(points: &[(u64, u64)]) -> ([u64; LATENCY_BUCKETS.len()], u64) {
        let mut b = [0; LATENCY_BUCKETS.len()];
        let mut count = 0;
        for &(us, n) in points {
            count += n;
            let d = std::time::Duration::from_micros(us);
            if let Some(i) = LATENCY_BUCKETS.iter().position(|&u| d <= u) {
                b[i] += n;
            }
        }
        (b, count)
    }

    #[test]
    fn no_observations_no_quantile() {
        let (b, c) = hist(&[]);
        assert_eq!(quantile_ms(&b, c, 0.5), None);
    }

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        // 100 calls in (40, 50] us: the median is halfway, 45 us.
        let (b, c) = hist(&[(45, 100)]);
        assert_eq!(quantile_ms(&b, c, 0.5), Some(0.045));
        // 99 fast calls and one in (1, 1.5] ms: p99 is still in the fast bucket, p100 not.
        let (b, c) = hist(&[(45, 99), (1_200, 1)]);
        assert_eq!(quantile_ms(&b, c, 0.99), Some(0.05));
        assert_eq!(quantile_ms(&b, c, 1.0), Some(1.5));
    }

    #[test]
    fn ranks_beyond_the_last_bucket_report_the_last_bound() {
        let (b, c) = hist(&[(5_000_000, 10)]);
        assert_eq!(quantile_ms(&b, c, 0.5), Some(1_000.0));
    }
}
