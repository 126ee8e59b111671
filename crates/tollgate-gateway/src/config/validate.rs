//! Raw -> validated. Each section is checked on its own and every problem is recorded; a
//! value that fails is replaced by its default so later checks can still run.

use super::error::Reporter;
use super::raw::{RawConfig, RawIdentity, RawPolicy, RawServer, RawStore, S};
use super::*;
use crate::config::duration::{parse_duration, DURATION_HELP};
use ipnet::IpNet;
use std::collections::HashSet;
use tollgate::{Algorithm, Quota};
use tollgate_tower::ForwardHeader;
use toml::Spanned;

pub(crate) fn validate(
    file: &str,
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let mut r = Reporter::new(file, text);
    let raw: RawConfig = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            r.parse_error(&e);
            return Err(ConfigErrors(r.errors));
        }
    };
    let server = server(
        &mut r,
        raw.server.map(Spanned::into_inner).unwrap_or_default(),
    );
    let store = store(
        &mut r,
        raw.store.map(Spanned::into_inner).unwrap_or_default(),
    );
    let (identity, secret) = identity(
        &mut r,
        raw.identity.map(Spanned::into_inner).unwrap_or_default(),
        &env,
    );
    let mut policies = Vec::new();
    let mut names = HashSet::new();
    for (i, p) in raw.policy.into_iter().enumerate() {
        let span = p.span();
        if let Some(p) = policy(&mut r, i, span.clone(), p.into_inner(), &store) {
            if !names.insert(p.name.clone()) {
                r.at(
                    span,
                    format!("policy[{i}].name"),
                    format!("duplicate policy name {:?}; names must be unique", p.name),
                );
            }
            policies.push(p);
        }
    }
    if server.listen == server.admin_listen {
        r.at(
            0..0,
            "server.admin_listen",
            "must differ from server.listen",
        );
    }
    if r.errors.is_empty() {
        Ok(Config {
            origin: file.to_string(),
            server,
            store,
            identity,
            secret,
            policies,
        })
    } else {
        Err(ConfigErrors(r.errors))
    }
}

/// The value of an optional spanned field, checked by `f`; the default when absent or wrong.
fn field<T, U>(
    r: &mut Reporter<'_>,
    key: &str,
    v: &S<T>,
    default: U,
    f: impl FnOnce(&T) -> Result<U, String>,
) -> U {
    match v {
        None => default,
        Some(s) => match f(s.get_ref()) {
            Ok(u) => u,
            Err(msg) => {
                r.at(s.span(), key, msg);
                default
            }
        },
    }
}

fn positive(v: &i64, what: &str) -> Result<u64, String> {
    u64::try_from(*v)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("{v} is not allowed; {what} must be a positive integer"))
}

fn duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("must be longer than zero; {DURATION_HELP}"));
    }
    Ok(d)
}

fn one_of<T: Copy>(s: &str, options: &[(&str, T)]) -> Result<T, String> {
    options
        .iter()
        .find(|(n, _)| *n == s)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<String> = options.iter().map(|(n, _)| format!("{n:?}")).collect();
            format!("{s:?} is not allowed; expected one of {}", names.join(", "))
        })
}

fn addr(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not an address; expected IP:PORT like \"127.0.0.1:8080\""))
}

fn server(r: &mut Reporter<'_>, raw: RawServer) -> ServerConfig {
    let listen = field(
        r,
        "server.listen",
        &raw.listen,
        ([127, 0, 0, 1], 8080).into(), |s| addr(s));
    let admin_listen = field(
        r,
        "server.admin_listen",
        &raw.admin_listen,
        ([127, 0, 0, 1], 9090).into(), |s| addr(s));
    let upstream = field(r, "server.upstream", &raw.upstream, None, |s| {
        upstream(s).map(Some)
    });
    let upstream_timeout = field(
        r,
        "server.upstream_timeout",
        &raw.upstream_timeout,
        Duration::from_secs(30), |s| duration(s));
    ServerConfig {
        listen,
        admin_listen,
        upstream,
        upstream_timeout,
    }
}

fn upstream(s: &str) -> Result<Upstream, String> {
    const HELP: &str = "expected \"http://HOST:PORT\" optionally followed by a base path";
    let uri: http::Uri = s
        .parse()
        .map_err(|_| format!("{s:?} is not a URL; {HELP}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "{s:?}: https upstreams are not supported; {HELP} (terminate TLS in front)"
            ))
        }
        _ => return Err(format!("{s:?} has no http:// scheme; {HELP}")),
    }
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| format!("{s:?} has no host; {HELP}"))?;
    if uri.query().is_some() {
        return Err(format!("{s:?} has a query string; {HELP}"));
    }
    Ok(Upstream {
        authority,
        base_path: uri.path().trim_end_matches('/').to_string(),
    })
}

fn failure_policy(s: &str) -> Result<FailurePolicy, String> {
    one_of(
        s,
        &[
            ("open", FailurePolicy::Open),
            ("closed", FailurePolicy::Closed),
            ("local", FailurePolicy::Local),
        ],
    )
}

fn redis_url(s: &str) -> Result<String, String> {
    if s.starts_with("redis://") || s.starts_with("rediss://") {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{:?} is not a Redis URL; expected redis://HOST:PORT or rediss://HOST:PORT",
            redact_url(s)
        ))
    }
}

fn store(r: &mut Reporter<'_>, raw: RawStore) -> StoreConfig {
    #[derive(Clone, Copy)]
    enum Kind {
        Memory,
        Redis,
        Cluster,
    }
    let kind = field(r, "store.backend", &raw.backend, Kind::Memory, |s| {
        one_of(
            s,
            &[
                ("memory", Kind::Memory),
                ("redis", Kind::Redis),
                ("redis-cluster", Kind::Cluster),
            ],
        )
    });
    let max_keys = field(r, "store.max_keys", &raw.max_keys, 1_000_000, |v| {
        positive(v, "max_keys").map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    });
    let url = field(r, "store.url", &raw.url, None, |s| redis_url(s).map(Some));
    let mut urls = Vec::new();
    if let Some(list) = &raw.urls {
        for u in list.get_ref() {
            match redis_url(u.get_ref()) {
                Ok(u) => urls.push(u),
                Err(m) => r.at(u.span(), "store.urls", m),
            }
        }
    }
    let backend = match kind {
        Kind::Memory => StoreBackend::Memory { max_keys },
        Kind::Redis => {
            if let Some(list) = &raw.urls {
                r.at(
                    list.span(),
                    "store.urls",
                    "is for backend \"redis-cluster\"; backend \"redis\" takes url = \"redis://...\"",
                );
            }
            StoreBackend::Redis {
                url: url.unwrap_or_else(|| "redis://127.0.0.1:6379".to_string()),
            }
        }
        Kind::Cluster => {
            if let Some(u) = &raw.url {
                r.at(
                    u.span(),
                    "store.url",
                    "backend \"redis-cluster\" takes urls = [\"redis://...\", ...]",
                );
            } else if urls.is_empty() {
                let span = raw.backend.as_ref().map_or(0..0, |b| b.span());
                r.at(span, "store.urls", "backend \"redis-cluster\" needs urls = [\"redis://HOST:PORT\", ...] with at least one node");
            }
            StoreBackend::RedisCluster { urls }
        }
    };
    let timeout = field(
        r,
        "store.timeout",
        &raw.timeout,
        Duration::from_millis(20), |s| duration(s));
    let key_prefix = field(
        r,
        "store.key_prefix",
        &raw.key_prefix,
        "tollgate".to_string(),
        |s| {
            if s.is_empty() || s.contains(['{', '}']) || s.chars().any(char::is_whitespace) {
                Err(format!(
                    "{s:?} is not allowed; expected a non-empty prefix without braces or spaces"
                ))
            } else {
                Ok(s.clone())
            }
        },
    );
    let clock_local = field(r, "store.clock", &raw.clock, false, |s| {
        one_of(s, &[("store", false), ("local", true)])
    });
    let on_failure = field(
        r,
        "store.on_failure",
        &raw.on_failure,
        FailurePolicy::Open, |s| failure_policy(s));
    let local_divisor = field(r, "store.local_divisor", &raw.local_divisor, 20, |v| {
        positive(v, "local_divisor")
    });
    let mut breaker = BreakerConfig {
        failures: 5,
        open_for: Duration::from_secs(1),
    };
    if let Some(b) = &raw.breaker {
        let b = b.get_ref();
        breaker.failures = field(r, "store.breaker.failures", &b.failures, 5, |v| {
            positive(v, "failures").and_then(|n| {
                u32::try_from(n).map_err(|_| "failures must be at most 4294967295".to_string())
            })
        });
        breaker.open_for = field(
            r,
            "store.breaker.open_for",
            &b.open_for,
            breaker.open_for, |s| duration(s));
    }
    StoreConfig {
        backend,
        timeout,
        key_prefix,
        clock_local,
        on_failure,
        local_divisor,
        breaker,
    }
}

fn sources(
    r: &mut Reporter<'_>,
    key: &str,
    list: &Spanned<Vec<Spanned<String>>>,
) -> Vec<IdentitySource> {
    if list.get_ref().is_empty() {
        r.at(
            list.span(),
            key,
            "must not be empty; expected e.g. [\"header:x-api-key\", \"ip\"]",
        );
    }
    let mut out = Vec::new();
    for s in list.get_ref() {
        match s.get_ref().parse::<IdentitySource>() {
            Ok(src) => out.push(src),
            Err(e) => r.at(s.span(), key, e.to_string()),
        }
    }
    out
}

fn identity(
    r: &mut Reporter<'_>,
    raw: RawIdentity,
    env: &impl Fn(&str) -> Option<String>,
) -> (IdentityConfig, Secret) {
    let mut id = IdentityConfig::default();
    if let Some(list) = &raw.sources {
        let s = sources(r, "identity.sources", list);
        if !s.is_empty() {
            id.sources = s;
        }
    }
    if let Some(list) = &raw.trusted_proxies {
        for p in list.get_ref() {
            let s = p.get_ref();
            let net = s
                .parse::<IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from));
            match net {
                Ok(n) => id.trusted_proxies.push(n.trunc()),
                Err(_) => r.at(
                    p.span(),
                    "identity.trusted_proxies",
                    format!(
                        "{s:?} is not allowed; expected an IP address or CIDR like \"10.0.0.0/8\""
                    ),
                ),
            }
        }
    }
    id.client_ip_header = field(
        r,
        "identity.client_ip_header",
        &raw.client_ip_header,
        ForwardHeader::XForwardedFor,
        |s| {
            one_of(
                &s.to_ascii_lowercase(),
                &[
                    ("x-forwarded-for", ForwardHeader::XForwardedFor),
                    ("forwarded", ForwardHeader::Forwarded),
                ],
            )
        },
    );
    id.ipv6_prefix = field(r, "identity.ipv6_prefix", &raw.ipv6_prefix, 64, |v| {
        u8::try_from(*v)
            .ok()
            .filter(|n| (1..=128).contains(n))
            .ok_or_else(|| format!("{v} is not allowed; expected a prefix length from 1 to 128"))
    });
    let secret = field(
        r,
        "identity.secret",
        &raw.secret,
        Secret(DEFAULT_SECRET.as_bytes().to_vec()),
        |s| {
            let expanded = expand_env(s, env)?;
            if expanded.is_empty() {
                return Err(
                    "is empty; expected a non-empty secret (\"${ENV_VAR}\" is expanded)"
                        .to_string(),
                );
            }
            Ok(Secret(expanded.into_bytes()))
        },
    );
    (id, secret)
}

/// Expands `${NAME}` from the environment; an unset variable is an error.
fn expand_env(s: &str, env: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let end = after
            .find('}')
            .ok_or("has an unterminated \"${\"; expected ${ENV_VAR}")?;
        let name = &after[..end];
        let value = env(name).ok_or_else(|| {
            format!("environment variable {name:?} is not set (referenced as ${{{name}}})")
        })?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn policy(
    r: &mut Reporter<'_>,
    i: usize,
    span: std::ops::Range<usize>,
    raw: RawPolicy,
    store: &StoreConfig,
) -> Option<PolicyConfig> {
    let k = |name: &str| format!("policy[{i}].{name}");
    let before = r.errors.len();
    let name = match &raw.name {
        None => {
            r.at(
                span.clone(),
                k("name"),
                "is missing; every policy needs a name matching [A-Za-z0-9_-]+",
            );
            String::new()
        }
        Some(n) => {
            if !valid_name(n.get_ref()) {
                r.at(
                    n.span(),
                    k("name"),
                    format!(
                        "{:?} is not allowed; expected 1 to 64 characters from [A-Za-z0-9_-]",
                        n.get_ref()
                    ),
                );
            }
            n.get_ref().clone()
        }
    };
    let (path_prefix, methods) = match &raw.matches {
        None => ("/".to_string(), Vec::new()),
        Some(m) => {
            let m = m.get_ref();
            let prefix = field(
                r,
                &k("match.path_prefix"),
                &m.path_prefix,
                "/".to_string(),
                |s| {
                    if s.starts_with('/') {
                        Ok(s.clone())
                    } else {
                        Err(format!(
                            "{s:?} is not allowed; expected a path starting with \"/\""
                        ))
                    }
                },
            );
            let mut methods = Vec::new();
            for mth in m
                .methods
                .as_ref()
                .map(|l| l.get_ref().as_slice())
                .unwrap_or(&[])
            {
                match Method::from_bytes(mth.get_ref().to_ascii_uppercase().as_bytes()) {
                    Ok(x) => methods.push(x),
                    Err(_) => r.at(
                        mth.span(),
                        k("match.methods"),
                        format!(
                            "{:?} is not an HTTP method; expected e.g. \"GET\", \"POST\"",
                            mth.get_ref()
                        ),
                    ),
                }
            }
            (prefix, methods)
        }
    };
    let algorithm = match &raw.algorithm {
        None => {
            r.at(span.clone(), k("algorithm"), "is missing; expected one of fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra");
            None
        }
        Some(a) => match a.get_ref().parse::<Algorithm>() {
            Ok(alg) => Some(alg),
            Err(e) => {
                r.at(a.span(), k("algorithm"), e.to_string());
                None
            }
        },
    };
    let limit = match &raw.limit {
        None => {
            r.at(
                span.clone(),
                k("limit"),
                "is missing; expected a positive integer (units per period)",
            );
            None
        }
        Some(l) => match positive(l.get_ref(), "limit") {
            Ok(n) => Some(n),
            Err(m) => {
                r.at(l.span(), k("limit"), m);
                None
            }
        },
    };
    let period = match &raw.period {
        None => {
            r.at(
                span.clone(),
                k("period"),
                format!("is missing; {DURATION_HELP}"),
            );
            None
        }
        Some(p) => match duration(p.get_ref()) {
            Ok(d) => Some(d),
            Err(m) => {
                r.at(p.span(), k("period"), m);
                None
            }
        },
    };
    let burst = field(r, &k("burst"), &raw.burst, None, |v| {
        positive(v, "burst").map(Some)
    });
    let cost = field(r, &k("cost"), &raw.cost, 1, |v| {
        u64::try_from(*v)
            .map_err(|_| format!("{v} is not allowed; cost must be 0 or a positive integer"))
    });
    let identity = raw.identity.as_ref().map(|l| sources(r, &k("identity"), l));
    let on_failure = field(
        r,
        &k("on_failure"),
        &raw.on_failure,
        store.on_failure, |s| failure_policy(s));
    let local_divisor = field(
        r,
        &k("local_divisor"),
        &raw.local_divisor,
        store.local_divisor,
        |v| positive(v, "local_divisor"),
    );
    let shadow = raw.shadow.as_ref().is_some_and(|s| *s.get_ref());
    let lease = field(r, &k("sync"), &raw.sync, false, |s| {
        one_of(s, &[("exact", false), ("lease", true)])
    });
    let ttl = field(
        r,
        &k("lease_ttl"),
        &raw.lease_ttl,
        Duration::from_millis(200), |s| duration(s));
    let max = field(r, &k("lease_max"), &raw.lease_max, 1000, |v| {
        positive(v, "lease_max")
    });
    if !lease {
        for (key, present) in [
            ("lease_ttl", raw.lease_ttl.as_ref().map(|s| s.span())),
            ("lease_max", raw.lease_max.as_ref().map(|s| s.span())),
        ] {
            if let Some(sp) = present {
                r.at(sp, k(key), "only applies with sync = \"lease\"");
            }
        }
    }
    let sync = if lease {
        SyncMode::Lease { ttl, max }
    } else {
        SyncMode::Exact
    };
    // The quota: errors go to the key that caused them.
    let (Some(algorithm), Some(limit_n), Some(period)) = (algorithm, limit, period) else {
        return None;
    };
    let quota = match Quota::new(limit_n, period) {
        Ok(q) => q,
        Err(e) => {
            let (key, sp) = match e {
                tollgate::QuotaError::ZeroLimit
                | tollgate::QuotaError::LimitTooLarge
                | tollgate::QuotaError::RateTooHigh => {
                    ("limit", raw.limit.as_ref().map(|s| s.span()))
                }
                _ => ("period", raw.period.as_ref().map(|s| s.span())),
            };
            r.at(sp.unwrap_or(span), k(key), e.to_string());
            return None;
        }
    };
    let quota = match burst {
        None => quota,
        Some(b) => match quota.with_burst(b) {
            Ok(q) => q,
            Err(e) => {
                r.at(
                    raw.burst.as_ref().map_or(span.clone(), |s| s.span()),
                    k("burst"),
                    e.to_string(),
                );
                return None;
            }
        },
    };
    let limit = match Limit::new(algorithm, quota) {
        Ok(l) => l,
        Err(m) => {
            r.at(
                raw.limit.as_ref().map_or(span.clone(), |s| s.span()),
                k("limit"),
                m,
            );
            return None;
        }
    };
    let capacity = match algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra => quota.burst(),
        _ => quota.limit(),
    };
    if cost > capacity {
        r.at(
            raw.cost.as_ref().map_or(span.clone(), |s| s.span()),
            k("cost"),
            format!("{cost} can never be admitted; cost must be at most {capacity} (the burst of bucket algorithms, the limit of window algorithms)"),
        );
    }
    if r.errors.len() > before {
        return None;
    }
    Some(PolicyConfig {
        name,
        path_prefix,
        methods,
        limit,
        cost,
        identity,
        on_failure,
        local_divisor,
        shadow,
        sync,
    })
}
