//! YAML tree -> [`RlsConfig`]: every key checked, every problem recorded with its line.

use super::meta::{Meta, MAX_METADATA_DEPTH, MAX_METADATA_VALUES};
use super::{Descriptor, Level, Pattern, RlsConfig, RlsConfigError, RlsConfigErrors, Rule};
use crate::yaml::{self, Kind, Node, Pos};
use std::collections::HashMap;
use std::path::Path;

mod rate_limit;

const ROOT_KEYS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// How files are combined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// `[rls] merge_domains`: a domain in several files is one domain (envoyproxy/ratelimit's
    /// `MERGE_DOMAIN_CONFIG`); a descriptor configured twice across them is still an error.
    /// Off: one domain per file.
    pub merge_domains: bool,
}

/// Loads one YAML file, or every `*.yaml` / `*.yml` file of a directory (in name order; one
/// domain per file, a domain in two files is an error).
pub fn load_dir_or_file(path: &Path) -> Result<RlsConfig, RlsConfigErrors> {
    load_dir_or_file_with(path, LoadOptions::default())
}

/// [`load_dir_or_file`] with `options`.
pub fn load_dir_or_file_with(
    path: &Path,
    options: LoadOptions,
) -> Result<RlsConfig, RlsConfigErrors> {
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
    load_str_with(texts.iter().map(|(f, t)| (f.as_str(), t.as_str())), options)
}

/// Loads configurations from (file name, text) pairs, one domain per file.
pub fn load_str<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<RlsConfig, RlsConfigErrors> {
    load_str_with(files, LoadOptions::default())
}

/// [`load_str`] with `options`.
pub fn load_str_with<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
    options: LoadOptions,
) -> Result<RlsConfig, RlsConfigErrors> {
    let mut config = RlsConfig::default();
    let mut errors = Vec::new();
    // Each domain's policy names so far (with where each is written), across its files.
    let mut names: HashMap<String, HashMap<String, (Pos, String)>> = HashMap::new();
    for (file, text) in files {
        config.files.push(file.to_string());
        let Some((domain, pos, root)) = parse_root(file, text, &mut errors) else {
            continue;
        };
        let merging = config.domains.contains_key(&domain);
        if merging && !options.merge_domains {
            let message = format!(
                "the domain {domain:?} is already configured by another file; one domain per \
                 file (or [rls] merge_domains = true)"
            );
            errors.push(RlsConfigError::at(
                file, pos.line, pos.col, "domain", message,
            ));
            continue;
        }
        let mut level = config.domains.remove(&domain).unwrap_or_default();
        let mut l = Loader {
            file,
            errors: &mut errors,
            rules: &mut config.rules,
            names: names.remove(&domain).unwrap_or_default(),
        };
        l.file_descriptors(&root, &domain, &mut level);
        names.insert(domain.clone(), l.names);
        config.domains.insert(domain, level);
    }
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(RlsConfigErrors(errors))
    }
}

/// Parses one file to its root mapping and its non-empty `domain` (every problem reported).
fn parse_root(
    file: &str,
    text: &str,
    errors: &mut Vec<RlsConfigError>,
) -> Option<(String, Pos, Node)> {
    let mut rules = Vec::new();
    let mut l = Loader {
        file,
        errors,
        rules: &mut rules,
        names: HashMap::new(),
    };
    let root = match yaml::parse(text) {
        Ok(Some(root)) => root,
        Ok(None) => {
            l.err(
                Pos { line: 1, col: 1 },
                "(file)",
                "the file is empty; expected `domain` and `descriptors`",
            );
            return None;
        }
        Err(e) => {
            l.err(e.pos, "(syntax)", format!("not valid YAML: {}", e.message));
            return None;
        }
    };
    let entries = l.map(&root, "", ROOT_KEYS)?;
    let domain = match get(entries, "domain") {
        Some((pos, n)) if n.is_null() => {
            l.err(
                pos,
                "domain",
                "must not be empty; every file names its domain",
            );
            None
        }
        Some((pos, n)) => match l.string(n, "domain") {
            Some(d) if !d.is_empty() => Some((d, pos)),
            Some(_) => {
                l.err(pos, "domain", "must not be empty");
                None
            }
            None => None,
        },
        None => {
            l.err(root.pos, "domain", "missing; every file names its domain");
            None
        }
    };
    let (domain, pos) = domain?;
    Some((domain, pos, root))
}

pub(super) struct Loader<'a> {
    file: &'a str,
    errors: &'a mut Vec<RlsConfigError>,
    rules: &'a mut Vec<Rule>,
    /// The policy name of each rule of this file so far, with where its descriptor starts
    /// (one domain per file, and names start with it, so per file is enough).
    names: HashMap<String, (Pos, String)>,
}

impl Loader<'_> {
    fn err(&mut self, pos: Pos, key: impl Into<String>, message: impl Into<String>) {
        self.errors.push(RlsConfigError::at(
            self.file, pos.line, pos.col, key, message,
        ));
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

    /// The file's descriptors into its domain's `level` (empty, or another file's when
    /// domains merge).
    fn file_descriptors(&mut self, root: &Node, domain: &str, level: &mut Level) {
        let Kind::Map(entries) = &root.kind else {
            return;
        };
        if let Some((_, list)) = get(entries, "descriptors") {
            self.descriptors(list, "descriptors", domain, false, level);
        }
        self.override_clashes(domain);
    }

    fn descriptors(
        &mut self,
        list: &Node,
        path: &str,
        parent: &str,
        value_to_metric: bool,
        level: &mut Level,
    ) {
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
            self.descriptor(item, &path, parent, value_to_metric, level);
        }
    }

    fn descriptor(
        &mut self,
        node: &Node,
        path: &str,
        parent: &str,
        value_to_metric: bool,
        level: &mut Level,
    ) {
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
        let quota = self.flag(entries, path, "quota_mode");
        let detailed_metric = self.flag(entries, path, "detailed_metric");
        let own_value_to_metric = self.flag(entries, path, "value_to_metric");
        let value_to_metric = value_to_metric || own_value_to_metric;
        let share = self.flag(entries, path, "share_threshold");
        if share && !composite.contains('*') {
            if let Some((pos, _)) = get(entries, "share_threshold") {
                self.err(
                    pos,
                    join(path, "share_threshold"),
                    "share_threshold applies only to a value with a `*` wildcard",
                );
            }
        }
        let metadata = get(entries, "metadata").and_then(|(_, n)| {
            let meta_path = join(path, "metadata");
            self.metadata(n, &meta_path)
        });
        let rule = get(entries, "rate_limit").and_then(|(_, n)| {
            let mut rule = self.rate_limit(n, &join(path, "rate_limit"), &name, shadow)?;
            rule.quota = quota;
            rule.detailed_metric = detailed_metric;
            rule.value_to_metric = value_to_metric;
            rule.metadata = metadata.as_ref().map(|m| super::meta::struct_of(m));
            self.rules.push(rule);
            Some(self.rules.len() - 1)
        });
        let mut d = Descriptor {
            rule,
            children: Level::default(),
            share,
            value_to_metric: own_value_to_metric,
        };
        if let Some((_, list)) = get(entries, "descriptors") {
            self.descriptors(
                list,
                &join(path, "descriptors"),
                &name,
                value_to_metric,
                &mut d.children,
            );
        }
        let slot = level.keys.entry(key.clone()).or_default();
        let duplicate = match value {
            None if slot.any.is_some() => true,
            None => {
                slot.any = Some(Box::new(d));
                false
            }
            Some(v) => match Pattern::new(&v) {
                Some(p) if slot.wildcards.iter().any(|(q, _)| *q == p) => true,
                Some(p) => {
                    slot.wildcards.push((p, d));
                    false
                }
                None => match slot.exact.entry(v) {
                    std::collections::hash_map::Entry::Occupied(_) => true,
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(d);
                        false
                    }
                },
            },
        };
        if duplicate {
            self.err(
                node.pos,
                path,
                format!("duplicate descriptor {name:?}: the same key and value twice at one level"),
            );
        } else if rule.is_some() {
            self.unique_name(name, node.pos, path);
        }
    }

    /// Two rules with one policy name would share metric series: `key: a_b` and
    /// `key: a, value: b` are both `<domain>.a_b`.
    fn unique_name(&mut self, name: String, pos: Pos, path: &str) {
        match self.names.entry(name) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let (first, first_path) = e.get();
                let message = format!(
                    "the policy name {:?} is already used by {first_path} (line {}); \
                     `key: a_b` and `key: a, value: b` name the same policy",
                    e.key(),
                    first.line
                );
                self.err(pos, path, message);
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert((pos, path.to_string()));
            }
        }
    }

    /// A limit override is counted under `<rule>.override` (`<domain>.override` when no rule
    /// matched): a rule may not be named like one.
    fn override_clashes(&mut self, domain: &str) {
        let domain_override = format!("{domain}.override");
        let mut clashes: Vec<(Pos, String, String)> = self
            .names
            .iter()
            .filter(|(name, _)| {
                **name == domain_override
                    || name
                        .strip_suffix(".override")
                        .is_some_and(|base| self.names.contains_key(base))
            })
            .map(|(name, (pos, path))| (*pos, path.clone(), name.clone()))
            .collect();
        clashes.sort_by_key(|(pos, _, _)| (pos.line, pos.col));
        for (pos, path, name) in clashes {
            self.err(
                pos,
                path,
                format!(
                    "the policy name {name:?} is the one limit overrides are counted under; \
                     rename the key"
                ),
            );
        }
    }

    /// A descriptor's `metadata`: a mapping of any YAML values, bounded in depth and size.
    fn metadata(&mut self, node: &Node, path: &str) -> Option<Vec<(String, Meta)>> {
        if node.is_null() {
            return None;
        }
        if !matches!(node.kind, Kind::Map(_)) {
            self.err(
                node.pos,
                path,
                format!("expected a mapping, found {}", node.type_name()),
            );
            return None;
        }
        let mut budget = MAX_METADATA_VALUES;
        match meta_value(node, 1, &mut budget) {
            Ok(Meta::Map(entries)) => Some(entries),
            Ok(_) => None,
            Err((pos, message)) => {
                self.err(pos, path, message);
                None
            }
        }
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
}

pub(super) fn get<'n>(entries: &'n [(String, Pos, Node)], key: &str) -> Option<(Pos, &'n Node)> {
    entries
        .iter()
        .find(|(k, _, _)| k == key)
        .map(|(_, p, n)| (*p, n))
}

pub(super) fn join(path: &str, key: &str) -> String {
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

/// The metadata value of `node` at nesting `depth`, spending one of `budget` per value.
fn meta_value(node: &Node, depth: usize, budget: &mut usize) -> Result<Meta, (Pos, String)> {
    if depth > MAX_METADATA_DEPTH {
        return Err((
            node.pos,
            format!("nested deeper than {MAX_METADATA_DEPTH} levels"),
        ));
    }
    if *budget == 0 {
        return Err((
            node.pos,
            format!("holds more than {MAX_METADATA_VALUES} values"),
        ));
    }
    *budget -= 1;
    Ok(match &node.kind {
        Kind::Scalar { text, plain: true } => Meta::plain(text),
        Kind::Scalar { text, plain: false } => Meta::Text(text.clone()),
        Kind::Seq(items) => Meta::List(
            items
                .iter()
                .map(|n| meta_value(n, depth + 1, budget))
                .collect::<Result<_, _>>()?,
        ),
        Kind::Map(entries) => Meta::Map(
            entries
                .iter()
                .map(|(k, _, n)| Ok((k.clone(), meta_value(n, depth + 1, budget)?)))
                .collect::<Result<_, _>>()?,
        ),
    })
}
