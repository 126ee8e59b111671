//! The cost of JWT identity per request in decision mode: `RateLimitLayer::check_request`
//! (resolve, verify, plan, `Limiter::check` on the memory store) for one token-bucket policy
//! whose clients are identified by an API key header, by `jwt:sub` of an HS256 token, or by
//! `jwt:sub` of an RS256 token (2048-bit key, from a JWKS). The same request every time, under
//! a limit it never reaches, so the difference between the three is the verification.
//!
//! Run: `cargo bench -p tollgate-tower --bench jwt -- --quick`.

// `criterion_group!` generates a public function without docs.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use http::Request;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use std::hint::black_box;
use tollgate::quota::{Limit, Quota};
use tollgate::{IdentityHasher, Limiter, LimiterConfig, PolicySpec};
use tollgate_tower::{
    IdentityConfig, IdentitySource, JwtVerifier, PeerAddr, RateLimitLayer, RoutedPolicy,
};

const SECRET: &[u8] = b"bench-hs256-secret-0123456789abcdef";
const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tollgate-gateway/tests/fixtures"
);

fn layer(source: IdentitySource, jwt: Option<JwtVerifier>) -> RateLimitLayer {
    let limiter = Limiter::new(LimiterConfig::default());
    let quota = Quota::per_hour(1_000_000_000).expect("quota");
    let limit = Limit::new(tollgate::quota::Algorithm::TokenBucket, quota).expect("limit");
    let policy = limiter
        .policy(PolicySpec::new("api", limit))
        .expect("policy");
    RateLimitLayer::new(limiter, IdentityHasher::new(b"bench"))
        .identity(IdentityConfig {
            sources: vec![source],
            jwt,
            ..IdentityConfig::default()
        })
        .policy(RoutedPolicy::new(policy))
}

fn token(alg: Algorithm) -> String {
    let claims = serde_json::json!({ "sub": "user-42", "exp": 4_000_000_000u64 });
    let key = match alg {
        Algorithm::HS256 => EncodingKey::from_secret(SECRET).expect("secret"),
        _ => {
            let pem = std::fs::read(format!("{FIXTURES}/jwt_rs256.pem")).expect("fixture key");
            EncodingKey::from_rsa_pem(&pem).expect("rsa key")
        }
    };
    encode(&Header::new(alg), &claims, &key).expect("sign")
}

fn request(header: &str, value: &str) -> Request<()> {
    let mut req = Request::get("/v1/items")
        .header(header, value)
        .body(())
        .expect("request");
    req.extensions_mut()
        .insert(PeerAddr("127.0.0.1:40000".parse().expect("addr")));
    req
}

fn decision_mode(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let jwks = std::fs::read_to_string(format!("{FIXTURES}/jwks.json")).expect("jwks");
    let cases = [
        (
            "header_api_key",
            layer("header:x-api-key".parse().expect("source"), None),
            request("x-api-key", "sk_live_0123456789"),
        ),
        (
            "jwt_hs256",
            layer(
                IdentitySource::Jwt("sub".into()),
                Some(JwtVerifier::hs256(SECRET).expect("key")),
            ),
            request(
                "authorization",
                &format!("Bearer {}", token(Algorithm::HS256)),
            ),
        ),
        (
            "jwt_rs256",
            layer(
                IdentitySource::Jwt("sub".into()),
                Some(JwtVerifier::from_jwks(&jwks).expect("jwks")),
            ),
            request(
                "authorization",
                &format!("Bearer {}", token(Algorithm::RS256)),
            ),
        ),
    ];
    let mut group = c.benchmark_group("decision");
    for (name, layer, req) in &cases {
        let allowed = rt
            .block_on(layer.check_request(req))
            .expect("not refused")
            .expect("matched")
            .is_allowed();
        assert!(allowed, "{name}: the bench request must be allowed");
        group.bench_function(*name, |b| {
            b.iter(|| rt.block_on(layer.check_request(black_box(req))))
        });
    }
    group.finish();
}

criterion_group!(benches, decision_mode);
criterion_main!(benches);
