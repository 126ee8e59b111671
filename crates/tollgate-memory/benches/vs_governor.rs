//! ns per check: the memory store against governor's `DefaultKeyedRateLimiter`, side by side,
//! on the same quota (GCRA, 1,000,000 per second, burst 2^32 - 1, so every check in the run is
//! admitted) and the same 16-byte client keys. `cargo xtask bench --only memory` runs it with
//! `bytes_per_key`; alone: `cargo bench -p tollgate-memory --bench vs_governor`.
//!
//! What each pays per check: governor reads its quanta clock (TSC), hashes the key with
//! SipHash (std `RandomState`), takes a DashMap shard read lock and runs a CAS loop on the
//! key's `AtomicU64`. Ours reads the same quanta TSC (anchored once to the system clock, since
//! the store takes wall-clock microseconds), hashes with a seeded folded multiply, takes the
//! shard's read lock, runs tollgate-core's `Limit::check` in a CAS loop on the slot's time
//! word, and returns a `Verdict` (one heap allocation for its `Vec<Decision>`). The `clock`
//! group measures what reading `SystemClock` instead would add.
//!
//! Time per sample is wall time minus the time each thread sat runnable but preempted (see
//! `run`): the machine the numbers come from has 2 cores shared with other builds.

#![allow(missing_docs)]

use criterion::{criterion_group, BenchmarkId, Criterion};
use governor::{DefaultKeyedRateLimiter, Quota as GQuota, RateLimiter};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};
use tollgate_core::{Algorithm, Check, ClientKey, Clock, Limit, Quota, Rule, SystemClock};
use tollgate_memory::{MemoryConfig, MemoryStore};

const KEYS: usize = 1_000_000;
const RATE: u32 = 1_000_000;

/// Wall-clock microseconds from the TSC: the system clock read once, then quanta's cycle
/// counter (the source governor's default clock reads).
struct TscWallClock {
    clock: quanta::Clock,
    start_raw: u64,
    start_us: u64,
}

impl TscWallClock {
    fn new() -> Self {
        let clock = quanta::Clock::new();
        let start_raw = clock.raw();
        Self {
            clock,
            start_raw,
            start_us: SystemClock.now(),
        }
    }

    fn now(&self) -> u64 {
        self.start_us + self.clock.delta_as_nanos(self.start_raw, self.clock.raw()) / 1_000
    }
}

struct Ours {
    store: MemoryStore,
    rule: Rule,
    clock: TscWallClock,
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
            clock: TscWallClock::new(),
        }
    }

    fn check(&self, key: &ClientKey) -> bool {
        self.check_n(key, 1)
    }

    /// The same check through `check_one`, which returns the decision without a `Verdict`.
    fn check_one(&self, key: &ClientKey) -> bool {
        let check = Check::new(*key, &self.rule, 1);
        self.store.check_one(&check, self.clock.now()).allowed
    }

    fn check_n(&self, key: &ClientKey, cost: u64) -> bool {
        let checks = [Check::new(*key, &self.rule, cost)];
        self.store.check(&checks, self.clock.now()).allowed
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

/// Nanoseconds this thread has spent runnable but waiting for a CPU (second field of
/// /proc/thread-self/schedstat); 0 where unavailable, which leaves plain wall time.
fn preempted_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Runs `iters` checks split over `threads` threads and returns the longest thread's time:
/// its wall time minus the time it was preempted while runnable. The benchmark machine is
/// shared, so time stolen by other processes is taken out; time blocked on a lock (not
/// runnable) still counts.
fn run<F: Fn(&mut Rng) -> bool + Sync>(threads: usize, iters: u64, f: F) -> Duration {
    let barrier = Barrier::new(threads);
    let spans: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (f, barrier) = (&f, &barrier);
                s.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                    let n = iters / threads as u64 + u64::from((t as u64) < iters % threads as u64);
                    barrier.wait();
                    let waited = preempted_ns();
                    let start = Instant::now();
                    for _ in 0..n {
                        black_box(f(&mut rng));
                    }
                    let wall = start.elapsed();
                    let stolen = Duration::from_nanos(preempted_ns().saturating_sub(waited));
                    wall.saturating_sub(stolen)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    spans.into_iter().max().unwrap_or_default()
}

/// Both limiters holding the same million keys.
struct Fixture {
    all: Vec<ClientKey>,
    ours: Ours,
    gov: DefaultKeyedRateLimiter<ClientKey>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let all = keys(KEYS);
        let ours = Ours::new();
        let gov = governor();
        // Charge every key 1000 s worth of units up front (both sides alike): keys stay
        // non-idle for the whole run, so our store's sweep keeps them and the loops measure
        // lookups.
        let prefill = NonZeroU32::new(1_000_000_000).expect("nonzero");
        for k in &all {
            assert!(ours.check_n(k, u64::from(prefill.get())));
            assert!(matches!(gov.check_key_n(k, prefill), Ok(Ok(()))));
        }
        assert_eq!(ours.store.len(), KEYS);
        assert_eq!(gov.len(), KEYS);
        Fixture { all, ours, gov }
    })
}

/// The four configurations: (name, threads, random keys?).
const CONFIGS: [(&str, usize, bool); 4] = [
    ("hot_key", 1, false),
    ("hot_key", 2, false),
    ("random_1m_keys", 1, true),
    ("random_1m_keys", 2, true),
];

fn time_ours(f: &Fixture, threads: usize, random: bool, iters: u64) -> Duration {
    let hot = f.all[0];
    if random {
        run(threads, iters, |rng| f.ours.check(&f.all[rng.below(KEYS)]))
    } else {
        run(threads, iters, |_| f.ours.check(&hot))
    }
}

fn time_ours_one(f: &Fixture, threads: usize, random: bool, iters: u64) -> Duration {
    let hot = f.all[0];
    if random {
        run(threads, iters, |rng| {
            f.ours.check_one(&f.all[rng.below(KEYS)])
        })
    } else {
        run(threads, iters, |_| f.ours.check_one(&hot))
    }
}

fn time_governor(f: &Fixture, threads: usize, random: bool, iters: u64) -> Duration {
    let hot = f.all[0];
    if random {
        run(threads, iters, |rng| {
            f.gov.check_key(&f.all[rng.below(KEYS)]).is_ok()
        })
    } else {
        run(threads, iters, |_| f.gov.check_key(&hot).is_ok())
    }
}

fn bench(c: &mut Criterion) {
    let f = fixture();
    for (name, threads, random) in CONFIGS {
        let mut g = c.benchmark_group(format!("{name}/{threads}_thread"));
        g.bench_function(BenchmarkId::new("tollgate", threads), |b| {
            b.iter_custom(|iters| time_ours(f, threads, random, iters))
        });
        g.bench_function(BenchmarkId::new("governor", threads), |b| {
            b.iter_custom(|iters| time_governor(f, threads, random, iters))
        });
        g.finish();
    }
    let mut g = c.benchmark_group("clock");
    g.bench_function("system_clock", |b| {
        b.iter_custom(|iters| run(1, iters, |_| SystemClock.now() > 0))
    });
    g.bench_function("tsc_wall_clock", |b| {
        b.iter_custom(|iters| run(1, iters, |_| f.ours.clock.now() > 0))
    });
    g.finish();
}

/// The paired comparison: for each configuration, 60 rounds, each timing a block of checks on
/// each limiter in turn (the order rotating), so that load on the shared machine changing over
/// seconds hits all alike. Prints the medians and the median of the per-round ratios as a
/// markdown table; `check_one` is the same check without building a `Verdict`.
fn paired() {
    let f = fixture();
    println!("\n## paired: ns per check, median of 60 rotating rounds");
    println!("| configuration | tollgate `check` | governor `check_key` | ratio | tollgate `check_one` | ratio |");
    println!("|---|---:|---:|---:|---:|---:|");
    type Timer = fn(&Fixture, usize, bool, u64) -> Duration;
    let timers: [Timer; 3] = [time_ours, time_governor, time_ours_one];
    for (_, threads, random) in CONFIGS {
        let block: u64 = if random { 50_000 } else { 200_000 };
        let mut ns: [Vec<f64>; 3] = Default::default();
        let (mut ratio, mut ratio_one) = (Vec::new(), Vec::new());
        for round in 0..60 {
            let mut t = [0.0; 3];
            for k in 0..3 {
                let which = (round + k) % 3;
                let d = timers[which](f, threads, random, block);
                t[which] = d.as_nanos() as f64 / block as f64;
            }
            for (v, x) in ns.iter_mut().zip(t) {
                v.push(x);
            }
            ratio.push(t[0] / t[1]);
            ratio_one.push(t[2] / t[1]);
        }
        let label = if random {
            "1,000,000 random keys"
        } else {
            "one hot key"
        };
        let plural = if threads > 1 { "s" } else { "" };
        let [a, b, c] = &mut ns;
        println!(
            "| {label}, {threads} thread{plural} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} |",
            median(a),
            median(b),
            median(&mut ratio),
            median(c),
            median(&mut ratio_one)
        );
    }
    // Every check of the run was admitted, for both: the comparison is of the same work.
    assert!(f.ours.check(&f.all[0]));
    assert!(f.gov.check_key(&f.all[0]).is_ok());
    println!("## end");
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // `cargo bench` passes --bench; test runs of the target (cargo test --benches) do not.
    if std::env::args().any(|a| a == "--bench") && std::env::var_os("NO_PAIRED").is_none() {
        paired();
    }
}
