//! The configuration as written: only parsed, never trusted. Every field is optional and
//! spanned, so validation can report every problem with the line it sits on, and unknown
//! keys are errors (a typo must not silently disable a limit).

use serde::Deserialize;
use toml::Spanned;

pub(crate) type S<T> = Option<Spanned<T>>;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub server: S<RawServer>,
    pub store: S<RawStore>,
    pub identity: S<RawIdentity>,
    #[serde(default)]
    pub policy: Vec<Spanned<RawPolicy>>,
    pub rls: S<RawRls>,
    pub overrides: S<RawOverridesRef>,
    pub telemetry: S<RawTelemetry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTelemetry {
    pub otlp_endpoint: S<String>,
    pub sample_ratio: S<toml::Value>,
    pub service_name: S<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOverridesRef {
    pub file: S<String>,
}

/// The overrides file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOverridesFile {
    #[serde(rename = "override", default)]
    pub overrides: Vec<Spanned<RawOverride>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOverride {
    pub policy: S<String>,
    pub identity: S<String>,
    pub limit: S<i64>,
    pub period: S<String>,
    pub burst: S<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRls {
    pub listen: S<String>,
    pub config: S<String>,
    pub response_headers: S<String>,
    pub quota_mode: S<bool>,
    pub shadow_mode: S<bool>,
    pub merge_domains: S<bool>,
    pub dynamic_metadata: S<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub listen: S<String>,
    pub admin_listen: S<String>,
    pub upstream: S<String>,
    pub upstream_timeout: S<String>,
    pub forward_auth: S<RawForwardAuth>,
    pub ambiguous_paths: S<String>,
    pub max_connections: S<i64>,
    pub max_connections_per_ip: S<i64>,
    pub admin_max_connections: S<i64>,
    pub admin_max_connections_per_ip: S<i64>,
    pub body_timeout: S<String>,
    pub admin_token: S<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawForwardAuth {
    pub method_header: S<String>,
    pub uri_header: S<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStore {
    pub backend: S<String>,
    pub url: S<String>,
    pub urls: S<Vec<Spanned<String>>>,
    pub master_name: S<String>,
    pub timeout: S<String>,
    pub key_prefix: S<String>,
    pub clock: S<String>,
    pub max_keys: S<i64>,
    pub on_failure: S<String>,
    pub local_divisor: S<i64>,
    pub max_batch: S<i64>,
    pub breaker: S<RawBreaker>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBreaker {
    pub failures: S<i64>,
    pub open_for: S<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIdentity {
    pub sources: S<Vec<Spanned<String>>>,
    pub trusted_proxies: S<Vec<Spanned<String>>>,
    pub allow_any_proxy: S<bool>,
    pub client_ip_header: S<String>,
    pub ipv6_prefix: S<i64>,
    pub secret: S<String>,
    pub proxy_set_headers: S<Vec<Spanned<String>>>,
    pub jwt: S<RawJwt>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwt {
    pub header: S<String>,
    pub jwks_file: S<String>,
    pub hs256_secret: S<String>,
    pub issuer: S<String>,
    pub audience: S<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    pub name: S<String>,
    #[serde(rename = "match")]
    pub matches: S<RawMatch>,
    pub algorithm: S<String>,
    pub limit: S<i64>,
    pub period: S<String>,
    pub burst: S<i64>,
    pub cost: S<i64>,
    pub identity: S<Vec<Spanned<String>>>,
    pub on_failure: S<String>,
    pub local_divisor: S<i64>,
    pub shadow: S<bool>,
    pub sync: S<String>,
    pub lease_ttl: S<String>,
    pub lease_max: S<i64>,
    pub cost_from_request: S<String>,
    pub cost_max: S<i64>,
    pub cost_from_response: S<String>,
    pub hold_ttl: S<String>,
    pub tier: S<String>,
    pub tiers: S<std::collections::BTreeMap<String, Spanned<RawTier>>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTier {
    pub limit: S<i64>,
    pub period: S<String>,
    pub burst: S<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    pub path_prefix: S<String>,
    pub methods: S<Vec<Spanned<String>>>,
    pub case_insensitive: S<bool>,
}
