//! Tiers read from a request header (`tier = "header:x-plan"`) are believed from trusted
//! proxies only, but a proxy passes on every header a client sent unless it is told to
//! overwrite or clear it: behind an nginx `auth_request` that does not, a client names its own
//! tier. tollgate cannot see what the proxy does, so the operator says so
//! (`identity.proxy_set_headers`: the headers every trusted proxy sets itself), and a header
//! tier that the list does not name is reachable from clients: `check-config` and `serve` warn.

use super::error::Reporter;
use super::raw::S;
use super::schema as key;
use crate::PolicyConfig;
use http::HeaderName;
use tollgate_tower::{TierSource, Trust};
use toml::Spanned;

/// `identity.proxy_set_headers`, checked: valid header names.
pub(super) fn proxy_set_headers(
    r: &mut Reporter<'_>,
    list: &S<Vec<Spanned<String>>>,
) -> Vec<HeaderName> {
    let mut out = Vec::new();
    for h in list.iter().flat_map(|l| l.get_ref()) {
        match HeaderName::from_bytes(h.get_ref().as_bytes()) {
            Ok(name) => out.push(name),
            Err(_) => r.at(
                h.span(),
                key::IDENTITY_PROXY_SET_HEADERS,
                "is not a header name; expected e.g. [\"x-plan\"]",
            ),
        }
    }
    out
}

/// A warning for each policy whose tier header clients can reach: read from trusted proxies
/// that are not said to set it, or never read at all (no trusted proxies).
pub(super) fn warnings(
    file: &str,
    policies: &[PolicyConfig],
    trust: &Trust,
    proxy_set: &[HeaderName],
) -> Vec<String> {
    let mut out = Vec::new();
    for (i, p) in policies.iter().enumerate() {
        let Some(TierSource::Header(h)) = &p.tier else {
            continue;
        };
        if trust.proxies().is_empty() {
            out.push(format!(
                "warning: {file}: policy[{i}].tier: a header tier is read only from identity.trusted_proxies, and there are none: every client gets the policy's own quota"
            ));
        } else if !proxy_set.contains(h) {
            out.push(format!(
                "warning: {file}: policy[{i}].tier: clients can choose their tier: the trusted proxies pass on a client's own {h} header unless they overwrite or clear it; make them set it (docs/forward-auth.md shows how) and list it in identity.proxy_set_headers"
            ));
        }
    }
    out
}
