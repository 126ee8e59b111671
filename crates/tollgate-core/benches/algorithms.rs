//! Nanoseconds per decision for each algorithm, on a fixed (manual) clock.
//!
//! Two paths per algorithm, both through `Limit::check` (the enum dispatch the stores use):
//! - `allowed`: a steady stream at half the quota's rate, so every request is admitted and
//!   charged and the state stays in a steady shape (the sliding log holds about
//!   `limit / 2` entries, pruning one and pushing one per request);
//! - `denied`: the quota is exhausted and time stands still, so every request is denied with a
//!   retry time and nothing is written;
//! - `long_log`: the sliding log's `allowed` path at limits of 1,000 to 100,000 a second
//!   (`limit / 2` entries in the window): what one admitted request costs as the log grows.
//!
//! Run: `cargo bench -p tollgate-core --bench algorithms -- --quick`.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use std::hint::black_box;
use std::time::Duration;
use tollgate_core::{Algorithm, Limit, Micros, Quota};

/// 1000 units per second (one every 1 ms), burst = limit.
fn limit(algorithm: Algorithm) -> Limit {
    let quota = Quota::new(1_000, Duration::from_secs(1)).expect("a valid quota");
    Limit::new(algorithm, quota).expect("valid for every algorithm")
}

/// A wall-clock-like start, aligned to the period.
const START: Micros = 1_700_000_000_000_000;

/// Admissions of one unit every other emission interval of `limit`, as `name` in `group`,
/// after two windows of them warmed the state into its steady shape.
fn admissions(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, limit: &Limit) {
    let step = 2 * limit.quota().emission_interval_micros();
    let mut state = limit.fresh();
    let mut now = START;
    for _ in 0..2 * limit.quota().limit() {
        now += step;
        assert!(limit.check(&mut state, now, 1, true).allowed);
    }
    group.bench_function(name, |b| {
        b.iter(|| {
            now += step;
            let d = limit.check(black_box(&mut state), black_box(now), 1, true);
            debug_assert!(d.allowed);
            d
        })
    });
}

fn allowed(c: &mut Criterion) {
    let mut group = c.benchmark_group("allowed");
    for algorithm in Algorithm::ALL {
        admissions(&mut group, algorithm.name(), &limit(algorithm));
    }
    group.finish();
}

fn denied(c: &mut Criterion) {
    let mut group = c.benchmark_group("denied");
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm);
        let mut state = limit.fresh();
        let now = START + 500_000;
        // Spread the admissions over the window so the log has many entries to scan.
        let mut t = START;
        while limit.check(&mut state, t, 1, true).allowed {
            t = (t + 400).min(now);
        }
        assert!(!limit.check(&mut state, now, 1, true).allowed);
        group.bench_function(algorithm.name(), |b| {
            b.iter(|| limit.check(black_box(&mut state), black_box(now), 1, true))
        });
    }
    group.finish();
}

fn long_log(c: &mut Criterion) {
    let mut group = c.benchmark_group("long_log");
    for n in [1_000, 10_000, 100_000] {
        let quota = Quota::new(n, Duration::from_secs(1)).expect("a valid quota");
        let limit = Limit::new(Algorithm::SlidingWindowLog, quota).expect("a valid log");
        admissions(&mut group, &n.to_string(), &limit);
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = allowed, denied, long_log
}
criterion_main!(benches);
