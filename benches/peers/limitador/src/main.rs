//! limitador's Redis storage (AsyncRateLimiter + AsyncRedisStorage) under the load
//! `cargo xtask bench` gives tollgate's RedisStore: `callers` concurrent tasks, each request for a
//! random one of `clients` clients, 100 per 60 s per client (limitador counts fixed windows),
//! for `seconds`. Prints one JSON line: decisions/s, p50/p99 latency in microseconds.
//!
//! limitador-peer --url redis://127.0.0.1:PORT [--callers 64] [--clients 100000] [--seconds 10]

use limitador::limit::{Context, Limit};
use limitador::storage::redis::AsyncRedisStorage;
use limitador::AsyncRateLimiter;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Args {
    url: String,
    callers: u64,
    clients: u64,
    seconds: u64,
}

fn parse() -> Args {
    let mut a = Args {
        url: String::new(),
        callers: 64,
        clients: 100_000,
        seconds: 10,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < argv.len() {
        let v = argv[i + 1].clone();
        let num = || -> u64 {
            v.parse().unwrap_or_else(|_| {
                eprintln!("{} needs a number", argv[i]);
                std::process::exit(2)
            })
        };
        match argv[i].as_str() {
            "--url" => a.url = v.clone(),
            "--callers" => a.callers = num().clamp(1, 4096),
            "--clients" => a.clients = num().max(1),
            "--seconds" => a.seconds = num().clamp(1, 600),
            other => {
                eprintln!("unknown flag {other}");
                std::process::exit(2)
            }
        }
        i += 2;
    }
    if a.url.is_empty() {
        eprintln!("--url is required");
        std::process::exit(2)
    }
    a
}

async fn phase(
    limiter: &Arc<AsyncRateLimiter>,
    a: &Args,
    seconds: f64,
    seed: u64,
) -> (f64, Vec<u32>, u64) {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for c in 0..a.callers {
        let limiter = limiter.clone();
        let clients = a.clients;
        tasks.push(tokio::spawn(async move {
            let mut x = (seed * 1000 + c + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut lat = Vec::new();
            let mut limited = 0u64;
            let namespace = "bench".into();
            // Bounded: at most 10 million requests per caller.
            for _ in 0..10_000_000u32 {
                if Instant::now() >= end {
                    break;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let mut values = HashMap::new();
                values.insert("user_id".to_string(), (x % clients).to_string());
                let ctx: Context = values.into();
                let t = Instant::now();
                match limiter
                    .check_rate_limited_and_update(&namespace, &ctx, 1)
                    .await
                {
                    Ok(r) => {
                        if r.limited {
                            limited += 1;
                        }
                    }
                    Err(e) => {
                        eprintln!("limitador: {e}");
                        std::process::exit(1)
                    }
                }
                lat.push(u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX));
            }
            (lat, limited)
        }));
    }
    let mut all = Vec::new();
    let mut limited = 0;
    for t in tasks {
        if let Ok((v, l)) = t.await {
            all.extend(v);
            limited += l;
        }
    }
    (start.elapsed().as_secs_f64(), all, limited)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() {
    let a = parse();
    let storage = AsyncRedisStorage::new(&a.url).await.unwrap_or_else(|e| {
        eprintln!("limitador: {e}");
        std::process::exit(1)
    });
    let limiter = AsyncRateLimiter::new_with_storage(Box::new(storage));
    let variable = "user_id".try_into().expect("variable");
    limiter.add_limit(Limit::new("bench", 100, 60, [], [variable]));
    let limiter = Arc::new(limiter);
    // Warm up the connection and the allocator, then measure.
    let _ = phase(&limiter, &a, (a.seconds as f64 / 10.0).max(0.5), 1).await;
    let (elapsed, mut lat, limited) = phase(&limiter, &a, a.seconds as f64, 2).await;
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            0
        } else {
            lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)]
        }
    };
    println!(
        "{{\"decisions_per_s\":{:.0},\"p50_us\":{},\"p99_us\":{},\"requests\":{},\"limited\":{},\"callers\":{},\"clients\":{},\"seconds\":{:.2}}}",
        lat.len() as f64 / elapsed,
        pct(0.50),
        pct(0.99),
        lat.len(),
        limited,
        a.callers,
        a.clients,
        elapsed
    );
}
