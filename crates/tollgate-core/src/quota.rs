//! A quota is "`limit` units per `period`, with bursts up to `burst`". It cannot be built
//! invalid: every constructor checks the bounds below and returns a typed error, so the
//! algorithms never divide by zero or overflow.
//!
//! The bounds keep every intermediate value exact both in Rust (`u64`/`u128`) and in the Lua
//! ports inside Redis (doubles, exact below 2^53).

use crate::time::{duration_to_micros, Micros};
use std::fmt;
use std::time::Duration;

/// The largest `limit` or `burst` a quota accepts (2^40, about 1.1e12).
pub const MAX_LIMIT: u64 = 1 << 40;
/// The longest period a quota accepts: 366 days.
pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);
/// `burst x emission interval` must stay below this many microseconds (2^52, about 142
/// years), so that theoretical arrival times stay exact as doubles.
pub const MAX_BURST_SPAN: Micros = 1 << 52;

/// Why a quota could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaError {
    /// The limit is zero.
    ZeroLimit,
    /// The limit exceeds [`MAX_LIMIT`].
    LimitTooLarge,
    /// The period is shorter than one microsecond.
    PeriodTooShort,
    /// The period exceeds [`MAX_PERIOD`].
    PeriodTooLong,
    /// The period is not a whole number of microseconds.
    PeriodNotWholeMicros,
    /// More than one unit per microsecond (limit > period in microseconds).
    RateTooHigh,
    /// The burst is zero.
    ZeroBurst,
    /// The burst exceeds [`MAX_LIMIT`] or `burst x interval` exceeds [`MAX_BURST_SPAN`].
    BurstTooLarge,
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            QuotaError::ZeroLimit => "limit must be at least 1".to_string(),
            QuotaError::LimitTooLarge => format!("limit must be at most {MAX_LIMIT}"),
            QuotaError::PeriodTooShort => "period must be at least 1us".to_string(),
            QuotaError::PeriodTooLong => "period must be at most 366 days".to_string(),
            QuotaError::PeriodNotWholeMicros => {
                "period must be a whole number of microseconds".to_string()
            }
            QuotaError::RateTooHigh => {
                "rate must be at most one unit per microsecond (limit <= period in us)".to_string()
            }
            QuotaError::ZeroBurst => "burst must be at least 1".to_string(),
            QuotaError::BurstTooLarge => {
                format!("burst must be at most {MAX_LIMIT} and burst x period/limit at most 2^52us")
            }
        };
        f.write_str(&s)
    }
}

impl std::error::Error for QuotaError {}

/// `limit` units per `period`, with a capacity of `burst` units for the bucket algorithms.
///
/// The emission interval (time per unit) is `ceil(period / limit)` microseconds. Rounding up
/// means a quota whose period is not a multiple of its limit admits a hair less than the
/// nominal rate (at most one microsecond per unit), never more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period: Micros,
    burst: u64,
    interval: Micros,
}

impl Quota {
    /// `limit` units per `period`; the burst defaults to the limit.
    pub fn new(limit: u64, period: Duration) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if limit > MAX_LIMIT {
            return Err(QuotaError::LimitTooLarge);
        }
        if period > MAX_PERIOD {
            return Err(QuotaError::PeriodTooLong);
        }
        if period < Duration::from_micros(1) {
            return Err(QuotaError::PeriodTooShort);
        }
        if !period.subsec_nanos().is_multiple_of(1_000) {
            return Err(QuotaError::PeriodNotWholeMicros);
        }
        let period = duration_to_micros(period);
        if limit > period {
            return Err(QuotaError::RateTooHigh);
        }
        let interval = period.div_ceil(limit);
        Self {
            limit,
            period,
            burst: limit,
            interval,
        }
        .with_burst(limit)
    }

    /// `limit` units per second.
    pub fn per_second(limit: u64) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(1))
    }

    /// `limit` units per minute.
    pub fn per_minute(limit: u64) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(60))
    }

    /// `limit` units per hour.
    pub fn per_hour(limit: u64) -> Result<Self, QuotaError> {
        Self::new(limit, Duration::from_secs(3600))
    }

    /// The same rate with a bucket capacity of `burst` units.
    pub fn with_burst(self, burst: u64) -> Result<Self, QuotaError> {
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        if burst > MAX_LIMIT {
            return Err(QuotaError::BurstTooLarge);
        }
        match burst.checked_mul(self.interval) {
            Some(span) if span <= MAX_BURST_SPAN => Ok(Self { burst, ..self }),
            _ => Err(QuotaError::BurstTooLarge),
        }
    }

    /// Units admitted per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period in microseconds.
    pub fn period_micros(&self) -> Micros {
        self.period
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period)
    }

    /// The capacity of the bucket algorithms (token, leaky, GCRA).
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Microseconds per unit: `ceil(period / limit)`.
    pub fn emission_interval_micros(&self) -> Micros {
        self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_quotas_cannot_be_built() {
        assert_eq!(Quota::per_minute(0), Err(QuotaError::ZeroLimit));
        assert_eq!(
            Quota::new(1, Duration::ZERO),
            Err(QuotaError::PeriodTooShort)
        );
        assert_eq!(
            Quota::new(1, Duration::from_nanos(1500)),
            Err(QuotaError::PeriodNotWholeMicros)
        );
        assert_eq!(
            Quota::new(1, MAX_PERIOD + Duration::from_secs(1)),
            Err(QuotaError::PeriodTooLong)
        );
        assert_eq!(
            Quota::new(MAX_LIMIT + 1, MAX_PERIOD),
            Err(QuotaError::LimitTooLarge)
        );
        assert_eq!(
            Quota::new(2_000_000, Duration::from_secs(1)),
            Err(QuotaError::RateTooHigh)
        );
        let q = Quota::per_second(10).unwrap();
        assert_eq!(q.with_burst(0), Err(QuotaError::ZeroBurst));
        assert_eq!(q.with_burst(MAX_LIMIT + 1), Err(QuotaError::BurstTooLarge));
    }

    #[test]
    fn huge_quotas_are_bounded_instead_of_overflowing() {
        let q = Quota::new(1, MAX_PERIOD).unwrap();
        // burst x interval would overflow u64 long before MAX_LIMIT.
        assert_eq!(q.with_burst(MAX_LIMIT), Err(QuotaError::BurstTooLarge));
        let q = Quota::new(MAX_LIMIT, MAX_PERIOD).unwrap();
        assert_eq!(q.emission_interval_micros(), 29);
        assert!(q.with_burst(MAX_LIMIT).is_ok());
    }

    #[test]
    fn emission_interval_rounds_up() {
        let q = Quota::per_second(7).unwrap();
        assert_eq!(q.emission_interval_micros(), 142_858);
        let q = Quota::per_minute(100).unwrap();
        assert_eq!(q.emission_interval_micros(), 600_000);
        assert_eq!(q.burst(), 100);
    }
}
