//! The reverse proxy: the request goes upstream as it came, streamed both ways, minus the
//! hop-by-hop headers (RFC 9110 section 7.6.1), with the forwarding headers
//! (`X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host`, `Forwarded`, `X-Real-IP`)
//! written by us: a client's own copies are dropped unless it is a trusted proxy, whose
//! copies are extended. The upstream believes these headers, so a client must not write them.
//! Upstream connections are pooled. An upstream that cannot be reached is a 502, one that
//! does not answer within `upstream_timeout` a 504; a client whose body is malformed is a
//! 400 and one whose body takes longer than `body_timeout` a 408, neither counted as an
//! upstream error. The client is never left hanging and never sees a 500.

use crate::client_body::{BodyFault, ClientBody};
use crate::config::Upstream;
use crate::http_util::{status_response, BoxBody};
use crate::metrics::HttpMetrics;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONNECTION, HOST};
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ipnet::IpNet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Headers that describe one connection, never forwarded (plus those `Connection` names).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// A pooled HTTP/1 client for one upstream.
#[derive(Clone)]
pub struct Proxy {
    client: Client<HttpConnector, ClientBody>,
    upstream: Arc<Upstream>,
    timeout: Duration,
    body_timeout: Duration,
    trusted: Arc<[IpNet]>,
    metrics: Arc<HttpMetrics>,
}

/// The proxy's settings beside the upstream itself.
pub struct ProxyLimits {
    /// How long to wait for the upstream's response headers.
    pub timeout: Duration,
    /// The most time a request body may take to arrive.
    pub body_timeout: Duration,
    /// Peers whose forwarding headers are extended rather than replaced.
    pub trusted: Vec<IpNet>,
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
            trusted: limits.trusted.into(),
            metrics,
        }
    }

    /// Forwards `req` from `peer` and returns the upstream's response (or 502 / 504).
    pub async fn forward(&self, req: Request<Incoming>, peer: SocketAddr) -> Response<BoxBody> {
        let (mut parts, body) = req.into_parts();
        let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        let target = format!(
            "http://{}{}{}",
            self.upstream.authority, self.upstream.base_path, path_and_query
        );
        let Ok(uri) = target.parse::<Uri>() else {
            return status_response(StatusCode::BAD_REQUEST, "malformed request target\n");
        };
        let host = parts.headers.get(HOST).cloned();
        strip_hop_by_hop(&mut parts.headers);
        let ip = tollgate_tower::forwarded::canonical(peer.ip());
        if !tollgate_tower::forwarded::is_trusted(ip, &self.trusted) {
            drop_forwarding(&mut parts.headers, ip);
        }
        add_forwarding(&mut parts.headers, ip, host.as_ref());
        parts.uri = uri;
        parts.version = http::Version::HTTP_11;
        let (body, fault) = ClientBody::new(body, self.body_timeout);
        let req = Request::from_parts(parts, body);
        let answer = tokio::time::timeout(self.timeout, self.client.request(req)).await;
        match fault.get() {
            Some(BodyFault::Broken) => {
                return status_response(StatusCode::BAD_REQUEST, "malformed request body\n")
            }
            Some(BodyFault::Timeout) => {
                return status_response(
                    StatusCode::REQUEST_TIMEOUT,
                    "the request body did not arrive in time\n",
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
                    "connect"
                } else {
                    "response"
                };
                self.metrics.upstream_error(kind);
                tracing::warn!(error = %e, kind, "upstream request failed");
                status_response(StatusCode::BAD_GATEWAY, "upstream unavailable\n")
            }
            Err(_) => {
                self.metrics.upstream_error("timeout");
                tracing::warn!(timeout = ?self.timeout, "upstream timed out");
                status_response(StatusCode::GATEWAY_TIMEOUT, "upstream timed out\n")
            }
        }
    }
}

/// Removes hop-by-hop headers, including every header `Connection` lists.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
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
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    // `Upgrade` is hop-by-hop too; protocol upgrades are not proxied.
    headers.remove(http::header::UPGRADE);
}

/// Replaces what an untrusted client wrote in the forwarding headers: the headers that name
/// the client are dropped, and `X-Real-IP` is the peer.
fn drop_forwarding(headers: &mut HeaderMap, peer: IpAddr) {
    for name in [
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "forwarded",
        "x-real-ip",
    ] {
        headers.remove(name);
    }
    if let Ok(v) = HeaderValue::from_str(&peer.to_string()) {
        headers.insert("x-real-ip", v);
    }
}

/// Appends the peer to `X-Forwarded-For` and `Forwarded`, and sets `X-Forwarded-Proto` and
/// `X-Forwarded-Host` when absent (a trusted proxy's values are kept).
fn add_forwarding(headers: &mut HeaderMap, peer: IpAddr, host: Option<&HeaderValue>) {
    let xff_name = HeaderName::from_static("x-forwarded-for");
    let prior: Vec<String> = headers
        .get_all(&xff_name)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let mut xff = prior.join(", ");
    if !xff.is_empty() {
        xff.push_str(", ");
    }
    xff.push_str(&peer.to_string());
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert(xff_name, v);
    }
    let node = match peer {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
    };
    let mut element = format!("for={node};proto=http");
    if let Some(h) = host.and_then(|h| h.to_str().ok()) {
        if !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
        {
            element.push_str(&format!(";host=\"{h}\""));
        }
    }
    if let Ok(v) = HeaderValue::from_str(&element) {
        headers.append(http::header::FORWARDED, v);
    }
    if !headers.contains_key("x-forwarded-proto") {
        headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    }
    if let Some(h) = host {
        if !headers.contains_key("x-forwarded-host") {
            headers.insert("x-forwarded-host", h.clone());
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
        drop_forwarding(&mut h, peer);
        add_forwarding(&mut h, peer, Some(&HeaderValue::from_static("api.example")));
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
        add_forwarding(&mut h, "::1".parse().expect("ip"), Some(&host));
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, ::1");
        assert_eq!(
            h["forwarded"],
            "for=\"[::1]\";proto=http;host=\"example.com\""
        );
        assert_eq!(h["x-forwarded-host"], "example.com");
    }
}
