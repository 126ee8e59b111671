//! `rate_limit`: the quota of a descriptor, envoyproxy/ratelimit's keys and tollgate's
//! (`algorithm`, `unit_multiplier`, `burst`, and `hold_ttl` for `algorithm: concurrency`, a
//! limit on hits in flight that has no unit).

use super::{get, join, Loader};
use crate::config::{Rule, RuleLimit, Unit, DEFAULT_HOLD_TTL};
use crate::yaml::{Kind, Node, Pos};
use std::time::Duration;
use tollgate::quota::{parse_duration, Algorithm, Limit};

const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "unit_multiplier",
    "burst",
    "hold_ttl",
];

/// What a rule names besides its quota: carried into the [`Rule`] unchanged.
struct Named<'a> {
    policy_name: &'a str,
    name: String,
    replaces: Vec<String>,
    shadow: bool,
    source: String,
}

impl Loader<'_> {
    pub(super) fn rate_limit(
        &mut self,
        node: &Node,
        path: &str,
        policy_name: &str,
        shadow: bool,
    ) -> Option<Rule> {
        let entries = self.map(node, path, RATE_LIMIT_KEYS)?;
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
        let hold_ttl = get(entries, "hold_ttl").filter(|(_, n)| !n.is_null());
        if let (false, Some((pos, _))) = (algorithm.is_concurrency(), hold_ttl) {
            self.err(
                pos,
                join(path, "hold_ttl"),
                "only `algorithm: concurrency` takes a hold_ttl",
            );
            return None;
        }
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
        if algorithm.is_concurrency() {
            let named = Named {
                policy_name,
                name,
                replaces,
                shadow,
                source,
            };
            return self.in_flight(entries, node.pos, path, unit.map(|u| u.0), hold_ttl, named);
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

    /// An `algorithm: concurrency` rule: `requests_per_unit` hits in flight at once, each
    /// dropped after `hold_ttl` unless a negative-hits request gives it back first. It has no
    /// window, so `unit` (and `unit_multiplier`, `burst`) are refused, naming the key.
    fn in_flight(
        &mut self,
        entries: &[(String, Pos, Node)],
        at: Pos,
        path: &str,
        unit: Option<Pos>,
        hold_ttl: Option<(Pos, &Node)>,
        named: Named<'_>,
    ) -> Option<Rule> {
        let mut refused = false;
        let extra = [("unit", unit), ("unit_multiplier", None), ("burst", None)];
        for (key, pos) in extra {
            let pos = pos.or_else(|| {
                get(entries, key)
                    .filter(|(_, n)| !n.is_null())
                    .map(|(p, _)| p)
            });
            if let Some(pos) = pos {
                self.err(
                    pos,
                    join(path, key),
                    format!(
                        "`algorithm: concurrency` takes no {key}: requests_per_unit is the limit \
                         in flight, hold_ttl how long a hit nothing gives back is held"
                    ),
                );
                refused = true;
            }
        }
        if self.is_zero(entries, "requests_per_unit") {
            self.err(
                at,
                join(path, "requests_per_unit"),
                "must be at least 1 with `algorithm: concurrency` (the limit in flight)",
            );
            return None;
        }
        let rpu = self.positive(entries, path, "requests_per_unit", at, None)?;
        let Ok(requests_per_unit) = u32::try_from(rpu) else {
            self.err(
                at,
                join(path, "requests_per_unit"),
                "must be at most 4294967295",
            );
            return None;
        };
        let ttl = match hold_ttl {
            None => DEFAULT_HOLD_TTL,
            Some((pos, n)) => self.hold_ttl(pos, n, path)?,
        };
        if refused {
            return None;
        }
        match Limit::checked(Algorithm::Concurrency, rpu, ttl, None, 1) {
            Ok(limit) => Some(Rule::new(
                named.policy_name,
                named.name,
                named.replaces,
                named.shadow,
                RuleLimit::InFlight {
                    requests_per_unit,
                    hold_ttl: ttl,
                    limit,
                },
                named.source,
            )),
            Err(e) => {
                let key = join(path, hold_ttl.map_or("requests_per_unit", |_| "hold_ttl"));
                let pos = hold_ttl.map_or(at, |(p, _)| p);
                self.err(pos, key, format!("invalid concurrency limit: {e}"));
                None
            }
        }
    }

    /// `hold_ttl`: a duration (`"30s"`, `"5m"`) above zero and at most a year. The error says
    /// what is wrong, never what the key held.
    fn hold_ttl(&mut self, pos: Pos, n: &Node, path: &str) -> Option<Duration> {
        let key = join(path, "hold_ttl");
        let text = self.string(n, &key)?;
        let problem = match parse_duration(&text) {
            Err(e) => format!("this value {e}"),
            Ok(d) if d.is_zero() => "must be above zero".to_string(),
            Ok(d) if d > tollgate::quota::MAX_PERIOD => "must be at most 366d".to_string(),
            Ok(d) => return Some(d),
        };
        self.err(pos, key, problem);
        None
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
