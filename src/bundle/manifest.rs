//! `manifest.yaml`: what was signed. Reading is bounded (size cap, the YAML
//! layer's node and depth limits, no anchors or aliases, unknown keys
//! refused) and every field is checked where it is, so a refusal points at
//! its `line:col`. Writing goes through serde_norway, whose output is the
//! exact bytes that get signed.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Serialize, Serializer};
use time::OffsetDateTime;

use crate::policy::yaml::{self, Node, Problem, Record, Value};

/// Largest manifest accepted.
pub(crate) const MAX_MANIFEST_BYTES: usize = 64 * 1024;
/// Most files a manifest may list.
pub(crate) const MAX_LISTED_FILES: usize = 16;

/// The signed description of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Manifest {
    /// The bundle's name (the policy's `name`); revisions count per name.
    pub name: BundleName,
    /// Higher is newer; a host refuses a revision lower than one it accepted.
    pub revision: u64,
    pub(crate) created: Timestamp,
    pub expires: Timestamp,
    /// Which trusted key signed `manifest.sig`.
    pub key_id: String,
    /// SHA-256 (hex) of every other file, by plain file name.
    pub files: Files,
}

impl Manifest {
    /// `name@revision`, what audit records carry as `bundle`.
    pub fn label(&self) -> String {
        format!("{}@{}", self.name.0, self.revision)
    }

    /// Parses manifest text; on error, `(line, col, message)`.
    pub fn parse(text: &str) -> Result<Manifest, (usize, usize, String)> {
        if text.len() > MAX_MANIFEST_BYTES {
            return Err((
                1,
                1,
                format!(
                    "the manifest is {} bytes, over the {MAX_MANIFEST_BYTES}-byte limit; sign the bundle again with `sluice bundle sign`",
                    text.len()
                ),
            ));
        }
        yaml::parse(text)
            .and_then(|root| Manifest::read(&root))
            .map_err(|p| (p.at.line, p.at.column, p.message))
    }

    fn read(root: &Node) -> Result<Manifest, Problem> {
        const RESIGN: &str = "sign the bundle again with `sluice bundle sign`";
        let r = Record::open(root, "the manifest", KEYS)?;
        let name = r.required("name", RESIGN)?;
        let text = name.text("the manifest's `name`")?;
        let name = BundleName::new(text).ok_or_else(|| {
            Problem::new(
                name.pos,
                format!(
                    "the manifest's `name` {text:?} must be 1-128 letters, digits, '-', '_' or '.'"
                ),
            )
        })?;
        let revision = r
            .required("revision", RESIGN)?
            .unsigned("the manifest's `revision`")?;
        let created = timestamp(r.required("created", RESIGN)?, "created")?;
        let expires = timestamp(r.required("expires", RESIGN)?, "expires")?;
        let key_id = r
            .required("key_id", RESIGN)?
            .text("the manifest's `key_id`")?
            .to_string();
        let files = Files::read(r.required("files", RESIGN)?)?;
        Ok(Manifest {
            name,
            revision,
            created,
            expires,
            key_id,
            files,
        })
    }

    /// The exact bytes that get signed.
    pub fn to_yaml(&self) -> String {
        serde_norway::to_string(self).expect("manifest serializes")
    }
}

/// The manifest's keys, in the order sluice writes them.
const KEYS: &[&str] = &["name", "revision", "created", "expires", "key_id", "files"];

fn timestamp(node: &Node, key: &str) -> Result<Timestamp, Problem> {
    let text = node.text(&format!("the manifest's `{key}`"))?;
    parse_time(text)
        .map(Timestamp::new)
        .map_err(|e| Problem::new(node.pos, format!("the manifest's `{key}`: {e}")))
}

/// A bundle name: 1-128 characters of letters, digits, `-`, `_`, `.`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct BundleName(pub(crate) String);

impl BundleName {
    pub fn new(name: &str) -> Option<BundleName> {
        let ok = !name.is_empty()
            && name.len() <= 128
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        ok.then(|| BundleName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BundleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An RFC 3339 instant, written in UTC (`2030-01-01T00:00:00Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp(pub OffsetDateTime);

impl Timestamp {
    /// Whole seconds, UTC.
    pub fn new(at: OffsetDateTime) -> Timestamp {
        Timestamp(
            at.to_offset(time::UtcOffset::UTC)
                .replace_nanosecond(0)
                .expect("0 ns is valid"),
        )
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self
            .0
            .format(&time::format_description::well_known::Rfc3339)
            .map_err(|_| fmt::Error)?;
        f.write_str(&text)
    }
}

/// Parses an RFC 3339 timestamp in UTC (`2030-01-01T00:00:00Z`).
pub(crate) fn parse_time(text: &str) -> Result<OffsetDateTime, String> {
    humantime::parse_rfc3339(text.trim())
        .map(OffsetDateTime::from)
        .map_err(|e| {
            format!("{text:?} is not an RFC 3339 UTC time like 2030-01-01T00:00:00Z ({e})")
        })
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The `files:` map: plain file names to SHA-256 hex.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Files(pub BTreeMap<String, String>);

impl Files {
    /// Checked per name and digest, so that a refusal points at the entry.
    fn read(node: &Node) -> Result<Files, Problem> {
        let entries = match &node.value {
            Value::Map(entries) => entries.as_slice(),
            _ => {
                return Err(Problem::new(
                    node.pos,
                    format!(
                        "the manifest's `files` must map file names to SHA-256 digests, but it is {}; {}",
                        node.kind(),
                        "sign the bundle again with `sluice bundle sign`"
                    ),
                ))
            }
        };
        if entries.len() > MAX_LISTED_FILES {
            return Err(Problem::new(
                node.pos,
                format!(
                    "the manifest lists {} files; a bundle holds at most {MAX_LISTED_FILES}",
                    entries.len()
                ),
            ));
        }
        let mut files = BTreeMap::new();
        for (key, value) in entries {
            let name = key.text("a file name in the manifest's `files`")?;
            if !plain_name(name) || name == "manifest.yaml" || name == "manifest.sig" {
                return Err(Problem::new(
                    key.pos,
                    format!("file name {name:?} must be a plain name in the bundle directory"),
                ));
            }
            let digest = value.text(&format!("the digest of {name:?}"))?;
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Problem::new(
                    value.pos,
                    format!("digest {digest:?} of {name:?} must be 64 hex characters (SHA-256)"),
                ));
            }
            if files.insert(name.to_string(), digest.to_string()).is_some() {
                return Err(Problem::new(
                    key.pos,
                    format!("the manifest lists {name:?} twice; a file is listed once"),
                ));
            }
        }
        Ok(Files(files))
    }
}

/// A file name without directories: no `/`, `\`, NUL, not `.` or `..`.
pub(crate) fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
}
