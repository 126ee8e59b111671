//! `jwt:<claim>` identities through the real `tollgate serve` binary: HS256 (a secret from the
//! environment) and RS256 (a JWKS file; tests/fixtures holds a key pair generated once with
//! openssl for these tests only). Two valid users have their own limits; an expired token, a
//! bad signature, `alg: none`, a wrong issuer or audience, and an algorithm the config did not
//! name are answered 401 problem+json and charge nothing (the decision counters in /metrics
//! stay put, and the same user's quota is still whole afterwards).

mod support;

use http::StatusCode;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use std::time::{SystemTime, UNIX_EPOCH};
use support::*;

const ISSUER: &str = "https://auth.test";
const AUDIENCE: &str = "api";
const HS_SECRET: &str = "jwt-test-secret-6b1f0c9e2d7a4853";
const LIMIT: usize = 3;

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn claims(sub: &str, iss: &str, aud: &str, exp: i64) -> serde_json::Value {
    serde_json::json!({ "sub": sub, "iss": iss, "aud": aud, "exp": exp, "nbf": now() - 5 })
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Signs with the gateway's own key (`alg`: HS256 or RS256).
fn sign(alg: Algorithm, claims: &serde_json::Value) -> String {
    let key = match alg {
        Algorithm::HS256 => EncodingKey::from_secret(HS_SECRET.as_bytes()).expect("secret"),
        _ => {
            let pem = std::fs::read(fixture("jwt_rs256.pem")).expect("test key");
            EncodingKey::from_rsa_pem(&pem).expect("rsa key")
        }
    };
    let mut header = Header::new(alg);
    if alg == Algorithm::RS256 {
        header.kid = Some("test-rs256".to_string());
    }
    encode(&header, claims, &key).expect("sign")
}

fn body(jwt: &str) -> String {
    format!(
        "[identity]\nsources = [\"jwt:sub\", \"ip\"]\n\
         [identity.jwt]\n{jwt}\nissuer = \"{ISSUER}\"\naudience = \"{AUDIENCE}\"\n\
         [[policy]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nlimit = {LIMIT}\nperiod = \"1h\"\n"
    )
}

fn start(alg: Algorithm) -> Gateway {
    match alg {
        Algorithm::HS256 => {
            std::env::set_var("TOLLGATE_TEST_JWT_SECRET", HS_SECRET);
            Gateway::start("", &body("hs256_secret = \"${TOLLGATE_TEST_JWT_SECRET}\""))
        }
        _ => Gateway::start(
            "",
            &body(&format!(
                "jwks_file = {:?}",
                fixture("jwks.json").display().to_string()
            )),
        ),
    }
}

/// Every `tollgate_decisions_total{policy="api",...}` sample, summed.
async fn decided(g: &Gateway) -> u64 {
    let c = client();
    let m = get(&c, &g.admin_url("/metrics"), &[]).await.text();
    m.lines()
        .filter(|l| l.starts_with("tollgate_decisions_total{policy=\"api\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

async fn with_token(g: &Gateway, token: &str) -> Answer {
    let bearer = format!("Bearer {token}");
    get(
        &client(),
        &g.url("/"),
        &[("authorization", bearer.as_bytes())],
    )
    .await
}

/// The header.payload of `token` under `{"alg":"none"}` with an empty signature.
fn as_alg_none(token: &str) -> String {
    let payload = token.split('.').nth(1).expect("payload");
    format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{payload}.")
}

/// `token` with its signature's first character changed.
fn tampered(token: &str) -> String {
    let (rest, sig) = token.rsplit_once('.').expect("signature");
    let mut sig: Vec<char> = sig.chars().collect();
    sig[0] = if sig[0] == 'A' { 'B' } else { 'A' };
    format!("{rest}.{}", sig.into_iter().collect::<String>())
}

async fn two_users_and_refusals(alg: Algorithm) {
    let g = start(alg);
    let exp = now() + 3600;
    let alice = sign(alg, &claims("alice", ISSUER, AUDIENCE, exp));
    let bob = sign(alg, &claims("bob", ISSUER, AUDIENCE, exp));
    for i in 0..LIMIT {
        let a = with_token(&g, &alice).await;
        assert_eq!(a.status, StatusCode::OK, "{alg:?} alice #{i}: {}", a.text());
    }
    let limited = with_token(&g, &alice).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS, "{alg:?}");
    // bob is his own client, and so is a request without a token (by IP).
    assert_eq!(with_token(&g, &bob).await.status, StatusCode::OK, "{alg:?}");
    let anonymous = get(&client(), &g.url("/"), &[]).await;
    assert_eq!(anonymous.status, StatusCode::OK, "{alg:?}");

    let before = decided(&g).await;
    assert!(
        before >= LIMIT as u64 + 3,
        "{alg:?}: /metrics shows {before} decisions"
    );
    let carol = |iss: &str, aud: &str, exp: i64| sign(alg, &claims("carol", iss, aud, exp));
    let other_alg = match alg {
        Algorithm::HS256 => {
            let pem = std::fs::read(fixture("jwt_rs256.pem")).expect("test key");
            let key = EncodingKey::from_rsa_pem(&pem).expect("rsa key");
            encode(
                &Header::new(Algorithm::RS256),
                &claims("carol", ISSUER, AUDIENCE, exp),
                &key,
            )
            .expect("sign")
        }
        // The RS256 gateway names no HS256 key; even one made from its public JWKS is refused.
        _ => encode(
            &Header::new(Algorithm::HS256),
            &claims("carol", ISSUER, AUDIENCE, exp),
            &EncodingKey::from_secret(&std::fs::read(fixture("jwks.json")).expect("jwks"))
                .expect("secret"),
        )
        .expect("sign"),
    };
    let bad = [
        ("expired", carol(ISSUER, AUDIENCE, now() - 600)),
        ("bad signature", tampered(&carol(ISSUER, AUDIENCE, exp))),
        ("alg none", as_alg_none(&carol(ISSUER, AUDIENCE, exp))),
        ("wrong issuer", carol("https://evil.test", AUDIENCE, exp)),
        ("wrong audience", carol(ISSUER, "other", exp)),
        ("unconfigured algorithm", other_alg),
        ("not a jwt", "abc".to_string()),
    ];
    for (what, token) in &bad {
        for _ in 0..LIMIT + 1 {
            let a = with_token(&g, token).await;
            assert_eq!(
                a.status,
                StatusCode::UNAUTHORIZED,
                "{alg:?} {what}: {}",
                a.text()
            );
            assert_eq!(a.header("content-type"), "application/problem+json");
            assert!(
                a.text()
                    .contains("https://tollgate.dev/problems#invalid-token"),
                "{what}: {}",
                a.text()
            );
        }
    }
    assert_eq!(
        decided(&g).await,
        before,
        "{alg:?}: a refused token was decided"
    );
    // carol's quota is whole: none of the refused tokens charged her.
    let good = carol(ISSUER, AUDIENCE, exp);
    for i in 0..LIMIT {
        let a = with_token(&g, &good).await;
        assert_eq!(a.status, StatusCode::OK, "{alg:?} carol #{i}: {}", a.text());
    }
    assert_eq!(
        with_token(&g, &good).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn hs256_users_have_their_own_limits_and_bad_tokens_are_401() {
    two_users_and_refusals(Algorithm::HS256).await;
}

#[tokio::test]
async fn rs256_jwks_users_have_their_own_limits_and_bad_tokens_are_401() {
    two_users_and_refusals(Algorithm::RS256).await;
}

#[test]
fn check_config_reports_jwt_mistakes_with_lines() {
    let cases = [
        (
            "[identity]\nsources = [\"jwt:sub\"]\n",
            "identity.sources",
        ),
        (
            "[identity]\nsources = [\"jwt:sub\"]\n[identity.jwt]\nissuer = \"x\"\n",
            "identity.jwt",
        ),
        (
            "[identity]\nsources = [\"jwt:sub\"]\n[identity.jwt]\nhs256_secret = \"short\"\n",
            "identity.jwt.hs256_secret",
        ),
        (
            "[identity]\nsources = [\"jwt:sub\"]\n[identity.jwt]\njwks_file = \"/nonexistent/jwks.json\"\n",
            "identity.jwt.jwks_file",
        ),
        (
            "[identity]\nsources = [\"jwt:sub\"]\n[identity.jwt]\nhs256_secret = \"0123456789abcdef0\"\nalgorithms = [\"none\"]\n",
            "algorithms",
        ),
    ];
    for (text, key) in cases {
        let path = scratch("jwt.toml");
        std::fs::write(&path, text).expect("write");
        let (accepted, err) = run_check_config(&path);
        assert!(!accepted, "{text:?} was accepted");
        let line_ref = format!("{}:", path.display());
        assert!(err.contains(&line_ref), "{text:?}: no file:line in {err}");
        assert!(err.contains(key), "{text:?}: {key} not in {err}");
    }
}

#[tokio::test]
async fn forged_tokens_are_charged_to_the_per_ip_policy_and_limited_like_any_request() {
    let jwks = format!(
        "jwks_file = {:?}",
        fixture("jwks.json").display().to_string()
    );
    let per_ip = "[[policy]]\nname = \"per_ip\"\nidentity = [\"ip\"]\nalgorithm = \"fixed_window\"\nlimit = 3\nperiod = \"1h\"\n";
    let g = Gateway::start("", &format!("{}{per_ip}", body(&jwks)));
    // Signed by no configured key, naming a key id of the attacker's choosing.
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("attacker-chosen-kid-5d2e".to_string());
    let forged = encode(
        &header,
        &claims("mallory", ISSUER, AUDIENCE, now() + 600),
        &EncodingKey::from_secret(b"not the key").expect("key"),
    )
    .expect("sign");
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let a = with_token(&g, &forged).await;
        if a.status == StatusCode::UNAUTHORIZED {
            let text = a.text();
            assert!(
                !text.contains("attacker-chosen-kid"),
                "echoes the kid: {text}"
            );
        }
        statuses.push(a.status.as_u16());
    }
    assert_eq!(
        statuses,
        [401, 401, 401, 429, 429, 429, 429, 429, 429, 429],
        "{}",
        g.log_text()
    );
    let m = get(&client(), &g.admin_url("/metrics"), &[]).await.text();
    assert!(
        m.contains("tollgate_decisions_total{policy=\"per_ip\",outcome=\"limited\"} 7"),
        "{m}"
    );
    // The policy keyed by the token's subject was charged nothing.
    assert_eq!(decided(&g).await, 0, "{m}");
}
