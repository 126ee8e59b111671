//! An RLS server on a loopback port over a real `redis-server`, and a tonic client to it.
//! Time is a ManualClock the store is told (`clock = local`), so windows are driven, not
//! waited for.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tollgate::clock::ManualClock;
use tollgate::store::{RedisConfig, StoreClock};
use tollgate::{Backend, IdentityHasher, Limiter, LimiterConfig};
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus,
};
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_rls::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_rls::proto::grpc::health::v1::health_client::HealthClient;
use tollgate_rls::{RlsOptions, RlsService};
use tonic::transport::Channel;

/// A window start: 1.8e9 s is a multiple of an hour.
pub const T0: u64 = 1_800_000_000_000_000;

pub struct Rls {
    pub client: RateLimitServiceClient<Channel>,
    pub health: HealthClient<Channel>,
    pub limiter: Limiter,
    pub service: RlsService,
    pub clock: ManualClock,
    pub addr: std::net::SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Rls {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

pub fn limiter(url: &str, prefix: &str, clock: &ManualClock, timeout: Duration) -> Limiter {
    let redis = RedisConfig::standalone(url)
        .with_clock(StoreClock::Local)
        .with_key_prefix(prefix);
    let mut cfg = LimiterConfig::new(Backend::Redis(redis));
    cfg.clock = Arc::new(clock.clone());
    cfg.timeout = timeout;
    Limiter::new(cfg)
}

/// Serves `yaml` over the Redis at `url` under key prefix `prefix`.
pub async fn start(url: &str, prefix: &str, yaml: &str, options: RlsOptions) -> Rls {
    let clock = ManualClock::new(T0);
    let limiter = limiter(url, prefix, &clock, Duration::from_millis(500));
    start_with(limiter, clock, yaml, options).await
}

pub async fn start_with(
    limiter: Limiter,
    clock: ManualClock,
    yaml: &str,
    options: RlsOptions,
) -> Rls {
    let config = tollgate_rls::config::load_str([("test.yaml", yaml)]).expect("valid yaml");
    serve_config(limiter, clock, config, options).await
}

/// Serves several YAML files (name, text), loaded with `load`.
pub async fn start_files(
    url: &str,
    prefix: &str,
    files: &[(&str, &str)],
    load: tollgate_rls::config::LoadOptions,
    options: RlsOptions,
) -> Rls {
    let clock = ManualClock::new(T0);
    let limiter = limiter(url, prefix, &clock, Duration::from_millis(500));
    let config =
        tollgate_rls::config::load_str_with(files.iter().copied(), load).expect("valid yaml");
    serve_config(limiter, clock, config, options).await
}

pub async fn serve_config(
    limiter: Limiter,
    clock: ManualClock,
    config: tollgate_rls::RlsConfig,
    options: RlsOptions,
) -> Rls {
    let service = RlsService::new(
        limiter.clone(),
        IdentityHasher::new(b"test secret"),
        config,
        options,
    )
    .expect("service");
    limiter.connect(Duration::from_secs(5)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = oneshot::channel::<()>();
    let served = service.clone();
    let task = tokio::spawn(async move {
        let _ = tollgate_rls::serve(listener, service, async {
            let _ = rx.await;
        })
        .await;
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect");
    Rls {
        client: RateLimitServiceClient::new(channel.clone()),
        health: HealthClient::new(channel),
        limiter,
        service: served,
        clock,
        addr,
        stop: Some(tx),
        task: Some(task),
    }
}

pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_string(),
                value: (*v).to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn with_hits(mut d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(hits);
    d
}

pub fn with_override(mut d: RateLimitDescriptor, rpu: u32, unit: i32) -> RateLimitDescriptor {
    d.limit = Some(RateLimitOverride {
        requests_per_unit: rpu,
        unit,
    });
    d
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

impl Rls {
    pub async fn call(&mut self, req: RateLimitRequest) -> RateLimitResponse {
        self.client
            .should_rate_limit(req)
            .await
            .expect("ShouldRateLimit answers")
            .into_inner()
    }

    pub async fn one(&mut self, domain: &str, entries: &[(&str, &str)]) -> RateLimitResponse {
        self.call(request(domain, vec![desc(entries)])).await
    }
}

pub fn code(s: &DescriptorStatus) -> Code {
    Code::try_from(s.code).unwrap_or(Code::Unknown)
}

pub fn overall(r: &RateLimitResponse) -> Code {
    Code::try_from(r.overall_code).unwrap_or(Code::Unknown)
}

pub fn reset_micros(s: &DescriptorStatus) -> u64 {
    let d = s.duration_until_reset.expect("duration_until_reset");
    u64::try_from(d.seconds).expect("non-negative") * 1_000_000
        + u64::try_from(d.nanos).expect("non-negative") / 1_000
}

/// `yaml` served from the in-process memory store, with a loopback listener for it: what the
/// wire tests (HTTP/2 frames, bounds, calls) start from, each with its own `serve*`.
pub async fn memory_service_on_loopback(
    yaml: &str,
) -> (RlsService, tokio::net::TcpListener, std::net::SocketAddr) {
    let limiter = Limiter::new(LimiterConfig::new(Backend::default()));
    let config = tollgate_rls::config::load_str([("test.yaml", yaml)]).expect("yaml");
    let service = RlsService::new(
        limiter,
        IdentityHasher::new(b"test secret"),
        config,
        RlsOptions::default(),
    )
    .expect("service");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    (service, listener, addr)
}
