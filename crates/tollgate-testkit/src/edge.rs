//! Tests that count in wall-clock windows start clear of the window's edge.
//!
//! A fixed window starts at a multiple of its period since the epoch (a sliding counter weighs
//! the window before it), so a window of an hour turns over at each whole hour, a window of a
//! day at each midnight UTC (a whole hour too), and a window of a minute at each whole minute.
//! A test that counts "3 pass, the 4th is 429" or "18 refunds of 90" in such a window fails if
//! the window turns during it: the new window forgets the count, and a refund for the old one
//! is refused (its window has passed). Such tests run against real processes (a gateway,
//! Redis's own `TIME`) or the system clock, which a test cannot set.
//!
//! CI runs often cross a whole hour, so [`start_clear_of_the_hour`] waits, once per process
//! (nextest runs each test in its own), until the hour has turned when fewer than
//! [`MARGIN`] are left of it. The testkit calls it where a test starts its real processes
//! (every [`crate::RedisServer`]); a test on a wall clock without them calls it first. The
//! xtask benchmarks start their Redis servers through the testkit too: a bench run started in
//! the last minute of an hour waits likewise, once, saying so.
//!
//! That guard covers windows of an hour and of whole hours (a day) under nextest. It does not
//! cover shorter windows (a minute turns over sixty times an hour), nor a test whose process
//! ran the check for another test before it (`cargo test` runs a file's tests in one
//! process), nor the part of a test that runs more than [`MARGIN`] after it. For those,
//! [`clear_of_window_end`] checks every time it is called, for any period, where the counting
//! starts. A test whose subject is not the clock does better still on a clock it drives.

use std::sync::Once;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long before a whole hour a test waits for it to pass: more than a test that counts in
/// an hour window takes (the one that failed in CI ran 10 s on its 2 cores; most take well
/// under a second).
pub const MARGIN: Duration = Duration::from_secs(60);

const HOUR: Duration = Duration::from_secs(3600);

/// Past the window's end, so that the whole test runs in the new one.
const AFTER: Duration = Duration::from_secs(1);

static CHECKED: Once = Once::new();

/// Waits until the hour has turned if fewer than [`MARGIN`] are left of it, the first time
/// it is called in this process; at once otherwise.
pub fn start_clear_of_the_hour() {
    CHECKED.call_once(|| clear_of_window_end(HOUR));
}

/// Waits until just past the end of the current window of `period` (windows aligned to
/// multiples of `period` since the Unix epoch, as fixed windows and sliding window counters
/// are) if fewer than [`MARGIN`] are left of it; returns at once otherwise. The wait blocks
/// the calling thread, at most [`MARGIN`] and a second.
///
/// Unlike [`start_clear_of_the_hour`] it checks on every call. Call it where a test starts
/// counting, when the counting lasts less than [`MARGIN`]: a wait after some counting would
/// put the edge inside the test instead of keeping it out. A redis-server started by the test
/// reads the same system clock (`TIME`), and so does a gateway process it starts.
///
/// Panics when [`MARGIN`] and a second are longer than `period` (a minute's window): no start
/// would be clear.
pub fn clear_of_window_end(period: Duration) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    if let Some(wait) = wait_at(since_epoch, period, MARGIN) {
        eprintln!(
            "testkit: {:.1} s before the end of a {:?} window: waiting for it to pass, so \
             that the window does not turn over during the test",
            wait.saturating_sub(AFTER).as_secs_f64(),
            period
        );
        std::thread::sleep(wait);
    }
}

/// How long a test starting `since_epoch` waits to be clear of the end of its window of
/// `period`: `None` when at least `margin` is left of it, else until [`AFTER`] past its end.
fn wait_at(since_epoch: Duration, period: Duration, margin: Duration) -> Option<Duration> {
    assert!(
        margin.saturating_add(AFTER) <= period,
        "a margin of {margin:?} leaves no start clear of the end of a {period:?} window"
    );
    let into = since_epoch.as_nanos() % period.as_nanos();
    let left = Duration::from_nanos(u64::try_from(period.as_nanos() - into).unwrap_or(u64::MAX));
    (left < margin).then_some(left + AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);
    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn only_the_last_minute_of_an_hour_waits_and_then_past_the_hour() {
        let wait_at = |t| wait_at(t, HOUR, MARGIN);
        let hours = Duration::from_secs(490_000 * 3600);
        assert_eq!(wait_at(hours), None, "on the hour: a whole hour ahead");
        assert_eq!(wait_at(hours + Duration::from_secs(3540)), None);
        assert_eq!(
            wait_at(hours + Duration::from_secs(3541)),
            Some(Duration::from_secs(59) + AFTER)
        );
        assert_eq!(
            wait_at(hours + Duration::from_millis(3_599_500)),
            Some(Duration::from_millis(1500))
        );
        // Waiting that long lands past the next hour, clear of its end.
        let start = hours + Duration::from_secs(3580);
        let after = start + wait_at(start).expect("waits");
        assert!(after > hours + HOUR);
        assert_eq!(wait_at(after), None);
    }

    #[test]
    fn a_window_waits_only_when_less_than_the_margin_is_left_of_it() {
        let margin = Duration::from_secs(10);
        // 2026-01-01T00:00:00Z: a whole minute, hour and day.
        let midnight = Duration::from_secs(1_767_225_600);
        for period in [MINUTE, HOUR, DAY] {
            let at = |before_the_end: Duration| midnight + period - before_the_end;
            let wait = |before_the_end| wait_at(at(before_the_end), period, margin);
            assert_eq!(
                wait_at(midnight, period, margin),
                None,
                "{period:?}: on the edge"
            );
            assert_eq!(wait(margin), None, "{period:?}: the margin left exactly");
            let nano = Duration::from_nanos(1);
            assert_eq!(
                wait(margin - nano),
                Some(margin - nano + AFTER),
                "{period:?}"
            );
            assert_eq!(
                wait(nano),
                Some(nano + AFTER),
                "{period:?}: the last nanosecond"
            );
            // Whatever the wait, the test starts in the next window with the margin ahead.
            for before_the_end in [nano, Duration::from_secs(3), margin - nano] {
                let start = at(before_the_end) + wait(before_the_end).expect("waits");
                assert!(start > midnight + period, "{period:?}");
                assert_eq!(wait_at(start, period, margin), None, "{period:?}");
            }
        }
        // A period that divides neither a minute nor an hour: its own edges count.
        let odd = Duration::from_secs(7);
        assert_eq!(
            wait_at(
                Duration::from_secs(7 * 1000 + 5),
                odd,
                Duration::from_secs(3)
            ),
            Some(Duration::from_secs(2) + AFTER)
        );
        assert_eq!(
            wait_at(
                Duration::from_secs(7 * 1000 + 4),
                odd,
                Duration::from_secs(3)
            ),
            None
        );
    }

    #[test]
    #[should_panic(expected = "leaves no start clear")]
    fn a_margin_as_long_as_the_window_is_refused() {
        wait_at(Duration::from_secs(5), MINUTE, MINUTE);
    }

    #[test]
    fn the_longest_margin_a_window_takes_is_a_second_shorter_than_it() {
        let margin = MINUTE - AFTER;
        let end = Duration::from_secs(60 * 1000);
        assert_eq!(wait_at(end, MINUTE, margin), None);
        let start = end - Duration::from_millis(1);
        let wait = wait_at(start, MINUTE, margin).expect("waits");
        assert_eq!(wait_at(start + wait, MINUTE, margin), None);
    }
}
