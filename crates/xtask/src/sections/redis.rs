//! redis: the Redis store's scripts inside Redis, then its client, on one redis-server.
//!
//! 1. redis-benchmark: EVALSHA throughput of tollgate's script per algorithm (-P 32 -c 50,
//!    100,000 random clients), against a naive HMGET/HSET/PEXPIRE token bucket script in the
//!    same round: the script's cost inside Redis, the ceiling of every gateway sharing it.
//!    Twice: store clock (both read Redis TIME) and caller's clock (both take now as an
//!    argument). Reference rows: a no-op script and an unvalidated GCRA.
//! 2. redis_bench (`RedisStore::check`, 64 callers, one connection): decisions/s, p50/p99,
//!    the ratio to raw EVALSHA and the Redis CPU it costs per request.
//! 3. 100 hot clients (nearly every request denied), two policies per request, and MEMORY
//!    USAGE of one key per algorithm.
//!
//! Why ABBA: tollgate, naive, naive, tollgate in every round and the ratio of the sums, so a
//! machine whose speed drifts during the four runs favours neither side.

use std::collections::BTreeMap;

use anyhow::Context;
use serde_json::json;
use tollgate_testkit::RedisServer;

use super::peers::{print_scripts, redis_bench, redis_benchmark};
use super::servers::{self, flush};
use super::{log, Ctx};
use crate::markdown::Table;
use crate::procs;
use crate::stats::{median, Digits, Spread};

const ALGORITHMS: [&str; 6] = [
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
    "leaky_bucket",
    "gcra",
];
/// Naive token bucket arguments: capacity, rate per second, cost.
const NAIVE_ARGS: [&str; 3] = ["100", "1.6666666666666667", "1"];
const NOW_US: &str = "1764442000123456";
const NOW_S: &str = "1764442000.123456";
/// The generic script's arguments for token bucket 100/min and GCRA 1,000/h.
const CHECK_ARGS: [&str; 13] = [
    "",
    "token_bucket",
    "100",
    "60000000",
    "100",
    "1",
    "0",
    "gcra",
    "1000",
    "3600000000",
    "1000",
    "1",
    "0",
];

/// One redis-server and the load against it.
struct Lab<'a> {
    ctx: &'a Ctx,
    redis: RedisServer,
    requests: u64,
    client_requests: u64,
    tick_ns: u64,
}

impl Lab<'_> {
    /// EVALSHA/s of one redis-benchmark run on an empty database over `clients` client tags.
    fn rps(&self, clients: u64, command: &[&str]) -> anyhow::Result<f64> {
        flush(&self.redis);
        let (n, r) = (self.requests.to_string(), clients.to_string());
        redis_benchmark(
            self.ctx,
            &self.redis,
            &["-P", "32", "-c", "50", "-n", &n, "-r", &r],
            command,
        )
    }

    /// Like `rps`, with redis-server's CPU ns per request.
    fn rps_cpu(&self, command: &[&str]) -> anyhow::Result<(f64, f64)> {
        let t0 = self.redis_ticks()?;
        let rps = self.rps(100_000, command)?;
        let t1 = self.redis_ticks()?;
        Ok((
            rps,
            ((t1 - t0) * self.tick_ns) as f64 / self.requests as f64,
        ))
    }

    /// redis-benchmark at the client's own concurrency: 64 connections, no pipelining.
    fn c64(&self, sha: &str, algorithm: &str) -> anyhow::Result<f64> {
        flush(&self.redis);
        let key = format!("tollgate:{{__rand_int__}}:{algorithm}");
        let n = self.requests.to_string();
        redis_benchmark(
            self.ctx,
            &self.redis,
            &["-P", "1", "-c", "64", "-n", &n, "-r", "100000"],
            &["EVALSHA", sha, "1", &key],
        )
    }

    /// One RedisStore::check run: decisions/s, p50, p99 and Redis CPU ns per request.
    fn client(&self, algorithm: &str, rep: u32) -> anyhow::Result<[f64; 4]> {
        flush(&self.redis);
        let t0 = self.redis_ticks()?;
        let r = redis_bench(
            self.ctx,
            &self.redis,
            algorithm,
            self.client_requests,
            &format!("redis-client-{algorithm}-{rep}.txt"),
        )?;
        let t1 = self.redis_ticks()?;
        // redis_bench sends a tenth more as warm-up.
        let cpu = ((t1 - t0) * self.tick_ns * 10) as f64 / (self.client_requests * 11) as f64;
        Ok([r.decisions_per_s, r.p50_us, r.p99_us, cpu])
    }

    fn redis_ticks(&self) -> anyhow::Result<u64> {
        procs::cpu_ticks(self.redis.pid().context("redis-server is not running")?)
    }
}

/// Every figure of one algorithm, over the rounds.
#[derive(Debug, Default)]
struct Figures {
    ours: Vec<f64>,
    naive: Vec<f64>,
    r_store: Vec<f64>,
    local: Vec<f64>,
    naive_local: Vec<f64>,
    r_local: Vec<f64>,
    client: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    r_client: Vec<f64>,
    r_cpu: Vec<f64>,
    c64: Vec<f64>,
    r_client64: Vec<f64>,
    hot: Vec<f64>,
    naive_hot: Vec<f64>,
    r_hot: Vec<f64>,
}

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let (requests, client_requests, algorithms): (u64, u64, &[&str]) = if ctx.quick {
        (20_000, 20_000, &["token_bucket", "gcra"])
    } else {
        (50_000, 100_000, &ALGORITHMS)
    };
    let lab = Lab {
        ctx,
        redis: RedisServer::start(),
        requests,
        client_requests,
        tick_ns: 1_000_000_000 / procs::ticks_per_second(),
    };
    let dir = ctx.dir("redis-scripts")?;
    let shas = print_scripts(ctx, &dir)?;
    for name in shas.keys() {
        let text = std::fs::read_to_string(dir.join(format!("{name}.lua")))
            .with_context(|| format!("{name}.lua"))?;
        servers::load_script(&lab.redis, &text)?;
    }
    let sha = |name: &str| {
        shas.get(name)
            .cloned()
            .with_context(|| format!("no script {name}"))
    };
    let benches = ctx.root.join("crates/tollgate-redis/benches");
    let load = |file: &str| -> anyhow::Result<String> {
        let text = std::fs::read_to_string(benches.join(file)).with_context(|| file.to_owned())?;
        servers::load_script(&lab.redis, &text)
    };
    let naive = load("naive_token_bucket.lua")?;
    let naive_now = load("naive_token_bucket_now.lua")?;
    let floor = load("floor_gcra.lua")?;
    let noop = servers::load_script(&lab.redis, "return 1")?;
    let (set2, check) = (sha("set2")?, sha("check")?);

    let naive_cmd: Vec<&str> = ["EVALSHA", &naive, "1", "naive:{__rand_int__}:tb"]
        .into_iter()
        .chain(NAIVE_ARGS)
        .collect();
    let naive_now_cmd: Vec<&str> = ["EVALSHA", &naive_now, "1", "naive:{__rand_int__}:tb"]
        .into_iter()
        .chain(NAIVE_ARGS)
        .chain([NOW_S])
        .collect();
    let two_keys = [
        "2",
        "tollgate:{__rand_int__}:a",
        "tollgate:{__rand_int__}:b",
    ];
    let set_cmd: Vec<&str> = ["EVALSHA", &set2].into_iter().chain(two_keys).collect();
    let generic_cmd: Vec<&str> = ["EVALSHA", &check]
        .into_iter()
        .chain(two_keys)
        .chain(CHECK_ARGS)
        .collect();

    let mut figures: BTreeMap<&str, Figures> = BTreeMap::new();
    let (mut noops, mut floors, mut sets, mut generics, mut r_set) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=ctx.reps {
        log(&format!("redis round {round}/{}", ctx.reps));
        noops.push(lab.rps(100_000, &["EVALSHA", &noop, "1", "x:{__rand_int__}:noop"])?);
        floors.push(lab.rps(
            100_000,
            &[
                "EVALSHA",
                &floor,
                "1",
                "floor:{__rand_int__}:gcra",
                "",
                "gcra",
                "100",
                "60000000",
                "100",
                "1",
            ],
        )?);
        let s1 = lab.rps(100_000, &set_cmd)?;
        let g1 = lab.rps(100_000, &generic_cmd)?;
        let g2 = lab.rps(100_000, &generic_cmd)?;
        let s2 = lab.rps(100_000, &set_cmd)?;
        sets.extend([s1, s2]);
        generics.extend([g1, g2]);
        r_set.push((s1 + s2) / (g1 + g2));
        for &alg in algorithms {
            let f = figures.entry(alg).or_default();
            let s = sha(alg)?;
            let key = format!("tollgate:{{__rand_int__}}:{alg}");
            let ours_cmd = ["EVALSHA", s.as_str(), "1", key.as_str()];
            let a1 = lab.rps(100_000, &ours_cmd)?;
            let b1 = lab.rps(100_000, &naive_cmd)?;
            let b2 = lab.rps(100_000, &naive_cmd)?;
            let (a2, u2) = lab.rps_cpu(&ours_cmd)?;
            f.r_store.push((a1 + a2) / (b1 + b2));
            // The client, framed by redis-benchmark at its own concurrency and by the raw
            // pipelined EVALSHA runs (a2 and a3).
            let k1 = lab.c64(&s, alg)?;
            let [c1, p50a, p99a, v1] = lab.client(alg, round)?;
            let [c2, p50b, p99b, v2] = lab.client(alg, round)?;
            let k2 = lab.c64(&s, alg)?;
            let (a3, u3) = lab.rps_cpu(&ours_cmd)?;
            f.r_cpu.push((v1 + v2) / (u2 + u3));
            f.ours.extend([a1, a2, a3]);
            f.naive.extend([b1, b2]);
            f.c64.extend([k1, k2]);
            f.client.extend([c1, c2]);
            f.p50.extend([p50a, p50b]);
            f.p99.extend([p99a, p99b]);
            f.r_client.push((c1 + c2) / (a2 + a3));
            f.r_client64.push((c1 + c2) / (k1 + k2));
            let local_cmd = ["EVALSHA", s.as_str(), "1", key.as_str(), "1", NOW_US];
            let a1 = lab.rps(100_000, &local_cmd)?;
            let b1 = lab.rps(100_000, &naive_now_cmd)?;
            let b2 = lab.rps(100_000, &naive_now_cmd)?;
            let a2 = lab.rps(100_000, &local_cmd)?;
            f.local.extend([a1, a2]);
            f.naive_local.extend([b1, b2]);
            f.r_local.push((a1 + a2) / (b1 + b2));
            // 100 hot clients exhaust their quota: nearly every request is denied.
            let h1 = lab.rps(100, &ours_cmd)?;
            let h2 = lab.rps(100, &naive_cmd)?;
            f.hot.push(h1);
            f.naive_hot.push(h2);
            f.r_hot.push(h1 / h2);
            ctx.emit(
                "redis",
                json!({"round": round, "algorithm": alg,
                "tollgate_evalsha_per_s": [a1, a2, a3], "naive_evalsha_per_s": [b1, b2],
                "ratio_store_clock": f.r_store.last(), "ratio_local_clock": f.r_local.last(),
                "client_decisions_per_s": [c1, c2], "client_p50_us": [p50a, p50b],
                "client_p99_us": [p99a, p99b], "client_vs_raw": f.r_client.last(),
                "redis_cpu_client_vs_raw": f.r_cpu.last(), "c64_evalsha_per_s": [k1, k2],
                "hot_tollgate": h1, "hot_naive": h2}),
            )?;
        }
        ctx.emit(
            "redis",
            json!({"round": round, "noop": noops.last(), "floor_gcra": floors.last(),
            "policy_set": [s1, s2], "generic": [g1, g2], "ratio_set_generic": r_set.last()}),
        )?;
    }
    let memory = memory_usage(&lab, algorithms, &sha, &naive)?;
    Ok(render(
        &lab,
        algorithms,
        &figures,
        [&noops, &floors, &sets, &generics, &r_set],
        &memory,
    ))
}

/// MEMORY USAGE of one client's key per algorithm: after 1 request, and after 100 (one
/// round trip each, so at distinct microseconds).
fn memory_usage(
    lab: &Lab,
    algorithms: &[&str],
    sha: &dyn Fn(&str) -> anyhow::Result<String>,
    naive: &str,
) -> anyhow::Result<Table> {
    flush(&lab.redis);
    let usage = |key: &str| {
        lab.redis
            .cli(&["memory", "usage", key, "samples", "0"])
            .trim()
            .to_owned()
    };
    let mut t = Table::new(&[
        "algorithm",
        "after 1 request",
        "after 100 requests in one window",
    ]);
    for &alg in algorithms {
        let key = format!("tollgate:{{0123456789abcdef0123456789abcdef}}:{alg}");
        let s = sha(alg)?;
        lab.redis.cli(&["evalsha", &s, "1", &key]);
        let one = usage(&key);
        for _ in 0..99 {
            lab.redis.cli(&["evalsha", &s, "1", &key]);
        }
        t.row(&[
            alg.to_owned(),
            format!("{one} B"),
            format!("{} B", usage(&key)),
        ]);
    }
    let key = "naive:{0123456789abcdef0123456789abcdef}:tb";
    let mut args = vec!["evalsha", naive, "1", key];
    args.extend(NAIVE_ARGS);
    lab.redis.cli(&args);
    t.row(&[
        "naive token bucket (hash of 2 floats)".to_owned(),
        format!("{} B", usage(key)),
    ]);
    Ok(t)
}

fn render(
    lab: &Lab,
    algorithms: &[&str],
    figures: &BTreeMap<&str, Figures>,
    refs: [&Vec<f64>; 5],
    memory: &Table,
) -> String {
    let whole = Digits::Fixed(0);
    let r = |v: &[f64]| {
        Spread::of(v).map_or_else(String::new, |s| s.show_median_first(Digits::Fixed(2)))
    };
    let m = |v: &[f64]| median(v, whole);
    let mut main = Table::new(&[
        "algorithm",
        "tollgate EVALSHA/s, store clock",
        "naive, Redis TIME",
        "tollgate / naive",
        "tollgate, clock = local",
        "naive, now from ARGV",
        "tollgate / naive",
        "RedisStore::check decisions/s",
        "p50",
        "p99",
        "client / raw EVALSHA",
        "Redis CPU per request, client / raw",
        "redis-benchmark -P 1 -c 64",
        "client / that",
    ]);
    let mut hot = Table::new(&[
        "algorithm",
        "tollgate EVALSHA/s",
        "naive token bucket EVALSHA/s",
        "tollgate / naive",
    ]);
    for &alg in algorithms {
        let Some(f) = figures.get(alg) else { continue };
        main.row(&[
            alg.to_owned(),
            m(&f.ours),
            m(&f.naive),
            r(&f.r_store),
            m(&f.local),
            m(&f.naive_local),
            r(&f.r_local),
            m(&f.client),
            format!("{} us", m(&f.p50)),
            format!("{} us", m(&f.p99)),
            r(&f.r_client),
            r(&f.r_cpu),
            m(&f.c64),
            r(&f.r_client64),
        ]);
        hot.row(&[alg.to_owned(), m(&f.hot), m(&f.naive_hot), r(&f.r_hot)]);
    }
    let [noops, floors, sets, generics, r_set] = refs;
    main.row(&["reference: no-op script (`return 1`)".to_owned(), m(noops)]);
    main.row(&[
        "reference: unvalidated GCRA (benches/floor_gcra.lua)".to_owned(),
        m(floors),
    ]);
    let mut two = Table::new(&["script", "EVALSHA/s", "set / generic"]);
    two.row(&["policy set".to_owned(), m(sets), r(r_set)]);
    two.row(&["generic check.lua".to_owned(), m(generics)]);
    format!(
        "### Redis store: scripts inside Redis, and the client\n\n\
         redis-server {}; {} requests per redis-benchmark run, {} per RedisStore::check run; \
         policy: 100 per minute, burst 100, cost 1. Requests/s are medians of {} interleaved \
         round(s); each tollgate / naive ratio is the median (min-max) of per-round ratios of \
         runs in the order tollgate, naive, naive, tollgate (sums compared); the client's two \
         runs per round are framed the same way by the runs it is compared with.\n\n{}\n\
         100 hot clients instead of 100,000 (after the first 10,000 requests nearly every \
         request is denied: tollgate's script does not write a denial, the naive one always \
         writes):\n\n{}\n\
         Two policies per request (token bucket 100 per minute and GCRA 1,000 per hour, 100,000 \
         clients): the script generated for that policy set against the generic multi-policy \
         script (check.lua, quotas as arguments, table reply):\n\n{}\n\
         Memory per limited client (MEMORY USAGE of its key, one policy):\n\n{}",
        servers::redis_version(),
        lab.requests,
        lab.client_requests,
        lab.ctx.reps,
        main.render(),
        hot.render(),
        two.render(),
        memory.render(),
    )
}
