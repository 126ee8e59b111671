//! The layer end to end over a memory limiter, with a trivial inner service.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::task::{Context, Poll};
use tollgate::quota::{Algorithm, Limit, Quota};
use tollgate::{IdentityHasher, Limiter, LimiterConfig, PolicySpec};
use tollgate_tower::{PeerAddr, ProblemKind, RateLimit, RateLimitLayer, RoutedPolicy};
use tower_layer::Layer;
use tower_service::Service;

#[derive(Clone)]
struct Ok200;

impl Service<Request<()>> for Ok200 {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(Full::new(Bytes::from_static(
            b"upstream",
        )))))
    }
}

/// Returns when at least a minute is left of the hour (else waits until just past it): the
/// policies here count in fixed windows of an hour on the system clock, and a test compares
/// answers given apart ("5 pass, the 6th is 429"). Every call checks: `cargo test` runs these
/// tests in one process, where the once-a-process `start_clear_of_the_hour` covers the first.
fn clear_of_the_hours_end() {
    tollgate_testkit::clear_of_window_end(std::time::Duration::from_secs(3600));
}

fn policy(limiter: &Limiter, name: &str, limit: u64, shadow: bool) -> tollgate::Policy {
    let mut spec = PolicySpec::new(
        name,
        Limit::new(
            Algorithm::FixedWindow,
            Quota::per_hour(limit).expect("quota"),
        )
        .expect("limit"),
    );
    spec.shadow = shadow;
    limiter.policy(spec).expect("policy")
}

/// On the wall clock, in hour windows: started clear of the hour's end (each test calls it
/// first).
fn service(policies: impl FnOnce(&Limiter) -> Vec<RoutedPolicy>) -> RateLimit<Ok200> {
    clear_of_the_hours_end();
    let limiter = Limiter::new(LimiterConfig::default());
    let mut layer = RateLimitLayer::new(limiter.clone(), IdentityHasher::new(b"t"));
    for p in policies(&limiter) {
        layer = layer.policy(p);
    }
    layer.layer(Ok200)
}

async fn send(
    svc: &mut RateLimit<Ok200>,
    path: &str,
    key: Option<&str>,
) -> (StatusCode, http::HeaderMap, String) {
    let mut req = Request::builder().uri(path);
    if let Some(k) = key {
        req = req.header("x-api-key", k);
    }
    let mut req = req.body(()).expect("request");
    let peer: SocketAddr = "192.0.2.1:1234".parse().expect("addr");
    req.extensions_mut().insert(PeerAddr(peer));
    std::future::poll_fn(|cx| svc.poll_ready(cx))
        .await
        .expect("ready");
    let resp = svc.call(req).await.expect("infallible");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// Checks that an answer is an `application/problem+json` body of `kind`, and returns it.
fn expect_problem(
    status: StatusCode,
    h: &http::HeaderMap,
    body: &str,
    kind: ProblemKind,
) -> serde_json::Value {
    assert_eq!(status, kind.status(), "{body}");
    assert_eq!(h["content-type"], "application/problem+json");
    let v: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(v["type"], kind.type_uri(), "{body}");
    assert_eq!(v["status"], status.as_u16(), "{body}");
    assert_eq!(v["title"], kind.title(), "{body}");
    v
}

#[tokio::test]
async fn remaining_counts_down_then_429_with_problem_json() {
    let mut svc =
        service(|l| vec![RoutedPolicy::new(policy(l, "api", 5, false)).path_prefix("/api")]);
    for r in (0..5).rev() {
        let (status, h, body) = send(&mut svc, "/api/x", None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, "upstream");
        assert_eq!(h["ratelimit-policy"], "\"api\";q=5;w=3600");
        let rl = h["ratelimit"].to_str().expect("ascii");
        assert!(rl.starts_with(&format!("\"api\";r={r};t=")), "{rl}");
    }
    let (status, h, body) = send(&mut svc, "/api/x", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(h["content-type"], "application/problem+json");
    let retry: u64 = h["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("int");
    assert!(retry >= 1);
    assert!(body.contains("#quota-exceeded\""), "{body}");
    assert!(body.contains("\"status\":429"), "{body}");
    assert!(body.contains("\"violated-policies\":[\"api\"]"), "{body}");
    assert!(
        body.contains(&format!("\"retry_after\":{retry}}}")),
        "{body}"
    );
    let v = expect_problem(status, &h, &body, ProblemKind::QuotaExceeded);
    assert_eq!(v["type"], "https://tollgate.dev/problems#quota-exceeded");
    // Unmatched paths pass untouched, without headers.
    let (status, h, _) = send(&mut svc, "/other", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!h.contains_key("ratelimit") && !h.contains_key("ratelimit-policy"));
}

#[tokio::test]
async fn shadow_policies_count_but_never_reject_nor_show() {
    let mut svc = service(|l| vec![RoutedPolicy::new(policy(l, "dry", 1, true))]);
    for _ in 0..3 {
        let (status, h, _) = send(&mut svc, "/", None).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!h.contains_key("ratelimit-policy"));
    }
}

#[tokio::test]
async fn two_api_keys_are_two_clients_and_several_policies_list_all() {
    let mut svc = service(|l| {
        let by_key = vec![
            "header:x-api-key".parse().expect("source"),
            tollgate_tower::IdentitySource::Ip,
        ];
        vec![
            RoutedPolicy::new(policy(l, "a", 1, false)).identity(by_key.clone()),
            RoutedPolicy::new(policy(l, "b", 10, false)).identity(by_key),
        ]
    });
    let (s1, h, _) = send(&mut svc, "/", Some("k1")).await;
    assert_eq!(s1, StatusCode::OK);
    assert_eq!(h["ratelimit-policy"], "\"a\";q=1;w=3600, \"b\";q=10;w=3600");
    assert!(h["ratelimit"]
        .to_str()
        .expect("ascii")
        .starts_with("\"a\";r=0;"));
    let (s2, _, _) = send(&mut svc, "/", Some("k2")).await;
    assert_eq!(s2, StatusCode::OK);
    let (s3, _, body) = send(&mut svc, "/", Some("k1")).await;
    assert_eq!(s3, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("[\"a\"]"), "{body}");
}

#[tokio::test]
async fn a_cost_above_capacity_is_429_without_retry_after() {
    let limiter = Limiter::new(LimiterConfig::default());
    let mut spec = PolicySpec::new(
        "big",
        Limit::new(Algorithm::TokenBucket, Quota::per_hour(2).expect("quota")).expect("limit"),
    );
    // A fixed cost of 3 on a burst of 2 is refused when the policy is made; a request that
    // costs more than the capacity on its own (a per-request cost) gets the 429 without a
    // retry time.
    spec.cost = 3;
    assert!(limiter.policy(spec.clone()).is_err());
    spec.cost = 1;
    let p = limiter.policy(spec).expect("policy").with_cost(3);
    let mut svc = RateLimitLayer::new(limiter, IdentityHasher::new(b"t"))
        .policy(RoutedPolicy::new(p))
        .layer(Ok200);
    let (status, h, body) = send(&mut svc, "/", None).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(!h.contains_key("retry-after"));
    assert!(body.contains("\"retry_after\":null"), "{body}");
    let v = expect_problem(status, &h, &body, ProblemKind::QuotaExceeded);
    assert_eq!(v["violated-policies"], serde_json::json!(["big"]));
}

#[tokio::test]
async fn an_ambiguous_path_is_a_bad_request_problem() {
    let mut svc =
        service(|l| vec![RoutedPolicy::new(policy(l, "api", 5, false)).path_prefix("/api")]);
    let (status, h, body) = send(&mut svc, "/api/a%2Fb", None).await;
    let v = expect_problem(status, &h, &body, ProblemKind::BadRequest);
    assert!(
        v["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{body}"
    );
}

/// The bearer token is verified only when a matched policy reads a JWT claim: an invalid
/// token passes a path whose policies count by IP (and a path no policy matches), and is
/// refused with 401 where a policy counts by `jwt:sub`.
#[tokio::test]
async fn a_bad_token_is_refused_only_where_a_policy_reads_it() {
    let limiter = Limiter::new(LimiterConfig::default());
    let identity = tollgate_tower::IdentityConfig {
        jwt: Some(tollgate_tower::JwtVerifier::hs256(b"0123456789abcdef").expect("key")),
        ..Default::default()
    };
    let by_user = RoutedPolicy::new(policy(&limiter, "users", 10, false))
        .path_prefix("/api")
        .identity(vec![
            "jwt:sub".parse().expect("source"),
            "ip".parse().expect("source"),
        ]);
    let by_ip = RoutedPolicy::new(policy(&limiter, "public", 10, false)).path_prefix("/public");
    let layer = RateLimitLayer::new(limiter, IdentityHasher::new(b"t"))
        .identity(identity)
        .policy(by_user)
        .policy(by_ip);
    let request = |path: &str| {
        let mut req = Request::builder()
            .uri(path)
            .header("authorization", "Bearer forged.token.here")
            .body(())
            .expect("request");
        req.extensions_mut()
            .insert(PeerAddr(SocketAddr::from(([127, 0, 0, 1], 9))));
        req
    };
    let public = layer.check_request(&request("/public")).await;
    assert!(
        matches!(public, Ok(Some(ref r)) if r.is_allowed()),
        "{public:?}"
    );
    assert!(matches!(
        layer.check_request(&request("/other")).await,
        Ok(None)
    ));
    assert!(layer.check_request(&request("/api/x")).await.is_err());
    // Through the service: a 401 problem with the bearer challenge, nothing charged.
    let resp = layer
        .layer(Ok200)
        .call(request("/api/x"))
        .await
        .expect("infallible");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    let body = String::from_utf8_lossy(&body);
    expect_problem(
        parts.status,
        &parts.headers,
        &body,
        ProblemKind::InvalidToken,
    );
    assert_eq!(
        parts.headers["www-authenticate"],
        "Bearer error=\"invalid_token\""
    );
}

/// A flood of forged tokens (well-formed, wrong signature) on a path with a per-IP policy,
/// on the memory store and on Redis: once the per-IP policy denies the address, its further
/// requests are answered 429 from the deny cache without their signatures being checked.
#[tokio::test]
async fn forged_tokens_past_the_per_ip_limit_cost_no_signature_check() {
    clear_of_the_hours_end();
    forged_token_flood(Limiter::new(LimiterConfig::default())).await;
    let redis = tollgate_testkit::RedisServer::start();
    let mut config = LimiterConfig::new(tollgate::Backend::Redis(
        tollgate::store::RedisConfig::standalone(redis.url()),
    ));
    config.timeout = std::time::Duration::from_secs(2);
    forged_token_flood(Limiter::new(config)).await;
}

async fn forged_token_flood(limiter: Limiter) {
    let verifier = tollgate_tower::JwtVerifier::hs256(b"0123456789abcdef").expect("key");
    let identity = tollgate_tower::IdentityConfig {
        jwt: Some(verifier.clone()),
        ..Default::default()
    };
    let by_user = RoutedPolicy::new(policy(&limiter, "users", 100, false))
        .path_prefix("/api")
        .identity(vec!["jwt:sub".parse().expect("source")]);
    let by_ip = RoutedPolicy::new(policy(&limiter, "per-ip", 3, false))
        .path_prefix("/api")
        .identity(vec!["ip".parse().expect("source")]);
    let mut svc = RateLimitLayer::new(limiter, IdentityHasher::new(b"t"))
        .identity(identity)
        .policy(by_user)
        .policy(by_ip)
        .layer(Ok200);
    let claims = serde_json::json!({"sub": "mallory", "exp": 4_000_000_000u64});
    let forged = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(b"not the configured key").expect("key"),
    )
    .expect("token");
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let mut req = Request::builder()
            .uri("/api/x")
            .header("authorization", format!("Bearer {forged}"))
            .body(())
            .expect("request");
        req.extensions_mut()
            .insert(PeerAddr(SocketAddr::from(([192, 0, 2, 7], 9))));
        std::future::poll_fn(|cx| svc.poll_ready(cx))
            .await
            .expect("ready");
        let resp = svc.call(req).await.expect("infallible");
        statuses.push(resp.status().as_u16());
    }
    assert_eq!(
        statuses,
        [401, 401, 401, 429, 429, 429, 429, 429, 429, 429],
        "three charged to the per-IP policy and refused, then limited"
    );
    assert_eq!(
        verifier.signatures_checked(),
        4,
        "the requests the deny cache answers check no signature"
    );
    // decide_head leaves that 429 to its caller, who may write it whole; still no signature
    // checked.
    let req = Request::builder()
        .uri("/api/x")
        .header("authorization", format!("Bearer {forged}"))
        .body(())
        .expect("request");
    let peer = SocketAddr::from(([192, 0, 2, 7], 9));
    let peer = tollgate_tower::TrustedPeer::of(&tollgate_tower::Trust::default(), peer.ip())
        .with_addr(peer);
    let tollgate_tower::Decided::Limited(limited) = svc.decide_head(&req, &peer).await else {
        panic!("a forged token past the per-IP limit is refused, left to the caller");
    };
    let mut out = Vec::new();
    assert!(limited.write_http1(&mut out, |o| o.extend_from_slice(b"date: D\r\n")));
    assert!(out.starts_with(b"HTTP/1.1 429 Too Many Requests\r\n"));
    assert_eq!(
        limited.into_response().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(verifier.signatures_checked(), 4);
}

/// A request body that records when it is dropped.
struct DropFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// `decide` answers what `call` answers (unmatched, allowed with the headers, 429 with its
/// problem), and lets go of the request before its future runs: a server's read buffer is
/// not held while the limiter decides.
#[tokio::test]
async fn decide_answers_as_call_does_and_drops_the_request_before_deciding() {
    use tollgate_tower::Decided;
    let svc = service(|l| vec![RoutedPolicy::new(policy(l, "api", 2, false)).path_prefix("/api")]);
    let request = |path: &str, dropped: &std::sync::Arc<std::sync::atomic::AtomicBool>| {
        let mut req = Request::builder()
            .uri(path)
            .body(DropFlag(dropped.clone()))
            .expect("request");
        let peer: SocketAddr = "192.0.2.1:1234".parse().expect("addr");
        req.extensions_mut().insert(PeerAddr(peer));
        req
    };
    for left in [1, 0] {
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let future = svc.decide(request("/api/x", &dropped));
        assert!(
            dropped.load(std::sync::atomic::Ordering::SeqCst),
            "the request outlived decide()"
        );
        let Decided::Allowed(allowed) = future.await else {
            panic!("the first two requests are allowed");
        };
        assert!(allowed.result().is_allowed());
        let resp = allowed.respond(Response::new(Full::new(Bytes::from_static(b"mine"))));
        assert_eq!(resp.headers()["ratelimit-policy"], "\"api\";q=2;w=3600");
        let rl = resp.headers()["ratelimit"].to_str().expect("ascii");
        assert!(rl.starts_with(&format!("\"api\";r={left};t=")), "{rl}");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"mine");
    }
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let Decided::Answered(resp) = svc.decide(request("/api/x", &dropped)).await else {
        panic!("the third request is limited");
    };
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    expect_problem(
        parts.status,
        &parts.headers,
        &String::from_utf8_lossy(&body),
        ProblemKind::QuotaExceeded,
    );
    assert!(parts.headers.contains_key("retry-after"));
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    assert!(matches!(
        svc.decide(request("/other", &dropped)).await,
        Decided::Unmatched
    ));
    // An ambiguous path is refused (400) before anything is charged.
    let Decided::Answered(resp) = svc.decide(request("/api/a%2Fb", &dropped)).await else {
        panic!("an ambiguous path is answered by the layer");
    };
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

/// A server may carry the peer's address in the `TrustedPeer` it inserts instead of a
/// separate `PeerAddr` (the gateway does: one extension per request): clients are still told
/// apart by it, and a `PeerAddr`, when present, wins.
#[tokio::test]
async fn the_peer_address_may_come_with_the_trusted_peer_alone() {
    use tollgate_tower::{Trust, TrustedPeer};
    let mut svc = service(|l| vec![RoutedPolicy::new(policy(l, "ip", 1, false))]);
    let trust = Trust::default();
    let mut send_from = |addr: &str, peer_addr: Option<&str>| {
        let addr: SocketAddr = addr.parse().expect("addr");
        let mut req = Request::builder().uri("/x").body(()).expect("request");
        req.extensions_mut()
            .insert(TrustedPeer::of(&trust, addr.ip()).with_addr(addr));
        if let Some(p) = peer_addr {
            req.extensions_mut()
                .insert(PeerAddr(p.parse().expect("addr")));
        }
        assert!(tollgate_tower::peer_addr(req.extensions()).is_some());
        svc.call(req)
    };
    assert_eq!(
        send_from("192.0.2.1:1", None).await.expect("ok").status(),
        StatusCode::OK
    );
    assert_eq!(
        send_from("192.0.2.2:1", None).await.expect("ok").status(),
        StatusCode::OK
    );
    assert_eq!(
        send_from("192.0.2.1:2", None).await.expect("ok").status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the same address is the same client"
    );
    // A PeerAddr of a new address decides over the TrustedPeer's.
    assert_eq!(
        send_from("192.0.2.1:3", Some("192.0.2.3:1"))
            .await
            .expect("ok")
            .status(),
        StatusCode::OK
    );
}

/// A layer trusting the proxies of 10.0.0.0/8 (returned), with one policy `ip`: 1 an hour per
/// client IP, on paths under `prefix`; started clear of the hour's end (each test calls it
/// first).
fn behind_proxies(prefix: &str) -> (tollgate_tower::Trust, RateLimitLayer) {
    clear_of_the_hours_end();
    let proxies = tollgate_tower::Trust::new(vec!["10.0.0.0/8".parse().expect("net")], 64);
    let limiter = Limiter::new(LimiterConfig::default());
    let identity = tollgate_tower::IdentityConfig {
        trust: proxies.clone(),
        ..Default::default()
    };
    let layer = RateLimitLayer::new(limiter.clone(), IdentityHasher::new(b"t"))
        .identity(identity)
        .policy(RoutedPolicy::new(policy(&limiter, "ip", 1, false)).path_prefix(prefix));
    (proxies, layer)
}

/// A GET of `path`, with `X-Forwarded-For: xff` when given.
fn forwarded_get(path: &str, xff: Option<&str>) -> Request<()> {
    let mut req = Request::builder().uri(path);
    if let Some(v) = xff {
        req = req.header("x-forwarded-for", v);
    }
    req.body(()).expect("request")
}

/// `addr` (an IP address and port) decided under `trust`, carrying its address.
fn peer_at(trust: &tollgate_tower::Trust, addr: &str) -> tollgate_tower::TrustedPeer {
    let addr: SocketAddr = addr.parse().expect("addr");
    tollgate_tower::TrustedPeer::of(trust, addr.ip()).with_addr(addr)
}

/// `decide_from` (the peer given beside the request, as the gateway's decision mode does)
/// answers what `decide` answers with the same peer in the extensions: the same client by
/// the peer's address, the forwarding header believed only from a trusted proxy, and a peer
/// decided under another trust list (a reload since) judged again.
#[tokio::test]
async fn decide_from_answers_as_decide_with_the_peer_in_the_extensions() {
    use tollgate_tower::{Decided, Trust};
    let (proxies, layer) = behind_proxies("/");
    let svc = layer.layer(Ok200);
    let request = |xff: Option<&str>| forwarded_get("/x", xff);
    let allowed = |d: &Decided| matches!(d, Decided::Allowed(_));
    let peer = peer_at;
    // Both ways, each on its own client: the first request passes, the second is limited.
    for (n, (via_proxy, client)) in [
        ("10.1.1.1:1", "198.51.100.1"),
        ("10.1.1.1:2", "198.51.100.2"),
    ]
    .into_iter()
    .enumerate()
    {
        let p = peer(&proxies, via_proxy);
        let given = |xff| svc.decide_from(request(xff), &p);
        let in_ext = |xff| {
            let mut req = request(xff);
            req.extensions_mut().insert(p.clone());
            svc.decide(req)
        };
        let (first, second) = if n == 0 {
            (given(Some(client)).await, in_ext(Some(client)).await)
        } else {
            (in_ext(Some(client)).await, given(Some(client)).await)
        };
        assert!(allowed(&first), "a new client behind a trusted proxy");
        assert!(
            !allowed(&second),
            "the same client, told by the same header"
        );
    }
    // An untrusted peer's header is not believed: two "clients" are one address.
    let stranger = peer(&proxies, "192.0.2.9:1");
    assert!(allowed(
        &svc.decide_from(request(Some("198.51.100.3")), &stranger)
            .await
    ));
    assert!(!allowed(
        &svc.decide_from(request(Some("198.51.100.4")), &stranger)
            .await
    ));
    // Decided as trusted under a list the layer no longer has: judged again, and not trusted
    // under the layer's own list.
    let old = Trust::new(vec!["192.0.2.0/24".parse().expect("net")], 64);
    let stale = peer(&old, "192.0.2.10:1");
    assert!(stale.is_trusted());
    assert!(allowed(
        &svc.decide_from(request(Some("198.51.100.5")), &stale).await
    ));
    assert!(
        !allowed(&svc.decide_from(request(Some("198.51.100.6")), &stale).await),
        "a forwarding header believed from a trust the layer no longer has"
    );
}

/// An inner service that answers with who it was told the peer is: `given <addr>` from
/// `call_from`, `extensions <addr>` from `call` (the `TrustedPeer` in the extensions), or
/// `nobody`.
#[derive(Clone)]
struct SaysPeer;

impl SaysPeer {
    fn answer(said: String) -> Ready<Result<Response<Full<Bytes>>, Infallible>> {
        ready(Ok(Response::new(Full::new(Bytes::from(said)))))
    }
}

impl Service<Request<()>> for SaysPeer {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: Request<()>) -> Self::Future {
        Self::answer(
            match req
                .extensions()
                .get::<tollgate_tower::TrustedPeer>()
                .and_then(|p| p.addr())
            {
                Some(addr) => format!("extensions {addr}"),
                None => "nobody".to_string(),
            },
        )
    }
}

impl tollgate_tower::CallFrom<Request<()>> for SaysPeer {
    fn call_from(&mut self, req: Request<()>, peer: &tollgate_tower::TrustedPeer) -> Self::Future {
        assert!(
            req.extensions()
                .get::<tollgate_tower::TrustedPeer>()
                .is_none(),
            "the peer goes beside the request, not into it"
        );
        Self::answer(match peer.addr() {
            Some(addr) => format!("given {addr}"),
            None => "given, without an address".to_string(),
        })
    }
}

/// `call_from` (the peer given beside the request, as the gateway's proxy mode does) answers
/// what `call` answers with the same peer in the extensions: the same client by the peer's
/// address, the forwarding header believed only from a trusted proxy, a peer decided under
/// another trust list judged again; and the inner service is told the peer by `call_from`
/// too, never through the request's extensions.
#[tokio::test]
async fn call_from_answers_as_call_with_the_peer_in_the_extensions() {
    use tollgate_tower::Trust;
    let (proxies, layer) = behind_proxies("/limited");
    let mut svc = layer.layer(SaysPeer);
    let request = forwarded_get;
    let peer = peer_at;
    let body = |resp: Response<tollgate_tower::RateLimitBody<Full<Bytes>>>| async move {
        let status = resp.status();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    };
    // Both ways, each on its own client: the first request passes, the second is limited.
    for (n, (via_proxy, client)) in [
        ("10.1.1.1:1", "198.51.100.1"),
        ("10.1.1.1:2", "198.51.100.2"),
    ]
    .into_iter()
    .enumerate()
    {
        let p = peer(&proxies, via_proxy);
        let in_ext = || {
            let mut req = request("/limited", Some(client));
            req.extensions_mut().insert(p.clone());
            req
        };
        // (On the in-process store a call decides when it is made: each is made in turn.)
        let (first, second) = if n == 0 {
            let first = svc.call_from(request("/limited", Some(client)), &p).await;
            let second = svc.call(in_ext()).await;
            (first, second)
        } else {
            let first = svc.call(in_ext()).await;
            let second = svc.call_from(request("/limited", Some(client)), &p).await;
            (first, second)
        };
        let first = body(first.expect("answer")).await;
        let second = body(second.expect("answer")).await;
        let told = if n == 0 { "given" } else { "extensions" };
        assert_eq!(
            first,
            (StatusCode::OK, format!("{told} {via_proxy}")),
            "a new client behind a trusted proxy, the inner service told its peer"
        );
        assert_eq!(
            second.0,
            StatusCode::TOO_MANY_REQUESTS,
            "the same client, told by the same header"
        );
    }
    // A request no policy matches reaches the inner service with its peer too.
    let p = peer(&proxies, "10.1.1.1:3");
    assert_eq!(
        body(
            svc.call_from(request("/free", None), &p)
                .await
                .expect("answer")
        )
        .await,
        (StatusCode::OK, "given 10.1.1.1:3".to_string())
    );
    // An untrusted peer's header is not believed: two "clients" are one address.
    let stranger = peer(&proxies, "192.0.2.9:1");
    let first = svc.call_from(request("/limited", Some("198.51.100.3")), &stranger);
    assert_eq!(first.await.expect("answer").status(), StatusCode::OK);
    let second = svc.call_from(request("/limited", Some("198.51.100.4")), &stranger);
    assert_eq!(
        second.await.expect("answer").status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Decided as trusted under a list the layer no longer has: judged again, and not trusted
    // under the layer's own list.
    let old = Trust::new(vec!["192.0.2.0/24".parse().expect("net")], 64);
    let stale = peer(&old, "192.0.2.10:1");
    assert!(stale.is_trusted());
    let first = svc.call_from(request("/limited", Some("198.51.100.5")), &stale);
    assert_eq!(first.await.expect("answer").status(), StatusCode::OK);
    let second = svc.call_from(request("/limited", Some("198.51.100.6")), &stale);
    assert_eq!(
        second.await.expect("answer").status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a forwarding header believed from a trust the layer no longer has"
    );
}

/// `decide_head` decides as `decide_from` does, with a refusal left to the caller
/// (`Decided::Limited`): its 429 as a response is the one `decide_from` answers, and written
/// whole for HTTP/1.1 it is that response's status, headers in their order, length, date
/// line and body, byte for byte; policies advertised and violated several at once are not
/// written (the caller writes the response), nothing left behind.
#[tokio::test]
async fn decide_head_leaves_the_429_to_the_caller_and_writes_it_as_its_response() {
    use tollgate_tower::{Decided, Trust};
    let svc = service(|l| {
        vec![
            RoutedPolicy::new(policy(l, "api", 1, false)).path_prefix("/api"),
            RoutedPolicy::new(policy(l, "both \"a\"", 1, false)).path_prefix("/both"),
            RoutedPolicy::new(policy(l, "both b", 1, false)).path_prefix("/both"),
        ]
    });
    let peer = peer_at(&Trust::default(), "192.0.2.7:1000");
    let req = |path: &str| Request::builder().uri(path).body(()).expect("request");
    for path in ["/api/x", "/both/x"] {
        assert!(matches!(
            svc.decide_head(&req(path), &peer).await,
            Decided::Allowed(_)
        ));
        let Decided::Limited(limited) = svc.decide_head(&req(path), &peer).await else {
            panic!("{path}: the second request is refused, left to the caller");
        };
        assert!(!limited.result().is_allowed());
        let mut out = b"earlier".to_vec();
        let written = limited.write_http1(&mut out, |o| o.extend_from_slice(b"date: D\r\n"));
        let Decided::Answered(answered) = svc.decide_from(req(path), &peer).await else {
            panic!("{path}: decide_from answers the 429 itself");
        };
        let (parts, body) = limited.into_response().into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        let (their_parts, their_body) = answered.into_parts();
        let their_body = their_body.collect().await.expect("body").to_bytes();
        assert_eq!(parts.status, StatusCode::TOO_MANY_REQUESTS);
        // Two decisions apart: their seconds may differ (a second's edge between them), their
        // shape may not.
        let names = |h: &http::HeaderMap| h.keys().map(|k| k.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&parts.headers), names(&their_parts.headers), "{path}");
        assert_eq!(
            parts.headers["ratelimit-policy"], their_parts.headers["ratelimit-policy"],
            "{path}"
        );
        let digits = |b: &[u8]| b.iter().filter(|c| !c.is_ascii_digit()).count();
        assert_eq!(digits(&body), digits(&their_body), "{path}");
        if path == "/both/x" {
            assert!(!written, "two policies violated: not written");
            assert_eq!(out, b"earlier");
            continue;
        }
        assert!(
            written,
            "{path}: one policy advertised and violated: written"
        );
        let mut expected = b"earlier".to_vec();
        expected.extend_from_slice(b"HTTP/1.1 429 Too Many Requests\r\n");
        for (name, value) in &parts.headers {
            expected.extend_from_slice(name.as_str().as_bytes());
            expected.extend_from_slice(b": ");
            expected.extend_from_slice(value.as_bytes());
            expected.extend_from_slice(b"\r\n");
        }
        expected.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
        expected.extend_from_slice(b"date: D\r\n\r\n");
        expected.extend_from_slice(&body);
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected),
            "{path}"
        );
    }
}
