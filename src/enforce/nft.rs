//! Apply one batch, read the table back and compare, count drops: each one
//! libnftables session ([`super::libnft`]) in the calling thread's network
//! namespace, where the session opens its netlink socket. No process is
//! spawned.

use std::ffi::{CStr, CString};

use serde_json::Value;

use super::libnft::{self, Reply};
use super::readback::{self, Listing, Table};
use super::ruleset::{first_ruleset, ruleset, DROP_COUNTER};
use super::{EnforceError, SandboxSpec};

/// Host mode reads everything in one go: the table, and whether any other
/// table exists (the namespace is the sandbox's alone).
const LIST_RULESET: &CStr = cr#"{"nftables":[{"list":{"ruleset":null}}]}"#;
/// Tap mode may share its namespace with the host's own firewall, whose
/// tables are none of sluice's business (and could be large).
const LIST_TABLE: &CStr = cr#"{"nftables":[{"list":{"table":{"family":"inet","name":"sluice"}}}]}"#;
/// The table's named counters, and nothing else: what a scrape reads.
const LIST_COUNTERS: &CStr =
    cr#"{"nftables":[{"list":{"counters":{"family":"inet","table":"sluice"}}}]}"#;

/// Applies [`ruleset`] as one transaction (whole or nothing), replacing any
/// previous `inet sluice` table in this thread's namespace.
///
/// A namespace without the table (every fresh sandbox) gets
/// [`first_ruleset`], which creates it; only if one exists already is the
/// full replacing batch sent. Either batch is one transaction.
pub fn apply(spec: &SandboxSpec) -> Result<(), EnforceError> {
    validate(spec)?;
    let first = command(&first_ruleset(spec))?;
    let replace = command(&ruleset(spec))?;
    libnft::session(|nft| {
        let reply = nft(&first);
        if reply.ok {
            return Ok(());
        }
        // EEXIST from `create table`: the batch was refused whole, and the
        // table there is replaced whole instead.
        if !reply.error.contains("File exists") {
            return Err(apply_error(reply));
        }
        let reply = nft(&replace);
        if reply.ok {
            Ok(())
        } else {
            Err(apply_error(reply))
        }
    })?
}

/// Reads `inet sluice` back and compares chains (type, hook, priority,
/// policy), every rule's expressions, in order, and the named counters with
/// what [`ruleset`] builds for `spec`. Handles and counter values are
/// ignored.
///
/// In host mode the namespace belongs to the sandbox alone, so any other
/// table in it is a mismatch too: a foreign chain could, for instance, DNAT
/// traffic past `ct status dnat accept`. (Tap mode may share its namespace
/// with the host's own firewall, so there only `inet sluice` is checked.)
pub fn verify(spec: &SandboxSpec) -> Result<(), EnforceError> {
    let want = Table::from_batch(&serde_json::to_value(ruleset(spec)).map_err(parse_err)?)?;
    let host = spec.tap.is_none();
    let listing = Listing::parse(&list(if host { LIST_RULESET } else { LIST_TABLE })?)?;
    let got = listing.sluice.ok_or(EnforceError::TableMissing)?;
    want.compare(&got).map_err(EnforceError::Mismatch)?;
    if host {
        if let Some(other) = listing.foreign.first() {
            return Err(EnforceError::Mismatch(format!(
                "unexpected table {other} in the sandbox namespace"
            )));
        }
    }
    Ok(())
}

/// Packets dropped so far by the table's drop rules in this thread's
/// namespace: one read of its named counters (every drop rule counts into
/// [`DROP_COUNTER`]).
pub fn dropped_packets() -> Result<u64, EnforceError> {
    readback::counted(&list(LIST_COUNTERS)?, DROP_COUNTER)
}

fn validate(spec: &SandboxSpec) -> Result<(), EnforceError> {
    if spec.proxy_port == 0 || spec.dns_port == 0 {
        return Err(EnforceError::InvalidSpec(format!(
            "proxy port {} and dns port {} must both be non-zero",
            spec.proxy_port, spec.dns_port
        )));
    }
    if let Some(tap) = &spec.tap {
        let ok = !tap.is_empty()
            && tap.len() < libc::IFNAMSIZ
            && tap
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            return Err(EnforceError::InvalidSpec(format!(
                "tap name {tap:?} is not a valid interface name (1-15 characters of [A-Za-z0-9._-])"
            )));
        }
    }
    Ok(())
}

/// A batch as the NUL-terminated JSON text libnftables takes.
fn command(batch: &nftables::schema::Nftables<'_>) -> Result<CString, EnforceError> {
    let json = serde_json::to_vec(batch)
        .map_err(|e| EnforceError::Parse(format!("serializing the ruleset: {e}")))?;
    // serde_json escapes NUL inside strings, so JSON text never holds one.
    CString::new(json).map_err(|e| EnforceError::Parse(format!("serializing the ruleset: {e}")))
}

/// Runs one listing command and parses its JSON output.
fn list(command: &CStr) -> Result<Value, EnforceError> {
    let reply = libnft::session(|nft| nft(command))?;
    if !reply.ok {
        return Err(if reply.error.contains("No such file or directory") {
            EnforceError::TableMissing
        } else if is_permission(&reply.error) {
            EnforceError::Permission {
                stderr: reply.error,
            }
        } else {
            EnforceError::List {
                stderr: reply.error,
            }
        });
    }
    serde_json::from_str(&reply.output).map_err(parse_err)
}

fn apply_error(reply: Reply) -> EnforceError {
    if is_permission(&reply.error) {
        EnforceError::Permission {
            stderr: reply.error,
        }
    } else {
        EnforceError::Apply {
            stderr: reply.error,
        }
    }
}

fn is_permission(stderr: &str) -> bool {
    stderr.contains("Operation not permitted")
}

fn parse_err(e: impl std::fmt::Display) -> EnforceError {
    EnforceError::Parse(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_tap_name_is_refused() {
        assert!(validate(&SandboxSpec::tap(1, 2, "tap\"0")).is_err());
        assert!(validate(&SandboxSpec::tap(1, 2, "a-very-long-tap-name")).is_err());
        assert!(validate(&SandboxSpec::tap(1, 2, "tap0")).is_ok());
        assert!(validate(&SandboxSpec::host(0, 2)).is_err());
    }

    #[test]
    fn listing_commands_are_valid_json() {
        for c in [LIST_RULESET, LIST_TABLE, LIST_COUNTERS] {
            let v: Value = serde_json::from_slice(c.to_bytes()).unwrap();
            assert!(v["nftables"][0]["list"].is_object(), "{v}");
        }
    }
}
