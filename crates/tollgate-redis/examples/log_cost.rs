//! Redis's time a request of one client's `sliding_window_log` policy as its log fills. The
//! client is admitted once a millisecond (the store's local clock, so the log holds a record
//! per request) under a limit of `--limit` (100,000 by default) an hour; at each mark, `calls`
//! more requests are timed by Redis itself (INFO commandstats' `usec_per_call` of EVALSHA,
//! reset first). A limit above `IN_PLACE_LOG_LIMIT` (500) is decided in place; up to it, by a
//! generated script that reads and writes the log whole.
//!
//! With `--settle-newest` or `--settle-earlier`, the timed calls are whole refunds (real cost
//! 0: the record goes) of the newest `calls` requests, newest first, or of the first `calls`
//! admitted since the previous mark (the oldest at the first mark; with marks that double,
//! about the middle of the log).
//!
//! ```text
//! log_cost --url redis://127.0.0.1:PORT [--marks 1000,10000,50000] [--calls 500]
//!          [--limit 100000] [--settle-newest | --settle-earlier]
//! ```
//! Run it against a Redis of its own: it resets that server's command statistics.

use std::time::Duration;
use tollgate_core::{Algorithm, Check, ClientKey, Limit, Quota, Rule};
use tollgate_redis::{RedisConfig, RedisStore, SettleItem, StoreClock};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut url = None;
    let mut marks = vec![1_000u64, 10_000, 50_000];
    let mut calls = 500u64;
    let mut limit = 100_000u64;
    // Time refunds instead of requests: of the newest records, or of the oldest.
    let mut settle: Option<bool> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--settle-newest" || a == "--settle-earlier" {
            settle = Some(a == "--settle-newest");
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{a} takes a value"))?;
        match a.as_str() {
            "--url" => url = Some(value),
            "--marks" => {
                marks = value
                    .split(',')
                    .map(|m| m.trim().parse::<u64>())
                    .collect::<Result<_, _>>()?;
            }
            "--calls" => calls = value.parse()?,
            "--limit" => limit = value.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let url = url.ok_or("--url redis://HOST:PORT is required")?;
    if marks.iter().any(|&m| m < calls || m > limit) {
        return Err("each mark must be at least --calls and at most --limit".into());
    }
    let store = RedisStore::connect(
        RedisConfig::standalone(&url)
            .with_clock(StoreClock::Local)
            .with_key_prefix("log-cost")
            .with_call_timeout(Duration::from_secs(10)),
    )
    .await?;
    let mut admin = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let rule = Rule::new(
        "log",
        Limit::new(
            Algorithm::SlidingWindowLog,
            Quota::new(limit, Duration::from_secs(3600))?,
        )?,
    );
    let who = ClientKey::from_u128(u128::from(std::process::id()));
    let t0: u64 = 1_800_000_000_000_000;
    // Requests made so far: the records in the log.
    let mut n = 0u64;
    println!("| records in the log | Redis µs a request |");
    println!("|---:|---:|");
    for mark in marks {
        if mark < n + calls {
            return Err("the marks must grow by at least --calls".into());
        }
        if let Some(newest) = settle {
            // Fill to the mark, then time whole refunds (the record goes) of the last `calls`
            // requests, newest first, or of the first `calls` since the previous mark; the
            // next fill goes on from the mark.
            admit(&store, &rule, who, t0, n, mark).await?;
            reset_stats(&mut admin).await?;
            let refunded: Vec<u64> = if newest {
                (mark - calls..mark).rev().collect()
            } else {
                (n..n + calls).collect()
            };
            for i in refunded {
                let item = SettleItem {
                    client: who,
                    rule: &rule,
                    units: 1,
                    at: t0 + i * 1000,
                    real: Some(0),
                };
                let back = store.settle(&[item], t0 + mark * 1000).await?;
                if back != [1] {
                    return Err(format!("request {i}: refunded {back:?}, not 1").into());
                }
            }
        } else {
            admit(&store, &rule, who, t0, n, mark - calls).await?;
            reset_stats(&mut admin).await?;
            admit(&store, &rule, who, t0, mark - calls, mark).await?;
        }
        n = mark;
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut admin)
            .await?;
        let per_call = stats
            .lines()
            .find(|l| l.starts_with("cmdstat_evalsha:"))
            .and_then(|l| l.split("usec_per_call=").nth(1))
            .and_then(|s| s.split(',').next())
            .ok_or("no EVALSHA in INFO commandstats")?;
        println!("| {mark} | {per_call} |");
    }
    Ok(())
}

/// Resets the server's command statistics (what INFO commandstats counts from).
async fn reset_stats(
    admin: &mut redis::aio::MultiplexedConnection,
) -> Result<(), Box<dyn std::error::Error>> {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(admin)
        .await?;
    Ok(())
}

/// Requests `from..to` of `who`, the i-th at `t0 + i` ms: each must be admitted.
async fn admit(
    store: &RedisStore,
    rule: &Rule,
    who: ClientKey,
    t0: u64,
    from: u64,
    to: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    for i in from..to {
        let v = store
            .check(&[Check::new(who, rule, 1)], t0 + i * 1000)
            .await?;
        if !v.allowed {
            return Err(format!("request {i} denied: the log is full").into());
        }
    }
    Ok(())
}
