//! What every service of one layer shares: the limiter, the identity rules, the routed
//! policies; and the two steps of a request before the limiter: its target (`resolve`) and its
//! plan (`plan`).

use crate::identity::{IdentityConfig, IdentitySource};
use crate::jwt::{Claims, InvalidToken};
use crate::path::{normalize_path, normalize_strict_borrowed};
use crate::route::{RoutedPolicy, TierInput};
use crate::target::{original_request, single, BadRequest, ForwardAuth, Target};
use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, Uri};
use std::net::{IpAddr, SocketAddr};
use tollgate::{ClientKey, IdentityHasher, LimitResult, Limiter, Plan};
use tracing::Instrument as _;

/// The socket peer of a request, put into its extensions by the server (the gateway does;
/// an axum app can use [`crate::RateLimitLayer::peer_addr_with`] to read `ConnectInfo` instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Reads the peer address from a request's extensions.
pub type PeerFn = fn(&Extensions) -> Option<IpAddr>;

/// The peer: the [`PeerAddr`] extension, else the address a [`crate::TrustedPeer`] carries.
pub(crate) fn peer_from_extension(ext: &Extensions) -> Option<IpAddr> {
    peer_addr(ext).map(|a| a.ip())
}

/// The peer's socket address: the [`PeerAddr`] extension, else the one a
/// [`crate::TrustedPeer`] carries ([`crate::TrustedPeer::with_addr`]).
pub fn peer_addr(ext: &Extensions) -> Option<SocketAddr> {
    ext.get::<PeerAddr>()
        .map(|p| p.0)
        .or_else(|| ext.get::<crate::TrustedPeer>()?.addr())
}

/// A request whose bearer token does not verify: answered 401, after `rest` (the matched
/// policies that do not count clients by a claim, such as a per-IP one) is charged, so a
/// flood of forged tokens is limited like any other traffic.
pub(crate) struct Unverified {
    pub(crate) why: InvalidToken,
    pub(crate) rest: Option<Plan>,
}

pub(crate) struct Shared {
    pub(crate) limiter: Limiter,
    pub(crate) hasher: IdentityHasher,
    pub(crate) identity: IdentityConfig,
    pub(crate) policies: Vec<RoutedPolicy>,
    pub(crate) forward_auth: Option<ForwardAuth>,
    pub(crate) allow_ambiguous_paths: bool,
    /// Every header an identity source reads (a request with two of one is refused).
    pub(crate) identity_headers: Vec<HeaderName>,
    /// The real-cost header (`cost_from_response`) of each policy that settles, by id.
    pub(crate) settle_headers: std::sync::Arc<std::collections::HashMap<u64, HeaderName>>,
    /// Whether a policy reads its estimate from a request header (`cost_from_request`).
    pub(crate) reads_costs: bool,
    pub(crate) peer: PeerFn,
}

/// The identities a request resolved, by identity source list: on the stack for the few
/// lists a request's policies use (most use one).
type Keys<'a> = smallvec::SmallVec<[(Option<&'a [IdentitySource]>, ClientKey); 2]>;

impl Shared {
    /// Matches policies on `method` and the normalised `path` (see `Shared::resolve`) and
    /// resolves identities (each distinct identity source list once): the request's plan,
    /// `None` when no policy matches. The bearer token is verified only when a matched policy
    /// reads a JWT claim (identity or tier), and at most once; a present token that does not
    /// verify refuses the request (401) with the plan of the policies that can count it
    /// without the token ([`Unverified`]).
    pub(crate) fn plan(
        &self,
        target: &Target,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Result<Option<Plan>, Box<Unverified>> {
        let Target {
            method,
            path,
            trusted,
            identity_values,
        } = target;
        let get = self.identity_lookup(identity_values, headers);
        let (path, trusted) = (&**path, *trusted);
        let mut keys: Keys<'_> = Keys::new();
        let mut plan = Plan::new();
        // `None` until a policy needs the claims; then the verified claims, if any.
        let mut claims: Option<Option<Claims>> = None;
        let mut refused: Option<InvalidToken> = None;
        for routed in self.policies.iter().filter(|p| p.matches(method, path)) {
            if claims.is_none() && refused.is_none() && routed.reads_jwt(&self.identity.sources) {
                match self.claims(headers) {
                    Ok(c) => claims = Some(c),
                    Err(e) => refused = Some(e),
                }
            }
            if refused.is_some() && routed.keyed_by_jwt(&self.identity.sources) {
                continue;
            }
            let verified = claims.as_ref().and_then(Option::as_ref);
            let sources = routed.identity_sources();
            let key = match keys.iter().find(|k| k.0 == sources) {
                Some(k) => k.1,
                None => {
                    let key = self.identity.client_key_by(
                        &self.hasher,
                        sources,
                        peer,
                        headers,
                        verified,
                        get,
                    );
                    keys.push((sources, key));
                    key
                }
            };
            let tier = TierInput {
                headers,
                claims: verified,
                trusted,
            };
            let policy = routed.policy_for(&key, &tier);
            // The estimate a request asks for (checked against cost_max in `check_costs`).
            match routed.cost_sources().estimate(headers) {
                Ok(Some(cost)) => plan.push(key, policy.with_cost(cost)),
                _ => plan.push(key, policy.clone()),
            }
        }
        let plan = (!plan.is_empty()).then_some(plan);
        match refused {
            // Boxed: rare, and a plan (two pairs inline) is large to carry in every result.
            Some(why) => Err(Box::new(Unverified { why, rest: plan })),
            None => Ok(plan),
        }
    }

    /// Before a bearer token's signature is checked (tens to hundreds of microseconds for
    /// RS256 and ES256): the deny cache's answer for the matched policies that do not read
    /// the token at all (neither identity nor tier), such as a per-IP one. When they deny the
    /// request, it is denied whatever the token holds, so a flood of forged tokens past its
    /// per-IP limit costs a cache lookup, not a signature check each. `None` without a token,
    /// without a policy that reads one, or when nothing denies locally.
    pub(crate) fn denied_before_token(
        &self,
        target: &Target,
        headers: &HeaderMap,
        peer: Option<IpAddr>,
    ) -> Option<LimitResult> {
        let jwt = self.identity.jwt.as_ref()?;
        if !headers.contains_key(jwt.header_name()) {
            return None;
        }
        let (method, path) = (&target.method, &*target.path);
        let defaults = &self.identity.sources;
        let matched = || self.policies.iter().filter(|p| p.matches(method, path));
        if !matched().any(|p| p.reads_jwt(defaults)) {
            return None;
        }
        let mut keys: Keys<'_> = Keys::new();
        let mut plan = Plan::new();
        for routed in matched().filter(|p| !p.reads_jwt(defaults)) {
            let sources = routed.identity_sources();
            let key = match keys.iter().find(|k| k.0 == sources) {
                Some(k) => k.1,
                None => {
                    let key = self.identity.client_key_by(
                        &self.hasher,
                        sources,
                        peer,
                        headers,
                        None,
                        self.identity_lookup(&target.identity_values, headers),
                    );
                    keys.push((sources, key));
                    key
                }
            };
            let tier = TierInput {
                headers,
                claims: None,
                trusted: target.trusted,
            };
            plan.push(key, routed.policy_for(&key, &tier).clone());
        }
        if plan.is_empty() {
            return None;
        }
        self.limiter.denied_locally(&plan)
    }

    /// The claims of the request's bearer token when `[identity.jwt]` is configured and a
    /// token is present; a present token that does not verify is refused (401, no store call).
    fn claims(&self, headers: &HeaderMap) -> Result<Option<Claims>, InvalidToken> {
        match &self.identity.jwt {
            None => Ok(None),
            Some(v) => v.verify(headers).transpose(),
        }
    }

    /// Refuses (400) a request that asks a matched policy for a larger estimate than its
    /// `cost_max` (`cost_from_request`).
    pub(crate) fn check_costs(
        &self,
        target: &Target,
        headers: &HeaderMap,
    ) -> Result<(), BadRequest> {
        // No policy reads a cost from the request (the common configuration): nothing to
        // check, and no second walk of the policies' routes a request (95 instructions).
        if !self.reads_costs {
            return Ok(());
        }
        let (method, path) = (&target.method, &*target.path);
        for routed in self.policies.iter().filter(|p| p.matches(method, path)) {
            if let Err(max) = routed.cost_sources().estimate(headers) {
                let name = routed
                    .cost_sources()
                    .from_request
                    .as_ref()
                    .map_or("", HeaderName::as_str);
                return Err(BadRequest(format!(
                    "the {name} header asks policy {:?} for more than its cost_max ({max})",
                    routed.policy().name()
                )));
            }
        }
        Ok(())
    }

    /// Whether a plan holds something to settle or release after the response.
    pub(crate) fn reserves(plan: &Plan) -> bool {
        plan.iter().any(|(_, p)| p.settles() || p.is_concurrency())
    }

    /// Decides a plan as [`Shared::check_in`] does, and reserves what its settling and
    /// concurrency policies hold (see `tollgate::Limiter::reserve`), inside `span` (made by
    /// [`Shared::span`] while the request was at hand).
    pub(crate) async fn reserve_in(
        &self,
        plan: &Plan,
        span: tracing::Span,
    ) -> (LimitResult, Option<tollgate::Reservation>) {
        let (result, reservation) = self.limiter.reserve(plan).instrument(span.clone()).await;
        tollgate::trace::record_decision(&span, plan, &result);
        (result, reservation)
    }

    /// Decides a plan: every matched policy, under every identity, in one limiter call
    /// (all-or-nothing), inside the decision's span (see `tollgate::trace`).
    pub(crate) async fn check(&self, plan: &Plan, headers: &HeaderMap) -> LimitResult {
        self.check_in(plan, Self::span(headers)).await
    }

    /// An identity header's value as `resolve` found it checking it for repeats
    /// (`found`, in the order of `identity_headers`): no second lookup; any other header's
    /// from `headers`.
    fn identity_lookup<'r>(
        &'r self,
        found: &'r [Option<&'r HeaderValue>],
        headers: &'r HeaderMap,
    ) -> impl Fn(&HeaderName) -> Option<&'r HeaderValue> + Copy + 'r {
        move |name| match self.identity_headers.iter().position(|n| n == name) {
            Some(i) => found.get(i).copied().flatten(),
            None => headers.get(name),
        }
    }

    /// [`Shared::check_in`] answered at once where it waits for nothing (see
    /// `Limiter::check_now`); `None` where it would wait.
    pub(crate) fn check_now(&self, plan: &Plan, span: &tracing::Span) -> Option<LimitResult> {
        let result = span.in_scope(|| self.limiter.check_now(plan))?;
        tollgate::trace::record_decision(span, plan, &result);
        Some(result)
    }

    /// [`Shared::check`] inside `span`.
    pub(crate) async fn check_in(&self, plan: &Plan, span: tracing::Span) -> LimitResult {
        let result = self.limiter.check(plan).instrument(span.clone()).await;
        tollgate::trace::record_decision(&span, plan, &result);
        result
    }

    /// The decision's span, under the trace context the request carries (`traceparent`).
    pub(crate) fn span(headers: &HeaderMap) -> tracing::Span {
        tollgate::trace::decision_span(|| headers.get("traceparent").and_then(|v| v.to_str().ok()))
    }

    /// The request's target, or why it is refused.
    pub(crate) fn resolve<'r>(
        &self,
        method: &Method,
        uri: &'r Uri,
        headers: &'r HeaderMap,
        peer: Option<IpAddr>,
        decided: Option<&crate::TrustedPeer>,
    ) -> Result<Target<'r>, BadRequest> {
        let identity_values = self
            .identity_headers
            .iter()
            .map(|name| single(headers, name))
            .collect::<Result<_, _>>()?;
        // Decided once for the connection by the server when it is still the same trust
        // list; else (another server, or a reload since) judged here.
        let trusted = decided
            .and_then(|d| d.under(&self.identity.trust))
            .unwrap_or_else(|| self.trusted(peer));
        if let (Some(fa), true) = (&self.forward_auth, trusted) {
            if let Some((method, path)) = original_request(fa, headers)? {
                return Ok(Target {
                    method,
                    path: self.normalize(path)?,
                    trusted,
                    identity_values,
                });
            }
        }
        Ok(Target {
            method: method.clone(),
            path: self.normalize(uri.path())?,
            trusted,
            identity_values,
        })
    }

    /// Whether `peer` is a trusted proxy.
    pub(crate) fn trusted(&self, peer: Option<IpAddr>) -> bool {
        peer.is_some_and(|ip| self.identity.trust.is_trusted(ip))
    }

    fn normalize<'a>(&self, path: &'a str) -> Result<std::borrow::Cow<'a, str>, BadRequest> {
        if self.allow_ambiguous_paths {
            Ok(std::borrow::Cow::Owned(normalize_path(path)))
        } else {
            normalize_strict_borrowed(path).map_err(|e| BadRequest(e.to_string()))
        }
    }
}

/// The real-cost header of every policy of `s` that settles, by policy id.
pub(crate) fn settle_headers(s: &Shared) -> std::collections::HashMap<u64, HeaderName> {
    let mut out = std::collections::HashMap::new();
    for routed in &s.policies {
        if let Some(name) = &routed.cost_sources().from_response {
            for p in routed.all_policies() {
                out.insert(p.id(), name.clone());
            }
        }
    }
    out
}

/// The headers the identity sources of `s` read.
pub(crate) fn identity_headers(s: &Shared) -> Vec<HeaderName> {
    let policy_sources = s.policies.iter().filter_map(|p| p.identity_sources());
    let mut names: Vec<HeaderName> = Vec::new();
    if let Some(jwt) = &s.identity.jwt {
        names.push(jwt.header_name().clone());
    }
    for source in std::iter::once(s.identity.sources.as_slice())
        .chain(policy_sources)
        .flatten()
    {
        if let IdentitySource::Header(h) = source {
            if !names.contains(h) {
                names.push(h.clone());
            }
        }
    }
    names
}
