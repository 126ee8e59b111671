//! gateway: first the CPU per request of each gateway on one core (gateway_cpu), then wrk
//! through `tollgate serve` in proxy mode (memory and Redis stores) against the upstream
//! called directly and nginx `limit_req`, interleaved per repetition. Draws
//! docs/bench/gateway.svg.

use anyhow::Context;
use serde_json::json;
use tollgate_bench::chart::bars::{self, Bar};
use tollgate_bench::chart::Unit;
use tollgate_testkit::RedisServer;

use super::servers::{self, Store, Wrk};
use super::{gateway_cpu, log, Ctx};
use crate::markdown::Table;
use crate::procs;
use crate::stats::{ratios, spread, Digits, Spread};

const PATHS: [&str; 4] = [
    "direct",
    "tollgate-memory",
    "tollgate-redis",
    "nginx-limit_req",
];

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let seconds = if ctx.quick { 3 } else { 6 };
    let cpu = gateway_cpu::table(ctx, seconds)?;

    let dir = ctx.dir("gateway")?;
    let [up, nl] = procs::free_ports()?;
    let _upstream = servers::nginx(&dir, "upstream", &servers::upstream_body(up), up, None)?;
    let _limit = servers::nginx(
        &dir,
        "limit",
        &servers::nginx_limit_body(nl, Some(up)),
        nl,
        None,
    )?;
    let redis = RedisServer::start();
    let memory = servers::serve(
        &ctx.bins.tollgate,
        &dir,
        "gw-memory",
        Some(up),
        Store::Memory,
        None,
    )?;
    let shared = servers::serve(
        &ctx.bins.tollgate,
        &dir,
        "gw-redis",
        Some(up),
        Store::Redis(redis.port()),
        None,
    )?;
    let ports = [up, memory.port, shared.port, nl];
    let wrk = Wrk {
        threads: 2,
        connections: 64,
        seconds,
        cpu: None,
        paths: 0,
    };
    let mut rps: [Vec<f64>; 4] = Default::default();
    let mut p50: [Vec<f64>; 4] = Default::default();
    let mut p99: [Vec<f64>; 4] = Default::default();
    let mut errors = [0u64; 4];
    for rep in 1..=ctx.reps {
        for (i, name) in PATHS.iter().enumerate() {
            log(&format!("gateway rep {rep}/{}: {name}", ctx.reps));
            let w = wrk.run(
                &dir,
                ports[i],
                &ctx.logs.join(format!("wrk-{name}-{rep}.txt")),
            )?;
            rps[i].push(w.rps());
            p50[i].push(w.p50_us as f64 / 1000.0);
            p99[i].push(w.p99_us as f64 / 1000.0);
            errors[i] += w.status_errors + w.socket_errors;
            ctx.emit(
                "gateway",
                json!({"run": name, "rep": rep, "requests_per_s": w.rps(),
                "p50_ms": w.p50_us as f64 / 1000.0, "p99_ms": w.p99_us as f64 / 1000.0,
                "status_errors": w.status_errors, "socket_errors": w.socket_errors}),
            )?;
        }
    }
    let sig = Digits::Significant;
    let mut t = Table::new(&[
        "path",
        "requests/s",
        "p50 ms",
        "p99 ms",
        "requests/s vs direct",
        "requests/s vs nginx limit_req",
        "errors",
    ]);
    for (i, name) in PATHS.iter().enumerate() {
        t.row(&[
            name.to_string(),
            spread(&rps[i], Digits::Fixed(0)),
            spread(&p50[i], sig),
            spread(&p99[i], sig),
            spread(&ratios(&rps[i], &rps[0]), sig),
            spread(&ratios(&rps[i], &rps[3]), sig),
            errors[i].to_string(),
        ]);
    }
    let chart: Vec<Bar> = PATHS
        .iter()
        .zip(&rps)
        .map(|(name, v)| Bar {
            name: name.to_string(),
            value: Spread::of(v).map_or(0.0, |s| s.median),
        })
        .collect();
    let svg = bars::render(
        "requests/s through each path (wrk, median)",
        "throughput",
        Unit::RequestsPerSecond,
        &chart,
        720,
    )?;
    let svg_path = ctx.root.join("docs/bench/gateway.svg");
    std::fs::write(&svg_path, svg)
        .with_context(|| format!("cannot write {}", svg_path.display()))?;
    Ok(format!(
        "{cpu}\n### Gateway: wrk through tollgate serve (proxy mode) vs nginx limit_req\n\n\
         `wrk -t2 -c64 -d{seconds}s --latency` (keep-alive, fixed connections), every request \
         with one of 100,000 random API keys; limit 100/min per key (tollgate: token_bucket; \
         nginx: `limit_req rate=100r/m burst=100 nodelay`). The upstream is an nginx answering \
         200 (1 worker); every limiter is a proxy in front of it. nginx's limit is local to its \
         process: the difference between the last rows is the price of a limit shared through \
         Redis. min / median / max of {} interleaved repetition(s); ratios per repetition \
         against the same repetition's row. Errors: answers of 400 or more and socket errors, \
         over all repetitions.\n\n{}\n![requests/s per path](bench/gateway.svg)\n",
        ctx.reps,
        t.render()
    ))
}
