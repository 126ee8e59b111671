//! `tollgate simulate`: replays a scenario through every algorithm on a simulated clock and
//! shows what each one admits, as a table, JSON lines or an SVG chart.
//!
//! Why it exists: the algorithms differ most where it matters least visibly, at window
//! boundaries and after idle periods. A replay makes the difference a number (the reference
//! boundary scenario: `fixed_window` admits 200 where the limit is 100) without a server or a
//! real clock.

mod chart;
mod scenario;

use clap::{Args, ValueEnum};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use tollgate_core::Algorithm;

pub use scenario::{explain, replay, Outcome, Scenario, ScenarioName};

/// Arguments of `tollgate simulate`.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// The scenario to replay.
    #[arg(long, value_enum, default_value_t = ScenarioName::Boundary)]
    pub scenario: ScenarioName,
    /// How to print the results.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also draw admitted and rejected requests over time, one panel per algorithm.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A table with a one-line explanation per algorithm.
    Table,
    /// One JSON object per line, one line per algorithm.
    Json,
}

/// One line of `--format json`. The first five fields are the documented contract.
#[derive(Debug, Serialize)]
struct JsonLine<'a> {
    scenario: &'a str,
    algorithm: &'a str,
    sent: u64,
    allowed: u64,
    denied: u64,
    limit: u64,
    period_s: f64,
    burst: u64,
}

/// Runs the simulation and prints (and draws) the results.
pub fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    let scenario = Scenario::new(args.scenario)?;
    let outcomes = Algorithm::ALL
        .into_iter()
        .map(|a| replay(&scenario, a))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Table => print_table(&mut out, &scenario, &outcomes)?,
        Format::Json => print_json(&mut out, &scenario, &outcomes)?,
    }
    if let Some(path) = &args.svg {
        chart::draw(path, &scenario, &outcomes)?;
        if args.format == Format::Table {
            writeln!(out, "\nchart written to {}", path.display())?;
        }
    }
    Ok(())
}

fn print_table(out: &mut impl Write, s: &Scenario, outcomes: &[Outcome]) -> anyhow::Result<()> {
    writeln!(out, "scenario {}: {}", s.name.name(), s.summary)?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<24} {:>6} {:>8} {:>7}  why",
        "algorithm", "sent", "allowed", "denied"
    )?;
    for o in outcomes {
        writeln!(
            out,
            "{:<24} {:>6} {:>8} {:>7}  {}",
            o.algorithm.name(),
            o.sent,
            o.allowed,
            o.denied,
            explain(s.name, o.algorithm)
        )?;
    }
    Ok(())
}

fn print_json(out: &mut impl Write, s: &Scenario, outcomes: &[Outcome]) -> anyhow::Result<()> {
    for o in outcomes {
        let line = JsonLine {
            scenario: s.name.name(),
            algorithm: o.algorithm.name(),
            sent: o.sent,
            allowed: o.allowed,
            denied: o.denied,
            limit: s.quota.limit(),
            period_s: s.quota.period().as_secs_f64(),
            burst: s.quota.burst(),
        };
        serde_json::to_writer(&mut *out, &line)?;
        writeln!(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(name: ScenarioName) -> Vec<(Algorithm, u64)> {
        let s = Scenario::new(name).expect("scenario");
        Algorithm::ALL
            .into_iter()
            .map(|a| (a, replay(&s, a).expect("replay").allowed))
            .collect()
    }

    #[test]
    fn boundary_lets_fixed_window_through_twice_and_nobody_else() {
        for (a, n) in allowed(ScenarioName::Boundary) {
            let want = if a == Algorithm::FixedWindow {
                200
            } else {
                100
            };
            assert_eq!(n, want, "{a}");
        }
    }

    #[test]
    fn every_request_is_either_allowed_or_denied() {
        for name in ScenarioName::value_variants() {
            let s = Scenario::new(*name).expect("scenario");
            for a in Algorithm::ALL {
                let o = replay(&s, a).expect("replay");
                assert_eq!(o.sent, o.allowed + o.denied);
                assert_eq!(o.sent, s.arrivals.len() as u64);
            }
        }
    }
}
