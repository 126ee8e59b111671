//! A horizontal bar chart: one bar per name, its value printed at its end, the value axis
//! with round ticks and its unit. `cargo xtask bench` draws docs/bench/gateway.svg with it.

use anyhow::anyhow;
use plotters::prelude::*;

use super::{Axis, TickedCoord, Unit};

const BAR: RGBColor = RGBColor(0x3d, 0x6f, 0xa8);
/// Pixels per bar (the bar and the gap below it).
const ROW: u32 = 52;

/// One bar.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// What the bar measures, written left of it.
    pub name: String,
    /// Its length, in the chart's unit.
    pub value: f64,
}

/// Draws `bars` (top to bottom) as an SVG document `width` pixels wide.
pub fn render(
    title: &str,
    quantity: &str,
    unit: Unit,
    bars: &[Bar],
    width: u32,
) -> anyhow::Result<String> {
    if bars.is_empty() {
        return Err(anyhow!("a bar chart needs at least one bar"));
    }
    if let Some(bad) = bars.iter().find(|b| !b.value.is_finite() || b.value < 0.0) {
        return Err(anyhow!(
            "bar {:?}: {} is not a value to draw",
            bad.name,
            bad.value
        ));
    }
    let height = 110 + ROW * bars.len() as u32;
    let peak = bars.iter().map(|b| b.value).fold(0.0, f64::max);
    // Room right of the longest bar for its value.
    let x = Axis::new(0.0, (peak * 1.2).max(1.0), 6, unit);
    let names_width = bars.iter().map(|b| b.name.len()).max().unwrap_or(0) as u32 * 9 + 20;
    let names = bars.iter().map(|b| b.name.clone()).collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        let fail = |e: DrawingAreaErrorKind<_>| anyhow!("chart: {e}");
        root.fill(&WHITE).map_err(fail)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, super::caption_font())
            .margin(12)
            .margin_right(28)
            .x_label_area_size(super::X_LABEL_AREA)
            .y_label_area_size(names_width)
            .build_cartesian_2d(x.coord(), TickedCoord::categories(names))
            .map_err(|e| anyhow!("chart: {e}"))?;
        chart
            .configure_mesh()
            .x_desc(x.title(quantity))
            .label_style(super::label_font())
            .axis_desc_style(super::label_font())
            .bold_line_style(BLACK.mix(0.12))
            .disable_y_mesh()
            .draw()
            .map_err(|e| anyhow!("chart: {e}"))?;
        let rows = bars.len() as f64;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, bar)| {
                let top = rows - i as f64 - 0.2;
                Rectangle::new([(0.0, top), (bar.value, top - 0.6)], BAR.filled())
            }))
            .map_err(|e| anyhow!("chart: {e}"))?;
        let value_style = super::label_font().color(&BLACK);
        chart
            .draw_series(bars.iter().enumerate().map(|(i, bar)| {
                let middle = rows - i as f64 - 0.5;
                EmptyElement::at((bar.value, middle))
                    + Text::new(
                        format!("{} {}", super::ticks::whole(bar.value), unit.symbol()),
                        (6, -8),
                        value_style.clone(),
                    )
            }))
            .map_err(|e| anyhow!("chart: {e}"))?;
        root.present().map_err(fail)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar(name: &str, value: f64) -> Bar {
        Bar {
            name: name.to_owned(),
            value,
        }
    }

    /// The text of every `<text>` element, in document order.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = &t[t.find('>')? + 1..];
                Some(body[..body.find("</text>")?].trim().to_owned())
            })
            .collect()
    }

    #[test]
    fn bars_are_named_valued_and_on_a_round_axis_with_its_unit() {
        let bars = [
            bar("direct", 89_922.4),
            bar("tollgate-memory", 26_664.0),
            bar("nginx-limit_req", 39_378.0),
        ];
        let svg = render(
            "requests/s through each path",
            "throughput",
            Unit::RequestsPerSecond,
            &bars,
            720,
        )
        .expect("rendered");
        let texts = texts(&svg);
        for expected in [
            "requests/s through each path",
            "throughput (req/s)",
            "direct",
            "tollgate-memory",
            "nginx-limit_req",
            "89,922 req/s",
            "26,664 req/s",
            "39,378 req/s",
            "0",
            "20,000",
            "100,000",
        ] {
            assert!(
                texts.iter().any(|t| t == expected),
                "{expected:?} not in {texts:?}"
            );
        }
        assert!(
            texts.iter().all(|t| !t.contains(".0000")),
            "float noise: {texts:?}"
        );
    }

    #[test]
    fn bars_that_cannot_be_drawn_are_refused() {
        let unit = Unit::RequestsPerSecond;
        assert!(render("t", "q", unit, &[], 600).is_err());
        assert!(render("t", "q", unit, &[bar("a", f64::NAN)], 600).is_err());
        assert!(render("t", "q", unit, &[bar("a", -1.0)], 600).is_err());
    }
}
