//! `tollgate bench --rls URL`: the same load, accuracy and report against Envoy's rate limit
//! service (gRPC `ShouldRateLimit`) instead of HTTP.
//!
//! Each request carries one descriptor per `--descriptor key=value[,key=value...]` (one by
//! default), in order, where `{client}` in a value is the virtual client's key (so each client
//! counts on its own, as an API key does over HTTP). The answer is mapped onto the HTTP report: `OK` counts as a 2xx,
//! `OVER_LIMIT` as a 429, a gRPC `UNAVAILABLE` as a 503 and any other gRPC error as an error.
//! The first `ratelimit-policy` in `response_headers_to_add` gives the limit to check against,
//! as the HTTP header does.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_rls::Unvectored;
use tonic::transport::Channel;

use super::report::{ErrorKind, Outcome};

/// The request every virtual client sends.
#[derive(Debug, Clone)]
pub struct RlsPlan {
    /// `--domain`.
    pub domain: String,
    /// One entry list per `--descriptor`, in order; `{client}` in a value is replaced by the
    /// client's key.
    pub descriptors: Vec<Vec<(String, String)>>,
}

/// One gRPC client (one HTTP/2 connection, multiplexed) per target.
pub struct RlsClients(Vec<RateLimitServiceClient<Channel>>);

impl RlsClients {
    /// Clients for `targets`; they connect on first use.
    pub fn new(targets: &[Uri], timeout: Duration) -> anyhow::Result<Self> {
        let mut clients = Vec::with_capacity(targets.len());
        for t in targets {
            let channel = Channel::builder(t.clone())
                .connect_timeout(timeout)
                .connect_with_connector_lazy(Connect);
            clients.push(RateLimitServiceClient::new(channel));
        }
        anyhow::ensure!(!clients.is_empty(), "no --rls target");
        Ok(Self(clients))
    }
}

/// How `--rls` connects: TCP without Nagle's delay, its writes not vectored
/// ([`Unvectored`] says why), so that h2 under tonic writes the requests of many streams at
/// once, as Envoy's client does, instead of a call each of a few descriptors.
#[derive(Clone, Copy)]
struct Connect;

impl tower_service::Service<Uri> for Connect {
    type Response = TokioIo<Unvectored<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(async move {
            let host = uri
                .host()
                .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
                .ok_or_else(|| std::io::Error::other(format!("{uri}: no host")))?;
            let port = uri.port_u16().unwrap_or(80);
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            Ok(TokioIo::new(Unvectored(stream)))
        })
    }
}

/// One `--descriptor`: the entries of one descriptor of each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor(pub Vec<(String, String)>);

/// Parses `key=value[,key=value...]`.
pub fn parse_descriptor(text: &str) -> Result<Descriptor, String> {
    let mut entries = Vec::new();
    for part in text.split(',') {
        match part.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() && !v.is_empty() => {
                entries.push((k.trim().to_string(), v.to_string()));
            }
            _ => {
                return Err(format!(
                    "{part:?}: expected key=value (e.g. api_key={{client}})"
                ))
            }
        }
    }
    Ok(Descriptor(entries))
}

/// One `ShouldRateLimit` for `key` at target `target`.
pub async fn exchange(
    clients: &RlsClients,
    plan: &RlsPlan,
    target: usize,
    key: &str,
    policy_header: &OnceLock<String>,
) -> Outcome {
    let Some(client) = clients.0.get(target % clients.0.len().max(1)) else {
        return Outcome::Error(ErrorKind::Http);
    };
    let request = RateLimitRequest {
        domain: plan.domain.clone(),
        descriptors: plan
            .descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: k.clone(),
                        value: v.replace("{client}", key),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    };
    let mut client = client.clone();
    match client.should_rate_limit(request).await {
        Ok(response) => {
            let response = response.into_inner();
            if policy_header.get().is_none() {
                if let Some(h) = response
                    .response_headers_to_add
                    .iter()
                    .find(|h| h.key.eq_ignore_ascii_case("ratelimit-policy"))
                {
                    let _ = policy_header.set(h.value.clone());
                }
            }
            match Code::try_from(response.overall_code) {
                Ok(Code::Ok) => Outcome::Status(200),
                Ok(Code::OverLimit) => Outcome::Status(429),
                _ => Outcome::Error(ErrorKind::Http),
            }
        }
        Err(status) if status.code() == tonic::Code::Unavailable => {
            // A transport failure is also UNAVAILABLE in tonic; tell them apart by source.
            if std::error::Error::source(&status).is_some() {
                Outcome::Error(ErrorKind::Connect)
            } else {
                Outcome::Status(503)
            }
        }
        Err(_) => Outcome::Error(ErrorKind::Http),
    }
}

/// The `--rls` targets as gRPC endpoints (`http://HOST:PORT`).
pub fn parse_rls_target(text: &str) -> Result<Uri, String> {
    let uri: Uri = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a URL"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!(
            "{text:?}: give http://HOST:PORT (gRPC over HTTP/2 cleartext)"
        ));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_key_value_pairs() {
        assert_eq!(
            parse_descriptor("api_key={client},path=/x")
                .expect("valid")
                .0,
            vec![
                ("api_key".to_string(), "{client}".to_string()),
                ("path".to_string(), "/x".to_string())
            ]
        );
        assert!(parse_descriptor("novalue").is_err());
        assert!(parse_descriptor("=v").is_err());
    }

    #[test]
    fn rls_targets_are_http_urls() {
        assert!(parse_rls_target("http://127.0.0.1:8081").is_ok());
        assert!(parse_rls_target("https://x:1").is_err());
        assert!(parse_rls_target("127.0.0.1:8081").is_err());
    }
}
