//! What a request is about, before any policy is matched: its method and normalised path,
//! or, behind a forward-auth proxy, the method and path of the request the proxy asks about.
//! Anything a client could use to be read two ways is refused here with a [`BadRequest`]:
//! an ambiguous path, a forward-auth header that is present but not valid, an identity header
//! sent twice (the first copy for us, the second for the upstream).
//!
//! Forward-auth headers are read from trusted peers only, and only the one configured pair:
//! a proxy overwrites the header it sets, but passes on any other a client made up, so
//! falling back to another header name is how a client picks its own path.

use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use std::fmt;

/// Which headers a forward-auth proxy names the original request with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardAuth {
    /// The original method (absent = `GET`, the method of the sub-request itself).
    pub method_header: HeaderName,
    /// The original request target (path and query).
    pub uri_header: HeaderName,
    /// Whether a trusted request without `uri_header` is refused (`true` when configured
    /// explicitly) or matched on its own path.
    pub require_uri: bool,
}

impl Default for ForwardAuth {
    /// `X-Forwarded-Method` and `X-Forwarded-Uri` (what Caddy and Traefik send), not required.
    fn default() -> Self {
        Self {
            method_header: HeaderName::from_static("x-forwarded-method"),
            uri_header: HeaderName::from_static("x-forwarded-uri"),
            require_uri: false,
        }
    }
}

/// Why a request is refused with 400 before any policy is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

impl fmt::Display for BadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadRequest {}

/// The method and normalised path policies are matched on.
pub(crate) struct Target<'a> {
    pub(crate) method: Method,
    /// Borrowed from the request when it is already normal.
    pub(crate) path: std::borrow::Cow<'a, str>,
    /// Whether the peer is a trusted proxy (found once, read again by the plan).
    pub(crate) trusted: bool,
    /// The value of each identity header (`Shared::identity_headers`, in its order), as
    /// `resolve` found it checking that none is repeated: the plan reads them from here.
    pub(crate) identity_values: smallvec::SmallVec<[Option<&'a HeaderValue>; 2]>,
}

/// The one value of `name`, `None` when absent; twice is an error.
pub(crate) fn single<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h HeaderValue>, BadRequest> {
    let mut all = headers.get_all(name).iter();
    let first = all.next();
    if all.next().is_some() {
        return Err(BadRequest(format!(
            "the {name} header is present more than once"
        )));
    }
    Ok(first)
}

/// Method and path of the original request, `None` when the URI header is absent and not
/// required.
pub(crate) fn original_request<'h>(
    fa: &ForwardAuth,
    headers: &'h HeaderMap,
) -> Result<Option<(Method, &'h str)>, BadRequest> {
    // A method header is checked even when the URI header is absent: invalid is invalid.
    let method = match single(headers, &fa.method_header)? {
        None => Method::GET,
        Some(m) => Method::from_bytes(m.as_bytes()).map_err(|_| {
            BadRequest(format!(
                "the {} header is not an HTTP method",
                fa.method_header
            ))
        })?,
    };
    let Some(value) = single(headers, &fa.uri_header)? else {
        if fa.require_uri {
            return Err(BadRequest(format!(
                "the {} header is missing; the forward-auth proxy must name the original request",
                fa.uri_header
            )));
        }
        return Ok(None);
    };
    let invalid = || {
        BadRequest(format!(
            "the {} header is not a request target like /path?query",
            fa.uri_header
        ))
    };
    let text = value.to_str().map_err(|_| invalid())?;
    let uri: Uri = text.parse().map_err(|_| invalid())?;
    if !(text.starts_with('/') || uri.scheme().is_some()) {
        return Err(invalid());
    }
    // An absolute URI is fine too: normalisation reads its path.
    Ok(Some((method, text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(list: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in list {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn nginx(require_uri: bool) -> ForwardAuth {
        ForwardAuth {
            uri_header: HeaderName::from_static("x-original-uri"),
            require_uri,
            ..ForwardAuth::default()
        }
    }

    #[test]
    fn only_the_configured_uri_header_is_read() {
        let h = headers(&[("x-original-uri", "/api/n"), ("x-forwarded-uri", "/public")]);
        let got = original_request(&nginx(true), &h).expect("valid");
        assert_eq!(got, Some((Method::GET, "/api/n")));
        let h = headers(&[("x-forwarded-uri", "/public")]);
        assert!(
            original_request(&nginx(true), &h).is_err(),
            "required and absent"
        );
        assert_eq!(original_request(&nginx(false), &h), Ok(None));
    }

    #[test]
    fn invalid_or_doubled_headers_are_refused_not_skipped() {
        for list in [
            &[("x-original-uri", "api/n")][..],
            &[("x-original-uri", "/a"), ("x-original-uri", "/b")],
            &[("x-original-uri", "/a"), ("x-forwarded-method", "G(T")],
            &[("x-forwarded-method", "G(T")],
        ] {
            assert!(
                original_request(&nginx(false), &headers(list)).is_err(),
                "{list:?}"
            );
        }
        let h = headers(&[
            ("x-original-uri", "http://h/api?x"),
            ("x-forwarded-method", "POST"),
        ]);
        assert_eq!(
            original_request(&nginx(true), &h),
            Ok(Some((Method::POST, "http://h/api?x")))
        );
    }
}
