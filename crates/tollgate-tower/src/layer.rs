//! The layer is the configuration: the limiter, the identity rules and the routed policies,
//! shared by every service it wraps.

use crate::identity::{IdentityConfig, IdentitySource};
use crate::route::{normalize_path, RoutedPolicy};
use crate::service::RateLimit;
use http::{Extensions, HeaderMap, Method, Request};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use tollgate::{ClientKey, IdentityHasher, LimitResult, Limiter, Plan};
use tower_layer::Layer;

/// The socket peer of a request, put into its extensions by the server (the gateway does;
/// an axum app can use [`RateLimitLayer::peer_addr_with`] to read `ConnectInfo` instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Reads the peer address from a request's extensions.
pub type PeerFn = fn(&Extensions) -> Option<IpAddr>;

fn peer_from_extension(ext: &Extensions) -> Option<IpAddr> {
    ext.get::<PeerAddr>().map(|p| p.0.ip())
}

pub(crate) struct Shared {
    pub(crate) limiter: Limiter,
    pub(crate) hasher: IdentityHasher,
    pub(crate) identity: IdentityConfig,
    pub(crate) policies: Vec<RoutedPolicy>,
    pub(crate) forward_auth: bool,
    pub(crate) peer: PeerFn,
}

impl Shared {
    /// Matches policies and resolves identities (each distinct identity source list once):
    /// the request's plan, `None` when no policy matches.
    pub(crate) fn plan(
        &self,
        method: &Method,
        target: &str,
        headers: &HeaderMap,
        ext: &Extensions,
    ) -> Option<Plan> {
        let peer = (self.peer)(ext);
        let trusted_peer = peer.is_some_and(|ip| {
            crate::forwarded::is_trusted(
                crate::forwarded::canonical(ip),
                &self.identity.trusted_proxies,
            )
        });
        let (method, path) = if self.forward_auth && trusted_peer {
            original_request(headers).unwrap_or_else(|| (method.clone(), normalize_path(target)))
        } else {
            (method.clone(), normalize_path(target))
        };
        let mut keys: Vec<(Option<&[IdentitySource]>, ClientKey)> = Vec::new();
        let mut plan = Plan::new();
        for routed in self.policies.iter().filter(|p| p.matches(&method, &path)) {
            let sources = routed.identity_sources();
            let key = match keys.iter().find(|k| k.0 == sources) {
                Some(k) => k.1,
                None => {
                    let key = self
                        .identity
                        .client_key(&self.hasher, sources, peer, headers);
                    keys.push((sources, key));
                    key
                }
            };
            plan.push(key, routed.policy().clone());
        }
        (!plan.is_empty()).then_some(plan)
    }

    /// Decides a plan: every matched policy, under every identity, in one limiter call
    /// (all-or-nothing).
    pub(crate) async fn check(&self, plan: &Plan) -> LimitResult {
        self.limiter.check(plan).await
    }
}

/// Method and normalised path of the original request named by a forward-auth proxy.
fn original_request(headers: &HeaderMap) -> Option<(Method, String)> {
    let uri = headers
        .get("x-forwarded-uri")
        .or_else(|| headers.get("x-original-uri"))?
        .to_str()
        .ok()?;
    let method = match headers.get("x-forwarded-method") {
        Some(m) => Method::from_bytes(m.as_bytes()).ok()?,
        None => Method::GET,
    };
    Some((method, normalize_path(uri)))
}

/// A tower [`Layer`] that rate-limits requests with a [`Limiter`]. Services it produces are
/// always ready: a limited request is answered with 429 in `call`, never queued.
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("identity", &self.shared.identity)
            .field("policies", &self.shared.policies)
            .field("forward_auth", &self.shared.forward_auth)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A layer with no policies (add them with [`RateLimitLayer::policy`]), identifying
    /// clients by IP; identities are hashed with `hasher`.
    pub fn new(limiter: Limiter, hasher: IdentityHasher) -> Self {
        Self {
            shared: Arc::new(Shared {
                limiter,
                hasher,
                identity: IdentityConfig::default(),
                policies: Vec::new(),
                forward_auth: false,
                peer: peer_from_extension,
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Shared)) -> Self {
        match Arc::get_mut(&mut self.shared) {
            Some(s) => f(s),
            None => {
                let s = &*self.shared;
                let mut copy = Shared {
                    limiter: s.limiter.clone(),
                    hasher: s.hasher.clone(),
                    identity: s.identity.clone(),
                    policies: s.policies.clone(),
                    forward_auth: s.forward_auth,
                    peer: s.peer,
                };
                f(&mut copy);
                self.shared = Arc::new(copy);
            }
        }
        self
    }

    /// How clients are identified (default: by IP, no trusted proxies, IPv6 /64).
    pub fn identity(self, identity: IdentityConfig) -> Self {
        self.edit(|s| s.identity = identity)
    }

    /// Adds a policy.
    pub fn policy(self, policy: RoutedPolicy) -> Self {
        self.edit(|s| s.policies.push(policy))
    }

    /// Forward-auth mode: when the peer is a trusted proxy, match policies on the request
    /// named by `X-Forwarded-Method` and `X-Forwarded-Uri` (or `X-Original-URI`).
    pub fn forward_auth(self, enabled: bool) -> Self {
        self.edit(|s| s.forward_auth = enabled)
    }

    /// Reads the peer address with `f` instead of from the [`PeerAddr`] extension.
    pub fn peer_addr_with(self, f: PeerFn) -> Self {
        self.edit(|s| s.peer = f)
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter {
        &self.shared.limiter
    }

    /// Decides `req` without forwarding it: `None` when no policy matches.
    pub async fn check_request<B>(&self, req: &Request<B>) -> Option<LimitResult> {
        let plan = self.shared.plan(
            req.method(),
            &target_of(req.uri()),
            req.headers(),
            req.extensions(),
        )?;
        Some(self.shared.check(&plan).await)
    }
}

pub(crate) fn target_of(uri: &http::Uri) -> String {
    uri.path().to_string()
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.shared.clone())
    }
}
