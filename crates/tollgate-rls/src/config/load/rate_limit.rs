//! `rate_limit`: the quota of a descriptor, envoyproxy/ratelimit's keys and tollgate's
//! (`algorithm`, `unit_multiplier`, `burst`).

use super::{get, join, Loader};
use crate::config::{Rule, RuleLimit, Unit};
use crate::yaml::{Kind, Node, Pos};
use std::time::Duration;
use tollgate::quota::{Algorithm, Limit};

const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "unit_multiplier",
    "burst",
];

impl Loader<'_> {
    pub(super) fn rate_limit(
        &mut self,
        node: &Node,
        path: &str,
        policy_name: &str,
        shadow: bool,
    ) -> Option<Rule> {
        let entries = self.map(node, path, RATE_LIMIT_KEYS)?;
        let unlimited = self.flag(entries, path, "unlimited");
        let name = match get(entries, "name") {
            Some((_, n)) if !n.is_null() => self.string(n, &join(path, "name")).unwrap_or_default(),
            _ => String::new(),
        };
        let replaces = self.replaces(entries, path, &name);
        let unit = get(entries, "unit").filter(|(_, n)| !n.is_null());
        let source = format!("{}:{}", self.file, node.pos.line);
        if unlimited {
            if let Some((pos, _)) = unit {
                self.err(
                    pos,
                    join(path, "unit"),
                    "`unlimited: true` takes no unit; remove one of them",
                );
                return None;
            }
            return Some(Rule::new(
                policy_name,
                name,
                replaces,
                shadow,
                RuleLimit::Unlimited,
                source,
            ));
        }
        let unit = match unit {
            None => {
                self.err(node.pos, join(path, "unit"), "missing; expected one of second, minute, hour, day, week, month, year (or unlimited: true)");
                return None;
            }
            Some((pos, n)) => {
                let s = self.string(n, &join(path, "unit"))?;
                match Unit::from_name(&s) {
                    Some(u) => u,
                    None => {
                        self.err(pos, join(path, "unit"), "not a unit; expected one of second, minute, hour, day, week, month, year");
                        return None;
                    }
                }
            }
        };
        if self.is_zero(entries, "requests_per_unit") {
            // envoyproxy/ratelimit's ban list: every request over the limit.
            return Some(Rule::new(
                policy_name,
                name,
                replaces,
                shadow,
                RuleLimit::Blocked { unit },
                source,
            ));
        }
        let rpu = self.positive(entries, path, "requests_per_unit", node.pos, None)?;
        let requests_per_unit = match u32::try_from(rpu) {
            Ok(v) => v,
            Err(_) => {
                self.err(
                    node.pos,
                    join(path, "requests_per_unit"),
                    "must be at most 4294967295",
                );
                return None;
            }
        };
        let multiplier = self.positive(entries, path, "unit_multiplier", node.pos, Some(1))?;
        let burst = self.positive(entries, path, "burst", node.pos, Some(rpu))?;
        let algorithm = match get(entries, "algorithm") {
            None => Algorithm::FixedWindow,
            Some((pos, n)) => {
                let s = self.string(n, &join(path, "algorithm"))?;
                match s.parse::<Algorithm>() {
                    Ok(a) => a,
                    Err(e) => {
                        self.err(pos, join(path, "algorithm"), e.to_string());
                        return None;
                    }
                }
            }
        };
        let period = unit
            .seconds()
            .checked_mul(multiplier)
            .map(Duration::from_secs);
        let limit = period
            .ok_or_else(|| "unit_multiplier is too large".to_string())
            .and_then(|p| {
                Limit::checked(algorithm, rpu, p, Some(burst), 1).map_err(|e| e.to_string())
            });
        match limit {
            Ok(limit) => Some(Rule::new(
                policy_name,
                name,
                replaces,
                shadow,
                RuleLimit::Limited {
                    requests_per_unit,
                    unit,
                    limit,
                },
                source,
            )),
            Err(e) => {
                self.err(node.pos, path.to_string(), format!("invalid quota: {e}"));
                None
            }
        }
    }

    fn replaces(&mut self, entries: &[(String, Pos, Node)], path: &str, own: &str) -> Vec<String> {
        let mut out = Vec::new();
        let Some((_, list)) = get(entries, "replaces") else {
            return out;
        };
        let path = join(path, "replaces");
        let Kind::Seq(items) = &list.kind else {
            self.err(
                list.pos,
                path,
                format!(
                    "expected a list of {{name: ...}}, found {}",
                    list.type_name()
                ),
            );
            return out;
        };
        for (i, item) in items.iter().enumerate() {
            let p = format!("{path}[{i}]");
            let Some(e) = self.map(item, &p, &["name"]) else {
                continue;
            };
            match get(e, "name").and_then(|(_, n)| self.string(n, &join(&p, "name"))) {
                Some(n) if n.is_empty() => {
                    self.err(item.pos, join(&p, "name"), "must not be empty")
                }
                Some(n) if n == own => self.err(
                    item.pos,
                    join(&p, "name"),
                    "a rate limit cannot replace itself",
                ),
                Some(n) => out.push(n),
                None => self.err(
                    item.pos,
                    join(&p, "name"),
                    "missing; expected the name of the rate limit replaced",
                ),
            }
        }
        out
    }

    /// Whether `key` is the integer 0.
    fn is_zero(&self, entries: &[(String, Pos, Node)], key: &str) -> bool {
        matches!(get(entries, key), Some((_, Node { kind: Kind::Scalar { text, plain: true }, .. })) if text.parse::<u64>() == Ok(0))
    }

    /// A positive integer at `key`; `default` when absent (`None`: required).
    fn positive(
        &mut self,
        entries: &[(String, Pos, Node)],
        path: &str,
        key: &str,
        at: Pos,
        default: Option<u64>,
    ) -> Option<u64> {
        let full = join(path, key);
        let Some((pos, n)) = get(entries, key).filter(|(_, n)| !n.is_null()) else {
            if default.is_none() {
                self.err(at, full, "missing; expected a positive integer");
            }
            return default;
        };
        let parsed = match &n.kind {
            Kind::Scalar { text, plain: true } => text.parse::<u64>().ok().filter(|v| *v >= 1),
            _ => None,
        };
        if parsed.is_none() {
            // The kind of value, never the value (an error is logged and shown to whoever
            // reloads: it says which key, not what it held).
            let shown = match &n.kind {
                Kind::Scalar { .. } => "this value",
                _ => n.type_name(),
            };
            let hint = if key == "requests_per_unit" {
                " (or 0: every request over the limit)"
            } else {
                ""
            };
            self.err(
                pos,
                full,
                format!("{shown} is not allowed; expected a positive integer{hint}"),
            );
        }
        parsed
    }
}
