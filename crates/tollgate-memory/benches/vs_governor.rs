//! ns per check: the memory store against governor's `DefaultKeyedRateLimiter`, side by side,
//! on the same quota (GCRA, 1,000,000 per second, burst 2^32 - 1, so every check in the run is
//! admitted) and the same 16-byte client keys. Run with `scripts/bench-memory`.
//!
//! What each pays per check: governor reads its quanta clock (TSC), hashes the key with
//! SipHash (std `RandomState`), takes a DashMap shard read lock and runs a CAS loop on the
//! key's `AtomicU64`. Ours reads the system clock (`clock_gettime`, vDSO), hashes with a seeded
//! folded multiply, takes the shard's mutex, calls tollgate-core's `Limit::check` and returns a
//! `Verdict` (one heap allocation for its `Vec<Decision>`).

#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use governor::{DefaultKeyedRateLimiter, Quota as GQuota, RateLimiter};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};
use tollgate_core::{Algorithm, Check, ClientKey, Clock, Limit, Quota, Rule, SystemClock};
use tollgate_memory::{MemoryConfig, MemoryStore};

const KEYS: usize = 1_000_000;
const RATE: u32 = 1_000_000;

struct Ours {
    store: MemoryStore,
    rule: Rule,
}

impl Ours {
    fn new() -> Self {
        let quota = Quota::per_second(u64::from(RATE))
            .and_then(|q| q.with_burst(u64::from(u32::MAX)))
            .expect("quota");
        let limit = Limit::new(Algorithm::Gcra, quota).expect("limit");
        // Room for every key, so the loop measures lookups, not evictions.
        let store = MemoryStore::new(MemoryConfig {
            max_keys: KEYS + KEYS / 10,
            ..MemoryConfig::default()
        });
        Self {
            store,
            rule: Rule::new("bench", limit),
        }
    }

    fn check(&self, key: &ClientKey) -> bool {
        self.check_n(key, 1)
    }

    fn check_n(&self, key: &ClientKey, cost: u64) -> bool {
        let checks = [Check {
            rule: &self.rule,
            cost,
        }];
        self.store.check(key, &checks, SystemClock.now()).allowed
    }
}

fn governor() -> DefaultKeyedRateLimiter<ClientKey> {
    let rate = NonZeroU32::new(RATE).expect("nonzero");
    RateLimiter::dashmap(GQuota::per_second(rate).allow_burst(NonZeroU32::MAX))
}

/// Random keys, as a keyed hash of client identities would give.
fn keys(n: usize) -> Vec<ClientKey> {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    (0..n)
        .map(|_| ClientKey::from_u128((u128::from(rng.next()) << 64) | u128::from(rng.next())))
        .collect()
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` by multiply-shift.
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

/// Runs `iters` checks split over `threads` threads; returns the wall time from the first
/// thread's start to the last thread's end.
fn run<F: Fn(&mut Rng) -> bool + Sync>(threads: usize, iters: u64, f: F) -> Duration {
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (f, barrier) = (&f, &barrier);
                s.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                    let n = iters / threads as u64 + u64::from((t as u64) < iters % threads as u64);
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..n {
                        black_box(f(&mut rng));
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let start = spans.iter().map(|s| s.0).min().unwrap_or_else(Instant::now);
    let end = spans.iter().map(|s| s.1).max().unwrap_or(start);
    end - start
}

fn bench(c: &mut Criterion) {
    let all = keys(KEYS);
    let hot = all[0];
    let ours = Ours::new();
    let gov = governor();
    // Charge every key 1000 s worth of units up front (both sides alike): keys stay non-idle
    // for the whole run, so our store's sweep keeps them and the loop measures lookups.
    let prefill = NonZeroU32::new(1_000_000_000).expect("nonzero");
    for k in &all {
        assert!(ours.check_n(k, u64::from(prefill.get())));
        assert!(matches!(gov.check_key_n(k, prefill), Ok(Ok(()))));
    }
    assert_eq!(ours.store.len(), KEYS);
    assert_eq!(gov.len(), KEYS);

    for threads in [1, 2] {
        let mut g = c.benchmark_group(format!("hot_key/{threads}_thread"));
        g.bench_function(BenchmarkId::new("tollgate", threads), |b| {
            b.iter_custom(|iters| run(threads, iters, |_| ours.check(&hot)))
        });
        g.bench_function(BenchmarkId::new("governor", threads), |b| {
            b.iter_custom(|iters| run(threads, iters, |_| gov.check_key(&hot).is_ok()))
        });
        g.finish();

        let mut g = c.benchmark_group(format!("random_1m_keys/{threads}_thread"));
        g.bench_function(BenchmarkId::new("tollgate", threads), |b| {
            b.iter_custom(|iters| run(threads, iters, |rng| ours.check(&all[rng.below(KEYS)])))
        });
        g.bench_function(BenchmarkId::new("governor", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |rng| {
                    gov.check_key(&all[rng.below(KEYS)]).is_ok()
                })
            })
        });
        g.finish();
    }
    // Every check above was admitted, for both: the comparison is of the same work.
    assert!(ours.check(&hot));
    assert!(gov.check_key(&hot).is_ok());
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
