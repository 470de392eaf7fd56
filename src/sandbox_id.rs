//! The sandbox id: the `sandbox` field of audit and timing records, the
//! `sandbox` label of the drop counters, and the name the daemon, `sluice
//! vm`, `sluice vm detach` and `sluice status` know a sandbox by. One type
//! with one rule ([`SandboxId::RULE`]), checked where an id comes in (clap's
//! value parser, the daemon's API deserialisation), so that past the
//! boundary every id is a valid one. A small leaf: it imports nothing of
//! sluice's, and never holds anything but the checked text.

use std::fmt;
use std::str::FromStr;

/// The longest sandbox id, in bytes (characters: the rule admits ASCII
/// only). Container ids as OCI runtimes make them are 64 hex digits; names
/// people choose fit too.
pub const MAX_LEN: usize = 128;

/// A sandbox id: 1 to [`MAX_LEN`] letters, digits, '.', '_' or '-'.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(String);

/// An id that breaks [`SandboxId::RULE`]; its message names the id and the
/// rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{id:?} is not a sandbox id: {}", SandboxId::RULE)]
pub struct BadSandboxId {
    id: String,
}

impl SandboxId {
    /// What an id must be, as errors say it.
    pub const RULE: &'static str =
        "use 1 to 128 ASCII letters, digits, '.', '_' or '-' (a container id or a name)";

    /// `id`, if it keeps the rule.
    pub(crate) fn new(id: impl Into<String>) -> Result<SandboxId, BadSandboxId> {
        let id = id.into();
        let ok = !id.is_empty()
            && id.len() <= MAX_LEN
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(SandboxId(id))
        } else {
            Err(BadSandboxId { id })
        }
    }

    /// `PREFIX-N`, e.g. `host-4242` for `sluice run`'s sandbox (sluice's
    /// pid). `prefix` is sluice's own, and keeps the rule.
    pub fn numbered(prefix: &'static str, n: u32) -> SandboxId {
        SandboxId::new(format!("{prefix}-{n}")).expect("sluice's own prefixes keep the rule")
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SandboxId {
    type Err = BadSandboxId;

    fn from_str(s: &str) -> Result<SandboxId, BadSandboxId> {
        SandboxId::new(s)
    }
}

impl TryFrom<String> for SandboxId {
    type Error = BadSandboxId;

    fn try_from(s: String) -> Result<SandboxId, BadSandboxId> {
        SandboxId::new(s)
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> String {
        id.0
    }
}

impl AsRef<str> for SandboxId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for SandboxId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for SandboxId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SandboxId, D::Error> {
        let text = String::deserialize(d)?;
        SandboxId::new(text).map_err(serde::de::Error::custom)
    }
}

impl crate::exit_class::Classified for BadSandboxId {
    /// An id that breaks the rule is the user's to fix.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::BadInput
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_and_names_are_sandbox_ids() {
        for id in [
            "0123abcdef",
            "my-container_1.x",
            "vm-42",
            &"a".repeat(MAX_LEN),
        ] {
            assert_eq!(SandboxId::new(id).unwrap().as_str(), id);
        }
    }

    #[test]
    fn an_id_that_breaks_the_rule_is_refused_naming_it_and_the_rule() {
        for id in ["", "../x", "a b", "é", "a/b", &"a".repeat(MAX_LEN + 1)] {
            let err = SandboxId::new(id).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("{id:?} is not a sandbox id: {}", SandboxId::RULE)
            );
        }
    }

    #[test]
    fn the_rule_says_the_limit() {
        assert!(SandboxId::RULE.contains(&format!("1 to {MAX_LEN} ")));
    }

    #[test]
    fn deserialising_checks_the_rule() {
        let ok: SandboxId = serde_json::from_str("\"ctr-1\"").unwrap();
        assert_eq!(ok.as_str(), "ctr-1");
        let err = serde_json::from_str::<SandboxId>("\"../x\"").unwrap_err();
        assert!(err.to_string().contains(SandboxId::RULE), "{err}");
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"ctr-1\"");
    }
}
