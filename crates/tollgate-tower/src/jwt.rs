//! Verified JWT identity: `jwt:<claim>` identity sources read a claim of a bearer token whose
//! signature, algorithm, `exp`, `nbf` and (when configured) `iss` and `aud` were checked.
//!
//! Only the algorithms of the configured keys are accepted: an HS256 secret accepts HS256, a
//! JWKS accepts the RS256, ES256 and EdDSA keys it lists (each key with its own algorithm, so a
//! token can never pick a weaker one; `alg: none` is never a key). The crypto is the
//! `jsonwebtoken` crate's; nothing here is hand-written crypto.

use http::{HeaderMap, HeaderName};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use std::fmt;

/// A verified token's claims.
pub type Claims = serde_json::Map<String, serde_json::Value>;

/// Seconds of clock skew allowed on `exp` and `nbf`.
pub const LEEWAY_SECS: u64 = 30;

/// A token that was present and did not verify (answered with 401, nothing charged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidToken(pub String);

impl fmt::Display for InvalidToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid token: {}", self.0)
    }
}

impl std::error::Error for InvalidToken {}

/// A key (a JWKS, a secret) that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadJwks(pub String);

impl fmt::Display for BadJwks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadJwks {}

struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// Verifies the bearer token of a request.
#[derive(Clone)]
pub struct JwtVerifier {
    header: HeaderName,
    keys: std::sync::Arc<Vec<Key>>,
    issuer: Option<String>,
    audience: Option<String>,
    /// The claim checks of each algorithm the keys use, built when the settings are (not per
    /// token: a `Validation` is a handful of allocations).
    validations: std::sync::Arc<[(Algorithm, Validation)]>,
    /// Signature checks done (shared by clones).
    signatures: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let algs: Vec<String> = self.keys.iter().map(|k| format!("{:?}", k.alg)).collect();
        f.debug_struct("JwtVerifier")
            .field("header", &self.header)
            .field("algorithms", &algs)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// Tokens signed with HS256 and `secret` (which must not be empty).
    pub fn hs256(secret: &[u8]) -> Result<Self, BadJwks> {
        let key = DecodingKey::from_secret(secret)
            .map_err(|e| BadJwks(format!("unusable HS256 secret: {e}")))?;
        Ok(Self::with_keys(vec![Key {
            kid: None,
            alg: Algorithm::HS256,
            key,
        }]))
    }

    /// Tokens signed by a key of the JWKS `json` (RS256, ES256 with P-256, EdDSA with
    /// Ed25519). A key's `alg` must be one of these when given; otherwise it follows from
    /// the key type. Other keys (e.g. symmetric ones) are refused: a public JWKS holds
    /// public keys.
    pub fn from_jwks(json: &str) -> Result<Self, BadJwks> {
        let set: JwkSet = serde_json::from_str(json)
            .map_err(|e| BadJwks(format!("is not a JWKS ({{\"keys\": [...]}}): {e}")))?;
        if set.keys.is_empty() {
            return Err(BadJwks("has no keys".to_string()));
        }
        let mut keys = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let inferred = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
                AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                    Some(Algorithm::ES256)
                }
                AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                    Some(Algorithm::EdDSA)
                }
                _ => None,
            };
            let Some(inferred) = inferred else {
                return Err(BadJwks(format!(
                    "key {i}: only RSA, EC P-256 and OKP Ed25519 public keys are supported"
                )));
            };
            let stated = match jwk.common.key_algorithm {
                None => None,
                Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
                Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
                Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
                Some(other) => {
                    return Err(BadJwks(format!(
                        "key {i}: alg {other:?} is not supported; expected RS256, ES256 or EdDSA"
                    )))
                }
            };
            if stated.is_some_and(|s| s != inferred) {
                return Err(BadJwks(format!(
                    "key {i}: alg {stated:?} does not fit its key type"
                )));
            }
            let key = DecodingKey::from_jwk(jwk)
                .map_err(|e| BadJwks(format!("key {i}: unusable key: {e}")))?;
            keys.push(Key {
                kid: jwk.common.key_id.clone(),
                alg: inferred,
                key,
            });
        }
        Ok(Self::with_keys(keys))
    }

    fn with_keys(keys: Vec<Key>) -> Self {
        Self {
            header: http::header::AUTHORIZATION,
            keys: std::sync::Arc::new(keys),
            issuer: None,
            audience: None,
            validations: std::sync::Arc::new([]),
            signatures: Default::default(),
        }
        .validated()
    }

    /// Builds the claim checks for the current issuer and audience.
    fn validated(mut self) -> Self {
        let mut algs: Vec<Algorithm> = Vec::new();
        for k in self.keys.iter() {
            if !algs.contains(&k.alg) {
                algs.push(k.alg);
            }
        }
        self.validations = algs.into_iter().map(|a| (a, self.validation(a))).collect();
        self
    }

    /// The header carrying `Bearer <token>` (default `authorization`).
    pub fn header(mut self, name: HeaderName) -> Self {
        self.header = name;
        self
    }

    /// `iss` must equal `issuer`.
    pub fn issuer(mut self, issuer: Option<String>) -> Self {
        self.issuer = issuer;
        self.validated()
    }

    /// `aud` must contain `audience`.
    pub fn audience(mut self, audience: Option<String>) -> Self {
        self.audience = audience;
        self.validated()
    }

    /// The required `iss`, if any.
    pub fn required_issuer(&self) -> Option<&str> {
        self.issuer.as_deref()
    }

    /// The required `aud`, if any.
    pub fn required_audience(&self) -> Option<&str> {
        self.audience.as_deref()
    }

    /// The algorithms of the keys it verifies with (e.g. `HS256`), once each; never a key.
    pub fn algorithms(&self) -> Vec<String> {
        let mut algs: Vec<String> = Vec::new();
        for k in self.keys.iter() {
            let a = format!("{:?}", k.alg);
            if !algs.contains(&a) {
                algs.push(a);
            }
        }
        algs
    }

    /// How many signatures this verifier (and its clones) checked: the costly part of a
    /// token, counted so that skipping it can be seen.
    pub fn signatures_checked(&self) -> u64 {
        self.signatures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The header read.
    pub fn header_name(&self) -> &HeaderName {
        &self.header
    }

    /// `None` without a bearer token (the next identity source is tried); the verified
    /// claims; or why a present token is refused.
    pub fn verify(&self, headers: &HeaderMap) -> Option<Result<Claims, InvalidToken>> {
        let value = headers.get(&self.header)?;
        let Ok(text) = value.to_str() else {
            return Some(Err(InvalidToken("the header is not ASCII".to_string())));
        };
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        // Another scheme (an upstream's own Basic auth, say) is no bearer token: the next
        // identity source is tried, as when the header is absent.
        let token = match text.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => return None,
        };
        Some(self.verify_token(token))
    }

    /// Verifies one compact JWS token.
    pub fn verify_token(&self, token: &str) -> Result<Claims, InvalidToken> {
        let header = decode_header(token)
            .map_err(|e| InvalidToken(format!("unreadable token header: {e}")))?;
        let key = self.key_for(&header)?;
        let Some((_, validation)) = self.validations.iter().find(|(a, _)| *a == key.alg) else {
            return Err(InvalidToken(format!("no claim checks for {:?}", key.alg)));
        };
        self.signatures
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        decode::<UniqueClaims>(token, &key.key, validation)
            .map(|data| data.claims.0)
            .map_err(|e| InvalidToken(e.to_string()))
    }

    /// The one configured key a token's header names: the key with its `kid`, or else the only
    /// key of its algorithm without a key id (any key of it when the token names none). Never
    /// several: a forged token costs one signature check, whatever its header says.
    fn key_for(&self, header: &jsonwebtoken::Header) -> Result<&Key, InvalidToken> {
        let same_alg = || self.keys.iter().filter(|k| k.alg == header.alg);
        if let Some(want) = &header.kid {
            if let Some(k) = same_alg().find(|k| k.kid.as_ref() == Some(want)) {
                return Ok(k);
            }
        }
        let mut rest = same_alg().filter(|k| header.kid.is_none() || k.kid.is_none());
        match (rest.next(), rest.next()) {
            (Some(k), None) => Ok(k),
            (None, _) => Err(InvalidToken(format!(
                "no configured key for algorithm {:?}{}",
                header.alg,
                header
                    .kid
                    .as_deref()
                    .map(|k| format!(" and key id {k:?}"))
                    .unwrap_or_default()
            ))),
            (Some(_), Some(_)) => Err(InvalidToken(format!(
                "the token names {} and several configured keys of {:?} could verify it; give each key its own kid",
                header
                    .kid
                    .as_deref()
                    .map_or("no key id (kid)".to_string(), |k| format!("key id {k:?}, which no key has,")),
                header.alg
            ))),
        }
    }

    fn validation(&self, alg: Algorithm) -> Validation {
        let mut v = Validation::new(alg);
        v.leeway = LEEWAY_SECS;
        v.validate_exp = true;
        v.validate_nbf = true;
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
        }
        match &self.audience {
            Some(aud) => v.set_audience(&[aud]),
            None => v.validate_aud = false,
        }
        v
    }
}

/// The claims of a token in which no claim is present twice: a duplicate `plan` would be read
/// one way here and maybe another by the service behind (as a duplicate `sub` or `exp` is,
/// which the JWT library refuses too), so the token is refused.
struct UniqueClaims(Claims);

impl<'de> serde::Deserialize<'de> for UniqueClaims {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = UniqueClaims;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of claims")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Self::Value, A::Error> {
                let mut claims = Claims::new();
                while let Some((k, v)) = a.next_entry::<String, serde_json::Value>()? {
                    if claims.contains_key(&k) {
                        return Err(serde::de::Error::custom("a claim is present twice"));
                    }
                    claims.insert(k, v);
                }
                Ok(UniqueClaims(claims))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A claim as identity bytes: a string as itself, any other JSON value as its JSON text;
/// `None` when absent or null.
pub fn claim_value(claims: &Claims, name: &str) -> Option<String> {
    match claims.get(name)? {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) if s.is_empty() => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// An HS256 token for `claims` signed with `secret`.
    fn hs256_token(secret: &[u8], claims: serde_json::Value) -> String {
        let header = jsonwebtoken::Header::new(Algorithm::HS256);
        let key = jsonwebtoken::EncodingKey::from_secret(secret).expect("key");
        jsonwebtoken::encode(&header, &claims, &key).expect("sign")
    }

    fn far_future() -> serde_json::Value {
        serde_json::json!({ "sub": "a", "exp": 9_999_999_999u64 })
    }

    #[test]
    fn no_header_and_other_schemes_are_no_token_and_a_bad_bearer_is_refused() {
        let v = JwtVerifier::hs256(b"k").expect("key");
        assert!(v.verify(&HeaderMap::new()).is_none());
        let mut h = HeaderMap::new();
        // An upstream's own Basic auth is not ours to refuse: the next source is tried.
        h.insert("authorization", HeaderValue::from_static("Basic dTpw"));
        assert!(v.verify(&h).is_none());
        h.insert(
            "authorization",
            HeaderValue::from_static("Bearer not.a.jwt"),
        );
        assert!(matches!(v.verify(&h), Some(Err(_))));
    }

    #[test]
    fn alg_none_and_foreign_signatures_are_refused() {
        let v = JwtVerifier::hs256(b"the configured secret").expect("key");
        // The verifier does accept a token signed with its own secret...
        let good = hs256_token(b"the configured secret", far_future());
        assert!(v.verify_token(&good).is_ok());
        // ...and refuses the same claims signed with another secret,
        let forged = hs256_token(b"another secret", far_future());
        assert!(v.verify_token(&forged).is_err());
        // the same token with its signature cut off,
        let unsigned = &good[..good.rfind('.').expect("three parts") + 1];
        assert!(v.verify_token(unsigned).is_err());
        // and {"alg":"none","typ":"JWT"} . {"sub":"a","exp":9999999999} . (no signature).
        let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhIiwiZXhwIjo5OTk5OTk5OTk5fQ.";
        assert!(v.verify_token(none).is_err());
    }

    #[test]
    fn jwks_refuses_symmetric_keys_and_garbage() {
        assert!(JwtVerifier::from_jwks("{").is_err());
        assert!(JwtVerifier::from_jwks("{\"keys\":[]}").is_err());
        let oct = r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#;
        assert!(JwtVerifier::from_jwks(oct).is_err());
    }

    /// Claims with `plan` written twice (serde_json writes what it is given).
    struct TwoPlans;
    impl serde::Serialize for TwoPlans {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut m = s.serialize_map(None)?;
            m.serialize_entry("sub", "a")?;
            m.serialize_entry("exp", &9_999_999_999u64)?;
            m.serialize_entry("plan", "free")?;
            m.serialize_entry("plan", "enterprise")?;
            m.end()
        }
    }

    #[test]
    fn a_claim_present_twice_is_refused_like_a_duplicate_sub() {
        let v = JwtVerifier::hs256(b"0123456789abcdef0123").expect("verifier");
        let header = jsonwebtoken::Header::new(Algorithm::HS256);
        let key = jsonwebtoken::EncodingKey::from_secret(b"0123456789abcdef0123").expect("key");
        let token = jsonwebtoken::encode(&header, &TwoPlans, &key).expect("sign");
        let e = v.verify_token(&token).expect_err("two plans");
        assert!(e.0.contains("twice"), "{e}");
        let once = hs256_token(
            b"0123456789abcdef0123",
            serde_json::json!({ "sub": "a", "exp": 9_999_999_999u64, "plan": "free" }),
        );
        assert!(v.verify_token(&once).is_ok());
    }

    #[test]
    fn claims_become_identity_text() {
        let mut c = Claims::new();
        c.insert("sub".into(), "alice".into());
        c.insert("n".into(), 7.into());
        c.insert("e".into(), "".into());
        assert_eq!(claim_value(&c, "sub").as_deref(), Some("alice"));
        assert_eq!(claim_value(&c, "n").as_deref(), Some("7"));
        assert_eq!(claim_value(&c, "e"), None);
        assert_eq!(claim_value(&c, "missing"), None);
    }

    /// The gateway tests' RSA key pair, its public key listed `with_kid` (`None`: no kid).
    fn rsa_jwks(kids: &[Option<&str>]) -> JwtVerifier {
        let jwks: serde_json::Value = serde_json::from_str(include_str!(
            "../../tollgate-gateway/tests/fixtures/jwks.json"
        ))
        .expect("fixture");
        let key = jwks["keys"][0].clone();
        let keys: Vec<serde_json::Value> = kids
            .iter()
            .map(|kid| {
                let mut k = key.clone();
                match kid {
                    Some(kid) => k["kid"] = serde_json::json!(kid),
                    None => {
                        k.as_object_mut().map(|o| o.remove("kid"));
                    }
                }
                k
            })
            .collect();
        JwtVerifier::from_jwks(&serde_json::json!({ "keys": keys }).to_string()).expect("jwks")
    }

    fn rs256_token(kid: Option<&str>) -> String {
        let mut header = jsonwebtoken::Header::new(Algorithm::RS256);
        header.kid = kid.map(str::to_string);
        let pem = include_bytes!("../../tollgate-gateway/tests/fixtures/jwt_rs256.pem");
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(pem).expect("pem");
        jsonwebtoken::encode(&header, &far_future(), &key).expect("sign")
    }

    #[test]
    fn a_token_is_checked_against_one_key_whatever_kid_it_names() {
        // Its own kid: that key.
        let v = rsa_jwks(&[Some("a"), None, None]);
        assert!(v.verify_token(&rs256_token(Some("a"))).is_ok());
        // A kid no key has, or none, where two keys without a kid could verify it: refused
        // (trying both would make one forged token cost two signature checks).
        for kid in [Some("unknown"), None] {
            let e = v.verify_token(&rs256_token(kid)).expect_err("ambiguous");
            assert!(e.0.contains("several configured keys"), "{kid:?}: {e}");
        }
        // One key without a kid: a token naming an unknown kid, or none, is checked with it.
        let v = rsa_jwks(&[Some("a"), None]);
        assert!(v.verify_token(&rs256_token(Some("unknown"))).is_ok());
        assert!(
            v.verify_token(&rs256_token(None)).is_err(),
            "two RS256 keys"
        );
        let v = rsa_jwks(&[Some("a"), Some("b")]);
        let e = v
            .verify_token(&rs256_token(Some("c")))
            .expect_err("no such kid");
        assert!(e.0.contains("no configured key"), "{e}");
    }
}
