//! Request paths as policies see them. A limiter in front of another server must read a path
//! the way that server will, or a client picks a spelling the limiter does not recognise and
//! the upstream does (`/%61pi`, `//api/../api`, `/api%2Fx`).
//!
//! So a path is normalised first (RFC 3986 section 6.2.2): percent-encoded unreserved
//! characters are decoded, the hex digits of the escapes that stay are upper-cased, `.` and
//! `..` segments are resolved and empty segments (`//`) dropped. What normalisation cannot
//! settle, because servers disagree about it, is *ambiguous*: an encoded `/` or `\`, a raw
//! `\`, control characters (NUL above all, raw or encoded), `;` path parameters (Tomcat and
//! Spring cut them, others keep them), double encoding (`%252F`, which a second decode turns
//! into `/`), overlong UTF-8 (`%C0%AF`), a stray `%`, and a segment ending in `.` or an
//! encoded space (Windows file
//! systems, IIS and several frameworks strip those, so `/api.` and `/api%20` may serve
//! `/api`). [`normalize_strict`] refuses those; [`normalize_path`] passes them through
//! unchanged so a deployment that needs them (`ambiguous_paths = "allow"`) still matches.

use std::fmt;

/// Why a path was refused: a form servers read differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmbiguousPath(pub &'static str);

impl fmt::Display for AmbiguousPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the request path contains {}", self.0)
    }
}

impl std::error::Error for AmbiguousPath {}

/// The path of a request target (`/a/b?q` or an absolute URI), normalised for matching.
/// Ambiguous forms are kept as they are (a stray `%` becomes `%25`).
pub fn normalize_path(target: &str) -> String {
    resolve_dots(&decode_unreserved(path_of(target)))
}

/// [`normalize_path`], or the reason the path is ambiguous.
pub fn normalize_strict(target: &str) -> Result<String, AmbiguousPath> {
    normalize_strict_borrowed(target).map(std::borrow::Cow::into_owned)
}

/// [`normalize_strict`], borrowing `target`'s path when it is its own normal form (most
/// paths: nothing to decode, resolve or refuse), so a request's path is not copied.
pub(crate) fn normalize_strict_borrowed(
    target: &str,
) -> Result<std::borrow::Cow<'_, str>, AmbiguousPath> {
    let path = path_of(target);
    if is_canonical(path) {
        return Ok(std::borrow::Cow::Borrowed(path));
    }
    normalize_decoded(path).map(std::borrow::Cow::Owned)
}

/// [`normalize_strict`] of a path, every step taken.
fn normalize_decoded(path: &str) -> Result<String, AmbiguousPath> {
    if let Some(why) = stray_percent(path) {
        return Err(why);
    }
    let decoded = decode_unreserved(path);
    if let Some(why) = ambiguity(&decoded) {
        return Err(why);
    }
    Ok(resolve_dots(&decoded))
}

/// Whether `path` is its own normal form: it starts with `/`, holds only letters, digits,
/// `-`, `_`, `~`, `.` and `/`, has no empty segment (`//`) and no segment ending in `.` (which
/// covers `.`, `..` and the dotted names some servers strip). Then [`normalize_strict`]'s
/// decoding, checks and dot resolution change nothing, so they are skipped (a property test
/// holds the two to the same answers).
fn is_canonical(path: &str) -> bool {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return false;
    }
    let mut prev = b'/';
    for &c in &b[1..] {
        let ok = match c {
            b'/' => prev != b'/' && prev != b'.',
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'~' | b'.' => true,
            _ => false,
        };
        if !ok {
            return false;
        }
        prev = c;
    }
    prev != b'.'
}

/// The path part of a request target: no scheme and authority, no query, no fragment.
fn path_of(target: &str) -> &str {
    // Only a target that does not start with `/` can be absolute, and only such a target is
    // searched for a scheme: `/x?u=http://h/api` is the path `/x`, whatever its query says.
    let scheme_end = if target.starts_with('/') {
        None
    } else {
        target.find("://")
    };
    let path = match scheme_end {
        Some(i) => {
            let after = &target[i + 3..];
            after.find(['/', '?', '#']).map_or("/", |j| &after[j..])
        }
        None => target,
    };
    path.split(['?', '#']).next().unwrap_or("")
}

fn hex(c: u8) -> Option<u8> {
    char::from(c)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// A `%` that does not start an escape.
fn stray_percent(path: &str) -> Option<AmbiguousPath> {
    let b = path.as_bytes();
    let ok = b
        .iter()
        .enumerate()
        .filter(|(_, c)| **c == b'%')
        .all(|(i, _)| {
            b.get(i + 1).copied().and_then(hex).is_some()
                && b.get(i + 2).copied().and_then(hex).is_some()
        });
    (!ok).then_some(AmbiguousPath("a '%' that starts no escape"))
}

/// Decodes `%XX` when it encodes an unreserved character and upper-cases the hex digits of
/// the escapes that stay; a stray `%` is written `%25`, so the result decodes to itself.
fn decode_unreserved(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let pair = b
                .get(i + 1)
                .copied()
                .and_then(hex)
                .zip(b.get(i + 2).copied().and_then(hex));
            match pair {
                Some((h, l)) if is_unreserved(h * 16 + l) => out.push(char::from(h * 16 + l)),
                Some(_) => {
                    out.push('%');
                    out.push(char::from(b[i + 1].to_ascii_uppercase()));
                    out.push(char::from(b[i + 2].to_ascii_uppercase()));
                }
                None => {
                    out.push_str("%25");
                    i += 1;
                    continue;
                }
            }
            i += 3;
            continue;
        }
        let ch_len = path[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&path[i..i + ch_len]);
        i += ch_len;
    }
    out
}

/// The first ambiguous form in a decoded path (escapes upper-cased), if any.
fn ambiguity(decoded: &str) -> Option<AmbiguousPath> {
    let b = decoded.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        let why = match c {
            b'\\' => "a backslash",
            b';' => "a ';' parameter",
            c if c < 0x20 || c == 0x7f => "a control character",
            b'%' => match (b.get(i + 1), b.get(i + 2)) {
                (Some(b'2'), Some(b'F')) => "an encoded '/'",
                (Some(b'5'), Some(b'C')) => "an encoded '\\'",
                (Some(b'0' | b'1'), Some(_)) | (Some(b'7'), Some(b'F')) => {
                    "an encoded control character"
                }
                (Some(b'2'), Some(b'5'))
                    if b.get(i + 3).copied().and_then(hex).is_some()
                        && b.get(i + 4).copied().and_then(hex).is_some() =>
                {
                    "a double-encoded character"
                }
                // `%C0%AF` and `%E0%80%AF` are overlong spellings of `/` that old decoders
                // accepted; no valid UTF-8 starts this way.
                (Some(b'C'), Some(b'0' | b'1')) => "an overlong UTF-8 encoding",
                (Some(b'E'), Some(b'0'))
                    if b.get(i + 3) == Some(&b'%') && matches!(b.get(i + 4), Some(b'8' | b'9')) =>
                {
                    "an overlong UTF-8 encoding"
                }
                _ => continue,
            },
            _ => continue,
        };
        return Some(AmbiguousPath(why));
    }
    let strippable = decoded
        .split('/')
        .any(|seg| (seg.ends_with('.') && seg != "." && seg != "..") || seg.ends_with("%20"));
    strippable.then_some(AmbiguousPath(
        "a segment ending in '.' or a space, which some servers strip",
    ))
}

/// Resolves `.` and `..`, drops empty segments; keeps one trailing `/`.
fn resolve_dots(decoded: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len() + 1);
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    let dir = decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    if out.is_empty() || (dir && !segments.is_empty()) {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The fast path answers exactly what the full normalization answers, for paths made
        /// of the characters that matter to it (dots, slashes, escapes, separators).
        #[test]
        fn the_fast_path_answers_as_the_full_normalization(
            path in proptest::collection::vec(
                prop_oneof![Just("/"), Just("."), Just(".."), Just("a"), Just("Z9"), Just("-_~"),
                            Just("%2e"), Just("%41"), Just(";"), Just("\\"), Just("?q=1"),
                            Just("#f"), Just(" "), Just("%"), Just("é")], 0..10)
        ) {
            let target: String = path.concat();
            prop_assert_eq!(
                normalize_strict(&target),
                normalize_decoded(path_of(&target)),
                "{:?}",
                target
            );
        }
    }

    #[test]
    fn canonical_paths_take_the_fast_path_and_others_do_not() {
        for p in ["/", "/api", "/api/", "/api/v1/items/42", "/a.b/c~d_e-f"] {
            assert!(is_canonical(p), "{p}");
            assert_eq!(normalize_strict(p).as_deref(), Ok(p));
        }
        for p in [
            "", "api", "//api", "/api//x", "/.", "/..", "/a/./b", "/a/../b", "/a.", "/a./b",
            "/%61", "/a;b", "/a b", "/a\\b",
        ] {
            assert!(!is_canonical(p), "{p}");
        }
    }

    #[test]
    fn tricks_do_not_escape_normalisation() {
        assert_eq!(normalize_path("/%61pi/x?q=1"), "/api/x");
        assert_eq!(normalize_path("//api/../api/./x"), "/api/x");
        assert_eq!(normalize_path("/../../"), "/");
        assert_eq!(normalize_path("http://h:1/api/"), "/api/");
        assert_eq!(normalize_path(""), "/");
        assert_eq!(normalize_path("/a%2fb"), "/a%2Fb");
        assert_eq!(normalize_path("/%"), "/%25");
        assert_eq!(normalize_path("/é%4"), "/é%254");
        assert_eq!(normalize_path("/api/x/.."), "/api/");
        assert_eq!(normalize_path("/api/n?next=http://h/public"), "/api/n");
        assert_eq!(normalize_path("http://h?q=/x"), "/");
    }

    #[test]
    fn ambiguous_forms_are_refused_by_the_strict_reading() {
        for path in [
            "/api%2Fx",
            "/api%2fx",
            "/api%5Cx",
            "/api\\x",
            "/api;x=1",
            "/api%00",
            "/api%0a",
            "/api%252Fx",
            "/api.",
            "/api%20",
            "/api%2E",
            "/api%20/x",
            "/%",
            "/a%zz",
            "/a%c0%afb",
            "/a%E0%80%AFb",
        ] {
            assert!(normalize_strict(path).is_err(), "{path}");
        }
        for (path, want) in [
            ("/api%20docs/x", "/api%20docs/x"),
            ("/caf%c3%a9", "/caf%C3%A9"),
            ("/%7Euser/./a", "/~user/a"),
            ("/api/../api/x", "/api/x"),
            ("/files/100%25", "/files/100%25"),
            ("/.well-known/x", "/.well-known/x"),
            ("/a/b/..", "/a/"),
        ] {
            assert_eq!(normalize_strict(path).as_deref(), Ok(want), "{path}");
        }
    }
}
