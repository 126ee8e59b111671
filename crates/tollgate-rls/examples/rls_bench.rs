//! The price of the front end, measured in one run on one redis-server: decisions per second
//! and latency (p50 / p99) of the same limiter asked three ways:
//!
//! - `store`: `Limiter::check` called directly (the RedisStore behind the limiter, no front
//!   end; deny cache off);
//! - `http`: an HTTP/1.1 request to the tower layer in decision mode (what `tollgate serve`
//!   without an upstream runs), keep-alive connections;
//! - `rls`: a gRPC `ShouldRateLimit` call to the RLS (what Envoy sends), over HTTP/2.
//!
//! Each mode runs `--concurrency` closed-loop workers for `--duration`, each worker its own
//! client key out of 1,000 (a limit no client reaches, so every answer is a full decision that
//! reaches Redis). It starts its own `redis-server` (from PATH) on a free port.
//!
//! `cargo run --release -p tollgate-rls --example rls_bench -- [--duration 5s]
//!  [--concurrency 32] [--channels 4]` (`--channels`: HTTP/2 connections of the RLS client)

use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::store::RedisConfig;
use tollgate::{Backend, ClientKey, IdentityHasher, Limiter, LimiterConfig, Plan, PolicySpec};
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate_rls::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate_rls::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate_rls::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate_rls::{RlsOptions, RlsService};
use tollgate_testkit::RedisServer;

const CLIENTS: usize = 1_000;
const YAML: &str = "domain: bench\ndescriptors:\n  - key: client\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000000000\n      algorithm: token_bucket\n";

struct Args {
    duration: Duration,
    concurrency: usize,
    channels: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        duration: Duration::from_secs(5),
        concurrency: 32,
        channels: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--duration" => {
                let secs: u64 = value
                    .trim_end_matches('s')
                    .parse()
                    .map_err(|_| format!("--duration {value}: expected seconds like 5s"))?;
                a.duration = Duration::from_secs(secs.clamp(1, 600));
            }
            "--concurrency" => {
                a.concurrency = value
                    .parse::<usize>()
                    .map_err(|_| format!("--concurrency {value}: expected a number"))?
                    .clamp(1, 1024);
            }
            "--channels" => {
                a.channels = value
                    .parse::<usize>()
                    .map_err(|_| format!("--channels {value}: expected a number"))?
                    .clamp(1, 256);
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn limiter(url: &str, prefix: &str) -> Limiter {
    let mut cfg = LimiterConfig::new(Backend::Redis(
        RedisConfig::standalone(url).with_key_prefix(prefix),
    ));
    cfg.timeout = Duration::from_secs(1);
    cfg.deny_cache_capacity = 0;
    Limiter::new(cfg)
}

fn big_limit() -> Limit {
    let quota = Quota::per_hour(1_000_000_000).expect("quota");
    Limit::new(Algorithm::TokenBucket, quota).expect("limit")
}

/// Runs `concurrency` workers calling `call(worker, i)` until `duration` is over; returns
/// (decisions, errors, sorted latencies in microseconds).
async fn run<F, Fut>(concurrency: usize, duration: Duration, call: F) -> (u64, u64, Vec<u64>)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let call = Arc::new(call);
    let stop = Instant::now() + duration;
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let call = Arc::clone(&call);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(100_000);
            let mut errors = 0u64;
            let mut i = 0u64;
            while Instant::now() < stop && i < 50_000_000 {
                let t = Instant::now();
                if !call(w, i).await {
                    errors += 1;
                }
                lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
                i += 1;
            }
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((lat, e)) = t.await {
            all.extend(lat);
            errors += e;
        }
    }
    all.sort_unstable();
    (all.len() as u64, errors, all)
}

fn report(mode: &str, duration: Duration, (n, errors, lat): (u64, u64, Vec<u64>)) {
    let pct = |p: f64| {
        let i = ((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1));
        lat.get(i).copied().unwrap_or(0)
    };
    println!(
        "| {mode} | {:.0} | {} | {} | {} |",
        n as f64 / duration.as_secs_f64(),
        pct(0.50),
        pct(0.99),
        errors
    );
}

fn rls_request(w: usize, i: u64) -> RateLimitRequest {
    let client = (w + i as usize * 7) % CLIENTS;
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "client".into(),
                value: format!("c{client}"),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn http_server(limiter: Limiter) -> std::net::SocketAddr {
    use axum::routing::get;
    let policy = limiter
        .policy(PolicySpec::new("api", big_limit()))
        .expect("policy");
    let layer = tollgate_tower::RateLimitLayer::new(limiter, IdentityHasher::new(b"bench"))
        .identity(tollgate_tower::IdentityConfig {
            sources: vec![tollgate_tower::IdentitySource::Header(
                http::HeaderName::from_static("x-api-key"),
            )],
            ..Default::default()
        })
        .policy(tollgate_tower::RoutedPolicy::new(policy));
    let app = axum::Router::new()
        .route("/", get(|| async { "" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args()?;
    let redis = RedisServer::start();
    let url = redis.url();
    println!(
        "{} workers, {:?} per mode, {CLIENTS} client keys, one redis-server, {} HTTP/2 connections to the RLS",
        a.concurrency, a.duration, a.channels
    );
    println!("| front end | decisions/s | p50 us | p99 us | errors |");
    println!("|---|---|---|---|---|");

    // store: the limiter alone.
    let store = limiter(&url, "store");
    let policy = store
        .policy(PolicySpec::new("api", big_limit()))
        .expect("policy");
    store.connect(Duration::from_secs(5)).await;
    let plans: Arc<Vec<Plan>> = Arc::new(
        (0..CLIENTS)
            .map(|c| Plan::for_client(ClientKey::from_u128(c as u128 + 1), [&policy]))
            .collect(),
    );
    let l = store.clone();
    let r = run(a.concurrency, a.duration, move |w, i| {
        let l = l.clone();
        let plans = Arc::clone(&plans);
        async move {
            let plan = &plans[(w + i as usize * 7) % CLIENTS];
            l.check(plan).await.action == tollgate::Action::Allow
        }
    })
    .await;
    report("store (Limiter::check)", a.duration, r);

    // http: the tower layer in decision mode.
    let http_limiter = limiter(&url, "http");
    let addr = http_server(http_limiter.clone()).await;
    http_limiter.connect(Duration::from_secs(5)).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(a.concurrency)
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let uri: http::Uri = format!("http://{addr}/").parse()?;
    let r = run(a.concurrency, a.duration, move |w, i| {
        let client = client.clone();
        let uri = uri.clone();
        async move {
            let key = format!("k{}", (w + i as usize * 7) % CLIENTS);
            let Ok(req) = http::Request::get(uri)
                .header("x-api-key", key)
                .body(http_body_util::Empty::new())
            else {
                return false;
            };
            match client.request(req).await {
                Ok(resp) => {
                    let ok = resp.status() == http::StatusCode::OK;
                    let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
                    ok
                }
                Err(_) => false,
            }
        }
    })
    .await;
    report("http (decision mode)", a.duration, r);

    // rls: ShouldRateLimit over gRPC.
    let rls_limiter = limiter(&url, "rls");
    let config = tollgate_rls::config::load_str([("bench.yaml", YAML)])?;
    let service = RlsService::new(
        rls_limiter.clone(),
        IdentityHasher::new(b"bench"),
        config,
        RlsOptions::default(),
    )?;
    rls_limiter.connect(Duration::from_secs(5)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = tollgate_rls::serve(listener, service, std::future::pending()).await;
    });
    // A few HTTP/2 connections, as Envoy keeps one per worker thread.
    let mut channels = Vec::new();
    for _ in 0..a.channels {
        let ch = tonic::transport::Channel::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        channels.push(RateLimitServiceClient::new(ch));
    }
    let channels = Arc::new(channels);
    let r = run(a.concurrency, a.duration, move |w, i| {
        let mut c = channels[w % channels.len()].clone();
        async move {
            c.should_rate_limit(rls_request(w, i))
                .await
                .is_ok_and(|r| r.into_inner().overall_code == 1)
        }
    })
    .await;
    report("rls (gRPC ShouldRateLimit)", a.duration, r);
    Ok(())
}
