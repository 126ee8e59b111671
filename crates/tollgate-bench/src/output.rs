//! The report: one serializable value, printed as a table for people and written as JSON for
//! machines (docs/bench-tool.md documents every field).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::accuracy::{self, AccuracyReport, Algorithm, Limit};
use crate::load::{Finished, Plan};
use crate::report::{LatencySummary, SecondSummary};
use crate::BenchArgs;

/// How the bench was run.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Target URLs, in round-robin order.
    pub targets: Vec<String>,
    /// Virtual clients.
    pub clients: usize,
    /// `closed` or `open`.
    pub mode: &'static str,
    /// Open loop: requests per second over all clients.
    pub rate: Option<f64>,
    /// Concurrent requests at most.
    pub connections: usize,
    /// `header:NAME`.
    pub identity: String,
    /// Configured duration.
    pub duration_ms: u128,
    /// Bound on scheduled requests.
    pub max_requests: u64,
    /// Per-request timeout.
    pub timeout_ms: u128,
    #[serde(skip)]
    keys: Vec<String>,
}

impl Settings {
    /// The settings of `plan`, as given by `args`.
    pub fn from_plan(plan: &Plan, args: &BenchArgs) -> Self {
        Self {
            targets: plan.targets.iter().map(ToString::to_string).collect(),
            clients: plan.keys.len(),
            mode: if plan.rate.is_some() {
                "open"
            } else {
                "closed"
            },
            rate: plan.rate,
            connections: plan.connections,
            identity: format!("header:{}", args.identity),
            duration_ms: plan.duration.as_millis(),
            max_requests: plan.max_requests,
            timeout_ms: plan.timeout.as_millis(),
            keys: plan
                .keys
                .iter()
                .map(|key| String::from_utf8_lossy(key.as_bytes()).into_owned())
                .collect(),
        }
    }
}

/// Request totals.
#[derive(Debug, Clone, Serialize)]
pub struct Requests {
    /// Requests sent; each ends answered or as an error, so this is `answered + errors`.
    pub sent: u64,
    /// Requests with an HTTP response: the sum of `status`.
    pub answered: u64,
    /// Requests without one: the sum of `errors`.
    pub errors: u64,
    /// Open loop: due but not sent because every connection was busy.
    pub missed: u64,
}

/// Rates over `elapsed_ms`.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    /// All requests.
    pub sent_per_s: f64,
    /// 2xx answers.
    pub admitted_per_s: f64,
    /// 429 answers.
    pub limited_per_s: f64,
}

/// Latency overall and by class.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Every request, errors included.
    pub all: LatencySummary,
    /// By class: `2xx`, `429`, `503`, `4xx`, `5xx`, `other`, `error`.
    pub by_class: BTreeMap<&'static str, LatencySummary>,
}

/// Everything a bench run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Always "tollgate bench".
    pub tool: &'static str,
    /// The tollgate version.
    pub version: &'static str,
    /// How the bench was run.
    pub settings: Settings,
    /// From the start to the last answer.
    pub elapsed_ms: u128,
    /// Request totals.
    pub requests: Requests,
    /// Rates.
    pub throughput: Throughput,
    /// Answers by HTTP status code.
    pub status: BTreeMap<u16, u64>,
    /// Requests without an answer, by kind: `connect`, `timeout`, `http`.
    pub errors: BTreeMap<&'static str, u64>,
    /// Latency percentiles.
    pub latency: Latency,
    /// Per-client accuracy; null when no limit is known.
    pub accuracy: Option<AccuracyReport>,
    /// Why `accuracy` is null.
    pub accuracy_note: Option<String>,
    /// One entry per second of the run.
    pub timeline: Vec<SecondSummary>,
}

impl Report {
    /// Builds the report of a finished run.
    pub fn build(
        settings: Settings,
        finished: &Finished,
        limits: Vec<Limit>,
        source: &'static str,
        algorithm: Algorithm,
    ) -> Self {
        let recorder = &finished.recorder;
        let answered: u64 = recorder.statuses().values().sum();
        let errors: u64 = recorder.errors().values().sum();
        let elapsed = recorder.last_done().as_secs_f64();
        let per_second = |count: u64| {
            if elapsed > 0.0 {
                count as f64 / elapsed
            } else {
                0.0
            }
        };
        let count_of = |class: &str| {
            recorder
                .latency_by_class()
                .get(class)
                .map_or(0, |histogram| histogram.count())
        };
        let (accuracy, accuracy_note) = if limits.is_empty() {
            let note = "no limit known: the gateway sent no RateLimit-Policy header; \
                        pass --limit and --period";
            (None, Some(note.to_owned()))
        } else {
            let keys = &settings.keys;
            let observations = recorder.observations().map(|(index, observation)| {
                (keys.get(index).map_or("?", String::as_str), observation)
            });
            let report = accuracy::assess(algorithm, source, limits, observations);
            (Some(report), None)
        };
        Self {
            tool: "tollgate bench",
            version: env!("CARGO_PKG_VERSION"),
            elapsed_ms: recorder.last_done().as_millis(),
            requests: Requests {
                sent: recorder.finished(),
                answered,
                errors,
                missed: finished.missed,
            },
            throughput: Throughput {
                sent_per_s: per_second(recorder.finished()),
                admitted_per_s: per_second(count_of("2xx")),
                limited_per_s: per_second(count_of("429")),
            },
            status: recorder.statuses().clone(),
            errors: recorder.errors().clone(),
            latency: Latency {
                all: LatencySummary::of(recorder.latency()),
                by_class: recorder
                    .latency_by_class()
                    .iter()
                    .map(|(class, histogram)| (*class, LatencySummary::of(histogram)))
                    .collect(),
            },
            accuracy,
            accuracy_note,
            timeline: recorder
                .timeline()
                .iter()
                .enumerate()
                .map(|(index, second)| SecondSummary::of(index, second))
                .collect(),
            settings,
        }
    }

    /// The report as a table for a terminal.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let s = &self.settings;
        let mode = match s.rate {
            Some(rate) => format!("open loop at {rate} req/s"),
            None => "closed loop".to_owned(),
        };
        let _ = writeln!(
            out,
            "tollgate bench: {} target(s), {} clients, {mode}, {} connections, {:.1} s",
            s.targets.len(),
            s.clients,
            s.connections,
            self.elapsed_ms as f64 / 1000.0
        );
        let r = &self.requests;
        let _ = writeln!(
            out,
            "requests    sent {}  answered {}  errors {}  missed {}",
            r.sent, r.answered, r.errors, r.missed
        );
        let t = &self.throughput;
        let _ = writeln!(
            out,
            "throughput  {:.1} req/s  (2xx {:.1}/s, 429 {:.1}/s)",
            t.sent_per_s, t.admitted_per_s, t.limited_per_s
        );
        let statuses: Vec<String> = self
            .status
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        if statuses.is_empty() {
            let _ = writeln!(out, "status      no answer");
        } else {
            let _ = writeln!(out, "status      {}", statuses.join("  "));
        }
        if !self.errors.is_empty() {
            let errors: Vec<String> = self
                .errors
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(out, "errors      {}", errors.join("  "));
        }
        let _ = writeln!(
            out,
            "\n{:<12}{:>9}{:>10}{:>10}{:>10}{:>10}{:>10}",
            "latency ms", "count", "p50", "p90", "p99", "p99.9", "max"
        );
        let rows = std::iter::once(("all", &self.latency.all))
            .chain(self.latency.by_class.iter().map(|(class, l)| (*class, l)));
        for (name, l) in rows {
            let ms = |us: u64| us as f64 / 1000.0;
            let _ = writeln!(
                out,
                "{name:<12}{:>9}{:>10.3}{:>10.3}{:>10.3}{:>10.3}{:>10.3}",
                l.count,
                ms(l.p50_us),
                ms(l.p90_us),
                ms(l.p99_us),
                ms(l.p999_us),
                ms(l.max_us)
            );
        }
        out.push('\n');
        match (&self.accuracy, &self.accuracy_note) {
            (Some(a), _) => write_accuracy(&mut out, a),
            (None, Some(note)) => {
                let _ = writeln!(out, "accuracy    {note}");
            }
            (None, None) => {}
        }
        out
    }
}

fn write_accuracy(out: &mut String, a: &AccuracyReport) {
    let _ = writeln!(out, "accuracy    {}: {}", a.algorithm.name(), a.formula);
    for limit in &a.limits {
        let _ = writeln!(
            out,
            "limit       {}{} per {:?}, burst {} (from {})",
            limit
                .name
                .as_deref()
                .map_or(String::new(), |n| format!("{n}: ")),
            limit.limit,
            limit.period,
            limit.burst,
            a.source
        );
    }
    let _ = writeln!(out, "clients     {}", a.clients);
    let spreads = [
        ("over-admitted", &a.over_admission),
        ("under-admitted", &a.under_admission),
    ];
    for (name, spread) in spreads {
        let _ = writeln!(
            out,
            "{name:<16}clients {}  max {}  total {}",
            spread.clients, spread.max, spread.total
        );
    }
}
