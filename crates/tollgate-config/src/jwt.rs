//! `[identity.jwt]`: how `jwt:<claim>` identity sources verify the bearer token. Exactly one
//! key source: `hs256_secret` (`${ENV}` expanded) or `jwks_file` (RS256, ES256, EdDSA public
//! keys; a relative path is relative to the TOML file). The keys are loaded here, so
//! `check-config` reports an unreadable or unusable JWKS with the line naming it.

use super::error::Reporter;
use super::fields::{expand_env, field};
use super::raw::RawJwt;
use super::rls::resolve;
use crate::schema as key;
use http::HeaderName;
use tollgate_tower::JwtVerifier;
use toml::Spanned;

pub(super) fn jwt(
    r: &mut Reporter<'_>,
    raw: &Spanned<RawJwt>,
    env: &impl Fn(&str) -> Option<String>,
) -> Option<JwtVerifier> {
    let span = raw.span();
    let raw = raw.get_ref();
    let header = field(
        r,
        key::IDENTITY_JWT_HEADER,
        &raw.header,
        http::header::AUTHORIZATION,
        |s| {
            HeaderName::from_bytes(s.as_bytes())
                .map_err(|_| "is not a header name; expected e.g. \"authorization\"".to_string())
        },
    );
    let non_empty = |key: &str, v: &Option<Spanned<String>>, r: &mut Reporter<'_>| {
        field(r, key, v, None, |s| {
            if s.is_empty() {
                Err("is empty; expected a value, or leave the key out".to_string())
            } else {
                Ok(Some(s.clone()))
            }
        })
    };
    let issuer = non_empty(key::IDENTITY_JWT_ISSUER, &raw.issuer, r);
    let audience = non_empty(key::IDENTITY_JWT_AUDIENCE, &raw.audience, r);
    let toml_file = r.file.to_string();
    let verifier = match (&raw.hs256_secret, &raw.jwks_file) {
        (Some(_), Some(_)) | (None, None) => {
            r.at(
                span,
                key::IDENTITY_JWT,
                "expected exactly one of hs256_secret (\"${ENV_VAR}\" is expanded) or jwks_file",
            );
            None
        }
        (Some(_), None) => field(
            r,
            key::IDENTITY_JWT_HS256_SECRET,
            &raw.hs256_secret,
            None,
            |s| {
                let expanded = expand_env(s, env)?;
                if expanded.len() < 16 {
                    return Err(
                    "is shorter than 16 bytes; expected a long random secret (\"${ENV_VAR}\" is expanded)"
                        .to_string(),
                );
                }
                JwtVerifier::hs256(expanded.as_bytes())
                    .map(Some)
                    .map_err(|e| e.to_string())
            },
        ),
        (None, Some(_)) => field(r, key::IDENTITY_JWT_JWKS_FILE, &raw.jwks_file, None, |s| {
            let path = resolve(&toml_file, s);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                format!("cannot read {}: {e}; expected a JWKS file", path.display())
            })?;
            JwtVerifier::from_jwks(&text)
                .map(Some)
                .map_err(|e| format!("{}: {e}", path.display()))
        }),
    }?;
    Some(verifier.header(header).issuer(issuer).audience(audience))
}
