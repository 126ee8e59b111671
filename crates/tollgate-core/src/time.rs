//! Time is an input. Every algorithm takes `now` as an argument, in whole microseconds since the
//! Unix epoch, so tests drive time with a [`ManualClock`] and never sleep.
//!
//! Why microseconds and not nanoseconds: the same definitions run as Lua inside Redis, where a
//! number is an IEEE double. Microseconds since the epoch (about 1.8e15) stay exact below 2^53;
//! nanoseconds would not. One unit everywhere keeps the Rust and Lua decisions identical.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch (or a duration in microseconds, where documented).
pub type Micros = u64;

/// Converts a duration to whole microseconds, saturating at `u64::MAX`.
pub fn duration_to_micros(d: Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Converts microseconds to a [`Duration`].
pub fn micros_to_duration(us: Micros) -> Duration {
    Duration::from_micros(us)
}

/// Rounds microseconds up to whole seconds (what `Retry-After` needs), never below `min`.
pub fn micros_to_secs_ceil(us: Micros, min: u64) -> u64 {
    us.div_ceil(1_000_000).max(min)
}

/// A source of wall-clock time in microseconds since the Unix epoch.
///
/// Wall time, not a monotonic clock: fixed and sliding windows are aligned to the epoch, and
/// gateways that share a store must agree on what "now" means. Algorithms clamp time that goes
/// backwards, so a clock step never refunds capacity.
pub trait Clock: Send + Sync {
    /// The current time in microseconds since the Unix epoch.
    fn now(&self) -> Micros;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Micros {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => duration_to_micros(d),
            // A clock set before 1970: treat as the epoch; algorithms clamp anyway.
            Err(_) => 0,
        }
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `now` microseconds since the epoch.
    pub fn new(now: Micros) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(now)),
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.now.fetch_add(duration_to_micros(d), Ordering::SeqCst);
    }

    /// Sets the clock to `now` (which may be earlier: tests of clock steps use it).
    pub fn set(&self, now: Micros) {
        self.now.store(now, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.now.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Micros {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time() {
        let a = ManualClock::new(10);
        let b = a.clone();
        a.advance(Duration::from_millis(1));
        assert_eq!(b.now(), 1_010);
        b.set(5);
        assert_eq!(a.now(), 5);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now() > 1_577_836_800_000_000);
    }

    #[test]
    fn retry_after_seconds_round_up_and_have_a_floor() {
        assert_eq!(micros_to_secs_ceil(1, 1), 1);
        assert_eq!(micros_to_secs_ceil(1_000_000, 1), 1);
        assert_eq!(micros_to_secs_ceil(1_000_001, 1), 2);
        assert_eq!(micros_to_secs_ceil(0, 1), 1);
        assert_eq!(micros_to_secs_ceil(0, 0), 0);
    }
}
