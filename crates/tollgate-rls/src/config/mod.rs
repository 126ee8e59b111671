//! envoyproxy/ratelimit's YAML descriptor configuration: one domain per file, nested
//! descriptors of `key` and optional `value`, each with an optional `rate_limit`.
//!
//! Loading is staged like the gateway's TOML: the YAML is parsed into a tree that keeps every
//! node's line (the crate's `yaml` module), then `load` checks it into a [`RlsConfig`] whose
//! quotas cannot be invalid, reporting every problem with file, line and key.
//!
//! Matching follows envoyproxy/ratelimit: the request's entries are walked level by level;
//! at each level an exact `key`+`value` wins over a `value` with `*` wildcards (anywhere in
//! the value; the first such descriptor in file order that matches wins, see
//! [`Pattern`]), which wins over a `key` with no `value` (any value). A rule applies when the
//! walk ends on the request's last entry at a descriptor that has a `rate_limit`.

mod load;
mod meta;
mod pattern;

pub use load::{load_dir_or_file, load_dir_or_file_with, load_str, load_str_with, LoadOptions};
pub use meta::{merge as merge_metadata, struct_of, Meta, MAX_METADATA_DEPTH, MAX_METADATA_VALUES};
pub use pattern::Pattern;

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;
use tollgate::quota::Limit;

/// A time unit of `rate_limit.unit` (and of a request's limit override).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as envoyproxy/ratelimit counts a month.
    Month,
    /// 365 days, as envoyproxy/ratelimit counts a year.
    Year,
}

impl Unit {
    /// Every unit with its configuration name.
    pub const ALL: [(&'static str, Unit); 7] = [
        ("second", Unit::Second),
        ("minute", Unit::Minute),
        ("hour", Unit::Hour),
        ("day", Unit::Day),
        ("week", Unit::Week),
        ("month", Unit::Month),
        ("year", Unit::Year),
    ];

    /// The unit's length.
    pub fn seconds(self) -> u64 {
        const DAY: u64 = 86_400;
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        }
    }

    /// The unit's length as a duration.
    pub fn duration(self) -> Duration {
        Duration::from_secs(self.seconds())
    }

    /// The value of `RateLimitResponse.RateLimit.Unit` (and `envoy.type.v3.RateLimitUnit`).
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit of a protobuf enum value; `None` for UNKNOWN and values not defined.
    pub fn from_proto(v: i32) -> Option<Unit> {
        Unit::ALL.iter().map(|(_, u)| *u).find(|u| u.proto() == v)
    }

    /// The unit named `s` (any case, as envoyproxy/ratelimit reads it).
    pub fn from_name(s: &str) -> Option<Unit> {
        Unit::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(s))
            .map(|(_, u)| *u)
    }

    /// The configuration name.
    pub fn name(self) -> &'static str {
        Unit::ALL
            .iter()
            .find(|(_, u)| *u == self)
            .map_or("second", |(n, _)| n)
    }
}

/// What a rule does with the requests it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleLimit {
    /// `unlimited: true`: always OK, never counted.
    Unlimited,
    /// `requests_per_unit: 0`: every request OVER_LIMIT (a ban list); nothing is stored.
    Blocked {
        /// `unit`.
        unit: Unit,
    },
    /// A quota: `requests_per_unit` per `unit_multiplier` x `unit`, by `algorithm`.
    Limited {
        /// `requests_per_unit`.
        requests_per_unit: u32,
        /// `unit`.
        unit: Unit,
        /// The algorithm and quota tollgate enforces.
        limit: Limit,
    },
    /// `algorithm: concurrency`: at most `requests_per_unit` hits held at once (no unit); a
    /// hit nothing gives back (a negative-hits request) is dropped after `hold_ttl`.
    InFlight {
        /// `requests_per_unit`: the limit in flight.
        requests_per_unit: u32,
        /// `hold_ttl` (default [`DEFAULT_HOLD_TTL`]).
        hold_ttl: Duration,
        /// The concurrency limit tollgate enforces (its period is `hold_ttl`).
        limit: Limit,
    },
}

/// `hold_ttl` of an `algorithm: concurrency` rule that names none.
pub const DEFAULT_HOLD_TTL: Duration = Duration::from_secs(300);

/// One configured descriptor with a `rate_limit`.
#[derive(Debug, Clone)]
pub struct Rule {
    /// `domain.key_value.key...`: the policy name (store keys, metrics). Configured text only.
    pub policy_name: String,
    /// `rate_limit.name` (empty when absent): what `replaces` refers to.
    pub name: String,
    /// `rate_limit.replaces[].name`.
    pub replaces: Vec<String>,
    /// `shadow_mode`.
    pub shadow: bool,
    /// `quota_mode`: over its limit, it denies only when every quota descriptor of the
    /// request is over its limit.
    pub quota: bool,
    /// `detailed_metric`: its metric series is named after the request's entries.
    pub detailed_metric: bool,
    /// Some descriptor on its path has `value_to_metric`: its series name carries request
    /// values at those levels.
    pub value_to_metric: bool,
    /// The descriptor's `metadata` (a mapping), as a protobuf struct.
    pub metadata: Option<prost_types::Struct>,
    /// The quota, or unlimited.
    pub limit: RuleLimit,
    /// Where the descriptor is written (`file:line`).
    pub source: String,
}

impl Rule {
    /// A rule with the flags off and no metadata (the loader sets them).
    pub(crate) fn new(
        policy_name: &str,
        name: String,
        replaces: Vec<String>,
        shadow: bool,
        limit: RuleLimit,
        source: String,
    ) -> Self {
        Self {
            policy_name: policy_name.to_string(),
            name,
            replaces,
            shadow,
            quota: false,
            detailed_metric: false,
            value_to_metric: false,
            metadata: None,
            limit,
            source,
        }
    }
}

/// A validated RLS configuration: domains, their descriptor trees and the rules.
#[derive(Debug, Clone, Default)]
pub struct RlsConfig {
    domains: Map<String, Level>,
    rules: Vec<Rule>,
    files: Vec<String>,
}

/// The descriptor tables: filled from the configuration, looked up with a request's domain,
/// keys and values (three lookups a descriptor). foldhash, seeded per process, where std's
/// SipHash cost an RLS request of ten descriptors about 4,200 instructions (callgrind); a
/// request's strings are only looked up, never inserted, so they cannot grow a table.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The descriptors of one level, grouped by key.
#[derive(Debug, Clone, Default)]
pub(crate) struct Level {
    keys: Map<String, KeyEntries>,
}

#[derive(Debug, Clone, Default)]
struct KeyEntries {
    exact: Map<String, Descriptor>,
    /// Values with `*`, in file order (the first that matches wins).
    wildcards: Vec<(Pattern, Descriptor)>,
    /// The descriptor without a value.
    any: Option<Box<Descriptor>>,
}

#[derive(Debug, Clone, Default)]
struct Descriptor {
    rule: Option<usize>,
    children: Level,
    /// `share_threshold`: every value matching this wildcard counts in one counter.
    share: bool,
    /// `value_to_metric`.
    value_to_metric: bool,
}

/// How a request entry matched a level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matched<'c> {
    /// Its key and value, written in the configuration.
    Exact,
    /// A wildcard value, with the pattern and whether it has `share_threshold`.
    Wildcard(&'c Pattern, bool),
    /// The key alone (any value).
    Any,
}

/// One level of a walk: how the entry matched and whether the descriptor has
/// `value_to_metric`.
#[derive(Debug, Clone, Copy)]
pub struct Step<'c> {
    /// How it matched.
    pub matched: Matched<'c>,
    /// `value_to_metric` of the matched descriptor.
    pub value_to_metric: bool,
}

/// A request descriptor's rule, as [`RlsConfig::find`] returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The index into [`RlsConfig::rules`].
    pub rule: usize,
    /// Bit `i` set: entry `i` matched a wildcard with `share_threshold`, so the value counts
    /// as its pattern (every value matching it shares one counter).
    pub shared: u64,
}

impl KeyEntries {
    fn find(&self, value: &str) -> Option<(&Descriptor, Matched<'_>)> {
        if let Some(d) = self.exact.get(value) {
            return Some((d, Matched::Exact));
        }
        if let Some((p, d)) = self.wildcards.iter().find(|(p, _)| p.matches(value)) {
            return Some((d, Matched::Wildcard(p, d.share)));
        }
        self.any.as_deref().map(|d| (d, Matched::Any))
    }
}

impl RlsConfig {
    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The configured domains.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Every rule, indexed as [`RlsConfig::find`] returns them.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The files the configuration was read from.
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// The rule that a request descriptor of `entries` (key, value) matches in `domain`;
    /// `None` for an unknown domain or no match.
    pub fn find<'a>(
        &self,
        domain: &str,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Found> {
        self.find_in(self.level(domain), entries)
    }

    /// `domain`'s descriptors, found once for a request's many descriptors
    /// ([`RlsConfig::find_in`]).
    pub(crate) fn level(&self, domain: &str) -> Option<&Level> {
        self.domains.get(domain)
    }

    /// [`RlsConfig::find`] in a domain already found (`None`: an unknown domain).
    pub(crate) fn find_in<'a>(
        &self,
        level: Option<&Level>,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Found> {
        let mut shared = 0u64;
        let rule = Self::walk_in(level?, entries, |i, step| {
            if let Matched::Wildcard(_, true) = step.matched {
                if i < 64 {
                    shared |= 1 << i;
                }
            }
        })?;
        Some(Found { rule, shared })
    }

    /// Walks `entries` down `domain`'s descriptors, calling `visit` with each level matched
    /// (entry index and how it matched); the rule found, as [`RlsConfig::find`].
    pub fn walk<'a, 'c>(
        &'c self,
        domain: &str,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
        visit: impl FnMut(usize, Step<'c>),
    ) -> Option<usize> {
        Self::walk_in(self.domains.get(domain)?, entries, visit)
    }

    fn walk_in<'a, 'c>(
        mut level: &'c Level,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
        mut visit: impl FnMut(usize, Step<'c>),
    ) -> Option<usize> {
        let last = entries.len().checked_sub(1)?;
        let mut found = None;
        for (i, (key, value)) in entries.enumerate() {
            let (d, matched) = level.keys.get(key)?.find(value)?;
            visit(
                i,
                Step {
                    matched,
                    value_to_metric: d.value_to_metric,
                },
            );
            if i == last {
                found = d.rule;
            }
            if d.children.keys.is_empty() {
                break;
            }
            level = &d.children;
        }
        found
    }

    /// The name envoyproxy/ratelimit gives the metric series of a request descriptor whose
    /// rule has `detailed_metric` or `value_to_metric` on its path (request values in it, as
    /// the operator asked): `None` for any other rule, whose series is its policy name.
    pub fn metric_key<'a>(
        &self,
        domain: &str,
        entries: &'a [(&'a str, &'a str)],
    ) -> Option<String> {
        let mut steps: Vec<Step<'_>> = Vec::with_capacity(entries.len());
        let rule = self.walk(domain, entries.iter().copied(), |_, s| steps.push(s))?;
        let r = &self.rules[rule];
        if !r.detailed_metric && !r.value_to_metric {
            return None;
        }
        let any_shared = steps
            .iter()
            .any(|s| matches!(s.matched, Matched::Wildcard(_, true)));
        let mut key = String::from(domain);
        for ((k, v), step) in entries.iter().zip(&steps) {
            key.push('.');
            key.push_str(k);
            // envoyproxy's three namings: detailed (every value; `key_` for an empty one),
            // detailed with shared wildcards (their patterns), and value_to_metric.
            let value: Option<&str> = match (step.matched, r.detailed_metric) {
                (Matched::Wildcard(p, true), _) => Some(p.as_str()),
                (_, true) if any_shared => Some(*v).filter(|v| !v.is_empty()),
                (_, true) => Some(*v),
                (Matched::Wildcard(_, false), false) if step.value_to_metric => Some(*v),
                (Matched::Wildcard(p, false), false) => Some(p.as_str()),
                (Matched::Exact, false) => Some(*v),
                (Matched::Any, false) if step.value_to_metric => Some(*v),
                (Matched::Any, false) => None,
            };
            if let Some(value) = value.filter(|v| !v.is_empty() || r.detailed_metric) {
                key.push('_');
                key.push_str(value);
            }
        }
        Some(key)
    }

    /// The pattern that counts instead of entry `index`'s value (its `share_threshold`
    /// wildcard), for a descriptor [`RlsConfig::find`] marked shared there.
    pub fn shared_pattern<'a>(
        &self,
        domain: &str,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
        index: usize,
    ) -> Option<&str> {
        let mut out = None;
        self.walk(domain, entries, |i, s| {
            if let (true, Matched::Wildcard(p, true)) = (i == index, s.matched) {
                out = Some(p.as_str());
            }
        });
        out
    }
}

/// One problem in a configuration file: an RLS YAML file here, the gateway's TOML file too
/// (tollgate-gateway reports its own problems with this type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsConfigError {
    /// The file.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// The key, e.g. `descriptors[0].rate_limit.unit`.
    pub key: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl RlsConfigError {
    /// A problem at `line:col` of `file`. The key and the message are cut (see [`cut`]): a value
    /// of 50 MB quoted in either is not echoed back whole.
    pub fn at(
        file: &str,
        line: usize,
        col: usize,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            file: file.to_string(),
            line,
            col,
            key: cut(&key.into(), MAX_QUOTED, 0),
            message: cut(&message.into(), MAX_QUOTED, MAX_HELP),
        }
    }
}

/// The most characters of a value an error repeats.
pub const MAX_QUOTED: usize = 200;
/// The most characters kept after the cut: the end of a message says what is allowed.
const MAX_HELP: usize = 300;

/// `message` unchanged when it is short; otherwise its first `head` characters (where a
/// quoted value starts), a note of how much was left out, and what follows the quoted value
/// when that is at most `tail` characters (the help: what is allowed).
pub fn cut(message: &str, head: usize, tail: usize) -> String {
    let chars: Vec<char> = message.chars().collect();
    let n = chars.len();
    if n <= head + 40 {
        return message.to_string();
    }
    // The end of the last quoted value: a `"` followed by `;`, `:`, `,` or a space.
    let from = n.saturating_sub(tail);
    let end = (from.max(head)..n.saturating_sub(1))
        .rev()
        .find(|&i| chars[i] == '"' && matches!(chars[i + 1], ';' | ':' | ',' | ' '));
    let rest = match end {
        Some(i) => i,
        // No quoted value ends past `head`: a long help text alone is kept whole.
        None if n <= head + tail + 40 => return message.to_string(),
        None => n,
    };
    let first: String = chars[..head].iter().collect();
    let last: String = chars[rest..].iter().collect();
    format!("{first}... ({} characters cut){last}", rest - head)
}

impl fmt::Display for RlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "error: {}:{}:{}: {}: {}",
            self.file, self.line, self.col, self.key, self.message
        )
    }
}

/// Every problem found.
#[derive(Debug, Clone)]
pub struct RlsConfigErrors(pub Vec<RlsConfigError>);

impl fmt::Display for RlsConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RlsConfigErrors {}

#[cfg(test)]
mod tests;
