//! The `secrets:` section: named references to values sluice reads on the
//! host side (a file, its own environment, a command). The policy holds
//! where a value is, never the value, so it can travel in a bundle.

use super::Checker;
use crate::policy::http::{is_secret_name, SecretRef, SecretSource, DEFAULT_SECRET_TTL};
use crate::policy::yaml::{list, Node, Pos, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

const SECRET_KEYS: &[&str] = &["name", "file", "env", "command", "ttl"];
const SOURCES: &[&str] = &["file", "env", "command"];
/// Bounds of a command secret's `ttl`: below a second the command would
/// run for every request, above a day a rotated token would linger.
const MIN_TTL: Duration = Duration::from_secs(1);
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

impl Checker {
    /// Reads `secrets`, and records every well-formed name (even of an
    /// entry with other problems) so rules referring to it are not also
    /// reported.
    pub(super) fn secrets(&mut self, v: &Node) -> Vec<SecretRef> {
        if v.value == Value::Null {
            return Vec::new();
        }
        let items = self.list_of(
            v,
            "`secrets`",
            "`secrets: [{name: gh, file: /etc/sluice/secrets/gh}]`",
        );
        let mut out = Vec::with_capacity(items.len());
        let mut first_at: HashMap<String, Pos> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let Some((name, at, secret)) = self.secret(item, i) else {
                continue;
            };
            if let Some(first) = first_at.get(&name) {
                self.err(
                    at,
                    format!(
                        "duplicate secret name `{name}` (first used at line {}); give every secret its own name",
                        first.line
                    ),
                );
                continue;
            }
            first_at.insert(name.clone(), at);
            self.secret_names.insert(name);
            out.extend(secret);
        }
        out
    }

    /// The entry's name and where it is, and the entry if it is valid.
    fn secret(&mut self, v: &Node, index: usize) -> Option<(String, Pos, Option<SecretRef>)> {
        let Value::Map(entries) = &v.value else {
            self.err(
                v.pos,
                format!(
                    "secret #{} must be a mapping with the keys {}, but it is {}",
                    index + 1,
                    list(SECRET_KEYS),
                    v.kind()
                ),
            );
            return None;
        };
        let before = self.problems.len();
        let mut label = format!("secret #{}", index + 1);
        let name = entries
            .iter()
            .find(|(k, _)| matches!(&k.value, Value::Str(s) if s == "name"))
            .map(|(_, n)| n);
        let named = match name {
            None => None,
            Some(n) => match &n.value {
                Value::Str(s) if is_secret_name(s) => {
                    label = format!("secret `{s}`");
                    Some((s.clone(), n.pos))
                }
                _ => {
                    self.err(
                        n.pos,
                        format!(
                            "{label}'s `name` is {}; write 1 to 64 lowercase letters, digits, `_` or `-` (it becomes SLUICE_SECRET_<NAME>)",
                            n.kind()
                        ),
                    );
                    None
                }
            },
        };
        let f = self.fields(v, entries, SECRET_KEYS, &label);
        if name.is_none() {
            self.err(
                v.pos,
                format!("{label} has no `name`; add `name: <unique name>` for rules to refer to it as {{{{name}}}}"),
            );
        }

        // In file order, so that "both" points at the second one written.
        let mut given: Vec<(&str, &Node)> = SOURCES
            .iter()
            .filter_map(|k| Some((*k, f.get(k)?)))
            .collect();
        given.sort_by_key(|(_, n)| n.pos);
        let mut source = None;
        match given.as_slice() {
            [] => self.err(
                v.pos,
                format!("{label} has no source; add one of `file: /path`, `env: NAME` or `command: [program, arg]`"),
            ),
            [(key, node)] => source = self.secret_source(key, node, &label),
            [(first, _), (second, node), ..] => self.err(
                node.pos,
                format!("{label} has both `{first}` and `{second}`; keep exactly one source"),
            ),
        }
        if let Some(t) = f.get("ttl") {
            match &mut source {
                Some(SecretSource::Command { ttl, .. }) => {
                    if let Some(d) = self.ttl(t, &label) {
                        *ttl = d;
                    }
                }
                _ if matches!(given.as_slice(), [("command", _)]) => {
                    // The command itself was bad; still check the ttl.
                    self.ttl(t, &label);
                }
                _ => self.err(
                    t.pos,
                    format!("{label} has a `ttl` but no `command`; a file or environment variable is read once, so remove `ttl`"),
                ),
            }
        }
        let (name, at) = named?;
        let secret = match (source, self.problems.len() == before) {
            (Some(source), true) => Some(SecretRef {
                name: name.clone(),
                source,
            }),
            _ => None,
        };
        Some((name, at, secret))
    }

    fn secret_source(&mut self, key: &str, v: &Node, label: &str) -> Option<SecretSource> {
        match key {
            "file" => {
                let path = self.source_text(v, &format!("{label}'s `file`"))?;
                if !path.starts_with('/') {
                    self.err(
                        v.pos,
                        format!("{label}'s `file` is `{path}`, a relative path; write the absolute path (sluice reads it wherever it runs from)"),
                    );
                    return None;
                }
                Some(SecretSource::File(PathBuf::from(path)))
            }
            "env" => {
                let var = self.source_text(v, &format!("{label}'s `env`"))?;
                let portable = var
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                    && var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                if !portable {
                    self.err(
                        v.pos,
                        format!("{label}'s `env` is `{var}`, not an environment variable name; write letters, digits and `_`, not starting with a digit, like GH_TOKEN"),
                    );
                    return None;
                }
                Some(SecretSource::Env(var.to_string()))
            }
            _ => {
                let what = format!("{label}'s `command`");
                let items = self.list_of(v, &what, "`command: [gh, auth, token]`");
                if items.is_empty() {
                    if matches!(v.value, Value::Seq(_)) {
                        self.err(
                            v.pos,
                            format!("{what} is empty; list the program and its arguments, like [gh, auth, token]"),
                        );
                    }
                    return None;
                }
                let mut argv = Vec::with_capacity(items.len());
                for item in items {
                    argv.extend(
                        self.source_text(item, &format!("an argument of {what}"))
                            .map(str::to_string),
                    );
                }
                (argv.len() == items.len()).then_some(SecretSource::Command {
                    argv,
                    ttl: DEFAULT_SECRET_TTL,
                })
            }
        }
    }

    /// A non-empty string without NUL (it becomes a path, a variable name
    /// or an argument, none of which can hold one).
    fn source_text<'n>(&mut self, v: &'n Node, what: &str) -> Option<&'n str> {
        match &v.value {
            Value::Str(s) if s.is_empty() => {
                self.err(v.pos, format!("{what} is empty; write it out"));
                None
            }
            Value::Str(s) if s.contains('\0') => {
                self.err(v.pos, format!("{what} contains a NUL character; remove it"));
                None
            }
            Value::Str(s) => Some(s),
            _ => {
                self.err(
                    v.pos,
                    format!(
                        "{what} must be a string, but it is {}; put it in quotes",
                        v.kind()
                    ),
                );
                None
            }
        }
    }

    /// A `ttl` such as "10m" or "1h 30m", within [`MIN_TTL`]..=[`MAX_TTL`].
    fn ttl(&mut self, v: &Node, label: &str) -> Option<Duration> {
        let what = format!("{label}'s `ttl`");
        let Value::Str(s) = &v.value else {
            self.err(
                v.pos,
                format!(
                    "{what} is {}; write a duration with its unit, like \"10m\", \"90s\" or \"1h\"",
                    v.kind()
                ),
            );
            return None;
        };
        match humantime::parse_duration(s.trim()) {
            Ok(d) if (MIN_TTL..=MAX_TTL).contains(&d) => Some(d),
            Ok(_) => {
                self.err(
                    v.pos,
                    format!("{what} is {s:?}; write a duration from 1s to 24h"),
                );
                None
            }
            Err(_) => {
                self.err(
                    v.pos,
                    format!(
                        "{what} {s:?} is not a duration; write one like \"10m\", \"90s\" or \"1h\""
                    ),
                );
                None
            }
        }
    }
}
