//! What a client sees: `RateLimit-Policy` and `RateLimit` (IETF httpapi draft syntax) on
//! every response to a request that policies matched, and the 429 / 503 answers with
//! `Retry-After` and an `application/problem+json` body.
//!
//! Shadow policies are invisible to clients: they are counted in metrics, never advertised.
//! When a request's cost exceeds what a policy can ever admit there is no honest retry time:
//! the 429 then has no `Retry-After`, and its body says `"retry_after":null` and why.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;
use std::fmt::Write;
use std::time::Duration;
use tollgate::headers::retry_after_secs;
use tollgate::LimitResult;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The problem type of a 429.
pub const QUOTA_EXCEEDED: &str = "https://tollgate.dev/problems#quota-exceeded";
/// The problem type of a 400 for a request the layer refuses to read.
pub const BAD_REQUEST: &str = "https://tollgate.dev/problems#bad-request";
/// The problem type of a 401 for a bearer token that does not verify.
pub const INVALID_TOKEN: &str = "https://tollgate.dev/problems#invalid-token";
/// The problem type of a 503 from a store failing closed.
pub const STORE_UNAVAILABLE: &str = "https://tollgate.dev/problems#store-unavailable";

pub use tollgate::headers::MAX_ADVERTISED_POLICIES;

/// Adds `RateLimit-Policy` and `RateLimit` for `result` to `headers`. Nothing is added when
/// every matched policy is a shadow one. At most [`MAX_ADVERTISED_POLICIES`] are listed.
pub fn add_headers(headers: &mut HeaderMap, result: &LimitResult) {
    let Some(policy) = tollgate::headers::ratelimit_policy(result) else {
        return;
    };
    if let Ok(v) = header_value(policy) {
        headers.insert(RATELIMIT_POLICY.clone(), v);
    }
    if let Some(value) = tollgate::headers::ratelimit(result) {
        if let Ok(v) = header_value(value) {
            headers.insert(RATELIMIT.clone(), v);
        }
    }
}

/// A header value that takes the string's buffer instead of copying it (the same validation
/// as `HeaderValue::from_str`).
fn header_value(s: String) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::from(s))
}

/// The 429 for `result`; `retry_after` is `None` when some policy can never admit the cost.
pub fn too_many_requests(
    result: &LimitResult,
    retry_after: Option<Duration>,
) -> Response<Full<Bytes>> {
    let violated: Vec<String> = result.violated().map(json_string).collect();
    let (retry_json, detail) = match retry_after {
        Some(wait) => (
            retry_after_secs(wait).to_string(),
            "Rate limit exceeded; retry after the number of seconds in Retry-After.".to_string(),
        ),
        None => (
            "null".to_string(),
            "This request costs more than the policy can ever admit; retrying will not help."
                .to_string(),
        ),
    };
    let body = format!(
        "{{\"type\":\"{QUOTA_EXCEEDED}\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":{},\"violated-policies\":[{}],\"retry_after\":{}}}",
        json_string(&detail),
        violated.join(","),
        retry_json
    );
    let mut resp = problem(StatusCode::TOO_MANY_REQUESTS, body);
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
    let body = format!(
        "{{\"type\":\"{STORE_UNAVAILABLE}\",\"title\":\"Service Unavailable\",\"status\":503,\"detail\":\"The rate-limit store is unavailable and this policy fails closed.\",\"retry_after\":{secs}}}"
    );
    let mut resp = problem(StatusCode::SERVICE_UNAVAILABLE, body);
    resp.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    add_headers(resp.headers_mut(), result);
    resp
}

/// The 400 for a request that could be read two ways (see [`crate::BadRequest`]).
pub fn bad_request(why: &crate::BadRequest) -> Response<Full<Bytes>> {
    let body = format!(
        "{{\"type\":\"{BAD_REQUEST}\",\"title\":\"Bad Request\",\"status\":400,\"detail\":{}}}",
        json_string(&why.0)
    );
    problem(StatusCode::BAD_REQUEST, body)
}

/// The 401 for a present bearer token that does not verify (nothing was charged).
pub fn unauthorized(why: &crate::InvalidToken) -> Response<Full<Bytes>> {
    let body = format!(
        "{{\"type\":\"{INVALID_TOKEN}\",\"title\":\"Unauthorized\",\"status\":401,\"detail\":{}}}",
        json_string(&why.to_string())
    );
    let mut resp = problem(StatusCode::UNAUTHORIZED, body);
    resp.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer error=\"invalid_token\""),
    );
    resp
}

fn problem(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    resp
}

/// A JSON string literal (policy names are restricted by config, but the layer takes any).
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
