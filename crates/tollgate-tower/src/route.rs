//! Which policies apply to a request: a path prefix and a set of methods per policy. Several
//! may match, and all that match are decided together.
//!
//! Paths are normalised before matching (see [`crate::path`]), so `/%61pi` or `//api/../api`
//! cannot slip past a policy on `/api`. A prefix matches whole segments: `/api` matches `/api`
//! and `/api/x`, not `/apix`; a prefix ending in `/` matches everything below it. Matching is
//! case-sensitive, as paths are; a policy in front of an upstream that ignores case sets
//! [`RoutedPolicy::case_insensitive`], or `/API` would be a way around it.

use crate::identity::IdentitySource;
use crate::jwt::{claim_value, Claims};
use crate::target::single;
use http::{HeaderMap, HeaderName, Method};
use tollgate::{ClientKey, Policy};

/// Where a client's tier name comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TierSource {
    /// A claim of the request's verified JWT, e.g. `jwt:plan`.
    Jwt(String),
    /// A request header, believed only from a trusted proxy, e.g. `header:x-plan`.
    Header(HeaderName),
}

impl std::fmt::Display for TierSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TierSource::Jwt(c) => write!(f, "jwt:{c}"),
            TierSource::Header(h) => write!(f, "header:{}", h.as_str()),
        }
    }
}

impl std::str::FromStr for TierSource {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || "is not allowed; expected \"jwt:CLAIM\" or \"header:NAME\"".to_string();
        match s.parse::<IdentitySource>().map_err(|_| bad())? {
            IdentitySource::Jwt(c) => Ok(TierSource::Jwt(c)),
            IdentitySource::Header(h) => Ok(TierSource::Header(h)),
            IdentitySource::Ip => Err(bad()),
        }
    }
}

/// What a request carries that can name its tier.
pub(crate) struct TierInput<'a> {
    pub(crate) headers: &'a HeaderMap,
    pub(crate) claims: Option<&'a Claims>,
    /// Whether the peer is a trusted proxy (a header tier is read only then).
    pub(crate) trusted: bool,
}

/// A policy with the requests it applies to.
#[derive(Debug, Clone)]
pub struct RoutedPolicy {
    policy: Policy,
    costs: Costs,
    path_prefix: String,
    methods: Vec<Method>,
    identity: Option<Vec<IdentitySource>>,
    case_insensitive: bool,
    tier: Option<TierSource>,
    tiers: Vec<(String, Policy)>,
    overrides: std::collections::HashMap<ClientKey, Policy>,
}

impl RoutedPolicy {
    /// `policy` on every path and method.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            costs: Costs::default(),
            path_prefix: "/".to_string(),
            methods: Vec::new(),
            identity: None,
            case_insensitive: false,
            tier: None,
            tiers: Vec::new(),
            overrides: std::collections::HashMap::new(),
        }
    }

    /// Per-client overrides: a client whose key (under this policy's identity sources) is
    /// listed is limited by its own policy, before any tier.
    pub fn overrides(mut self, overrides: impl IntoIterator<Item = (ClientKey, Policy)>) -> Self {
        self.overrides = overrides.into_iter().collect();
        self
    }

    /// Tiers: a client whose `source` names one of `tiers` is limited by that tier's policy
    /// (its own rule, so its own state); any other client by the policy itself.
    pub fn tiers(mut self, source: TierSource, tiers: Vec<(String, Policy)>) -> Self {
        self.tier = Some(source);
        self.tiers = tiers;
        self
    }

    /// The tier source, if any.
    pub fn tier_source(&self) -> Option<&TierSource> {
        self.tier.as_ref()
    }

    /// The name of the tier a request is in (`None`: no tier, or one not configured).
    pub(crate) fn tier_of(&self, input: &TierInput<'_>) -> Option<&(String, Policy)> {
        let find = |value: &str| self.tiers.iter().find(|(name, _)| name == value);
        match self.tier.as_ref()? {
            TierSource::Jwt(claim) => find(&claim_value(input.claims?, claim)?),
            // Only from a trusted proxy; a header sent twice names no tier.
            TierSource::Header(name) if input.trusted => {
                find(single(input.headers, name).ok()??.to_str().ok()?.trim())
            }
            TierSource::Header(_) => None,
        }
    }

    /// The policy that limits `client`'s request: its override, its tier's, or this
    /// policy's own.
    pub(crate) fn policy_for(&self, client: &ClientKey, input: &TierInput<'_>) -> &Policy {
        if let Some(p) = self.overrides.get(client) {
            return p;
        }
        self.tier_of(input).map_or(&self.policy, |t| &t.1)
    }

    /// Where the estimate and the real cost of a request come from (see [`Costs`]).
    pub fn costs(mut self, costs: Costs) -> Self {
        self.costs = costs;
        self
    }

    /// The policy's cost sources.
    pub fn cost_sources(&self) -> &Costs {
        &self.costs
    }

    /// Every policy this route may charge (its own, its tiers', its overrides'), for the
    /// lookup of their real-cost header.
    pub(crate) fn all_policies(&self) -> impl Iterator<Item = &Policy> {
        std::iter::once(&self.policy)
            .chain(self.tiers.iter().map(|(_, p)| p))
            .chain(self.overrides.values())
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

    /// Whether deciding this policy reads a claim of the bearer token: its identity sources
    /// (its own, else `defaults`) or its tier.
    pub(crate) fn reads_jwt(&self, defaults: &[IdentitySource]) -> bool {
        matches!(self.tier, Some(TierSource::Jwt(_))) || self.keyed_by_jwt(defaults)
    }

    /// Whether the client this policy counts is named by a claim of the bearer token (an
    /// identity source `jwt:CLAIM`, its own or `defaults`). A policy that is not can still
    /// count a request whose token does not verify (under its base tier).
    pub(crate) fn keyed_by_jwt(&self, defaults: &[IdentitySource]) -> bool {
        self.identity_sources()
            .unwrap_or(defaults)
            .iter()
            .any(|s| matches!(s, IdentitySource::Jwt(_)))
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

/// Where a policy's costs come from, when not from its fixed `cost` alone.
#[derive(Debug, Clone, Default)]
pub struct Costs {
    /// `cost_from_request`: the estimate from this request header (a positive integer up to
    /// `max`; absent or not a positive integer: the policy's `cost`; above `max`: 400).
    pub from_request: Option<HeaderName>,
    /// `cost_max`: the largest estimate a request may ask for.
    pub max: u64,
    /// `cost_from_response`: the real cost from this response header or trailer, settled
    /// when the response ends (the policy must settle, `PolicySpec::settle`).
    pub from_response: Option<HeaderName>,
}

/// The longest cost value read (u64::MAX has 20 digits): a longer one is not a cost.
const MAX_COST_DIGITS: usize = 20;

/// A cost header's value: `Ok(None)` when absent, `Ok(Some(n))` for one positive decimal
/// integer, `Err(())` for anything else (sent twice, empty, signs, spaces inside, zero,
/// too long).
pub(crate) fn cost_value(headers: &HeaderMap, name: &HeaderName) -> Result<Option<u64>, ()> {
    let mut values = headers.get_all(name).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(());
    }
    let bytes = v.as_bytes().trim_ascii();
    if bytes.is_empty() || bytes.len() > MAX_COST_DIGITS || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(());
    }
    let n = std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or(())?;
    if n == 0 {
        return Err(());
    }
    Ok(Some(n))
}

impl Costs {
    /// The estimate a request asks for: `Ok(None)` for the policy's own cost, `Err` (400)
    /// when it asks for more than `max`.
    pub(crate) fn estimate(&self, headers: &HeaderMap) -> Result<Option<u64>, u64> {
        let Some(name) = &self.from_request else {
            return Ok(None);
        };
        match cost_value(headers, name) {
            Ok(Some(n)) if n > self.max => Err(self.max),
            Ok(n) => Ok(n),
            Err(()) => Ok(None),
        }
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
    fn cost_headers_are_one_positive_integer_or_nothing() {
        let name = HeaderName::from_static("x-cost");
        let with = |values: &[&[u8]]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(
                    name.clone(),
                    http::HeaderValue::from_bytes(v).expect("value"),
                );
            }
            cost_value(&h, &name)
        };
        assert_eq!(with(&[]), Ok(None));
        assert_eq!(with(&[b"42"]), Ok(Some(42)));
        assert_eq!(with(&[b" 7 "]), Ok(Some(7)));
        assert_eq!(with(&[b"18446744073709551615"]), Ok(Some(u64::MAX)));
        for bad in [
            &b"0"[..],
            b"-1",
            b"+1",
            b"1.5",
            b"1e3",
            b"",
            b"4 2",
            b"18446744073709551616",
            b"000000000000000000001",
            b"0x10",
        ] {
            assert_eq!(with(&[bad]), Err(()), "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(with(&[b"1", b"2"]), Err(()), "sent twice");
    }

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

    #[test]
    fn a_header_tier_is_read_once_trimmed_and_only_from_a_trusted_peer() {
        let limiter = tollgate::Limiter::new(tollgate::LimiterConfig::default());
        let policy = |name: &str| {
            let quota = tollgate::quota::Quota::per_minute(10).expect("quota");
            let limit = tollgate::quota::Limit::new(tollgate::quota::Algorithm::TokenBucket, quota)
                .expect("limit");
            limiter
                .policy(tollgate::PolicySpec::new(name, limit))
                .expect("policy")
        };
        let name = HeaderName::from_static("x-plan");
        let routed = RoutedPolicy::new(policy("api")).tiers(
            TierSource::Header(name.clone()),
            vec![("pro".to_string(), policy("api.pro"))],
        );
        let tier = |values: &[&str], trusted: bool| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(name.clone(), http::HeaderValue::from_str(v).expect("value"));
            }
            let input = TierInput {
                headers: &headers,
                claims: None,
                trusted,
            };
            routed.tier_of(&input).map(|(t, _)| t.clone())
        };
        assert_eq!(tier(&["pro"], true).as_deref(), Some("pro"));
        assert_eq!(tier(&[" pro "], true).as_deref(), Some("pro"));
        assert_eq!(tier(&["pro"], false), None, "untrusted peer");
        assert_eq!(tier(&["pro", "pro"], true), None, "sent twice");
        assert_eq!(tier(&["enterprise"], true), None, "not configured");
        assert_eq!(tier(&[], true), None);
    }
}
