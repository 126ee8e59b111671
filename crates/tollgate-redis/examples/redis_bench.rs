//! Decisions per second and latency of `RedisStore::check` against a running Redis: `callers`
//! concurrent tasks, each request for a random one of `clients` clients, one policy
//! (100 per minute) of the chosen algorithm, store clock. `cargo xtask bench` (sections redis
//! and peers) runs it beside redis-benchmark; see docs/benchmarks.md.
//!
//! ```text
//! redis_bench --url redis://127.0.0.1:PORT --algorithm gcra [--requests 200000]
//!             [--callers 64] [--clients 100000] [--connections 1] [--threads 1]
//!             [--max-batch N]        # each connection's store.max_batch (default: the store's)
//! redis_bench --print-scripts DIR    # writes the Lua texts the store loads (the one of a
//!                                    # 100-per-minute policy of each algorithm, and
//!                                    # check.lua), prints "name sha1" lines
//! redis_bench --script-floor --url redis://127.0.0.1:PORT [--keys 1000000,100000] [--batch 64]
//!             [--seconds 5] [--rounds 3]
//!                                    # Redis's own CPU per plan: tollgate's one-plan and batch
//!                                    # scripts against a floor script and plain SETs (floor.rs)
//! ```
//!
//! A plan script takes its quotas as its first argument, packed in bytes, which
//! redis-benchmark's command line cannot carry: each plan script written here begins with one
//! statement that puts its 100-per-minute quotas there (`table.insert(ARGV, 1, ...)`), so
//! `EVALSHA sha 1 key` or `EVALSHA sha 1 key COST` runs it as the store does, at the price of
//! that one statement.
//!
//! ```text
//! ```

#[global_allocator]
static GLOBAL: tollgate_alloc::Mimalloc = tollgate_alloc::Mimalloc;

// In redis_bench/: a file directly under examples/ would be taken for an example of its own.
#[path = "redis_bench/floor.rs"]
mod floor;
#[path = "redis_bench/resp.rs"]
mod resp;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate_core::{Algorithm, Check, ClientKey, Limit, Mode, Quota, Rule};
use tollgate_redis::{RedisConfig, RedisStore, RuleShape};

struct Args {
    url: String,
    algorithm: Algorithm,
    requests: usize,
    callers: usize,
    clients: u64,
    connections: usize,
    threads: usize,
    /// `store.max_batch`; `None`: the store's default.
    max_batch: Option<usize>,
}

fn parse() -> Result<Option<Args>, String> {
    let mut args = Args {
        url: String::new(),
        algorithm: Algorithm::Gcra,
        requests: 200_000,
        callers: 64,
        clients: 100_000,
        connections: 1,
        threads: 1,
        max_batch: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--url" => args.url = value,
            "--algorithm" => args.algorithm = value.parse().map_err(|e| format!("{e}"))?,
            "--requests" => args.requests = num(&value)?,
            "--callers" => args.callers = num(&value)?.max(1),
            "--clients" => args.clients = num(&value)?.max(1) as u64,
            "--connections" => args.connections = num(&value)?.max(1),
            "--threads" => args.threads = num(&value)?.max(1),
            "--max-batch" => args.max_batch = Some(num(&value)?.max(1)),
            "--print-scripts" => {
                let dir = std::path::Path::new(&value);
                let write = |name: &str, text: &str| {
                    std::fs::write(dir.join(format!("{name}.lua")), text)
                        .map_err(|e| format!("{value}: {e}"))
                };
                let quota = Quota::per_minute(100).map_err(|e| e.to_string())?;
                let shape = |limit| RuleShape {
                    limit,
                    mode: Mode::Enforce,
                };
                let missing = || "no generated script".to_string();
                // The plan script with its quotas put first in ARGV, and that text's SHA1.
                let with_quotas = |rules: &[RuleShape]| -> Result<(String, String), String> {
                    let text = tollgate_redis::plan_script_text(rules).ok_or_else(missing)?;
                    let quotas = tollgate_redis::plan_script_quotas(rules).ok_or_else(missing)?;
                    let bytes: String = quotas.iter().map(|b| format!("\\{b}")).collect();
                    let text = format!("table.insert(ARGV, 1, \"{bytes}\")\n{text}");
                    let sha = redis::Script::new(&text).get_hash().to_string();
                    Ok((text, sha))
                };
                for a in Algorithm::ALL {
                    let limit = Limit::new(a, quota).map_err(|e| e.to_string())?;
                    let (text, sha) = with_quotas(&[shape(limit)])?;
                    write(a.name(), &text)?;
                    println!("{} {sha}", a.name());
                }
                // A request matched by two policies: 100 per minute (token bucket) and 1,000
                // per hour (GCRA).
                let hourly = Quota::new(1000, std::time::Duration::from_secs(3600))
                    .map_err(|e| e.to_string())?;
                let pair = [
                    shape(Limit::new(Algorithm::TokenBucket, quota).map_err(|e| e.to_string())?),
                    shape(Limit::new(Algorithm::Gcra, hourly).map_err(|e| e.to_string())?),
                ];
                let (text, sha) = with_quotas(&pair)?;
                write("set2", &text)?;
                println!("set2 {sha}");
                // The batch script of one token bucket's plans, as a standalone server runs it.
                let bucket =
                    Limit::new(Algorithm::TokenBucket, quota).map_err(|e| e.to_string())?;
                let batch =
                    tollgate_redis::batch_script_text(&[shape(bucket)]).ok_or_else(missing)?;
                write("batch_token_bucket", &batch)?;
                println!(
                    "batch_token_bucket {}",
                    redis::Script::new(&batch).get_hash()
                );
                write("check", tollgate_redis::generic_script_text())?;
                println!("check {}", tollgate_redis::generic_script_sha());
                return Ok(None);
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.url.is_empty() {
        return Err("--url is required".into());
    }
    Ok(Some(args))
}

/// SplitMix64 step: cheap per-request randomness without a dependency.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

async fn run_phase(
    stores: &[RedisStore],
    rule: &Arc<Rule>,
    args: &Args,
    requests: usize,
    seed: u64,
) -> Result<(Duration, Vec<u32>, usize), String> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for caller in 0..args.callers {
        let store = stores[caller % stores.len()].clone();
        let rule = rule.clone();
        let next = next.clone();
        let clients = args.clients;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(requests / 64 + 1);
            let mut allowed = 0usize;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let client = ClientKey::from_u128(u128::from(mix(seed ^ i as u64) % clients));
                let checks = [Check::new(client, &rule, 1)];
                let t = Instant::now();
                let v = store.check(&checks, 0).await.map_err(|e| e.to_string())?;
                latencies.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
                allowed += usize::from(v.allowed);
            }
            Ok::<_, String>((latencies, allowed))
        }));
    }
    let mut all = Vec::with_capacity(requests);
    let mut allowed = 0;
    for t in tasks {
        let (lat, a) = t.await.map_err(|e| e.to_string())??;
        all.extend(lat);
        allowed += a;
    }
    Ok((start.elapsed(), all, allowed))
}

async fn bench(args: Args) -> Result<(), String> {
    let mut config = RedisConfig::standalone(args.url.clone());
    if let Some(n) = args.max_batch {
        config = config.with_max_batch(n);
    }
    let mut stores = Vec::new();
    for _ in 0..args.connections {
        stores.push(
            RedisStore::connect(config.clone())
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let quota = Quota::per_minute(100).map_err(|e| e.to_string())?;
    let limit = Limit::new(args.algorithm, quota).map_err(|e| e.to_string())?;
    let rule = Arc::new(Rule::new(args.algorithm.name(), limit));
    // Warm up connections, the script cache and the allocator, then measure.
    run_phase(&stores, &rule, &args, args.requests / 10, 1).await?;
    let (elapsed, mut lat, allowed) = run_phase(&stores, &rule, &args, args.requests, 2).await?;
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "algorithm={} requests={} callers={} clients={} connections={} max_batch={} decisions_per_s={:.0} p50_us={} p99_us={} allowed={}",
        args.algorithm,
        lat.len(),
        args.callers,
        args.clients,
        args.connections,
        config.max_batch,
        lat.len() as f64 / elapsed.as_secs_f64(),
        pct(0.50),
        pct(0.99),
        allowed
    );
    Ok(())
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--script-floor") {
        if let Err(e) = floor::main(std::env::args().skip(2)) {
            eprintln!("redis_bench --script-floor: {e}");
            std::process::exit(1);
        }
        return;
    }
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => return,
        Err(e) => {
            eprintln!("redis_bench: {e}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("redis_bench: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(bench(args)) {
        eprintln!("redis_bench: {e}");
        std::process::exit(1);
    }
}
