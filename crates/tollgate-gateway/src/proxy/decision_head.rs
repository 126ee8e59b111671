//! Decision mode's 200 head, cloned from a template (`tollgate_tower::template`).
//!
//! Decision mode answers nearly every request with the same head: `Content-Type`, the one
//! advertised policy's `RateLimit-Policy` item, and a `RateLimit` value of its own. Written
//! header by header, that is three inserts into a new map: about 1,460 instructions a request.
//! A map cloned from a template that holds the first two and a `RateLimit` placeholder, whose
//! value is then replaced in place, costs about 950 (callgrind; see docs/benchmarks.md). An
//! answer that advertises several policies (or none) is written header by header, as before.

use crate::http::util::{status_response_full, TEXT_PLAIN};
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;
use std::cell::RefCell;
use tollgate::LimitResult;
use tollgate_tower::response::{add_headers, RATELIMIT, RATELIMIT_POLICY};
use tollgate_tower::template::{fill, Templates};

/// Where `RateLimit` sits in a template (its entries are in insertion order).
const RATELIMIT_AT: usize = 2;

thread_local! {
    static TEMPLATES: RefCell<Templates> = const { RefCell::new(Templates::new()) };
}

/// The 200 decision mode answers an allowed request with, its `RateLimit` headers those of
/// `result`.
pub(crate) fn allowed(result: &LimitResult) -> Response<Full<Bytes>> {
    if let Some(head) = templated(result) {
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.headers_mut() = head;
        return resp;
    }
    let mut resp = status_response_full(StatusCode::OK, "");
    add_headers(resp.headers_mut(), result);
    resp
}

/// [`allowed`]'s answer written whole at the end of `out` as hyper writes it (the status
/// line, the template's three headers in their order, `content-length` and `date`), with no
/// map: the answer of a result that advertises exactly one policy with a decision.
/// Otherwise (the caller writes [`allowed`]'s) false, `out` as it was. The item and the
/// `RateLimit` value are printable ASCII whatever the policy's name (`tollgate::headers`
/// writes names as structured-field strings; a test in `tollgate` holds every byte of a name
/// to it), so they are written unchecked, where the template checks them (as `HeaderValue`
/// does) once per value: 300 instructions a request (callgrind).
pub(crate) fn write_allowed(result: &LimitResult, out: &mut Vec<u8>) -> bool {
    let Some(item) = tollgate::headers::ratelimit_policy_item_str(result) else {
        return false;
    };
    let start = out.len();
    out.extend_from_slice(HEAD_TO_POLICY);
    out.extend_from_slice(item.as_bytes());
    out.extend_from_slice(b"\r\nratelimit: ");
    let value = out.len();
    if tollgate::headers::write_ratelimit(result, out).is_none() {
        out.truncate(start);
        return false;
    }
    debug_assert!(header_value(item.as_bytes()) && header_value(&out[value..]));
    out.extend_from_slice(b"\r\ncontent-length: 0\r\ndate: ");
    crate::http::plain::write_date(out);
    out.extend_from_slice(b"\r\n\r\n");
    true
}

/// [`write_allowed`]'s answer up to its `RateLimit-Policy` item: one constant, copied in one
/// piece, where the content type's value taken from [`TEXT_PLAIN`] was a copy of a length
/// known only at run time (a `memcpy` call). A test holds it to [`TEXT_PLAIN`].
const HEAD_TO_POLICY: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\nratelimit-policy: ";

/// Whether `bytes` make a header value as `HeaderValue` checks one (no control character but
/// a tab, no DEL): what the template's values are checked for, and what the values written
/// without a map are (in debug builds, the tests').
fn header_value(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| (b >= 32 && b != 127) || b == b'\t')
}

/// The head of `result`'s 200 from its policy's template; `None` when the answer does not
/// advertise exactly one policy with a decision.
fn templated(result: &LimitResult) -> Option<HeaderMap> {
    let (mut head, value) =
        tollgate_tower::template::for_result(&TEMPLATES, result, template, |h| Some(h.clone()))?;
    fill(&mut head, RATELIMIT_AT, &RATELIMIT, value)?;
    Some(head)
}

/// A template: `Content-Type`, `RateLimit-Policy: item`, and a `RateLimit` placeholder.
fn template(item: &Bytes) -> Option<HeaderMap> {
    let mut head = HeaderMap::with_capacity(RATELIMIT_AT + 1);
    head.insert(CONTENT_TYPE, TEXT_PLAIN.clone());
    head.insert(
        RATELIMIT_POLICY.clone(),
        HeaderValue::from_maybe_shared(item.clone()).ok()?,
    );
    head.insert(RATELIMIT.clone(), HeaderValue::from_static("-"));
    Some(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tollgate::quota::{Algorithm, Limit, Quota};
    use tollgate::{ClientKey, Limiter, LimiterConfig, Plan, Policy, PolicySpec};

    /// The constant start of `write_allowed`'s head names the content type every other
    /// answer of decision mode sends ([`TEXT_PLAIN`]).
    #[test]
    fn the_written_head_starts_with_text_plain() {
        let mut want = b"HTTP/1.1 200 OK\r\ncontent-type: ".to_vec();
        want.extend_from_slice(TEXT_PLAIN.as_bytes());
        want.extend_from_slice(b"\r\nratelimit-policy: ");
        assert_eq!(HEAD_TO_POLICY, &want[..]);
    }

    fn spec(name: &str, limit: u64) -> PolicySpec {
        let quota = Quota::new(limit, Duration::from_secs(60)).expect("quota");
        PolicySpec::new(
            name,
            Limit::new(Algorithm::TokenBucket, quota).expect("limit"),
        )
    }

    fn policy(l: &Limiter, name: &str, limit: u64) -> Policy {
        l.policy(spec(name, limit)).expect("policy")
    }

    async fn decide(l: &Limiter, policies: &[&Policy], client: u8) -> LimitResult {
        l.check(&Plan::for_client(
            ClientKey([client; 16]),
            policies.iter().copied(),
        ))
        .await
    }

    /// The head written header by header, as `add_headers` writes it.
    fn written(result: &LimitResult) -> HeaderMap {
        let mut resp = status_response_full(StatusCode::OK, "");
        add_headers(resp.headers_mut(), result);
        resp.headers().clone()
    }

    fn same(a: &HeaderMap, b: &HeaderMap) {
        assert_eq!(a.len(), b.len(), "{a:?} / {b:?}");
        for (name, value) in a {
            let theirs: Vec<_> = b.get_all(name).iter().collect();
            assert_eq!(theirs, vec![value], "{name}: {a:?} / {b:?}");
        }
    }

    fn remaining(resp: &Response<Full<Bytes>>) -> String {
        resp.headers()[&RATELIMIT]
            .to_str()
            .expect("ascii")
            .to_owned()
    }

    #[tokio::test]
    async fn the_templated_head_is_the_head_written_header_by_header() {
        let l = Limiter::new(LimiterConfig::default());
        let api = policy(&l, "api", 3);
        let other = policy(&l, "other \"quoted\"", 50);
        // Each answer, from a template made on the first and reused after, across policies
        // that may share a slot, says what the inserts say, and its own remaining count.
        for round in 0..3u64 {
            for (p, client) in [(&api, 1), (&other, 2), (&api, 3)] {
                let result = decide(&l, &[p], client).await;
                assert!(result.is_allowed(), "round {round}: {result:?}");
                let resp = allowed(&result);
                assert_eq!(resp.status(), StatusCode::OK);
                assert!(templated(&result).is_some(), "one policy: templated");
                same(resp.headers(), &written(&result));
                let left = if client == 2 { 49 - round } else { 2 - round };
                assert!(
                    remaining(&resp).contains(&format!(";r={left};")),
                    "{}",
                    remaining(&resp)
                );
            }
        }
        // A copy of a policy at another cost shares its item, and so its template.
        let dear = api.with_cost(2);
        let result = decide(&l, &[&dear], 4).await;
        assert!(templated(&result).is_some());
        same(allowed(&result).headers(), &written(&result));
    }

    #[tokio::test]
    async fn several_policies_or_none_advertised_are_written_header_by_header() {
        let l = Limiter::new(LimiterConfig::default());
        let api = policy(&l, "api", 10);
        let burst = policy(&l, "burst", 5);
        let both = decide(&l, &[&api, &burst], 1).await;
        assert!(templated(&both).is_none());
        let resp = allowed(&both);
        same(resp.headers(), &written(&both));
        assert!(resp.headers()[&RATELIMIT_POLICY]
            .to_str()
            .expect("ascii")
            .contains(", "));
        let mut dry = spec("watch", 10);
        dry.shadow = true;
        let dry = l.policy(dry).expect("policy");
        let none = decide(&l, &[&dry], 2).await;
        assert!(templated(&none).is_none());
        let resp = allowed(&none);
        assert!(resp.headers().get(&RATELIMIT_POLICY).is_none());
        assert!(resp.headers().get(&RATELIMIT).is_none());
        assert_eq!(resp.headers()[CONTENT_TYPE], TEXT_PLAIN);
    }

    #[tokio::test]
    async fn more_policies_than_slots_evict_and_still_answer_exactly() {
        let l = Limiter::new(LimiterConfig::default());
        let many: Vec<Policy> = (0..tollgate_tower::template::SLOTS * 4)
            .map(|i| policy(&l, &format!("p{i}"), 7))
            .collect();
        for round in 0..2u64 {
            for (i, p) in many.iter().enumerate() {
                let result = decide(&l, &[p], i as u8).await;
                let resp = allowed(&result);
                same(resp.headers(), &written(&result));
                let left = remaining(&resp);
                assert!(
                    left.starts_with(&format!("\"p{i}\";r={};", 6 - round)),
                    "{left}"
                );
            }
        }
    }

    #[tokio::test]
    async fn the_answer_written_without_a_map_is_the_templated_answer_encoded() {
        use crate::http::plain::dateless;
        let l = Limiter::new(LimiterConfig::default());
        let api = policy(&l, "api", 3);
        let odd = policy(&l, "we\"ird\\ né", 50);
        for round in 0..2u8 {
            for (p, client) in [(&api, 1), (&odd, 2), (&api, 3)] {
                let result = decide(&l, &[p], client + 10 * round).await;
                let mut out = b"earlier answer".to_vec();
                assert!(write_allowed(&result, &mut out), "one policy: written");
                let (head, _) = allowed(&result).into_parts();
                let mut encoded = b"earlier answer".to_vec();
                crate::http::plain::encode(&head, b"", false, &mut encoded);
                assert_eq!(dateless(&out), dateless(&encoded));
                assert!(dateless(&out).ends_with("\r\ncontent-length: 0\r\ndate: -\r\n\r\n"));
            }
        }
        // Several policies, or only shadow ones: not written, nothing left behind.
        let burst = policy(&l, "burst", 5);
        let mut dry = spec("watch", 10);
        dry.shadow = true;
        let dry = l.policy(dry).expect("policy");
        for policies in [&[&api, &burst][..], &[&dry][..]] {
            let result = decide(&l, policies, 7).await;
            let mut out = b"kept".to_vec();
            assert!(!write_allowed(&result, &mut out));
            assert_eq!(out, b"kept");
        }
    }

    #[test]
    fn header_values_are_checked_as_http_checks_them() {
        for bytes in [&b""[..], b"\"a\";r=1;t=2", b"tab\there", "né".as_bytes()] {
            assert!(header_value(bytes));
            assert!(HeaderValue::from_bytes(bytes).is_ok());
        }
        for bytes in [&b"a\rb"[..], b"a\nb", b"\x00", b"\x7f", b"\x1f"] {
            assert!(!header_value(bytes));
            assert!(HeaderValue::from_bytes(bytes).is_err());
        }
    }
}
