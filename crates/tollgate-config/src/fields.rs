//! The value checks every section of the config shares: a spanned field with its default,
//! positive integers, durations, one of a list, failure policies, identity sources and
//! `${ENV}` expansion. A leaf: the section validators (validate, store, policy) use it.

use super::error::Reporter;
use super::raw::S;
use crate::duration::{parse_duration, DURATION_HELP};
use std::ops::Range;
use std::time::Duration;
use tollgate::policy::FailurePolicy;
use tollgate_tower::IdentitySource;
use toml::Spanned;

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

/// Where the optional field `v` was written, or `fallback` (its table's) when it was not.
pub(super) fn span_or<T>(v: &S<T>, fallback: &Range<usize>) -> Range<usize> {
    v.as_ref().map_or(fallback.clone(), |s| s.span())
}

pub(super) fn positive(v: &i64, what: &str) -> Result<u64, String> {
    u64::try_from(*v)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("must be a positive integer ({what} counts at least 1)"))
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
            format!("is not allowed; expected one of {}", names.join(", "))
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

/// Expands `${NAME}` from the environment; an unset variable is an error.
pub(super) fn expand_env(s: &str, env: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
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

/// A tier's or an override's policy: `base` (its algorithm, cost, failure policy, sync ...)
/// under the rule name `name` with `limit` units per `period` (burst when given), checked by
/// the library's own rules; an error names the field that is wrong.
pub(super) fn variant(
    base: &tollgate::PolicySpec,
    name: String,
    (limit, period, burst): (u64, Duration, Option<u64>),
) -> Result<tollgate::PolicySpec, (tollgate::PolicyField, String)> {
    let built =
        tollgate::quota::Limit::checked(base.limit.algorithm(), limit, period, burst, base.cost)
            .map_err(|e| {
                let field = e.field().into();
                let reason = match e {
                    tollgate::quota::RateError::CostTooLarge { cost, max } => {
                        format!("the policy's cost {cost} can never be admitted (at most {max})")
                    }
                    other => other.to_string(),
                };
                (field, reason)
            })?;
    let spec = tollgate::PolicySpec {
        name,
        limit: built,
        ..base.clone()
    };
    match spec.validate() {
        Ok(()) => Ok(spec),
        Err(tollgate::Error::InvalidPolicy { field, reason, .. }) => Err((field, reason)),
    }
}

/// An `http://HOST[:PORT]...` URL someone wrote (the upstream, the OTLP collector), with
/// `help` saying what is expected and `https` the answer to an `https://` one. User info is
/// refused first and the value is then never echoed: it would be a credential.
pub(super) fn http_url(s: &str, help: &str, https: &str) -> Result<http::Uri, String> {
    let after_scheme = s.split_once("://").map_or(s, |(_, rest)| rest);
    if after_scheme
        .split(['/', '?', '#'])
        .next()
        .is_some_and(|a| a.contains('@'))
    {
        return Err(format!(
            "has user info (USER:PASSWORD@), which the gateway would never send; remove it; {help}"
        ));
    }
    let uri: http::Uri = s.parse().map_err(|_| format!("is not a URL; {help}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(https.to_string()),
        _ => return Err(format!("has no http:// scheme; {help}")),
    }
    if uri.authority().is_none() {
        return Err(format!("has no host; {help}"));
    }
    Ok(uri)
}
