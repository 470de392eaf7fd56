//! `manifest.yaml`: what was signed. Parsing is bounded (size cap, serde_yaml's
//! depth and alias limits, unknown keys refused) and every field is checked
//! while it is read, so a refusal points at `line:col`.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};
use time::OffsetDateTime;

/// Largest manifest accepted.
pub const MAX_MANIFEST_BYTES: usize = 64 * 1024;
/// Most files a manifest may list.
pub const MAX_LISTED_FILES: usize = 16;

/// The signed description of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The bundle's name (the policy's `name`); revisions count per name.
    pub name: BundleName,
    /// Higher is newer; a host refuses a revision lower than one it accepted.
    pub revision: u64,
    pub created: Timestamp,
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
            return Err((1, 1, format!("over {MAX_MANIFEST_BYTES} bytes")));
        }
        serde_yaml::from_str::<Manifest>(text).map_err(|e| {
            let (line, col) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
            let mut msg = e.to_string();
            if let Some(at) = msg.find(" at line ") {
                msg.truncate(at);
            }
            (line, col, msg)
        })
    }

    /// The exact bytes that get signed.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(self).expect("manifest serializes")
    }
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

impl<'de> Deserialize<'de> for BundleName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, |s| {
            BundleName::new(s)
                .ok_or_else(|| format!("name {s:?} must be 1-128 letters, digits, '-', '_' or '.'"))
        })
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
pub fn parse_time(text: &str) -> Result<OffsetDateTime, String> {
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

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, |s| parse_time(s).map(Timestamp::new))
    }
}

/// The `files:` map: plain file names to SHA-256 hex.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Files(pub BTreeMap<String, String>);

impl<'de> Deserialize<'de> for Files {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Checked per key and value so that errors carry their position.
        let map = BTreeMap::<ListedName, Sha256Hex>::deserialize(d)?;
        if map.len() > MAX_LISTED_FILES {
            return Err(de::Error::custom(format!(
                "lists {} files; at most {MAX_LISTED_FILES}",
                map.len()
            )));
        }
        Ok(Files(map.into_iter().map(|(k, v)| (k.0, v.0)).collect()))
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct ListedName(String);

impl<'de> Deserialize<'de> for ListedName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, |name| {
            if !plain_name(name) || name == "manifest.yaml" || name == "manifest.sig" {
                return Err(format!(
                    "file name {name:?} must be a plain name in the bundle directory"
                ));
            }
            Ok(ListedName(name.to_string()))
        })
    }
}

struct Sha256Hex(String);

impl<'de> Deserialize<'de> for Sha256Hex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        checked_str(d, |digest| {
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "digest {digest:?} must be 64 hex characters (SHA-256)"
                ));
            }
            Ok(Sha256Hex(digest.to_string()))
        })
    }
}

/// Reads a string and checks it inside the visitor, where serde_yaml still
/// knows the position to stamp on the error.
fn checked_str<'de, D, T, F>(d: D, check: F) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    F: FnOnce(&str) -> Result<T, String>,
{
    struct V<F>(F);
    impl<'de, T, F: FnOnce(&str) -> Result<T, String>> de::Visitor<'de> for V<F> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            (self.0)(v).map_err(E::custom)
        }
    }
    d.deserialize_str(V(check))
}

/// A file name without directories: no `/`, `\`, NUL, not `.` or `..`.
pub(crate) fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
}
