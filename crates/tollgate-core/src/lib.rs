//! Pure rate-limiting algorithms for tollgate.
//!
//! Every algorithm is a function of the stored state, `now`, the quota and the cost, returning
//! a [`Decision`] and (when the request is admitted) a new state. Nothing here does I/O or
//! reads a clock: stores own atomicity and time is passed in, so the same definitions can be
//! run by the in-memory store under a compare-and-swap, ported to Lua for Redis, and tested
//! with a [`ManualClock`] that never sleeps.
//!
//! Shared rules, enforced by property tests:
//! - a denied request consumes nothing, and a zero-cost request is a pure query;
//! - `retry_after` is the exact earliest time the same request would pass if nothing else
//!   happened, and a cost larger than the algorithm can ever admit is denied with none;
//! - time is integer microseconds; a clock that goes backwards is clamped, never refunded.
//!
//! ```
//! use tollgate_core::{Algorithm, Limit, Quota};
//!
//! // 100 per minute, at most 10 at once.
//! let quota = Quota::per_minute(100)?.with_burst(10)?;
//! let limit = Limit::new(Algorithm::Gcra, quota)?;
//! let mut state = limit.fresh();
//! let now = 1_700_000_000_000_000; // microseconds since the Unix epoch
//! for _ in 0..10 {
//!     assert!(limit.check(&mut state, now, 1, true).allowed);
//! }
//! let denied = limit.check(&mut state, now, 1, true);
//! assert!(!denied.allowed);
//! // Exactly one emission interval (60 s / 100) until the next unit.
//! assert_eq!(denied.retry_after, Some(600_000));
//! assert!(limit.check(&mut state, now + 600_000, 1, true).allowed);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod algorithms;
mod decision;
pub mod duration;
mod key;
mod quota;
mod rate;
pub mod settle;
mod time;

pub use algorithms::{decide, Algorithm, Limit, LimitError, State, UnknownAlgorithm};
pub use decision::{Decision, Decisions, Verdict};
pub use key::{plan_allows, Check, ClientKey, Mode, Rule};
pub use quota::{Quota, QuotaError, MAX_BURST_SPAN, MAX_LIMIT, MAX_PERIOD};
pub use rate::{RateError, RateField};
pub use settle::{Charge, Settled};
pub use time::{
    duration_to_micros, micros_to_duration, micros_to_secs_ceil, Clock, ManualClock, Micros,
    SystemClock,
};
