//! A YAML document as a tree whose every node knows its line and column, so a configuration
//! error can name the line it sits on. Built from `yaml-rust2`'s marked parser events; anchors
//! and aliases are resolved (envoyproxy/ratelimit's YAML library accepts them too), up to
//! [`MAX_NODES`] nodes in all, so a file of nested aliases cannot expand without bound.

use std::collections::HashMap;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// The most nodes a document may hold once its aliases are expanded.
pub(crate) const MAX_NODES: usize = 1_000_000;

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
    if let Err(e) = parser.load(&mut builder, false) {
        return Err(SyntaxError {
            pos: Pos::from(*e.marker()),
            message: e.info().to_string(),
        });
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
        first: usize,
        entries: Vec<(String, Pos, Node)>,
        key: Option<(String, Pos)>,
    },
    Seq {
        pos: Pos,
        anchor: usize,
        first: usize,
        items: Vec<Node>,
    },
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Node>,
    /// Anchored nodes with how many nodes each holds.
    anchors: HashMap<usize, (Node, usize)>,
    /// Nodes so far, aliases counted at their expanded size.
    nodes: usize,
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

    /// A node of `size` nodes (itself included) is complete.
    fn finish(&mut self, node: Node, anchor: usize, size: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
        self.attach(node);
    }

    /// Counts `n` more nodes; false (and an error) past [`MAX_NODES`].
    fn count(&mut self, n: usize, pos: Pos) -> bool {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > MAX_NODES {
            self.fail(
                pos,
                format!("more than {MAX_NODES} nodes once aliases are expanded"),
            );
            return false;
        }
        true
    }

    fn attach(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => {
                self.root = Some(node);
                self.done = true;
            }
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                Some((k, kpos)) => {
                    if entries.iter().any(|(e, _, _)| *e == k) {
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
                if !self.count(1, pos) {
                    return;
                }
                let plain = style == TScalarStyle::Plain;
                self.finish(
                    Node {
                        pos,
                        kind: Kind::Scalar { text, plain },
                    },
                    anchor,
                    1,
                );
            }
            Event::MappingStart(anchor, _) => {
                if self.count(1, pos) {
                    let first = self.nodes;
                    self.stack.push(Frame::Map {
                        pos,
                        anchor,
                        first,
                        entries: Vec::new(),
                        key: None,
                    });
                }
            }
            Event::SequenceStart(anchor, _) => {
                if self.count(1, pos) {
                    let first = self.nodes;
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
                    let size = self.nodes - first + 1;
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
                    let size = self.nodes - first + 1;
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
            Event::Alias(id) => match self.anchors.get(&id).map(|(_, size)| *size) {
                Some(size) => {
                    if self.count(size, pos) {
                        if let Some((node, _)) = self.anchors.get(&id) {
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
        assert!(!e.message.is_empty());
    }

    #[test]
    fn empty_text_is_no_document() {
        assert!(parse("").expect("ok").is_none());
        assert!(parse("# only a comment\n").expect("ok").is_none());
    }
}
