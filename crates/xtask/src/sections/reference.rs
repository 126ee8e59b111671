//! reference: the reference deployment scaled to this machine. 20 `tollgate serve` processes
//! (decision mode, Redis store) on one redis-server, driven by tollgate-bench (the load
//! generator behind `tollgate bench`, run in this process). "As many users as the box
//! sustains" is a bounded search: the offered rate (and with it the number of users, rate /
//! 20) climbs a fixed ladder, one run per step, until a step is not sustained, then at most two
//! bisection steps; the highest sustained rate is then run --reps times in all.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use serde_json::{json, Value};
use tollgate_testkit::RedisServer;

use super::servers::{self, Store};
use super::{log, Ctx};
use crate::markdown::Table;
use crate::procs;
use crate::stats::{spread, Digits};

const GATEWAYS: usize = 20;
/// Requests/s each user offers: 160 in an 8 s run against the 113 its bucket allows, so every
/// user is limited and exactness is tested.
const PER_USER: u64 = 20;
/// Sustained: p99 added over the direct call at most this many ms,
const P99_ADDED_MS: u64 = 10;
/// the achieved rate at least this share of the offered rate,
const MIN_ACHIEVED: f64 = 0.97;
/// and missed + errors at most this share of the scheduled requests.
const MAX_MISSED: f64 = 0.01;

/// One run of the 20 gateways at one rate, with its verdict.
#[derive(Debug, Clone, PartialEq)]
struct Verdict {
    rate: u64,
    users: u64,
    achieved: f64,
    p99_us: u64,
    direct_p99_us: u64,
    calls_per_request: f64,
    over_total: f64,
    over_clients: f64,
    missed_or_errors: u64,
    /// Empty when sustained.
    why_not: Vec<String>,
}

impl Verdict {
    fn added_us(&self) -> i64 {
        self.p99_us as i64 - self.direct_p99_us as i64
    }

    fn sustained(&self) -> bool {
        self.why_not.is_empty()
    }
}

/// Judges a run from the gateways' and the direct call's reports (tollgate-bench's JSON).
fn judge(gateways: &Value, direct: &Value, calls: u64, rate: u64) -> anyhow::Result<Verdict> {
    let num = |v: &Value, path: &[&str]| -> anyhow::Result<f64> {
        let mut x = v;
        for p in path {
            x = &x[*p];
        }
        x.as_f64()
            .with_context(|| format!("the bench report has no {}", path.join(".")))
    };
    let sent = num(gateways, &["requests", "sent"])?;
    let missed = num(gateways, &["requests", "missed"])?;
    let bad = missed + num(gateways, &["requests", "errors"])?;
    let achieved = num(gateways, &["throughput", "sent_per_s"])?;
    let p99 = num(gateways, &["latency", "all", "p99_us"])? as u64;
    let direct_p99 = num(direct, &["latency", "all", "p99_us"])? as u64;
    let accuracy =
        |which: &str, field: &str| num(gateways, &["accuracy", which, field]).unwrap_or(f64::NAN);
    let mut v = Verdict {
        rate,
        users: rate / PER_USER,
        achieved,
        p99_us: p99,
        direct_p99_us: direct_p99,
        calls_per_request: calls as f64 / sent.max(1.0),
        over_total: accuracy("over_admission", "total"),
        over_clients: accuracy("over_admission", "clients"),
        missed_or_errors: bad as u64,
        why_not: Vec::new(),
    };
    if v.added_us() > (P99_ADDED_MS * 1000) as i64 {
        v.why_not
            .push(format!("p99 added {} us > {P99_ADDED_MS} ms", v.added_us()));
    }
    if achieved < MIN_ACHIEVED * rate as f64 {
        v.why_not.push(format!(
            "achieved {achieved:.0} < {:.0}%",
            MIN_ACHIEVED * 100.0
        ));
    }
    if bad > MAX_MISSED * (sent + missed) {
        v.why_not.push(format!("missed + errors {bad}"));
    }
    Ok(v)
}

/// The search: climbs `ladder` until a step is not sustained (or `run` fails, or time is
/// up), then bisects at most twice between the last sustained rate and that one, on multiples
/// of 250. Returns the highest sustained rate and why the search stopped.
fn search(
    ladder: &[u64],
    mut time_left: impl FnMut() -> bool,
    mut run: impl FnMut(u64) -> anyhow::Result<bool>,
) -> (Option<u64>, String) {
    let (mut best, mut failed) = (None, None);
    let mut stop = "the ladder ended".to_owned();
    for &rate in ladder {
        if !time_left() {
            stop = "the time budget ran out".into();
            break;
        }
        match run(rate) {
            Ok(true) => best = Some(rate),
            Ok(false) => {
                failed = Some(rate);
                break;
            }
            Err(e) => {
                return (best, format!("the run at {rate} req/s failed: {e:#}"));
            }
        }
    }
    for _ in 0..2 {
        let (Some(b), Some(f)) = (best, failed) else {
            break;
        };
        let mid = (b + f) / 2 / 250 * 250;
        if mid <= b || mid >= f || !time_left() {
            break;
        }
        match run(mid) {
            Ok(true) => best = Some(mid),
            Ok(false) => failed = Some(mid),
            Err(_) => break,
        }
    }
    if let Some(f) = failed {
        stop = format!("{f} req/s was not sustained");
    }
    (best, stop)
}

/// `tollgate bench`'s arguments, parsed (and so checked) by its own definition.
#[derive(Debug, Parser)]
struct BenchLine {
    #[command(flatten)]
    args: tollgate_bench::BenchArgs,
}

fn bench(line: &[String]) -> anyhow::Result<Value> {
    let argv = std::iter::once("bench".to_owned()).chain(line.iter().cloned());
    let parsed = BenchLine::try_parse_from(argv).context("tollgate bench arguments")?;
    tollgate_bench::measure(parsed.args)
}

struct Lab<'a> {
    ctx: &'a Ctx,
    dir: &'a Path,
    redis: RedisServer,
    upstream: u16,
    targets: String,
    seconds: u64,
    direct_seconds: u64,
    runs: Vec<(String, Verdict)>,
}

impl Lab<'_> {
    /// The direct call then the 20 gateways at `rate`; records the verdict.
    fn run(&mut self, rate: u64, tag: &str) -> anyhow::Result<bool> {
        log(&format!(
            "reference {tag}: {rate} req/s, {} users",
            rate / PER_USER
        ));
        let users = (rate / PER_USER).max(1).to_string();
        let common = |target: &str, seconds: u64, json: &Path| -> Vec<String> {
            [
                "--quiet",
                "--target",
                target,
                "--clients",
                &users,
                "--rate",
                &rate.to_string(),
                "--duration",
                &format!("{seconds}s"),
                "--connections",
                "256",
                "--limit",
                "100",
                "--period",
                "1m",
                "--json",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain([json.display().to_string()])
            .collect()
        };
        let dj = self.dir.join(format!("direct-{rate}-{tag}.json"));
        let direct = bench(&common(
            &format!("http://127.0.0.1:{}/", self.upstream),
            self.direct_seconds,
            &dj,
        ))
        .with_context(|| format!("direct call at {rate} req/s"))?;
        let before = servers::script_calls(&self.redis)?;
        let gj = self.dir.join(format!("gateways-{rate}-{tag}.json"));
        let mut line = common(&self.targets, self.seconds, &gj);
        line.push("--svg".into());
        line.push(
            self.dir
                .join(format!("gateways-{rate}-{tag}.svg"))
                .display()
                .to_string(),
        );
        let gateways = bench(&line).with_context(|| format!("20 gateways at {rate} req/s"))?;
        let calls = servers::script_calls(&self.redis)? - before;
        let v = judge(&gateways, &direct, calls, rate)?;
        self.ctx.emit(
            "reference",
            json!({"tag": tag, "rate": rate, "users": v.users,
            "sent_per_s": v.achieved, "p99_us": v.p99_us, "direct_p99_us": v.direct_p99_us,
            "added_p99_us": v.added_us(), "redis_calls_per_request": v.calls_per_request,
            "over_admission_total": v.over_total, "over_admission_clients": v.over_clients,
            "missed_or_errors": v.missed_or_errors, "sustained": v.sustained(),
            "why_not": v.why_not}),
        )?;
        let ok = v.sustained();
        self.runs.push((tag.to_owned(), v));
        Ok(ok)
    }
}

pub fn run(ctx: &Ctx) -> anyhow::Result<String> {
    let (seconds, direct_seconds, ladder, budget): (u64, u64, &[u64], u64) = if ctx.quick {
        (4, 2, &[1000, 2000], 30)
    } else {
        (
            8,
            4,
            &[2000, 3000, 4500, 6750, 10000, 15000, 22500, 33750, 50000],
            180,
        )
    };
    let dir = ctx.dir("reference")?;
    let up = procs::free_port()?;
    let _upstream = servers::nginx(&dir, "upstream", &servers::upstream_body(up), up, None)?;
    let redis = RedisServer::start();
    let mut gateways = Vec::new();
    for g in 1..=GATEWAYS {
        gateways.push(servers::serve(
            &ctx.bins.tollgate,
            &dir,
            &format!("ref-{g}"),
            None,
            Store::Redis(redis.port()),
            None,
        )?);
    }
    let targets: Vec<String> = gateways
        .iter()
        .map(|g| format!("http://127.0.0.1:{}/", g.port))
        .collect();
    let mut lab = Lab {
        ctx,
        dir: &dir,
        redis,
        upstream: up,
        targets: targets.join(","),
        seconds,
        direct_seconds,
        runs: Vec::new(),
    };
    let started = Instant::now();
    let budget = Duration::from_secs(budget);
    let (best, stop) = search(
        ladder,
        || started.elapsed() < budget,
        |rate| lab.run(rate, "search"),
    );
    let conf = best.unwrap_or(ladder[0]);
    for rep in 2..=ctx.reps {
        lab.run(conf, &format!("rep{rep}"))?;
    }
    let svg = dir.join(format!("gateways-{conf}-search.svg"));
    let chart = std::fs::copy(&svg, ctx.root.join("docs/bench/reference.svg")).is_ok();
    Ok(render(
        ctx, &lab.runs, best, conf, &stop, ladder, budget, chart,
    ))
}

#[allow(clippy::too_many_arguments)]
fn render(
    ctx: &Ctx,
    runs: &[(String, Verdict)],
    best: Option<u64>,
    conf: u64,
    stop: &str,
    ladder: &[u64],
    budget: Duration,
    chart: bool,
) -> String {
    if runs.is_empty() {
        return format!(
            "### Reference deployment, scaled to this machine\n\nNo run finished: {stop}.\n"
        );
    }
    let mut steps = Table::new(&[
        "step",
        "offered req/s",
        "users",
        "achieved req/s",
        "p99",
        "direct p99",
        "p99 added",
        "Redis calls / request",
        "over-admitted (total)",
        "missed + errors",
        "sustained",
    ])
    .numbers_only();
    for (i, (_, v)) in runs.iter().filter(|(t, _)| t == "search").enumerate() {
        steps.row(&[
            (i + 1).to_string(),
            v.rate.to_string(),
            v.users.to_string(),
            format!("{:.1}", v.achieved),
            format!("{} us", v.p99_us),
            format!("{} us", v.direct_p99_us),
            format!("{} us", v.added_us()),
            format!("{:.3}", v.calls_per_request),
            format!("{}", v.over_total),
            v.missed_or_errors.to_string(),
            if v.sustained() {
                "yes".to_owned()
            } else {
                format!("no: {}", v.why_not.join(", "))
            },
        ]);
    }
    let at: Vec<&Verdict> = runs
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v.rate == conf)
        .collect();
    let col = |f: &dyn Fn(&Verdict) -> f64| -> Vec<f64> { at.iter().map(|v| f(v)).collect() };
    let sig = Digits::Significant;
    let mut summary = Table::new(&[
        "offered req/s",
        "users",
        "achieved req/s",
        "p99",
        "direct p99",
        "p99 added",
        "Redis calls / request",
        "over-admitted (total)",
        "users over",
        "missed + errors",
        "runs sustained",
    ])
    .numbers_only();
    summary.row(&[
        conf.to_string(),
        (conf / PER_USER).to_string(),
        spread(&col(&|v| v.achieved), sig),
        format!("{} us", spread(&col(&|v| v.p99_us as f64), sig)),
        format!("{} us", spread(&col(&|v| v.direct_p99_us as f64), sig)),
        format!("{} us", spread(&col(&|v| v.added_us() as f64), sig)),
        spread(&col(&|v| v.calls_per_request), sig),
        spread(&col(&|v| v.over_total), sig),
        spread(&col(&|v| v.over_clients), sig),
        spread(&col(&|v| v.missed_or_errors as f64), sig),
        format!(
            "{} of {}",
            at.iter().filter(|v| v.sustained()).count(),
            at.len()
        ),
    ]);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let verdict = match best {
        Some(b) => format!(
            "**Highest sustained: {b} requests/s, {} users** ({GATEWAYS} gateways, one Redis, \
             {cores} cores shared with the load generator); the search stopped because {stop}.",
            b / PER_USER
        ),
        None => format!("**No step was sustained** (the search stopped because {stop}); the table below is at the first step."),
    };
    let ladder_text: Vec<String> = ladder.iter().map(u64::to_string).collect();
    format!(
        "### Reference deployment, scaled to this machine\n\n\
         DESIGN.md's reference load is 20 gateways, 50,000 requests/s, 100 requests/min per \
         user. Here: {GATEWAYS} `tollgate serve` processes (decision mode, token_bucket 100/min \
         per `header:x-api-key`, Redis store timeout 200ms) on one redis-server, all on {cores} \
         cores with the load generator. Each run: tollgate-bench (`tollgate bench --target <{GATEWAYS} \
         urls> --clients U --rate R --duration {}s --connections 256 --limit 100 --period 1m`), U = \
         R / {PER_USER}, just after the same load for {} s against an nginx answering 200 (the \
         direct call). Redis calls per request: INFO commandstats (evalsha + eval) over the run / \
         requests sent. Over-admission: requests admitted beyond what the limit allows, summed \
         over all users (0 = exact).\n\n\
         **How many users the box sustains**: the offered rate climbs {} req/s (one run per \
         step) and stops at the first step that is not sustained; then at most two bisection \
         steps; {} s at most in all. Sustained = p99 added over the direct call at most \
         {P99_ADDED_MS} ms, achieved rate at least {:.0}% of the offered rate, and missed + \
         errors at most {:.0}% of those scheduled.\n\n{}\n{verdict}\n\n\
         At {conf} req/s ({} users), the search's run and {} more: min / median / max of the \
         runs.\n\n{}{}",
        if ctx.quick { 4 } else { 8 },
        if ctx.quick { 2 } else { 4 },
        ladder_text.join(" / "),
        budget.as_secs(),
        MIN_ACHIEVED * 100.0,
        MAX_MISSED * 100.0,
        steps.render(),
        conf / PER_USER,
        ctx.reps.saturating_sub(1),
        summary.render(),
        if chart { format!("\n![reference deployment at {conf} req/s](bench/reference.svg)\n") } else { String::new() },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(sent: u64, missed: u64, errors: u64, per_s: f64, p99: u64) -> Value {
        json!({"requests": {"sent": sent, "missed": missed, "errors": errors},
               "throughput": {"sent_per_s": per_s}, "latency": {"all": {"p99_us": p99}},
               "accuracy": {"over_admission": {"total": 0, "clients": 0}}})
    }

    #[test]
    fn a_run_is_sustained_only_when_every_condition_holds() {
        let direct = report(8000, 0, 0, 2000.0, 300);
        let ok = judge(&report(16000, 0, 0, 1999.0, 1300), &direct, 16000, 2000).expect("verdict");
        assert!(ok.sustained(), "{ok:?}");
        assert_eq!(ok.calls_per_request, 1.0);
        assert_eq!(ok.added_us(), 1000);
        let slow =
            judge(&report(16000, 0, 0, 1999.0, 10_400), &direct, 16000, 2000).expect("verdict");
        assert_eq!(slow.why_not, vec!["p99 added 10100 us > 10 ms".to_owned()]);
        let short =
            judge(&report(16000, 0, 0, 1900.0, 400), &direct, 16000, 2000).expect("verdict");
        assert!(!short.sustained());
        let missed =
            judge(&report(16000, 300, 0, 1990.0, 400), &direct, 16000, 2000).expect("verdict");
        assert_eq!(missed.why_not, vec!["missed + errors 300".to_owned()]);
        assert!(judge(&json!({}), &direct, 0, 2000).is_err());
    }

    #[test]
    fn the_search_climbs_then_bisects_between_the_last_two_steps() {
        let mut tried = Vec::new();
        let (best, stop) = search(
            &[2000, 3000, 4500, 6750, 10000, 15000],
            || true,
            |rate| {
                tried.push(rate);
                Ok(rate <= 11_000)
            },
        );
        assert_eq!(
            tried,
            vec![2000, 3000, 4500, 6750, 10000, 15000, 12500, 11250]
        );
        assert_eq!(best, Some(10000));
        assert_eq!(stop, "11250 req/s was not sustained");
    }

    #[test]
    fn the_search_stops_on_a_failure_or_when_time_is_up() {
        let (best, stop) = search(
            &[1000, 2000],
            || true,
            |rate| {
                if rate == 2000 {
                    anyhow::bail!("boom")
                } else {
                    Ok(true)
                }
            },
        );
        assert_eq!(best, Some(1000));
        assert!(stop.contains("failed: boom"), "{stop}");
        let mut polls = 0;
        let (best, stop) = search(
            &[1000, 2000, 3000],
            || {
                polls += 1;
                polls <= 1
            },
            |_| Ok(true),
        );
        assert_eq!(best, Some(1000));
        assert_eq!(stop, "the time budget ran out");
        let (best, stop) = search(&[1000, 2000], || true, |_| Ok(true));
        assert_eq!((best, stop.as_str()), (Some(2000), "the ladder ended"));
    }
}
