//! The YAML layer: parse text into a small position-free tree with hard
//! bounds (input size, node count, serde_yaml's depth and alias limits), and
//! find the `line:column` of any node or key in that tree afterwards.
//!
//! serde_yaml 0.9 exposes no spans, but it stamps the position of the node
//! being read onto any error a visitor returns. Positions are found by
//! walking the document a second time (only when there are violations) and
//! failing on purpose at each target scalar: [`locate_many`] catches each
//! such error in the parent visitor, reads the position, and walks on, so
//! one parse locates every target. The rare target that is not a scalar
//! (an empty list or mapping) is found by [`locate`], which walks to it and
//! stops there (one parse each).

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
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
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
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

/// Error text of a deliberate failure at a scalar (caught by the walker).
const AT_SCALAR: &str = "\u{1}sluice: position of this scalar\u{1}";
/// Error text of a deliberate failure at a list or mapping key (not caught:
/// serde_yaml cannot resume after it).
const AT_CONTAINER: &str = "\u{1}sluice: position of this node\u{1}";

/// Finds the positions of all `locs` in `text`: one parse for every target
/// that is a scalar, a key, or a non-empty mapping (located at its first
/// key); one more parse each for the others, at most `max_extra` of them.
pub(crate) fn locate_many(
    text: &str,
    locs: &[Loc],
    max_extra: usize,
) -> Vec<Option<(usize, usize)>> {
    let mut prefixes: HashSet<&[usize]> = HashSet::new();
    let mut values: HashSet<&[usize]> = HashSet::new();
    let mut keys: HashSet<&[usize]> = HashSet::new();
    for loc in locs {
        for n in 0..=loc.path.len() {
            prefixes.insert(&loc.path[..n]);
        }
        if loc.key {
            keys.insert(&loc.path);
        } else {
            values.insert(&loc.path);
        }
    }
    let walk = Walk {
        prefixes,
        values,
        keys,
        found: RefCell::new(HashMap::new()),
    };
    // A walk that stops early (a complex key) keeps what it found so far.
    let _ = WalkSeed {
        walk: &walk,
        path: Vec::new(),
    }
    .deserialize(serde_yaml::Deserializer::from_str(text));
    let found = walk.found.into_inner();
    let mut extra = 0;
    locs.iter()
        .map(|loc| {
            found.get(loc).copied().or_else(|| {
                extra += 1;
                (extra <= max_extra).then(|| locate(text, loc)).flatten()
            })
        })
        .collect()
}

struct Walk<'a> {
    /// Every prefix of a target path: the nodes worth descending into.
    prefixes: HashSet<&'a [usize]>,
    values: HashSet<&'a [usize]>,
    keys: HashSet<&'a [usize]>,
    found: RefCell<HashMap<Loc, (usize, usize)>>,
}

impl Walk<'_> {
    /// Records the position of a deliberate scalar failure and swallows it;
    /// any other error goes on up.
    fn catch<E: de::Error>(&self, err: E, loc: Loc) -> Result<(), E> {
        let text = err.to_string();
        if !text.contains(AT_SCALAR) {
            return Err(err);
        }
        // serde_yaml renders "<path>: <message> at line L column C", and
        // leaves the suffix out for line 1 column 1.
        let pos = text
            .rsplit_once(" at line ")
            .and_then(|(_, rest)| rest.split_once(" column "))
            .and_then(|(l, c)| Some((l.parse().ok()?, c.parse().ok()?)))
            .unwrap_or((1, 1));
        self.found.borrow_mut().entry(loc).or_insert(pos);
        Ok(())
    }
}

struct WalkSeed<'w, 'a> {
    walk: &'w Walk<'a>,
    path: Vec<usize>,
}

impl<'de> DeserializeSeed<'de> for WalkSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl WalkSeed<'_, '_> {
    fn leaf<E: de::Error>(&self) -> Result<(), E> {
        if self.walk.values.contains(self.path.as_slice()) {
            Err(E::custom(AT_SCALAR))
        } else {
            Ok(())
        }
    }

    fn child(&self, i: usize) -> Vec<usize> {
        let mut path = self.path.clone();
        path.push(i);
        path
    }
}

/// Fails at a scalar key with [`AT_SCALAR`], at anything else with
/// [`AT_CONTAINER`].
struct KeyHere;

impl<'de> DeserializeSeed<'de> for KeyHere {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(KeyHere)
    }
}

macro_rules! scalar_visits {
    ($($method:ident($ty:ty)),*) => {$(
        fn $method<E: de::Error>(self, _v: $ty) -> Result<(), E> {
            self.leaf()
        }
    )*};
}

impl KeyHere {
    fn leaf<E: de::Error>(&self) -> Result<(), E> {
        Err(E::custom(AT_SCALAR))
    }
}

impl<'de> Visitor<'de> for KeyHere {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(AT_CONTAINER)
    }

    scalar_visits!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_i128(i128),
        visit_u128(u128),
        visit_f64(f64),
        visit_str(&str)
    );

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.leaf()
    }
}

impl<'de> Visitor<'de> for WalkSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(AT_CONTAINER)
    }

    scalar_visits!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_i128(i128),
        visit_u128(u128),
        visit_f64(f64),
        visit_str(&str)
    );

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.leaf()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.leaf()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        for i in 0.. {
            let path = self.child(i);
            if self.walk.prefixes.contains(path.as_slice()) {
                let seed = WalkSeed {
                    walk: self.walk,
                    path: path.clone(),
                };
                match seq.next_element_seed(seed) {
                    Ok(None) => break,
                    Ok(Some(())) => {}
                    Err(e) => self.walk.catch(e, Loc { path, key: false })?,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let whole = self.walk.values.contains(self.path.as_slice());
        for i in 0.. {
            let path = self.child(i);
            let key_target = self.walk.keys.contains(path.as_slice());
            if key_target || (whole && i == 0) {
                match map.next_key_seed(KeyHere) {
                    Ok(None) => break,
                    Ok(Some(())) => {}
                    Err(e) => {
                        let key = Loc {
                            path: path.clone(),
                            key: true,
                        };
                        self.walk.catch(e, key.clone())?;
                        if whole && i == 0 {
                            // A mapping is located at its first key.
                            let mut found = self.walk.found.borrow_mut();
                            let pos = found[&key];
                            let whole = Loc {
                                path: self.path.clone(),
                                key: false,
                            };
                            found.entry(whole).or_insert(pos);
                        }
                    }
                }
            } else if map.next_key::<IgnoredAny>()?.is_none() {
                break;
            }
            if self.walk.prefixes.contains(path.as_slice()) {
                let seed = WalkSeed {
                    walk: self.walk,
                    path: path.clone(),
                };
                if let Err(e) = map.next_value_seed(seed) {
                    self.walk.catch(e, Loc { path, key: false })?;
                }
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(path: &[usize], key: bool) -> Loc {
        Loc {
            path: path.to_vec(),
            key,
        }
    }

    const DOC: &str = "a: 1\nb:\n  - x\n  - {k: v, l: [1, 2]}\n  - &anchor w\n  - *anchor\nc: {}\n";

    #[test]
    fn one_walk_locates_scalars_keys_and_mappings() {
        let locs = [
            loc(&[0], false),          // 1
            loc(&[1], true),           // b
            loc(&[1, 0], false),       // x
            loc(&[1, 1], false),       // {k: v, ...} at its first key
            loc(&[1, 1, 1], true),     // l
            loc(&[1, 1, 1, 1], false), // 2
            loc(&[1, 3], false),       // *anchor: where the anchored value is
        ];
        let got = locate_many(DOC, &locs, 0);
        let want = [(1, 4), (2, 1), (3, 5), (4, 6), (4, 12), (4, 19), (5, 5)];
        let got: Vec<_> = got.into_iter().map(Option::unwrap).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn walk_agrees_with_single_probes() {
        let locs = [loc(&[1, 0], false), loc(&[1, 1, 0], true), loc(&[2], true)];
        for (l, many) in locs.iter().zip(locate_many(DOC, &locs, 0)) {
            assert_eq!(many, locate(DOC, l), "{l:?}");
        }
    }

    #[test]
    fn empty_containers_need_a_probe_each() {
        let empty = [loc(&[2], false)];
        assert_eq!(locate_many(DOC, &empty, 0), [None]);
        assert_eq!(locate_many(DOC, &empty, 1), [Some((7, 4))]);
    }

    #[test]
    fn complex_keys_stop_the_walk_without_panicking() {
        let doc = "? [a, b]\n: 1\nz: 2\n";
        let got = locate_many(doc, &[loc(&[0], true), loc(&[1], false)], 5);
        assert_eq!(got[1], Some((3, 4)));
    }
}
