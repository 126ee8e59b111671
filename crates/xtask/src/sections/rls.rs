//! rls: what Envoy users run. `tollgate serve`'s rate limit service (gRPC `ShouldRateLimit`)
//! pinned alone to one core on a real redis-server, driven by `tollgate bench --rls` from the
//! other core, for three request shapes (one descriptor; three nested entries matched through
//! a wildcard; ten descriptors), next to the HTTP decision mode of the same process on the same
//! store. CPU per decision is the gateway's utime + stime over the run divided by the answers:
//! the cost of a decision whatever the load generator's own speed.
//!
//! After the shapes, in every repetition, the servers under the two front ends are measured
//! with no limiter at all (the examples `http_floor` and `rls_floor`, the latter answering as
//! many statuses as a shape has descriptors) under the same loads, so the table can say how
//! much of a decision is the limiter and how much the HTTP or HTTP/2 server under it.
//!
//! With `--baseline TOLLGATE_BIN` every run is made on both binaries in turn (this build, then
//! the baseline, within each repetition and shape: ABAB), so "no change makes the simple case
//! slower" is read from ratios taken side by side, never across runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};
use tollgate_testkit::RedisServer;

use super::servers;
use super::{log, Ctx};
use crate::markdown::Table;
use crate::procs::{self, Proc};
use crate::stats::{ratios, spread, Digits};

const GATEWAY_CPU: u32 = 1;
const LOAD_CPU: u32 = 0;
/// Virtual clients of every run, each its own counter.
const CLIENTS: u64 = 10_000;
/// Concurrent requests of the load generator.
const CONNECTIONS: u64 = 64;
/// HTTP/2 connections to the RLS (Envoy opens a few per worker, not one per request).
const CHANNELS: usize = 4;
/// How long a server gets to listen.
const START: Duration = Duration::from_secs(15);

/// The rules every shape matches. A limit no client reaches, so every answer is a full
/// decision that reaches Redis. The nested shape's middle level is a trailing `*` (matched the
/// same by a prefix and by a wildcard-anywhere matcher), with sibling rules it must not take.
const YAML: &str = "\
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: token_bucket}
  - key: tenant
    descriptors:
      - key: path
        value: /admin/*
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: path
        value: /api/v1/users
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: path
        value: /api/*
        descriptors:
          - key: client
            rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: token_bucket}
";

/// One request shape.
#[derive(Debug, Clone)]
struct Shape {
    /// The row's name.
    name: &'static str,
    /// Descriptors per request (0: the HTTP decision mode).
    descriptors: usize,
    /// `--descriptor` values, one per descriptor; empty: HTTP.
    flags: Vec<String>,
    /// HTTP: the policies every request matches (each its own rule, counting the client).
    policies: usize,
}

fn shapes() -> Vec<Shape> {
    let ten = (0..10).map(|i| format!("d{i}={{client}}")).collect();
    vec![
        Shape {
            name: "HTTP decision mode",
            descriptors: 0,
            flags: Vec::new(),
            policies: 1,
        },
        Shape {
            name: "RLS simple",
            descriptors: 1,
            flags: vec!["client={client}".into()],
            policies: 1,
        },
        Shape {
            name: "RLS nested wildcard",
            descriptors: 1,
            flags: vec!["tenant=acme,path=/api/v1/items/42,client={client}".into()],
            policies: 1,
        },
        Shape {
            name: "RLS 10 descriptors",
            descriptors: 10,
            flags: ten,
            policies: 10,
        },
        Shape {
            name: "HTTP decision mode, 10 policies",
            descriptors: 0,
            flags: Vec::new(),
            policies: 10,
        },
    ]
}

/// The HTTP shape that does the work of `shapes()[s]` (as many rules, one plan): the one
/// with as many policies as it has descriptors (or policies).
fn http_twin(shapes: &[Shape], s: usize) -> Option<usize> {
    let want = shapes[s].policies;
    shapes
        .iter()
        .position(|t| t.descriptors == 0 && t.policies == want)
}

/// The server under a front end, with no limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Floor {
    /// The example `http_floor`: the gateway's HTTP server answering 200.
    Http,
    /// The example `rls_floor`: the RLS listener's HTTP/2 server answering this many statuses.
    Rls(usize),
}

/// Each floor, named, with the shape whose load it is driven by (the shapes of `shapes()`).
fn floors(shapes: &[Shape]) -> Vec<(String, Floor, usize)> {
    let mut out: Vec<(String, Floor, usize)> = Vec::new();
    for (s, shape) in shapes.iter().enumerate() {
        let floor = floor_of(shape);
        if !out.iter().any(|(_, f, _)| *f == floor) {
            let name = match floor {
                Floor::Http => "HTTP floor (no limiter)".to_owned(),
                Floor::Rls(1) => "RLS floor, 1 status (no limiter)".to_owned(),
                Floor::Rls(n) => format!("RLS floor, {n} statuses (no limiter)"),
            };
            out.push((name, floor, s));
        }
    }
    out
}

/// The floor a shape stands on: its front end's server answering as many statuses.
fn floor_of(shape: &Shape) -> Floor {
    if shape.descriptors == 0 {
        Floor::Http
    } else {
        Floor::Rls(shape.descriptors)
    }
}

/// The YAML with the ten descriptors' rules appended (`d0` to `d9`, each its own rule).
fn yaml() -> String {
    let mut y = YAML.to_owned();
    for i in 0..10 {
        y.push_str(&format!(
            "  - key: d{i}\n    rate_limit: {{unit: hour, requests_per_unit: 1000000000, \
             algorithm: token_bucket}}\n"
        ));
    }
    y
}

/// The config of one gateway: decision mode and the RLS on one Redis, one limiter; the HTTP
/// side with `policies` policies, each matching every request.
fn config(ports: Ports, redis: u16, yaml: &Path, policies: usize) -> String {
    let mut policy = String::new();
    for p in 0..policies.max(1) {
        let name = if p == 0 {
            "api".to_owned()
        } else {
            format!("api{p}")
        };
        policy.push_str(&format!(
            "[[policy]]\nname = \"{name}\"\nalgorithm = \"token_bucket\"\nlimit = 1000000000\n\
             period = \"1h\"\n"
        ));
    }
    format!(
        "[server]\nlisten = \"127.0.0.1:{}\"\nadmin_listen = \"127.0.0.1:{}\"\n\
         [store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{redis}\"\ntimeout = \"1s\"\n\
         on_failure = \"closed\"\n\
         [identity]\nsources = [\"header:x-api-key\"]\nsecret = \"bench\"\n\
         {policy}[rls]\nlisten = \"127.0.0.1:{}\"\nconfig = \"{}\"\n",
        ports.http,
        ports.admin,
        ports.rls,
        yaml.display()
    )
}

#[derive(Debug, Clone, Copy)]
struct Ports {
    http: u16,
    admin: u16,
    rls: u16,
}

/// The figures of one shape on one binary, one value per repetition.
#[derive(Debug, Default)]
struct Runs {
    per_s: Vec<f64>,
    cpu_us: Vec<f64>,
    redis_us: Vec<f64>,
    calls: Vec<f64>,
    p99_ms: Vec<f64>,
    errors: u64,
}

impl Runs {
    /// One more repetition's figures.
    fn add(&mut self, m: &Sample) {
        self.per_s.push(m.per_s);
        self.cpu_us.push(m.cpu_us);
        self.redis_us.push(m.redis_us);
        self.calls.push(m.calls);
        self.p99_ms.push(m.p99_ms);
        self.errors += m.errors;
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
struct Sample {
    decisions: u64,
    per_s: f64,
    cpu_us: f64,
    redis_us: f64,
    calls: f64,
    p99_ms: f64,
    errors: u64,
}

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let title = "### Envoy RLS: CPU per decision, the gateway alone on one core\n\n";
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return Ok(format!(
            "{title}Not measured: this needs two CPUs (one for the gateway, one for the load \
             and redis-server).\n"
        ));
    }
    let seconds = if ctx.quick { 2 } else { 6 };
    let dir = ctx.dir("rls")?;
    let yaml_path = dir.join("bench.yaml");
    std::fs::write(&yaml_path, yaml())
        .with_context(|| format!("cannot write {}", yaml_path.display()))?;
    let redis = RedisServer::start();
    let redis_pid = redis.pid().context("redis-server has no pid")?;
    servers::pin_running(redis_pid, LOAD_CPU)?;
    let rig = Rig {
        ctx,
        dir: &dir,
        redis: &redis,
        redis_pid,
        yaml: &yaml_path,
        seconds,
    };
    let mut bins: Vec<(&str, PathBuf)> = vec![("this build", ctx.bins.tollgate.clone())];
    if let Some(baseline) = &ctx.baseline {
        bins.push(("baseline", baseline.clone()));
    }
    let shapes = shapes();
    let floors = floors(&shapes);
    let mut runs: BTreeMap<(usize, usize), Runs> = BTreeMap::new();
    let mut floor_runs: Vec<Runs> = floors.iter().map(|_| Runs::default()).collect();
    for rep in 1..=ctx.reps {
        for (s, shape) in shapes.iter().enumerate() {
            for b in order(rep, bins.len()) {
                let (label, bin) = &bins[b];
                log(&format!(
                    "rls rep {rep}/{}: {} ({label})",
                    ctx.reps, shape.name
                ));
                // Keys, scripts and counters: a script the other binary loaded is not free to
                // this run (every call's Lua garbage collection walks the scripts kept).
                servers::reset_redis(&[&redis]);
                let m = rig
                    .measure(bin, shape)
                    .with_context(|| format!("{} on {}", shape.name, bin.display()))?;
                ctx.emit(
                    "rls",
                    json!({"shape": shape.name, "binary": label, "path": bin, "rep": rep,
                    "descriptors_per_request": shape.descriptors, "decisions": m.decisions,
                    "decisions_per_s": m.per_s, "cpu_us_per_decision": m.cpu_us,
                    "redis_cpu_us_per_decision": m.redis_us,
                    "script_calls_per_decision": m.calls, "p99_ms": m.p99_ms,
                    "errors": m.errors}),
                )?;
                runs.entry((s, b)).or_default().add(&m);
            }
        }
        for ((name, floor, s), r) in floors.iter().zip(&mut floor_runs) {
            log(&format!("rls rep {rep}/{}: {name}", ctx.reps));
            let m = rig
                .measure_floor(*floor, &shapes[*s])
                .with_context(|| format!("{name} under {}", shapes[*s].name))?;
            ctx.emit(
                "rls",
                json!({"shape": name, "binary": "floor", "rep": rep,
                "descriptors_per_request": shapes[*s].descriptors, "decisions": m.decisions,
                "decisions_per_s": m.per_s, "cpu_us_per_decision": m.cpu_us,
                "p99_ms": m.p99_ms, "errors": m.errors}),
            )?;
            r.add(&m);
        }
    }
    let mut out = format!(
        "{title}`tollgate serve` pinned alone to CPU {GATEWAY_CPU} (taskset) with `[rls]` and \
         decision mode on one redis-server; `tollgate bench` (closed loop, {CONNECTIONS} \
         concurrent requests, {CLIENTS} clients, {seconds} s; `--rls` over {CHANNELS} HTTP/2 \
         connections) and redis-server share CPU {LOAD_CPU}. Every rule is a token bucket no \
         client reaches, so every answer is a full decision and one store call; the store fails \
         `closed` (timeout 1 s), so an answer that did not come from Redis is an error here, \
         never a cheap `OK`. Shapes: \
         *HTTP decision mode*: a GET with the client's `x-api-key`, one policy; *simple*: one \
         descriptor `client=<key>`; *nested wildcard*: one descriptor of three entries \
         `tenant=acme, path=/api/v1/items/42, client=<key>`, matched by `tenant` > `path: \
         /api/*` > `client` beside sibling rules `/admin/*` and `/api/v1/users` (the `*` is \
         trailing, so the file means the same to a prefix matcher and to a wildcard-anywhere \
         one); *10 descriptors*: `d0=<key>` .. `d9=<key>`, each its own rule, one plan (a \
         generated script holds up to sixteen rules, so this plan coalesces like the others); *HTTP decision mode, 10 policies*: \
         the same GET matched by ten policies (each its own rule counting the client), the \
         HTTP front end doing what *10 descriptors* does: ten rules in one plan, one store \
         call (*vs HTTP with as many rules* divides each shape by the HTTP shape of as many \
         rules). A \
         decision is one answer (one request, whatever its descriptors). CPU per decision: the \
         gateway's utime + stime over the run / decisions; Redis CPU likewise for redis-server; \
         store calls: EVAL/EVALSHA per decision; redis-server is emptied of keys, scripts and \
         counters before every run. min / median / max of {} repetition(s), the \
         shapes interleaved; ratios per repetition. Errors: answers other than OK / 200 and \
         requests without an answer, over all repetitions.\n\n",
        ctx.reps
    );
    out.push_str(&main_table(&shapes, &bins, &runs));
    out.push_str(&format!(
        "\n#### The servers under the front ends, with no limiter\n\n*HTTP floor*: the \
         example `http_floor`, hyper's HTTP/1 server on the gateway's runtime answering every \
         request with the decision mode's 200 (decision mode answers its plain requests without \
         hyper, so this is hyper's floor, not decision mode's); *RLS floor*: the example `rls_floor`, the RLS \
         listener's HTTP/2 server (h2's, with the listener's settings and its unvectored \
         stream, a task spawned per stream as the listener spawns it, on the gateway's \
         runtime and allocator) answering \
         every call with one answer encoded at start, as many OK statuses as the shape has \
         descriptors, the request read to its end and not decoded. Each floor is pinned where the gateway runs and driven by its shape's load, \
         after the shapes in every repetition. *Above the floor*: a shape's CPU per decision \
         (this build) less its floor's in the same repetition: what the limiter and its front \
         end's own work cost; its last column divides that by the HTTP decision mode's. A \
         floor answers faster than the shapes on it, and on this machine a server's kernel time \
         per answer grows as its rate falls (the load generator shares the other CPU and is \
         found asleep more often), so a floor at its shape's rate would cost more: the figures \
         above the floor are upper bounds.\n\n{}",
        floor_table(&shapes, &floors, &floor_runs, &runs)
    ));
    if bins.len() > 1 {
        out.push_str(&format!(
            "\n#### This build vs the baseline, side by side\n\nBaseline: `{}`. Each shape \
             ran on both binaries one after the other within every repetition, this build \
             first in odd repetitions and the baseline first in even ones; the ratios are this \
             build / baseline in the same repetition (CPU below 1: this build is cheaper; \
             decisions/s above 1: faster).\n\n{}",
            bins[1].1.display(),
            baseline_table(&shapes, &runs)
        ));
    }
    Ok(out)
}

/// The binaries' order in repetition `rep`: this build first in odd repetitions, the
/// baseline first in even ones (ABBA over two repetitions), so neither always runs second.
fn order(rep: u32, bins: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..bins).collect();
    if rep.is_multiple_of(2) {
        order.reverse();
    }
    order
}

fn main_table(
    shapes: &[Shape],
    bins: &[(&str, PathBuf)],
    runs: &BTreeMap<(usize, usize), Runs>,
) -> String {
    let sig = Digits::Significant;
    let mut t = Table::new(&[
        "shape",
        "binary",
        "descriptors per request",
        "decisions/s",
        "gateway CPU µs per decision",
        "vs HTTP decision mode (CPU)",
        "vs HTTP with as many rules (CPU)",
        "Redis CPU µs per decision",
        "store calls per decision",
        "p99 ms",
        "errors",
    ]);
    let empty = Runs::default();
    for (b, (label, _)) in bins.iter().enumerate() {
        let http = runs.get(&(0, b)).unwrap_or(&empty);
        for (s, shape) in shapes.iter().enumerate() {
            let r = runs.get(&(s, b)).unwrap_or(&empty);
            let vs_http = if s == 0 {
                "1".to_owned()
            } else {
                spread(&ratios(&r.cpu_us, &http.cpu_us), Digits::Fixed(2))
            };
            let vs_twin = match http_twin(shapes, s) {
                Some(t) if t == s => "1".to_owned(),
                Some(t) => {
                    let twin = runs.get(&(t, b)).unwrap_or(&empty);
                    spread(&ratios(&r.cpu_us, &twin.cpu_us), Digits::Fixed(2))
                }
                None => "-".to_owned(),
            };
            t.row(&[
                shape.name.to_owned(),
                (*label).to_owned(),
                if shape.descriptors == 0 {
                    "(HTTP)".to_owned()
                } else {
                    shape.descriptors.to_string()
                },
                spread(&r.per_s, Digits::Fixed(0)),
                spread(&r.cpu_us, sig),
                vs_http,
                vs_twin,
                spread(&r.redis_us, sig),
                spread(&r.calls, Digits::Fixed(2)),
                spread(&r.p99_ms, sig),
                r.errors.to_string(),
            ]);
        }
    }
    t.render()
}

fn floor_table(
    shapes: &[Shape],
    floors: &[(String, Floor, usize)],
    floor_runs: &[Runs],
    runs: &BTreeMap<(usize, usize), Runs>,
) -> String {
    let sig = Digits::Significant;
    let mut t = Table::new(&[
        "shape",
        "its floor",
        "floor answers/s",
        "floor CPU µs per answer",
        "shape CPU µs per decision",
        "above the floor, µs",
        "above the floor vs HTTP decision mode's",
        "floor errors",
    ]);
    let empty = Runs::default();
    let above = |s: usize| -> Vec<f64> {
        let Some(f) = floors
            .iter()
            .position(|(_, f, _)| *f == floor_of(&shapes[s]))
        else {
            return Vec::new();
        };
        let r = runs.get(&(s, 0)).unwrap_or(&empty);
        r.cpu_us
            .iter()
            .zip(&floor_runs[f].cpu_us)
            .map(|(a, b)| a - b)
            .collect()
    };
    let http_above = above(0);
    for (s, shape) in shapes.iter().enumerate() {
        let Some(f) = floors.iter().position(|(_, f, _)| *f == floor_of(shape)) else {
            continue;
        };
        let fr = &floor_runs[f];
        let r = runs.get(&(s, 0)).unwrap_or(&empty);
        let a = above(s);
        t.row(&[
            shape.name.to_owned(),
            floors[f].0.clone(),
            spread(&fr.per_s, Digits::Fixed(0)),
            spread(&fr.cpu_us, sig),
            spread(&r.cpu_us, sig),
            spread(&a, Digits::Fixed(2)),
            if s == 0 {
                "1".to_owned()
            } else {
                spread(&ratios(&a, &http_above), Digits::Fixed(2))
            },
            fr.errors.to_string(),
        ]);
    }
    t.render()
}

fn baseline_table(shapes: &[Shape], runs: &BTreeMap<(usize, usize), Runs>) -> String {
    let sig = Digits::Significant;
    let mut t = Table::new(&[
        "shape",
        "CPU µs per decision, this build",
        "CPU µs per decision, baseline",
        "CPU this / baseline",
        "decisions/s this / baseline",
    ]);
    let empty = Runs::default();
    for (s, shape) in shapes.iter().enumerate() {
        let (a, b) = (
            runs.get(&(s, 0)).unwrap_or(&empty),
            runs.get(&(s, 1)).unwrap_or(&empty),
        );
        t.row(&[
            shape.name.to_owned(),
            spread(&a.cpu_us, sig),
            spread(&b.cpu_us, sig),
            spread(&ratios(&a.cpu_us, &b.cpu_us), Digits::Fixed(2)),
            spread(&ratios(&a.per_s, &b.per_s), Digits::Fixed(2)),
        ]);
    }
    t.render()
}

/// What every run shares: the section's directory, the redis-server, the rules and the length.
#[derive(Clone, Copy)]
struct Rig<'a> {
    ctx: &'a Ctx,
    dir: &'a Path,
    redis: &'a RedisServer,
    redis_pid: u32,
    yaml: &'a Path,
    seconds: u64,
}

impl Rig<'_> {
    /// One run: a fresh gateway from `bin` pinned to the gateway CPU, the load for `seconds`
    /// from this build's `tollgate bench` on the load CPU.
    fn measure(&self, bin: &Path, shape: &Shape) -> anyhow::Result<Sample> {
        let Rig {
            dir, redis, yaml, ..
        } = *self;
        let [http, admin, rls] = procs::free_ports()?;
        let ports = Ports { http, admin, rls };
        let toml = dir.join("gateway.toml");
        std::fs::write(&toml, config(ports, redis.port(), yaml, shape.policies))
            .with_context(|| format!("cannot write {}", toml.display()))?;
        let mut cmd = servers::pinned(bin, Some(GATEWAY_CPU));
        cmd.arg("serve")
            .arg("--config")
            .arg(&toml)
            .env("TOLLGATE_LOG", "warn");
        let mut gateway = Proc::spawn("tollgate-rls", cmd, &dir.join("gateway.log"))?;
        gateway.wait_port(ports.http, START)?;
        gateway.wait_port(ports.rls, START)?;
        procs::wait_http_ok(ports.admin, "/healthz", START)?;
        std::thread::sleep(Duration::from_millis(300));
        let sample = self.drive(&gateway, ports.http, ports.rls, shape);
        drop(gateway);
        sample
    }

    /// One run of a floor (the server under a front end, no limiter: `http_floor`, or
    /// `rls_floor` answering `statuses` statuses) pinned where the gateway runs, under the load
    /// of `shape`.
    fn measure_floor(&self, floor: Floor, shape: &Shape) -> anyhow::Result<Sample> {
        let port = procs::free_port()?;
        let (bin, name) = match floor {
            Floor::Http => (&self.ctx.bins.http_floor, "http_floor"),
            Floor::Rls(_) => (&self.ctx.bins.rls_floor, "rls_floor"),
        };
        let mut cmd = servers::pinned(bin, Some(GATEWAY_CPU));
        cmd.arg(format!("127.0.0.1:{port}"));
        if let Floor::Rls(statuses) = floor {
            cmd.arg(statuses.to_string());
        }
        let mut p = Proc::spawn(name, cmd, &self.dir.join(format!("{name}.log")))?;
        p.wait_port(port, START)?;
        std::thread::sleep(Duration::from_millis(300));
        let sample = self.drive(&p, port, port, shape);
        drop(p);
        sample
    }

    /// `shape`'s load for the rig's seconds from this build's `tollgate bench` on the load
    /// CPU against `server` (HTTP on `http`, the RLS on `rls`), and what it cost.
    fn drive(&self, server: &Proc, http: u16, rls: u16, shape: &Shape) -> anyhow::Result<Sample> {
        let Rig {
            ctx,
            dir,
            redis,
            redis_pid,
            seconds,
            ..
        } = *self;
        let json_path = dir.join("bench.json");
        let _ = std::fs::remove_file(&json_path);
        let mut load = servers::pinned(&ctx.bins.tollgate, Some(LOAD_CPU));
        load.arg("bench")
            .args(["--clients", &CLIENTS.to_string()])
            .args(["--connections", &CONNECTIONS.to_string()])
            .args(["--duration", &format!("{seconds}s")])
            .args(["--timeout", "5s", "--quiet", "--json"])
            .arg(&json_path);
        if shape.flags.is_empty() {
            load.args(["--target", &format!("http://127.0.0.1:{http}/")]);
        } else {
            let url = format!("http://127.0.0.1:{rls}");
            load.args(["--rls", &vec![url; CHANNELS].join(",")]);
            for flag in &shape.flags {
                load.args(["--descriptor", flag]);
            }
        }
        let (c0, r0, k0) = (
            procs::cpu_ticks(server.pid())?,
            procs::cpu_ticks(redis_pid)?,
            servers::script_calls(redis)?,
        );
        procs::run(
            load,
            &ctx.logs.join("rls-bench.txt"),
            Duration::from_secs(seconds + 60),
        )?;
        let (c1, r1, k1) = (
            procs::cpu_ticks(server.pid())?,
            procs::cpu_ticks(redis_pid)?,
            servers::script_calls(redis)?,
        );
        let text = std::fs::read_to_string(&json_path)
            .with_context(|| format!("cannot read {}", json_path.display()))?;
        let report: Value = serde_json::from_str(&text).context("tollgate bench's JSON")?;
        sample(&report, c1 - c0, r1 - r0, k1.saturating_sub(k0))
    }
}

/// The figures of one run from `tollgate bench --json`'s report and the counters read around
/// it (CPU in clock ticks, script calls).
fn sample(
    report: &Value,
    gateway_ticks: u64,
    redis_ticks: u64,
    calls: u64,
) -> anyhow::Result<Sample> {
    let count = |code: &str| report["status"][code].as_u64().unwrap_or(0);
    let decisions = count("200") + count("429");
    anyhow::ensure!(decisions > 0, "no decision was answered: {report}");
    let answered = report["requests"]["answered"].as_u64().unwrap_or(0);
    let errors =
        report["requests"]["errors"].as_u64().unwrap_or(0) + answered.saturating_sub(decisions);
    let elapsed_s = report["elapsed_ms"].as_f64().unwrap_or(0.0) / 1000.0;
    let tick_us = 1e6 / procs::ticks_per_second() as f64;
    let n = decisions as f64;
    Ok(Sample {
        decisions,
        per_s: if elapsed_s > 0.0 { n / elapsed_s } else { 0.0 },
        cpu_us: gateway_ticks as f64 * tick_us / n,
        redis_us: redis_ticks as f64 * tick_us / n,
        calls: calls as f64 / n,
        p99_ms: report["latency"]["all"]["p99_us"].as_f64().unwrap_or(0.0) / 1000.0,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_but_http_sends_its_descriptors() {
        let s = shapes();
        assert_eq!(s[0].flags.len(), 0);
        assert!(s[1..].iter().all(|s| s.flags.len() == s.descriptors));
        assert_eq!(s[3].flags.len(), 10);
        let y = yaml();
        for i in 0..10 {
            assert!(y.contains(&format!("  - key: d{i}\n")), "{y}");
        }
    }

    /// One floor for each front end and answer size, driven by the first shape on it; every
    /// shape finds its own.
    #[test]
    fn each_floor_is_measured_once_under_the_first_shape_that_stands_on_it() {
        let s = shapes();
        let f = floors(&s);
        let kinds: Vec<(Floor, usize)> = f.iter().map(|(_, f, s)| (*f, *s)).collect();
        assert_eq!(
            kinds,
            vec![(Floor::Http, 0), (Floor::Rls(1), 1), (Floor::Rls(10), 3)]
        );
        for shape in &s {
            assert!(
                f.iter().any(|(_, f, _)| *f == floor_of(shape)),
                "{}",
                shape.name
            );
        }
        assert_eq!(f[2].0, "RLS floor, 10 statuses (no limiter)");
    }

    #[test]
    fn the_binaries_take_turns_going_first() {
        assert_eq!(order(1, 2), vec![0, 1]);
        assert_eq!(order(2, 2), vec![1, 0]);
        assert_eq!(order(3, 2), vec![0, 1]);
        assert_eq!(order(2, 1), vec![0]);
    }

    #[test]
    fn a_run_is_read_from_the_bench_report() {
        let report = json!({"elapsed_ms": 2000, "status": {"200": 990, "429": 10, "503": 5},
            "requests": {"answered": 1005, "errors": 2},
            "latency": {"all": {"p99_us": 1500}}});
        let m = sample(&report, 100, 50, 1000).expect("sample");
        assert_eq!(m.decisions, 1000);
        assert_eq!(m.per_s, 500.0);
        assert_eq!(m.errors, 7);
        assert_eq!(m.calls, 1.0);
        assert_eq!(m.p99_ms, 1.5);
        let tick_us = 1e6 / procs::ticks_per_second() as f64;
        assert!((m.cpu_us - 100.0 * tick_us / 1000.0).abs() < 1e-9);
        assert!(sample(&json!({"status": {}}), 1, 1, 1).is_err());
    }

    /// A gateway's config with `policies` policies on ports 1-3 and a Redis on port 4.
    fn test_config(policies: usize) -> String {
        let ports = Ports {
            http: 1,
            admin: 2,
            rls: 3,
        };
        config(ports, 4, Path::new("/x/bench.yaml"), policies)
    }

    #[test]
    fn the_gateway_config_serves_both_front_ends_on_one_store() {
        let c = test_config(1);
        assert!(c.contains("listen = \"127.0.0.1:1\""));
        assert!(c.contains("[rls]\nlisten = \"127.0.0.1:3\"\nconfig = \"/x/bench.yaml\""));
        assert!(c.contains("url = \"redis://127.0.0.1:4\""));
        assert!(!c.contains("upstream"));
        assert_eq!(c.matches("[[policy]]").count(), 1);
    }

    #[test]
    fn each_shape_is_compared_with_the_http_shape_of_as_many_rules() {
        let s = shapes();
        let names: Vec<Option<&str>> = (0..s.len())
            .map(|i| http_twin(&s, i).map(|t| s[t].name))
            .collect();
        assert_eq!(names[0], Some("HTTP decision mode"));
        assert_eq!(names[1], Some("HTTP decision mode"));
        assert_eq!(names[2], Some("HTTP decision mode"));
        assert_eq!(names[3], Some("HTTP decision mode, 10 policies"));
        assert_eq!(names[4], Some("HTTP decision mode, 10 policies"));
        let ten = test_config(10);
        assert_eq!(ten.matches("[[policy]]").count(), 10);
        assert_eq!(ten.matches("name = \"api").count(), 10);
        assert!(!ten.contains("match"), "every policy matches every request");
    }
}
