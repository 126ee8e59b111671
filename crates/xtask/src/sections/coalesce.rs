//! coalesce: coalesced store calls (`store.max_batch`), the default against `max_batch = 1`,
//! on one redis-server and on a Redis Cluster of three masters, side by side in one run.
//!
//! `tollgate serve` in decision mode pinned alone to one core; the Redis processes and wrk (1
//! thread, 64 connections, 100,000 random `x-api-key`s, token_bucket 100/min, so nearly every
//! request is allowed and is one plan) on the other. On the Cluster also with the far
//! section's many forms: every request a plan of two rules, the second one of ten policies
//! chosen by its path. Redis CPU per decision is the utime +
//! stime of every Redis process over the wrk run divided by the requests; script calls are
//! INFO commandstats' EVALSHA + EVAL over all of them. With `--baseline` the baseline binary
//! runs every case too, in the same rounds (on a Cluster, main's batches were per slot: what
//! per-node batches change shows there).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;
use tollgate_testkit::{RedisCluster, RedisServer};

use super::servers::{self, Wrk};
use super::{log, Ctx};
use crate::markdown::Table;
use crate::procs;
use crate::stats::{ratios, spread, Digits};

const GATEWAY_CPU: u32 = 1;
const LOAD_CPU: u32 = 0;

/// The Redis setups measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Setup {
    Standalone,
    Cluster,
    /// The Cluster, requests matching among ten policies (the far section's many forms).
    ClusterManyForms,
}

impl Setup {
    const ALL: [Setup; 3] = [Setup::Standalone, Setup::Cluster, Setup::ClusterManyForms];

    fn name(self) -> &'static str {
        match self {
            Setup::Standalone => "one redis-server",
            Setup::Cluster => "Redis Cluster, 3 masters",
            Setup::ClusterManyForms => "Redis Cluster, 3 masters, ten forms",
        }
    }

    fn many(self) -> bool {
        self == Setup::ClusterManyForms
    }
}

#[derive(Debug, Default)]
struct Runs {
    rps: Vec<f64>,
    p99_ms: Vec<f64>,
    redis_us: Vec<f64>,
    gateway_us: Vec<f64>,
    calls: Vec<f64>,
    errors: u64,
}

/// A case: the setup, the binary's label, and `max_batch = 1` or the default.
type Key = (Setup, String, bool);

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let title = "### Coalesced store calls: the default `max_batch` against 1, one server and a Cluster\n\n";
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return Ok(format!(
            "{title}Not measured: this needs two CPUs (one for the gateway, one for Redis and wrk).\n"
        ));
    }
    let dir = ctx.dir("coalesce")?;
    let seconds = if ctx.quick { 2 } else { 6 };
    let server = RedisServer::start();
    servers::pin_running(server.pid().unwrap_or(0), LOAD_CPU)?;
    let cluster = RedisCluster::start(3, 0);
    for n in cluster.nodes() {
        servers::pin_running(n.pid().unwrap_or(0), LOAD_CPU)?;
    }
    let mut binaries: Vec<(String, &Path)> = vec![("this build".into(), &ctx.bins.tollgate)];
    if let Some(b) = &ctx.baseline {
        binaries.push(("baseline".into(), b));
    }
    let wrk = |setup: Setup, seconds| Wrk {
        threads: 1,
        connections: 64,
        seconds,
        cpu: Some(LOAD_CPU),
        paths: if setup.many() { 10 } else { 0 },
    };
    let tick_us = 1e6 / procs::ticks_per_second() as f64;
    let mut runs: BTreeMap<Key, Runs> = BTreeMap::new();
    for rep in 1..=ctx.reps {
        for setup in Setup::ALL {
            let nodes: Vec<&RedisServer> = match setup {
                Setup::Standalone => vec![&server],
                Setup::Cluster | Setup::ClusterManyForms => cluster.nodes().iter().collect(),
            };
            let urls: Vec<String> = nodes.iter().map(|n| n.url()).collect();
            for (label, bin) in &binaries {
                // Alternate which setting goes first, so a drifting machine favours neither.
                let order = if rep % 2 == 1 {
                    [true, false]
                } else {
                    [false, true]
                };
                for one in order {
                    log(&format!(
                        "coalesce rep {rep}/{}: {} {label} max_batch {}",
                        ctx.reps,
                        setup.name(),
                        if one { "1" } else { "default" }
                    ));
                    servers::reset_redis(&nodes);
                    let gateway = serve(bin, &dir, setup, &urls, one)?;
                    // Scripts loaded and connections open before the clock starts (ten
                    // forms: the batch scripts too).
                    let warm = if setup.many() { 3 } else { 1 };
                    let logs = ctx.logs.join("coalesce-wrk.txt");
                    wrk(setup, warm).run(&dir, gateway.port, &logs)?;
                    let ((r0, s0), g0) = (
                        servers::redis_usage(&nodes)?,
                        procs::cpu_ticks(gateway.proc.pid())?,
                    );
                    let w = wrk(setup, seconds).run(&dir, gateway.port, &logs)?;
                    let ((r1, s1), g1) = (
                        servers::redis_usage(&nodes)?,
                        procs::cpu_ticks(gateway.proc.pid())?,
                    );
                    drop(gateway);
                    let n = w.requests.max(1) as f64;
                    let redis_us = (r1 - r0) as f64 * tick_us / n;
                    let gateway_us = (g1 - g0) as f64 * tick_us / n;
                    let per_request = (s1 - s0) as f64 / n;
                    let r = runs.entry((setup, label.clone(), one)).or_default();
                    r.rps.push(w.rps());
                    r.p99_ms.push(w.p99_us as f64 / 1000.0);
                    r.redis_us.push(redis_us);
                    r.gateway_us.push(gateway_us);
                    r.calls.push(per_request);
                    r.errors += w.status_errors + w.socket_errors;
                    ctx.emit(
                        "coalesce",
                        json!({"setup": setup.name(), "binary": label, "max_batch_1": one,
                        "rep": rep, "requests": w.requests, "requests_per_s": w.rps(),
                        "p99_us": w.p99_us, "redis_cpu_us_per_decision": redis_us,
                        "gateway_cpu_us_per_request": gateway_us,
                        "script_calls_per_request": per_request,
                        "status_errors": w.status_errors, "socket_errors": w.socket_errors}),
                    )?;
                }
            }
        }
    }
    Ok(format!(
        "{title}`tollgate serve` (decision mode, token_bucket 100/min per `x-api-key`) pinned \
         alone to CPU {GATEWAY_CPU}; the Redis processes (one redis-server, or the three masters \
         of a Cluster) and wrk (1 thread, 64 connections, {seconds} s counted after 1 s of \
         warm-up, 3 s with ten forms, 100,000 random keys, so \
         nearly every request is allowed and is one plan) on CPU {LOAD_CPU}; *ten forms*: every \
         request a plan of two rules, that token bucket (of 100,000/min) and one of ten policies \
         chosen by its path (five algorithms, each enforced and in shadow mode; the far \
         section's many forms), wrk picking one of ten paths at random. Before each run every \
         Redis process is emptied of keys and scripts (`SCRIPT FLUSH`: a script an earlier run \
         loaded weighs on every call). Redis CPU per \
         decision: utime + stime of every Redis process over the run / requests; script calls: \
         INFO commandstats' EVALSHA + EVAL of every Redis process / requests. min / median / \
         max of {} repetition(s), the two settings taking turns; the ratios are default / \
         `max_batch = 1` of the same binary, setup and repetition.\n\n{}",
        ctx.reps,
        render(&runs, &binaries)
    ))
}

fn render(runs: &BTreeMap<Key, Runs>, binaries: &[(String, &Path)]) -> String {
    let sig = Digits::Significant;
    let mut t = Table::new(&[
        "Redis",
        "binary",
        "store.max_batch",
        "requests/s",
        "p99 ms",
        "Redis CPU µs per decision",
        "Redis CPU default / 1",
        "requests/s default / 1",
        "gateway CPU µs per request",
        "script calls per request",
        "errors",
    ]);
    let empty = Runs::default();
    for setup in Setup::ALL {
        for (label, _) in binaries {
            let one = runs.get(&(setup, label.clone(), true)).unwrap_or(&empty);
            for is_one in [true, false] {
                let r = runs.get(&(setup, label.clone(), is_one)).unwrap_or(&empty);
                let (cpu_ratio, rps_ratio) = if is_one {
                    ("1".to_string(), "1".to_string())
                } else {
                    (
                        spread(&ratios(&r.redis_us, &one.redis_us), Digits::Fixed(2)),
                        spread(&ratios(&r.rps, &one.rps), Digits::Fixed(2)),
                    )
                };
                t.row(&[
                    setup.name().to_string(),
                    label.clone(),
                    if is_one { "1" } else { "default (64)" }.to_string(),
                    spread(&r.rps, Digits::Fixed(0)),
                    spread(&r.p99_ms, sig),
                    spread(&r.redis_us, sig),
                    cpu_ratio,
                    rps_ratio,
                    spread(&r.gateway_us, sig),
                    spread(&r.calls, Digits::Fixed(3)),
                    r.errors.to_string(),
                ]);
            }
        }
    }
    t.render()
}

/// Starts `tollgate serve` on `urls` (one: standalone; several: a Cluster), pinned to the
/// gateway's CPU.
fn serve(
    bin: &Path,
    dir: &Path,
    setup: Setup,
    urls: &[String],
    one: bool,
) -> anyhow::Result<servers::Gateway> {
    let store = match setup {
        Setup::Standalone => format!(
            "backend = \"redis\"\nurl = \"{}\"\n",
            urls.first().map_or("", String::as_str)
        ),
        Setup::Cluster | Setup::ClusterManyForms => {
            let list: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
            format!(
                "backend = \"redis-cluster\"\nurls = [{}]\n",
                list.join(", ")
            )
        }
    };
    servers::serve_with(
        bin,
        dir,
        "tollgate-coalesce",
        Some(GATEWAY_CPU),
        |port, admin| {
            format!(
                "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             [store]\n{store}timeout = \"200ms\"\n{}\
             [identity]\nsources = [\"header:x-api-key\", \"ip\"]\nsecret = \"bench\"\n{}",
                if one { "max_batch = 1\n" } else { "" },
                super::far::policies(setup.many())
            )
        },
    )
}
