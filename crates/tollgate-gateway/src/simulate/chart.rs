//! The `--svg` chart: one panel per algorithm, cumulative admitted and rejected requests over
//! time, with the quota's window boundaries marked, all panels on the same scale.

use super::{Outcome, Scenario};
use anyhow::Context;
use plotters::prelude::*;
use std::path::Path;

const ADMITTED: RGBColor = RGBColor(0x1b, 0x9e, 0x4b);
const REJECTED: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const BOUNDARY: RGBColor = RGBColor(0x3b, 0x6e, 0xc4);

/// Draws the chart to `path`.
pub fn draw(path: &Path, scenario: &Scenario, outcomes: &[Outcome]) -> anyhow::Result<()> {
    draw_inner(path, scenario, outcomes)
        .with_context(|| format!("cannot draw the chart to {}", path.display()))
}

fn draw_inner(path: &Path, s: &Scenario, outcomes: &[Outcome]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1200, 960)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "tollgate simulate --scenario {}: {}",
        s.name.name(),
        s.summary
    );
    let root = root.titled(&title, ("sans-serif", 20))?;
    let (x0, x1) = time_range(s);
    let y_max = outcomes.iter().map(|o| o.sent).max().unwrap_or(1).max(1) as f64 * 1.05;
    let period = s.quota.period().as_secs_f64();
    for (panel, o) in root.split_evenly((3, 2)).iter().zip(outcomes) {
        let caption = format!(
            "{}: {} admitted, {} rejected of {}",
            o.algorithm.name(),
            o.allowed,
            o.denied,
            o.sent
        );
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(x0..x1, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc("requests (cumulative)")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .x_label_formatter(&|v| format!("{v}"))
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.08))
            .draw()?;
        let boundaries = window_boundaries(x0, x1, period);
        let mut first = true;
        for b in boundaries {
            let series = chart.draw_series(DashedLineSeries::new(
                [(b, 0.0), (b, y_max)],
                6,
                4,
                BOUNDARY.stroke_width(1),
            ))?;
            if first {
                series
                    .label("window boundary")
                    .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BOUNDARY));
                first = false;
            }
        }
        for (label, color, admitted) in
            [("admitted", ADMITTED, true), ("rejected", REJECTED, false)]
        {
            chart
                .draw_series(LineSeries::new(
                    cumulative(o, admitted, x0, x1),
                    color.stroke_width(2),
                ))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Seconds shown on the x axis: the span of the arrivals with a margin on both sides.
fn time_range(s: &Scenario) -> (f64, f64) {
    let secs = |us: u64| us as f64 / 1e6;
    let first = s.arrivals.iter().copied().min().map_or(0.0, secs);
    let last = s.arrivals.iter().copied().max().map_or(1.0, secs);
    let pad = ((last - first) * 0.08).max(0.1);
    ((first - pad).max(0.0), last + pad)
}

/// Multiples of the period inside the x range (the fixed windows' edges).
fn window_boundaries(x0: f64, x1: f64, period: f64) -> Vec<f64> {
    let mut k = (x0 / period).ceil();
    let mut out = Vec::new();
    while k * period <= x1 && out.len() < 1_000 {
        out.push(k * period);
        k += 1.0;
    }
    out
}

/// A step line of the running count of admitted (or rejected) requests.
fn cumulative(o: &Outcome, admitted: bool, x0: f64, x1: f64) -> Vec<(f64, f64)> {
    let mut points = vec![(x0, 0.0)];
    let mut n = 0.0;
    for &(at, ok) in &o.decisions {
        if ok != admitted {
            continue;
        }
        let t = at as f64 / 1e6;
        points.push((t, n));
        n += 1.0;
        points.push((t, n));
    }
    points.push((x1, n));
    points
}
