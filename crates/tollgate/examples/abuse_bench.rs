//! An abuse scenario against a real redis-server this program starts: the deny cache on vs
//! off, side by side in one run.
//!
//! U users at 100 requests/min each (token bucket, burst 100) behind one `Limiter` (one
//! gateway). 5% of them are abusive and offer 50 x their limit; the others are legitimate and
//! offer 60% of theirs (never limited). Requests are paced on a schedule (open loop) by worker
//! tasks, legitimate and abusive traffic on separate workers.
//!
//! For each mode it measures: Redis calls per request (`INFO commandstats`: evalsha + eval,
//! counted by Redis itself), and the latency of the legitimate clients' checks (p50/p99, the
//! time `Limiter::check` takes). It prints one JSON line per run and a Markdown table
//! (min / median / max over the repetitions; ratios per repetition against the run without
//! the deny cache).
//!
//! Usage: cargo run --release -p tollgate --features redis --example abuse_bench --
//!        [--users 2000] [--seconds 10] [--reps 3] [--abusive-pct 5] [--factor 50]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::RedisConfig;
use tollgate::{Action, Backend, ClientKey, Limiter, LimiterConfig, Policy, PolicySpec};
use tollgate_testkit::RedisServer;

/// Worker tasks per traffic class, so one slow call does not stall the whole schedule.
const WORKERS: u64 = 8;
const LIMIT_PER_MIN: u64 = 100;

#[derive(Clone, Copy)]
struct Args {
    users: u64,
    seconds: u64,
    reps: usize,
    abusive_pct: u64,
    factor: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        users: 2_000,
        seconds: 10,
        reps: 3,
        abusive_pct: 5,
        factor: 50,
    };
    common::numeric_flags(|flag, v| {
        match flag {
            "--users" => a.users = v.clamp(20, 1_000_000),
            "--seconds" => a.seconds = v.clamp(1, 600),
            "--reps" => a.reps = usize::try_from(v).unwrap_or(1).clamp(1, 20),
            "--abusive-pct" => a.abusive_pct = v.clamp(1, 50),
            "--factor" => a.factor = v.clamp(2, 1000),
            _ => return false,
        }
        true
    });
    a
}

struct Run {
    mode: &'static str,
    legit_offered: u64,
    legit_admitted: u64,
    abusive_offered: u64,
    abusive_admitted: u64,
    calls: u64,
    legit_p50_us: u64,
    legit_p99_us: u64,
    abusive_p99_us: u64,
    elapsed: f64,
}

impl Run {
    fn requests(&self) -> u64 {
        self.legit_offered + self.abusive_offered
    }
    fn calls_per_request(&self) -> f64 {
        self.calls as f64 / self.requests().max(1) as f64
    }
}

struct Class {
    offered: AtomicU64,
    admitted: AtomicU64,
}

/// Paces `rate` requests/s over WORKERS tasks for `seconds`; request k of worker w goes to
/// user `first + (k * WORKERS + w) % count`. Returns the check latencies in microseconds.
#[allow(clippy::too_many_arguments)]
async fn drive(
    limiter: Limiter,
    policy: Policy,
    rate: f64,
    start: Instant,
    seconds: u64,
    first: u64,
    count: u64,
    class: Arc<Class>,
) -> Vec<u32> {
    let end = start + Duration::from_secs(seconds);
    let interval = WORKERS as f64 / rate;
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let limiter = limiter.clone();
        let policy = policy.clone();
        let class = class.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut k: u64 = 0;
            loop {
                let at = start
                    + Duration::from_secs_f64(
                        interval * k as f64 + interval * w as f64 / WORKERS as f64,
                    );
                if at >= end {
                    break;
                }
                tokio::time::sleep_until(at.into()).await;
                let user = first + (k * WORKERS + w) % count;
                let client = ClientKey::from_u128(u128::from(user) + 1);
                let t = Instant::now();
                let action = limiter
                    .check(&tollgate::Plan::for_client(client, [&policy]))
                    .await
                    .action;
                lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
                class.offered.fetch_add(1, Ordering::Relaxed);
                if action == Action::Allow {
                    class.admitted.fetch_add(1, Ordering::Relaxed);
                }
                k += 1;
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        if let Ok(v) = t.await {
            all.extend(v);
        }
    }
    all
}

fn pct(sorted: &[u32], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p) as usize).min(sorted.len() - 1);
    u64::from(sorted[i])
}

async fn run(server: &RedisServer, a: Args, mode: &'static str, rep: usize) -> Run {
    let prefix = format!("abuse-{mode}-{rep}");
    let redis = RedisConfig::standalone(server.url()).with_key_prefix(&prefix);
    let mut cfg = LimiterConfig::new(Backend::Redis(redis));
    // A loaded 2-core machine: do not let timeouts (failing open) blur the call counts.
    cfg.timeout = Duration::from_millis(200);
    if mode == "no_deny_cache" {
        cfg.deny_cache_capacity = 0;
    }
    let limiter = Limiter::new(cfg);
    let limit = Limit::new(
        Algorithm::TokenBucket,
        Quota::per_minute(LIMIT_PER_MIN).expect("quota"),
    )
    .expect("limit");
    let policy = limiter
        .policy(PolicySpec::new("per_user", limit))
        .unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        });
    if !limiter.connect(Duration::from_secs(5)).await {
        eprintln!("redis not reachable");
        std::process::exit(1)
    }
    let abusive = (a.users * a.abusive_pct / 100).max(1);
    let legit = a.users - abusive;
    let per_user = LIMIT_PER_MIN as f64 / 60.0;
    // Legitimate users at 60% of their limit, abusive ones at `factor` times it.
    let legit_rate = legit as f64 * per_user * 0.6;
    let abusive_rate = abusive as f64 * per_user * a.factor as f64;
    let legit_class = Arc::new(Class {
        offered: AtomicU64::new(0),
        admitted: AtomicU64::new(0),
    });
    let abusive_class = Arc::new(Class {
        offered: AtomicU64::new(0),
        admitted: AtomicU64::new(0),
    });
    let before = common::script_calls(server);
    let start = Instant::now() + Duration::from_millis(50);
    let legit_task = tokio::spawn(drive(
        limiter.clone(),
        policy.clone(),
        legit_rate,
        start,
        a.seconds,
        0,
        legit,
        legit_class.clone(),
    ));
    let abusive_task = tokio::spawn(drive(
        limiter.clone(),
        policy.clone(),
        abusive_rate,
        start,
        a.seconds,
        legit,
        abusive,
        abusive_class.clone(),
    ));
    let mut legit_lat = legit_task.await.unwrap_or_default();
    let mut abusive_lat = abusive_task.await.unwrap_or_default();
    let elapsed = start.elapsed().as_secs_f64();
    let calls = common::script_calls(server) - before;
    limiter.shutdown().await;
    legit_lat.sort_unstable();
    abusive_lat.sort_unstable();
    let r = Run {
        mode,
        legit_offered: legit_class.offered.load(Ordering::Relaxed),
        legit_admitted: legit_class.admitted.load(Ordering::Relaxed),
        abusive_offered: abusive_class.offered.load(Ordering::Relaxed),
        abusive_admitted: abusive_class.admitted.load(Ordering::Relaxed),
        calls,
        legit_p50_us: pct(&legit_lat, 0.50),
        legit_p99_us: pct(&legit_lat, 0.99),
        abusive_p99_us: pct(&abusive_lat, 0.99),
        elapsed,
    };
    println!(
        "{{\"mode\":\"{}\",\"rep\":{rep},\"users\":{},\"abusive_users\":{abusive},\"requests\":{},\"legit_offered\":{},\"legit_admitted\":{},\"abusive_offered\":{},\"abusive_admitted\":{},\"store_calls\":{},\"calls_per_request\":{:.4},\"legit_p50_us\":{},\"legit_p99_us\":{},\"abusive_p99_us\":{},\"seconds\":{:.2}}}",
        r.mode,
        a.users,
        r.requests(),
        r.legit_offered,
        r.legit_admitted,
        r.abusive_offered,
        r.abusive_admitted,
        r.calls,
        r.calls_per_request(),
        r.legit_p50_us,
        r.legit_p99_us,
        r.abusive_p99_us,
        r.elapsed
    );
    r
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = parse_args();
    let server = RedisServer::start();
    let modes = ["no_deny_cache", "deny_cache"];
    let mut runs: Vec<Run> = Vec::new();
    for rep in 0..a.reps {
        // Alternate which mode goes first, so a drift in machine load hits both alike.
        let order = if rep % 2 == 0 {
            [modes[0], modes[1]]
        } else {
            [modes[1], modes[0]]
        };
        let mut pair = Vec::new();
        for mode in order {
            pair.push(run(&server, a, mode, rep).await);
        }
        pair.sort_by_key(|r| r.mode != modes[0]);
        runs.extend(pair);
    }
    println!();
    println!("| deny cache | offered req/s | Redis calls / request | calls vs without cache | legit p50 | legit p99 | legit p99 vs without cache | legit admitted | abusive admitted |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let base: Vec<&Run> = runs.iter().filter(|r| r.mode == modes[0]).collect();
    for mode in modes {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.mode == mode).collect();
        let offered = common::stats(
            mine.iter()
                .map(|r| r.requests() as f64 / r.elapsed)
                .collect(),
            0,
        );
        let calls = common::stats(mine.iter().map(|r| r.calls_per_request()).collect(), 3);
        let calls_vs = common::stats(
            mine.iter()
                .zip(&base)
                .map(|(r, b)| r.calls_per_request() / b.calls_per_request().max(1e-9))
                .collect(),
            3,
        );
        let p50 = common::stats(mine.iter().map(|r| r.legit_p50_us as f64).collect(), 0);
        let p99 = common::stats(mine.iter().map(|r| r.legit_p99_us as f64).collect(), 0);
        let p99_vs = common::stats(
            mine.iter()
                .zip(&base)
                .map(|(r, b)| r.legit_p99_us as f64 / b.legit_p99_us.max(1) as f64)
                .collect(),
            2,
        );
        let legit_ok = common::stats(
            mine.iter()
                .map(|r| r.legit_admitted as f64 / r.legit_offered.max(1) as f64)
                .collect(),
            3,
        );
        let abusive_ok = common::stats(
            mine.iter()
                .map(|r| r.abusive_admitted as f64 / r.abusive_offered.max(1) as f64)
                .collect(),
            3,
        );
        let label = if mode == "deny_cache" {
            "on (default, 100,000 entries)"
        } else {
            "off (`deny_cache_capacity = 0`)"
        };
        println!("| {label} | {offered} | {calls} | {calls_vs} | {p50} us | {p99} us | {p99_vs} | {legit_ok} | {abusive_ok} |");
    }
    let abusive = (a.users * a.abusive_pct / 100).max(1);
    println!();
    println!(
        "(min / median / max over {} repetitions of {} s; one Limiter, token_bucket {LIMIT_PER_MIN}/min per user; {} users, {abusive} of them ({}%) abusive at {}x their limit, the others at 60% of it; admitted = share of offered requests allowed)",
        a.reps, a.seconds, a.users, a.abusive_pct, a.factor
    );
}
