//! The SVG chart: throughput (admitted vs limited per second) above latency percentiles over
//! time, so a person sees at a glance whether the limiter held and what it cost.

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::chart::{self, Axis, Unit};
use crate::output::Report;
use crate::report::SecondSummary;

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 720;

/// One line: its legend, colour and value in a second.
type Series = (&'static str, RGBColor, fn(&SecondSummary) -> f64);

const THROUGHPUT: [Series; 3] = [
    ("admitted (2xx)", RGBColor(0x2e, 0x7d, 0x32), |s| {
        s.admitted as f64
    }),
    ("limited (429)", RGBColor(0xc6, 0x28, 0x28), |s| {
        s.limited as f64
    }),
    ("other + errors", RGBColor(0x75, 0x75, 0x75), |s| {
        (s.other + s.errors) as f64
    }),
];

const LATENCY_MS: [Series; 3] = [
    ("p50", RGBColor(0x15, 0x65, 0xc0), |s| {
        s.p50_us as f64 / 1000.0
    }),
    ("p90", RGBColor(0xef, 0x6c, 0x00), |s| {
        s.p90_us as f64 / 1000.0
    }),
    ("p99", RGBColor(0x6a, 0x1b, 0x9a), |s| {
        s.p99_us as f64 / 1000.0
    }),
];

/// Renders the report's timeline as an SVG document.
pub fn render(report: &Report) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("chart: {e}"))?;
        let (top, bottom) = root.split_vertically(HEIGHT / 2);
        let seconds = &report.timeline;
        let top_panel = Panel {
            caption: "throughput per second",
            quantity: "throughput",
            unit: Unit::RequestsPerSecond,
            series: &THROUGHPUT,
            reference: allowed_rate(report).map(|rate| ("limit x clients", rate)),
        };
        top_panel.draw(&top, seconds)?;
        // Seconds in which nothing finished have no latency to draw.
        let busy: Vec<SecondSummary> = seconds
            .iter()
            .filter(|s| s.admitted + s.limited + s.other + s.errors > 0)
            .cloned()
            .collect();
        let bottom_panel = Panel {
            caption: "latency percentiles per second",
            quantity: "latency",
            unit: Unit::Milliseconds,
            series: &LATENCY_MS,
            reference: None,
        };
        bottom_panel.draw(&bottom, &busy)?;
        root.present().map_err(|e| anyhow!("chart: {e}"))?;
    }
    Ok(svg)
}

/// What the whole fleet of clients may be admitted per second, in the long run.
fn allowed_rate(report: &Report) -> Option<f64> {
    let accuracy = report.accuracy.as_ref()?;
    let per_client = accuracy
        .limits
        .iter()
        .map(|limit| limit.limit as f64 / limit.period.as_secs_f64().max(1e-9))
        .fold(f64::INFINITY, f64::min);
    per_client
        .is_finite()
        .then_some(per_client * report.settings.clients as f64)
}

/// One chart of lines over the seconds of the run.
struct Panel<'a> {
    caption: &'a str,
    quantity: &'a str,
    unit: Unit,
    series: &'a [Series],
    /// A horizontal line to compare against, with its legend.
    reference: Option<(&'a str, f64)>,
}

impl Panel<'_> {
    fn draw(
        &self,
        area: &DrawingArea<SVGBackend<'_>, Shift>,
        seconds: &[SecondSummary],
    ) -> anyhow::Result<()> {
        let peak = seconds
            .iter()
            .flat_map(|s| self.series.iter().map(move |(_, _, value)| value(s)))
            .chain(self.reference.map(|(_, level)| level))
            .fold(0.0, f64::max);
        let span = seconds.last().map_or(1.0, |s| s.second as f64 + 1.0);
        let x = Axis::new(0.0, span, 11, Unit::Seconds);
        let y = Axis::new(0.0, (peak * 1.1).max(0.1), 7, self.unit);
        let mut chart = ChartBuilder::on(area)
            .caption(self.caption, chart::caption_font())
            .margin(12)
            .margin_right(28)
            .x_label_area_size(chart::X_LABEL_AREA)
            .y_label_area_size(chart::Y_LABEL_AREA)
            .build_cartesian_2d(x.coord(), y.coord())
            .map_err(|e| anyhow!("chart: {e}"))?;
        chart
            .configure_mesh()
            .x_desc(x.title("time since the start"))
            .y_desc(y.title(self.quantity))
            .label_style(chart::label_font())
            .axis_desc_style(chart::label_font())
            .bold_line_style(BLACK.mix(0.12))
            .draw()
            .map_err(|e| anyhow!("chart: {e}"))?;
        if let Some((label, level)) = self.reference {
            let style = BLACK.stroke_width(1);
            let line = DashedLineSeries::new([(0.0, level), (span, level)], 8, 5, style);
            chart
                .draw_series(line)
                .map_err(|e| anyhow!("chart: {e}"))?
                .label(label)
                .legend(chart::dashed_sample(style, 8, 5));
        }
        for &(label, color, value) in self.series {
            let points = seconds.iter().map(|s| (s.second as f64 + 0.5, value(s)));
            let style = color.stroke_width(2);
            chart
                .draw_series(LineSeries::new(points, style))
                .map_err(|e| anyhow!("chart: {e}"))?
                .label(label)
                .legend(chart::solid_sample(style));
        }
        chart
            .configure_series_labels()
            .label_font(chart::label_font())
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow!("chart: {e}"))?;
        Ok(())
    }
}
