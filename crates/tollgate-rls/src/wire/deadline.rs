//! How long a call may take: the server's bound ([`crate::CALL_TIMEOUT`]), or the client's
//! `grpc-timeout` when it is shorter. Past it the call is answered `CANCELLED` with
//! "Timeout expired", which is what tonic's server answered (gRPC's spec would say
//! `DEADLINE_EXCEEDED`; a client with a deadline ends the call on its own side anyway).
//!
//! The deadline covers the whole call up to its answer's headers: waiting for the request's
//! body, decoding it, the decision. A call stopped by it frees its place in the budget at
//! once. An answer already on its way is not cut (HTTP/2 flow control and the connection's
//! keep-alive bound that).
//!
//! `grpc-timeout` is an integer of at most 8 digits and a unit (`H`, `M`, `S`, `m`, `u`,
//! `n`); any other value is ignored, as tonic ignored it.

use http::{HeaderMap, HeaderName};
use std::time::Duration;
use tonic::Status;

/// The client's timeout (a constant: no name parsed per call).
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// How long the call with `headers` may take, at most `bound`.
pub(crate) fn of(headers: &HeaderMap, bound: Duration) -> Duration {
    client_timeout(headers).map_or(bound, |t| t.min(bound))
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

    #[test]
    fn an_expired_call_is_cancelled_as_tonic_answered_it() {
        let s = expired();
        assert_eq!(s.code(), tonic::Code::Cancelled);
        assert_eq!(s.message(), "Timeout expired");
    }
}
