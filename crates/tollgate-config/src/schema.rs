//! The schema: every key of the configuration, named once. The validators report errors at
//! these names, the restart-only list of a reload is the keys marked here, secrets are marked
//! for redaction, and the config fuzzer builds its files from these names; a test writes each
//! key with a value of the wrong type and checks the error names that very key, and another
//! (in `show`) that `GET /v1/config` shows these keys and no others.

/// One key of `tollgate.toml` (or of the overrides file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// The dotted path as errors print it (`server.listen`; `policy[].limit` for a key of
    /// every `[[policy]]`, which errors print with the index: `policy[0].limit`).
    pub path: &'static str,
    /// A change applies only after a restart: a reload keeps the running value and says so.
    pub restart_only: bool,
    /// The value is a credential: never logged, echoed in an error or shown unredacted.
    pub secret: bool,
    /// A table of other keys (`server.forward_auth = { ... }`), not a value.
    pub table: bool,
}

const fn key(path: &'static str, restart_only: bool, secret: bool, table: bool) -> Key {
    Key {
        path,
        restart_only,
        secret,
        table,
    }
}

/// `server.listen`.
pub const SERVER_LISTEN: &str = "server.listen";
/// `server.admin_listen`.
pub const SERVER_ADMIN_LISTEN: &str = "server.admin_listen";
/// `server.upstream`.
pub const SERVER_UPSTREAM: &str = "server.upstream";
/// `server.upstream_timeout`.
pub const SERVER_UPSTREAM_TIMEOUT: &str = "server.upstream_timeout";
/// `server.forward_auth`.
pub const SERVER_FORWARD_AUTH: &str = "server.forward_auth";
/// `server.forward_auth.method_header`.
pub const SERVER_FORWARD_AUTH_METHOD_HEADER: &str = "server.forward_auth.method_header";
/// `server.forward_auth.uri_header`.
pub const SERVER_FORWARD_AUTH_URI_HEADER: &str = "server.forward_auth.uri_header";
/// `server.ambiguous_paths`.
pub const SERVER_AMBIGUOUS_PATHS: &str = "server.ambiguous_paths";
/// `server.max_connections`.
pub const SERVER_MAX_CONNECTIONS: &str = "server.max_connections";
/// `server.max_connections_per_ip`.
pub const SERVER_MAX_CONNECTIONS_PER_IP: &str = "server.max_connections_per_ip";
/// `server.admin_max_connections`.
pub const SERVER_ADMIN_MAX_CONNECTIONS: &str = "server.admin_max_connections";
/// `server.admin_max_connections_per_ip`.
pub const SERVER_ADMIN_MAX_CONNECTIONS_PER_IP: &str = "server.admin_max_connections_per_ip";
/// `server.body_timeout`.
pub const SERVER_BODY_TIMEOUT: &str = "server.body_timeout";
/// `server.admin_token`.
pub const SERVER_ADMIN_TOKEN: &str = "server.admin_token";
/// `store.backend`.
pub const STORE_BACKEND: &str = "store.backend";
/// `store.url`.
pub const STORE_URL: &str = "store.url";
/// `store.urls`.
pub const STORE_URLS: &str = "store.urls";
/// `store.master_name`.
pub const STORE_MASTER_NAME: &str = "store.master_name";
/// `store.timeout`.
pub const STORE_TIMEOUT: &str = "store.timeout";
/// `store.key_prefix`.
pub const STORE_KEY_PREFIX: &str = "store.key_prefix";
/// `store.clock`.
pub const STORE_CLOCK: &str = "store.clock";
/// `store.max_keys`.
pub const STORE_MAX_KEYS: &str = "store.max_keys";
/// `store.on_failure`.
pub const STORE_ON_FAILURE: &str = "store.on_failure";
/// `store.local_divisor`.
pub const STORE_LOCAL_DIVISOR: &str = "store.local_divisor";
/// `store.max_batch`.
pub const STORE_MAX_BATCH: &str = "store.max_batch";
/// `store.breaker`.
pub const STORE_BREAKER: &str = "store.breaker";
/// `store.breaker.failures`.
pub const STORE_BREAKER_FAILURES: &str = "store.breaker.failures";
/// `store.breaker.open_for`.
pub const STORE_BREAKER_OPEN_FOR: &str = "store.breaker.open_for";
/// `identity.sources`.
pub const IDENTITY_SOURCES: &str = "identity.sources";
/// `identity.trusted_proxies`.
pub const IDENTITY_TRUSTED_PROXIES: &str = "identity.trusted_proxies";
/// `identity.allow_any_proxy`.
pub const IDENTITY_ALLOW_ANY_PROXY: &str = "identity.allow_any_proxy";
/// `identity.client_ip_header`.
pub const IDENTITY_CLIENT_IP_HEADER: &str = "identity.client_ip_header";
/// `identity.ipv6_prefix`.
pub const IDENTITY_IPV6_PREFIX: &str = "identity.ipv6_prefix";
/// `identity.secret`.
pub const IDENTITY_SECRET: &str = "identity.secret";
/// `identity.proxy_set_headers`.
pub const IDENTITY_PROXY_SET_HEADERS: &str = "identity.proxy_set_headers";
/// `identity.jwt`.
pub const IDENTITY_JWT: &str = "identity.jwt";
/// `identity.jwt.header`.
pub const IDENTITY_JWT_HEADER: &str = "identity.jwt.header";
/// `identity.jwt.jwks_file`.
pub const IDENTITY_JWT_JWKS_FILE: &str = "identity.jwt.jwks_file";
/// `identity.jwt.hs256_secret`.
pub const IDENTITY_JWT_HS256_SECRET: &str = "identity.jwt.hs256_secret";
/// `identity.jwt.issuer`.
pub const IDENTITY_JWT_ISSUER: &str = "identity.jwt.issuer";
/// `identity.jwt.audience`.
pub const IDENTITY_JWT_AUDIENCE: &str = "identity.jwt.audience";
/// `rls.listen`.
pub const RLS_LISTEN: &str = "rls.listen";
/// `rls.config`.
pub const RLS_CONFIG: &str = "rls.config";
/// `rls.response_headers`.
pub const RLS_RESPONSE_HEADERS: &str = "rls.response_headers";
/// `rls.quota_mode`.
pub const RLS_QUOTA_MODE: &str = "rls.quota_mode";
/// `rls.shadow_mode`.
pub const RLS_SHADOW_MODE: &str = "rls.shadow_mode";
/// `rls.merge_domains`.
pub const RLS_MERGE_DOMAINS: &str = "rls.merge_domains";
/// `rls.dynamic_metadata`.
pub const RLS_DYNAMIC_METADATA: &str = "rls.dynamic_metadata";
/// `telemetry`.
pub const TELEMETRY: &str = "telemetry";
/// `telemetry.otlp_endpoint`.
pub const TELEMETRY_OTLP_ENDPOINT: &str = "telemetry.otlp_endpoint";
/// `telemetry.sample_ratio`.
pub const TELEMETRY_SAMPLE_RATIO: &str = "telemetry.sample_ratio";
/// `telemetry.service_name`.
pub const TELEMETRY_SERVICE_NAME: &str = "telemetry.service_name";
/// `overrides.file`.
pub const OVERRIDES_FILE: &str = "overrides.file";

/// Every key outside `[[policy]]`, in the order the reference documents them.
pub const KEYS: &[Key] = &[
    key(SERVER_LISTEN, true, false, false),
    key(SERVER_ADMIN_LISTEN, true, false, false),
    key(SERVER_UPSTREAM, false, false, false),
    key(SERVER_UPSTREAM_TIMEOUT, false, false, false),
    key(SERVER_FORWARD_AUTH, false, false, true),
    key(SERVER_FORWARD_AUTH_METHOD_HEADER, false, false, false),
    key(SERVER_FORWARD_AUTH_URI_HEADER, false, false, false),
    key(SERVER_AMBIGUOUS_PATHS, false, false, false),
    key(SERVER_MAX_CONNECTIONS, true, false, false),
    key(SERVER_MAX_CONNECTIONS_PER_IP, true, false, false),
    key(SERVER_ADMIN_MAX_CONNECTIONS, true, false, false),
    key(SERVER_ADMIN_MAX_CONNECTIONS_PER_IP, true, false, false),
    key(SERVER_BODY_TIMEOUT, false, false, false),
    key(SERVER_ADMIN_TOKEN, false, true, false),
    key(STORE_BACKEND, true, false, false),
    key(STORE_URL, true, true, false),
    key(STORE_URLS, true, true, false),
    key(STORE_MASTER_NAME, true, false, false),
    key(STORE_TIMEOUT, true, false, false),
    key(STORE_KEY_PREFIX, true, false, false),
    key(STORE_CLOCK, true, false, false),
    key(STORE_MAX_KEYS, true, false, false),
    key(STORE_ON_FAILURE, false, false, false),
    key(STORE_LOCAL_DIVISOR, false, false, false),
    key(STORE_MAX_BATCH, true, false, false),
    key(STORE_BREAKER, true, false, true),
    key(STORE_BREAKER_FAILURES, true, false, false),
    key(STORE_BREAKER_OPEN_FOR, true, false, false),
    key(IDENTITY_SOURCES, false, false, false),
    key(IDENTITY_TRUSTED_PROXIES, false, false, false),
    key(IDENTITY_ALLOW_ANY_PROXY, false, false, false),
    key(IDENTITY_CLIENT_IP_HEADER, false, false, false),
    key(IDENTITY_IPV6_PREFIX, false, false, false),
    key(IDENTITY_SECRET, false, true, false),
    key(IDENTITY_PROXY_SET_HEADERS, false, false, false),
    key(IDENTITY_JWT, false, false, true),
    key(IDENTITY_JWT_HEADER, false, false, false),
    key(IDENTITY_JWT_JWKS_FILE, false, false, false),
    key(IDENTITY_JWT_HS256_SECRET, false, true, false),
    key(IDENTITY_JWT_ISSUER, false, false, false),
    key(IDENTITY_JWT_AUDIENCE, false, false, false),
    key(RLS_LISTEN, true, false, false),
    key(RLS_CONFIG, false, false, false),
    key(RLS_RESPONSE_HEADERS, false, false, false),
    key(RLS_QUOTA_MODE, false, false, false),
    key(RLS_SHADOW_MODE, false, false, false),
    key(RLS_MERGE_DOMAINS, false, false, false),
    key(RLS_DYNAMIC_METADATA, false, false, false),
    key(OVERRIDES_FILE, false, false, false),
    key(TELEMETRY, true, false, true),
    key(TELEMETRY_OTLP_ENDPOINT, true, false, false),
    key(TELEMETRY_SAMPLE_RATIO, true, false, false),
    key(TELEMETRY_SERVICE_NAME, true, false, false),
];

/// The keys of each `[[policy]]`, relative to it (`tiers.NAME.limit`: NAME is the tier's).
pub const POLICY_KEYS: &[&str] = &[
    "name",
    "match",
    "match.path_prefix",
    "match.methods",
    "match.case_insensitive",
    "algorithm",
    "limit",
    "period",
    "burst",
    "cost",
    "identity",
    "on_failure",
    "local_divisor",
    "shadow",
    "sync",
    "lease_ttl",
    "lease_max",
    "cost_from_request",
    "cost_max",
    "cost_from_response",
    "hold_ttl",
    "tier",
    "tiers",
    "tiers.NAME.limit",
    "tiers.NAME.period",
    "tiers.NAME.burst",
];

/// The keys of each `[[override]]` of the overrides file.
pub const OVERRIDE_KEYS: &[&str] = &["policy", "identity", "limit", "period", "burst"];

/// The keys a reload does not apply (their running values keep serving until a restart).
pub fn restart_only() -> impl Iterator<Item = &'static str> {
    KEYS.iter().filter(|k| k.restart_only).map(|k| k.path)
}

/// The key at `path`, if the schema has one.
pub fn get(path: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.path == path)
}

/// Every name a key path is made of (`server`, `listen`, `forward_auth`, ...), once each: the
/// words the fuzzer builds files from.
pub fn words() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    let all = KEYS
        .iter()
        .map(|k| k.path)
        .chain(POLICY_KEYS.iter().copied())
        .chain(OVERRIDE_KEYS.iter().copied());
    for path in all {
        for w in path.split('.') {
            if w != "NAME" && !out.contains(&w) {
                out.push(w);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_error_key(text: &str) -> String {
        match crate::validate::validate("t.toml", text, |_| None) {
            Ok(_) => String::from("(accepted)"),
            Err(e) => e.0.first().map(|e| e.key.clone()).unwrap_or_default(),
        }
    }

    /// `a.b.c` written as `[a.b]` then `c = value`.
    fn written(path: &str, value: &str) -> String {
        match path.rsplit_once('.') {
            Some((table, leaf)) => format!("[{table}]\n{leaf} = {value}\n"),
            None => format!("{path} = {value}\n"),
        }
    }

    #[test]
    fn every_key_is_reported_under_its_schema_name() {
        for k in KEYS {
            // A wrong type: a table where a value goes, a number where a table goes.
            let value = if k.table { "5" } else { "{ x = 1 }" };
            let text = written(k.path, value);
            assert_eq!(first_error_key(&text), k.path, "{text}");
        }
        for leaf in POLICY_KEYS.iter().filter(|p| !p.contains('.')) {
            let value = if matches!(*leaf, "match" | "tiers") {
                "5"
            } else {
                "{ x = 1 }"
            };
            let text = format!("[[policy]]\n{leaf} = {value}\n");
            assert_eq!(
                first_error_key(&text),
                format!("policy[0].{leaf}"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_key_the_schema_does_not_have_is_refused() {
        for k in KEYS.iter().filter(|k| !k.table) {
            let text = written(&format!("{}_typo", k.path), "1");
            assert_ne!(first_error_key(&text), "(accepted)", "{text}");
        }
    }

    #[test]
    fn secrets_and_restart_keys_are_where_the_contract_says() {
        for s in [
            SERVER_ADMIN_TOKEN,
            IDENTITY_SECRET,
            IDENTITY_JWT_HS256_SECRET,
        ] {
            assert!(get(s).is_some_and(|k| k.secret), "{s}");
        }
        let restart: Vec<&str> = restart_only().collect();
        for r in [SERVER_LISTEN, STORE_BACKEND, RLS_LISTEN] {
            assert!(restart.contains(&r), "{r}");
        }
        assert!(!restart.contains(&IDENTITY_SOURCES));
        assert!(words().contains(&"lease_ttl") && words().contains(&"forward_auth"));
    }
}
