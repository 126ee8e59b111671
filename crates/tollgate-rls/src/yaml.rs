//! A YAML document as a tree whose every node knows its line and column, so a configuration
//! error can name the line it sits on. Built from `yaml-rust2`'s marked parser events; anchors
//! and aliases are resolved (envoyproxy/ratelimit's YAML library accepts them too), up to
//! [`MAX_NODES`] nodes and [`MAX_BYTES`] bytes of text in all, so a file of nested aliases
//! cannot expand without bound, and up to [`MAX_DEPTH`] levels of nesting, so a deep file
//! cannot overflow the stack of whatever walks the tree (the configuration loader recurses
//! into nested descriptors; dropping a node recurses too).

use std::collections::{HashMap, HashSet};
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// The most nodes a document may hold once its aliases are expanded.
pub(crate) const MAX_NODES: usize = 1_000_000;
/// The most bytes of keys and scalar text a document may hold once its aliases are expanded.
pub(crate) const MAX_BYTES: usize = 64 << 20;
/// The most mappings and lists one node may sit inside.
pub(crate) const MAX_DEPTH: usize = 64;

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pos {
    pub line: usize,
    pub col: usize,
}

impl From<Marker> for Pos {
    fn from(m: Marker) -> Self {
        // yaml-rust2 counts lines from 1 and columns from 0.
        Pos {
            line: m.line().max(1),
            col: m.col() + 1,
        }
    }
}

/// One node and where it starts.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub pos: Pos,
    pub kind: Kind,
}

/// What a node is.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// Keys in file order, each with its position.
    Map(Vec<(String, Pos, Node)>),
    Seq(Vec<Node>),
    /// The text; `plain` when unquoted (only plain scalars can be null, numbers or booleans).
    Scalar {
        text: String,
        plain: bool,
    },
}

impl Node {
    /// Whether this is a null (`~`, `null`, or nothing).
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, Kind::Scalar { text, plain: true } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// A short name of the node's type, for errors.
    pub fn type_name(&self) -> &'static str {
        match &self.kind {
            Kind::Map(_) => "a mapping",
            Kind::Seq(_) => "a list",
            Kind::Scalar { .. } if self.is_null() => "nothing",
            Kind::Scalar { .. } => "a scalar",
        }
    }
}

/// A syntax error: where and what.
#[derive(Debug, Clone)]
pub(crate) struct SyntaxError {
    pub pos: Pos,
    pub message: String,
}

/// Parses the first document of `text`. `Ok(None)` for an empty document.
pub(crate) fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    // Events one by one rather than `Parser::load`, which recurses once per nesting level
    // (a deep file would overflow the stack before the builder's depth bound could stop it).
    loop {
        let (ev, mark) = parser.next_token().map_err(|e| SyntaxError {
            pos: Pos::from(*e.marker()),
            message: e.info().to_string(),
        })?;
        let end = match ev {
            Event::StreamEnd => true,
            Event::DocumentEnd => builder.done,
            _ => false,
        };
        builder.on_event(ev, mark);
        if end || builder.error.is_some() {
            break;
        }
    }
    if let Some(e) = builder.error {
        return Err(e);
    }
    Ok(builder.root)
}

enum Frame {
    Map {
        pos: Pos,
        anchor: usize,
        first: (usize, usize),
        entries: Vec<(String, Pos, Node)>,
        /// The keys of `entries`, for the duplicate check.
        keys: HashSet<String>,
        key: Option<(String, Pos)>,
    },
    Seq {
        pos: Pos,
        anchor: usize,
        first: (usize, usize),
        items: Vec<Node>,
    },
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Node>,
    /// Anchored nodes with how many nodes and text bytes each holds.
    /// Each anchor's node, its size (nodes, bytes) and its height (levels of mappings and
    /// lists), which an alias adds to where it stands.
    anchors: HashMap<usize, (Node, (usize, usize), usize)>,
    /// Nodes so far, aliases counted at their expanded size.
    nodes: usize,
    /// Bytes of scalar text so far (keys included), aliases counted at their expanded size.
    bytes: usize,
    error: Option<SyntaxError>,
    done: bool,
}

impl Builder {
    fn fail(&mut self, pos: Pos, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(SyntaxError {
                pos,
                message: message.into(),
            });
        }
    }

    /// A node of `size` (nodes, itself included; text bytes) is complete.
    fn finish(&mut self, node: Node, anchor: usize, size: (usize, usize)) {
        if anchor > 0 {
            let height = height(&node);
            self.anchors.insert(anchor, (node.clone(), size, height));
        }
        self.attach(node);
    }

    /// Counts `n` more nodes holding `bytes` more bytes of text; false (and an error) past
    /// [`MAX_NODES`] or [`MAX_BYTES`].
    fn count(&mut self, n: usize, bytes: usize, pos: Pos) -> bool {
        self.nodes = self.nodes.saturating_add(n);
        self.bytes = self.bytes.saturating_add(bytes);
        if self.nodes > MAX_NODES {
            self.fail(
                pos,
                format!("more than {MAX_NODES} nodes once aliases are expanded"),
            );
            return false;
        }
        if self.bytes > MAX_BYTES {
            self.fail(
                pos,
                format!(
                    "more than {} MiB of text once aliases are expanded",
                    MAX_BYTES >> 20
                ),
            );
            return false;
        }
        true
    }

    /// Whether one more mapping or list may open; false (and an error) past [`MAX_DEPTH`].
    fn may_nest(&mut self, pos: Pos) -> bool {
        if self.stack.len() >= MAX_DEPTH {
            self.fail(
                pos,
                format!("nested more than {MAX_DEPTH} mappings or lists deep"),
            );
            return false;
        }
        true
    }

    /// Where a mapping or list opened now starts counting its size.
    fn mark(&self) -> (usize, usize) {
        (self.nodes, self.bytes)
    }

    /// The size of a mapping or list opened at `first`, itself included.
    fn size_since(&self, first: (usize, usize)) -> (usize, usize) {
        (self.nodes - first.0 + 1, self.bytes - first.1)
    }

    fn attach(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => {
                self.root = Some(node);
                self.done = true;
            }
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map {
                entries, keys, key, ..
            }) => match key.take() {
                Some((k, kpos)) => {
                    if !keys.insert(k.clone()) {
                        let message = format!("the key {k:?} appears twice in one mapping");
                        self.fail(kpos, message);
                    } else {
                        entries.push((k, kpos, node));
                    }
                }
                None => match node.kind {
                    Kind::Scalar { text, .. } => *key = Some((text, node.pos)),
                    _ => self.fail(node.pos, "a mapping key must be a string"),
                },
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.done || self.error.is_some() {
            return;
        }
        let pos = Pos::from(mark);
        match ev {
            Event::Scalar(text, style, anchor, _) => {
                let len = text.len();
                if !self.count(1, len, pos) {
                    return;
                }
                let plain = style == TScalarStyle::Plain;
                self.finish(
                    Node {
                        pos,
                        kind: Kind::Scalar { text, plain },
                    },
                    anchor,
                    (1, len),
                );
            }
            Event::MappingStart(anchor, _) => {
                if self.may_nest(pos) && self.count(1, 0, pos) {
                    let first = self.mark();
                    self.stack.push(Frame::Map {
                        pos,
                        anchor,
                        first,
                        entries: Vec::new(),
                        keys: HashSet::new(),
                        key: None,
                    });
                }
            }
            Event::SequenceStart(anchor, _) => {
                if self.may_nest(pos) && self.count(1, 0, pos) {
                    let first = self.mark();
                    self.stack.push(Frame::Seq {
                        pos,
                        anchor,
                        first,
                        items: Vec::new(),
                    });
                }
            }
            Event::MappingEnd | Event::SequenceEnd => match self.stack.pop() {
                Some(Frame::Map {
                    pos,
                    anchor,
                    first,
                    entries,
                    ..
                }) => {
                    let size = self.size_since(first);
                    self.finish(
                        Node {
                            pos,
                            kind: Kind::Map(entries),
                        },
                        anchor,
                        size,
                    );
                }
                Some(Frame::Seq {
                    pos,
                    anchor,
                    first,
                    items,
                }) => {
                    let size = self.size_since(first);
                    self.finish(
                        Node {
                            pos,
                            kind: Kind::Seq(items),
                        },
                        anchor,
                        size,
                    );
                }
                None => self.fail(pos, "unbalanced end of a mapping or list"),
            },
            Event::Alias(id) => match self.anchors.get(&id).map(|(_, size, h)| (*size, *h)) {
                Some(((nodes, bytes), height)) => {
                    // An alias nests its anchor's levels where it stands: the depth bound holds
                    // for the tree as expanded, as the loader walks it.
                    if self.stack.len() + height > MAX_DEPTH {
                        self.fail(
                            pos,
                            format!("nested more than {MAX_DEPTH} mappings or lists deep once aliases are expanded"),
                        );
                    } else if self.count(nodes, bytes, pos) {
                        if let Some((node, _, _)) = self.anchors.get(&id) {
                            let node = node.clone();
                            self.attach(node);
                        }
                    }
                }
                None => self.fail(pos, "an alias to an unknown anchor"),
            },
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}

/// Levels of mappings and lists in `node` (a scalar: 0), counted without recursion.
fn height(node: &Node) -> usize {
    let mut max = 0;
    let mut todo = vec![(node, 0)];
    while let Some((n, depth)) = todo.pop() {
        match &n.kind {
            Kind::Map(entries) => {
                max = max.max(depth + 1);
                todo.extend(entries.iter().map(|(_, _, c)| (c, depth + 1)));
            }
            Kind::Seq(items) => {
                max = max.max(depth + 1);
                todo.extend(items.iter().map(|c| (c, depth + 1)));
            }
            Kind::Scalar { .. } => {}
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_lines_and_columns() {
        let root = parse("domain: a\ndescriptors:\n  - key: k\n")
            .expect("ok")
            .expect("ok");
        let Kind::Map(entries) = root.kind else {
            panic!("not a map")
        };
        assert_eq!(entries[0].0, "domain");
        assert_eq!(entries[0].1, Pos { line: 1, col: 1 });
        let Kind::Seq(items) = &entries[1].2.kind else {
            panic!("not a list")
        };
        let Kind::Map(d) = &items[0].kind else {
            panic!("not a map")
        };
        assert_eq!(d[0].1, Pos { line: 3, col: 5 });
    }

    #[test]
    fn a_key_given_twice_is_an_error_at_the_second() {
        let e = parse("a: 1\nb: 2\na: 3\n").expect_err("an error");
        assert_eq!(e.pos.line, 3);
        assert!(e.message.contains("twice"));
    }

    #[test]
    fn aliases_resolve_to_their_anchor() {
        let root = parse("x: &v hello\ny: *v\n").expect("ok").expect("ok");
        let Kind::Map(entries) = root.kind else {
            panic!("not a map")
        };
        assert!(matches!(&entries[1].2.kind, Kind::Scalar { text, .. } if text == "hello"));
    }

    #[test]
    fn nested_aliases_cannot_expand_without_bound() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
        }
        let e = parse(&text).expect_err("bounded");
        assert!(e.message.contains("aliases"), "{}", e.message);
    }

    #[test]
    fn syntax_errors_have_a_position() {
        let e = parse("a: [1, 2\nb: 3\n").expect_err("an error");
        assert!(e.pos.line >= 1);
        // The `:` of line 2 inside the unclosed flow list.
        assert_eq!(e.pos, Pos { line: 2, col: 2 }, "{}", e.message);
        assert!(!e.message.is_empty());
    }

    #[test]
    fn empty_text_is_no_document() {
        assert!(parse("").expect("ok").is_none());
        assert!(parse("# only a comment\n").expect("ok").is_none());
    }

    #[test]
    fn aliases_cannot_expand_past_the_byte_bound() {
        // 1 MiB of text, then 70 aliases to it: few nodes, more than 64 MiB once expanded.
        let big = "x".repeat(1 << 20);
        let refs = vec!["*b"; 70].join(", ");
        let text = format!("b: &b {big}\nl: [{refs}]\n");
        let e = parse(&text).expect_err("bounded");
        assert!(e.message.contains("MiB of text"), "{}", e.message);
        assert_eq!(e.pos.line, 2);
        // Under the bound, the same shape loads.
        let refs = vec!["*b"; 60].join(", ");
        let text = format!("b: &b {big}\nl: [{refs}]\n");
        assert!(parse(&text).is_ok());
    }

    #[test]
    fn nesting_deeper_than_the_bound_is_an_error_not_a_stack_overflow() {
        // Block lists nest without limit in the parser: `- - - ... x`.
        let deep = format!("{}x\n", "- ".repeat(100_000));
        let e = parse(&deep).expect_err("too deep");
        assert!(e.message.contains("nested more than 64"), "{}", e.message);
        assert_eq!(e.pos, Pos { line: 1, col: 129 });
        // Flow lists under the parser's own limit (255).
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let e = parse(&deep).expect_err("too deep");
        assert!(e.message.contains("nested more than 64"), "{}", e.message);
        assert_eq!(e.pos, Pos { line: 1, col: 65 });
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(&ok).is_ok());
    }

    #[test]
    fn aliases_cannot_nest_past_the_depth_bound() {
        // Each anchor wraps the previous alias in 40 more levels: 40 + 40 > 64 once expanded.
        let wrap = |inner: &str| format!("{}{inner}{}", "[".repeat(40), "]".repeat(40));
        let text = format!(
            "a: &a {}
b: &b {}
",
            wrap("x"),
            wrap("*a")
        );
        let e = parse(&text).expect_err("too deep once expanded");
        assert!(e.message.contains("nested more than 64"), "{}", e.message);
        // Within the bound an alias is fine: 30 + 30 levels (plus the root mapping).
        let wrap = |inner: &str| format!("{}{inner}{}", "[".repeat(30), "]".repeat(30));
        let text = format!(
            "a: &a {}
b: &b {}
",
            wrap("x"),
            wrap("*a")
        );
        assert!(parse(&text).is_ok());
    }

    #[test]
    fn a_mapping_of_many_keys_is_checked_for_duplicates() {
        let mut text: String = (0..50_000).map(|i| format!("k{i}: {i}\n")).collect();
        assert!(parse(&text).is_ok());
        text.push_str("k123: again\n");
        let e = parse(&text).expect_err("duplicate");
        assert!(
            e.message.contains("\"k123\" appears twice"),
            "{}",
            e.message
        );
        assert_eq!(
            e.pos,
            Pos {
                line: 50_001,
                col: 1
            }
        );
    }
}
