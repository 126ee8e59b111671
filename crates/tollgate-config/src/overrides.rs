//! `[overrides] file`: named clients with their own quota. The file holds
//! `[[override]] policy = "api", identity = "header:x-api-key=KEY", limit = N` (period and
//! burst default to the policy's). Each identity is hashed at load with the identity secret,
//! exactly as a request's would be, and only the hash is kept: the raw key lives no longer than
//! this function. Errors name the overrides file and its lines.

use super::error::Reporter;
use super::fields::{duration, field, positive, span_or, variant};
use super::raw::{RawOverride, RawOverridesFile, RawOverridesRef};
use super::rls::resolve;
use super::{OverrideConfig, PolicyConfig};
use crate::schema as key;
use std::collections::HashSet;
use std::path::PathBuf;
use tollgate::IdentityHasher;
use tollgate_tower::{IdentityConfig, IdentitySource};
use toml::Spanned;

/// The overrides of `raw`, with the path they were read from; errors go to `r` (the main
/// config's reporter, for the `[overrides]` table) or carry the overrides file's own lines.
pub(super) fn overrides(
    r: &mut Reporter<'_>,
    raw: &Spanned<RawOverridesRef>,
    policies: &[PolicyConfig],
    identity: &IdentityConfig,
    hasher: &IdentityHasher,
) -> (Option<PathBuf>, Vec<OverrideConfig>) {
    let Some(file) = &raw.get_ref().file else {
        r.at(
            raw.span(),
            key::OVERRIDES_FILE,
            "is missing; expected the path of a TOML file of [[override]] entries",
        );
        return (None, Vec::new());
    };
    let path = resolve(r.file, file.get_ref());
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            r.at(
                file.span(),
                key::OVERRIDES_FILE,
                format!(
                    "cannot read {}: {e}; expected a TOML file of [[override]] entries",
                    path.display()
                ),
            );
            return (Some(path), Vec::new());
        }
    };
    let name = path.display().to_string();
    let mut o = Reporter::new(&name, &text);
    let out = entries(&mut o, &text, policies, identity, hasher);
    r.errors.extend(o.errors);
    (Some(path), out)
}

fn entries(
    o: &mut Reporter<'_>,
    text: &str,
    policies: &[PolicyConfig],
    identity: &IdentityConfig,
    hasher: &IdentityHasher,
) -> Vec<OverrideConfig> {
    let raw: RawOverridesFile = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            o.parse_error(&e);
            return Vec::new();
        }
    };
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, entry) in raw.overrides.into_iter().enumerate() {
        let span = entry.span();
        if let Some(c) = entry_of(
            o,
            i,
            span.clone(),
            entry.into_inner(),
            policies,
            identity,
            hasher,
        ) {
            if !seen.insert((c.policy.clone(), c.client)) {
                o.at(
                    span,
                    format!("override[{i}].identity"),
                    "duplicate: this policy already has an override for this identity",
                );
                continue;
            }
            out.push(c);
        }
    }
    out
}

fn entry_of(
    o: &mut Reporter<'_>,
    i: usize,
    span: std::ops::Range<usize>,
    raw: RawOverride,
    policies: &[PolicyConfig],
    identity: &IdentityConfig,
    hasher: &IdentityHasher,
) -> Option<OverrideConfig> {
    let k = |key: &str| format!("override[{i}].{key}");
    let before = o.errors.len();
    let policy = match &raw.policy {
        None => {
            o.at(
                span.clone(),
                k("policy"),
                "is missing; expected the name of a [[policy]]",
            );
            None
        }
        Some(p) => {
            let found = policies.iter().find(|x| x.name() == p.get_ref());
            if found.is_none() {
                let names: Vec<String> =
                    policies.iter().map(|x| format!("{:?}", x.name())).collect();
                o.at(
                    p.span(),
                    k("policy"),
                    format!("is not a policy; expected one of {}", names.join(", ")),
                );
            }
            found
        }
    };
    let client = match &raw.identity {
        None => {
            o.at(
                span.clone(),
                k("identity"),
                "is missing; expected \"SOURCE=VALUE\", e.g. \"header:x-api-key=KEY\"",
            );
            None
        }
        Some(id) => match client_key(id.get_ref().as_bytes(), policy, identity, hasher) {
            Ok(c) => Some(c),
            Err(m) => {
                // The message never repeats the value: it may be a secret API key.
                o.at(id.span(), k("identity"), m);
                None
            }
        },
    };
    let limit_n = match &raw.limit {
        None => {
            o.at(
                span.clone(),
                k("limit"),
                "is missing; expected a positive integer (units per period)",
            );
            None
        }
        Some(l) => positive(l.get_ref(), "limit")
            .map_err(|m| o.at(l.span(), k("limit"), m))
            .ok(),
    };
    let policy = policy?;
    let base = policy.limit().quota();
    let period = field(o, &k("period"), &raw.period, base.period(), |s| duration(s));
    let policy_burst = (base.burst() != base.limit()).then_some(base.burst());
    let burst = field(o, &k("burst"), &raw.burst, policy_burst, |v| {
        positive(v, "burst").map(Some)
    });
    let (client, limit_n) = (client?, limit_n?);
    if o.errors.len() > before {
        return None;
    }
    let rule = OverrideConfig::rule_name_of(policy.name(), &client);
    match variant(&policy.spec, rule, (limit_n, period, burst)) {
        Ok(spec) => Some(OverrideConfig {
            policy: policy.name().to_string(),
            client,
            spec,
        }),
        Err((field, m)) => {
            let written = match field {
                tollgate::PolicyField::Period => span_or(&raw.period, &span),
                tollgate::PolicyField::Burst => span_or(&raw.burst, &span),
                _ => span_or(&raw.limit, &span),
            };
            o.at(written, k(field.as_str()), m);
            None
        }
    }
}

/// The hashed client key of `SOURCE=VALUE`, as a request identified by that source would get.
/// The value is bytes: a header may carry any (an API key that is not UTF-8 is a client of
/// its own, never the one its lossy reading names).
pub(super) fn client_key(
    spec: &[u8],
    policy: Option<&PolicyConfig>,
    identity: &IdentityConfig,
    hasher: &IdentityHasher,
) -> Result<tollgate::ClientKey, String> {
    let expected = || {
        "expected \"SOURCE=VALUE\", e.g. \"header:x-api-key=KEY\" or \"ip=192.0.2.7\"".to_string()
    };
    let eq = spec.iter().position(|b| *b == b'=').ok_or_else(expected)?;
    let (src, value) = (&spec[..eq], &spec[eq + 1..]);
    let src = std::str::from_utf8(src).map_err(|_| expected())?;
    let source: IdentitySource = src
        .parse()
        .map_err(|e: tollgate_tower::BadIdentitySource| e.to_string())?;
    if value.is_empty() {
        return Err("has an empty value; expected \"SOURCE=VALUE\"".to_string());
    }
    if let Some(p) = policy {
        let sources = p.identity.as_deref().unwrap_or(&identity.sources);
        if !sources.contains(&source) {
            let names: Vec<String> = sources
                .iter()
                .map(|s| format!("{:?}", s.to_string()))
                .collect();
            return Err(format!(
                "source {src:?} is not one policy {:?} identifies clients by (it uses {}), so this override could never apply",
                p.name(),
                names.join(", ")
            ));
        }
    }
    Ok(match source {
        IdentitySource::Ip => {
            let ip: std::net::IpAddr = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| "the ip value is not an IP address".to_string())?;
            let addr = identity
                .client_addr(Some(ip), &http::HeaderMap::new())
                .ok_or_else(|| "the ip value is not an IP address".to_string())?;
            hasher.client_key("ip", addr.as_bytes())
        }
        other => hasher.client_key(&other.name(), value),
    })
}
