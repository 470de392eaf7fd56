//! Where a secret's value comes from, as the policy declares it.
// moved to policy by the lead at merge

use std::path::PathBuf;
use std::time::Duration;

/// One way to read a secret's value on the host side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// The whole file, trailing newline trimmed.
    File(PathBuf),
    /// A variable of sluice's own environment.
    Env(String),
    /// A program run with no shell; its standard output, trimmed, is the
    /// value until `ttl` has passed.
    Command { argv: Vec<String>, ttl: Duration },
}

/// A secret the policy declares: its name (what templates refer to) and its
/// source. Never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub name: String,
    pub source: SecretSource,
}
