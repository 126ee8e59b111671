//! The values of `RateLimit-Policy` and `RateLimit` (IETF httpapi draft syntax) for a
//! [`LimitResult`], written once for every front end that renders them: the HTTP layer's
//! response headers and the Envoy RLS `response_headers_to_add`.
//!
//! Shadow policies are never advertised. `r` is what remains after this request; `t` and `w`
//! are whole seconds (rounded up; a window is at least 1 s), and so is `Retry-After`
//! ([`retry_after_secs`]): a client that waits the whole seconds it is told never comes back
//! early.

use crate::{LimitResult, PolicyResult};
use std::time::Duration;

/// Most policies `RateLimit-Policy` lists: the most constrained one first, then others in
/// configuration order. A request matched by thousands of policies must not get a header of
/// hundreds of kilobytes (which many clients and proxies refuse).
pub const MAX_ADVERTISED_POLICIES: usize = 16;

/// `"name";q=LIMIT;w=WINDOW_SECONDS` for the enforced policies of `result` (the most
/// constrained first, at most [`MAX_ADVERTISED_POLICIES`]), comma-separated; `None` when
/// every policy is a shadow one.
pub fn ratelimit_policy(result: &LimitResult) -> Option<String> {
    // Written straight into one string (no formatting machinery, no string per name): one
    // line per decision, and the RLS writes it for every request with ten or more rules.
    // Each policy's item is written once, when the policy is built (`policy_item`).
    let mut out = String::with_capacity(ratelimit_policy_room(result.results.len()));
    Advertised::of(result).each_item(|n, item| {
        if n > 0 {
            out.push_str(", ");
        }
        out.push_str(item);
    });
    (!out.is_empty()).then_some(out)
}

/// Appends [`ratelimit_policy`]`(result)` to `out` (nothing when it is `None`); true when it
/// wrote something. For a writer that puts the value straight into its own buffer (the RLS's
/// answer), without a string of its own.
pub fn write_ratelimit_policy(result: &LimitResult, out: &mut Vec<u8>) -> bool {
    Advertised::of(result).write_policy(out)
}

/// The room [`ratelimit_policy`]'s value takes for a decision of `policies` policies: an
/// item of a name of a few dozen bytes, its quota and its window for each policy listed (at
/// most [`MAX_ADVERTISED_POLICIES`]).
pub fn ratelimit_policy_room(policies: usize) -> usize {
    48 * policies.min(MAX_ADVERTISED_POLICIES)
}

/// A result's `RateLimit-Policy` and `RateLimit` values, its most constrained policy found
/// once for both (a pass over every result: an RLS answer of ten rules writes both).
pub struct Advertised<'r> {
    result: &'r LimitResult,
    first: Option<&'r PolicyResult>,
}

impl<'r> Advertised<'r> {
    /// The values of `result`.
    pub fn of(result: &'r LimitResult) -> Self {
        Self {
            result,
            first: result.most_constrained(),
        }
    }

    /// Appends the `RateLimit-Policy` value ([`ratelimit_policy`]) to `out`; true when it
    /// wrote something.
    pub fn write_policy(&self, out: &mut Vec<u8>) -> bool {
        out.reserve(ratelimit_policy_room(self.result.results.len()));
        let start = out.len();
        self.each_item(|n, item| {
            if n > 0 {
                out.extend_from_slice(b", ");
            }
            out.extend_from_slice(item.as_bytes());
        });
        out.len() > start
    }

    /// Appends the `RateLimit` value ([`ratelimit`]) to `out`; `None`, and nothing written,
    /// when there is none.
    pub fn write_ratelimit(&self, out: &mut Vec<u8>) -> Option<()> {
        let (prefix, remaining, reset) = self.ratelimit_parts()?;
        out.extend_from_slice(prefix.as_bytes());
        write_u64(out, remaining);
        out.extend_from_slice(b";t=");
        write_u64(out, reset);
        Some(())
    }

    /// The `RateLimit` value's parts: the most constrained policy's `"name";r=`, the count
    /// remaining and the whole seconds to the reset; `None` when there is no such policy with
    /// a decision (shadow only, or the store failed open).
    fn ratelimit_parts(&self) -> Option<(&'r str, u64, u64)> {
        let r = self.first?;
        let d = r.decision?;
        Some((
            r.policy.remaining_prefix(),
            d.remaining,
            secs_ceil(d.reset_after, 0),
        ))
    }

    /// The advertised policies' items, in order, each given to `put` with its place: the
    /// most constrained first, then the other enforced ones in configuration order, at most
    /// [`MAX_ADVERTISED_POLICIES`].
    fn each_item(&self, mut put: impl FnMut(usize, &'r str)) {
        let first = self.first;
        let others = self
            .result
            .results
            .iter()
            .filter(|r| !r.policy.is_shadow() && !first.is_some_and(|f| std::ptr::eq(*r, f)));
        let listed = first
            .into_iter()
            .chain(others)
            .take(MAX_ADVERTISED_POLICIES);
        for (n, r) in listed.enumerate() {
            put(n, r.policy.advertised());
        }
    }
}

/// [`ratelimit_policy`] as bytes for a header value: the one advertised policy's item shared
/// as it was written when the policy was built (no allocation, no copy), or the list written
/// as [`ratelimit_policy`] writes it.
pub fn ratelimit_policy_value(result: &LimitResult) -> Option<bytes::Bytes> {
    ratelimit_policy_item(result).or_else(|| ratelimit_policy(result).map(bytes::Bytes::from))
}

/// The `RateLimit-Policy` value of a result with exactly one enforced policy: that policy's
/// item, shared as it was written when the policy was built (the same bytes, at the same
/// address, for every result of that policy and of its [`crate::Policy::with_cost`] copies);
/// `None` when no policy or several are advertised.
pub fn ratelimit_policy_item(result: &LimitResult) -> Option<bytes::Bytes> {
    only_advertised(result).map(|r| r.policy.advertised_bytes())
}

/// [`ratelimit_policy_item`]'s bytes, borrowed: for a caller that copies them, as a head
/// written whole does (a shared copy is a locked instruction to take and one to drop).
pub fn ratelimit_policy_item_str(result: &LimitResult) -> Option<&str> {
    only_advertised(result).map(|r| r.policy.advertised())
}

/// The one policy a result advertises, when it advertises exactly one.
fn only_advertised(result: &LimitResult) -> Option<&PolicyResult> {
    let mut enforced = result.results.iter().filter(|r| !r.policy.is_shadow());
    let first = enforced.next()?;
    enforced.next().is_none().then_some(first)
}

/// `"name";r=` for a policy named `name` (the start of its `RateLimit` value).
pub(crate) fn remaining_prefix(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 5);
    push_sf_string(&mut out, name);
    out.push_str(";r=");
    out
}

/// One policy's item of `RateLimit-Policy`: `"name";q=LIMIT;w=WINDOW_SECONDS`, or
/// `;qu="concurrent-requests"` instead of a window for a concurrency limit.
pub(crate) fn policy_item(name: &str, limit: &crate::quota::Limit) -> String {
    let mut out = String::with_capacity(name.len() + 32);
    let q = limit.quota();
    push_sf_string(&mut out, name);
    out.push_str(";q=");
    push_u64(&mut out, q.limit());
    if limit.algorithm().is_concurrency() {
        // Not a rate: no window; the quota unit says what is counted.
        out.push_str(";qu=\"concurrent-requests\"");
    } else {
        out.push_str(";w=");
        push_u64(&mut out, secs_ceil(q.period(), 1));
    }
    out
}

/// `"name";r=REMAINING;t=RESET_SECONDS` for the most constrained enforced policy with a
/// decision; `None` when there is none (shadow only, or the store failed open).
pub fn ratelimit(result: &LimitResult) -> Option<String> {
    let (prefix, remaining, reset) = Advertised::of(result).ratelimit_parts()?;
    let mut out = String::with_capacity(prefix.len() + 44);
    out.push_str(prefix);
    push_u64(&mut out, remaining);
    out.push_str(";t=");
    push_u64(&mut out, reset);
    Some(out)
}

/// [`ratelimit`] as bytes for a header value, in one allocation of its exact size (written
/// on the stack first when the policy's name is short, as names are).
pub fn ratelimit_value(result: &LimitResult) -> Option<bytes::Bytes> {
    let (prefix, remaining, reset) = Advertised::of(result).ratelimit_parts()?;
    let prefix = prefix.as_bytes();
    // The prefix, two numbers of at most 20 digits and ";t=".
    let mut buf = [0u8; 256];
    if prefix.len() + 43 > buf.len() {
        return ratelimit(result).map(bytes::Bytes::from);
    }
    let mut len = 0;
    let mut put = |part: &[u8]| {
        buf[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    };
    put(prefix);
    put(Digits::of(remaining).as_slice());
    put(b";t=");
    put(Digits::of(reset).as_slice());
    Some(bytes::Bytes::copy_from_slice(&buf[..len]))
}

/// [`ratelimit`] written at the end of `out` (nothing written when it is `None`).
pub fn write_ratelimit(result: &LimitResult, out: &mut Vec<u8>) -> Option<()> {
    Advertised::of(result).write_ratelimit(out)
}

/// `n` in decimal at the end of `out`.
pub fn write_u64(out: &mut Vec<u8>, n: u64) {
    // Pushed a digit at a time: a copy of the few digits a header's number has cost more
    // (a call to `memcpy` for each number) than the pushes.
    out.reserve(20);
    for &b in Digits::of(n).as_slice() {
        out.push(b);
    }
}

/// The decimal digits of a number, most significant first, at the end of a buffer on the
/// stack (written from the last: no count of them first).
struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    #[inline]
    fn of(mut n: u64) -> Self {
        let mut d = Self {
            buf: [0; 20],
            start: 20,
        };
        loop {
            d.start -= 1;
            d.buf[d.start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return d;
            }
        }
    }

    fn as_slice(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// `text` as a structured-field string (RFC 9651 3.3.3): quoted, `"` and `\\` escaped, and
/// every character a string may not hold (controls, DEL, anything past ASCII) written as `?`,
/// so a name from a configuration file can never end the header or start another.
pub fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    push_sf_string(&mut out, text);
    out
}

/// Appends [`sf_string`]`(text)` to `out`.
fn push_sf_string(out: &mut String, text: &str) {
    out.push('"');
    if text
        .bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        out.push_str(text);
    } else {
        for c in text.chars() {
            match c {
                '"' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                ' '..='~' => out.push(c),
                _ => out.push('?'),
            }
        }
    }
    out.push('"');
}

/// Appends `n` in decimal to `out`, without the formatting machinery (the header values
/// here and the problem bodies of the HTTP layer write their numbers with it).
pub fn push_u64(out: &mut String, n: u64) {
    // ASCII digits: always UTF-8.
    if let Ok(text) = std::str::from_utf8(Digits::of(n).as_slice()) {
        out.push_str(text);
    }
}

/// The value of `Retry-After` (and of a problem body's `retry_after`) for a wait of `wait`:
/// whole seconds, rounded up, at least 1 (a `0` would invite a retry at once).
pub fn retry_after_secs(wait: Duration) -> u64 {
    secs_ceil(wait, 1)
}

/// `d` in whole seconds, rounded up from its whole microseconds (the unit every time of the
/// limiter comes in), never below `min`.
fn secs_ceil(d: Duration, min: u64) -> u64 {
    let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    us.div_ceil(1_000_000).max(min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_written_as_structured_field_strings() {
        assert_eq!(sf_string("api"), "\"api\"");
        assert_eq!(sf_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(sf_string("x\r\nSet-Cookie: y"), "\"x??Set-Cookie: y\"");
        assert_eq!(sf_string("é\u{7f}"), "\"??\"");
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        // Every digit count, at its edges (the digits are written from the last, into a
        // buffer of twenty).
        let edges = (0..20).flat_map(|p| {
            let t = 10u64.pow(p);
            [t - 1, t, t + 1, t.saturating_mul(7)]
        });
        for n in edges.chain([42, 1_000_000_007, u64::MAX - 1, u64::MAX]) {
            let mut s = String::new();
            push_u64(&mut s, n);
            assert_eq!(s, n.to_string());
            let mut v = b"x".to_vec();
            write_u64(&mut v, n);
            assert_eq!(v, format!("x{n}").into_bytes());
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_never_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_micros(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_micros(1_000_001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(18)), 18);
        assert_eq!(
            retry_after_secs(Duration::MAX),
            u64::MAX.div_ceil(1_000_000)
        );
    }

    #[test]
    fn a_reset_may_be_zero_seconds_but_a_window_is_at_least_one() {
        assert_eq!(secs_ceil(Duration::ZERO, 0), 0);
        assert_eq!(secs_ceil(Duration::from_micros(17_500_000), 0), 18);
        assert_eq!(secs_ceil(Duration::from_millis(500), 1), 1);
    }
}
