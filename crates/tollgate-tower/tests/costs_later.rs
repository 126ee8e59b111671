//! An axum app gets costs known later from the layer alone: the real cost its handler puts
//! in a response header is settled when the body ends, and a concurrency policy holds a
//! request until its response body is done or dropped.

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderName, Request, StatusCode};
use http_body_util::BodyExt;
use std::net::SocketAddr;
use std::time::Duration;
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::{IdentityHasher, Limiter, LimiterConfig, PolicySpec};
use tollgate_tower::{Costs, PeerAddr, RateLimitLayer, RoutedPolicy};
use tower_service::Service;

fn app() -> Router {
    let limiter = Limiter::new(LimiterConfig::default());
    let mut spec = PolicySpec::new(
        "tokens",
        Limit::new(
            Algorithm::TokenBucket,
            Quota::per_hour(1000).expect("quota"),
        )
        .expect("limit"),
    );
    spec.cost = 100;
    spec.settle = true;
    let tokens = limiter.policy(spec).expect("policy");
    let inflight = limiter
        .policy(PolicySpec::new(
            "inflight",
            Limit::new(
                Algorithm::Concurrency,
                Quota::new(1, Duration::from_secs(300)).expect("quota"),
            )
            .expect("limit"),
        ))
        .expect("policy");
    let layer = RateLimitLayer::new(limiter, IdentityHasher::new(b"t"))
        .policy(RoutedPolicy::new(tokens).path_prefix("/llm").costs(Costs {
            from_request: None,
            max: 1000,
            from_response: Some(HeaderName::from_static("x-tokens-used")),
        }))
        .policy(RoutedPolicy::new(inflight).path_prefix("/stream"));
    Router::new()
        .route(
            "/llm",
            get(|q: axum::extract::RawQuery| async move {
                let used = q.0.unwrap_or_default().replace("used=", "");
                ([("x-tokens-used", used)], "completion")
            }),
        )
        .route("/stream", get(|| async { "streamed" }))
        .layer(layer)
}

async fn call(app: &mut Router, path: &str) -> http::Response<Body> {
    let mut req = Request::get(path).body(Body::empty()).expect("request");
    let peer: SocketAddr = "192.0.2.7:1000".parse().expect("addr");
    req.extensions_mut().insert(PeerAddr(peer));
    std::future::poll_fn(|cx| <Router as Service<Request<Body>>>::poll_ready(app, cx))
        .await
        .expect("ready");
    app.call(req).await.expect("infallible")
}

fn remaining(r: &http::Response<Body>) -> String {
    r.headers()
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

#[tokio::test]
async fn an_axum_handlers_real_cost_is_settled_when_its_body_ends() {
    let mut app = app();
    let r = call(&mut app, "/llm?used=10").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(remaining(&r), "\"tokens\";r=900;t=360");
    let _ = r.into_body().collect().await.expect("body");
    let r = call(&mut app, "/llm?used=abc").await;
    assert!(
        remaining(&r).starts_with("\"tokens\";r=890;"),
        "{}",
        remaining(&r)
    );
    let _ = r.into_body().collect().await.expect("body");
    // The bad cost left its estimate (in the 890 already): 790 after this one.
    let r = call(&mut app, "/llm?used=1").await;
    assert!(
        remaining(&r).starts_with("\"tokens\";r=790;"),
        "{}",
        remaining(&r)
    );
}

#[tokio::test]
async fn a_response_body_not_yet_read_holds_its_request_and_dropping_it_releases() {
    let mut app = app();
    let first = call(&mut app, "/stream").await;
    assert_eq!(first.status(), StatusCode::OK);
    let second = call(&mut app, "/stream").await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        second
            .headers()
            .get("ratelimit-policy")
            .and_then(|v| v.to_str().ok()),
        Some("\"inflight\";q=1;qu=\"concurrent-requests\"")
    );
    drop(first); // the client went away before reading it
    let third = call(&mut app, "/stream").await;
    assert_eq!(
        third.status(),
        StatusCode::OK,
        "released when its body was dropped"
    );
    let _ = third.into_body().collect().await.expect("body");
    let fourth = call(&mut app, "/stream").await;
    assert_eq!(
        fourth.status(),
        StatusCode::OK,
        "released when its body ended"
    );
}
