//! The statistics every table shares: min / median / max over repetitions, and ratios taken
//! within a repetition.
//!
//! Why the median is the lower middle value for an even count: it is then always a figure
//! that was measured, never an average of two runs that never happened.

/// How a figure is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digits {
    /// Three significant digits, whole numbers from 100 up (requests/s, ratios).
    Significant,
    /// A fixed number of decimals (ns per check: 1; ratios of ns: 2).
    Fixed(usize),
}

/// The spread of one figure over the repetitions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// The smallest value.
    pub min: f64,
    /// The lower middle value.
    pub median: f64,
    /// The largest value.
    pub max: f64,
    /// How many values (at least 1).
    pub count: usize,
}

impl Spread {
    /// The spread of `values`, ignoring values that are not finite; `None` when none is.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Spread {
            min: v[0],
            median: v[(v.len() - 1) / 2],
            max: v[v.len() - 1],
            count: v.len(),
        })
    }

    /// `min / median / max`, or the one value when there is one.
    pub fn show(&self, digits: Digits) -> String {
        if self.count == 1 {
            return number(self.median, digits);
        }
        format!(
            "{} / {} / {}",
            number(self.min, digits),
            number(self.median, digits),
            number(self.max, digits)
        )
    }

    /// `median (min-max)`, the form of the Redis tables' ratios.
    pub fn show_median_first(&self, digits: Digits) -> String {
        if self.count == 1 {
            return number(self.median, digits);
        }
        format!(
            "{} ({}-{})",
            number(self.median, digits),
            number(self.min, digits),
            number(self.max, digits)
        )
    }
}

/// `min / median / max` of `values`, or `n/a` when there are none.
pub fn spread(values: &[f64], digits: Digits) -> String {
    Spread::of(values).map_or_else(|| "n/a".to_owned(), |s| s.show(digits))
}

/// The median of `values` written with `digits`, or an empty string when there are none.
pub fn median(values: &[f64], digits: Digits) -> String {
    Spread::of(values).map_or_else(String::new, |s| number(s.median, digits))
}

/// Pairwise `a[i] / b[i]` for the repetitions both have, skipping a zero denominator.
pub fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .filter(|(_, y)| **y != 0.0)
        .map(|(x, y)| x / y)
        .collect()
}

/// One number as the tables write it.
pub fn number(x: f64, digits: Digits) -> String {
    match digits {
        Digits::Fixed(d) => format!("{x:.d$}"),
        Digits::Significant => significant(x),
    }
}

/// Three significant digits (trailing zeros dropped), or a whole number from 100 up.
fn significant(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".to_owned();
    }
    if x.abs() >= 100.0 {
        return format!("{x:.0}");
    }
    if x == 0.0 {
        return "0".to_owned();
    }
    let magnitude = x.abs().log10().floor() as i32;
    let decimals = usize::try_from(2 - magnitude).unwrap_or(0);
    let text = format!("{x:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_a_measured_value() {
        let s = Spread::of(&[4.0, 1.0, 3.0, 2.0]).expect("values");
        assert_eq!((s.min, s.median, s.max, s.count), (1.0, 2.0, 4.0, 4));
        let s = Spread::of(&[5.0, 9.0, 7.0]).expect("values");
        assert_eq!(s.median, 7.0);
    }

    #[test]
    fn values_that_are_not_numbers_are_left_out() {
        let s = Spread::of(&[f64::NAN, 2.0, f64::INFINITY]).expect("one value");
        assert_eq!(s.count, 1);
        assert_eq!(Spread::of(&[f64::NAN]), None);
        assert_eq!(spread(&[], Digits::Significant), "n/a");
        assert_eq!(median(&[], Digits::Significant), "");
    }

    #[test]
    fn one_repetition_shows_one_value() {
        assert_eq!(spread(&[0.8421], Digits::Significant), "0.842");
        assert_eq!(
            spread(&[3.0, 1.0, 2.0], Digits::Fixed(1)),
            "1.0 / 2.0 / 3.0"
        );
        let s = Spread::of(&[1.5, 1.2, 1.9]).expect("values");
        assert_eq!(s.show_median_first(Digits::Fixed(2)), "1.50 (1.20-1.90)");
    }

    #[test]
    fn significant_digits_read_like_the_tables() {
        let cases = [
            (95147.4, "95147"),
            (100.0, "100"),
            (99.94, "99.9"),
            (4.19, "4.19"),
            (1.0, "1"),
            (1.03, "1.03"),
            (0.8420, "0.842"),
            (0.0123456, "0.0123"),
            (9.9996, "10"),
            (0.0, "0"),
            (-2.5, "-2.5"),
        ];
        for (x, want) in cases {
            assert_eq!(number(x, Digits::Significant), want, "{x}");
        }
    }

    #[test]
    fn ratios_pair_repetitions_and_skip_a_zero() {
        assert_eq!(ratios(&[2.0, 3.0, 4.0], &[1.0, 0.0, 8.0]), vec![2.0, 0.5]);
        assert_eq!(ratios(&[1.0, 2.0], &[2.0]), vec![0.5]);
    }
}
