//! The scenarios and the replay: a scenario is a quota and a list of timed requests; replaying
//! it runs the requests through one algorithm on a simulated clock and records each decision.

use anyhow::Context;
use clap::ValueEnum;
use tollgate_core::{Algorithm, Limit, Micros, Quota};

/// A minute boundary since the Unix epoch (2023-11-14T22:13:00Z), so windows align with it.
const START: Micros = 1_699_999_980_000_000;
const SECOND: Micros = 1_000_000;

/// The scenarios `tollgate simulate` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ScenarioName {
    /// 100/min; 150 requests at 59.9 s and 150 at 60.1 s, across a window boundary.
    Boundary,
    /// 100/min; one request every 500 ms (1.2x the limit) for 10 minutes.
    Steady,
    /// 100/min; bursts of 100 requests every 45 s, five times.
    Burst,
}

impl ScenarioName {
    /// The name as typed on the command line and printed in the output.
    pub fn name(self) -> &'static str {
        match self {
            ScenarioName::Boundary => "boundary",
            ScenarioName::Steady => "steady",
            ScenarioName::Burst => "burst",
        }
    }
}

/// A quota and the requests sent against it.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Which scenario this is.
    pub name: ScenarioName,
    /// One line saying what is sent.
    pub summary: &'static str,
    /// The quota every algorithm enforces.
    pub quota: Quota,
    /// When each request arrives, in microseconds after the start (a minute boundary).
    pub arrivals: Vec<Micros>,
}

impl Scenario {
    /// Builds the named scenario.
    pub fn new(name: ScenarioName) -> anyhow::Result<Self> {
        let quota = Quota::per_minute(100).context("the scenario's quota")?;
        let (summary, arrivals) = match name {
            ScenarioName::Boundary => (
                "100 per minute (burst 100); 150 requests at 59.9 s and 150 at 60.1 s",
                [59_900_000; 150]
                    .into_iter()
                    .chain([60_100_000; 150])
                    .collect(),
            ),
            ScenarioName::Steady => (
                "100 per minute (burst 100); one request every 500 ms (1.2x the limit) for 10 min",
                (0..1_200).map(|k| k * 500_000).collect(),
            ),
            ScenarioName::Burst => (
                "100 per minute (burst 100); 100 requests at once at 0, 45, 90, 135 and 180 s",
                (0..5)
                    .flat_map(|k| std::iter::repeat_n(k * 45 * SECOND, 100))
                    .collect(),
            ),
        };
        Ok(Self {
            name,
            summary,
            quota,
            arrivals,
        })
    }
}

/// What one algorithm did with a scenario.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Requests sent.
    pub sent: u64,
    /// Requests admitted.
    pub allowed: u64,
    /// Requests rejected.
    pub denied: u64,
    /// Each request's arrival (microseconds after the start) and whether it was admitted.
    pub decisions: Vec<(Micros, bool)>,
}

/// Replays `scenario` through `algorithm`, each request costing 1.
pub fn replay(scenario: &Scenario, algorithm: Algorithm) -> anyhow::Result<Outcome> {
    let limit = Limit::new(algorithm, scenario.quota).map_err(anyhow::Error::msg)?;
    let mut state = limit.fresh();
    let mut decisions = Vec::with_capacity(scenario.arrivals.len());
    for &at in &scenario.arrivals {
        let d = limit.check(&mut state, START + at, 1, true);
        decisions.push((at, d.allowed));
    }
    let allowed = decisions.iter().filter(|(_, ok)| *ok).count();
    let sent = decisions.len();
    Ok(Outcome {
        algorithm,
        sent: u64::try_from(sent)?,
        allowed: u64::try_from(allowed)?,
        denied: u64::try_from(sent - allowed)?,
        decisions,
    })
}

/// Why the algorithm admitted what it did in this scenario, in one line.
pub fn explain(name: ScenarioName, algorithm: Algorithm) -> &'static str {
    use Algorithm::*;
    use ScenarioName::*;
    match (name, algorithm) {
        (Boundary, FixedWindow) => {
            "100 fit in the window [0 s, 60 s) and another 100 in [60 s, 120 s): 200 within 0.2 s"
        }
        (Boundary, SlidingWindowLog) => {
            "exact: at 60.1 s the 100 admitted at 59.9 s are still in the last 60 s"
        }
        (Boundary, SlidingWindowCounter) => {
            "at 60.1 s the previous window's 100 still weigh 100 x 59.9/60 = 99.8: no room left"
        }
        (Boundary, TokenBucket) => {
            "the 100 tokens are spent at 59.9 s; 0.2 s refills none (one token per 600 ms)"
        }
        (Boundary, LeakyBucket) => {
            "the bucket fills to 100 at 59.9 s; 0.2 s drains none (one unit per 600 ms)"
        }
        (Boundary, Gcra) => {
            "the first 100 push the arrival time 60 s ahead; 0.2 s later it is still 59.8 s ahead"
        }
        (Steady, FixedWindow) => "100 per aligned minute, the surplus of each minute rejected",
        (Steady, SlidingWindowLog) => {
            "100 in any 60 s: the first minute fills it, then one admitted as one leaves"
        }
        (Steady, SlidingWindowCounter) => {
            "the weighted estimate of the last 60 s keeps it near the rate, a few under the log"
        }
        (Steady, TokenBucket) => {
            "the full bucket (100) absorbs the surplus for 5 min, then one token per 600 ms"
        }
        (Steady, LeakyBucket) => "same as the token bucket: the meter drains one unit per 600 ms",
        (Steady, Gcra) => "same as the token bucket: one arrival per 600 ms plus the burst",
        (Burst, FixedWindow) => {
            "each burst that opens a new minute gets 100; the one at 45 s finds its minute full"
        }
        (Burst, SlidingWindowLog) => {
            "a burst gets 100 only when none was admitted in the last 60 s"
        }
        (Burst, SlidingWindowCounter) => {
            "100, 0, 50, 62, 38: each burst gets what the previous minute's weighted count leaves"
        }
        (Burst, TokenBucket) => "100, then 45 s of refill (75 tokens) before each later burst",
        (Burst, LeakyBucket) => "same as the token bucket: 45 s drain 75 units",
        (Burst, Gcra) => "same as the token bucket: 45 s move the arrival time back by 75 units",
        // Not simulated (no rate: nothing is released in a scenario of instant requests).
        (_, Concurrency) => "holds every request until it ends: not a rate",
    }
}
