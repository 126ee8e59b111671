//! Exact vs lease, side by side in one run, against a real redis-server this program starts.
//!
//! Two workloads, each run in both modes with 20 `Limiter` instances (20 gateways, each with
//! its own connection) in this process:
//! - `hot`: one global policy of L units/s (token bucket, burst L), offered 1.5 x L for D
//!   seconds, spread evenly over the 20 gateways.
//! - `per-user`: 100 requests/min per user, U users, requests from random users at random
//!   gateways at a total rate R (by default 25 requests/s per user: over a 10 s run each user
//!   offers about twice its burst plus refill, so limiting happens).
//!
//! It prints one JSON line per run and a Markdown table (min/median/max over the repetitions).
//! `bound` is what the limit allows over the run's real length (burst + rate x elapsed); runs
//! are compared by `admitted / bound`, so a run that a loaded machine stretched is not
//! credited with the refill of its extra seconds.
//! Store calls are counted by Redis itself (`INFO commandstats`: evalsha + eval).
//!
//! Usage: cargo run --release -p tollgate --features redis --example lease_bench --
//!        [--limit 10000] [--seconds 10] [--reps 3] [--users 200] [--user-rate 5000]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate::policy::SyncMode;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::RedisConfig;
use tollgate::{Action, Backend, ClientKey, Limiter, LimiterConfig, Policy, PolicySpec};
use tollgate_testkit::RedisServer;

const GATEWAYS: usize = 20;

#[derive(Clone, Copy)]
struct Args {
    limit: u64,
    seconds: u64,
    reps: usize,
    users: u64,
    user_rate: u64,
}

fn parse_args() -> Args {
    let mut a = Args {
        limit: 10_000,
        seconds: 10,
        reps: 3,
        users: 200,
        user_rate: 5_000,
    };
    common::numeric_flags(|flag, v| {
        match flag {
            "--limit" => a.limit = v,
            "--seconds" => a.seconds = v.clamp(1, 600),
            "--reps" => a.reps = usize::try_from(v).unwrap_or(1).clamp(1, 20),
            "--users" => a.users = v.max(1),
            "--user-rate" => a.user_rate = v.max(1),
            _ => return false,
        }
        true
    });
    a
}

struct Run {
    workload: &'static str,
    mode: &'static str,
    offered: u64,
    admitted: u64,
    calls: u64,
    bound: u64,
    elapsed: f64,
}

fn gateways(url: &str, spec: &PolicySpec, prefix: &str) -> Vec<(Limiter, Policy)> {
    (0..GATEWAYS)
        .map(|_| {
            let redis = RedisConfig::standalone(url).with_key_prefix(prefix);
            let mut cfg = LimiterConfig::new(Backend::Redis(redis));
            cfg.timeout = Duration::from_millis(200);
            let l = Limiter::new(cfg);
            let p = l.policy(spec.clone()).unwrap_or_else(|e| {
                eprintln!("{e}");
                std::process::exit(2)
            });
            (l, p)
        })
        .collect()
}

/// Drives `rate` requests/s for `seconds` over the gateways (each gateway its share, paced on
/// a schedule); `client(i)` picks the client of request i. Returns (offered, admitted).
async fn drive(
    gws: Arc<Vec<(Limiter, Policy)>>,
    rate: u64,
    seconds: u64,
    client: fn(u64, u64) -> ClientKey,
    users: u64,
) -> (u64, u64, f64) {
    let admitted = Arc::new(AtomicU64::new(0));
    let offered = Arc::new(AtomicU64::new(0));
    let per_gateway = rate as f64 / GATEWAYS as f64;
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for g in 0..GATEWAYS {
        // Four workers per gateway, so one slow call does not stall its schedule.
        for w in 0..4u64 {
            let gws = gws.clone();
            let admitted = admitted.clone();
            let offered = offered.clone();
            tasks.push(tokio::spawn(async move {
                let interval = 4.0 / per_gateway;
                let mut i: u64 = 0;
                let mut x = (g as u64 * 4 + w + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                loop {
                    let at = start
                        + Duration::from_secs_f64(interval * i as f64 + interval * w as f64 / 4.0);
                    if at >= end {
                        break;
                    }
                    tokio::time::sleep_until(at.into()).await;
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let (l, p) = &gws[g];
                    let c = client(x, users);
                    offered.fetch_add(1, Ordering::Relaxed);
                    if l.check(&tollgate::Plan::for_client(c, [p])).await.action == Action::Allow {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                }
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    for (l, _) in gws.iter() {
        l.shutdown().await;
    }
    (
        offered.load(Ordering::Relaxed),
        admitted.load(Ordering::Relaxed),
        elapsed,
    )
}

fn hot_client(_: u64, _: u64) -> ClientKey {
    ClientKey([0x42; 16])
}

fn user_client(x: u64, users: u64) -> ClientKey {
    ClientKey::from_u128(u128::from(x % users) + 1)
}

#[allow(clippy::too_many_arguments)]
async fn run(
    server: &RedisServer,
    workload: &'static str,
    mode: &'static str,
    spec: PolicySpec,
    rate: u64,
    seconds: u64,
    client: fn(u64, u64) -> ClientKey,
    users: u64,
    bound: impl Fn(f64) -> u64,
    rep: usize,
) -> Run {
    let prefix = format!("bench-{workload}-{mode}-{rep}");
    let gws = Arc::new(gateways(&server.url(), &spec, &prefix));
    // Connect every gateway before the clock starts.
    for (l, _) in gws.iter() {
        let _ = l.ready().await;
    }
    let before = common::script_calls(server);
    let (offered, admitted, elapsed) = drive(gws, rate, seconds, client, users).await;
    let calls = common::script_calls(server) - before;
    let r = Run {
        workload,
        mode,
        offered,
        admitted,
        calls,
        bound: bound(elapsed),
        elapsed,
    };
    println!(
        "{{\"workload\":\"{}\",\"mode\":\"{}\",\"rep\":{rep},\"offered\":{},\"admitted\":{},\"bound\":{},\"store_calls\":{},\"calls_per_request\":{:.4},\"seconds\":{:.2}}}",
        r.workload,
        r.mode,
        r.offered,
        r.admitted,
        r.bound,
        r.calls,
        r.calls as f64 / r.offered.max(1) as f64,
        r.elapsed
    );
    r
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = parse_args();
    let server = RedisServer::start();
    let mut runs = Vec::new();
    let lease = SyncMode::Lease {
        ttl: Duration::from_millis(200),
        max: 1000,
    };
    let hot_limit = Limit::new(
        Algorithm::TokenBucket,
        Quota::per_second(a.limit).expect("quota"),
    )
    .expect("limit");
    let user_limit = Limit::new(
        Algorithm::TokenBucket,
        Quota::per_minute(100).expect("quota"),
    )
    .expect("limit");
    for rep in 0..a.reps {
        for (mode, sync) in [("exact", SyncMode::Exact), ("lease", lease)] {
            let mut spec = PolicySpec::new("global", hot_limit);
            spec.sync = sync;
            // Burst + rate x the run's real length (the last admissions may land just after
            // the schedule ends).
            let limit = a.limit;
            let bound = move |elapsed: f64| limit + (limit as f64 * elapsed) as u64;
            let rate = a.limit * 3 / 2;
            runs.push(
                run(
                    &server, "hot", mode, spec, rate, a.seconds, hot_client, 1, bound, rep,
                )
                .await,
            );
            let mut spec = PolicySpec::new("per_user", user_limit);
            spec.sync = sync;
            // Each user: burst 100 + 100/min over the run.
            let users = a.users;
            let bound = move |elapsed: f64| users * (100 + (100.0 * elapsed / 60.0) as u64);
            runs.push(
                run(
                    &server,
                    "per-user",
                    mode,
                    spec,
                    a.user_rate,
                    a.seconds,
                    user_client,
                    a.users,
                    bound,
                    rep,
                )
                .await,
            );
        }
    }
    println!();
    println!("| workload | mode | offered req/s | admitted / bound | vs exact (admitted / bound) | store calls per request |");
    println!("|---|---|---|---|---|---|");
    for workload in ["hot", "per-user"] {
        for mode in ["exact", "lease"] {
            let mine: Vec<&Run> = runs
                .iter()
                .filter(|r| r.workload == workload && r.mode == mode)
                .collect();
            let exact: Vec<&Run> = runs
                .iter()
                .filter(|r| r.workload == workload && r.mode == "exact")
                .collect();
            let offered = common::stats(
                mine.iter().map(|r| r.offered as f64 / r.elapsed).collect(),
                3,
            );
            let of_bound = common::stats(
                mine.iter()
                    .map(|r| r.admitted as f64 / r.bound as f64)
                    .collect(),
                3,
            );
            let vs_exact = common::stats(
                mine.iter()
                    .zip(&exact)
                    .map(|(r, e)| {
                        let share = |x: &Run| x.admitted as f64 / x.bound.max(1) as f64;
                        share(r) / share(e)
                    })
                    .collect(),
                3,
            );
            let calls = common::stats(
                mine.iter()
                    .map(|r| r.calls as f64 / r.offered.max(1) as f64)
                    .collect(),
                3,
            );
            println!("| {workload} | {mode} | {offered} | {of_bound} | {vs_exact} | {calls} |");
        }
    }
    println!();
    println!("(min / median / max over {} repetitions of {} s each; limit {} units/s for hot; {} users at 100/min, {} req/s in all, for per-user)", a.reps, a.seconds, a.limit, a.users, a.user_rate);
}
