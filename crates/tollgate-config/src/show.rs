//! The effective configuration as `GET /v1/config` shows it: every value after defaults, in
//! the file's key names, with secrets redacted (the identity secret, the JWT secret, the admin
//! token, passwords in store URLs) and override identities shown only as their hashed rule
//! names.

use super::{Config, PolicyConfig, StoreBackend};
use serde_json::{json, Value};
use std::time::Duration;
use tollgate::policy::{FailurePolicy, SyncMode};
use tollgate::quota::Limit;

const REDACTED: &str = "<redacted>";

fn secs(d: Duration) -> Value {
    json!(d.as_secs_f64())
}

fn limit(l: &Limit) -> Value {
    let q = l.quota();
    json!({
        "algorithm": l.algorithm().name(),
        "limit": q.limit(),
        "period_seconds": q.period().as_secs_f64(),
        "burst": q.burst(),
    })
}

fn failure(f: FailurePolicy) -> &'static str {
    f.as_str()
}

fn policy(p: &PolicyConfig) -> Value {
    let sync = match p.spec.sync {
        SyncMode::Exact => json!("exact"),
        SyncMode::Lease { ttl, max } => {
            json!({"mode": "lease", "lease_ttl_seconds": ttl.as_secs_f64(), "lease_max": max})
        }
    };
    let mut v = json!({
        "name": p.spec.name,
        "match": {
            "path_prefix": p.path_prefix,
            "methods": p.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            "case_insensitive": p.case_insensitive,
        },
        "cost": p.spec.cost,
        "identity": p.identity.as_ref().map(|s| s.iter().map(ToString::to_string).collect::<Vec<_>>()),
        "on_failure": failure(p.spec.on_failure),
        "local_divisor": p.spec.local_divisor,
        "shadow": p.spec.shadow,
        "sync": sync,
        "cost_from_request": p.costs.from_request.as_ref().map(|h| h.as_str()),
        "cost_max": p.costs.from_request.as_ref().map(|_| p.costs.max),
        "cost_from_response": p.costs.from_response.as_ref().map(|h| h.as_str()),
        "tier": p.tier.as_ref().map(ToString::to_string),
        "tiers": p.tiers.iter().map(|t| {
            let mut v = limit(&t.spec.limit);
            v["name"] = json!(t.name);
            v["rule"] = json!(t.spec.name);
            v
        }).collect::<Vec<_>>(),
    });
    if let (Value::Object(m), Value::Object(l)) = (&mut v, limit(&p.spec.limit)) {
        m.extend(l);
    }
    v
}

fn store(c: &Config) -> Value {
    let s = &c.store;
    let backend = match &s.backend {
        StoreBackend::Memory { max_keys } => json!({"backend": "memory", "max_keys": max_keys}),
        StoreBackend::Redis { url } => json!({"backend": "redis", "url": super::redact_url(url)}),
        StoreBackend::RedisCluster { urls } => json!({
            "backend": "redis-cluster",
            "urls": urls.iter().map(|u| super::redact_url(u)).collect::<Vec<_>>(),
        }),
        StoreBackend::RedisSentinel { urls, master_name } => json!({
            "backend": "redis-sentinel",
            "urls": urls.iter().map(|u| super::redact_url(u)).collect::<Vec<_>>(),
            "master_name": master_name,
        }),
    };
    let mut v = json!({
        "timeout_seconds": s.timeout.as_secs_f64(),
        "key_prefix": s.key_prefix,
        "clock": if s.clock_local { "local" } else { "store" },
        "on_failure": failure(s.on_failure),
        "local_divisor": s.local_divisor,
        "max_batch": s.max_batch,
        "breaker": {
            "failures": s.breaker.failures,
            "open_for_seconds": secs(s.breaker.open_for),
        },
    });
    if let (Value::Object(m), Value::Object(b)) = (&mut v, backend) {
        m.extend(b);
    }
    v
}

/// The effective configuration, secrets redacted.
pub fn effective(c: &Config) -> Value {
    let s = &c.server;
    let id = &c.identity;
    let jwt = id.jwt.as_ref().map(|j| {
        json!({
            "header": j.header_name().as_str(),
            "algorithms": j.algorithms(),
            "jwks_file": c.jwks_path.as_ref().map(|p| p.display().to_string()),
            "hs256_secret": c.jwks_path.is_none().then_some(REDACTED),
            "issuer": j.required_issuer(),
            "audience": j.required_audience(),
        })
    });
    json!({
        "origin": c.origin,
        "server": {
            "listen": s.listen.to_string(),
            "admin_listen": s.admin_listen.to_string(),
            "admin_token": s.admin_token.as_ref().map(|_| REDACTED),
            "upstream": s.upstream.as_ref().map(|u| format!("http://{}{}", u.authority, u.base_path)),
            "upstream_timeout_seconds": secs(s.upstream_timeout),
            "forward_auth": {
                "method_header": s.forward_auth.method_header.as_str(),
                "uri_header": s.forward_auth.uri_header.as_str(),
                "required": s.forward_auth.require_uri,
            },
            "ambiguous_paths": if s.allow_ambiguous_paths { "allow" } else { "reject" },
            "max_connections": s.max_connections,
            "max_connections_per_ip": s.max_connections_per_ip,
            "admin_max_connections": s.admin_max_connections,
            "admin_max_connections_per_ip": s.admin_max_connections_per_ip,
            "body_timeout_seconds": secs(s.body_timeout),
        },
        "store": store(c),
        "identity": {
            "sources": id.sources.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "trusted_proxies": id.trust.proxies().iter().map(ToString::to_string).collect::<Vec<_>>(),
            "client_ip_header": id.client_ip_header.name(),
            "ipv6_prefix": id.trust.ipv6_prefix(),
            "secret": REDACTED,
            "proxy_set_headers": c.proxy_set_headers.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
            "jwt": jwt,
        },
        "policy": c.policies.iter().map(policy).collect::<Vec<_>>(),
        "overrides": {
            "file": c.overrides_path.as_ref().map(|p| p.display().to_string()),
            "override": c.overrides.iter().map(|o| {
                let mut v = limit(o.limit());
                v["policy"] = json!(o.policy);
                v["rule"] = json!(o.rule_name());
                v
            }).collect::<Vec<_>>(),
        },
        "telemetry": {
            "otlp_endpoint": c.telemetry.otlp_endpoint,
            "sample_ratio": c.telemetry.sample_ratio,
            "service_name": c.telemetry.service_name,
        },
        "rls": c.rls.as_ref().map(|r| json!({
            "listen": r.listen.map(|l| l.to_string()),
            "config": r.config_path.display().to_string(),
            "files": r.config.files(),
            "domains": r.config.domains().collect::<Vec<_>>(),
            "rules": r.config.rules().len(),
            "response_headers": if r.options.response_headers { "draft" } else { "off" },
            "quota_mode": r.options.quota_mode,
            "shadow_mode": r.options.shadow_mode,
            "merge_domains": r.load.merge_domains,
            "dynamic_metadata": r.options.dynamic_metadata,
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;

    /// Dotted paths of every key `v` shows, `_seconds` folded back to the key it renders.
    fn paths(prefix: &str, v: &Value, out: &mut Vec<String>) {
        if let Value::Object(m) = v {
            for (k, v) in m {
                let k = k.strip_suffix("_seconds").unwrap_or(k);
                let p = if prefix.is_empty() {
                    k.to_string()
                } else {
                    format!("{prefix}.{k}")
                };
                if v.is_object() {
                    paths(&p, v, out);
                }
                out.push(p);
            }
        }
    }

    #[test]
    fn get_v1_config_shows_the_schema_keys_and_only_those() {
        let text = "[server]\nadmin_token = \"0123456789abcdef\"\n[store]\nbackend = \"redis-sentinel\"\nurls = [\"redis://:pw@a:1\"]\nmaster_name = \"m\"\n[identity]\nsecret = \"s\"\n[identity.jwt]\nhs256_secret = \"0123456789abcdef0123\"\nissuer = \"i\"\naudience = \"a\"\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:4317\"\n";
        let c = crate::validate::validate("t.toml", text, |_| None).expect("valid");
        let shown = effective(&c);
        let mut got = Vec::new();
        paths("", &shown, &mut got);
        // Shown but not keys: what the config derived, for an operator to read.
        let derived = [
            "server",
            "store",
            "identity",
            "overrides",
            "telemetry",
            "origin",
            "policy",
            "rls",
            "server.forward_auth.required",
            "identity.jwt.algorithms",
            "overrides.override",
        ];
        for p in &got {
            let top = p.split('.').next().unwrap_or_default();
            assert!(
                schema::get(p).is_some() || derived.contains(&p.as_str()) || top == "rls",
                "/v1/config shows {p:?}, which the schema does not name"
            );
        }
        // Keys not shown: the other store backends' settings, the other JWT key source,
        // and allow_any_proxy (a check on trusted_proxies, not a value that serves).
        let unshown = [
            schema::STORE_URL,
            schema::IDENTITY_ALLOW_ANY_PROXY,
            schema::IDENTITY_JWT_JWKS_FILE,
            schema::STORE_MAX_KEYS,
        ];
        for k in schema::KEYS.iter().filter(|k| !k.path.starts_with("rls.")) {
            if unshown.contains(&k.path) {
                continue;
            }
            assert!(
                got.iter().any(|p| p == k.path),
                "/v1/config does not show {}",
                k.path
            );
        }
        let text = shown.to_string();
        for secret in ["0123456789abcdef", "pw@", "\"s\""] {
            assert!(!text.contains(secret), "{secret} shown in {text}");
        }
    }
}
