//! gateway, first table: the CPU each gateway spends per request, pinned alone to one core,
//! tollgate (decision and proxy mode, memory and Redis store) against nginx `limit_req` in the
//! same mode. wrk, the upstream and redis-server share the other core. CPU per request is the
//! gateway's utime + stime over the wrk run divided by the requests completed: what a request
//! costs the gateway whatever the load generator's own speed. With `--baseline`, the other
//! `tollgate` binary runs every tollgate case too, in the same rounds, and the table gives each
//! build's ratio to the other within a round.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tollgate_testkit::RedisServer;

use super::servers::{self, flush, Store, Wrk};
use super::{log, Ctx};
use crate::markdown::Table;
use crate::procs::{self, Proc};
use crate::stats::{ratios, spread, Digits};

const GATEWAY_CPU: u32 = 1;
const LOAD_CPU: u32 = 0;

/// One gateway under test.
#[derive(Debug, Clone, Copy)]
enum Case {
    Nginx,
    /// nginx in proxy mode writing the forwarding headers tollgate writes.
    NginxForwarding,
    Floor,
    /// The floor spinning on every request for as long as tollgate on the memory store spent
    /// above it in user space in the same repetition (its `--busy-ns`): the floor at
    /// tollgate's rate, to tell the kernel time a slower gateway pays for waking its peers
    /// (see docs/benchmarks.md, "tenth session") from tollgate's own.
    FloorAtRate,
    Tollgate(Store),
    /// The `--baseline` binary.
    Baseline(Store),
}

#[derive(Debug, Default)]
struct Runs {
    rps: Vec<f64>,
    p99_ms: Vec<f64>,
    cpu_us: Vec<f64>,
    user_us: Vec<f64>,
    kernel_us: Vec<f64>,
    errors: u64,
}

pub fn table(ctx: &Ctx, seconds: u64) -> anyhow::Result<String> {
    let title = "### Gateway: CPU per request, each gateway alone on one core\n\n";
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return Ok(format!("{title}Not measured: this needs two CPUs (one for the gateway, one for wrk and the upstream).\n"));
    }
    let dir = ctx.dir("gateway-cpu")?;
    let up = procs::free_port()?;
    let _upstream = servers::nginx(
        &dir,
        "upstream",
        &servers::upstream_body(up),
        up,
        Some(LOAD_CPU),
    )?;
    let redis = RedisServer::start();
    servers::pin_running(redis.pid().unwrap_or(0), LOAD_CPU)?;
    let store_redis = Store::Redis(redis.port());
    let mut cases: Vec<(String, bool, Case)> = Vec::new();
    for proxy in [false, true] {
        let mode = if proxy { "proxy" } else { "decision" };
        cases.push((format!("nginx {mode}"), proxy, Case::Nginx));
        if proxy {
            cases.push((
                "nginx proxy, forwarding headers".into(),
                proxy,
                Case::NginxForwarding,
            ));
        }
        let floor = if proxy {
            "proxy floor (no limiter)"
        } else {
            "http floor (no limiter)"
        };
        cases.push((floor.into(), proxy, Case::Floor));
        cases.push((
            format!("tollgate {mode} memory"),
            proxy,
            Case::Tollgate(Store::Memory),
        ));
        cases.push((
            format!(
                "{} at tollgate memory's rate",
                floor.trim_end_matches(" (no limiter)")
            ),
            proxy,
            Case::FloorAtRate,
        ));
        cases.push((
            format!("tollgate {mode} redis"),
            proxy,
            Case::Tollgate(store_redis),
        ));
        if ctx.baseline.is_some() {
            for (store, name) in [(Store::Memory, "memory"), (store_redis, "redis")] {
                cases.push((
                    format!("baseline {mode} {name}"),
                    proxy,
                    Case::Baseline(store),
                ));
            }
        }
    }
    let wrk = Wrk {
        threads: 1,
        connections: 64,
        seconds,
        cpu: Some(LOAD_CPU),
        paths: 0,
    };
    let tick_us = 1e6 / procs::ticks_per_second() as f64;
    let mut runs: BTreeMap<String, Runs> = BTreeMap::new();
    for rep in 1..=ctx.reps {
        // User µs a request of this repetition's floor and tollgate on memory, by mode
        // (decision, proxy).
        let mut user_of = [UserTime::default(); 2];
        for (name, proxy, case) in &cases {
            log(&format!("gateway cpu rep {rep}/{}: {name}", ctx.reps));
            flush(&redis);
            let upstream = proxy.then_some(up);
            let busy = match case {
                Case::FloorAtRate => Some(user_of[usize::from(*proxy)].busy_ns()),
                _ => None,
            };
            let (proc, port) = start(ctx, &dir, *case, upstream, busy)?;
            std::thread::sleep(Duration::from_millis(300));
            let (u0, k0) = procs::cpu_ticks_split(proc.pid())?;
            let w = wrk.run(&dir, port, &ctx.logs.join("gateway-cpu-wrk.txt"))?;
            let (u1, k1) = procs::cpu_ticks_split(proc.pid())?;
            drop(proc);
            let per_request = |ticks: u64| ticks as f64 * tick_us / w.requests.max(1) as f64;
            let (user_us, kernel_us) = (per_request(u1 - u0), per_request(k1 - k0));
            let cpu_us = user_us + kernel_us;
            let seen = &mut user_of[usize::from(*proxy)];
            match case {
                Case::Floor => seen.floor = Some(user_us),
                Case::Tollgate(Store::Memory) => seen.tollgate = Some(user_us),
                _ => {}
            }
            let r = runs.entry(name.clone()).or_default();
            r.rps.push(w.rps());
            r.p99_ms.push(w.p99_us as f64 / 1000.0);
            r.cpu_us.push(cpu_us);
            r.user_us.push(user_us);
            r.kernel_us.push(kernel_us);
            r.errors += w.status_errors + w.socket_errors;
            ctx.emit(
                "gateway_cpu",
                json!({"name": name, "rep": rep, "requests": w.requests,
                "requests_per_s": w.rps(), "p50_us": w.p50_us, "p99_us": w.p99_us,
                "cpu_us_per_request": cpu_us, "user_us_per_request": user_us,
                "kernel_us_per_request": kernel_us, "busy_ns": busy,
                "status_errors": w.status_errors,
                "socket_errors": w.socket_errors}),
            )?;
        }
    }
    let sig = Digits::Significant;
    let mut columns = vec![
        "gateway on one core",
        "requests/s",
        "p99 ms",
        "CPU µs per request",
        "user µs",
        "kernel µs",
        "vs nginx, same mode",
    ];
    if ctx.baseline.is_some() {
        columns.push("this build / baseline, CPU");
    }
    columns.push("errors");
    let mut t = Table::new(&columns);
    let empty = Runs::default();
    for (name, proxy, case) in &cases {
        let r = runs.get(name).unwrap_or(&empty);
        let base = runs
            .get(if *proxy {
                "nginx proxy"
            } else {
                "nginx decision"
            })
            .unwrap_or(&empty);
        let mut row = vec![
            name.clone(),
            spread(&r.rps, Digits::Fixed(0)),
            spread(&r.p99_ms, sig),
            spread(&r.cpu_us, sig),
            spread(&r.user_us, sig),
            spread(&r.kernel_us, sig),
            spread(&ratios(&r.cpu_us, &base.cpu_us), Digits::Fixed(2)),
        ];
        if ctx.baseline.is_some() {
            row.push(match case {
                Case::Tollgate(_) => {
                    let other = runs
                        .get(&name.replacen("tollgate", "baseline", 1))
                        .unwrap_or(&empty);
                    spread(&ratios(&r.cpu_us, &other.cpu_us), Digits::Fixed(2))
                }
                _ => String::new(),
            });
        }
        row.push(r.errors.to_string());
        t.row(&row);
    }
    Ok(format!(
        "{title}Each gateway pinned alone to CPU {GATEWAY_CPU} (taskset); wrk (1 thread, 64 \
         connections, {seconds} s), the upstream (an nginx answering 200) and redis-server share \
         CPU {LOAD_CPU}. Every request carries one of 100,000 random API keys, limit 100/min per \
         key (tollgate: token_bucket; nginx: `limit_req rate=100r/m burst=100 nodelay`), so \
         almost every request is allowed and is one store call. Decision mode answers 200 \
         itself (nginx: `return 200`); proxy mode forwards to the upstream (nginx: `proxy_pass` \
         with upstream keepalive). CPU per request is the gateway's utime + stime during the \
         wrk run divided by the requests completed, and apart: user µs (utime) and kernel µs \
         (stime). min / median / max of {} interleaved \
         repetition(s); the ratio is to nginx in the same mode and repetition. \"http floor\" \
         is the example `http_floor`: hyper's HTTP/1 server on the gateway's runtime answering \
         the same 200 with no limiter (decision mode answers its plain requests without hyper, \
         so this is hyper's floor, not decision mode's); \"proxy floor\" \
         is the same \
         example given the upstream: each request forwarded as it came, no header rewritten, \
         on one upstream connection per downstream connection (hyper's `client::conn::http1`, \
         driven from the downstream connection's task), the floor under proxy mode. \
         \"nginx proxy, forwarding headers\" is nginx told to send what tollgate's proxy \
         sends on every request (the client's `Host`, `X-Forwarded-For`, `X-Real-IP`, \
         `X-Forwarded-Proto`, `X-Forwarded-Host`, `Forwarded`); its ratio is still to plain \
         nginx. \"... floor at tollgate memory's rate\" is the same floor spinning on every \
         request (`http_floor --busy-ns N`) for as long as tollgate on the memory store spent \
         above the floor in user space in the same repetition: as slow as tollgate, doing \
         nothing else tollgate does. On this machine a gateway's kernel time per request grows \
         as its rate falls (wrk and the upstream share the other CPU, and a slower gateway \
         finds them asleep more often: waking them is charged to it), so its kernel µs less the \
         floor's at full rate is what tollgate's rate alone costs in the kernel.{} Errors: \
         answers of 400 or more and socket errors, over all repetitions.\n\n{}",
        ctx.reps,
        ctx.baseline.as_ref().map_or(String::new(), |b| format!(
            " \"baseline\" rows: the binary `{}`, in the same rounds; \"this build / \
             baseline\" is the ratio of the two within a round.",
            b.display()
        )),
        t.render()
    ))
}

/// User µs a request of one mode's floor and of tollgate on the memory store, in one
/// repetition, as they are measured.
#[derive(Debug, Clone, Copy, Default)]
struct UserTime {
    floor: Option<f64>,
    tollgate: Option<f64>,
}

impl UserTime {
    /// The `--busy-ns` of the floor at tollgate's rate: what tollgate spent above the floor in
    /// user space, per request (none when either is missing or the floor spent more), bounded
    /// as the floor bounds it (1 ms).
    fn busy_ns(self) -> u64 {
        match (self.tollgate, self.floor) {
            (Some(t), Some(f)) if t > f => ((t - f) * 1000.0).round().min(1_000_000.0) as u64,
            _ => 0,
        }
    }
}

/// Starts one case pinned to the gateway CPU (the floor spinning `busy` ns a request when
/// given); returns it with its port.
fn start(
    ctx: &Ctx,
    dir: &Path,
    case: Case,
    upstream: Option<u16>,
    busy: Option<u64>,
) -> anyhow::Result<(Proc, u16)> {
    let cpu = Some(GATEWAY_CPU);
    match case {
        Case::Nginx | Case::NginxForwarding => {
            let port = procs::free_port()?;
            let extra = match case {
                Case::NginxForwarding => servers::NGINX_FORWARDING,
                _ => "",
            };
            let body = servers::nginx_limit_body_with(port, upstream, extra);
            Ok((servers::nginx(dir, "gateway", &body, port, cpu)?, port))
        }
        Case::Floor | Case::FloorAtRate => {
            let port = procs::free_port()?;
            let mut cmd = servers::pinned(&ctx.bins.http_floor, cpu);
            if let Some(ns) = busy {
                cmd.arg("--busy-ns").arg(ns.to_string());
            }
            cmd.arg(format!("127.0.0.1:{port}"));
            if let Some(up) = upstream {
                cmd.arg(format!("127.0.0.1:{up}"));
            }
            let mut p = Proc::spawn("http_floor", cmd, &dir.join("http_floor.log"))?;
            p.wait_port(port, Duration::from_secs(15))?;
            Ok((p, port))
        }
        Case::Tollgate(store) | Case::Baseline(store) => {
            let (bin, name) = match (case, store, &ctx.baseline) {
                (Case::Baseline(_), Store::Memory, Some(b)) => (b, "baseline-memory"),
                (Case::Baseline(_), Store::Redis(_), Some(b)) => (b, "baseline-redis"),
                (_, Store::Memory, _) => (&ctx.bins.tollgate, "tollgate-memory"),
                (_, Store::Redis(_), _) => (&ctx.bins.tollgate, "tollgate-redis"),
            };
            let g = servers::serve(bin, dir, name, upstream, store, cpu)?;
            Ok((g.proc, g.port))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_spins_for_what_tollgate_spent_above_it_in_its_own_mode() {
        // (decision, proxy), as the table keeps them.
        let mut user_of = [UserTime::default(); 2];
        assert_eq!(user_of[1].busy_ns(), 0, "nothing measured yet");
        user_of[1].floor = Some(3.0);
        user_of[1].tollgate = Some(5.25);
        user_of[0].floor = Some(0.9);
        assert_eq!(user_of[1].busy_ns(), 2250);
        assert_eq!(
            user_of[0].busy_ns(),
            0,
            "decision mode's tollgate not run yet"
        );
        user_of[0].tollgate = Some(0.8);
        assert_eq!(user_of[0].busy_ns(), 0, "a floor slower than tollgate");
        user_of[0].tollgate = Some(5000.0);
        assert_eq!(
            user_of[0].busy_ns(),
            1_000_000,
            "bounded as the floor bounds it"
        );
    }
}
