//! floor: what Redis itself spends per plan (issue #25), tollgate's scripts against the floor
//! of their key writes.
//!
//! Coalesced calls pay a script call's fixed cost once per batch; what they cannot remove is
//! Redis's work per key (read it, write it with `SET ... PX`, delete it by active expiry).
//! The example `redis_bench --script-floor`, pinned to CPU 1, drives a redis-server of this
//! section's own, pinned alone to CPU 0, with a pipelined RESP client of its own (so the
//! client's cost is not the question), token bucket 100/min, four cases: tollgate's one-plan
//! script (one plan per call), its batch script (64 plans per call), a minimal script (one
//! MGET, then `SET key value PX 600 GET` per key, no decision) and plain pipelined `SET ... PX
//! 600`, with 1,000,000 and 100,000 random keys. Redis CPU per plan is redis-server's utime +
//! stime over a run divided by its plans; the cases take turns within each round, and the
//! ratios to the one-plan script are taken within a round.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use tollgate_testkit::RedisServer;

use super::servers;
use super::{log, split_json_lines, Ctx};
use crate::markdown::Table;
use crate::procs;
use crate::stats::{ratios, spread, Digits};

const REDIS_CPU: u32 = 0;
const CLIENT_CPU: u32 = 1;
const BATCH: usize = 64;
const KEYS: [u64; 2] = [1_000_000, 100_000];

/// The cases, in the example's names and order, with what each row says.
const CASES: [(&str, &str); 4] = [
    (
        "single",
        "tollgate's one-plan script, 1 plan per EVALSHA (64 pipelined)",
    ),
    ("batch", "tollgate's batch script, 64 plans per EVALSHA"),
    (
        "minimal",
        "one MGET of 64 keys, then `SET key value PX 600 GET` each, in a script; no decision",
    ),
    ("set", "plain `SET key value PX 600`, pipelined, no Lua"),
];

/// One run, as the example prints it.
#[derive(Debug, Clone, Deserialize)]
struct Run {
    case: String,
    keys: u64,
    round: u32,
    plans: u64,
    plans_per_s: f64,
    redis_cpu_us_per_plan: f64,
    redis_busy: f64,
    client_busy: f64,
    full_buckets: u64,
    keys_at_end: i64,
}

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let title = "### Redis's floor per plan: tollgate's scripts against a minimal script and plain SETs\n\n";
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return Ok(format!(
            "{title}Not measured: this needs two CPUs (one for redis-server, one for the client).\n"
        ));
    }
    let (seconds, warmup) = if ctx.quick { (2.0, 0.5) } else { (5.0, 1.0) };
    let server = RedisServer::start();
    servers::pin_running(
        server.pid().context("redis-server is not running")?,
        REDIS_CPU,
    )?;
    let info = server.cli(&["info", "server"]);
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map_or("?", str::trim)
        .to_owned();
    let keys: Vec<String> = KEYS.iter().map(u64::to_string).collect();
    let mut cmd: Command = servers::pinned(&ctx.bins.redis_bench, Some(CLIENT_CPU));
    cmd.args(["--script-floor", "--url", &server.url()])
        .args(["--keys", &keys.join(","), "--batch", &BATCH.to_string()])
        .args([
            "--seconds",
            &seconds.to_string(),
            "--warmup",
            &warmup.to_string(),
        ])
        .args(["--rounds", &ctx.reps.to_string()]);
    // Every run: a FLUSHALL, the warm-up, the measured seconds and two short commands.
    let runs = f64::from(ctx.reps) * (KEYS.len() * CASES.len()) as f64;
    let timeout = Duration::from_secs_f64(runs * (seconds + warmup + 5.0) + 60.0);
    let before = load_average();
    log(&format!(
        "floor: {} rounds of {} runs of {seconds} s (load average {before})",
        ctx.reps,
        KEYS.len() * CASES.len()
    ));
    let text = procs::run(cmd, &ctx.logs.join("floor.txt"), timeout)?;
    let after = load_average();
    let (objects, summary) = split_json_lines(&text);
    let mut runs = Vec::with_capacity(objects.len());
    for object in objects {
        ctx.emit("floor", object.clone())?;
        runs.push(
            serde_json::from_value::<Run>(object)
                .context("redis_bench --script-floor printed a run it did not describe")?,
        );
    }
    if runs.is_empty() {
        anyhow::bail!("redis_bench --script-floor printed no run:\n{summary}");
    }
    Ok(format!(
        "{title}Issue #25 asks that coalesced calls cost Redis at most 0.5x the CPU per decision \
         of one plan per call. What Redis spends per plan, token bucket 100/min, by `redis_bench \
         --script-floor --keys {} --batch {BATCH} --seconds {seconds} --warmup {warmup} --rounds \
         {}` (its own pipelined RESP client on std's TcpStream, pinned to CPU {CLIENT_CPU}; \
         the section's own redis-server {version} alone on CPU {REDIS_CPU}): tollgate's \
         scripts with the arguments the store sends, against a minimal script that only reads \
         and writes the keys as the batch script does and against plain `SET`s. Redis CPU per plan: \
         redis-server's utime + stime over a run ({seconds} s after {warmup} s of warm-up, on a \
         flushed database) / plans answered. min / median / max of {} round(s), the cases \
         taking turns within each; the ratio is to the one-plan script of the same round and \
         key count. Redis busy: its CPU time / the run's time (1 = never idle; less when the \
         client or another process on its core held it back). Full buckets: plans that found \
         no state (a key new or expired). Load average before the runs {before}, after \
         {after}.\n\n{}",
        keys.join(","),
        ctx.reps,
        ctx.reps,
        render(&runs)
    ))
}

/// The table: per key count and case, Redis CPU per plan, its ratio to `single` by round,
/// plans/s and how busy Redis was.
fn render(runs: &[Run]) -> String {
    let sig = Digits::Significant;
    let mut t = Table::new(&[
        "random keys",
        "case",
        "Redis CPU µs per plan",
        "ratio to one plan per call",
        "plans/s",
        "Redis busy",
        "client busy",
        "full buckets",
        "keys in Redis at the end",
    ]);
    // (keys, case) -> round -> run.
    let mut by: BTreeMap<(u64, &str), BTreeMap<u32, &Run>> = BTreeMap::new();
    for r in runs {
        by.entry((r.keys, r.case.as_str()))
            .or_default()
            .insert(r.round, r);
    }
    let empty = BTreeMap::new();
    for keys in KEYS {
        let single = by.get(&(keys, "single")).unwrap_or(&empty);
        for (case, label) in CASES {
            let mine = by.get(&(keys, case)).unwrap_or(&empty);
            let field = |f: fn(&Run) -> f64| -> Vec<f64> { mine.values().map(|r| f(r)).collect() };
            // Paired by round: a round either side lacks is left out.
            let (ours, theirs): (Vec<f64>, Vec<f64>) = mine
                .iter()
                .filter_map(|(round, r)| {
                    Some((
                        r.redis_cpu_us_per_plan,
                        single.get(round)?.redis_cpu_us_per_plan,
                    ))
                })
                .unzip();
            let ratio = if case == "single" {
                "1".to_string()
            } else {
                spread(&ratios(&ours, &theirs), Digits::Fixed(2))
            };
            let full = field(|r| r.full_buckets as f64 / r.plans.max(1) as f64);
            t.row(&[
                format_count(keys),
                format!("{case}: {label}"),
                spread(&field(|r| r.redis_cpu_us_per_plan), Digits::Fixed(2)),
                ratio,
                spread(&field(|r| r.plans_per_s), Digits::Fixed(0)),
                spread(&field(|r| r.redis_busy), Digits::Fixed(2)),
                spread(&field(|r| r.client_busy), Digits::Fixed(2)),
                if matches!(case, "single" | "batch") {
                    spread(&full, Digits::Fixed(2))
                } else {
                    "-".to_string()
                },
                spread(&field(|r| r.keys_at_end as f64), sig),
            ]);
        }
    }
    t.render()
}

/// 1000000 -> `1,000,000`.
fn format_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// /proc/loadavg's three averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(case: &str, keys: u64, round: u32, us: f64) -> Run {
        Run {
            case: case.into(),
            keys,
            round,
            plans: 1000,
            plans_per_s: 1e6 / us,
            redis_cpu_us_per_plan: us,
            redis_busy: 0.98,
            client_busy: 0.2,
            full_buckets: 900,
            keys_at_end: 90_000,
        }
    }

    #[test]
    fn the_ratio_is_taken_within_a_round_and_key_count() {
        let runs = [
            run("single", 1_000_000, 1, 6.0),
            run("batch", 1_000_000, 1, 4.2),
            run("single", 1_000_000, 2, 12.0),
            run("batch", 1_000_000, 2, 6.0),
            // A round the one-plan script lacks is left out of the ratio.
            run("batch", 1_000_000, 3, 1.0),
            run("single", 100_000, 1, 5.0),
            run("set", 100_000, 1, 2.0),
        ];
        let md = render(&runs);
        let row = |start: &str| {
            md.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_default()
                .to_string()
        };
        let batch = row("| 1,000,000 | batch:");
        assert!(
            batch.contains("| 1.00 / 4.20 / 6.00 | 0.50 / 0.50 / 0.70 |"),
            "{md}"
        );
        assert!(batch.contains("| 0.90 / 0.90 / 0.90 |"), "{md}");
        let set = row("| 100,000 | set:");
        assert!(set.contains("| 2.00 | 0.40 |"), "{md}");
        assert!(set.ends_with("| - | 90000 |"), "{md}");
        assert!(row("| 100,000 | minimal:").contains("| n/a |"), "{md}");
        assert!(
            row("| 1,000,000 | single:").contains("| 6.00 / 6.00 / 12.00 | 1 |"),
            "{md}"
        );
    }

    #[test]
    fn counts_are_written_with_separators() {
        assert_eq!(format_count(1_000_000), "1,000,000");
        assert_eq!(format_count(100_000), "100,000");
        assert_eq!(format_count(64), "64");
    }

    #[test]
    fn the_examples_json_line_is_a_run() {
        let line = r#"{"case":"batch","keys":1000000,"batch":64,"round":2,"plans":500,"seconds":5.001,"plans_per_s":100,"redis_cpu_us_per_plan":4.3,"redis_busy":0.99,"client_busy":0.1,"allowed":500,"full_buckets":450,"keys_at_end":80000}"#;
        let r: Run = serde_json::from_str(line).expect("a run");
        assert_eq!(
            (r.case.as_str(), r.keys, r.round, r.plans),
            ("batch", 1_000_000, 2, 500)
        );
    }
}
