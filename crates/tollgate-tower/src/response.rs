//! What a client sees: `RateLimit-Policy` and `RateLimit` (IETF httpapi draft syntax) on
//! every response to a request that policies matched, and the 429 / 503 answers with
//! `Retry-After` and an `application/problem+json` body.
//!
//! Shadow policies are invisible to clients: they are counted in metrics, never advertised.
//! When a request's cost exceeds what a policy can ever admit there is no honest retry time:
//! the 429 then has no `Retry-After`, and its body says `"retry_after":null` and why. The
//! bodies are [`crate::problem`]'s, like every other error answer.

use crate::problem::{Problem, ProblemKind};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response};
use http_body_util::Full;
use std::time::Duration;
use tollgate::headers::retry_after_secs;
use tollgate::LimitResult;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

pub use tollgate::headers::MAX_ADVERTISED_POLICIES;

/// Adds `RateLimit-Policy` and `RateLimit` for `result` to `headers`. Nothing is added when
/// every matched policy is a shadow one. At most [`MAX_ADVERTISED_POLICIES`] are listed.
pub fn add_headers(headers: &mut HeaderMap, result: &LimitResult) {
    // The values come as `Bytes`: a policy's item shared as it was written when the policy
    // was built, `RateLimit` in one exact allocation (`HeaderValue::from_maybe_shared`
    // validates them as `from_str` would, without a copy).
    let Some(policy) = tollgate::headers::ratelimit_policy_value(result) else {
        return;
    };
    if let Ok(v) = HeaderValue::from_maybe_shared(policy) {
        headers.insert(RATELIMIT_POLICY.clone(), v);
    }
    if let Some(value) = tollgate::headers::ratelimit_value(result) {
        if let Ok(v) = HeaderValue::from_maybe_shared(value) {
            headers.insert(RATELIMIT.clone(), v);
        }
    }
}

/// The 429 for `result`; `retry_after` is `None` when some policy can never admit the cost.
pub fn too_many_requests(
    result: &LimitResult,
    retry_after: Option<Duration>,
) -> Response<Full<Bytes>> {
    let violated: Vec<String> = result.violated().map(str::to_owned).collect();
    let (retry_secs, detail) = match retry_after {
        Some(wait) => (
            Some(retry_after_secs(wait)),
            "Rate limit exceeded; retry after the number of seconds in Retry-After.",
        ),
        None => (
            None,
            "This request costs more than the policy can ever admit; retrying will not help.",
        ),
    };
    let mut resp = Problem::new(ProblemKind::QuotaExceeded)
        .detail(detail)
        .member("violated-policies", violated)
        .member("retry_after", retry_secs)
        .into_response();
    if let Some(wait) = retry_after {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(wait)));
    }
    add_headers(resp.headers_mut(), result);
    resp
}

/// The 503 when the store fails and a policy fails closed.
pub fn unavailable(result: &LimitResult, retry_after: Duration) -> Response<Full<Bytes>> {
    let secs = retry_after_secs(retry_after);
    let mut resp = Problem::new(ProblemKind::StoreUnavailable)
        .detail("The rate-limit store is unavailable and this policy fails closed.")
        .member("retry_after", secs)
        .into_response();
    resp.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    add_headers(resp.headers_mut(), result);
    resp
}

/// The 400 for a request that could be read two ways (see [`crate::BadRequest`]).
pub fn bad_request(why: &crate::BadRequest) -> Response<Full<Bytes>> {
    Problem::new(ProblemKind::BadRequest)
        .detail(why.0.clone())
        .into_response()
}

/// The 401 for a present bearer token that does not verify (charged only to the policies
/// that do not count clients by a claim). The body says no more than that: why it failed (a
/// `kid` the client chose, the parser's view of its bytes) is for the debug log, not for
/// whoever sent it.
pub fn unauthorized(why: &crate::InvalidToken) -> Response<Full<Bytes>> {
    tracing::debug!(reason = %why, "bearer token refused");
    let mut resp = Problem::new(ProblemKind::InvalidToken)
        .detail("the bearer token does not verify (expired, not yet valid, not signed by a configured key, or not a JWT)")
        .into_response();
    resp.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer error=\"invalid_token\""),
    );
    resp
}
