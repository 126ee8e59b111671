//! Aggregation of samples into counts, latency histograms and a per-second timeline.
//!
//! Why aggregate as samples arrive instead of keeping them: memory stays bounded by the number
//! of clients and seconds, not by the number of requests.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::accuracy::{ClientObservation, Span};
use crate::histogram::Histogram;

/// Why a request got no HTTP response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorKind {
    /// The connection could not be made.
    Connect,
    /// No complete answer within the request timeout.
    Timeout,
    /// Any other transport or protocol failure.
    Http,
}

impl ErrorKind {
    /// The name used in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Http => "http",
        }
    }
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An HTTP response with this status.
    Status(u16),
    /// No response.
    Error(ErrorKind),
}

impl Outcome {
    /// The class used for latency breakdowns: `2xx`, `429`, `503`, `4xx`, `5xx`, `other`,
    /// `error`.
    pub fn class(self) -> &'static str {
        match self {
            Outcome::Status(200..=299) => "2xx",
            Outcome::Status(429) => "429",
            Outcome::Status(503) => "503",
            Outcome::Status(400..=499) => "4xx",
            Outcome::Status(500..=599) => "5xx",
            Outcome::Status(_) => "other",
            Outcome::Error(_) => "error",
        }
    }
}

/// One finished request; times are offsets from the start of the bench.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Index of the virtual client.
    pub client: usize,
    /// When the request was handed to the connection.
    pub sent_at: Duration,
    /// When the whole response (or the error) came back.
    pub done_at: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

/// What one virtual client offered and got.
#[derive(Debug, Clone, Copy, Default)]
struct ClientCounts {
    sent: u64,
    admitted: u64,
    limited: u64,
    first_sent: Option<Duration>,
    first_done: Option<Duration>,
    last_sent: Duration,
    last_done: Duration,
}

/// Counts for one second of the run (by completion time).
#[derive(Debug, Clone, Default)]
pub struct Second {
    /// 2xx answers.
    pub admitted: u64,
    /// 429 answers.
    pub limited: u64,
    /// Any other status.
    pub other: u64,
    /// No answer.
    pub errors: u64,
    /// Latency of everything that finished in this second, in microseconds.
    pub latency: Histogram,
}

/// Everything the bench learnt, aggregated.
#[derive(Debug, Clone)]
pub struct Recorder {
    start_unix_ns: u128,
    statuses: BTreeMap<u16, u64>,
    errors: BTreeMap<&'static str, u64>,
    latency: Histogram,
    latency_by_class: BTreeMap<&'static str, Histogram>,
    clients: Vec<ClientCounts>,
    timeline: Vec<Second>,
    last_done: Duration,
}

impl Recorder {
    /// An empty recorder for `clients` clients; `start_unix_ns` is the wall-clock time of the
    /// bench's start, which the epoch-aligned window formulas need.
    pub fn new(clients: usize, start_unix_ns: u128) -> Self {
        Self {
            start_unix_ns,
            statuses: BTreeMap::new(),
            errors: BTreeMap::new(),
            latency: Histogram::new(),
            latency_by_class: BTreeMap::new(),
            clients: vec![ClientCounts::default(); clients],
            timeline: Vec::new(),
            last_done: Duration::ZERO,
        }
    }

    /// Counts one finished request.
    pub fn record(&mut self, sample: Sample) {
        let micros = u64::try_from(sample.done_at.saturating_sub(sample.sent_at).as_micros())
            .unwrap_or(u64::MAX);
        self.latency.record(micros);
        let class = sample.outcome.class();
        self.latency_by_class
            .entry(class)
            .or_default()
            .record(micros);
        self.last_done = self.last_done.max(sample.done_at);

        let second = usize::try_from(sample.done_at.as_secs()).unwrap_or(usize::MAX);
        if second < MAX_SECONDS {
            if self.timeline.len() <= second {
                self.timeline.resize_with(second + 1, Second::default);
            }
            let slot = &mut self.timeline[second];
            slot.latency.record(micros);
            match sample.outcome {
                Outcome::Status(200..=299) => slot.admitted += 1,
                Outcome::Status(429) => slot.limited += 1,
                Outcome::Status(_) => slot.other += 1,
                Outcome::Error(_) => slot.errors += 1,
            }
        }

        match sample.outcome {
            Outcome::Status(status) => *self.statuses.entry(status).or_default() += 1,
            Outcome::Error(kind) => *self.errors.entry(kind.as_str()).or_default() += 1,
        }

        let Some(client) = self.clients.get_mut(sample.client) else {
            return;
        };
        client.sent += 1;
        match sample.outcome {
            Outcome::Status(200..=299) => client.admitted += 1,
            Outcome::Status(429) => client.limited += 1,
            _ => {}
        }
        client.first_sent = Some(
            client
                .first_sent
                .map_or(sample.sent_at, |t| t.min(sample.sent_at)),
        );
        client.first_done = Some(
            client
                .first_done
                .map_or(sample.done_at, |t| t.min(sample.done_at)),
        );
        client.last_sent = client.last_sent.max(sample.sent_at);
        client.last_done = client.last_done.max(sample.done_at);
    }

    /// Requests that finished, with or without a response.
    pub fn finished(&self) -> u64 {
        self.latency.count()
    }

    /// When the last request finished, from the start.
    pub fn last_done(&self) -> Duration {
        self.last_done
    }

    /// Counts by HTTP status.
    pub fn statuses(&self) -> &BTreeMap<u16, u64> {
        &self.statuses
    }

    /// Counts by error kind.
    pub fn errors(&self) -> &BTreeMap<&'static str, u64> {
        &self.errors
    }

    /// Latency of every request, in microseconds.
    pub fn latency(&self) -> &Histogram {
        &self.latency
    }

    /// Latency by outcome class, in microseconds.
    pub fn latency_by_class(&self) -> &BTreeMap<&'static str, Histogram> {
        &self.latency_by_class
    }

    /// The per-second timeline, by completion time.
    pub fn timeline(&self) -> &[Second] {
        &self.timeline
    }

    /// What each client saw, in the spans the accuracy formulas need (wall clock).
    pub fn observations(&self) -> impl Iterator<Item = (usize, ClientObservation)> + '_ {
        let wall = |offset: Duration| self.start_unix_ns + offset.as_nanos();
        self.clients
            .iter()
            .enumerate()
            .filter_map(move |(index, c)| {
                let (first_sent, first_done) = (c.first_sent?, c.first_done?);
                let widest = Span {
                    start_ns: wall(first_sent),
                    end_ns: wall(c.last_done.max(first_sent)),
                };
                let narrow_start = wall(first_done);
                let narrowest = Span {
                    start_ns: narrow_start,
                    end_ns: wall(c.last_sent).max(narrow_start),
                };
                let observation = ClientObservation {
                    admitted: c.admitted,
                    limited: c.limited,
                    widest,
                    narrowest,
                };
                Some((index, observation))
            })
    }
}

/// Seconds kept in the timeline: the longest run (1 h) plus the longest timeout (5 min).
const MAX_SECONDS: usize = 3_900;

/// Latency summary of a set of requests, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct LatencySummary {
    /// Requests counted.
    pub count: u64,
    /// Fastest.
    pub min_us: u64,
    /// Exact mean.
    pub mean_us: u64,
    /// Median.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest.
    pub max_us: u64,
}

impl LatencySummary {
    /// Summarises a histogram of microseconds.
    pub fn of(histogram: &Histogram) -> Self {
        Self {
            count: histogram.count(),
            min_us: histogram.min(),
            mean_us: histogram.mean().round() as u64,
            p50_us: histogram.quantile(0.50),
            p90_us: histogram.quantile(0.90),
            p99_us: histogram.quantile(0.99),
            p999_us: histogram.quantile(0.999),
            max_us: histogram.max(),
        }
    }
}

/// One second of the timeline in reports.
#[derive(Debug, Clone, Serialize)]
pub struct SecondSummary {
    /// Seconds since the start (by completion time).
    pub second: usize,
    /// 2xx answers.
    pub admitted: u64,
    /// 429 answers.
    pub limited: u64,
    /// Other statuses.
    pub other: u64,
    /// No answer.
    pub errors: u64,
    /// Median latency in this second.
    pub p50_us: u64,
    /// 90th percentile latency in this second.
    pub p90_us: u64,
    /// 99th percentile latency in this second.
    pub p99_us: u64,
}

impl SecondSummary {
    /// Summarises second `index` of a timeline.
    pub fn of(index: usize, second: &Second) -> Self {
        Self {
            second: index,
            admitted: second.admitted,
            limited: second.limited,
            other: second.other,
            errors: second.errors,
            p50_us: second.latency.quantile(0.50),
            p90_us: second.latency.quantile(0.90),
            p99_us: second.latency.quantile(0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(client: usize, sent_ms: u64, done_ms: u64, outcome: Outcome) -> Sample {
        Sample {
            client,
            sent_at: Duration::from_millis(sent_ms),
            done_at: Duration::from_millis(done_ms),
            outcome,
        }
    }

    #[test]
    fn every_sample_is_counted_once_by_status_or_error() {
        let mut recorder = Recorder::new(2, 0);
        recorder.record(sample(0, 0, 5, Outcome::Status(200)));
        recorder.record(sample(1, 1, 7, Outcome::Status(429)));
        recorder.record(sample(0, 2, 1_500, Outcome::Status(503)));
        recorder.record(sample(1, 3, 2_003, Outcome::Error(ErrorKind::Timeout)));
        let by_status: u64 = recorder.statuses().values().sum();
        let by_error: u64 = recorder.errors().values().sum();
        assert_eq!(by_status + by_error, 4);
        assert_eq!(recorder.finished(), 4);
        assert_eq!(recorder.errors().get("timeout"), Some(&1));
        assert_eq!(recorder.timeline().len(), 3);
        assert_eq!(recorder.timeline()[0].admitted, 1);
        assert_eq!(recorder.timeline()[0].limited, 1);
        assert_eq!(recorder.timeline()[1].other, 1);
        assert_eq!(recorder.timeline()[2].errors, 1);
        assert_eq!(recorder.latency_by_class()["2xx"].max(), 5_000);
        assert_eq!(recorder.last_done(), Duration::from_millis(2_003));
    }

    #[test]
    fn client_spans_are_widest_and_narrowest_around_the_decisions() {
        let mut recorder = Recorder::new(1, 1_000_000_000);
        recorder.record(sample(0, 10, 20, Outcome::Status(200)));
        recorder.record(sample(0, 100, 130, Outcome::Status(429)));
        let (index, seen) = recorder.observations().next().expect("one client");
        assert_eq!(index, 0);
        assert_eq!((seen.admitted, seen.limited), (1, 1));
        assert_eq!(seen.widest.start_ns, 1_010_000_000);
        assert_eq!(seen.widest.end_ns, 1_130_000_000);
        assert_eq!(seen.narrowest.start_ns, 1_020_000_000);
        assert_eq!(seen.narrowest.end_ns, 1_100_000_000);
    }

    #[test]
    fn a_single_request_has_an_empty_narrowest_span() {
        let mut recorder = Recorder::new(3, 0);
        recorder.record(sample(2, 10, 20, Outcome::Status(200)));
        let seen: Vec<_> = recorder.observations().collect();
        assert_eq!(seen.len(), 1, "idle clients are left out");
        assert_eq!(seen[0].0, 2);
        assert_eq!(seen[0].1.narrowest.elapsed_ns(), 0);
    }
}
