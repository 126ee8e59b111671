//! One `[[policy]]`: its name, what it matches, its quota (checked by `Quota` and the
//! algorithm's own bounds, each error reported at the key that caused it), and its overrides.

use super::error::Reporter;
use super::fields::{duration, failure_policy, field, one_of, positive, sources, span_or, variant};
use super::raw::RawPolicy;
use super::{PolicyConfig, StoreConfig, TierConfig};
use crate::duration::DURATION_HELP;
use http::Method;
use std::time::Duration;
use tollgate::policy::SyncMode;
use tollgate::quota::{Algorithm, Limit};
use tollgate::{PolicyField, PolicySpec};
use tollgate_tower::TierSource;

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

pub(super) fn policy(
    r: &mut Reporter<'_>,
    i: usize,
    span: std::ops::Range<usize>,
    raw: RawPolicy,
    store: &StoreConfig,
    decision_mode: bool,
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
                    "is not allowed; expected 1 to 64 characters from [A-Za-z0-9_-]",
                );
            }
            n.get_ref().clone()
        }
    };
    let (path_prefix, methods, case_insensitive) = match &raw.matches {
        None => ("/".to_string(), Vec::new(), false),
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
                        Err("is not allowed; expected a path starting with \"/\"".to_string())
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
                        "is not an HTTP method; expected e.g. \"GET\", \"POST\"",
                    ),
                }
            }
            let case_insensitive = m.case_insensitive.as_ref().is_some_and(|c| *c.get_ref());
            (prefix, methods, case_insensitive)
        }
    };
    let algorithm = match &raw.algorithm {
        None => {
            r.at(span.clone(), k("algorithm"), "is missing; expected one of fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra, concurrency");
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
    let concurrency = algorithm == Some(Algorithm::Concurrency);
    let hold_ttl = field(
        r,
        &k("hold_ttl"),
        &raw.hold_ttl,
        Duration::from_secs(300),
        |s| duration(s),
    );
    if let (false, Some(h)) = (concurrency, &raw.hold_ttl) {
        r.at(
            h.span(),
            k("hold_ttl"),
            "only applies with algorithm = \"concurrency\"",
        );
    }
    if concurrency {
        // A request holds one unit, from admission to its response's end: no rate, no cost.
        for (key, present) in [
            ("period", raw.period.as_ref().map(|s| s.span())),
            ("burst", raw.burst.as_ref().map(|s| s.span())),
            ("cost", raw.cost.as_ref().map(|s| s.span())),
            (
                "cost_from_request",
                raw.cost_from_request.as_ref().map(|s| s.span()),
            ),
            ("cost_max", raw.cost_max.as_ref().map(|s| s.span())),
            (
                "cost_from_response",
                raw.cost_from_response.as_ref().map(|s| s.span()),
            ),
            ("sync", raw.sync.as_ref().map(|s| s.span())),
        ] {
            if let Some(sp) = present {
                r.at(
                    sp,
                    k(key),
                    "does not apply to algorithm = \"concurrency\" (limit is the requests in flight, each holding one unit; hold_ttl is how long the holds of a gateway that died last)",
                );
            }
        }
        if decision_mode {
            r.at(
                span_or(&raw.algorithm, &span),
                k("algorithm"),
                "\"concurrency\" needs proxy mode (server.upstream): in decision mode the gateway never sees a response end, so a hold would never be released",
            );
        }
    }
    let header = |s: &String| {
        http::HeaderName::from_bytes(s.to_ascii_lowercase().as_bytes())
            .map_err(|_| "is not an HTTP header name".to_string())
    };
    let from_request = field(
        r,
        &k("cost_from_request"),
        &raw.cost_from_request,
        None,
        |s| header(s).map(Some),
    );
    let from_response = field(
        r,
        &k("cost_from_response"),
        &raw.cost_from_response,
        None,
        |s| header(s).map(Some),
    );
    if let (true, Some(c)) = (decision_mode, &raw.cost_from_response) {
        r.at(
            c.span(),
            k("cost_from_response"),
            "needs proxy mode (server.upstream): in decision mode the gateway never sees the response",
        );
    }
    let cost_max = field(r, &k("cost_max"), &raw.cost_max, None, |v| {
        positive(v, "cost_max").map(Some)
    });
    if let (None, Some(c)) = (&from_request, &raw.cost_max) {
        if raw.cost_from_request.is_none() {
            r.at(
                c.span(),
                k("cost_max"),
                "only applies with cost_from_request",
            );
        }
    }
    let period = match &raw.period {
        None if concurrency => Some(hold_ttl),
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
    // A cost of 0 would let every request through and count nothing.
    let cost = field(r, &k("cost"), &raw.cost, 1, |v| positive(v, "cost"));
    let identity = raw.identity.as_ref().map(|l| sources(r, &k("identity"), l));
    let on_failure = field(
        r,
        &k("on_failure"),
        &raw.on_failure,
        store.on_failure,
        |s| failure_policy(s),
    );
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
        Duration::from_millis(200),
        |s| duration(s),
    );
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
    let (Some(algorithm), Some(limit_n), Some(period)) = (algorithm, limit, period) else {
        return None;
    };
    if r.errors.len() > before {
        return None;
    }
    // The rules a policy obeys are the library's: its rate (tollgate_core::Limit::checked)
    // and the rest of the spec (PolicySpec::validate). Each error names the field, which is
    // put back at the key that set it.
    let at = |field: PolicyField| -> (String, std::ops::Range<usize>) {
        let written = match field {
            PolicyField::Name => span_or(&raw.name, &span),
            PolicyField::Limit => span_or(&raw.limit, &span),
            PolicyField::Period => span_or(&raw.period, &span),
            PolicyField::Burst => span_or(&raw.burst, &span),
            PolicyField::Cost => span_or(&raw.cost, &span),
            PolicyField::LocalDivisor => span_or(&raw.local_divisor, &span),
            PolicyField::Sync => span_or(&raw.sync, &span),
            PolicyField::LeaseTtl => span_or(&raw.lease_ttl, &span),
            PolicyField::LeaseMax => span_or(&raw.lease_max, &span),
            PolicyField::Algorithm => span_or(&raw.algorithm, &span),
        };
        (k(field.as_str()), written)
    };
    let limit = match Limit::checked(algorithm, limit_n, period, burst, cost) {
        Ok(l) => l,
        Err(e) => {
            let (key, sp) = at(e.field().into());
            r.at(sp, key, e.to_string());
            return None;
        }
    };
    let max_cost = limit.max_cost();
    if let (Some(m), Some(written)) = (cost_max, &raw.cost_max) {
        if m > max_cost {
            r.at(
                written.span(),
                k("cost_max"),
                format!("is above what the policy can ever admit ({max_cost}, its burst or limit)"),
            );
            return None;
        }
    }
    let costs = tollgate_tower::Costs {
        from_request,
        max: cost_max.unwrap_or(max_cost),
        from_response,
    };
    let spec = PolicySpec {
        name,
        limit,
        cost,
        on_failure,
        local_divisor,
        shadow,
        sync,
        settle: costs.from_response.is_some(),
    };
    if let Err(tollgate::Error::InvalidPolicy { field, reason, .. }) = spec.validate() {
        let (key, sp) = at(field);
        r.at(sp, key, reason);
        return None;
    }
    let (tier, tiers) = tiers(r, &k, &raw, &spec, period, burst);
    if r.errors.len() > before {
        return None;
    }
    Some(PolicyConfig {
        spec,
        path_prefix,
        methods,
        case_insensitive,
        identity,
        tier,
        tiers,
        costs,
    })
}

/// `tier` and `tiers.<name> = { limit, period, burst }`: period and burst default to the
/// policy's (burst to the tier's limit when the policy sets none); the algorithm and cost are
/// the policy's.
fn tiers(
    r: &mut Reporter<'_>,
    k: &impl Fn(&str) -> String,
    raw: &RawPolicy,
    base: &PolicySpec,
    period: Duration,
    burst: Option<u64>,
) -> (Option<TierSource>, Vec<TierConfig>) {
    let source = field(r, &k("tier"), &raw.tier, None, |s| {
        s.parse::<TierSource>().map(Some)
    });
    match (&raw.tier, &raw.tiers) {
        (Some(t), None) => {
            r.at(
                t.span(),
                k("tier"),
                "has no tiers; add e.g. tiers.pro = { limit = 1000 }",
            );
            return (None, Vec::new());
        }
        (None, Some(t)) => {
            r.at(
                t.span(),
                k("tiers"),
                "need tier = \"jwt:CLAIM\" or \"header:NAME\" to say where a client's tier comes from",
            );
            return (None, Vec::new());
        }
        (None, None) => return (None, Vec::new()),
        (Some(_), Some(_)) => {}
    }
    let mut out = Vec::new();
    for (name, t) in raw
        .tiers
        .as_ref()
        .map(|t| t.get_ref().iter())
        .into_iter()
        .flatten()
    {
        let tk = |key: &str| k(&format!("tiers.{name}.{key}"));
        if !valid_name(name) {
            r.at(
                t.span(),
                k("tiers"),
                format!("tier name {name:?} is not allowed; expected 1 to 64 characters from [A-Za-z0-9_-]"),
            );
            continue;
        }
        let tr = t.get_ref();
        let Some(limit_n) = tr.limit.as_ref() else {
            r.at(
                t.span(),
                tk("limit"),
                "is missing; expected a positive integer (units per period)",
            );
            continue;
        };
        let Ok(limit_n) =
            positive(limit_n.get_ref(), "limit").map_err(|m| r.at(limit_n.span(), tk("limit"), m))
        else {
            continue;
        };
        let tperiod = field(r, &tk("period"), &tr.period, period, |s| duration(s));
        let tburst = field(r, &tk("burst"), &tr.burst, burst, |v| {
            positive(v, "burst").map(Some)
        });
        let rule = format!("{}.{name}", base.name);
        match variant(base, rule, (limit_n, tperiod, tburst)) {
            Ok(spec) => out.push(TierConfig {
                name: name.clone(),
                spec,
            }),
            Err((field, m)) => {
                let written = match field {
                    PolicyField::Period => span_or(&tr.period, &t.span()),
                    PolicyField::Burst => span_or(&tr.burst, &t.span()),
                    _ => t.span(),
                };
                r.at(written, tk(field.as_str()), m);
            }
        }
    }
    (source, out)
}
