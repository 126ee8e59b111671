//! peers: tollgate's RedisStore, limitador and rate-limiter-flexible (benches/peers/) and raw
//! pipelined EVALSHA on one redis-server, interleaved in every repetition: 64 concurrent
//! callers over 100,000 clients, 100/min per client.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};
use tollgate_testkit::RedisServer;

use super::servers::{self, flush};
use super::{log, Ctx};
use crate::markdown::Table;
use crate::procs;
use crate::stats::{ratios, spread, Digits};

/// Decisions/s and latency of one client run.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClientRun {
    pub decisions_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// One run of the example redis_bench (`RedisStore::check`, 64 callers, one connection).
pub(super) fn redis_bench(
    ctx: &Ctx,
    redis: &RedisServer,
    algorithm: &str,
    requests: u64,
    log_name: &str,
) -> anyhow::Result<ClientRun> {
    let mut cmd = Command::new(&ctx.bins.redis_bench);
    cmd.args(["--url", &redis.url(), "--algorithm", algorithm])
        .args(["--requests", &requests.to_string()])
        .args([
            "--callers",
            "64",
            "--clients",
            "100000",
            "--connections",
            "1",
            "--threads",
            "1",
        ]);
    let out = procs::run(cmd, &ctx.logs.join(log_name), Duration::from_secs(600))?;
    let fields = key_values(&out);
    let get = |k: &str| -> anyhow::Result<f64> {
        fields
            .get(k)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("redis_bench printed no {k}: {out}"))
    };
    Ok(ClientRun {
        decisions_per_s: get("decisions_per_s")?,
        p50_us: get("p50_us")?,
        p99_us: get("p99_us")?,
    })
}

/// `a=1 b=2` -> {a: 1, b: 2}, from the last line that has any.
fn key_values(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .rev()
        .find(|l| l.contains('='))
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// One redis-benchmark run on `redis`: its rps.
pub(super) fn redis_benchmark(
    ctx: &Ctx,
    redis: &RedisServer,
    options: &[&str],
    command: &[&str],
) -> anyhow::Result<f64> {
    let mut cmd = Command::new("redis-benchmark");
    cmd.args(["-h", "127.0.0.1", "-p", &redis.port().to_string()])
        .args(options)
        .arg("--csv")
        .args(command);
    let out = procs::run(
        cmd,
        &ctx.logs.join("redis-benchmark.csv"),
        Duration::from_secs(600),
    )?;
    servers::csv_rps(&out)
}

/// The sha of each script the store loads, written to `dir` by `redis_bench --print-scripts`.
pub(super) fn print_scripts(ctx: &Ctx, dir: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let mut cmd = Command::new(&ctx.bins.redis_bench);
    cmd.arg("--print-scripts").arg(dir);
    let out = procs::run(
        cmd,
        &ctx.logs.join("print-scripts.txt"),
        Duration::from_secs(60),
    )?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, s)| (n.to_owned(), s.trim().to_owned()))
        .collect())
}

/// A peer's JSON line: decisions_per_s, p50_us, p99_us.
fn peer_run(
    mut cmd: Command,
    redis: &RedisServer,
    seconds: u64,
    log: &Path,
) -> anyhow::Result<(ClientRun, Value)> {
    cmd.args([
        "--url",
        &redis.url(),
        "--callers",
        "64",
        "--clients",
        "100000",
    ])
    .args(["--seconds", &seconds.to_string()]);
    let out = procs::run(cmd, log, Duration::from_secs(seconds + 120))?;
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("the peer printed no JSON line: {out}"))?;
    let v: Value = serde_json::from_str(line.trim()).with_context(|| format!("{line:?}"))?;
    let get = |k: &str| v[k].as_f64().with_context(|| format!("no {k} in {line}"));
    Ok((
        ClientRun {
            decisions_per_s: get("decisions_per_s")?,
            p50_us: get("p50_us")?,
            p99_us: get("p99_us")?,
        },
        v,
    ))
}

#[derive(Debug, Default)]
struct Column {
    rate: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
}

impl Column {
    fn push(&mut self, r: ClientRun) {
        self.rate.push(r.decisions_per_s);
        self.p50.push(r.p50_us);
        self.p99.push(r.p99_us);
    }
}

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let peers = ctx.peers.clone().context("the peers were not built")?;
    let (seconds, n) = if ctx.quick { (3, 40_000) } else { (6, 200_000) };
    let redis = RedisServer::start();
    let dir = ctx.dir("peers-scripts")?;
    let shas = print_scripts(ctx, &dir)?;
    let sha = shas
        .get("token_bucket")
        .context("no token_bucket script")?
        .clone();
    let text = std::fs::read_to_string(dir.join("token_bucket.lua")).context("token_bucket.lua")?;
    servers::load_script(&redis, &text)?;

    let mut raw: Vec<f64> = Vec::new();
    let (mut ours, mut fw) = (Column::default(), Column::default());
    let (mut lim, mut rlf) = (Column::default(), Column::default());
    for rep in 1..=ctx.reps {
        log(&format!("peers rep {rep}/{}", ctx.reps));
        flush(&redis);
        // The single-policy script of a 100-per-minute token bucket: its argument is the cost.
        let v = redis_benchmark(
            ctx,
            &redis,
            &["-P", "32", "-c", "64", "-n", &n.to_string(), "-r", "100000"],
            &[
                "EVALSHA",
                &sha,
                "1",
                "tollgate:{__rand_int__}:token_bucket",
                "1",
            ],
        )?;
        raw.push(v);
        ctx.emit(
            "peers",
            json!({"peer": "redis-benchmark EVALSHA", "rep": rep, "decisions_per_s": v}),
        )?;
        for (algorithm, column, label) in [
            ("token_bucket", &mut ours, "tollgate RedisStore"),
            ("fixed_window", &mut fw, "tollgate RedisStore fixed_window"),
        ] {
            flush(&redis);
            let r = redis_bench(
                ctx,
                &redis,
                algorithm,
                n,
                &format!("peers-{algorithm}-{rep}.txt"),
            )?;
            column.push(r);
            ctx.emit(
                "peers",
                json!({"peer": label, "rep": rep, "decisions_per_s": r.decisions_per_s,
                                      "p50_us": r.p50_us, "p99_us": r.p99_us}),
            )?;
        }
        if let Ok(bin) = &peers.limitador {
            flush(&redis);
            let (r, v) = peer_run(
                Command::new(bin),
                &redis,
                seconds,
                &ctx.logs.join(format!("peers-limitador-{rep}.txt")),
            )?;
            lim.push(r);
            ctx.emit("peers", json!({"peer": "limitador", "rep": rep, "run": v}))?;
        }
        if let Ok(script) = &peers.rlf {
            flush(&redis);
            let mut cmd = Command::new("node");
            cmd.arg(script);
            let (r, v) = peer_run(
                cmd,
                &redis,
                seconds,
                &ctx.logs.join(format!("peers-rlf-{rep}.txt")),
            )?;
            rlf.push(r);
            ctx.emit(
                "peers",
                json!({"peer": "rate-limiter-flexible", "rep": rep, "run": v}),
            )?;
        }
    }

    let sig = Digits::Significant;
    let us = |v: &[f64]| format!("{} us", spread(v, sig));
    let mut t = Table::new(&[
        "client",
        "decisions/s",
        "p50",
        "p99",
        "decisions/s vs tollgate RedisStore",
    ]);
    t.row(&[
        "redis-benchmark raw EVALSHA (pipelined, no client logic)".to_owned(),
        spread(&raw, sig),
        String::new(),
        String::new(),
        spread(&ratios(&raw, &ours.rate), sig),
    ]);
    t.row(&[
        format!(
            "**tollgate RedisStore**, token_bucket (tollgate-redis {})",
            env!("CARGO_PKG_VERSION")
        ),
        spread(&ours.rate, sig),
        us(&ours.p50),
        us(&ours.p99),
        "1".to_owned(),
    ]);
    t.row(&[
        "**tollgate RedisStore**, fixed_window (the peers' algorithm)".to_owned(),
        spread(&fw.rate, sig),
        us(&fw.p50),
        us(&fw.p99),
        spread(&ratios(&fw.rate, &ours.rate), sig),
    ]);
    match &peers.limitador {
        Ok(_) => t.row(&[
            format!(
                "limitador {} (AsyncRedisStorage)",
                limitador_version(&ctx.root)
            ),
            spread(&lim.rate, sig),
            us(&lim.p50),
            us(&lim.p99),
            spread(&ratios(&lim.rate, &ours.rate), sig),
        ]),
        Err(e) => t.row(&[
            "limitador".to_owned(),
            format!("not measured: build failed: `{e}`"),
        ]),
    }
    match &peers.rlf {
        Ok(_) => t.row(&[
            format!(
                "rate-limiter-flexible {} (RateLimiterRedis, ioredis, node {})",
                rlf_version(&ctx.root),
                crate::tools::version("node", &["--version"])
            ),
            spread(&rlf.rate, sig),
            us(&rlf.p50),
            us(&rlf.p99),
            spread(&ratios(&rlf.rate, &ours.rate), sig),
        ]),
        Err(e) => t.row(&[
            "rate-limiter-flexible".to_owned(),
            format!("not measured: {e}"),
        ]),
    }
    let built = if peers.limitador.is_ok() {
        format!(
            " limitador-peer was built in {} s in this run ({}; a few seconds when cached).",
            peers.limitador_build_s, peers.limitador_rocksdb
        )
    } else {
        String::new()
    };
    Ok(format!(
        "### Redis store vs peers on the same redis-server\n\n\
         One redis-server {} on loopback; 64 concurrent callers over 100,000 clients, 100 per \
         minute per client, one connection per process. Both peers count fixed windows \
         (INCR-style scripts, cheaper inside Redis than a token bucket): compare them with \
         tollgate's fixed_window row; the last column is against tollgate's token bucket. \
         redis-benchmark runs tollgate's token bucket script with EVALSHA, pipelined (-P 32 -c \
         64): the most one Redis does here, the ceiling of every client. tollgate: `redis_bench \
         --callers 64 --clients 100000 --requests {n}`; peers: benches/peers/ for {seconds} s \
         each. min / median / max of {} interleaved repetition(s); the ratio is per repetition, \
         against tollgate's RedisStore in the same repetition.{built}\n\n{}",
        servers::redis_version(),
        ctx.reps,
        t.render()
    ))
}

/// limitador's version in the peer's lock file.
fn limitador_version(root: &Path) -> String {
    let lock = std::fs::read_to_string(root.join("benches/peers/limitador/Cargo.lock"))
        .unwrap_or_default();
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "name = \"limitador\"" {
            if let Some(v) = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = "))
            {
                return v.trim_matches('"').to_owned();
            }
        }
    }
    String::new()
}

/// rate-limiter-flexible's installed version.
fn rlf_version(root: &Path) -> String {
    let path = root.join(
        "benches/peers/rate-limiter-flexible/node_modules/rate-limiter-flexible/package.json",
    );
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_bench_lines_are_read_as_key_values() {
        let out = "warming up\nalgorithm=gcra requests=200000 decisions_per_s=95000 p50_us=480 p99_us=930 allowed=1\n";
        let kv = key_values(out);
        assert_eq!(kv["decisions_per_s"], "95000");
        assert_eq!(kv["p99_us"], "930");
        assert!(key_values("nothing here").is_empty());
    }
}
