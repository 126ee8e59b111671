//! Which policies apply to a request: a path prefix and a set of methods per policy. Several
//! may match, and all that match are decided together.
//!
//! Paths are normalised before matching (percent-encoded unreserved characters decoded, `//`
//! collapsed, `.` and `..` segments resolved), so `/%61pi` or `//api/../api` cannot slip
//! past a policy on `/api`. A prefix matches whole segments: `/api` matches `/api` and
//! `/api/x`, not `/apix`; a prefix ending in `/` matches everything below it.

use crate::identity::IdentitySource;
use http::Method;
use tollgate::Policy;

/// A policy with the requests it applies to.
#[derive(Debug, Clone)]
pub struct RoutedPolicy {
    policy: Policy,
    path_prefix: String,
    methods: Vec<Method>,
    identity: Option<Vec<IdentitySource>>,
}

impl RoutedPolicy {
    /// `policy` on every path and method.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            path_prefix: "/".to_string(),
            methods: Vec::new(),
            identity: None,
        }
    }

    /// Only paths under `prefix`.
    pub fn path_prefix(mut self, prefix: impl Into<String>) -> Self {
        let p = prefix.into();
        self.path_prefix = if p.starts_with('/') {
            p
        } else {
            format!("/{p}")
        };
        self
    }

    /// Only these methods (empty = all).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Identify clients with these sources instead of the layer's default ones.
    pub fn identity(mut self, sources: Vec<IdentitySource>) -> Self {
        self.identity = Some(sources);
        self
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The identity override, if any.
    pub fn identity_sources(&self) -> Option<&[IdentitySource]> {
        self.identity.as_deref()
    }

    /// Whether a request with this method and (normalised) path is subject to the policy.
    pub fn matches(&self, method: &Method, normalized_path: &str) -> bool {
        (self.methods.is_empty() || self.methods.contains(method))
            && prefix_matches(&self.path_prefix, normalized_path)
    }
}

fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" || prefix.ends_with('/') {
        return path.starts_with(prefix);
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// The path of a request target (`/a/b?q` or an absolute URI), normalised for matching.
pub fn normalize_path(target: &str) -> String {
    let path = match target.find("://") {
        Some(i) => {
            let after = &target[i + 3..];
            after.find('/').map_or("/", |j| &after[j..])
        }
        None => target,
    };
    let path = path.split(['?', '#']).next().unwrap_or("");
    let decoded = decode_unreserved(path);
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
    if out.is_empty() || (decoded.ends_with('/') && !segments.is_empty()) {
        out.push('/');
    }
    out
}

/// Decodes `%XX` when it encodes an unreserved character; leaves everything else as is.
fn decode_unreserved(path: &str) -> String {
    let b = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| char::from(c).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                let c = char::from_u32(h * 16 + l).unwrap_or('%');
                if c.is_ascii_alphanumeric() || "-._~".contains(c) {
                    out.push(c);
                    i += 3;
                    continue;
                }
            }
        }
        let ch_len = path[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&path[i..i + ch_len]);
        i += ch_len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/x"));
        assert!(!prefix_matches("/api", "/apix"));
        assert!(prefix_matches("/api/", "/api/x"));
        assert!(prefix_matches("/", "/anything"));
    }

    #[test]
    fn tricks_do_not_escape_normalisation() {
        assert_eq!(normalize_path("/%61pi/x?q=1"), "/api/x");
        assert_eq!(normalize_path("//api/../api/./x"), "/api/x");
        assert_eq!(normalize_path("/../../"), "/");
        assert_eq!(normalize_path("http://h:1/api/"), "/api/");
        assert_eq!(normalize_path(""), "/");
        assert_eq!(normalize_path("/a%2Fb"), "/a%2Fb");
        assert_eq!(normalize_path("/%"), "/%");
        assert_eq!(normalize_path("/é%4"), "/é%4");
    }
}
