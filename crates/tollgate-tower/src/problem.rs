//! Every error answer tollgate writes, as one RFC 9457 problem: a [`ProblemKind`] (its type
//! URI, title and status), a `detail` for this occurrence and extension members such as
//! `violated-policies` and `retry_after`, rendered by one JSON writer that escapes every
//! string. A client then reads one format whatever refused it: the layer, the gateway's
//! refusals before hyper, the proxy, or the admin API.
//!
//! Type URIs: tollgate's own types are `https://tollgate.dev/problems#<name>`. The IETF httpapi
//! ratelimit-headers draft defines `https://iana.org/assignments/http-problem-types#quota-exceeded`
//! with the same `violated-policies` member; the 429 keeps tollgate's URI because the body is
//! a published contract and the draft's entry is not in the IANA registry yet, while the member
//! is the draft's, so a client written for the draft finds the policies where it looks.
//! `about:blank` is used where RFC 9457 section 4.2.1 says it fits: the problem means no more
//! than its status code (404, 405, 408, 431, 500, 505); its title is then the status phrase.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body_util::Full;
use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::OnceLock;

/// `application/problem+json`, the media type of every problem.
pub const CONTENT_TYPE_PROBLEM: &str = "application/problem+json";

/// The base of tollgate's own problem type URIs.
const BASE: &str = "https://tollgate.dev/problems#";

/// What went wrong, as far as a client can act on it: each kind has one type URI, one title
/// and one status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 429: a policy's quota is used up (`violated-policies`, `retry_after`).
    QuotaExceeded,
    /// 503: the rate-limit store does not answer and the policy fails closed, or an admin
    /// call could not read it.
    StoreUnavailable,
    /// 400: a request that could be read two ways or that HTTP/1.1 forbids; a bad admin query.
    BadRequest,
    /// 401: a present bearer token (JWT identity) that does not verify.
    InvalidToken,
    /// 401: an admin call without the right admin token.
    AdminTokenRequired,
    /// 403: the admin API is off because no admin token is configured.
    AdminDisabled,
    /// 404: no such resource (admin paths, admin API calls, policies).
    NotFound,
    /// 405: a method this resource does not serve (`Allow` says which it does).
    MethodNotAllowed,
    /// 408: the request body did not arrive within `body_timeout`.
    RequestTimeout,
    /// 409: a reload was asked for but the config came from no file.
    NothingToReload,
    /// 422: a reloaded config does not validate; the old one keeps serving.
    ConfigRefused,
    /// 431: the request head is larger than the gateway reads.
    HeadTooLarge,
    /// 500: a fault of tollgate itself, never an answer to what a client sent.
    Internal,
    /// 502: the upstream could not be reached or broke off its answer.
    UpstreamUnavailable,
    /// 504: the upstream did not answer within `upstream_timeout`.
    UpstreamTimeout,
    /// 505: HTTP/2 with prior knowledge on the HTTP/1 port.
    HttpVersionNotSupported,
}

impl ProblemKind {
    /// Every kind, for documentation and tests.
    pub const ALL: [ProblemKind; 16] = [
        ProblemKind::QuotaExceeded,
        ProblemKind::StoreUnavailable,
        ProblemKind::BadRequest,
        ProblemKind::InvalidToken,
        ProblemKind::AdminTokenRequired,
        ProblemKind::AdminDisabled,
        ProblemKind::NotFound,
        ProblemKind::MethodNotAllowed,
        ProblemKind::RequestTimeout,
        ProblemKind::NothingToReload,
        ProblemKind::ConfigRefused,
        ProblemKind::HeadTooLarge,
        ProblemKind::Internal,
        ProblemKind::UpstreamUnavailable,
        ProblemKind::UpstreamTimeout,
        ProblemKind::HttpVersionNotSupported,
    ];

    /// The `type` member: tollgate's URI, or `about:blank` for a kind that means no more
    /// than its status.
    pub fn type_uri(self) -> &'static str {
        match self.own_uri() {
            Some(f) => f,
            None => "about:blank",
        }
    }

    /// tollgate's own type URI, `None` for the `about:blank` kinds.
    fn own_uri(self) -> Option<&'static str> {
        use ProblemKind::*;
        // Spelled out whole so each URI can be searched for.
        let uri = match self {
            QuotaExceeded => "https://tollgate.dev/problems#quota-exceeded",
            StoreUnavailable => "https://tollgate.dev/problems#store-unavailable",
            BadRequest => "https://tollgate.dev/problems#bad-request",
            InvalidToken => "https://tollgate.dev/problems#invalid-token",
            AdminTokenRequired => "https://tollgate.dev/problems#admin-token-required",
            AdminDisabled => "https://tollgate.dev/problems#admin-disabled",
            NothingToReload => "https://tollgate.dev/problems#nothing-to-reload",
            ConfigRefused => "https://tollgate.dev/problems#config-refused",
            UpstreamUnavailable => "https://tollgate.dev/problems#upstream-unavailable",
            UpstreamTimeout => "https://tollgate.dev/problems#upstream-timeout",
            NotFound
            | MethodNotAllowed
            | RequestTimeout
            | HeadTooLarge
            | Internal
            | HttpVersionNotSupported => return None,
        };
        debug_assert!(uri.starts_with(BASE));
        Some(uri)
    }

    /// The `title` member: the same for every occurrence of the kind.
    pub fn title(self) -> &'static str {
        use ProblemKind::*;
        match self {
            QuotaExceeded => "Too Many Requests",
            StoreUnavailable => "Service Unavailable",
            BadRequest => "Bad Request",
            InvalidToken => "Unauthorized",
            AdminTokenRequired => "Admin token required",
            AdminDisabled => "Admin API disabled",
            NotFound => "Not Found",
            MethodNotAllowed => "Method Not Allowed",
            RequestTimeout => "Request Timeout",
            NothingToReload => "Nothing to reload",
            ConfigRefused => "Config refused; the old one keeps serving",
            HeadTooLarge => "Request Header Fields Too Large",
            Internal => "Internal Server Error",
            UpstreamUnavailable => "Upstream unavailable",
            UpstreamTimeout => "Upstream timed out",
            HttpVersionNotSupported => "HTTP Version Not Supported",
        }
    }

    /// The HTTP status, also the `status` member.
    pub fn status(self) -> StatusCode {
        use ProblemKind::*;
        match self {
            QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            BadRequest => StatusCode::BAD_REQUEST,
            InvalidToken | AdminTokenRequired => StatusCode::UNAUTHORIZED,
            AdminDisabled => StatusCode::FORBIDDEN,
            NotFound => StatusCode::NOT_FOUND,
            MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            NothingToReload => StatusCode::CONFLICT,
            ConfigRefused => StatusCode::UNPROCESSABLE_ENTITY,
            HeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Internal => StatusCode::INTERNAL_SERVER_ERROR,
            UpstreamUnavailable => StatusCode::BAD_GATEWAY,
            UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            HttpVersionNotSupported => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
        }
    }
}

/// The value of an extension member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Member {
    /// A JSON string.
    Text(String),
    /// A JSON number (a whole one).
    Count(u64),
    /// A JSON boolean.
    Flag(bool),
    /// `null`.
    Null,
    /// An array of strings.
    Texts(Vec<String>),
}

impl From<&str> for Member {
    fn from(s: &str) -> Self {
        Member::Text(s.to_owned())
    }
}

impl From<String> for Member {
    fn from(s: String) -> Self {
        Member::Text(s)
    }
}

impl From<u64> for Member {
    fn from(n: u64) -> Self {
        Member::Count(n)
    }
}

impl From<bool> for Member {
    fn from(b: bool) -> Self {
        Member::Flag(b)
    }
}

impl From<Option<u64>> for Member {
    fn from(n: Option<u64>) -> Self {
        n.map_or(Member::Null, Member::Count)
    }
}

impl From<Vec<String>> for Member {
    fn from(v: Vec<String>) -> Self {
        Member::Texts(v)
    }
}

/// The members RFC 9457 defines; an extension by one of these names is not written, so a
/// body never has a key twice.
const STANDARD: [&str; 5] = ["type", "title", "status", "detail", "instance"];

/// One problem occurrence: a kind, an optional detail and extension members in the order
/// they were added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    kind: ProblemKind,
    /// Mostly a fixed sentence: borrowed, so the 429 path copies nothing.
    detail: Option<Cow<'static, str>>,
    members: Vec<(&'static str, Member)>,
}

impl Problem {
    /// A problem of `kind` with no detail and no extensions.
    pub fn new(kind: ProblemKind) -> Self {
        Self {
            kind,
            detail: None,
            members: Vec::new(),
        }
    }

    /// With `detail`: what happened this time and what the client can do. It may carry text
    /// from the request; the writer escapes it.
    pub fn detail(mut self, detail: impl Into<Cow<'static, str>>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// With the extension member `name` (names are ours, never a client's).
    pub fn member(mut self, name: &'static str, value: impl Into<Member>) -> Self {
        self.members.push((name, value.into()));
        self
    }

    /// The kind.
    pub fn kind(&self) -> ProblemKind {
        self.kind
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The JSON body: `type`, `title`, `status`, `detail` when there is one, then the
    /// extensions.
    pub fn to_json(&self) -> String {
        // Room for a 429's body (about 230 bytes with one policy) without growing.
        let mut out = String::with_capacity(320);
        match json_head(self.kind) {
            Some(head) => out.push_str(head),
            None => write_head(&mut out, self.kind),
        }
        if let Some(d) = &self.detail {
            out.push_str(",\"detail\":");
            push_str(&mut out, d);
        }
        for (name, value) in &self.members {
            if STANDARD.contains(name) {
                continue;
            }
            out.push(',');
            push_str(&mut out, name);
            out.push(':');
            push_member(&mut out, value);
        }
        out.push('}');
        out
    }

    /// The answer: its status, `Content-Type: application/problem+json` and the body.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        let mut resp = Response::new(Full::new(Bytes::from(self.to_json())));
        *resp.status_mut() = self.kind.status();
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_PROBLEM));
        resp
    }

    /// The same answer as raw HTTP/1.1 bytes, ending with `Connection: close`: for a
    /// connection answered before any HTTP parser reads it, and closed after.
    pub fn to_http1_close(&self) -> Vec<u8> {
        let body = self.to_json();
        let status = self.kind.status();
        let head = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: {CONTENT_TYPE_PROBLEM}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        );
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body.as_bytes());
        bytes
    }
}

impl From<Problem> for Response<Full<Bytes>> {
    fn from(p: Problem) -> Self {
        p.into_response()
    }
}

/// A body's first members, which its kind fixes: `{"type":…,"title":…,"status":…`.
fn write_head(out: &mut String, kind: ProblemKind) {
    out.push_str("{\"type\":");
    push_str(out, kind.type_uri());
    out.push_str(",\"title\":");
    push_str(out, kind.title());
    out.push_str(",\"status\":");
    tollgate::headers::push_u64(out, u64::from(kind.status().as_u16()));
}

/// [`write_head`] of `kind`, written once per kind (a 429 is what a flood of refused requests
/// gets: with this and the word check of [`plain`], a refused request went from 16,156 to
/// 15,296 instructions under callgrind); `None` for a kind missing from [`ProblemKind::ALL`].
fn json_head(kind: ProblemKind) -> Option<&'static str> {
    static HEADS: OnceLock<Vec<String>> = OnceLock::new();
    let heads = HEADS.get_or_init(|| {
        ProblemKind::ALL
            .iter()
            .map(|&k| {
                let mut head = String::new();
                write_head(&mut head, k);
                head
            })
            .collect()
    });
    let i = ProblemKind::ALL.iter().position(|&k| k == kind)?;
    heads.get(i).map(String::as_str)
}

fn push_member(out: &mut String, value: &Member) {
    match value {
        Member::Text(s) => push_str(out, s),
        Member::Count(n) => tollgate::headers::push_u64(out, *n),
        Member::Flag(b) => out.push_str(if *b { "true" } else { "false" }),
        Member::Null => out.push_str("null"),
        Member::Texts(v) => {
            out.push('[');
            for (i, s) in v.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_str(out, s);
            }
            out.push(']');
        }
    }
}

/// The bytes a JSON string holds as they are: printable ASCII but `"` and `\\`.
static PLAIN: [bool; 256] = {
    let mut plain = [false; 256];
    let mut b = b' ';
    while b <= b'~' {
        plain[b as usize] = b != b'"' && b != b'\\';
        b += 1;
    }
    plain
};

/// Whether every byte of `s` is [`PLAIN`]: eight bytes at a time (a byte of 0x80 or more, one
/// below 0x20, `"`, `\` or DEL in a word is found with a few integer operations), the rest
/// one at a time. A byte at a time, a 429's fixed sentences cost about four instructions a
/// byte (callgrind).
fn plain(s: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    // A byte of `w` equals `b`: the classic zero-byte test on `w ^ b..b` (exact for
    // whether one exists; which one is not needed).
    let has = |w: u64, b: u8| {
        let x = w ^ (ONES * u64::from(b));
        x.wrapping_sub(ONES) & !x & HIGH != 0
    };
    let mut words = s.chunks_exact(8);
    for word in &mut words {
        let Ok(bytes) = <[u8; 8]>::try_from(word) else {
            return false;
        };
        let w = u64::from_ne_bytes(bytes);
        let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH != 0;
        if w & HIGH != 0 || below_space || has(w, b'"') || has(w, b'\\') || has(w, 0x7f) {
            return false;
        }
    }
    words.remainder().iter().all(|&b| PLAIN[usize::from(b)])
}

/// Appends `s` as a JSON string (RFC 8259 section 7): `"` and `\` escaped, every control
/// character below U+0020 escaped, everything else written as UTF-8. DEL and U+2028/U+2029
/// are escaped too: legal in JSON, but they break log lines and JavaScript readers.
fn push_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    // Most strings (every fixed one: the type, the title, a 429's detail) need no escape:
    // checked (see `plain`) and written whole. A 429 is what a flood of refused requests
    // gets, and decoding its text a character at a time was two thirds of its cost
    // (callgrind: 4,940 of `too_many_requests`' 7,420 instructions).
    if plain(s.as_bytes()) {
        out.push('"');
        out.push_str(s);
        out.push('"');
        return;
    }
    out.push('"');
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let escaped = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            '\u{08}' => "\\b",
            '\u{0c}' => "\\f",
            c if u32::from(c) < 0x20 || c == '\u{7f}' || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&s[start..i]);
                let _ = write!(out, "\\u{:04x}", u32::from(c));
                start = i + c.len_utf8();
                continue;
            }
            _ => continue,
        };
        out.push_str(&s[start..i]);
        out.push_str(escaped);
        start = i + c.len_utf8();
    }
    out.push_str(&s[start..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn parse(p: &Problem) -> Value {
        serde_json::from_str(&p.to_json()).expect("valid JSON")
    }

    /// Every ASCII byte, alone and inside plain text: the whole-string path (no escape
    /// needed) and the escaping one write what a JSON reader reads back as the same text,
    /// and only a string that needs no escape is written as it is.
    #[test]
    fn every_ascii_byte_is_written_as_json_reads_it() {
        for b in 0u8..=0x7f {
            let c = char::from(b);
            for text in [c.to_string(), format!("plain {c} text"), format!("{c}{c}")] {
                let mut out = String::new();
                push_str(&mut out, &text);
                let back: Value = serde_json::from_str(&out).expect("valid JSON");
                assert_eq!(back, Value::String(text.clone()), "{b:#x}: {out}");
                let plain = (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
                assert_eq!(out == format!("\"{text}\""), plain, "{b:#x}: {out}");
            }
        }
    }

    /// Every kind's body starts with its head as written for it alone, and every kind has
    /// its head kept (none is missing from `ALL`).
    #[test]
    fn every_kind_keeps_its_head() {
        for kind in ProblemKind::ALL {
            let mut fresh = String::new();
            write_head(&mut fresh, kind);
            assert_eq!(json_head(kind), Some(fresh.as_str()), "{kind:?}");
            let body = Problem::new(kind).detail("d").to_json();
            assert!(body.starts_with(&fresh), "{body}");
            let v: Value = serde_json::from_str(&body).expect("valid JSON");
            assert_eq!(v["type"], kind.type_uri());
            assert_eq!(v["title"], kind.title());
            assert_eq!(v["status"], kind.status().as_u16());
        }
    }

    /// The word-at-a-time check says what the byte table says, for every byte value at every
    /// position of a word and of the tail, in strings of every length up to three words.
    #[test]
    fn the_word_check_agrees_with_the_byte_table() {
        for len in 1..=24 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    s[at] = b;
                    let table = s.iter().all(|&b| PLAIN[usize::from(b)]);
                    assert_eq!(plain(&s), table, "byte {b:#x} at {at} of {len}");
                }
            }
        }
        assert!(plain(b""));
        assert!(plain(
            b"Rate limit exceeded; retry after the number of seconds"
        ));
    }

    #[test]
    fn hostile_strings_round_trip_through_the_writer() {
        let hostile = [
            "\"},{\"type\":\"evil\"",
            "back\\slash\\\\ and \\\"",
            "nul\u{0}bell\u{7}esc\u{1b}del\u{7f}",
            "lines\r\n\tand \u{08}\u{0c} and \u{1f}",
            "non-ASCII: é ü 雪 🚦 \u{2028}\u{2029}",
            "</script><script>alert(1)</script>",
            "",
        ];
        for s in hostile {
            let p = Problem::new(ProblemKind::BadRequest)
                .detail(s)
                .member("echo", s)
                .member("list", vec![s.to_owned(), s.to_owned()]);
            let json = p.to_json();
            let v = parse(&p);
            assert_eq!(v["detail"], s, "{json}");
            assert_eq!(v["echo"], s, "{json}");
            assert_eq!(v["list"][1], s, "{json}");
            assert_eq!(v["type"], ProblemKind::BadRequest.type_uri(), "{json}");
            assert!(
                !json.chars().any(|c| u32::from(c) < 0x20
                    || c == '\u{7f}'
                    || c == '\u{2028}'
                    || c == '\u{2029}'),
                "a raw control character or line separator in {json:?}"
            );
        }
    }

    #[test]
    fn control_characters_use_the_short_escapes_where_json_has_them() {
        let mut out = String::new();
        push_str(&mut out, "a\"b\\c\nd\re\tf\u{8}g\u{c}h\u{1}i\u{7f}");
        assert_eq!(out, r#""a\"b\\c\nd\re\tf\bg\fh\u0001i\u007f""#);
    }

    #[test]
    fn every_kind_has_its_status_type_and_title() {
        let mut uris = std::collections::HashSet::new();
        for kind in ProblemKind::ALL {
            let resp = Problem::new(kind).into_response();
            assert_eq!(resp.status(), kind.status(), "{kind:?}");
            assert_eq!(resp.headers()[CONTENT_TYPE], CONTENT_TYPE_PROBLEM);
            let v = parse(&Problem::new(kind));
            assert_eq!(v["status"], kind.status().as_u16(), "{kind:?}");
            assert_eq!(v["type"], kind.type_uri(), "{kind:?}");
            assert_eq!(v["title"], kind.title(), "{kind:?}");
            assert!(v.get("detail").is_none(), "{kind:?}");
            let uri = kind.type_uri();
            if uri == "about:blank" {
                // RFC 9457 4.2.1: the title of about:blank is the status phrase.
                assert_eq!(Some(kind.title()), kind.status().canonical_reason());
            } else {
                assert!(uri.starts_with(BASE), "{uri}");
                assert!(uris.insert(uri), "{uri} used twice");
            }
            assert!(
                !kind.status().is_success() && kind.status().as_u16() >= 400,
                "{kind:?}"
            );
        }
    }

    #[test]
    fn the_quota_exceeded_body_is_the_documented_one() {
        let p = Problem::new(ProblemKind::QuotaExceeded)
            .detail("Rate limit exceeded; retry after the number of seconds in Retry-After.")
            .member("violated-policies", vec!["default".to_owned()])
            .member("retry_after", Some(1));
        assert_eq!(
            p.to_json(),
            r#"{"type":"https://tollgate.dev/problems#quota-exceeded","title":"Too Many Requests","status":429,"detail":"Rate limit exceeded; retry after the number of seconds in Retry-After.","violated-policies":["default"],"retry_after":1}"#
        );
        let none = Problem::new(ProblemKind::QuotaExceeded).member("retry_after", None);
        assert!(none.to_json().ends_with(",\"retry_after\":null}"));
    }

    #[test]
    fn extensions_cannot_overwrite_the_standard_members() {
        let p = Problem::new(ProblemKind::NotFound)
            .member("status", 200u64)
            .member("type", "https://evil.example")
            .member("result", "error")
            .member("ok", false);
        assert_eq!(
            p.to_json(),
            r#"{"type":"about:blank","title":"Not Found","status":404,"result":"error","ok":false}"#
        );
    }

    #[test]
    fn the_raw_answer_is_the_response_as_http1_bytes() {
        let p = Problem::new(ProblemKind::HttpVersionNotSupported).detail("use HTTP/1.1");
        let raw = String::from_utf8(p.to_http1_close()).expect("utf-8");
        let (head, body) = raw.split_once("\r\n\r\n").expect("head and body");
        assert_eq!(body, p.to_json());
        let mut lines = head.split("\r\n");
        assert_eq!(
            lines.next(),
            Some("HTTP/1.1 505 HTTP Version Not Supported")
        );
        let fields: Vec<&str> = lines.collect();
        assert!(fields.contains(&"content-type: application/problem+json"));
        assert!(fields.contains(&format!("content-length: {}", body.len()).as_str()));
        assert!(fields.contains(&"connection: close"));
    }
}
