//! The reverse proxy: the request goes upstream as it came, streamed both ways, minus the
//! hop-by-hop headers (RFC 9110 section 7.6.1), with the forwarding headers
//! (`X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host`, `Forwarded`, `X-Real-IP`)
//! written by us: a client's own copies are dropped unless it is a trusted proxy, whose
//! copies are extended. The upstream believes these headers, so a client must not write them.
//! Upstream connections are pooled. An upstream that cannot be reached is a 502, one that
//! does not answer within `upstream_timeout` a 504; a client whose body is malformed is a
//! 400 and one whose body takes longer than `body_timeout` a 408, neither counted as an
//! upstream error. The client is never left hanging and never sees a 500.

use crate::config::Upstream;
use crate::http::client_body::{BodyFault, ClientBody};
use crate::http::metrics::{HttpMetrics, UpstreamError};
use crate::http::util::{problem_response, status_response, BoxBody};
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONNECTION, HOST};
use http::uri::PathAndQuery;
use http::{HeaderMap, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tollgate_tower::{PeerAddr, Problem, ProblemKind, Trust};
use tower_service::Service;

/// Headers that describe one connection, never forwarded (plus those `Connection` names).
/// `Upgrade` is hop-by-hop too; protocol upgrades are not proxied.
static HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    http::header::UPGRADE,
];

/// The forwarding headers a client names itself in (dropped unless it is a trusted proxy).
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
static FORWARDING: [&HeaderName; 5] = [
    &X_FORWARDED_FOR,
    &X_FORWARDED_PROTO,
    &X_FORWARDED_HOST,
    &http::header::FORWARDED,
    &X_REAL_IP,
];

/// A pooled HTTP/1 client for one upstream.
#[derive(Clone)]
pub struct Proxy {
    client: Client<HttpConnector, ClientBody>,
    upstream: Arc<Upstream>,
    timeout: Duration,
    body_timeout: Duration,
    trusted: Trust,
    metrics: Arc<HttpMetrics>,
}

/// The proxy's settings beside the upstream itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyLimits {
    /// How long to wait for the upstream's response headers.
    pub timeout: Duration,
    /// The most time a request body may take to arrive.
    pub body_timeout: Duration,
    /// Peers whose forwarding headers are extended rather than replaced.
    pub trusted: Trust,
}

impl Proxy {
    /// A proxy to `upstream`.
    pub fn new(upstream: Upstream, limits: ProxyLimits, metrics: Arc<HttpMetrics>) -> Self {
        let timeout = limits.timeout;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .build(connector);
        Self {
            client,
            upstream: Arc::new(upstream),
            timeout,
            body_timeout: limits.body_timeout,
            trusted: limits.trusted,
            metrics,
        }
    }

    /// Forwards `req` from `peer` and returns the upstream's response (or 502 / 504).
    pub async fn forward(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<BoxBody> {
        let (mut parts, body) = req.into_parts();
        let Some(uri) = self.upstream_uri(&parts.uri) else {
            return problem_response(
                Problem::new(ProblemKind::BadRequest).detail("malformed request target"),
            );
        };
        let host = parts.headers.get(HOST).cloned();
        strip_hop_by_hop(&mut parts.headers);
        let ip = tollgate_tower::forwarded::canonical(peer.ip());
        // The peer's address as header text, written once for the headers that carry it.
        let ip_text = Bytes::from(ip.to_string());
        let trusted = parts
            .extensions
            .get::<tollgate_tower::TrustedPeer>()
            .and_then(|d| d.under(&self.trusted))
            .unwrap_or_else(|| self.trusted.is_trusted(ip));
        if !trusted {
            drop_forwarding(&mut parts.headers, &ip_text);
        }
        add_forwarding(&mut parts.headers, ip, &ip_text, host.as_ref());
        parts.uri = uri;
        parts.version = http::Version::HTTP_11;
        let (body, fault) = ClientBody::new(body, self.body_timeout);
        let req = Request::from_parts(parts, body);
        let answer = tokio::time::timeout(self.timeout, self.client.request(req)).await;
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
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, body.map_err(Into::into).boxed())
            }
            Ok(Err(e)) => {
                let kind = if e.is_connect() {
                    UpstreamError::Connect
                } else {
                    UpstreamError::Response
                };
                self.metrics.upstream_error(kind);
                tracing::warn!(error = %e, kind = kind.as_str(), "upstream request failed");
                problem_response(
                    Problem::new(ProblemKind::UpstreamUnavailable)
                        .detail("the upstream could not be reached or broke off its answer"),
                )
            }
            Err(_) => {
                self.metrics.upstream_error(UpstreamError::Timeout);
                tracing::warn!(timeout = ?self.timeout, "upstream timed out");
                problem_response(
                    Problem::new(ProblemKind::UpstreamTimeout)
                        .detail("the upstream did not answer within upstream_timeout"),
                )
            }
        }
    }
}

impl Proxy {
    /// The upstream's URI for a request to `uri`: the upstream's authority, its base path,
    /// then the request's path and query (`/` when it has none). Without a base path the
    /// request's already parsed path is reused as it is.
    fn upstream_uri(&self, uri: &Uri) -> Option<Uri> {
        let path_and_query = match (self.upstream.base_path.as_str(), uri.path_and_query()) {
            ("", Some(pq)) => pq.clone(),
            ("", None) => PathAndQuery::from_static("/"),
            (base, pq) => {
                let pq = pq.map_or("/", PathAndQuery::as_str);
                let mut joined = String::with_capacity(base.len() + pq.len());
                joined.push_str(base);
                joined.push_str(pq);
                PathAndQuery::from_maybe_shared(Bytes::from(joined)).ok()?
            }
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        parts.authority = Some(self.upstream.authority.clone());
        parts.path_and_query = Some(path_and_query);
        Uri::from_parts(parts).ok()
    }
}

/// Removes hop-by-hop headers, including every header `Connection` lists. Most requests
/// carry none: one pass over the names finds that without a lookup per hop-by-hop name.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Replaces what an untrusted client wrote in the forwarding headers: the headers that name
/// the client are dropped, and `X-Real-IP` is the peer (`peer`: its address as text).
fn drop_forwarding(headers: &mut HeaderMap, peer: &Bytes) {
    if headers.keys().any(|k| FORWARDING.contains(&k)) {
        for name in FORWARDING {
            headers.remove(name);
        }
    }
    if let Ok(v) = HeaderValue::from_maybe_shared(peer.clone()) {
        headers.insert(X_REAL_IP.clone(), v);
    }
}

/// Appends the peer to `X-Forwarded-For` and `Forwarded`, and sets `X-Forwarded-Proto` and
/// `X-Forwarded-Host` when absent (a trusted proxy's values are kept). `peer_text` is the
/// peer's address as text.
fn add_forwarding(
    headers: &mut HeaderMap,
    peer: IpAddr,
    peer_text: &Bytes,
    host: Option<&HeaderValue>,
) {
    let mut prior = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .peekable();
    let xff = if prior.peek().is_none() {
        HeaderValue::from_maybe_shared(peer_text.clone())
    } else {
        let mut xff = String::new();
        for v in prior {
            xff.push_str(v);
            xff.push_str(", ");
        }
        xff.push_str(&String::from_utf8_lossy(peer_text));
        HeaderValue::from_maybe_shared(Bytes::from(xff))
    };
    if let Ok(v) = xff {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
    let mut element = String::with_capacity(64);
    element.push_str("for=");
    match peer {
        IpAddr::V4(_) => element.push_str(&String::from_utf8_lossy(peer_text)),
        IpAddr::V6(v6) => {
            let _ = write!(element, "\"[{v6}]\"");
        }
    }
    element.push_str(";proto=http");
    if let Some(h) = host.and_then(|h| h.to_str().ok()) {
        if !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        {
            element.push_str(";host=\"");
            element.push_str(h);
            element.push('"');
        }
    }
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(element)) {
        headers.append(http::header::FORWARDED, v);
    }
    if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
    }
    if let Some(h) = host {
        if !headers.contains_key(&X_FORWARDED_HOST) {
            headers.insert(X_FORWARDED_HOST.clone(), h.clone());
        }
    }
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
    fn the_upstream_uri_is_the_base_path_then_the_request_path_and_query() {
        let uri = |p: &Proxy, target: &str| {
            p.upstream_uri(&target.parse().expect("uri"))
                .map(|u| u.to_string())
        };
        let plain = proxy_to("");
        assert_eq!(
            uri(&plain, "/a/b?c=1&d").as_deref(),
            Some("http://127.0.0.1:8080/a/b?c=1&d")
        );
        assert_eq!(
            uri(&plain, "http://other.example/x?y").as_deref(),
            Some("http://127.0.0.1:8080/x?y")
        );
        assert_eq!(
            uri(&plain, "http://other.example").as_deref(),
            Some("http://127.0.0.1:8080/")
        );
        let based = proxy_to("/v1");
        assert_eq!(
            uri(&based, "/a?b").as_deref(),
            Some("http://127.0.0.1:8080/v1/a?b")
        );
        assert_eq!(
            uri(&based, "//a").as_deref(),
            Some("http://127.0.0.1:8080/v1//a")
        );
    }

    #[test]
    fn a_request_without_hop_by_hop_headers_keeps_all_of_them() {
        let mut h = HeaderMap::new();
        h.insert(HOST, HeaderValue::from_static("x"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        h.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(http::header::TE, HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 2);
        assert!(!h.contains_key(http::header::UPGRADE));
    }

    #[test]
    fn hop_by_hop_and_connection_listed_headers_are_removed() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("close, x-secret-hop"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-end-to-end", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-end-to-end"));
    }

    #[test]
    fn an_untrusted_client_cannot_write_forwarding_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "evil.example"),
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
        ] {
            h.insert(k, HeaderValue::from_static(v));
        }
        let peer: IpAddr = "192.0.2.7".parse().expect("ip");
        let text = Bytes::from(peer.to_string());
        drop_forwarding(&mut h, &text);
        add_forwarding(
            &mut h,
            peer,
            &text,
            Some(&HeaderValue::from_static("api.example")),
        );
        assert_eq!(h["x-forwarded-for"], "192.0.2.7");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "api.example");
        assert_eq!(
            h["forwarded"],
            "for=192.0.2.7;proto=http;host=\"api.example\""
        );
        assert_eq!(h["x-real-ip"], "192.0.2.7");
    }

    #[test]
    fn forwarding_headers_append_the_peer() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        let host = HeaderValue::from_static("example.com");
        let peer: IpAddr = "::1".parse().expect("ip");
        add_forwarding(&mut h, peer, &Bytes::from(peer.to_string()), Some(&host));
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, ::1");
        assert_eq!(
            h["forwarded"],
            "for=\"[::1]\";proto=http;host=\"example.com\""
        );
        assert_eq!(h["x-forwarded-host"], "example.com");
    }
}

/// What the rate limiter wraps: the upstream, or the decision-mode 200.
#[derive(Clone)]
pub enum Target {
    /// Behind an `Arc`: the proxy's HTTP client is large and the target is cloned per
    /// connection.
    Proxy(Arc<Proxy>),
    /// Decision mode: 200, the request goes nowhere.
    Decision,
}

impl Service<Request<Incoming>> for Target {
    type Response = Response<BoxBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<BoxBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        match self {
            Target::Proxy(p) => {
                let p = p.clone();
                let peer = req.extensions().get::<PeerAddr>().map(|a| a.0);
                Box::pin(async move {
                    let Some(peer) = peer else {
                        // The server names the peer of every request it serves, so this
                        // is tollgate's fault, never the client's: a 500.
                        return Ok(problem_response(
                            Problem::new(ProblemKind::Internal)
                                .detail("the connection's peer address is unknown"),
                        ));
                    };
                    Ok(p.forward(req, peer).await)
                })
            }
            Target::Decision => Box::pin(async { Ok(status_response(http::StatusCode::OK, "")) }),
        }
    }
}
