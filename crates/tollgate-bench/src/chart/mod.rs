//! What every tollgate chart shares (`tollgate simulate --svg`, `tollgate bench --svg`,
//! docs/bench/*.svg): round tick values ([`ticks`]), units in every axis title, fonts large
//! enough to read at 100% zoom, and legend entries drawn with the same stroke as their line.
//!
//! Charts are drawn with plotters; this module only decides where the ticks go and how they
//! read, so that no chart prints a float as plotters found it.

pub mod bars;
pub mod ticks;

use std::ops::Range;

use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::element::{DashedPathElement, PathElement};
use plotters::style::{FontDesc, IntoFont, ShapeStyle};

pub use ticks::{Ticks, Unit};

/// Font size of a chart's title.
pub const TITLE_SIZE: f64 = 20.0;
/// Font size of a panel's caption.
pub const CAPTION_SIZE: f64 = 17.0;
/// Font size of axis titles, tick labels and legends.
pub const LABEL_SIZE: f64 = 15.0;
/// Room for the tick labels under an x axis and its title, in pixels.
pub const X_LABEL_AREA: u32 = 48;
/// Room for the tick labels left of a y axis and its title, in pixels.
pub const Y_LABEL_AREA: u32 = 78;

/// One axis: its range, the round ticks inside it and its unit.
#[derive(Debug, Clone)]
pub struct Axis {
    /// The values the axis spans.
    pub range: Range<f64>,
    /// The ticks drawn on it.
    pub ticks: Ticks,
    /// What its values measure.
    pub unit: Unit,
}

impl Axis {
    /// An axis over `lo..hi` with at most `max_ticks` round ticks.
    pub fn new(lo: f64, hi: f64, max_ticks: usize, unit: Unit) -> Axis {
        let ticks = Ticks::new(lo, hi, max_ticks);
        Axis {
            range: lo..hi,
            ticks,
            unit,
        }
    }

    /// The axis as a plotters coordinate: its key points are exactly the ticks, and its
    /// labels are the ticks' labels.
    pub fn coord(&self) -> TickedCoord {
        TickedCoord {
            inner: self.range.clone().into(),
            points: self.ticks.values(),
            labels: Labels::Ticks(self.ticks),
        }
    }

    /// The axis title with its unit, e.g. `time (s)`.
    pub fn title(&self, quantity: &str) -> String {
        self.unit.title(quantity)
    }
}

/// The font of tick labels, axis titles and legends.
pub fn label_font() -> FontDesc<'static> {
    ("sans-serif", LABEL_SIZE).into_font()
}

/// The font of a panel's caption.
pub fn caption_font() -> FontDesc<'static> {
    ("sans-serif", CAPTION_SIZE).into_font()
}

/// The font of a chart's title.
pub fn title_font() -> FontDesc<'static> {
    ("sans-serif", TITLE_SIZE).into_font()
}

/// The legend sample of a solid line drawn with `style`, centred on `(x, y)`.
pub fn solid_sample(style: ShapeStyle) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new([(x, y), (x + 24, y)], style)
}

/// The legend sample of a dashed line drawn with `style` and the same dash pattern as
/// `DashedLineSeries::new(.., size, spacing, style)`.
pub fn dashed_sample(
    style: ShapeStyle,
    size: u32,
    spacing: u32,
) -> impl Fn((i32, i32)) -> DashedPathElement<std::array::IntoIter<(i32, i32), 2>, u32> {
    move |(x, y)| DashedPathElement::new([(x, y), (x + 24, y)], size, spacing, style)
}

/// A plotters coordinate mapped as a plain `f64` range whose key points and labels are ours:
/// round ticks ([`Axis::coord`]) or one named slot per bar ([`TickedCoord::categories`]).
pub struct TickedCoord {
    inner: RangedCoordf64,
    points: Vec<f64>,
    labels: Labels,
}

/// How a [`TickedCoord`] labels its key points.
enum Labels {
    Ticks(Ticks),
    /// Slot i from the top is centred on `len - i - 0.5`.
    Names(Vec<String>),
}

impl TickedCoord {
    /// `names.len()` slots, the first at the top, each labelled with its name.
    pub fn categories(names: Vec<String>) -> TickedCoord {
        let len = names.len();
        TickedCoord {
            inner: (0.0..len as f64).into(),
            points: (0..len).map(|i| i as f64 + 0.5).collect(),
            labels: Labels::Names(names),
        }
    }
}

impl Ranged for TickedCoord {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Grid lines at the key points only: no lighter lines in between.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.points.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

impl ValueFormatter<f64> for TickedCoord {
    fn format_ext(&self, value: &f64) -> String {
        match &self.labels {
            Labels::Ticks(ticks) => ticks.label(*value),
            Labels::Names(names) => {
                let from_top = (names.len() as f64 - value - 0.5).round();
                if from_top >= 0.0 && (from_top as usize) < names.len() {
                    names[from_top as usize].clone()
                } else {
                    String::new()
                }
            }
        }
    }
}
