//! The admin API under `/v1/` on `admin_listen`, for operators and their tools:
//!
//! - `GET /v1/clients/<policy>?identity=SRC=VALUE`: the client's state under each rule of the
//!   policy that can apply to it (its override; otherwise the policy's own rule and each
//!   tier's), read without charging it;
//! - `DELETE` of the same: resets those states (the store's, the local fallback's, the deny
//!   cache's and local leases), so a limited client passes again;
//! - `POST /v1/reload`: re-reads the config (see [`crate::live`]);
//! - `GET /v1/config`: the effective config, secrets redacted.
//!
//! Every call needs `Authorization: Bearer <admin_token>`, compared in constant time. Without
//! `[server] admin_token`, `/v1/` answers 403 to everyone. Errors are problems
//! (`tollgate_tower::problem`), the format of every error answer tollgate writes.

use crate::config::effective;
use crate::http::util::{problem_response, text_response, BoxBody};
use crate::live::{Live, ReloadError, ReloadTrigger};
use http::header::{HeaderValue, ALLOW, AUTHORIZATION, WWW_AUTHENTICATE};
use http::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::time::Duration;
use subtle::ConstantTimeEq;
use tollgate::operator::StoreUnavailable;
use tollgate::{ClientKey, Policy};
use tollgate_tower::{Problem, ProblemKind};

/// Answers one request under `/v1/`.
pub(crate) async fn handle<B>(live: &Live, req: &Request<B>) -> Response<BoxBody> {
    if let Some(refused) = refuse(live, req) {
        return refused;
    }
    let path = req.uri().path();
    let rest = path.strip_prefix("/v1/").unwrap_or("");
    match (rest, req.method()) {
        ("reload", &Method::POST) => reload(live).await,
        ("reload", _) => not_allowed("POST"),
        ("config", &Method::GET | &Method::HEAD) => {
            let g = live.generation();
            let mut config = effective(&g.config);
            config["pending_restart"] = json!(g.pending_restart);
            json_response(StatusCode::OK, &config)
        }
        ("config", _) => not_allowed("GET, HEAD"),
        (r, m) if r.starts_with("clients/") => {
            let policy = &r["clients/".len()..];
            match *m {
                Method::GET | Method::HEAD => client(live, policy, req, false).await,
                Method::DELETE => client(live, policy, req, true).await,
                _ => not_allowed("GET, HEAD, DELETE"),
            }
        }
        _ => problem(Problem::new(ProblemKind::NotFound).detail(
            "no such admin call; try GET /v1/clients/<policy>?identity=SRC=VALUE, DELETE of the same, POST /v1/reload or GET /v1/config",
        )),
    }
}

/// `None` when the request carries the admin token; otherwise the answer (403 when no token
/// is configured, 401 when the request's is missing or wrong).
fn refuse<B>(live: &Live, req: &Request<B>) -> Option<Response<BoxBody>> {
    let config = live.config();
    let Some(token) = &config.server.admin_token else {
        return Some(problem(Problem::new(ProblemKind::AdminDisabled).detail(
            "set [server] admin_token (\"${ADMIN_TOKEN}\" is expanded) to enable /v1/",
        )));
    };
    let mut values = req.headers().get_all(AUTHORIZATION).iter();
    let given = match (values.next(), values.next()) {
        (Some(v), None) => bearer(v.as_bytes()),
        _ => None,
    };
    // Digests of equal length compared in constant time: the time tells nothing of the
    // token, not even its length.
    let ok = given.is_some_and(|g| {
        let (g, t) = (Sha256::digest(g), Sha256::digest(&token.0));
        bool::from(g.as_slice().ct_eq(t.as_slice()))
    });
    if ok {
        return None;
    }
    let mut resp = problem(
        Problem::new(ProblemKind::AdminTokenRequired)
            .detail("send Authorization: Bearer <admin_token>"),
    );
    resp.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tollgate-admin\""),
    );
    Some(resp)
}

/// The credentials of `Bearer <credentials>` (scheme case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ")).then(|| rest.trim_ascii())
}

async fn reload(live: &Live) -> Response<BoxBody> {
    match live.reload(ReloadTrigger::Api).await {
        Ok(r) => json_response(
            StatusCode::OK,
            &json!({"result": "ok", "changed": r.changed, "restart_required": r.restart_required}),
        ),
        Err(ReloadError::NoFile) => problem(
            Problem::new(ProblemKind::NothingToReload).detail(ReloadError::NoFile.to_string()),
        ),
        Err(e) => problem(
            Problem::new(ProblemKind::ConfigRefused)
                .detail(e.to_string())
                .member("result", "error"),
        ),
    }
}

/// `GET` (or, with `reset`, `DELETE`) `/v1/clients/<policy>?identity=SRC=VALUE`.
async fn client<B>(live: &Live, policy: &str, req: &Request<B>, reset: bool) -> Response<BoxBody> {
    let generation = live.generation();
    let Some((config, rules)) = generation.policy(policy) else {
        let names: Vec<&str> = generation
            .config
            .policies
            .iter()
            .map(|p| p.name())
            .collect();
        return problem(
            Problem::new(ProblemKind::NotFound)
                .detail(format!("no such policy; policies: {}", names.join(", "))),
        );
    };
    let identity = match one_param(req.uri().query().unwrap_or(""), "identity") {
        Ok(v) => v,
        Err(why) => return problem(Problem::new(ProblemKind::BadRequest).detail(why)),
    };
    let client = match generation.config.client_key(config, &identity) {
        Ok(k) => k,
        Err(why) => {
            return problem(
                Problem::new(ProblemKind::BadRequest).detail(format!("bad identity: {why}")),
            )
        }
    };
    // The rules that can apply: the client's override alone, or the policy's and its tiers'.
    let overridden = rules.overrides.iter().find(|(k, _)| *k == client);
    let candidates: Vec<(&Policy, Option<&str>, bool)> = match overridden {
        Some((_, p)) => vec![(p, None, true)],
        None => std::iter::once((&rules.policy, None, false))
            .chain(
                rules
                    .tiers
                    .iter()
                    .map(|(t, p)| (p, Some(t.as_str()), false)),
            )
            .collect(),
    };
    let source = identity
        .iter()
        .position(|b| *b == b'=')
        .and_then(|i| std::str::from_utf8(&identity[..i]).ok())
        .unwrap_or("");
    let mut out = Vec::with_capacity(candidates.len());
    for (p, tier, is_override) in candidates {
        let item = if reset {
            live.limiter()
                .reset(&client, p)
                .await
                .map(|had| json!({"rule": p.name(), "tier": tier, "override": is_override, "had_state": had}))
        } else {
            state(live, &client, p, tier, is_override).await
        };
        match item {
            Ok(v) => out.push(v),
            Err(e) => return store_failed(&e),
        }
    }
    let key = if reset { "reset" } else { "rules" };
    let mut body = json!({
        "policy": policy,
        "identity_source": source,
        "client": client.to_string(),
    });
    body[key] = Value::Array(out);
    if !reset && overridden.is_none() && !rules.tiers.is_empty() {
        body["note"] = json!("a client's tier comes from each request (its token or header), so every tier's state is shown");
    }
    json_response(StatusCode::OK, &body)
}

async fn state(
    live: &Live,
    client: &ClientKey,
    p: &Policy,
    tier: Option<&str>,
    is_override: bool,
) -> Result<Value, StoreUnavailable> {
    let s = live.limiter().peek(client, p).await?;
    let q = p.limit().quota();
    let d = s.decision;
    Ok(json!({
        "rule": p.name(),
        "tier": tier,
        "override": is_override,
        "algorithm": p.limit().algorithm().name(),
        "limit": q.limit(),
        "period_seconds": q.period().as_secs_f64(),
        "burst": q.burst(),
        "cost": p.cost(),
        "remaining": d.remaining,
        "limited": d.remaining < p.cost() || s.denied_here_for.is_some(),
        "reset_seconds": seconds(d.reset_after),
        "denied_here_seconds": s.denied_here_for.map(seconds),
    }))
}

fn seconds(d: Duration) -> f64 {
    // Display only: microseconds to seconds, exact to well below a millisecond.
    d.as_micros() as f64 / 1e6
}

/// The one value of `name` in a query string (percent-decoded).
/// The one value of `?name=` in `query`, percent-decoded to bytes: an identity value need not
/// be UTF-8 (a header may hold any bytes), and a lossy decoding would name another client
/// (every invalid sequence reads as U+FFFD).
fn one_param(query: &str, name: &str) -> Result<Vec<u8>, String> {
    let mut found = query.split('&').filter_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (form_decode(k) == name.as_bytes()).then(|| form_decode(v))
    });
    match (found.next(), found.next()) {
        (Some(v), None) => Ok(v),
        (None, _) => Err(format!(
            "missing ?{name}=SOURCE=VALUE, e.g. ?{name}=header:x-api-key=KEY or ?{name}=ip=192.0.2.7"
        )),
        (Some(_), Some(_)) => Err(format!("?{name} given twice; give it once")),
    }
}

/// `application/x-www-form-urlencoded` decoding to bytes: `+` is a space, `%XX` a byte, and
/// anything else (a `%` not followed by two hex digits too) itself.
fn form_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let hex = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        let escaped = match (c, b.get(i + 1), b.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| h * 16 + l),
            _ => None,
        };
        match (c, escaped) {
            (_, Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', None) => {
                out.push(b' ');
                i += 1;
            }
            (other, None) => {
                out.push(other);
                i += 1;
            }
        }
    }
    out
}

fn store_failed(e: &StoreUnavailable) -> Response<BoxBody> {
    problem(
        Problem::new(ProblemKind::StoreUnavailable)
            .detail(format!("the store did not answer: {e}")),
    )
}

fn not_allowed(allow: &'static str) -> Response<BoxBody> {
    let mut resp =
        problem(Problem::new(ProblemKind::MethodNotAllowed).detail(format!("use {allow}")));
    resp.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    resp
}

/// An error answer, not to be cached (like every admin answer).
fn problem(p: Problem) -> Response<BoxBody> {
    let mut resp = problem_response(p);
    resp.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    resp
}

fn json_response(status: StatusCode, body: &Value) -> Response<BoxBody> {
    let mut resp = text_response(status, "application/json", format!("{body}\n"));
    resp.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_value_decodes_to_its_bytes_not_a_lossy_string() {
        assert_eq!(
            form_decode("header:x-api-key=%FF%FE"),
            b"header:x-api-key=\xff\xfe"
        );
        assert_eq!(form_decode("a+b%2Bc%zz%4"), b"a b+c%zz%4");
        assert_eq!(
            one_param("x=1&identity=ip%3D192.0.2.7", "identity"),
            Ok(b"ip=192.0.2.7".to_vec())
        );
        assert!(one_param("identity=a&identity=b", "identity").is_err());
        assert!(one_param("x=1", "identity").is_err());
    }
}
