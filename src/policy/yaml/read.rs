//! Reading the tree: a mapping's keys checked against the keys it may have
//! (every key a string, known and given once, with a suggestion for a
//! misspelling), and typed access to values with messages that say what was
//! expected, what was found and what to write. The policy collects every
//! problem ([`fields`]); the smaller files stop at their first ([`Record`]).
//! Nothing here knows what a key means.

use super::{Node, Pos, Problem, Value};
use std::collections::HashMap;

/// The known keys of one mapping, each with its value.
pub(crate) struct Fields<'n> {
    /// Where the mapping is.
    pub(crate) at: Pos,
    found: HashMap<&'static str, &'n Node>,
}

impl<'n> Fields<'n> {
    pub(crate) fn get(&self, key: &str) -> Option<&'n Node> {
        self.found.get(key).copied()
    }
}

/// Checks the keys of the mapping at `at`: strings, among `allowed`, not
/// repeated; every violation goes to `problems`. `what` names the mapping in
/// messages ("the policy", "rule `web`").
pub(crate) fn fields<'n>(
    at: Pos,
    entries: &'n [(Node, Node)],
    allowed: &[&'static str],
    what: &str,
    problems: &mut Vec<Problem>,
) -> Fields<'n> {
    let mut found: HashMap<&'static str, &'n Node> = HashMap::new();
    let mut first_at: HashMap<&'static str, Pos> = HashMap::new();
    for (key, value) in entries {
        let Value::Str(name) = &key.value else {
            problems.push(Problem::new(
                key.pos,
                format!(
                    "{what} has a key that is {}; the allowed keys are {}",
                    key.kind(),
                    list(allowed)
                ),
            ));
            continue;
        };
        let Some(&known) = allowed.iter().find(|k| **k == name) else {
            let hint = match suggest(name, allowed) {
                Some(s) => format!("did you mean `{s}`? the allowed keys are"),
                None => "remove it; the allowed keys are".to_string(),
            };
            problems.push(Problem::new(
                key.pos,
                format!("unknown key `{name}` in {what}; {hint} {}", list(allowed)),
            ));
            continue;
        };
        if let Some(first) = first_at.get(known) {
            problems.push(Problem::new(
                key.pos,
                format!(
                    "key `{name}` appears twice in {what} (first at line {}); keep only one",
                    first.line
                ),
            ));
            continue;
        }
        first_at.insert(known, key.pos);
        found.insert(known, value);
    }
    Fields { at, found }
}

/// One mapping of a small file (a manifest, a key or trust file, the daemon
/// config), read up to its first problem.
pub(crate) struct Record<'n> {
    what: String,
    fields: Fields<'n>,
}

impl<'n> Record<'n> {
    /// `node` must be a mapping whose keys are all among `allowed`; `what`
    /// names it in messages ("the manifest").
    pub(crate) fn open(
        node: &'n Node,
        what: &str,
        allowed: &[&'static str],
    ) -> Result<Record<'n>, Problem> {
        let entries = node.map(what, allowed)?;
        let mut problems = Vec::new();
        let fields = fields(node.pos, entries, allowed, what, &mut problems);
        match problems.into_iter().next() {
            Some(p) => Err(p),
            None => Ok(Record {
                what: what.to_string(),
                fields,
            }),
        }
    }

    /// The value of `key`, or a problem that says it is missing and what
    /// to do (`hint`).
    pub(crate) fn required(&self, key: &str, hint: &str) -> Result<&'n Node, Problem> {
        self.fields.get(key).ok_or_else(|| {
            Problem::new(
                self.fields.at,
                format!("{} has no `{key}`; {hint}", self.what),
            )
        })
    }
}

/// Typed access; `what` names the value ("the manifest's `revision`").
impl Node {
    /// A mapping's entries; null counts as an empty mapping.
    pub(crate) fn map(&self, what: &str, allowed: &[&str]) -> Result<&[(Node, Node)], Problem> {
        match &self.value {
            Value::Map(entries) => Ok(entries),
            Value::Null => Ok(&[]),
            _ => Err(Problem::new(
                self.pos,
                format!(
                    "{what} must be a mapping with the keys {}, but it is {}",
                    list(allowed),
                    self.kind()
                ),
            )),
        }
    }

    /// A list's items; `example` shows one written out.
    pub(crate) fn seq(&self, what: &str, example: &str) -> Result<&[Node], Problem> {
        match &self.value {
            Value::Seq(items) => Ok(items),
            _ => Err(Problem::new(
                self.pos,
                format!(
                    "{what} must be a list, but it is {}; write it like {example}",
                    self.kind()
                ),
            )),
        }
    }

    /// Text. A plain number or `true` is not text here: the files that use
    /// this compare it exactly (key ids, names, digests), so it must be
    /// written as the string meant.
    pub(crate) fn text(&self, what: &str) -> Result<&str, Problem> {
        match &self.value {
            Value::Str(s) => Ok(s),
            Value::Int(_) | Value::Float(_) | Value::Bool(_) => Err(Problem::new(
                self.pos,
                format!(
                    "{what} must be text, but it is {}; put it in quotes",
                    self.kind()
                ),
            )),
            _ => Err(Problem::new(
                self.pos,
                format!("{what} must be text, but it is {}", self.kind()),
            )),
        }
    }

    /// A whole number from 0 to `u64::MAX`.
    pub(crate) fn unsigned(&self, what: &str) -> Result<u64, Problem> {
        match &self.value {
            Value::Int(i) => u64::try_from(*i).map_err(|_| {
                Problem::new(
                    self.pos,
                    format!(
                        "{what} is {i}, out of range; write a whole number from 0 to {}",
                        u64::MAX
                    ),
                )
            }),
            _ => Err(Problem::new(
                self.pos,
                format!("{what} must be a whole number, but it is {}", self.kind()),
            )),
        }
    }

    /// `true` or `false`.
    pub(crate) fn flag(&self, what: &str) -> Result<bool, Problem> {
        match &self.value {
            Value::Bool(b) => Ok(*b),
            _ => Err(Problem::new(
                self.pos,
                format!(
                    "{what} must be `true` or `false`, but it is {}",
                    self.kind()
                ),
            )),
        }
    }
}

/// "`a`, `b`, `c`"
pub(crate) fn list(keys: &[&str]) -> String {
    keys.iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The allowed key closest to a misspelled one, if it is close.
fn suggest(key: &str, allowed: &[&'static str]) -> Option<&'static str> {
    allowed
        .iter()
        .map(|k| (edit_distance(&key.to_ascii_lowercase(), k), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}
