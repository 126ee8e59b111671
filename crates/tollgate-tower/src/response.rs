//! What a client sees: `RateLimit-Policy` and `RateLimit` (IETF httpapi draft syntax) on
//! every response to a request that policies matched, and the 429 / 503 answers with
//! `Retry-After` and an `application/problem+json` body.
//!
//! Shadow policies are invisible to clients: they are counted in metrics, never advertised.
//! When a request's cost exceeds what a policy can ever admit there is no honest retry time:
//! the 429 then has no `Retry-After`, and its body says `"retry_after":null` and why. The
//! bodies are [`crate::problem`]'s, like every other error answer.

use crate::problem::{Problem, ProblemKind, CONTENT_TYPE_PROBLEM};
use crate::template::{fill, Templates};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;
use std::cell::RefCell;
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
    if let Some((head, body)) = retry_after.and_then(|wait| templated_429(result, wait)) {
        let mut resp = Response::new(Full::new(body));
        *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        *resp.headers_mut() = head;
        return resp;
    }
    written_429(refusal(result, retry_after), result, retry_after)
}

/// The problem of a 429 for `result`.
fn refusal(result: &LimitResult, retry_after: Option<Duration>) -> Problem {
    let violated: Vec<String> = result.violated().map(str::to_owned).collect();
    quota_exceeded(violated, retry_after.map(retry_after_secs))
}

/// The problem of a 429 that names `violated` and waits `retry_secs` (`None`: never).
fn quota_exceeded(violated: Vec<String>, retry_secs: Option<u64>) -> Problem {
    let detail = match retry_secs {
        Some(_) => "Rate limit exceeded; retry after the number of seconds in Retry-After.",
        None => "This request costs more than the policy can ever admit; retrying will not help.",
    };
    Problem::new(ProblemKind::QuotaExceeded)
        .detail(detail)
        .member("violated-policies", violated)
        .member("retry_after", retry_secs)
}

/// Where the placeholders sit in a 429's template (its entries are in insertion order, the
/// order [`written_429`] inserts them in).
const RETRY_AFTER_AT: usize = 1;
const RATELIMIT_AT_429: usize = 3;

/// A 429's template: its head with placeholders, and its body up to the one number that
/// varies, for the policy it was made for.
struct Template429 {
    head: HeaderMap,
    /// The violated policy its body names.
    policy: Box<str>,
    /// The body [`refusal`] writes for that policy alone, cut before its `retry_after` number
    /// (its last member: only the number and the closing brace follow).
    body: Box<str>,
}

thread_local! {
    static TEMPLATES_429: RefCell<Templates<Template429>> =
        const { RefCell::new(Templates::new()) };
}

/// The head and body of a 429 for `result` that waits `wait`, from its policy's template
/// ([`crate::template`]): `Content-Type`, `Retry-After`, `RateLimit-Policy`, `RateLimit`, as
/// [`written_429`] writes them, and the body [`refusal`] writes; `None` when the answer does
/// not advertise exactly one policy with a decision, or does not name exactly that one as
/// violated. A refused request is what a flood gets (callgrind, decision mode on memory,
/// docs/benchmarks.md): written header by header and member by member it cost 15,177 / 15,236
/// instructions, with the head from the template 14,881 / 14,896, and with the body kept in
/// the template too 13,493 / 13,547 (the policy's name no longer copied into a list of its
/// own, the problem's members no longer built and checked for escapes).
fn templated_429(result: &LimitResult, wait: Duration) -> Option<(HeaderMap, Bytes)> {
    let secs = retry_after_secs(wait);
    let (mut head, body) = with_template_429(result, |t| {
        let mut body = String::with_capacity(t.body.len() + 21);
        body.push_str(&t.body);
        tollgate::headers::push_u64(&mut body, secs);
        body.push('}');
        Some((t.head.clone(), body))
    })?;
    let value = HeaderValue::from_maybe_shared(tollgate::headers::ratelimit_value(result)?).ok()?;
    fill(
        &mut head,
        RETRY_AFTER_AT,
        &RETRY_AFTER,
        HeaderValue::from(secs),
    )?;
    fill(&mut head, RATELIMIT_AT_429, &RATELIMIT, value)?;
    Some((head, Bytes::from(body)))
}

/// What `read` takes from the 429 template of `result`'s one advertised policy, made when
/// this thread keeps none for it; `None` when the answer does not advertise exactly one
/// policy, does not name exactly that one as violated, or this thread's templates are in use
/// or gone (the caller writes the 429 member by member then), or when `read` declines.
fn with_template_429<R>(
    result: &LimitResult,
    read: impl FnOnce(&Template429) -> Option<R>,
) -> Option<R> {
    let mut violated = result.violated();
    let (Some(policy), None) = (violated.next(), violated.next()) else {
        return None;
    };
    let item = tollgate::headers::ratelimit_policy_item(result)?;
    TEMPLATES_429
        .try_with(|templates| {
            let mut templates = templates.try_borrow_mut().ok()?;
            let t = templates.get(item, |item| template_429(item, policy))?;
            if *t.policy != *policy {
                return None;
            }
            read(t)
        })
        .ok()
        .flatten()
}

/// [`too_many_requests`]`(result, Some(wait))` written whole at the end of `out` as an
/// HTTP/1.1 server writes it, with no map and nothing boxed: the status line, the template's
/// headers in their order (`Retry-After` and `RateLimit` filled in), `content-length`, the
/// `date` field that `date` writes (a whole line), the blank line and the body. Only for a
/// 429 that comes from its policy's template (one policy advertised and violated); otherwise
/// false, `out` as it was. A refused request is what a flood gets: this is its cheapest
/// answer (see docs/benchmarks.md, twenty-first session).
pub(crate) fn write_429(
    result: &LimitResult,
    wait: Duration,
    out: &mut Vec<u8>,
    date: impl FnOnce(&mut Vec<u8>),
) -> bool {
    let secs = retry_after_secs(wait);
    let start = out.len();
    let written = with_template_429(result, |t| {
        out.extend_from_slice(b"HTTP/1.1 429 Too Many Requests\r\n");
        for (at, (name, value)) in t.head.iter().enumerate() {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            match at {
                RETRY_AFTER_AT => tollgate::headers::write_u64(out, secs),
                RATELIMIT_AT_429 => tollgate::headers::write_ratelimit(result, out)?,
                _ => out.extend_from_slice(value.as_bytes()),
            }
            out.extend_from_slice(b"\r\n");
        }
        // The body: the template's, the number, the closing brace.
        let digits = secs.checked_ilog10().map_or(1, |l| l as usize + 1);
        out.extend_from_slice(b"content-length: ");
        tollgate::headers::write_u64(out, (t.body.len() + digits + 1) as u64);
        out.extend_from_slice(b"\r\n");
        date(out);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(t.body.as_bytes());
        tollgate::headers::write_u64(out, secs);
        out.push(b'}');
        Some(())
    });
    if written.is_none() {
        out.truncate(start);
        return false;
    }
    true
}

/// A 429's template for the policy of `item`, named `policy`: `Content-Type`, a `Retry-After`
/// placeholder, `RateLimit-Policy: item` and a `RateLimit` placeholder; its body cut before
/// the number.
fn template_429(item: &Bytes, policy: &str) -> Option<Template429> {
    let mut head = HeaderMap::with_capacity(RATELIMIT_AT_429 + 1);
    head.insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_PROBLEM));
    head.insert(RETRY_AFTER, HeaderValue::from_static("-"));
    head.insert(
        RATELIMIT_POLICY.clone(),
        HeaderValue::from_maybe_shared(item.clone()).ok()?,
    );
    head.insert(RATELIMIT.clone(), HeaderValue::from_static("-"));
    let mut body = quota_exceeded(vec![policy.to_owned()], Some(0)).to_json();
    // It ends with `"retry_after":0}`: cut before the number.
    let cut = body.strip_suffix("0}")?.len();
    body.truncate(cut);
    Some(Template429 {
        head,
        policy: policy.into(),
        body: body.into_boxed_str(),
    })
}

/// The 429 of `problem`, written header by header.
fn written_429(
    problem: Problem,
    result: &LimitResult,
    retry_after: Option<Duration>,
) -> Response<Full<Bytes>> {
    let mut resp = problem.into_response();
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tollgate::quota::{Algorithm, Limit, Quota};
    use tollgate::{ClientKey, Limiter, LimiterConfig, Plan, Policy, PolicySpec};

    fn policy(l: &Limiter, name: &str) -> Policy {
        let quota = Quota::per_minute(1).expect("quota");
        l.policy(PolicySpec::new(
            name,
            Limit::new(Algorithm::TokenBucket, quota).expect("limit"),
        ))
        .expect("policy")
    }

    /// A refused result of `policies` for `client` (the first request is allowed, the second
    /// refused: one a minute).
    async fn refused(l: &Limiter, policies: &[&Policy], client: u8) -> LimitResult {
        let plan = Plan::for_client(ClientKey([client; 16]), policies.iter().copied());
        for _ in 0..3 {
            let r = l.check(&plan).await;
            if !r.is_allowed() {
                return r;
            }
        }
        panic!("never refused");
    }

    /// Status, headers in order and body of `a` and `b` are the same.
    async fn same(a: Response<Full<Bytes>>, b: Response<Full<Bytes>>) {
        assert_eq!(a.status(), b.status());
        let head = |r: &Response<Full<Bytes>>| -> Vec<(String, Vec<u8>)> {
            r.headers()
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect()
        };
        assert_eq!(head(&a), head(&b));
        let body = |r: Response<Full<Bytes>>| async move {
            r.into_body().collect().await.expect("body").to_bytes()
        };
        assert_eq!(body(a).await, body(b).await);
    }

    fn written(result: &LimitResult, retry_after: Option<Duration>) -> Response<Full<Bytes>> {
        written_429(refusal(result, retry_after), result, retry_after)
    }

    /// Every 429 of one advertised policy comes from its template (head and body, see
    /// [`Template429`]), and is the 429 written header by header and member by member (names
    /// that need escapes included): across more policies than a thread keeps templates and
    /// bodies for (so slots are taken over and both made again), a policy's cost copy (the
    /// same item), and its `Retry-After` and `RateLimit` of its own.
    #[tokio::test]
    async fn a_templated_429_is_the_429_written_header_by_header() {
        let l = Limiter::new(LimiterConfig::default());
        let many: Vec<Policy> = (0..crate::template::SLOTS * 3)
            .map(|i| policy(&l, &format!("p{i} \"q\"")))
            .collect();
        for round in 0..2u8 {
            for (i, p) in many.iter().enumerate() {
                let dear = p.with_cost(1);
                let p = if round == 1 { &dear } else { p };
                let r = refused(&l, &[p], i as u8 + 64 * round).await;
                let wait = r.retry_after().expect("a wait");
                let (head, _) = templated_429(&r, wait).expect("one policy: templated");
                assert_eq!(head.len(), 4);
                same(too_many_requests(&r, Some(wait)), written(&r, Some(wait))).await;
            }
        }
    }

    /// Several advertised policies, none, or no retry time: written header by header, as
    /// before.
    #[tokio::test]
    async fn other_429s_are_written_header_by_header() {
        let l = Limiter::new(LimiterConfig::default());
        let (a, b) = (policy(&l, "a"), policy(&l, "b"));
        let both = refused(&l, &[&a, &b], 1).await;
        let wait = both.retry_after().expect("a wait");
        assert!(templated_429(&both, wait).is_none());
        same(
            too_many_requests(&both, Some(wait)),
            written(&both, Some(wait)),
        )
        .await;
        let one = refused(&l, &[&a], 2).await;
        let never = too_many_requests(&one, None);
        assert!(!never.headers().contains_key(RETRY_AFTER));
        same(never, written(&one, None)).await;
    }
}
