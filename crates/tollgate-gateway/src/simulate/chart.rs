//! The `--svg` chart: one panel per algorithm, cumulative admitted and rejected requests over
//! time, with the quota's window boundaries marked, all panels on the same scale.

use super::{Outcome, Scenario};
use anyhow::Context;
use plotters::prelude::*;
use std::path::Path;
use tollgate_bench::chart::{self, Axis, Unit};

const ADMITTED: RGBColor = RGBColor(0x1b, 0x9e, 0x4b);
const REJECTED: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const BOUNDARY: RGBColor = RGBColor(0x3b, 0x6e, 0xc4);

/// Draws the chart to `path`.
pub fn draw(path: &Path, scenario: &Scenario, outcomes: &[Outcome]) -> anyhow::Result<()> {
    draw_inner(path, scenario, outcomes)
        .with_context(|| format!("cannot draw the chart to {}", path.display()))
}

fn draw_inner(path: &Path, s: &Scenario, outcomes: &[Outcome]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1200, 1020)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "tollgate simulate --scenario {}: {}",
        s.name.name(),
        s.summary
    );
    let root = root.titled(&title, chart::title_font())?;
    let (x0, x1) = time_range(s);
    let x = Axis::new(x0, x1, 8, Unit::Seconds);
    let y_max = outcomes.iter().map(|o| o.sent).max().unwrap_or(1).max(1) as f64 * 1.05;
    let y = Axis::new(0.0, y_max, 6, Unit::Count);
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
            .caption(caption, chart::caption_font())
            .margin(12)
            .margin_right(28)
            .x_label_area_size(chart::X_LABEL_AREA)
            .y_label_area_size(chart::Y_LABEL_AREA)
            .build_cartesian_2d(x.coord(), y.coord())?;
        chart
            .configure_mesh()
            .x_desc(x.title("time"))
            .y_desc(y.title("requests (cumulative)"))
            .label_style(chart::label_font())
            .axis_desc_style(chart::label_font())
            .bold_line_style(BLACK.mix(0.12))
            .draw()?;
        let boundary = BOUNDARY.stroke_width(2);
        for (i, b) in window_boundaries(x0, x1, period).into_iter().enumerate() {
            let line = DashedLineSeries::new([(b, 0.0), (b, y_max)], 6, 4, boundary);
            let series = chart.draw_series(line)?;
            if i == 0 {
                series
                    .label("window boundary")
                    .legend(chart::dashed_sample(boundary, 6, 4));
            }
        }
        for (label, color, admitted) in
            [("admitted", ADMITTED, true), ("rejected", REJECTED, false)]
        {
            let style = color.stroke_width(2);
            chart
                .draw_series(LineSeries::new(cumulative(o, admitted, x0, x1), style))?
                .label(label)
                .legend(chart::solid_sample(style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(chart::label_font())
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
