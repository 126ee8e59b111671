//! Tests that count in wall-clock windows start clear of the hour's edge.
//!
//! A fixed window starts at a multiple of its period since the epoch (a sliding counter weighs
//! the window before it), so an hour window, and every shorter one that divides it, turns over
//! at each whole hour. A test that counts "3 pass, the 4th is 429" or "18 refunds of 90" in an
//! hour window fails if the hour turns during it: the new window forgets the count, and a
//! refund for the old one is refused (its window has passed). Such tests run against real
//! processes (a gateway, Redis's own `TIME`), whose clocks a test cannot set.
//!
//! CI runs often cross a whole hour, so [`start_clear_of_the_hour`] waits, once per process
//! (nextest runs each test in its own), until the hour has turned when fewer than
//! [`MARGIN`] are left of it. The testkit calls it where a test starts its real processes
//! (every [`crate::RedisServer`]); a test on a wall clock without them calls it first. The
//! xtask benchmarks start their Redis servers through the testkit too: a bench run started in
//! the last minute of an hour waits likewise, once, saying so.

use std::sync::Once;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long before a whole hour a test waits for it to pass: more than a test that counts in
/// an hour window takes (the one that failed in CI ran 10 s on its 2 cores; most take well
/// under a second).
pub const MARGIN: Duration = Duration::from_secs(60);

const HOUR: Duration = Duration::from_secs(3600);

/// Past the hour, so that the whole test runs in the new one.
const AFTER: Duration = Duration::from_secs(1);

static CHECKED: Once = Once::new();

/// Waits until the hour has turned if fewer than [`MARGIN`] are left of it, the first time
/// it is called in this process; at once otherwise.
pub fn start_clear_of_the_hour() {
    CHECKED.call_once(|| {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        if let Some(wait) = wait_at(since_epoch) {
            eprintln!(
                "testkit: {:.1} s before a whole hour: waiting for it to pass, so that \
                 windows of an hour do not turn over during the test",
                wait.saturating_sub(AFTER).as_secs_f64()
            );
            std::thread::sleep(wait);
        }
    });
}

/// How long a test starting `since_epoch` waits: `None` when at least [`MARGIN`] is left of
/// the hour.
fn wait_at(since_epoch: Duration) -> Option<Duration> {
    let hour = HOUR.as_nanos();
    let into = since_epoch.as_nanos() % hour;
    let left = Duration::from_nanos(u64::try_from(hour - into).unwrap_or(u64::MAX));
    (left < MARGIN).then_some(left + AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_minute_of_an_hour_waits_and_then_past_the_hour() {
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
}
