//! JwtVerifier with a JWKS of an ES256 (P-256) and an EdDSA (Ed25519) key, generated once with
//! openssl for these tests only (tests/fixtures): tokens signed by either verify and yield
//! their claims; a token whose header names the other key's id, an algorithm the JWKS has no
//! key for, an expired token (past the 30 s leeway) and one not yet valid are refused, while
//! a token expired 10 s ago is still inside the leeway.

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use std::time::{SystemTime, UNIX_EPOCH};
use tollgate_tower::JwtVerifier;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("fixture")
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn sign(alg: Algorithm, kid: &str, claims: serde_json::Value) -> String {
    let key = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_pem(&fixture("es256.pem")).expect("ec key"),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(&fixture("ed25519.pem")).expect("ed key"),
        _ => EncodingKey::from_secret(b"0123456789abcdef0123").expect("secret"),
    };
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_string());
    encode(&header, &claims, &key).expect("sign")
}

fn verifier() -> JwtVerifier {
    let text = String::from_utf8(fixture("jwks_ec_ed.json")).expect("utf-8");
    JwtVerifier::from_jwks(&text).expect("jwks")
}

#[test]
fn es256_and_eddsa_tokens_verify_with_their_own_keys() {
    let v = verifier();
    let claims = |sub: &str| serde_json::json!({ "sub": sub, "exp": now() + 600 });
    let es = v
        .verify_token(&sign(Algorithm::ES256, "test-es256", claims("ec-user")))
        .expect("es256 verifies");
    assert_eq!(es.get("sub").and_then(|s| s.as_str()), Some("ec-user"));
    let ed = v
        .verify_token(&sign(Algorithm::EdDSA, "test-eddsa", claims("ed-user")))
        .expect("eddsa verifies");
    assert_eq!(ed.get("sub").and_then(|s| s.as_str()), Some("ed-user"));
    // Without a kid, the keys of the token's algorithm are tried.
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = None;
    let key = EncodingKey::from_ed_pem(&fixture("ed25519.pem")).expect("ed key");
    let no_kid = encode(&header, &claims("anon"), &key).expect("sign");
    assert!(v.verify_token(&no_kid).is_ok());
}

#[test]
fn wrong_key_id_other_algorithms_and_times_are_refused() {
    let v = verifier();
    let ok = serde_json::json!({ "sub": "u", "exp": now() + 600 });
    // (algorithm, key id, claims): each refused.
    let refused = [
        (Algorithm::ES256, "test-eddsa", ok.clone()),
        (Algorithm::HS256, "test-es256", ok),
        (
            Algorithm::ES256,
            "test-es256",
            serde_json::json!({ "sub": "u", "exp": now() - 120 }),
        ),
        (
            Algorithm::ES256,
            "test-es256",
            serde_json::json!({ "sub": "u", "exp": now() + 600, "nbf": now() + 120 }),
        ),
        (
            Algorithm::ES256,
            "test-es256",
            serde_json::json!({ "sub": "u" }),
        ),
    ];
    for (alg, kid, claims) in refused {
        let token = sign(alg, kid, claims.clone());
        assert!(v.verify_token(&token).is_err(), "{alg:?} {kid} {claims}");
    }
    let within_leeway = serde_json::json!({ "sub": "u", "exp": now() - 10 });
    assert!(v
        .verify_token(&sign(Algorithm::ES256, "test-es256", within_leeway))
        .is_ok());
}

/// With two keys of one algorithm, a token without a key id is refused (no token may make
/// the gateway try every key); with its key id it verifies.
#[test]
fn a_token_without_kid_is_refused_when_several_keys_share_its_algorithm() {
    let mut jwks: serde_json::Value =
        serde_json::from_slice(&fixture("jwks_ec_ed.json")).expect("jwks json");
    let keys = jwks["keys"].as_array_mut().expect("keys");
    let mut twin = keys
        .iter()
        .find(|k| k["kid"] == "test-es256")
        .expect("the es256 key")
        .clone();
    twin["kid"] = "test-es256-twin".into();
    keys.push(twin);
    let v = JwtVerifier::from_jwks(&jwks.to_string()).expect("jwks");
    let claims = serde_json::json!({ "sub": "u", "exp": now() + 600 });
    assert!(v
        .verify_token(&sign(Algorithm::ES256, "test-es256-twin", claims.clone()))
        .is_ok());
    let mut header = Header::new(Algorithm::ES256);
    header.kid = None;
    let key = EncodingKey::from_ec_pem(&fixture("es256.pem")).expect("ec key");
    let no_kid = encode(&header, &claims, &key).expect("sign");
    let err = v.verify_token(&no_kid).expect_err("no kid, two ES256 keys");
    assert!(err.to_string().contains("key id"), "{err}");
}
