//! The processes the sections measure, all on 127.0.0.1 and free ports: nginx in a prefix of
//! its own, `tollgate serve` configs, wrk with a Lua script, and the Redis helpers that run
//! against tollgate-testkit's [`RedisServer`].

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;
use tollgate_testkit::RedisServer;

use crate::procs::{self, Proc};

/// How long a server gets to listen.
const START: Duration = Duration::from_secs(15);

/// `cmd`, run through `taskset -c cpu` when pinned.
pub fn pinned(program: &Path, cpu: Option<u32>) -> Command {
    match cpu {
        Some(cpu) => {
            let mut cmd = Command::new("taskset");
            cmd.arg("-c").arg(cpu.to_string()).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// Pins a running process (and its threads) to `cpu`.
pub fn pin_running(pid: u32, cpu: u32) -> anyhow::Result<()> {
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .context("cannot run taskset")?;
    if !status.success() {
        bail!("taskset -p {pid} failed: {status}");
    }
    Ok(())
}

/// An nginx with `body` as its `http` block, one process (no master, so stopping it stops
/// everything), logs and temp files under `dir/name`.
pub fn nginx(
    dir: &Path,
    name: &str,
    body: &str,
    port: u16,
    cpu: Option<u32>,
) -> anyhow::Result<Proc> {
    let prefix = dir.join(name);
    std::fs::create_dir_all(&prefix)
        .with_context(|| format!("cannot create {}", prefix.display()))?;
    let d = prefix.display();
    let conf = format!(
        "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;\n\
         error_log {d}/error.log error;\n\
         events {{ worker_connections 8192; }}\n\
         http {{ access_log off; keepalive_requests 1000000; keepalive_timeout 75s;\n\
         client_body_temp_path {d}/t1; proxy_temp_path {d}/t2; fastcgi_temp_path {d}/t3;\n\
         uwsgi_temp_path {d}/t4; scgi_temp_path {d}/t5;\n{body}\n}}\n"
    );
    let conf_path = prefix.join("nginx.conf");
    std::fs::write(&conf_path, conf)
        .with_context(|| format!("cannot write {}", conf_path.display()))?;
    let bin = crate::tools::which("nginx").context("nginx is not installed")?;
    let mut cmd = pinned(&bin, cpu);
    cmd.arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf_path)
        .arg("-e")
        .arg(prefix.join("error.log"));
    let mut p = Proc::spawn(name, cmd, &prefix.join("stdout.log"))?;
    p.wait_port(port, START)?;
    Ok(p)
}

/// An upstream answering 200 to everything.
pub fn upstream_body(port: u16) -> String {
    format!(
        "server {{ listen 127.0.0.1:{port} backlog=4096; location / {{ return 200 \"ok\\n\"; }} }}"
    )
}

/// nginx's limiter keyed on the same header as tollgate's policy: 100/min with a burst of
/// 100, like token_bucket 100/min; `upstream` = proxy to it, none = answer 200 itself.
pub fn nginx_limit_body(port: u16, upstream: Option<u16>) -> String {
    nginx_limit_body_with(port, upstream, "")
}

/// What nginx must be told to pass on what tollgate's proxy writes on every request: the
/// client's `Host` (nginx sends the upstream's name by default) and the forwarding headers
/// (`X-Forwarded-For` extended, `X-Real-IP`, `X-Forwarded-Proto`, `X-Forwarded-Host`, an
/// RFC 7239 `Forwarded`), so the two proxies do the same work on a request's head.
pub const NGINX_FORWARDING: &str = "proxy_set_header Host $http_host; \
     proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for; \
     proxy_set_header X-Real-IP $remote_addr; proxy_set_header X-Forwarded-Proto $scheme; \
     proxy_set_header X-Forwarded-Host $http_host; \
     proxy_set_header Forwarded \"for=$remote_addr;proto=$scheme;host=\\\"$http_host\\\"\";";

/// [`nginx_limit_body`] with more directives in the proxy's location (`extra`, e.g.
/// [`NGINX_FORWARDING`]).
pub fn nginx_limit_body_with(port: u16, upstream: Option<u16>, extra: &str) -> String {
    let zone = "limit_req_zone $http_x_api_key zone=api:64m rate=100r/m;";
    let limit = "limit_req zone=api burst=100 nodelay; limit_req_status 429;";
    match upstream {
        Some(up) => format!(
            "upstream backend {{ server 127.0.0.1:{up}; keepalive 1024; }} {zone} \
             server {{ listen 127.0.0.1:{port} backlog=4096; location / {{ {limit} \
             proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; \
             {extra} }} }}"
        ),
        None => format!(
            "{zone} server {{ listen 127.0.0.1:{port} backlog=4096; location / {{ {limit} return 200 \"ok\\n\"; }} }}"
        ),
    }
}

/// The store of a `tollgate serve` config.
#[derive(Debug, Clone, Copy)]
pub enum Store {
    /// In process.
    Memory,
    /// A redis-server on this port.
    Redis(u16),
}

/// A `tollgate serve` config: token_bucket 100/min per `x-api-key` (else IP); proxy mode
/// when `upstream` is given, decision mode otherwise.
pub fn serve_config(listen: u16, admin: u16, upstream: Option<u16>, store: Store) -> String {
    let mut c = format!(
        "[server]\nlisten = \"127.0.0.1:{listen}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n"
    );
    if let Some(up) = upstream {
        c.push_str(&format!("upstream = \"http://127.0.0.1:{up}\"\n"));
    }
    match store {
        Store::Memory => c.push_str("[store]\nbackend = \"memory\"\n"),
        Store::Redis(port) => c.push_str(&format!(
            "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\ntimeout = \"200ms\"\n"
        )),
    }
    c.push_str(
        "[identity]\nsources = [\"header:x-api-key\", \"ip\"]\nsecret = \"bench\"\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = 100\nperiod = \"1m\"\n",
    );
    c
}

/// A running `tollgate serve` and its ports.
#[derive(Debug)]
pub struct Gateway {
    /// The process.
    pub proc: Proc,
    /// Where it serves.
    pub port: u16,
    /// Its admin listener (`/metrics`, `/healthz`).
    pub admin: u16,
}

/// Starts `tollgate serve` with [`serve_config`] (see [`serve_with`]).
pub fn serve(
    tollgate: &Path,
    dir: &Path,
    name: &str,
    upstream: Option<u16>,
    store: Store,
    cpu: Option<u32>,
) -> anyhow::Result<Gateway> {
    serve_with(tollgate, dir, name, cpu, |port, admin| {
        serve_config(port, admin, upstream, store)
    })
}

/// Starts `tollgate serve` (pinned to `cpu` when given) with the config `config(port, admin)`
/// gives for two free loopback ports (written to `dir/name.toml`, its log `dir/name.log`), and
/// waits until it listens and its /healthz answers.
pub fn serve_with(
    tollgate: &Path,
    dir: &Path,
    name: &str,
    cpu: Option<u32>,
    config: impl FnOnce(u16, u16) -> String,
) -> anyhow::Result<Gateway> {
    let [port, admin] = procs::free_ports()?;
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config(port, admin))
        .with_context(|| format!("cannot write {}", path.display()))?;
    let mut cmd = pinned(tollgate, cpu);
    cmd.arg("serve")
        .arg("--config")
        .arg(&path)
        .env("TOLLGATE_LOG", "warn");
    let mut proc = Proc::spawn(name, cmd, &dir.join(format!("{name}.log")))?;
    proc.wait_port(port, START)?;
    procs::wait_http_ok(admin, "/healthz", START)?;
    Ok(Gateway { proc, port, admin })
}

/// wrk's script: one of N requests pre-formatted in init() (`x-api-key: k1..kN`, drawn at
/// random, a fixed seed), so wrk spends its CPU on sending; done() prints `RESULT {json}`.
/// With PATHS = P above 0, request i's path is `/p<i mod P>/x` instead of `/`.
const WRK_LUA: &str = r#"
local n = tonumber(os.getenv("KEYS") or "100000")
local paths = tonumber(os.getenv("PATHS") or "0")
local reqs = {}
function init(args)
  math.randomseed(7)
  for i = 1, n do
    local path = nil
    if paths > 0 then path = "/p" .. (i % paths) .. "/x" end
    reqs[i] = wrk.format(nil, path, { ["x-api-key"] = "k" .. i })
  end
end
function request() return reqs[math.random(n)] end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('RESULT {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,' ..
    '"status_errors":%d,"socket_errors":%d}\n', summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), e.status,
    e.connect + e.read + e.write + e.timeout))
end
"#;

/// What one wrk run reports.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct WrkResult {
    /// Requests completed.
    pub requests: u64,
    /// The run's length.
    pub duration_us: u64,
    /// Latency median.
    pub p50_us: u64,
    /// Latency p99.
    pub p99_us: u64,
    /// Answers with status 400 or more.
    pub status_errors: u64,
    /// Connect, read, write and timeout errors.
    pub socket_errors: u64,
}

impl WrkResult {
    /// Requests per second.
    pub fn rps(&self) -> f64 {
        self.requests as f64 / (self.duration_us.max(1) as f64 / 1e6)
    }
}

/// A wrk load: threads, connections and duration.
#[derive(Debug, Clone, Copy)]
pub struct Wrk {
    /// `-t`.
    pub threads: u32,
    /// `-c`.
    pub connections: u32,
    /// Seconds (`-d`).
    pub seconds: u64,
    /// Pinned to this CPU.
    pub cpu: Option<u32>,
    /// Paths `/p0/x` .. `/p<paths - 1>/x`, one per key; 0: every request to `/`.
    pub paths: u32,
}

impl Wrk {
    /// Runs wrk against http://127.0.0.1:`port`/ (log in `log`).
    pub fn run(&self, dir: &Path, port: u16, log: &Path) -> anyhow::Result<WrkResult> {
        let lua = dir.join("keys.lua");
        if !lua.exists() {
            std::fs::write(&lua, WRK_LUA)
                .with_context(|| format!("cannot write {}", lua.display()))?;
        }
        let wrk = crate::tools::which("wrk").context("wrk is not installed")?;
        let mut cmd = pinned(&wrk, self.cpu);
        cmd.arg(format!("-t{}", self.threads))
            .arg(format!("-c{}", self.connections))
            .arg(format!("-d{}s", self.seconds))
            .arg("--latency")
            .arg("-s")
            .arg(&lua)
            .arg(format!("http://127.0.0.1:{port}/"))
            .env("KEYS", "100000")
            .env("PATHS", self.paths.to_string());
        let out = procs::run(cmd, log, Duration::from_secs(self.seconds + 60))?;
        parse_wrk(&out)
    }
}

fn parse_wrk(out: &str) -> anyhow::Result<WrkResult> {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .with_context(|| format!("wrk printed no RESULT line:\n{out}"))?;
    serde_json::from_str(line)
        .with_context(|| format!("wrk's RESULT is not what was expected: {line}"))
}

/// FLUSHALL.
pub fn flush(redis: &RedisServer) {
    redis.cli(&["flushall"]);
}

/// Loads a script, returning its SHA1.
pub fn load_script(redis: &RedisServer, text: &str) -> anyhow::Result<String> {
    let sha = redis.cli(&["script", "load", text]).trim().to_owned();
    if sha.len() != 40 || !sha.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("SCRIPT LOAD answered {sha:?}");
    }
    Ok(sha)
}

/// Empties `nodes` for a fresh run: no keys, no scripts and no counters. A script an earlier
/// run loaded (another binary's, another setting's) is not free to the next: every call's Lua
/// garbage collection walks the scripts a server keeps.
pub fn reset_redis(nodes: &[&RedisServer]) {
    for n in nodes {
        n.cli(&["flushall"]);
        n.cli(&["script", "flush"]);
        n.cli(&["config", "resetstat"]);
    }
}

/// The CPU ticks (utime + stime) and script calls of `nodes` so far, each summed.
pub fn redis_usage(nodes: &[&RedisServer]) -> anyhow::Result<(u64, u64)> {
    let (mut ticks, mut calls) = (0, 0);
    for n in nodes {
        ticks += procs::cpu_ticks(n.pid().context("a redis-server has no pid")?)?;
        calls += script_calls(n)?;
    }
    Ok((ticks, calls))
}

/// EVALSHA + EVAL calls the server has run so far (INFO commandstats).
pub fn script_calls(redis: &RedisServer) -> anyhow::Result<u64> {
    commandstats_calls(&redis.cli(&["info", "commandstats"]))
}

fn commandstats_calls(info: &str) -> anyhow::Result<u64> {
    let mut total = 0;
    for line in info.lines() {
        let Some(rest) = line
            .strip_prefix("cmdstat_evalsha:")
            .or_else(|| line.strip_prefix("cmdstat_eval:"))
        else {
            continue;
        };
        let calls = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .with_context(|| format!("no calls= in {line:?}"))?;
        total += calls
            .trim()
            .parse::<u64>()
            .with_context(|| format!("{line:?}"))?;
    }
    Ok(total)
}

/// The rps of a `redis-benchmark --csv` run (its last line: `"TEST","RPS",...`).
pub fn csv_rps(out: &str) -> anyhow::Result<f64> {
    let line = out
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .context("redis-benchmark printed nothing")?;
    let field = line
        .split("\",\"")
        .nth(1)
        .with_context(|| format!("redis-benchmark: unexpected line {line:?}"))?;
    field
        .trim_matches('"')
        .parse()
        .with_context(|| format!("redis-benchmark: {field:?} is not a rate"))
}

/// The version of redis-server (`7.0.15`).
pub fn redis_version() -> String {
    let v = crate::tools::version("redis-server", &["--version"]);
    v.split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or("?")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_results_are_read_from_the_script_line() {
        let out = "Running 6s test\nRESULT {\"requests\":600,\"duration_us\":6000000,\"p50_us\":400,\"p99_us\":900,\"status_errors\":2,\"socket_errors\":0}\n";
        let r = parse_wrk(out).expect("parsed");
        assert_eq!(r.requests, 600);
        assert_eq!(r.rps(), 100.0);
        assert!(parse_wrk("Running 6s test\n").is_err());
    }

    #[test]
    fn redis_outputs_are_read() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=120,usec=5,usec_per_call=0.1\r\n\
                    cmdstat_eval:calls=3,usec=1\r\ncmdstat_ping:calls=9,usec=1\r\n";
        assert_eq!(commandstats_calls(info).expect("calls"), 123);
        let csv = "\"test\",\"rps\",\"avg_latency_ms\"\n\"EVALSHA abc 1 k\",\"95147.41\",\"0.3\"\n";
        assert_eq!(csv_rps(csv).expect("rps"), 95147.41);
        assert!(csv_rps("").is_err());
    }

    #[test]
    fn configs_say_what_the_section_measures() {
        let c = serve_config(1, 2, Some(3), Store::Redis(4));
        assert!(c.contains("listen = \"127.0.0.1:1\""));
        assert!(c.contains("upstream = \"http://127.0.0.1:3\""));
        assert!(c.contains("url = \"redis://127.0.0.1:4\""));
        assert!(!serve_config(1, 2, None, Store::Memory).contains("upstream"));
        assert!(nginx_limit_body(5, Some(6)).contains("proxy_pass http://backend"));
        assert!(nginx_limit_body(5, None).contains("return 200"));
        let fwd = nginx_limit_body_with(5, Some(6), NGINX_FORWARDING);
        assert!(fwd.contains("proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;"));
        assert!(fwd.contains(
            r#"proxy_set_header Forwarded "for=$remote_addr;proto=$scheme;host=\"$http_host\"";"#
        ));
    }
}
