//! The report of `tollgate bench --store`: the same object as JSON and as a table.

use serde::Serialize;

use super::bound::{self, Window};
use super::{Phase, Settings};

/// The whole report (`--json` writes it as one object).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SettleReport {
    tool: &'static str,
    version: &'static str,
    mode: &'static str,
    settings: ReportSettings,
    bound: Bound,
    settling: PhaseReport,
    estimate_only: PhaseReport,
    /// The client prefix with the least headroom; null when nothing was admitted.
    worst: Option<ClientWindow>,
    per_client: Vec<ClientWindow>,
}

#[derive(Debug, Clone, Serialize)]
struct ReportSettings {
    store: String,
    clients: u64,
    in_flight: u64,
    estimate: u64,
    max_real: u64,
    hold_ms: u128,
    duration_ms: u128,
    max_requests: u64,
    algorithm: &'static str,
    limit: u64,
    period_ms: u128,
    burst: u64,
    seed: u64,
}

#[derive(Debug, Clone, Serialize)]
struct Bound {
    formula: &'static str,
    /// `C x max(0, max_real - estimate)`.
    settle_slack: u64,
    /// Every client's every prefix within the bound.
    holds: bool,
    /// Clients with a prefix past it.
    clients_over: u64,
    /// The most any client's worst prefix was admitted above what the algorithm admits.
    max_over_algorithm: u64,
}

#[derive(Debug, Clone, Serialize)]
struct PhaseReport {
    settle: bool,
    requests: u64,
    admitted: u64,
    limited: u64,
    /// Settling: the real units of the admitted requests; estimate only: what they were
    /// charged (`admitted x estimate`, their cost when nothing settles).
    admitted_units: u64,
    elapsed_ms: u128,
    store_calls: u64,
    store_calls_per_request: f64,
    store_calls_per_admitted: f64,
    /// Denials answered by the deny cache, without a store call.
    deny_cache_hits: u64,
    refunded_units: u64,
    charged_units: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct ClientWindow {
    client: u64,
    #[serde(flatten)]
    window: Window,
}

const FORMULA: &str =
    "admitted_real <= burst + floor(elapsed * limit / period) + in_flight * max(0, max_real - estimate)";

impl SettleReport {
    pub(crate) fn build(s: &Settings, settling: &Phase, estimated: &Phase) -> Self {
        let terms = s.terms();
        let per_client: Vec<ClientWindow> = settling
            .clients
            .iter()
            .zip(0u64..)
            .filter_map(|((first, admitted), client)| {
                let window = bound::worst_window(&terms, *first, admitted)?;
                Some(ClientWindow { client, window })
            })
            .collect();
        let worst = per_client.iter().min_by_key(|c| c.window.headroom).copied();
        let clients_over = per_client.iter().filter(|c| c.window.headroom < 0).count();
        Self {
            tool: "tollgate bench",
            version: env!("CARGO_PKG_VERSION"),
            mode: "settle",
            settings: ReportSettings {
                store: redacted(&s.store),
                clients: s.clients,
                in_flight: s.in_flight,
                estimate: s.estimate,
                max_real: s.max_real,
                hold_ms: s.hold.as_millis(),
                duration_ms: s.duration.as_millis(),
                max_requests: s.max_requests,
                algorithm: s.algorithm.name(),
                limit: s.limit,
                period_ms: s.period.as_millis(),
                burst: s.burst,
                seed: s.seed,
            },
            bound: Bound {
                formula: FORMULA,
                settle_slack: terms.settle_slack(),
                holds: clients_over == 0,
                clients_over: u64::try_from(clients_over).unwrap_or(u64::MAX),
                max_over_algorithm: per_client
                    .iter()
                    .map(|c| c.window.over_algorithm)
                    .max()
                    .unwrap_or(0),
            },
            settling: PhaseReport::of(settling, true, s.estimate),
            estimate_only: PhaseReport::of(estimated, false, s.estimate),
            worst,
            per_client,
        }
    }

    /// Whether every client stayed within the bound.
    pub(crate) fn holds(&self) -> bool {
        self.bound.holds
    }

    /// The report for people.
    pub(crate) fn to_table(&self) -> String {
        let s = &self.settings;
        let mut out = format!(
            "costs known later: {} limit {} per {} ms, burst {}, on {}\n\
             {} clients x {} in flight, estimate {}, real uniform in [1, {}], held up to {} ms, \
             {} ms\n",
            s.algorithm,
            s.limit,
            s.period_ms,
            s.burst,
            s.store,
            s.clients,
            s.in_flight,
            s.estimate,
            s.max_real,
            s.hold_ms,
            s.duration_ms,
        );
        out +=
            "\nphase           requests  admitted   limited       units  deny cache  store calls  \
                 per request  per admitted\n";
        for (name, p) in [
            ("settling", &self.settling),
            ("estimate only", &self.estimate_only),
        ] {
            out += &format!(
                "{name:<14} {:>9} {:>9} {:>9} {:>11} {:>11} {:>12} {:>12.3} {:>13.3}\n",
                p.requests,
                p.admitted,
                p.limited,
                p.admitted_units,
                p.deny_cache_hits,
                p.store_calls,
                p.store_calls_per_request,
                p.store_calls_per_admitted,
            );
        }
        out += &format!(
            "\nsettled: {} units refunded, {} charged past the estimate\n",
            self.settling.refunded_units, self.settling.charged_units
        );
        out += &format!("bound: {}\n", self.bound.formula);
        match &self.worst {
            Some(w) => {
                out += &format!(
                    "worst prefix: client {} over {} ms: {} real units admitted, the algorithm \
                     admits {} (+{} over), bound {} (slack {}), headroom {}\n",
                    w.client,
                    w.window.elapsed_ms,
                    w.window.admitted_real,
                    w.window.algorithm_allows,
                    w.window.over_algorithm,
                    w.window.bound,
                    self.bound.settle_slack,
                    w.window.headroom
                );
            }
            None => out += "worst prefix: nothing was admitted\n",
        }
        out += if self.bound.holds {
            "the bound holds for every client\n"
        } else {
            "THE BOUND IS BROKEN\n"
        };
        out
    }
}

impl PhaseReport {
    fn of(p: &Phase, settle: bool, estimate: u64) -> Self {
        let admitted = p.clients.iter().map(|c| c.1.len() as u64).sum();
        let admitted_units = if settle {
            p.clients
                .iter()
                .flat_map(|c| c.1.iter())
                .map(|a| a.real)
                .sum()
        } else {
            admitted * estimate
        };
        let per = |n: u64| {
            if n == 0 {
                0.0
            } else {
                p.store_calls as f64 / n as f64
            }
        };
        Self {
            settle,
            requests: p.requests,
            admitted,
            limited: p.limited,
            admitted_units,
            elapsed_ms: p.elapsed.as_millis(),
            store_calls: p.store_calls,
            store_calls_per_request: per(p.requests),
            store_calls_per_admitted: per(admitted),
            deny_cache_hits: p.deny_cache_hits,
            refunded_units: p.settled.0,
            charged_units: p.settled.1,
        }
    }
}

/// A store URL without its password.
fn redacted(store: &str) -> String {
    match (store.split_once("://"), store.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://***{}", &store[at..]),
        _ => store.to_owned(),
    }
}
