//! YAML tree -> [`RlsConfig`]: every key checked, every problem recorded with its line.

use super::{Descriptor, Level, RlsConfig, RlsConfigError, RlsConfigErrors, Rule};
use super::{RuleLimit, Unit};
use crate::yaml::{self, Kind, Node, Pos};
use std::path::Path;
use std::time::Duration;
use tollgate::{Algorithm, Limit, Quota};

const ROOT_KEYS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "shadow_mode",
    "detailed_metric",
];
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

/// Loads one YAML file, or every `*.yaml` / `*.yml` file of a directory (in name order; one
/// domain per file, a domain in two files is an error).
pub fn load_dir_or_file(path: &Path) -> Result<RlsConfig, RlsConfigErrors> {
    let shown = path.display().to_string();
    let read_error = |e: std::io::Error, what: &str| {
        RlsConfigErrors(vec![RlsConfigError {
            file: shown.clone(),
            line: 1,
            col: 1,
            key: "(file)".into(),
            message: format!(
                "cannot read the {what}: {e}; expected a YAML file or a directory of them"
            ),
        }])
    };
    let files = if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| read_error(e, "directory"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && p.extension().is_some_and(|x| {
                        x.eq_ignore_ascii_case("yaml") || x.eq_ignore_ascii_case("yml")
                    })
            })
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut texts = Vec::with_capacity(files.len());
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|e| read_error(e, "file"))?;
        texts.push((f.display().to_string(), text));
    }
    if texts.is_empty() {
        return Err(RlsConfigErrors(vec![RlsConfigError {
            file: shown,
            line: 1,
            col: 1,
            key: "(file)".into(),
            message: "the directory holds no .yaml or .yml file".into(),
        }]));
    }
    load_str(texts.iter().map(|(f, t)| (f.as_str(), t.as_str())))
}

/// Loads configurations from (file name, text) pairs.
pub fn load_str<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<RlsConfig, RlsConfigErrors> {
    let mut config = RlsConfig::default();
    let mut errors = Vec::new();
    for (file, text) in files {
        config.files.push(file.to_string());
        let mut l = Loader {
            file,
            errors: &mut errors,
            rules: &mut config.rules,
        };
        if let Some((domain, pos, level)) = l.file(text) {
            match config.domains.entry(domain) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    let message = format!(
                        "the domain {:?} is already configured by another file; one domain per file",
                        e.key()
                    );
                    l.err(pos, "domain", message);
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(level);
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(RlsConfigErrors(errors))
    }
}

struct Loader<'a> {
    file: &'a str,
    errors: &'a mut Vec<RlsConfigError>,
    rules: &'a mut Vec<Rule>,
}

impl Loader<'_> {
    fn err(&mut self, pos: Pos, key: impl Into<String>, message: impl Into<String>) {
        self.errors.push(RlsConfigError {
            file: self.file.to_string(),
            line: pos.line,
            col: pos.col,
            key: key.into(),
            message: message.into(),
        });
    }

    /// The entries of a mapping node, each unknown key reported; `None` (reported) when the
    /// node is not a mapping.
    fn map<'n>(
        &mut self,
        node: &'n Node,
        path: &str,
        allowed: &[&str],
    ) -> Option<&'n [(String, Pos, Node)]> {
        let Kind::Map(entries) = &node.kind else {
            self.err(
                node.pos,
                display(path),
                format!("expected a mapping, found {}", node.type_name()),
            );
            return None;
        };
        for (k, pos, _) in entries {
            if !allowed.contains(&k.as_str()) {
                let allowed: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
                self.err(
                    *pos,
                    join(path, k),
                    format!("unknown key {k:?}; allowed here: {}", allowed.join(", ")),
                );
            }
        }
        Some(entries)
    }

    fn file(&mut self, text: &str) -> Option<(String, Pos, Level)> {
        let root = match yaml::parse(text) {
            Ok(Some(root)) => root,
            Ok(None) => {
                self.err(
                    Pos { line: 1, col: 1 },
                    "(file)",
                    "the file is empty; expected `domain` and `descriptors`",
                );
                return None;
            }
            Err(e) => {
                self.err(e.pos, "(syntax)", format!("not valid YAML: {}", e.message));
                return None;
            }
        };
        let entries = self.map(&root, "", ROOT_KEYS)?;
        let domain = match get(entries, "domain") {
            Some((pos, n)) => match self.string(n, "domain") {
                Some(d) if !d.is_empty() => Some((d, pos)),
                Some(_) => {
                    self.err(pos, "domain", "must not be empty");
                    None
                }
                None => None,
            },
            None => {
                self.err(root.pos, "domain", "missing; every file names its domain");
                None
            }
        };
        let mut level = Level::default();
        if let Some((domain, _)) = &domain {
            if let Some((_, list)) = get(entries, "descriptors") {
                self.descriptors(list, "descriptors", domain, &mut level);
            }
        }
        domain.map(|(d, pos)| (d, pos, level))
    }

    fn descriptors(&mut self, list: &Node, path: &str, parent: &str, level: &mut Level) {
        if list.is_null() {
            return;
        }
        let Kind::Seq(items) = &list.kind else {
            self.err(
                list.pos,
                path,
                format!("expected a list of descriptors, found {}", list.type_name()),
            );
            return;
        };
        for (i, item) in items.iter().enumerate() {
            let path = format!("{path}[{i}]");
            self.descriptor(item, &path, parent, level);
        }
    }

    fn descriptor(&mut self, node: &Node, path: &str, parent: &str, level: &mut Level) {
        let Some(entries) = self.map(node, path, DESCRIPTOR_KEYS) else {
            return;
        };
        let key = match get(entries, "key") {
            Some((pos, n)) => match self.string(n, &join(path, "key")) {
                Some(k) if !k.is_empty() => k,
                Some(_) => {
                    self.err(pos, join(path, "key"), "must not be empty");
                    return;
                }
                None => return,
            },
            None => {
                self.err(
                    node.pos,
                    join(path, "key"),
                    "missing; every descriptor has a key",
                );
                return;
            }
        };
        let value = match get(entries, "value") {
            Some((_, n)) if !n.is_null() => self
                .string(n, &join(path, "value"))
                .filter(|v| !v.is_empty()),
            _ => None,
        };
        let composite = match &value {
            Some(v) => format!("{key}_{v}"),
            None => key.clone(),
        };
        let name = format!("{parent}.{composite}");
        let shadow = self.flag(entries, path, "shadow_mode");
        // Accepted for compatibility: metric labels never carry request values here.
        let _ = self.flag(entries, path, "detailed_metric");
        let rule = get(entries, "rate_limit").and_then(|(_, n)| {
            let limit = self.rate_limit(n, &join(path, "rate_limit"), &name, shadow)?;
            self.rules.push(limit);
            Some(self.rules.len() - 1)
        });
        let mut d = Descriptor {
            rule,
            children: Level::default(),
        };
        if let Some((_, list)) = get(entries, "descriptors") {
            self.descriptors(list, &join(path, "descriptors"), &name, &mut d.children);
        }
        let slot = level.keys.entry(key.clone()).or_default();
        let duplicate = match value {
            None if slot.any.is_some() => true,
            None => {
                slot.any = Some(Box::new(d));
                false
            }
            Some(v) if v.ends_with('*') => {
                let prefix = v.trim_end_matches('*').to_string();
                if slot.prefixes.iter().any(|(p, _)| *p == prefix) {
                    true
                } else {
                    slot.prefixes.push((prefix, d));
                    slot.prefixes.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
                    false
                }
            }
            Some(v) => match slot.exact.entry(v) {
                std::collections::hash_map::Entry::Occupied(_) => true,
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(d);
                    false
                }
            },
        };
        if duplicate {
            self.err(
                node.pos,
                path,
                format!("duplicate descriptor {name:?}: the same key and value twice at one level"),
            );
        }
    }

    fn rate_limit(
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
            return Some(Rule {
                policy_name: policy_name.to_string(),
                name,
                replaces,
                shadow,
                limit: RuleLimit::Unlimited,
                source,
            });
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
                        self.err(pos, join(path, "unit"), format!("{s:?} is not a unit; expected one of second, minute, hour, day, week, month, year"));
                        return None;
                    }
                }
            }
        };
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
            .and_then(|p| Quota::new(rpu, p).map_err(|e| e.to_string()))
            .and_then(|q| q.with_burst(burst).map_err(|e| e.to_string()))
            .and_then(|q| Limit::new(algorithm, q).map_err(|e| e.to_string()));
        match limit {
            Ok(limit) => Some(Rule {
                policy_name: policy_name.to_string(),
                name,
                replaces,
                shadow,
                limit: RuleLimit::Limited {
                    requests_per_unit,
                    unit,
                    limit,
                },
                source,
            }),
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

    fn string(&mut self, n: &Node, key: &str) -> Option<String> {
        match &n.kind {
            Kind::Scalar { text, .. } => Some(text.clone()),
            _ => {
                self.err(
                    n.pos,
                    key,
                    format!("expected a string, found {}", n.type_name()),
                );
                None
            }
        }
    }

    fn flag(&mut self, entries: &[(String, Pos, Node)], path: &str, key: &str) -> bool {
        let Some((_, n)) = get(entries, key) else {
            return false;
        };
        match &n.kind {
            Kind::Scalar { text, plain: true } if text.eq_ignore_ascii_case("true") => true,
            Kind::Scalar { text, plain: true } if text.eq_ignore_ascii_case("false") => false,
            _ if n.is_null() => false,
            _ => {
                self.err(n.pos, join(path, key), "expected true or false");
                false
            }
        }
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
            let shown = match &n.kind {
                Kind::Scalar { text, .. } => format!("{text:?}"),
                _ => n.type_name().to_string(),
            };
            let hint = if key == "requests_per_unit" {
                " (a descriptor that admits nothing is not supported; use a limit of 1 or shadow_mode)"
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

fn get<'n>(entries: &'n [(String, Pos, Node)], key: &str) -> Option<(Pos, &'n Node)> {
    entries
        .iter()
        .find(|(k, _, _)| k == key)
        .map(|(_, p, n)| (*p, n))
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn display(path: &str) -> String {
    if path.is_empty() {
        "(file)".to_string()
    } else {
        path.to_string()
    }
}
