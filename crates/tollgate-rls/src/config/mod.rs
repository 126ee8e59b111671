//! envoyproxy/ratelimit's YAML descriptor configuration: one domain per file, nested
//! descriptors of `key` and optional `value`, each with an optional `rate_limit`.
//!
//! Loading is staged like the gateway's TOML: the YAML is parsed into a tree that keeps every
//! node's line ([`crate::yaml`]), then [`load`] checks it into a [`RlsConfig`] whose quotas
//! cannot be invalid, reporting every problem with file, line and key.
//!
//! Matching follows envoyproxy/ratelimit: the request's entries are walked level by level;
//! at each level an exact `key`+`value` wins over a `value` ending in `*` (a prefix; the
//! longest prefix wins), which wins over a `key` with no `value` (any value). A rule applies
//! when the walk ends on the request's last entry at a descriptor that has a `rate_limit`.

mod load;

pub use load::{load_dir_or_file, load_str};

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
    /// A quota: `requests_per_unit` per `unit_multiplier` x `unit`, by `algorithm`.
    Limited {
        /// `requests_per_unit`.
        requests_per_unit: u32,
        /// `unit`.
        unit: Unit,
        /// The algorithm and quota tollgate enforces.
        limit: Limit,
    },
}

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
    /// The quota, or unlimited.
    pub limit: RuleLimit,
    /// Where the descriptor is written (`file:line`).
    pub source: String,
}

/// A validated RLS configuration: domains, their descriptor trees and the rules.
#[derive(Debug, Clone, Default)]
pub struct RlsConfig {
    domains: HashMap<String, Level>,
    rules: Vec<Rule>,
    files: Vec<String>,
}

/// The descriptors of one level, grouped by key.
#[derive(Debug, Clone, Default)]
pub(crate) struct Level {
    keys: HashMap<String, KeyEntries>,
}

#[derive(Debug, Clone, Default)]
struct KeyEntries {
    exact: HashMap<String, Descriptor>,
    /// Values ending in `*`, as (prefix, descriptor), longest prefix first.
    prefixes: Vec<(String, Descriptor)>,
    /// The descriptor without a value.
    any: Option<Box<Descriptor>>,
}

#[derive(Debug, Clone, Default)]
struct Descriptor {
    rule: Option<usize>,
    children: Level,
}

impl KeyEntries {
    fn find(&self, value: &str) -> Option<&Descriptor> {
        self.exact
            .get(value)
            .or_else(|| {
                self.prefixes
                    .iter()
                    .find(|(p, _)| value.starts_with(p.as_str()))
                    .map(|(_, d)| d)
            })
            .or(self.any.as_deref())
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

    /// The rule that a request descriptor of `entries` (key, value) matches in `domain`, as
    /// an index into [`RlsConfig::rules`]; `None` for an unknown domain or no match.
    pub fn find<'a>(
        &self,
        domain: &str,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> Option<usize> {
        let mut level = self.domains.get(domain)?;
        let last = entries.len().checked_sub(1)?;
        let mut found = None;
        for (i, (key, value)) in entries.enumerate() {
            let d = level.keys.get(key)?.find(value)?;
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
