//! Raw -> validated. Each section is checked on its own and every problem is recorded; a
//! value that fails is replaced by its default so later checks can still run.

use super::error::Reporter;
use super::policy::policy;
use super::raw::{RawConfig, RawIdentity, RawServer, RawStore, S};
use super::*;
use crate::config::duration::{parse_duration, DURATION_HELP};
use ipnet::IpNet;
use std::collections::HashSet;
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
    let rls = raw
        .rls
        .and_then(|rls| super::rls::rls(&mut r, rls.into_inner(), &server));
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
            rls,
        })
    } else {
        Err(ConfigErrors(r.errors))
    }
}

/// The value of an optional spanned field, checked by `f`; the default when absent or wrong.
pub(super) fn field<T, U>(
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

pub(super) fn positive(v: &i64, what: &str) -> Result<u64, String> {
    u64::try_from(*v)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("{v} is not allowed; {what} must be a positive integer"))
}

pub(super) fn duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("must be longer than zero; {DURATION_HELP}"));
    }
    Ok(d)
}

pub(super) fn one_of<T: Copy>(s: &str, options: &[(&str, T)]) -> Result<T, String> {
    options
        .iter()
        .find(|(n, _)| *n == s)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<String> = options.iter().map(|(n, _)| format!("{n:?}")).collect();
            format!("{s:?} is not allowed; expected one of {}", names.join(", "))
        })
}

pub(super) fn addr(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("{s:?} is not an address; expected IP:PORT like \"127.0.0.1:8080\""))
}

fn server(r: &mut Reporter<'_>, raw: RawServer) -> ServerConfig {
    let listen = field(
        r,
        "server.listen",
        &raw.listen,
        ([127, 0, 0, 1], 8080).into(),
        |s| addr(s),
    );
    let admin_listen = field(
        r,
        "server.admin_listen",
        &raw.admin_listen,
        ([127, 0, 0, 1], 9090).into(),
        |s| addr(s),
    );
    let upstream = field(r, "server.upstream", &raw.upstream, None, |s| {
        upstream(s).map(Some)
    });
    let upstream_timeout = field(
        r,
        "server.upstream_timeout",
        &raw.upstream_timeout,
        Duration::from_secs(30),
        |s| duration(s),
    );
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

pub(super) fn failure_policy(s: &str) -> Result<FailurePolicy, String> {
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
        Duration::from_millis(20),
        |s| duration(s),
    );
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
        FailurePolicy::Open,
        |s| failure_policy(s),
    );
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
            breaker.open_for,
            |s| duration(s),
        );
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

pub(super) fn sources(
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
