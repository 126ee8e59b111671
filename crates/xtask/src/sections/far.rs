//! far: a gateway in front of a Redis far away, the default `store.max_batch` against 1.
//!
//! A delay relay (`crate::relay`) between the gateway and its redis-server holds every chunk
//! 500 µs each way, so each round trip to Redis takes 1 ms more, as to a server in another
//! zone; with many clients at once, one gateway passes only what its calls in flight carry.
//! Cases: plans of one form (token bucket 100/min per `x-api-key`) 1 ms away; and plans of many
//! forms (every request a plan of two rules, its second one of ten policies chosen by the path:
//! five algorithms, each enforced and in shadow mode), on loopback and 1 ms away. Batches of
//! many forms in every order fill the process's cache of batch scripts (256 lists of forms)
//! within the warm-up, so the counted seconds run past that bound. Unpinned: the gateway (its
//! default workers), the relay, redis-server and wrk share the machine's CPUs. With
//! `--baseline` the baseline binary runs every case too, in the same rounds.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tollgate_testkit::RedisServer;

use super::servers::{self, Wrk};
use super::{log, Ctx};
use crate::markdown::Table;
use crate::procs;
use crate::relay::DelayRelay;
use crate::stats::{ratios, spread, Digits};

/// The relay's delay each way.
const DELAY: Duration = Duration::from_micros(500);

/// The algorithms of the ten policies of many forms (each twice: enforced, then in shadow).
const ALGORITHMS: [&str; 5] = [
    "token_bucket",
    "fixed_window",
    "sliding_window_counter",
    "leaky_bucket",
    "gcra",
];

/// The cases measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Case {
    OneFar,
    ManyNear,
    ManyFar,
}

impl Case {
    const ALL: [Case; 3] = [Case::OneFar, Case::ManyNear, Case::ManyFar];

    fn name(self) -> &'static str {
        match self {
            Case::OneFar => "one form, Redis 1 ms away",
            Case::ManyNear => "many forms, Redis on loopback",
            Case::ManyFar => "many forms, Redis 1 ms away",
        }
    }

    fn far(self) -> bool {
        self != Case::ManyNear
    }

    fn many(self) -> bool {
        self != Case::OneFar
    }

    /// wrk's connections: enough to keep a far Redis's round trips full.
    fn connections(self) -> u32 {
        if self.far() {
            256
        } else {
            64
        }
    }
}

#[derive(Debug, Default)]
struct Runs {
    rps: Vec<f64>,
    p99_ms: Vec<f64>,
    redis_us: Vec<f64>,
    calls: Vec<f64>,
    errors: u64,
}

/// A case: the case, the binary's label, and `max_batch = 1` or the default.
type Key = (Case, String, bool);

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let title = "### A Redis far away: the default `max_batch` against 1\n\n";
    let dir = ctx.dir("far")?;
    let seconds = if ctx.quick { 2 } else { 6 };
    let server = RedisServer::start_with_args(&["--hz", "100"]);
    let relay = DelayRelay::start(server.port(), DELAY)?;
    let mut binaries: Vec<(String, &Path)> = vec![("this build".into(), &ctx.bins.tollgate)];
    if let Some(b) = &ctx.baseline {
        binaries.push(("baseline".into(), b));
    }
    let tick_us = 1e6 / procs::ticks_per_second() as f64;
    let mut runs: BTreeMap<Key, Runs> = BTreeMap::new();
    for rep in 1..=ctx.reps {
        for case in Case::ALL {
            let redis_port = if case.far() {
                relay.port()
            } else {
                server.port()
            };
            let wrk = |seconds| Wrk {
                threads: 1,
                connections: case.connections(),
                seconds,
                cpu: None,
                paths: if case.many() { 10 } else { 0 },
            };
            // Binaries and settings take turns, the order reversed every other repetition.
            let mut order: Vec<(&String, &Path, bool)> = Vec::new();
            for (label, bin) in &binaries {
                for one in [false, true] {
                    order.push((label, bin, one));
                }
            }
            if rep % 2 == 0 {
                order.reverse();
            }
            for (label, bin, one) in order {
                log(&format!(
                    "far rep {rep}/{}: {} {label} max_batch {}",
                    ctx.reps,
                    case.name(),
                    if one { "1" } else { "default" }
                ));
                servers::reset_redis(&[&server]);
                let gateway = serve(bin, &dir, case, redis_port, one)?;
                let (port, admin) = (gateway.port, gateway.admin);
                let warm = if case.many() { 3 } else { 1 };
                wrk(warm).run(&dir, port, &ctx.logs.join("far-warm.txt"))?;
                let ((r0, c0), f0) = (servers::redis_usage(&[&server])?, failed_decisions(admin)?);
                let w = wrk(seconds).run(&dir, port, &ctx.logs.join("far-wrk.txt"))?;
                let ((r1, c1), f1) = (servers::redis_usage(&[&server])?, failed_decisions(admin)?);
                drop(gateway);
                let n = w.requests.max(1) as f64;
                let redis_us = r1.saturating_sub(r0) as f64 * tick_us / n;
                let per_request = c1.saturating_sub(c0) as f64 / n;
                let failed = f1.saturating_sub(f0);
                let r = runs.entry((case, label.clone(), one)).or_default();
                r.rps.push(w.rps());
                r.p99_ms.push(w.p99_us as f64 / 1000.0);
                r.redis_us.push(redis_us);
                r.calls.push(per_request);
                r.errors += w.status_errors + w.socket_errors + failed;
                ctx.emit(
                    "far",
                    json!({"case": case.name(), "binary": label, "max_batch_1": one,
                    "rep": rep, "requests": w.requests, "requests_per_s": w.rps(),
                    "p99_us": w.p99_us, "redis_cpu_us_per_decision": redis_us,
                    "script_calls_per_request": per_request,
                    "status_errors": w.status_errors, "socket_errors": w.socket_errors,
                    "failed_decisions": failed}),
                )?;
            }
        }
    }
    drop(relay);
    Ok(format!(
        "{title}`tollgate serve` in decision mode on one redis-server (`--hz 100`), through a \
         delay relay holding every chunk {} µs each way (a round trip 1 ms longer) or on \
         loopback. *One form*: token_bucket 100/min per `x-api-key`, 100,000 random keys, so \
         nearly every request is allowed and is one plan. *Many forms*: every request a plan of \
         two rules, the second one of ten policies picked by its path at random (five \
         algorithms, each enforced and in shadow mode): ten forms, one batch script a store for \
         all of them (before 2026-12-05, a script for each set of up to four, past the \
         process's cache of 256 within the warm-up). wrk (1 thread; 256 \
         connections 1 ms away, 64 on loopback; {seconds} s counted after 1 s of warm-up, 3 s \
         with many forms); `store.timeout` 2 s. Unpinned: the gateway (its default workers), \
         the relay, redis-server and wrk share the machine's CPUs. Redis CPU per decision: its \
         utime + stime over the run / requests; script calls: INFO commandstats' EVALSHA + EVAL \
         / requests. Errors: answers of 400 or more, socket errors and decisions that failed \
         open or closed or were made by the fallback (`tollgate_decisions_total`). min / median / max of {} repetition(s), \
         the settings (and binaries) taking turns; the ratio is default / `max_batch = 1` of \
         the same binary, case and repetition.\n\n{}",
        DELAY.as_micros(),
        ctx.reps,
        render(&runs, &binaries)
    ))
}

fn render(runs: &BTreeMap<Key, Runs>, binaries: &[(String, &Path)]) -> String {
    let sig = Digits::Significant;
    let mut t = Table::new(&[
        "case",
        "binary",
        "store.max_batch",
        "requests/s",
        "requests/s default / 1",
        "p99 ms",
        "Redis CPU µs per decision",
        "script calls per request",
        "errors",
    ]);
    let empty = Runs::default();
    for case in Case::ALL {
        for (label, _) in binaries {
            let one = runs.get(&(case, label.clone(), true)).unwrap_or(&empty);
            for is_one in [false, true] {
                let r = runs.get(&(case, label.clone(), is_one)).unwrap_or(&empty);
                let ratio = if is_one {
                    "1".to_string()
                } else {
                    spread(&ratios(&r.rps, &one.rps), Digits::Fixed(2))
                };
                t.row(&[
                    case.name().to_string(),
                    label.clone(),
                    if is_one { "1" } else { "default (64)" }.to_string(),
                    spread(&r.rps, Digits::Fixed(0)),
                    ratio,
                    spread(&r.p99_ms, sig),
                    spread(&r.redis_us, sig),
                    spread(&r.calls, Digits::Fixed(3)),
                    r.errors.to_string(),
                ]);
            }
        }
    }
    t.render()
}

/// The config's policies: one, or (many forms) one for every request and ten by path (wrk
/// with `paths: 10`). The coalesce section's too.
pub(super) fn policies(many: bool) -> String {
    let limit = if many { 100_000 } else { 100 };
    let mut out = format!(
        "[[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = {limit}\n\
         period = \"1m\"\n"
    );
    if many {
        for i in 0..10 {
            let algorithm = ALGORITHMS[i % ALGORITHMS.len()];
            out.push_str(&format!(
                "[[policy]]\nname = \"p{i}\"\nalgorithm = \"{algorithm}\"\nlimit = 100000\n\
                 period = \"1m\"\nshadow = {}\nmatch = {{ path_prefix = \"/p{i}/\" }}\n",
                i >= 5
            ));
        }
    }
    out
}

/// Starts `tollgate serve` (unpinned) on the Redis at 127.0.0.1:`redis_port`.
fn serve(
    bin: &Path,
    dir: &Path,
    case: Case,
    redis_port: u16,
    one: bool,
) -> anyhow::Result<servers::Gateway> {
    servers::serve_with(bin, dir, "tollgate-far", None, |port, admin| {
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             [store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{redis_port}\"\n\
             timeout = \"2s\"\n{}\
             [identity]\nsources = [\"header:x-api-key\", \"ip\"]\nsecret = \"far\"\n{}",
            if one { "max_batch = 1\n" } else { "" },
            policies(case.many())
        )
    })
}

/// Decisions not made by Redis so far (failed open or closed, or made by the fallback), from
/// the gateway's metrics.
fn failed_decisions(admin: u16) -> anyhow::Result<u64> {
    Ok(count_failed(&procs::http_body(admin, "/metrics")?))
}

fn count_failed(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("tollgate_decisions_total{"))
        .filter(|l| {
            [
                "failed_open",
                "failed_closed",
                "fallback_allowed",
                "fallback_limited",
            ]
            .iter()
            .any(|o| l.contains(&format!("outcome=\"{o}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_decisions_count_only_failed_outcomes() {
        let m = "# TYPE tollgate_decisions_total counter\n\
                 tollgate_decisions_total{policy=\"api\",outcome=\"allowed\"} 900\n\
                 tollgate_decisions_total{policy=\"api\",outcome=\"failed_open\"} 3\n\
                 tollgate_decisions_total{policy=\"p1\",outcome=\"failed_closed\"} 4\n\
                 tollgate_decisions_total{policy=\"p2\",outcome=\"fallback_limited\"} 2\n\
                 tollgate_store_errors_total{outcome=\"failed_open\"} 50\n";
        assert_eq!(count_failed(m), 9);
    }

    #[test]
    fn many_forms_give_ten_policies_by_path_half_in_shadow() {
        let p = policies(true);
        assert_eq!(p.matches("[[policy]]").count(), 11);
        assert_eq!(p.matches("shadow = true").count(), 5);
        assert!(p.contains("path_prefix = \"/p9/\""));
        assert_eq!(policies(false).matches("[[policy]]").count(), 1);
    }
}
