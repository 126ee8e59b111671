//! The reverse proxy: the request goes upstream as it came, streamed both ways, minus the
//! hop-by-hop headers, with the forwarding headers written by us (see `headers`).
//! Upstream connections are HTTP/1.1 connections of the gateway's own (`h1` writes and reads
//! the messages as hyper's client did), driven by the downstream connection's own task and
//! kept in a small pool per worker (see `pool`). An upstream that
//! cannot be reached is a 502, one that does not answer within `upstream_timeout` a 504; a
//! client whose body is malformed is a 400 and one whose body takes longer than
//! `body_timeout` a 408, neither counted as an upstream error. The client is never left
//! hanging and never sees a 500.

mod decision_head;
mod h1;
mod headers;
mod pool;

use crate::config::Upstream;
use crate::http::client_body::{BodyFault, ClientBody};
use crate::http::metrics::{HttpMetrics, UpstreamError};
use crate::http::util::{problem_response, status_response_full, BoxBody};
use bytes::Bytes;
use headers::{strip_hop_by_hop, write_forwarding};
use http::header::{HeaderValue, HOST};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use pool::{Failure, Pool};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tollgate_tower::{CallFrom, Problem, ProblemKind, Trust, TrustedPeer};
use tower_service::Service;

pub use pool::{IDLE_TIMEOUT, MAX_IDLE_PER_WORKER};

/// The reverse proxy to one upstream, with its connections.
pub struct Proxy {
    pool: Arc<Pool<ClientBody>>,
    upstream: Upstream,
    /// The `Host` of a request that came without one (HTTP/1.0): the upstream's authority.
    host: HeaderValue,
    timeout: Duration,
    body_timeout: Duration,
    trusted: Trust,
    metrics: Arc<HttpMetrics>,
}

/// The proxy's settings beside the upstream itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyLimits {
    /// How long to wait for the upstream's response headers (connecting included).
    pub timeout: Duration,
    /// The most time a request body may take to arrive.
    pub body_timeout: Duration,
    /// Peers whose forwarding headers are extended rather than replaced.
    pub trusted: Trust,
}

impl Proxy {
    /// A proxy to `upstream`, keeping at most [`MAX_IDLE_PER_WORKER`] idle connections per
    /// worker thread.
    pub fn new(upstream: Upstream, limits: ProxyLimits, metrics: Arc<HttpMetrics>) -> Self {
        let workers = crate::runtime::usable_cpus().get();
        let pool = Pool::new(&upstream.authority, workers, MAX_IDLE_PER_WORKER);
        let host = HeaderValue::from_str(upstream.authority.as_str())
            .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        Self {
            pool,
            upstream,
            host,
            timeout: limits.timeout,
            body_timeout: limits.body_timeout,
            trusted: limits.trusted,
            metrics,
        }
    }

    /// Makes `req` from `peer` ready for the upstream, at once (no future holds the request:
    /// see [`Target::answer`]): its hop-by-hop headers dropped, its forwarding headers
    /// written, its target in origin form, its body under `body_timeout`. A target that
    /// names no path is its 400.
    ///
    /// `trusted`: whether `peer` is a trusted proxy, as the server that accepted its
    /// connection decided under this proxy's trust list (`None`: decide it here).
    fn prepare(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        trusted: Option<bool>,
    ) -> Result<Ready, Box<Response<BoxBody>>> {
        let (mut parts, body) = req.into_parts();
        let Some(path) = self.upstream_path(&parts.uri) else {
            return Err(Box::new(problem_response(
                Problem::new(ProblemKind::BadRequest).detail("malformed request target"),
            )));
        };
        let host = parts.headers.get(HOST).cloned();
        strip_hop_by_hop(&mut parts.headers);
        let ip = tollgate_tower::forwarded::canonical(peer.ip());
        let trusted = trusted.unwrap_or_else(|| self.trusted.is_trusted(ip));
        // The fields the proxy writes go as lines after the request's own, not through its map
        // (see `headers::write_forwarding`).
        let mut fields = Vec::with_capacity(192);
        write_forwarding(&mut parts.headers, ip, host.as_ref(), trusted, &mut fields);
        // The gateway reads trailers (a real cost sent after the body, `cost_from_response`),
        // which an HTTP/1.1 upstream sends only to a client that says it takes them (the
        // client's own `TE` is hop-by-hop, removed above).
        fields.extend_from_slice(b"te: trailers\r\n");
        if host.is_none() {
            parts.headers.insert(HOST, self.host.clone());
        }
        // Origin form: the connection is to the upstream itself.
        parts.uri = Uri::from(path);
        parts.version = http::Version::HTTP_11;
        let now = tokio::time::Instant::now();
        let (body, fault) = ClientBody::new(body, now + self.body_timeout);
        Ok(Ready {
            fields,
            // Boxed once: the request goes down through the pool's future into the
            // connection's and hyper's, each of which would otherwise hold a copy of it
            // (about 300 bytes) for its whole life and copy it in (see `pool::Pool::send`).
            req: Box::new(Request::from_parts(parts, body)),
            fault,
            deadline: now + self.timeout,
        })
    }

    /// Sends a request made ready ([`Proxy::prepare`]) and returns the upstream's response
    /// (or 400 / 408 for the client's body, 502 / 504 for the upstream). Of the service's
    /// type, so that it is boxed as it is (a future awaiting it would hold it twice).
    async fn send(self: Arc<Self>, ready: Ready) -> Result<Response<BoxBody>, Infallible> {
        let Ready {
            req,
            fields,
            fault,
            deadline,
        } = ready;
        let answer = self.pool.send(req, fields, deadline).await;
        Ok(self.answered(answer, &fault))
    }

    /// What the client gets for the upstream's `answer`, its own body's `fault` first.
    fn answered(
        &self,
        answer: Result<Response<pool::UpstreamBody<ClientBody>>, Failure>,
        fault: &crate::http::client_body::FaultSlot,
    ) -> Response<BoxBody> {
        match fault.get() {
            Some(BodyFault::Broken) => {
                return problem_response(
                    Problem::new(ProblemKind::BadRequest).detail("malformed request body"),
                )
            }
            Some(BodyFault::Timeout) => {
                return problem_response(
                    Problem::new(ProblemKind::RequestTimeout)
                        .detail("the request body did not arrive within body_timeout"),
                )
            }
            None => {}
        }
        match answer {
            // The pool leaves the hop-by-hop fields out as it reads the head (`h1.rs`).
            Ok(resp) => resp.map(BodyExt::boxed),
            Err(Failure::Timeout) => {
                self.metrics.upstream_error(UpstreamError::Timeout);
                tracing::warn!(timeout = ?self.timeout, "upstream timed out");
                problem_response(
                    Problem::new(ProblemKind::UpstreamTimeout)
                        .detail("the upstream did not answer within upstream_timeout"),
                )
            }
            Err(Failure::Connect(e)) => self.unavailable(UpstreamError::Connect, &e),
            Err(Failure::Exchange(e)) => self.unavailable(UpstreamError::Response, &e),
        }
    }

    /// The 502 of an upstream that could not be reached or broke off (`kind`, `error`).
    fn unavailable(&self, kind: UpstreamError, error: &dyn std::fmt::Display) -> Response<BoxBody> {
        self.metrics.upstream_error(kind);
        tracing::warn!(error = %error, kind = kind.as_str(), "upstream request failed");
        problem_response(
            Problem::new(ProblemKind::UpstreamUnavailable)
                .detail("the upstream could not be reached or broke off its answer"),
        )
    }

    /// The path and query sent upstream for a request to `uri`: the upstream's base path,
    /// then the request's path and query (`/` when it has none). Without a base path the
    /// request's already parsed path is reused as it is. `None` for a target that names no
    /// path (the asterisk form).
    fn upstream_path(&self, uri: &Uri) -> Option<PathAndQuery> {
        match (self.upstream.base_path.as_str(), uri.path_and_query()) {
            ("", Some(pq)) if pq.as_str().starts_with('/') => Some(pq.clone()),
            ("", Some(_)) => None,
            ("", None) => Some(PathAndQuery::from_static("/")),
            (base, pq) => {
                let pq = pq.map_or("/", PathAndQuery::as_str);
                let mut joined = String::with_capacity(base.len() + pq.len());
                joined.push_str(base);
                joined.push_str(pq);
                PathAndQuery::from_maybe_shared(Bytes::from(joined)).ok()
            }
        }
    }
}

/// A request made ready for the upstream ([`Proxy::prepare`]), to be sent ([`Proxy::send`]).
struct Ready {
    req: Box<Request<ClientBody>>,
    /// Header lines written after the request's own (the forwarding fields, `TE`).
    fields: Vec<u8>,
    fault: crate::http::client_body::FaultSlot,
    /// For the upstream's response head (`upstream_timeout` from when it was made ready).
    deadline: tokio::time::Instant,
}

/// An empty body of the gateway's type.
pub fn empty() -> BoxBody {
    http_body_util::Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy_to(base_path: &str) -> Proxy {
        let upstream = Upstream {
            authority: "127.0.0.1:8080".parse().expect("authority"),
            base_path: base_path.to_string(),
        };
        let limits = ProxyLimits {
            timeout: Duration::from_secs(1),
            body_timeout: Duration::from_secs(1),
            trusted: Trust::default(),
        };
        Proxy::new(upstream, limits, Arc::new(HttpMetrics::default()))
    }

    #[test]
    fn the_upstream_path_is_the_base_path_then_the_request_path_and_query() {
        let uri = |p: &Proxy, target: &str| {
            p.upstream_path(&target.parse().expect("uri"))
                .map(|u| u.to_string())
        };
        let plain = proxy_to("");
        assert_eq!(uri(&plain, "/a/b?c=1&d").as_deref(), Some("/a/b?c=1&d"));
        assert_eq!(
            uri(&plain, "http://other.example/x?y").as_deref(),
            Some("/x?y")
        );
        assert_eq!(uri(&plain, "http://other.example").as_deref(), Some("/"));
        assert_eq!(uri(&plain, "*"), None, "the asterisk form names no path");
        let based = proxy_to("/v1");
        assert_eq!(uri(&based, "/a?b").as_deref(), Some("/v1/a?b"));
        assert_eq!(uri(&based, "//a").as_deref(), Some("/v1//a"));
    }
}

/// What the rate limiter wraps: the upstream, or the decision-mode 200.
#[derive(Clone)]
pub enum Target {
    /// Behind an `Arc`: the target is cloned per connection and per request.
    Proxy(Arc<Proxy>),
    /// Decision mode: 200, the request goes nowhere.
    Decision,
}

/// Decision mode's answer: 200 for an allowed (or unmatched) request, with the `RateLimit`
/// headers when a policy matched, else the layer's own answer (400, 401, 429, 503).
pub(crate) fn decision_answer(decided: tollgate_tower::Decided) -> crate::http::util::Answer {
    use tollgate_tower::Decided;
    match decided {
        Decided::Unmatched => decision_ok().map(Either::Right),
        // Nothing to settle at the answer's end: its head from a template.
        Decided::Allowed(allowed) => match allowed.into_result() {
            Ok(result) => decision_head::allowed(&result).map(Either::Right),
            Err(allowed) => settling_ok(allowed),
        },
        Decided::Answered(resp) => (*resp).map(Either::Right),
        Decided::Limited(limited) => limited.into_response().map(Either::Right),
    }
}

/// Decision mode's answer to `decided`, as [`decision_answer`] makes it: the common 200 or
/// 429 written whole at the end of `out`, its head as hyper writes it on a connection that
/// stays open (see `http/plain.rs`), with its status; else (or when `closing`) the answer to
/// write.
pub(crate) fn write_decision(
    decided: tollgate_tower::Decided,
    out: &mut Vec<u8>,
    closing: bool,
) -> crate::http::service::Written {
    use crate::http::service::Written;
    if let tollgate_tower::Decided::Allowed(allowed) = decided {
        return match allowed.into_result() {
            Ok(result) if !closing && decision_head::write_allowed(&result, out) => {
                Written::Whole(200)
            }
            Ok(result) => Written::Answer(decision_head::allowed(&result).map(Either::Right)),
            Err(allowed) => Written::Answer(settling_ok(allowed)),
        };
    }
    if let tollgate_tower::Decided::Limited(limited) = &decided {
        let date = |out: &mut Vec<u8>| {
            out.extend_from_slice(b"date: ");
            crate::http::plain::write_date(out);
            out.extend_from_slice(b"\r\n");
        };
        if !closing && limited.write_http1(out, date) {
            return Written::Whole(429);
        }
    }
    Written::Answer(decision_answer(decided))
}

/// The 200 of a request whose reservation settles at the answer's end. The body is the
/// gateway's own (not boxed) unless it still settles then (an empty body settles at once:
/// see `Settling`).
fn settling_ok(allowed: tollgate_tower::Allowed) -> crate::http::util::Answer {
    allowed.respond(decision_ok()).map(|body| match body {
        Either::Left(settling) => match settling.into_plain() {
            Ok(full) => Either::Right(full),
            Err(settling) => {
                Either::Left(settling.map(|full| full.map_err(|never| match never {}).boxed()))
            }
        },
        Either::Right(full) => Either::Right(full),
    })
}

/// The 200 decision mode answers an allowed request with.
fn decision_ok() -> Response<Full<Bytes>> {
    status_response_full(http::StatusCode::OK, "")
}

impl Service<Request<Incoming>> for Target {
    type Response = Response<BoxBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<BoxBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let decided = req.extensions().get::<TrustedPeer>();
        let trusted = match (&*self, decided) {
            (Target::Proxy(p), Some(d)) => d.under(&p.trusted),
            _ => None,
        };
        let peer = tollgate_tower::peer_addr(req.extensions());
        self.answer(req, peer, trusted)
    }
}

impl CallFrom<Request<Incoming>> for Target {
    fn call_from(&mut self, req: Request<Incoming>, peer: &TrustedPeer) -> Self::Future {
        let trusted = match &*self {
            Target::Proxy(p) => peer.under(&p.trusted),
            Target::Decision => None,
        };
        let addr = peer
            .addr()
            .or_else(|| tollgate_tower::peer_addr(req.extensions()));
        self.answer(req, addr, trusted)
    }
}

impl Target {
    /// The answer to `req` from `peer`; `trusted`: whether the server found the peer a
    /// trusted proxy, when it decided that under the proxy's own trust list.
    fn answer(
        &self,
        req: Request<Incoming>,
        peer: Option<SocketAddr>,
        trusted: Option<bool>,
    ) -> <Self as Service<Request<Incoming>>>::Future {
        match self {
            Target::Proxy(p) => {
                let Some(peer) = peer else {
                    // The server names the peer of every request it serves, so this is
                    // tollgate's fault, never the client's: a 500.
                    let resp = problem_response(
                        Problem::new(ProblemKind::Internal)
                            .detail("the connection's peer address is unknown"),
                    );
                    return Box::pin(std::future::ready(Ok(resp)));
                };
                // The request is made ready here and the future boxed holds what the
                // exchange needs, not the request as it came: a future holds its arguments for
                // its whole life, and boxing it copies it whole (`size_of_val` in a release
                // build: 544 bytes, 1,464 with the request held as it came, 2,320 before it
                // went down boxed; see docs/benchmarks.md).
                match p.prepare(req, peer, trusted) {
                    Ok(ready) => Box::pin(Arc::clone(p).send(ready)),
                    Err(resp) => Box::pin(std::future::ready(Ok(*resp))),
                }
            }
            Target::Decision => Box::pin(async {
                Ok(decision_ok().map(|full| full.map_err(|never| match never {}).boxed()))
            }),
        }
    }
}
