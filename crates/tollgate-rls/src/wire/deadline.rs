//! How long a call may take: the server's bound ([`crate::CALL_TIMEOUT`]), or the client's
//! `grpc-timeout` when it is shorter. Past it the call is answered `CANCELLED` with
//! "Timeout expired", which is what tonic's server answered (gRPC's spec would say
//! `DEADLINE_EXCEEDED`; a client with a deadline ends the call on its own side anyway).
//!
//! The deadline covers what a client can make a call wait for: its request's body (and, for
//! the health service, the whole call). It counts from the first time the call waits
//! ([`Deadline::within`]), and a call that never waits arms no timer at all: a request whose
//! body has arrived with its headers, as Envoy's do, costs no timer (registering it and taking
//! it out of tokio's timer wheel cost an answer of one descriptor on Redis 542 instructions
//! under callgrind, 43,778 to 43,236; docs/benchmarks.md, twenty-eighth session). A call
//! stopped by it frees its place in the budget at once. The decision after the body is not
//! under it: the limiter bounds it by the store's own timeout (`store.timeout`), which is far
//! shorter than [`crate::CALL_TIMEOUT`], and a client whose own deadline passes first resets
//! the stream, which drops the call at once ([`crate::server`]). An answer already on its
//! way is not cut (HTTP/2 flow control and the connection's keep-alive bound that).
//!
//! `grpc-timeout` is an integer of at most 8 digits and a unit (`H`, `M`, `S`, `m`, `u`,
//! `n`); any other value is ignored, as tonic ignored it.

use http::{HeaderMap, HeaderName};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;
use tonic::Status;

/// The client's timeout (a constant: no name parsed per call).
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// How long the call with `headers` may take, at most `bound`.
pub(crate) fn of(headers: &HeaderMap, bound: Duration) -> Duration {
    client_timeout(headers).map_or(bound, |t| t.min(bound))
}

/// A call's deadline: its length, and its timer once the call has waited.
pub(crate) struct Deadline {
    length: Duration,
    /// Armed at the first wait, and kept for every later one: one deadline for the call.
    /// Boxed: only a call that waits has one, and the call's future stays small.
    timer: Option<Pin<Box<Sleep>>>,
}

/// A call's deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expired;

impl Deadline {
    /// A deadline of `length` from the call's first wait.
    pub(crate) fn new(length: Duration) -> Self {
        Self {
            length,
            timer: None,
        }
    }

    /// `work`, unless the deadline passes first. `work` is polled first, so a call whose work
    /// is ready is never refused, even with a deadline of zero.
    pub(crate) fn within<F: Future>(&mut self, work: F) -> Within<'_, F> {
        Within {
            work,
            deadline: self,
        }
    }

    /// Whether the call has waited (its timer is armed).
    #[cfg(test)]
    pub(crate) fn armed(&self) -> bool {
        self.timer.is_some()
    }
}

pin_project_lite::pin_project! {
    /// [`Deadline::within`]'s future: the work inline (an async fn would keep it twice, as its
    /// argument and pinned), the deadline borrowed.
    pub(crate) struct Within<'d, F> {
        #[pin]
        work: F,
        deadline: &'d mut Deadline,
    }
}

impl<F: Future> Future for Within<'_, F> {
    type Output = Result<F::Output, Expired>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(done) = this.work.poll(cx) {
            return Poll::Ready(Ok(done));
        }
        let length = this.deadline.length;
        let timer = this
            .deadline
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(length)));
        timer.as_mut().poll(cx).map(|()| Err(Expired))
    }
}

/// The answer to a call past its deadline.
pub(crate) fn expired() -> Status {
    Status::cancelled("Timeout expired")
}

fn client_timeout(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(GRPC_TIMEOUT)?.to_str().ok()?;
    let (&unit, value) = text.as_bytes().split_last()?;
    if value.len() > 8 {
        return None;
    }
    // At most 99,999,999: no unit below overflows.
    let value: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(value * 3600),
        b'M' => Duration::from_secs(value * 60),
        b'S' => Duration::from_secs(value),
        b'm' => Duration::from_millis(value),
        b'u' => Duration::from_micros(value),
        b'n' => Duration::from_nanos(value),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(5);

    fn with(timeout: &str) -> Duration {
        let mut headers = HeaderMap::new();
        headers.insert(
            "grpc-timeout",
            http::HeaderValue::from_str(timeout).expect("a header value"),
        );
        of(&headers, BOUND)
    }

    #[test]
    fn the_bound_applies_without_a_client_timeout() {
        assert_eq!(of(&HeaderMap::new(), BOUND), BOUND);
    }

    #[test]
    fn a_shorter_client_timeout_wins_in_every_unit() {
        assert_eq!(with("1S"), Duration::from_secs(1));
        assert_eq!(with("250m"), Duration::from_millis(250));
        assert_eq!(with("250000u"), Duration::from_millis(250));
        assert_eq!(with("25000000n"), Duration::from_millis(25));
        assert_eq!(with("250000000n"), BOUND, "nine digits: ignored");
        assert_eq!(with("0m"), Duration::ZERO);
        assert_eq!(
            with("+3S"),
            Duration::from_secs(3),
            "as Rust parses integers"
        );
    }

    #[test]
    fn a_longer_client_timeout_is_cut_to_the_bound() {
        assert_eq!(with("1H"), BOUND);
        assert_eq!(with("2M"), BOUND);
        assert_eq!(with("99999999H"), BOUND, "the largest value, no overflow");
    }

    #[test]
    fn a_malformed_client_timeout_is_ignored() {
        for bad in [
            "",
            "S",
            "1",
            "1s",
            "1x",
            "-1S",
            "123456789S",
            "1.5S",
            " 1S",
            "１S",
        ] {
            let mut headers = HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_str(bad) {
                headers.insert("grpc-timeout", v);
            } else {
                headers.insert(
                    "grpc-timeout",
                    http::HeaderValue::from_bytes(bad.as_bytes()).expect("opaque bytes"),
                );
            }
            assert_eq!(of(&headers, BOUND), BOUND, "{bad:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_is_armed_at_the_first_wait_and_counts_from_it() {
        let mut d = Deadline::new(Duration::from_millis(100));
        // Ready work: no timer, even with no time left.
        assert_eq!(d.within(async { 7 }).await, Ok(7));
        assert!(!d.armed());
        let mut zero = Deadline::new(Duration::ZERO);
        assert_eq!(zero.within(async { 1 }).await, Ok(1));
        // Work that waits 60 ms arms it; the next 60 ms wait ends at the deadline, 100 ms
        // after the first wait began (one deadline for the call, not one a wait).
        let start = tokio::time::Instant::now();
        let waited = d
            .within(tokio::time::sleep(Duration::from_millis(60)))
            .await;
        assert_eq!(waited, Ok(()));
        assert!(d.armed());
        let waited = d
            .within(tokio::time::sleep(Duration::from_millis(60)))
            .await;
        assert_eq!(waited, Err(Expired));
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        // Past it, ready work still passes; work that waits does not.
        assert_eq!(d.within(async { 2 }).await, Ok(2));
        assert_eq!(d.within(std::future::pending::<()>()).await, Err(Expired));
    }

    #[test]
    fn an_expired_call_is_cancelled_as_tonic_answered_it() {
        let s = expired();
        assert_eq!(s.code(), tonic::Code::Cancelled);
        assert_eq!(s.message(), "Timeout expired");
    }
}
