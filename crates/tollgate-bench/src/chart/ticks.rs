//! Round tick values and their labels for a chart axis.
//!
//! Why not format whatever positions the plotting library picks: its positions are floats
//! (`59.849999999999994`) and its labels print them as they are. Here a step is a decimal,
//! `1`, `2` or `5` times a power of ten, held as integers; every tick is an integer multiple of
//! it, and a label is printed from those integers with exactly the decimals the step needs, so
//! `59.85 .. 60.2 s` reads `59.85, 59.90, ... 60.20` and `0 .. 12,000 req/s` reads `0, 2,000,
//! ... 12,000`.

/// The unit of an axis, named in its title.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Seconds.
    Seconds,
    /// Milliseconds.
    Milliseconds,
    /// Requests per second.
    RequestsPerSecond,
    /// A plain count (requests); the quantity names the unit.
    Count,
}

impl Unit {
    /// The unit as written after a quantity, e.g. `s`, `ms`, `req/s`; empty for a count.
    pub fn symbol(self) -> &'static str {
        match self {
            Unit::Seconds => "s",
            Unit::Milliseconds => "ms",
            Unit::RequestsPerSecond => "req/s",
            Unit::Count => "",
        }
    }

    /// An axis title: `time (s)`, `latency (ms)`; a count's title is the quantity alone.
    pub fn title(self, quantity: &str) -> String {
        match self {
            Unit::Count => quantity.to_owned(),
            unit => format!("{quantity} ({})", unit.symbol()),
        }
    }
}

/// The ticks of one axis: `count` multiples of a round step, from `first * step` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticks {
    /// The step is `mantissa * 10^exponent`, the mantissa 1, 2 or 5.
    mantissa: i64,
    exponent: i32,
    /// The first tick is `first` steps from zero.
    first: i64,
    count: usize,
}

/// The largest and smallest powers of ten a step may have; beyond them f64 cannot hold the
/// tick values exactly enough to matter on a chart.
const EXPONENTS: std::ops::RangeInclusive<i32> = -12..=15;

impl Ticks {
    /// The ticks inside `lo..=hi`: the smallest round step that gives at most `max_count`
    /// of them (at least 2 are asked for; an empty or non-finite range becomes `lo..=lo + 1`).
    pub fn new(lo: f64, hi: f64, max_count: usize) -> Ticks {
        let max_count = max_count.clamp(2, 50);
        let (lo, hi) = sane_range(lo, hi);
        let raw = (hi - lo) / (max_count - 1) as f64;
        let start = (raw.log10().floor() as i32).clamp(*EXPONENTS.start(), *EXPONENTS.end());
        let mut widest = None;
        for exponent in start..=*EXPONENTS.end() {
            for mantissa in [1, 2, 5] {
                let ticks = Ticks::with_step(lo, hi, mantissa, exponent);
                if ticks.count <= max_count {
                    return ticks;
                }
                widest = Some(ticks);
            }
        }
        widest.unwrap_or_else(|| Ticks::with_step(lo, hi, 5, *EXPONENTS.end()))
    }

    fn with_step(lo: f64, hi: f64, mantissa: i64, exponent: i32) -> Ticks {
        let step = mantissa as f64 * 10f64.powi(exponent);
        // A tick a hair outside the range (float error) still counts as inside.
        let slack = 1e-9;
        let first = (lo / step - slack).ceil();
        let last = (hi / step + slack).floor();
        let count = if last >= first {
            (last - first) as usize + 1
        } else {
            0
        };
        Ticks {
            mantissa,
            exponent,
            first: first as i64,
            count,
        }
    }

    /// The step between two ticks.
    pub fn step(&self) -> f64 {
        self.mantissa as f64 * 10f64.powi(self.exponent)
    }

    /// The tick positions, nearest f64 to each decimal.
    pub fn values(&self) -> Vec<f64> {
        (0..self.count as i64)
            .map(|i| decimal_value((self.first + i) * self.mantissa, self.exponent))
            .collect()
    }

    /// The tick labels, one per value, with the decimals the step needs and thousands
    /// separators.
    pub fn labels(&self) -> Vec<String> {
        (0..self.count as i64)
            .map(|i| format_decimal((self.first + i) * self.mantissa, self.exponent))
            .collect()
    }

    /// The label of any value on this axis, printed with the step's decimals (for a plotting
    /// library that hands back the tick positions as floats).
    pub fn label(&self, value: f64) -> String {
        let units = (value / 10f64.powi(self.exponent)).round();
        if !units.is_finite() || units.abs() >= i64::MAX as f64 {
            return format!("{value}");
        }
        format_decimal(units as i64, self.exponent)
    }
}

/// A value rounded to a whole number and written with thousands separators: `89,922`.
pub fn whole(value: f64) -> String {
    let rounded = value.round();
    if !rounded.is_finite() || rounded.abs() >= i64::MAX as f64 {
        return format!("{value}");
    }
    format_decimal(rounded as i64, 0)
}

/// A finite, non-empty range.
fn sane_range(lo: f64, hi: f64) -> (f64, f64) {
    let lo = if lo.is_finite() { lo } else { 0.0 };
    let hi = if hi.is_finite() { hi } else { lo + 1.0 };
    if hi > lo {
        (lo, hi)
    } else {
        (lo, lo + 1.0)
    }
}

/// `units * 10^exponent` as the nearest f64 (divides for negative exponents, which is exact
/// where multiplying by 0.1 is not).
fn decimal_value(units: i64, exponent: i32) -> f64 {
    if exponent >= 0 {
        units as f64 * 10f64.powi(exponent)
    } else {
        units as f64 / 10f64.powi(-exponent)
    }
}

/// `units * 10^exponent` written out: `-1,234.50` style, no float in between.
fn format_decimal(units: i64, exponent: i32) -> String {
    let negative = units < 0;
    let magnitude = units.unsigned_abs();
    let (whole, fraction) = if exponent >= 0 {
        let scale = 10u128.pow(exponent.unsigned_abs());
        ((magnitude as u128 * scale).to_string(), String::new())
    } else {
        let decimals = exponent.unsigned_abs() as usize;
        let scale = 10u64.pow(exponent.unsigned_abs());
        (
            (magnitude / scale).to_string(),
            format!("{:0decimals$}", magnitude % scale),
        )
    };
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    out.push_str(&thousands(&whole));
    if !fraction.is_empty() {
        out.push('.');
        out.push_str(&fraction);
    }
    out
}

/// `12000` -> `12,000`.
fn thousands(digits: &str) -> String {
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(lo: f64, hi: f64, max: usize) -> Vec<String> {
        Ticks::new(lo, hi, max).labels()
    }

    #[test]
    fn a_boundary_range_in_seconds_gets_two_decimals_and_no_float_noise() {
        assert_eq!(
            labels(59.85, 60.2, 8),
            ["59.85", "59.90", "59.95", "60.00", "60.05", "60.10", "60.15", "60.20"]
        );
        assert_eq!(labels(59.85, 60.2, 6), ["59.9", "60.0", "60.1", "60.2"]);
        // The simulator's padded range, whose ends are not round themselves.
        assert_eq!(
            labels(59.849999999999994, 60.150000000000006, 7),
            ["59.85", "59.90", "59.95", "60.00", "60.05", "60.10", "60.15"]
        );
    }

    #[test]
    fn a_requests_per_second_range_gets_thousands_separators() {
        assert_eq!(
            labels(0.0, 12_000.0, 7),
            ["0", "2,000", "4,000", "6,000", "8,000", "10,000", "12,000"]
        );
        assert_eq!(
            labels(0.0, 12_000.0, 4),
            ["0", "5,000", "10,000"],
            "fewer ticks: a wider round step"
        );
        assert_eq!(labels(0.0, 1_250_000.0, 6), ["0", "500,000", "1,000,000"]);
    }

    #[test]
    fn a_latency_range_in_milliseconds_gets_whole_tens() {
        assert_eq!(labels(0.2, 51.0, 6), ["10", "20", "30", "40", "50"]);
        assert_eq!(labels(0.0, 51.0, 6), ["0", "10", "20", "30", "40", "50"]);
        assert_eq!(
            labels(0.0, 0.9, 5),
            ["0.0", "0.2", "0.4", "0.6", "0.8"],
            "sub-millisecond latencies"
        );
    }

    #[test]
    fn ticks_are_evenly_spaced_and_inside_the_range() {
        for (lo, hi, max) in [
            (59.85, 60.2, 8),
            (0.0, 12_000.0, 7),
            (0.2, 51.0, 6),
            (0.001, 0.0173, 5),
            (-3.5, 7.25, 6),
            (0.0, 3_600.0, 9),
        ] {
            let ticks = Ticks::new(lo, hi, max);
            let values = ticks.values();
            assert!(
                values.len() >= 2 && values.len() <= max,
                "{lo}..{hi}: {values:?}"
            );
            assert!(values.iter().all(|v| *v >= lo - 1e-9 && *v <= hi + 1e-9));
            for pair in values.windows(2) {
                assert!((pair[1] - pair[0] - ticks.step()).abs() < ticks.step() * 1e-9);
            }
            assert_eq!(
                values.iter().map(|v| ticks.label(*v)).collect::<Vec<_>>(),
                ticks.labels(),
                "labelling a position gives the tick's own label"
            );
        }
    }

    #[test]
    fn negative_values_and_degenerate_ranges_are_labelled_plainly() {
        assert_eq!(labels(-3.5, 7.25, 6), ["-2", "0", "2", "4", "6"]);
        assert_eq!(labels(5.0, 5.0, 3), ["5.0", "5.5", "6.0"]);
        assert_eq!(labels(f64::NAN, f64::INFINITY, 3), ["0.0", "0.5", "1.0"]);
        assert_eq!(Ticks::new(0.0, 1.0, 3).label(-0.0001), "0.0");
    }

    #[test]
    fn whole_numbers_get_thousands_separators() {
        assert_eq!(whole(89_922.4), "89,922");
        assert_eq!(whole(999.5), "1,000");
        assert_eq!(whole(-1_234_567.0), "-1,234,567");
        assert_eq!(whole(0.2), "0");
    }

    #[test]
    fn units_are_named_in_the_axis_title() {
        assert_eq!(Unit::Seconds.title("time"), "time (s)");
        assert_eq!(Unit::Milliseconds.title("latency"), "latency (ms)");
        assert_eq!(
            Unit::RequestsPerSecond.title("throughput"),
            "throughput (req/s)"
        );
        assert_eq!(
            Unit::Count.title("requests (cumulative)"),
            "requests (cumulative)"
        );
    }
}
