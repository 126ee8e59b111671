//! Raw -> validated. Each section is checked on its own and every problem is recorded; a
//! value that fails is replaced by its default so later checks can still run.

use super::error::Reporter;
use super::fields::{duration, expand_env, field, one_of, positive, sources};
use super::policy::policy;
use super::raw::{RawConfig, RawForwardAuth, RawIdentity, RawServer};
use super::store::store;
use super::*;
use crate::schema as key;
use ipnet::IpNet;
use std::collections::HashSet;
use tollgate_tower::{ForwardAuth, ForwardHeader};
use toml::Spanned;

pub(crate) fn validate(
    file: &str,
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    validate_keyed(file, text, env, None)
}

/// [`validate`], the identities keyed by `keying` (see [`Keying`]), or by the file's own store
/// when `None`.
pub(crate) fn validate_keyed(
    file: &str,
    text: &str,
    env: impl Fn(&str) -> Option<String>,
    keying: Option<Keying>,
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
        &env,
    );
    let jwks_path = raw
        .identity
        .as_ref()
        .and_then(|i| i.get_ref().jwt.as_ref())
        .and_then(|j| j.get_ref().jwks_file.as_ref())
        .map(|f| super::rls::resolve(file, f.get_ref()));
    let store = store(
        &mut r,
        raw.store.map(Spanned::into_inner).unwrap_or_default(),
        &env,
    );
    let proxy_set = raw.identity.as_ref().map_or(Vec::new(), |i| {
        super::header_tiers::proxy_set_headers(&mut r, &i.get_ref().proxy_set_headers)
    });
    let (identity, secret) = identity(
        &mut r,
        raw.identity.map(Spanned::into_inner).unwrap_or_default(),
        &env,
    );
    let mut policies = Vec::new();
    let mut names = HashSet::new();
    for (i, p) in raw.policy.into_iter().enumerate() {
        let span = p.span();
        let decision_mode = server.upstream.is_none();
        if let Some(p) = policy(
            &mut r,
            i,
            span.clone(),
            p.into_inner(),
            &store,
            decision_mode,
        ) {
            let jwt_source = p.identity.iter().flatten().any(is_jwt)
                || matches!(p.tier, Some(tollgate_tower::TierSource::Jwt(_)));
            if jwt_source
                && identity.jwt.is_none()
                && !r
                    .errors
                    .iter()
                    .any(|e| e.key.starts_with(key::IDENTITY_JWT))
            {
                r.at(
                    span.clone(),
                    format!("policy[{i}].identity"),
                    "a jwt:<claim> identity or tier needs [identity.jwt] (hs256_secret or jwks_file) to verify the token",
                );
            }
            if !names.insert(p.name().to_string()) {
                r.at(
                    span,
                    format!("policy[{i}].name"),
                    format!("duplicate policy name {:?}; names must be unique", p.name()),
                );
            }
            policies.push(p);
        }
    }
    let hasher = keying
        .unwrap_or_else(|| Keying::of(&store.backend))
        .hasher(&secret.0);
    let (overrides_path, overrides) = match &raw.overrides {
        None => (None, Vec::new()),
        Some(o) => super::overrides::overrides(&mut r, o, &policies, &identity, &hasher),
    };
    let telemetry = super::telemetry::telemetry(
        &mut r,
        raw.telemetry.map(Spanned::into_inner).unwrap_or_default(),
        &env,
    );
    let rls = raw
        .rls
        .and_then(|rls| super::rls::rls(&mut r, rls.into_inner(), &server, &store));
    if server.listen == server.admin_listen {
        r.at(
            0..0,
            key::SERVER_ADMIN_LISTEN,
            "must differ from server.listen",
        );
    }
    let mut warnings = Vec::new();
    if policies.is_empty() {
        warnings.push(format!(
            "warning: {file}: no [[policy]]: every request passes unlimited; add a [[policy]] with name, algorithm, limit and period"
        ));
    }
    warnings.extend(super::header_tiers::warnings(
        file,
        &policies,
        &identity.trust,
        &proxy_set,
    ));
    warnings.extend(super::log_cost::warnings(
        file,
        &policies,
        rls.as_ref(),
        &store.backend,
    ));
    if r.errors.is_empty() {
        Ok(Config {
            origin: file.to_string(),
            server,
            store,
            identity,
            secret,
            proxy_set_headers: proxy_set,
            hasher,
            policies,
            warnings,
            rls,
            overrides_path,
            overrides,
            jwks_path,
            telemetry,
        })
    } else {
        Err(ConfigErrors(r.errors))
    }
}

pub(super) fn addr(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| "is not an address; expected IP:PORT like \"127.0.0.1:8080\"".to_string())
}

fn server(
    r: &mut Reporter<'_>,
    raw: RawServer,
    env: &impl Fn(&str) -> Option<String>,
) -> ServerConfig {
    let listen = field(
        r,
        key::SERVER_LISTEN,
        &raw.listen,
        ([127, 0, 0, 1], 8080).into(),
        |s| addr(s),
    );
    let admin_listen = field(
        r,
        key::SERVER_ADMIN_LISTEN,
        &raw.admin_listen,
        ([127, 0, 0, 1], 9090).into(),
        |s| addr(s),
    );
    let upstream = field(r, key::SERVER_UPSTREAM, &raw.upstream, None, |s| {
        upstream(s).map(Some)
    });
    let upstream_timeout = field(
        r,
        key::SERVER_UPSTREAM_TIMEOUT,
        &raw.upstream_timeout,
        Duration::from_secs(30),
        |s| duration(s),
    );
    let forward_auth = match &raw.forward_auth {
        None => ForwardAuth::default(),
        Some(fa) => {
            if upstream.is_some() {
                r.at(
                    fa.span(),
                    key::SERVER_FORWARD_AUTH,
                    "is for decision mode; remove it or server.upstream",
                );
            }
            forward_auth(r, fa.get_ref())
        }
    };
    let allow_ambiguous_paths = field(
        r,
        key::SERVER_AMBIGUOUS_PATHS,
        &raw.ambiguous_paths,
        false,
        |s| one_of(s, &[("reject", false), ("allow", true)]),
    );
    let count =
        |v: &i64, what: &str| positive(v, what).map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let max_connections = field(
        r,
        key::SERVER_MAX_CONNECTIONS,
        &raw.max_connections,
        10_000,
        |v| count(v, "max_connections"),
    );
    let max_connections_per_ip = field(
        r,
        key::SERVER_MAX_CONNECTIONS_PER_IP,
        &raw.max_connections_per_ip,
        256,
        |v| count(v, "max_connections_per_ip"),
    );
    let admin_max_connections = field(
        r,
        key::SERVER_ADMIN_MAX_CONNECTIONS,
        &raw.admin_max_connections,
        64,
        |v| count(v, "admin_max_connections"),
    );
    let admin_max_connections_per_ip = field(
        r,
        key::SERVER_ADMIN_MAX_CONNECTIONS_PER_IP,
        &raw.admin_max_connections_per_ip,
        16,
        |v| count(v, "admin_max_connections_per_ip"),
    );
    let body_timeout = field(
        r,
        key::SERVER_BODY_TIMEOUT,
        &raw.body_timeout,
        Duration::from_secs(30),
        |s| duration(s),
    );
    let admin_token = field(r, key::SERVER_ADMIN_TOKEN, &raw.admin_token, None, |s| {
        admin_token(s, env).map(Some)
    });
    if raw.admin_token.is_none() && !admin_listen.ip().is_loopback() {
        if let Some(at) = &raw.admin_listen {
            r.at(
                at.span(),
                key::SERVER_ADMIN_LISTEN,
                format!(
                    "{admin_listen} is not a loopback address and server.admin_token is not set; the admin API resets clients and reloads the config, so set admin_token = \"${{ADMIN_TOKEN}}\" or listen on 127.0.0.1"
                ),
            );
        }
    }
    ServerConfig {
        listen,
        admin_listen,
        admin_token,
        upstream,
        upstream_timeout,
        forward_auth,
        allow_ambiguous_paths,
        max_connections,
        max_connections_per_ip,
        admin_max_connections,
        admin_max_connections_per_ip,
        body_timeout,
    }
}

/// `[server] admin_token`: `${ENV}` expanded; at least 16 visible ASCII characters (it is
/// compared with a bearer token, which cannot hold spaces or control characters).
fn admin_token(s: &str, env: &impl Fn(&str) -> Option<String>) -> Result<Secret, String> {
    let token = expand_env(s, env)?;
    if token.len() < 16 {
        return Err(
            "is shorter than 16 characters; expected a long random token (\"${ENV_VAR}\" is expanded)"
                .to_string(),
        );
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "holds a space, a control or a non-ASCII character; expected visible ASCII only"
                .to_string(),
        );
    }
    Ok(Secret(token.into_bytes()))
}

/// `[server] forward_auth`: written means required (a trusted request without the URI
/// header is refused); each name defaults to the Caddy/Traefik one.
fn forward_auth(r: &mut Reporter<'_>, raw: &RawForwardAuth) -> ForwardAuth {
    let default = ForwardAuth::default();
    let header = |s: &String| {
        http::HeaderName::from_bytes(s.as_bytes())
            .map_err(|_| "is not a header name; expected e.g. \"x-original-uri\"".to_string())
    };
    ForwardAuth {
        method_header: field(
            r,
            key::SERVER_FORWARD_AUTH_METHOD_HEADER,
            &raw.method_header,
            default.method_header,
            header,
        ),
        uri_header: field(
            r,
            key::SERVER_FORWARD_AUTH_URI_HEADER,
            &raw.uri_header,
            default.uri_header,
            header,
        ),
        require_uri: true,
    }
}

fn upstream(s: &str) -> Result<Upstream, String> {
    const HELP: &str = "expected \"http://HOST:PORT\" optionally followed by a base path";
    let uri = super::fields::http_url(
        s,
        HELP,
        &format!("{s:?}: https upstreams are not supported; {HELP} (terminate TLS in front)"),
    )?;
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| format!("has no host; {HELP}"))?;
    if uri.query().is_some() {
        return Err(format!("has a query string; {HELP}"));
    }
    Ok(Upstream {
        authority,
        base_path: uri.path().trim_end_matches('/').to_string(),
    })
}

fn identity(
    r: &mut Reporter<'_>,
    raw: RawIdentity,
    env: &impl Fn(&str) -> Option<String>,
) -> (IdentityConfig, Secret) {
    let mut id = IdentityConfig::default();
    if let Some(list) = &raw.sources {
        let s = sources(r, key::IDENTITY_SOURCES, list);
        if !s.is_empty() {
            id.sources = s;
        }
    }
    let mut proxies = Vec::new();
    if let Some(list) = &raw.trusted_proxies {
        for p in list.get_ref() {
            let s = p.get_ref();
            let net = s
                .parse::<IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from));
            match net {
                Ok(n) => proxies.push(n.trunc()),
                Err(_) => r.at(
                    p.span(),
                    key::IDENTITY_TRUSTED_PROXIES,
                    "is not allowed; expected an IP address or CIDR like \"10.0.0.0/8\"",
                ),
            }
        }
        let allow_any = raw.allow_any_proxy.as_ref().is_some_and(|a| *a.get_ref());
        if !allow_any {
            if let Some(all) = catch_all(&proxies) {
                r.at(
                    list.span(),
                    key::IDENTITY_TRUSTED_PROXIES,
                    format!("covers every {all} address, so any client could pick its own identity with a forwarding header; list your proxies' addresses, or set allow_any_proxy = true if every peer really is a proxy"),
                );
            }
        }
    }
    id.client_ip_header = field(
        r,
        key::IDENTITY_CLIENT_IP_HEADER,
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
    let ipv6_prefix = field(r, key::IDENTITY_IPV6_PREFIX, &raw.ipv6_prefix, 64, |v| {
        u8::try_from(*v)
            .ok()
            .filter(|n| (1..=128).contains(n))
            .ok_or_else(|| "is not allowed; expected a prefix length from 1 to 128".to_string())
    });
    // The one trust list: identities, the proxy's forwarding headers and the connection
    // bounds all ask it.
    id.trust = tollgate_tower::Trust::new(proxies, ipv6_prefix);
    if let Some(j) = &raw.jwt {
        id.jwt = super::jwt::jwt(r, j, env);
    }
    if let Some(list) = &raw.sources {
        if raw.jwt.is_none() && id.sources.iter().any(is_jwt) {
            r.at(
                list.span(),
                key::IDENTITY_SOURCES,
                "a jwt:<claim> source needs [identity.jwt] (hs256_secret or jwks_file) to verify the token",
            );
        }
    }
    let secret = field(
        r,
        key::IDENTITY_SECRET,
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

fn is_jwt(s: &IdentitySource) -> bool {
    matches!(s, IdentitySource::Jwt(_))
}

/// "IPv4" or "IPv6" when `nets` together trust every address of that family.
fn catch_all(nets: &[IpNet]) -> Option<&'static str> {
    IpNet::aggregate(&nets.to_vec())
        .iter()
        .find(|n| n.prefix_len() == 0)
        .map(|n| match n {
            IpNet::V4(_) => "IPv4",
            IpNet::V6(_) => "IPv6",
        })
}
