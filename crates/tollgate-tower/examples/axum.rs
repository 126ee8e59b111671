//! An axum app rate-limited by tollgate: 10 requests per minute per client IP on `/api`,
//! nothing on `/`.
//!
//! ```text
//! cargo run -p tollgate-tower --example axum
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/api/hello; done
//! ```

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::{IdentityHasher, Limiter, LimiterConfig, PolicySpec};
use tollgate_tower::{RateLimitLayer, RoutedPolicy};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = Limiter::new(LimiterConfig::default());
    let limit = Limit::new(Algorithm::TokenBucket, Quota::per_minute(10)?)?;
    let api = limiter.policy(PolicySpec::new("api", limit))?;
    let layer = RateLimitLayer::new(limiter, IdentityHasher::new(b"example secret"))
        // axum puts the peer address in `ConnectInfo` (see `into_make_service_with_connect_info`).
        .peer_addr_with(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
        .policy(RoutedPolicy::new(api).path_prefix("/api"));
    let app = Router::new()
        .route("/", get(|| async { "not limited\n" }))
        .route("/api/hello", get(|| async { "hello\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
