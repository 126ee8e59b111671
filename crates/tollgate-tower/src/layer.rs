//! The layer is the configuration: the limiter, the identity rules and the routed policies,
//! shared by every service it wraps.

use crate::identity::IdentityConfig;
use crate::jwt::InvalidToken;
use crate::route::RoutedPolicy;
use crate::service::RateLimit;
use crate::shared::{identity_headers, peer_from_extension, settle_headers, PeerFn, Shared};
use crate::target::{BadRequest, ForwardAuth};
use http::Request;
use std::sync::Arc;
use tollgate::{IdentityHasher, LimitResult, Limiter};
use tower_layer::Layer;

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
            .field("allow_ambiguous_paths", &self.shared.allow_ambiguous_paths)
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
                forward_auth: None,
                allow_ambiguous_paths: false,
                identity_headers: Vec::new(),
                settle_headers: Arc::default(),
                reads_costs: false,
                peer: peer_from_extension,
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Shared)) -> Self {
        let f = |s: &mut Shared| {
            f(s);
            s.identity_headers = identity_headers(s);
            s.settle_headers = Arc::new(settle_headers(s));
            s.reads_costs = s
                .policies
                .iter()
                .any(|p| p.cost_sources().from_request.is_some());
        };
        match Arc::get_mut(&mut self.shared) {
            Some(s) => f(s),
            None => {
                let s = &*self.shared;
                let mut copy = Shared {
                    limiter: s.limiter.clone(),
                    hasher: s.hasher.clone(),
                    identity: s.identity.clone(),
                    policies: s.policies.clone(),
                    forward_auth: s.forward_auth.clone(),
                    allow_ambiguous_paths: s.allow_ambiguous_paths,
                    identity_headers: s.identity_headers.clone(),
                    settle_headers: Arc::clone(&s.settle_headers),
                    reads_costs: s.reads_costs,
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
    /// its [`ForwardAuth`] headers name (and on nothing else: no other header is read).
    pub fn forward_auth(self, headers: Option<ForwardAuth>) -> Self {
        self.edit(|s| s.forward_auth = headers)
    }

    /// Match ambiguous paths (encoded `/`, `;` parameters, ...; see [`crate::path`]) in
    /// their normalised form instead of refusing them with 400.
    pub fn allow_ambiguous_paths(self, allow: bool) -> Self {
        self.edit(|s| s.allow_ambiguous_paths = allow)
    }

    /// Reads the peer address with `f` instead of from the [`PeerAddr`](crate::PeerAddr)
    /// extension.
    pub fn peer_addr_with(self, f: PeerFn) -> Self {
        self.edit(|s| s.peer = f)
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter {
        &self.shared.limiter
    }

    /// Decides `req` without forwarding it: `Ok(None)` when no policy matches, an error
    /// when the request is one to refuse (400, or 401 for an invalid token).
    pub async fn check_request<B>(&self, req: &Request<B>) -> Result<Option<LimitResult>, Refused> {
        let peer = (self.shared.peer)(req.extensions());
        let target = self.shared.resolve(
            req.method(),
            req.uri(),
            req.headers(),
            peer,
            req.extensions().get::<crate::TrustedPeer>(),
        )?;
        self.shared.check_costs(&target, req.headers())?;
        let plan = match self.shared.plan(&target, req.headers(), peer) {
            Ok(Some(plan)) => plan,
            Ok(None) => return Ok(None),
            Err(u) => {
                // Charged to what can count it; limited like any request, else refused.
                if let Some(rest) = &u.rest {
                    let result = self.shared.check(rest, req.headers()).await;
                    if matches!(result.action, tollgate::Action::Limit { .. }) {
                        return Ok(Some(result));
                    }
                }
                return Err(Refused::InvalidToken(u.why));
            }
        };
        Ok(Some(self.shared.check(&plan, req.headers()).await))
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.shared.clone())
    }
}

/// Why [`RateLimitLayer::check_request`] refuses a request before deciding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// 400: the request could be read two ways.
    BadRequest(BadRequest),
    /// 401: a bearer token is present and does not verify.
    InvalidToken(InvalidToken),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::BadRequest(e) => f.write_str(&e.0),
            Refused::InvalidToken(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Refused {}

impl From<BadRequest> for Refused {
    fn from(e: BadRequest) -> Self {
        Refused::BadRequest(e)
    }
}

impl From<InvalidToken> for Refused {
    fn from(e: InvalidToken) -> Self {
        Refused::InvalidToken(e)
    }
}
