//! The YAML layer of every file sluice reads (the policy, a bundle's
//! manifest, key and trust files, the revision state, the daemon config):
//! text in, a small tree out in which every node carries its `line:column`.
//! It enforces hard bounds while it reads (node count, nesting depth; the
//! caller caps the size) and refuses anchors, aliases, tags and a second
//! document, each at its own position. It must never expand an alias or
//! read on past a bound: hostile input costs at most the bounds.
//!
//! Built on saphyr-parser's pull-style event stream rather than on
//! marked-yaml: sluice takes the events one at a time, each with its span,
//! so a bound stops reading at the node that crosses it, where marked-yaml's
//! loader is a receiver that yaml-rust2 drives to the end of the document,
//! with no bound on depth or node count; repeated keys stay in the tree, so
//! validation can say where the first one was (marked-yaml keeps only the
//! last, or stops at the second); and saphyr, from the same project, types
//! plain scalars by the YAML 1.2 core schema. Refusing anchors, aliases and
//! tags is one check per event.

mod read;

pub(crate) use read::{fields, list, Fields, Record};

use saphyr_parser::{Event, Parser, ScalarStyle, Span};
use std::fmt;

/// Most YAML nodes (scalars, lists, mappings) in one file.
pub(crate) const MAX_NODES: usize = 1_000_000;
/// Deepest nesting of lists and mappings (serde_yaml's limit, which sluice
/// had before).
pub(crate) const MAX_DEPTH: usize = 128;

/// A 1-based line and column (columns count characters, as editors do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Pos {
    pub(crate) line: usize,
    pub(crate) column: usize,
}

impl Pos {
    /// The start of the file.
    pub(crate) const START: Pos = Pos { line: 1, column: 1 };

    fn of(span: Span) -> Pos {
        Pos {
            line: span.start.line(),
            column: span.start.col() + 1,
        }
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// One thing wrong with a file, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) at: Pos,
    /// What is wrong and what to do about it.
    pub(crate) message: String,
}

impl Problem {
    pub(crate) fn new(at: Pos, message: impl Into<String>) -> Problem {
        Problem {
            at,
            message: message.into(),
        }
    }
}

/// A YAML node and where it starts. A mapping starts at its first key (an
/// empty one at its `{`), a list at its first `-` or its `[`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub(crate) pos: Pos,
    pub(crate) value: Value,
}

/// A node's value. Mappings keep their entries in file order, repeated keys
/// included.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// A short description for "must be X, but it is Y" messages.
    pub(crate) fn kind(&self) -> String {
        match &self.value {
            Value::Null => "nothing (null)".into(),
            Value::Bool(b) => format!("`{b}`"),
            Value::Int(i) => format!("the number {i}"),
            Value::Float(x) => format!("the number {x}"),
            Value::Str(s) => format!("the string {s:?}"),
            Value::Seq(_) => "a list".into(),
            Value::Map(_) => "a mapping".into(),
        }
    }
}

/// Parses `text` (one document) into a tree. An empty document is a null
/// root at 1:1.
pub(crate) fn parse(text: &str) -> Result<Node, Problem> {
    parse_within(text, MAX_NODES)
}

/// [`parse`] with a node budget of `max_nodes`.
fn parse_within(text: &str, max_nodes: usize) -> Result<Node, Problem> {
    let mut tree = Tree {
        root: None,
        open: Vec::new(),
        nodes_left: max_nodes,
        max_nodes,
    };
    let mut documents = 0;
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| {
            let at = Pos {
                line: e.marker().line(),
                column: e.marker().col() + 1,
            };
            // The scanner has a nesting limit of its own (255 flow levels),
            // which it can reach before the parser hands out the events
            // that would reach MAX_DEPTH: say the same thing either way.
            let message = if e.info() == "recursion limit exceeded" {
                too_deep()
            } else {
                format!("{}; fix the YAML there", e.info())
            };
            Problem::new(at, message)
        })?;
        let at = Pos::of(span);
        match event {
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(Problem::new(
                        at,
                        "the file holds more than one document (a second `---`); keep one YAML document",
                    ));
                }
            }
            Event::Alias(_) => {
                return Err(Problem::new(
                    at,
                    "YAML aliases (`*name`) are not supported; write the value out in full",
                ))
            }
            Event::Scalar(text, style, anchor, tag) => {
                plain_node(at, anchor, tag.is_some())?;
                tree.spend(at)?;
                tree.complete(Node {
                    pos: at,
                    value: scalar(text, style),
                });
            }
            Event::SequenceStart(anchor, tag) => {
                plain_node(at, anchor, tag.is_some())?;
                tree.open(at, Open::Seq(Vec::new()))?;
            }
            Event::MappingStart(anchor, tag) => {
                plain_node(at, anchor, tag.is_some())?;
                tree.open(at, Open::Map(Vec::new(), None))?;
            }
            Event::SequenceEnd | Event::MappingEnd => tree.close(),
            Event::StreamEnd => break,
            Event::Nothing | Event::StreamStart | Event::DocumentEnd => {}
        }
    }
    Ok(tree.root.unwrap_or(Node {
        pos: Pos::START,
        value: Value::Null,
    }))
}

/// Refuses an anchor (`&name`) or a tag (`!name`) on a node: aliases are
/// refused anyway, and no file sluice reads has a use for tags.
fn plain_node(at: Pos, anchor: usize, tagged: bool) -> Result<(), Problem> {
    if anchor != 0 {
        return Err(Problem::new(
            at,
            "YAML anchors (`&name`) are not supported; write the value out in full",
        ));
    }
    if tagged {
        return Err(Problem::new(
            at,
            "YAML tags (`!name`) are not supported; remove the tag",
        ));
    }
    Ok(())
}

/// Types a scalar by the YAML 1.2 core schema: quoted scalars are strings;
/// plain ones may be null, a boolean, an integer or a float.
fn scalar(text: std::borrow::Cow<'_, str>, style: ScalarStyle) -> Value {
    use saphyr::Scalar;
    if style == ScalarStyle::Plain {
        // saphyr stops at i64 (and reads a longer decimal as a float); the
        // core schema's integers are unbounded, and a manifest's revision is
        // a u64.
        let digits = text.strip_prefix(['-', '+']).unwrap_or(&text);
        if digits.len() > 18 && digits.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(i) = text.parse::<i128>() {
                return Value::Int(i);
            }
        }
    }
    match Scalar::parse_from_cow_and_metadata(text, style, None) {
        Some(Scalar::Null) | None => Value::Null,
        Some(Scalar::Boolean(b)) => Value::Bool(b),
        Some(Scalar::Integer(i)) => Value::Int(i.into()),
        Some(Scalar::FloatingPoint(x)) => Value::Float(x.0),
        Some(Scalar::String(s)) => Value::Str(s.into_owned()),
    }
}

fn too_deep() -> String {
    format!(
        "lists and mappings are nested more than {MAX_DEPTH} levels deep here; flatten the YAML"
    )
}

/// The tree being built: the finished root, and the lists and mappings
/// still open (innermost last), so that no part of building recurses.
struct Tree {
    root: Option<Node>,
    open: Vec<(Pos, Open)>,
    nodes_left: usize,
    max_nodes: usize,
}

enum Open {
    Seq(Vec<Node>),
    /// Entries so far, and a key waiting for its value.
    Map(Vec<(Node, Node)>, Option<Node>),
}

impl Tree {
    fn spend(&mut self, at: Pos) -> Result<(), Problem> {
        let max = self.max_nodes;
        self.nodes_left = self.nodes_left.checked_sub(1).ok_or_else(|| {
            Problem::new(
                at,
                format!(
                    "the file has more than {max} YAML values; split it or remove what is unused"
                ),
            )
        })?;
        Ok(())
    }

    fn open(&mut self, at: Pos, open: Open) -> Result<(), Problem> {
        self.spend(at)?;
        if self.open.len() >= MAX_DEPTH {
            return Err(Problem::new(at, too_deep()));
        }
        self.open.push((at, open));
        Ok(())
    }

    fn close(&mut self) {
        let Some((at, open)) = self.open.pop() else {
            return;
        };
        let node = match open {
            Open::Seq(items) => Node {
                pos: at,
                value: Value::Seq(items),
            },
            Open::Map(entries, _) => Node {
                pos: entries.first().map_or(at, |(k, _)| k.pos),
                value: Value::Map(entries),
            },
        };
        self.complete(node);
    }

    /// Puts a finished node where it belongs: into the innermost open list
    /// or mapping, or at the root.
    fn complete(&mut self, node: Node) {
        match self.open.last_mut() {
            None => self.root = Some(node),
            Some((_, Open::Seq(items))) => items.push(node),
            Some((_, Open::Map(entries, pending))) => match pending.take() {
                None => *pending = Some(node),
                Some(key) => entries.push((key, node)),
            },
        }
    }
}

#[cfg(test)]
mod tests;
