//! The YAML layer: parse text into a small position-free tree with hard
//! bounds (input size, node count, serde_yaml's depth and alias limits), and
//! find the `line:column` of any node or key in that tree afterwards.
//!
//! serde_yaml 0.9 exposes no spans, but it stamps the position of the node
//! being read onto any error a visitor returns. [`locate`] uses that: it
//! walks the document again along a path and fails on purpose at the target,
//! then reads the position off the error. Valid files are parsed once; each
//! violation costs one more parse, and only files with violations pay it.

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::cell::Cell;
use std::fmt;

/// Largest policy text accepted.
pub(crate) const MAX_BYTES: usize = 4 << 20;
/// Most YAML nodes (scalars, lists, maps, alias expansions counted again).
pub(crate) const MAX_NODES: usize = 1_000_000;

/// A YAML value without positions. Maps keep their entries in file order,
/// duplicates included, so that entry indices match the document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// A short description for "expected X, found Y" messages.
    pub(crate) fn kind(&self) -> String {
        match self {
            Node::Null => "nothing (null)".into(),
            Node::Bool(b) => format!("`{b}`"),
            Node::Int(i) => format!("the number {i}"),
            Node::Float(x) => format!("the number {x}"),
            Node::Str(s) => format!("the string {s:?}"),
            Node::Seq(_) => "a list".into(),
            Node::Map(_) => "a mapping".into(),
        }
    }
}

/// Where a node is: entry/element indices from the root; `key` targets the
/// key of the last map entry instead of its value.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Loc {
    pub path: Vec<usize>,
    pub key: bool,
}

impl Loc {
    pub(crate) fn child(&self, i: usize) -> Loc {
        let mut path = self.path.clone();
        path.push(i);
        Loc { path, key: false }
    }

    pub(crate) fn key_of(&self, i: usize) -> Loc {
        let mut path = self.path.clone();
        path.push(i);
        Loc { path, key: true }
    }
}

/// A parse failure: message and 1-based position.
#[derive(Debug)]
pub(crate) struct ParseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Parses `text` into a [`Node`] tree, refusing oversized or explosive input.
pub(crate) fn parse(text: &str) -> Result<Node, ParseError> {
    if text.len() > MAX_BYTES {
        return Err(ParseError {
            line: 1,
            column: 1,
            message: format!(
                "the policy is {} bytes, over the {} MiB limit; split it or remove unused rules",
                text.len(),
                MAX_BYTES >> 20
            ),
        });
    }
    let budget = Cell::new(MAX_NODES);
    let de = serde_yaml::Deserializer::from_str(text);
    NodeSeed { budget: &budget }
        .deserialize(de)
        .map_err(from_serde)
}

fn from_serde(err: serde_yaml::Error) -> ParseError {
    let text = err.to_string();
    match err.location() {
        Some(loc) => {
            let suffix = format!(" at line {} column {}", loc.line(), loc.column());
            let message = text.strip_suffix(&suffix).unwrap_or(&text).to_string();
            ParseError {
                line: loc.line(),
                column: loc.column(),
                message: format!("{message}; fix the YAML there"),
            }
        }
        None => ParseError {
            line: 1,
            column: 1,
            message: format!("{text}; a policy is a single YAML document"),
        },
    }
}

struct NodeSeed<'a> {
    budget: &'a Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
    type Value = Node;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor {
            budget: self.budget,
        })
    }
}

struct NodeVisitor<'a> {
    budget: &'a Cell<usize>,
}

impl NodeVisitor<'_> {
    fn spend<E: de::Error>(&self) -> Result<(), E> {
        match self.budget.get().checked_sub(1) {
            Some(left) => {
                self.budget.set(left);
                Ok(())
            }
            None => Err(E::custom(format_args!(
                "the policy expands to more than {MAX_NODES} YAML values (aliases count each time they are used); write it out plainly"
            ))),
        }
    }
}

impl<'de> Visitor<'de> for NodeVisitor<'_> {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Int(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Int(v.into()))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Int(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        self.spend()?;
        Ok(i128::try_from(v).map_or(Node::Float(v as f64), Node::Int))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Str(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Str(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        self.spend()?;
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        NodeSeed {
            budget: self.budget,
        }
        .deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        self.spend()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(NodeSeed {
            budget: self.budget,
        })? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        self.spend()?;
        let mut entries = Vec::new();
        while let Some(key) = map.next_key_seed(NodeSeed {
            budget: self.budget,
        })? {
            let value = map.next_value_seed(NodeSeed {
                budget: self.budget,
            })?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _data: A) -> Result<Node, A::Error> {
        Err(de::Error::custom(
            "YAML tags (`!name`) are not supported in a policy; remove the tag",
        ))
    }
}

/// Returns the 1-based `(line, column)` of `loc` in `text`, if it exists.
pub(crate) fn locate(text: &str, loc: &Loc) -> Option<(usize, usize)> {
    let de = serde_yaml::Deserializer::from_str(text);
    let probe = Probe {
        path: &loc.path,
        key: loc.key,
    };
    match probe.deserialize(de) {
        Ok(()) => None,
        Err(err) => err.location().map(|l| (l.line(), l.column())),
    }
}

/// Walks `path` and fails at its end, so serde_yaml stamps that position.
struct Probe<'a> {
    path: &'a [usize],
    key: bool,
}

/// Fails on any node.
struct Here;

const HERE: &str = "here";

impl<'de> Visitor<'de> for Here {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(HERE)
    }
}

impl<'de> DeserializeSeed<'de> for Here {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(Here)
    }
}

impl<'de> DeserializeSeed<'de> for Probe<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.path.is_empty() {
            d.deserialize_any(Here)
        } else {
            d.deserialize_any(self)
        }
    }
}

impl<'de> Visitor<'de> for Probe<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list or mapping on the probed path")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (&index, rest) = self.path.split_first().expect("probe path is not empty");
        for _ in 0..index {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        seq.next_element_seed(Probe {
            path: rest,
            key: self.key,
        })?;
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (&index, rest) = self.path.split_first().expect("probe path is not empty");
        for _ in 0..index {
            if map.next_entry::<IgnoredAny, IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        if rest.is_empty() && self.key {
            map.next_key_seed(Here)?;
            return Ok(());
        }
        if map.next_key::<IgnoredAny>()?.is_none() {
            return Ok(());
        }
        map.next_value_seed(Probe {
            path: rest,
            key: self.key,
        })
    }
}
