//! Which policies apply to a request: a path prefix and a set of methods per policy. Several
//! may match, and all that match are decided together.
//!
//! Paths are normalised before matching (see [`crate::path`]), so `/%61pi` or `//api/../api`
//! cannot slip past a policy on `/api`. A prefix matches whole segments: `/api` matches `/api`
//! and `/api/x`, not `/apix`; a prefix ending in `/` matches everything below it. Matching is
//! case-sensitive, as paths are; a policy in front of an upstream that ignores case sets
//! [`RoutedPolicy::case_insensitive`], or `/API` would be a way around it.

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
    case_insensitive: bool,
}

impl RoutedPolicy {
    /// `policy` on every path and method.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            path_prefix: "/".to_string(),
            methods: Vec::new(),
            identity: None,
            case_insensitive: false,
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

    /// Match the path prefix ignoring ASCII case (for upstreams that ignore case).
    pub fn case_insensitive(mut self, yes: bool) -> Self {
        self.case_insensitive = yes;
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
            && prefix_matches(&self.path_prefix, normalized_path, self.case_insensitive)
    }
}

fn prefix_matches(prefix: &str, path: &str, case_insensitive: bool) -> bool {
    let (prefix, path) = (prefix.as_bytes(), path.as_bytes());
    let Some(head) = path.get(..prefix.len()) else {
        return false;
    };
    let same = if case_insensitive {
        head.eq_ignore_ascii_case(prefix)
    } else {
        head == prefix
    };
    let rest = &path[prefix.len()..];
    same && (prefix.ends_with(b"/") || rest.is_empty() || rest.starts_with(b"/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(prefix_matches("/api", "/api", false));
        assert!(prefix_matches("/api", "/api/x", false));
        assert!(!prefix_matches("/api", "/apix", false));
        assert!(prefix_matches("/api/", "/api/x", false));
        assert!(prefix_matches("/", "/anything", false));
        assert!(!prefix_matches("/api", "/API/x", false));
        assert!(prefix_matches("/api", "/API/x", true));
        assert!(!prefix_matches("/api", "/APIx", true));
        assert!(!prefix_matches("/api", "/a", true));
    }
}
