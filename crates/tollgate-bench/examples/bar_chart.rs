//! Draws a horizontal bar chart with tollgate's chart helper, for the bench scripts
//! (docs/bench/gateway.svg):
//!
//! ```text
//! bar_chart OUT.svg TITLE QUANTITY UNIT NAME=VALUE...
//! bar_chart docs/bench/gateway.svg "requests/s through each path" throughput req/s direct=89922 ...
//! ```
//! UNIT is one of `s`, `ms`, `req/s` or `count`.

use std::process::ExitCode;

use anyhow::{anyhow, Context};
use tollgate_bench::chart::bars::{self, Bar};
use tollgate_bench::chart::Unit;

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            eprintln!("usage: bar_chart OUT.svg TITLE QUANTITY s|ms|req/s|count NAME=VALUE...");
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> anyhow::Result<()> {
    let [out, title, quantity, unit, pairs @ ..] = args.as_slice() else {
        return Err(anyhow!("expected at least five arguments"));
    };
    let unit = match unit.as_str() {
        "s" => Unit::Seconds,
        "ms" => Unit::Milliseconds,
        "req/s" => Unit::RequestsPerSecond,
        "count" => Unit::Count,
        other => return Err(anyhow!("unknown unit {other:?}")),
    };
    let bars = pairs
        .iter()
        .map(|pair| {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| anyhow!("{pair:?} is not NAME=VALUE"))?;
            let value = value
                .parse()
                .with_context(|| format!("{pair:?}: the value is not a number"))?;
            Ok(Bar {
                name: name.to_owned(),
                value,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let svg = bars::render(title, quantity, unit, &bars, 720)?;
    std::fs::write(out, svg).with_context(|| format!("cannot write {out}"))
}
