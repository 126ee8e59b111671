//! Redis's time a request of one client's `sliding_window_log` policy as its log fills: the
//! log is one Redis value of 14 bytes a record, read and written whole by each request. The
//! client is admitted once a millisecond (the store's local clock, so the log holds a record
//! per request) under a limit of 100,000 an hour; at each mark, `calls` more requests are
//! timed by Redis itself (INFO commandstats' `usec_per_call` of EVALSHA, reset first).
//! `tollgate check-config` warns of such logs above 2,000 (tollgate-config's `log_cost.rs`).
//!
//! ```text
//! log_cost --url redis://127.0.0.1:PORT [--marks 1000,10000,50000] [--calls 500]
//! ```
//! Run it against a Redis of its own: it resets that server's command statistics.

use std::time::Duration;
use tollgate_core::{Algorithm, Check, ClientKey, Limit, Quota, Rule};
use tollgate_redis::{RedisConfig, RedisStore, StoreClock};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut url = None;
    let mut marks = vec![1_000u64, 10_000, 50_000];
    let mut calls = 500u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
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
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let url = url.ok_or("--url redis://HOST:PORT is required")?;
    if marks.iter().any(|&m| m < calls || m > 100_000) {
        return Err("each mark must be at least --calls and at most 100000".into());
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
            Quota::new(100_000, Duration::from_secs(3600))?,
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
        admit(&store, &rule, who, t0, n, mark - calls).await?;
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut admin)
            .await?;
        admit(&store, &rule, who, t0, mark - calls, mark).await?;
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
