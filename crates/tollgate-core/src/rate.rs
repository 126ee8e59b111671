//! The one constructor of a rule's rate: `limit` per `period`, a `burst`, an algorithm, and the
//! cost each request must be able to pay. Every place that builds a rule from numbers a person
//! wrote (the gateway's policies, tiers and overrides, RLS descriptors and their per-request
//! overrides, the local fallback) goes through [`Limit::checked`], so the rules a rate obeys
//! live here once, and an error says which of the numbers is wrong ([`RateError::field`]) for
//! the caller to point at where it was written.

use crate::algorithms::{Algorithm, Limit, LimitError};
use crate::quota::{Quota, QuotaError};
use std::fmt;
use std::time::Duration;

/// Which number of a rate a [`RateError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RateField {
    /// Units per period.
    Limit,
    /// The period.
    Period,
    /// The bucket capacity.
    Burst,
    /// Units one request costs.
    Cost,
}

impl RateField {
    /// The name the configuration uses for it.
    pub fn as_str(self) -> &'static str {
        match self {
            RateField::Limit => "limit",
            RateField::Period => "period",
            RateField::Burst => "burst",
            RateField::Cost => "cost",
        }
    }
}

/// Why a rate cannot be enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateError {
    /// The quota's own bounds ([`Quota::new`], [`Quota::with_burst`]).
    Quota(QuotaError),
    /// The algorithm's bounds on the quota ([`Limit::new`]).
    Algorithm(LimitError),
    /// A cost of zero would let every request through and count nothing.
    ZeroCost,
    /// A request of this cost could never be admitted.
    CostTooLarge {
        /// The cost asked for.
        cost: u64,
        /// The most the limit can ever admit at once ([`Limit::max_cost`]).
        max: u64,
    },
}

impl RateError {
    /// The number that is wrong.
    pub fn field(&self) -> RateField {
        match self {
            RateError::Quota(
                QuotaError::ZeroLimit | QuotaError::LimitTooLarge | QuotaError::RateTooHigh,
            ) => RateField::Limit,
            RateError::Quota(
                QuotaError::PeriodTooShort
                | QuotaError::PeriodTooLong
                | QuotaError::PeriodNotWholeMicros,
            ) => RateField::Period,
            RateError::Quota(QuotaError::ZeroBurst | QuotaError::BurstTooLarge) => RateField::Burst,
            RateError::Algorithm(_) => RateField::Limit,
            RateError::ZeroCost | RateError::CostTooLarge { .. } => RateField::Cost,
        }
    }
}

impl fmt::Display for RateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RateError::Quota(e) => e.fmt(f),
            RateError::Algorithm(e) => e.fmt(f),
            RateError::ZeroCost => f.write_str(
                "cost must be a positive integer (a cost of 0 would count nothing)",
            ),
            RateError::CostTooLarge { cost, max } => write!(
                f,
                "{cost} can never be admitted; cost must be at most {max} (the burst of bucket algorithms, the limit of window algorithms)"
            ),
        }
    }
}

impl std::error::Error for RateError {}

impl From<QuotaError> for RateError {
    fn from(e: QuotaError) -> Self {
        RateError::Quota(e)
    }
}

impl From<LimitError> for RateError {
    fn from(e: LimitError) -> Self {
        RateError::Algorithm(e)
    }
}

impl Limit {
    /// `limit` units per `period` under `algorithm`, with `burst` (default: the limit), that
    /// admits a request of `cost` units: the quota's bounds, the algorithm's bounds, then the
    /// cost, in that order.
    pub fn checked(
        algorithm: Algorithm,
        limit: u64,
        period: Duration,
        burst: Option<u64>,
        cost: u64,
    ) -> Result<Limit, RateError> {
        let quota = Quota::new(limit, period)?;
        let quota = match burst {
            None => quota,
            Some(b) => quota.with_burst(b)?,
        };
        let built = Limit::new(algorithm, quota)?;
        built.admits(cost)?;
        Ok(built)
    }

    /// Whether a request of `cost` units can ever be admitted by this limit.
    pub fn admits(&self, cost: u64) -> Result<(), RateError> {
        if cost == 0 {
            return Err(RateError::ZeroCost);
        }
        let max = self.max_cost();
        if cost > max {
            return Err(RateError::CostTooLarge { cost, max });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn each_error_names_the_number_that_caused_it() {
        let tb = Algorithm::TokenBucket;
        let field = |r: Result<Limit, RateError>| r.err().map(|e| e.field());
        assert_eq!(
            field(Limit::checked(tb, 0, MIN, None, 1)),
            Some(RateField::Limit)
        );
        assert_eq!(
            field(Limit::checked(tb, 10, Duration::ZERO, None, 1)),
            Some(RateField::Period)
        );
        assert_eq!(
            field(Limit::checked(tb, 10, MIN, Some(0), 1)),
            Some(RateField::Burst)
        );
        assert_eq!(
            field(Limit::checked(tb, 10, MIN, None, 0)),
            Some(RateField::Cost)
        );
        assert_eq!(
            field(Limit::checked(tb, 10, MIN, Some(5), 6)),
            Some(RateField::Cost)
        );
        assert_eq!(
            field(Limit::checked(
                Algorithm::SlidingWindowLog,
                1 << 30,
                Duration::from_secs(3600),
                None,
                1
            )),
            Some(RateField::Limit)
        );
    }

    #[test]
    fn a_valid_rate_is_the_limit_new_would_build() {
        let got = Limit::checked(Algorithm::Gcra, 100, MIN, Some(10), 10).expect("valid");
        let quota = Quota::new(100, MIN)
            .and_then(|q| q.with_burst(10))
            .expect("quota");
        assert_eq!(got, Limit::new(Algorithm::Gcra, quota).expect("limit"));
        assert!(got.admits(11).is_err());
    }
}
