//! Bytes per tracked key at 1,000,000 keys: the memory store (default config, `max_keys`
//! 1,000,000) against governor's `DefaultKeyedRateLimiter`, each in a fresh child process,
//! measured as the growth of resident memory (/proc/self/statm) divided by the keys tracked.
//!
//! `cargo run --release -p tollgate-memory --example bytes_per_key`

use governor::{DefaultKeyedRateLimiter, Quota as GQuota, RateLimiter};
use std::error::Error;
use std::num::NonZeroU32;
use std::process::Command;
use tollgate_core::{Algorithm, Check, ClientKey, Clock, Limit, Quota, Rule, SystemClock};
use tollgate_memory::{MemoryConfig, MemoryStore};

const KEYS: u64 = 1_000_000;

fn rss_bytes() -> Result<u64, Box<dyn Error>> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .ok_or("statm has no resident field")?
        .parse()?;
    Ok(pages * 4096)
}

fn key(i: u64) -> ClientKey {
    let x = u128::from(i).wrapping_mul(0x2545_f491_4f6c_dd1d_9e37_79b9_7f4a_7c15);
    ClientKey::from_u128(x ^ (x >> 61))
}

/// Inserts the keys; returns (keys tracked, RSS growth in bytes).
fn measure(which: &str) -> Result<(u64, u64), Box<dyn Error>> {
    // Each key is charged 1000 s of units at once (both sides alike), so none goes idle while
    // the million are inserted.
    let prefill = NonZeroU32::new(1_000_000_000).ok_or("zero")?;
    match which {
        "tollgate" => {
            let quota = Quota::per_second(1_000_000)?.with_burst(u64::from(u32::MAX))?;
            let rule = Rule::new("bytes", Limit::new(Algorithm::Gcra, quota)?);
            let before = rss_bytes()?;
            let store = MemoryStore::new(MemoryConfig::default());
            for i in 0..KEYS {
                let checks = [Check::new(key(i), &rule, u64::from(prefill.get()))];
                store.check(&checks, SystemClock.now());
            }
            let after = rss_bytes()?;
            Ok((store.len() as u64, after.saturating_sub(before)))
        }
        "governor" => {
            let rate = NonZeroU32::new(1_000_000).ok_or("zero")?;
            let before = rss_bytes()?;
            let gov: DefaultKeyedRateLimiter<ClientKey> =
                RateLimiter::dashmap(GQuota::per_second(rate).allow_burst(NonZeroU32::MAX));
            for i in 0..KEYS {
                let _ = gov.check_key_n(&key(i), prefill);
            }
            let after = rss_bytes()?;
            Ok((gov.len() as u64, after.saturating_sub(before)))
        }
        other => Err(format!("unknown store {other:?}").into()),
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    if let Some(which) = std::env::args().nth(1) {
        let (keys, bytes) = measure(&which)?;
        println!("{which} {keys} {bytes}");
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    println!("| store | keys tracked | RSS growth (MiB) | bytes per key |");
    println!("|---|---:|---:|---:|");
    let mut per_key = Vec::new();
    for which in ["tollgate", "governor"] {
        let out = Command::new(&exe).arg(which).output()?;
        if !out.status.success() {
            return Err(format!("{which}: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        let text = String::from_utf8(out.stdout)?;
        let fields: Vec<u64> = text
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let [keys, bytes] = fields[..] else {
            return Err(format!("unexpected output {text:?}").into());
        };
        let b = bytes as f64 / keys.max(1) as f64;
        per_key.push(b);
        println!(
            "| {which} | {keys} | {:.1} | {b:.1} |",
            bytes as f64 / 1_048_576.0
        );
    }
    if let [ours, theirs] = per_key[..] {
        println!("\nratio tollgate/governor: {:.2}", ours / theirs);
    }
    Ok(())
}
