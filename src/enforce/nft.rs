//! Apply one batch, read the tables back and compare, count drops, remove a
//! fence, in the calling thread's network namespace: host mode's table over
//! netlink ([`super::netlink`]) where it is created and read back, the rest
//! each one libnftables session ([`super::libnft`]), which opens its
//! netlink socket there. No process is spawned.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};

use serde_json::Value;

use super::fence::DropReason;
use super::libnft::{self, Output, Reply, Run};
use super::netlink::{self, Created};
use super::readback::{self, Listing, Table};
use super::ruleset::{first_ruleset, removal, ruleset, DROP_COUNTER, TABLE};
use super::{EnforceError, SandboxSpec};

/// A namespace that is the sandbox's alone is read in one go: its tables,
/// and whether any other table exists.
const LIST_RULESET: &CStr = cr#"{"nftables":[{"list":{"ruleset":null}}]}"#;

/// Applies [`ruleset`] as one transaction (whole or nothing), replacing any
/// previous tables of the spec in this thread's namespace.
///
/// A namespace without them (every fresh sandbox) gets [`first_ruleset`],
/// which creates them; only if one exists already is the full replacing
/// batch built and sent. Either batch is one transaction.
///
/// Host mode's table is created over netlink ([`netlink::create`]), with
/// no libnftables; libnftables replaces one that exists, and applies a
/// microVM's fence.
pub fn apply(spec: &SandboxSpec) -> Result<(), EnforceError> {
    validate(spec)?;
    if over_netlink(spec) {
        return match netlink::create(spec)? {
            Created::Yes => Ok(()),
            Created::AlreadyThere => libnft::session(|nft| replace_in(nft, spec))?,
        };
    }
    let first = command(&first_ruleset(spec))?;
    libnft::session(|nft| apply_in(nft, spec, &first))?
}

/// Removes the spec's tables from this thread's namespace, in one
/// transaction (`sluice vm detach`): what is not there is no error.
pub fn remove(spec: &SandboxSpec) -> Result<(), EnforceError> {
    validate(spec)?;
    let batch = command(&removal(spec))?;
    let reply = libnft::session(|nft| nft(Output::Json, &batch))?;
    if reply.ok {
        Ok(())
    } else {
        Err(apply_error(reply))
    }
}

/// Reads the spec's tables back and compares chains (type, hook, priority,
/// policy, device), every rule's expressions, in order, and the named
/// counters with what [`ruleset`] builds for `spec`. Handles and counter
/// values are ignored.
///
/// When the namespace belongs to the sandbox alone (host mode, and a VMM's
/// namespace under `sluice vm`), any other table in it is a mismatch too: a
/// foreign chain could, for instance, DNAT traffic past `ct status dnat
/// accept`. (A tap attached in someone else's namespace shares it with their
/// firewall, so there only sluice's own tables are checked.)
///
/// Host mode's table is read from the kernel's netlink dumps
/// ([`netlink::verify`]); a microVM's fence through libnftables.
pub fn verify(spec: &SandboxSpec) -> Result<(), EnforceError> {
    validate(spec)?;
    if over_netlink(spec) {
        return netlink::verify(spec);
    }
    verify_with_libnftables(spec)
}

/// [`verify`] through libnftables whatever the spec: its listing, as JSON,
/// compared with [`ruleset`]'s (the golden files). For host mode this is
/// the reference the netlink encoding is tested against: libnftables must
/// decode what `netlink::create` sent as exactly the golden table.
pub fn verify_with_libnftables(spec: &SandboxSpec) -> Result<(), EnforceError> {
    validate(spec)?;
    let want = wanted(spec)?;
    libnft::session(|nft| verify_in(nft, spec, &want))?
}

/// [`apply`], then [`verify`]: what a sandbox's start does before its
/// workload runs. In host mode, a fresh namespace's whole start is netlink
/// (no libnftables); a microVM's fence is applied and read back in ONE
/// libnftables session (one thread, one context), its first batch built
/// once, as JSON, to serve both: its text is what is applied, and its
/// `add` objects (the same as [`ruleset`]'s, as `ruleset`'s unit tests
/// pin) are what the listing is compared with.
pub fn apply_and_verify(spec: &SandboxSpec) -> Result<(), EnforceError> {
    validate(spec)?;
    if over_netlink(spec) {
        apply(spec)?;
        return netlink::verify(spec);
    }
    let (first, want) = first_batch(spec)?;
    libnft::session(|nft| {
        apply_in(nft, spec, &first)?;
        verify_in(nft, spec, &want)
    })?
}

/// [`apply_and_verify`], started on a thread of its own in the CALLING
/// THREAD's network namespace (a thread starts in its creator's); returns
/// at once, so that the caller can set up the namespace's links meanwhile.
/// Only for a table that names no link but `lo` (which every namespace has
/// from its start): a spec with a tap is refused, as its netdev chain
/// needs the tap to exist.
pub(crate) fn start_apply_and_verify(spec: &SandboxSpec) -> Result<Applying, EnforceError> {
    validate(spec)?;
    if spec.tap.is_some() {
        return Err(EnforceError::InvalidSpec(
            "a tap's table cannot be applied before its links exist".into(),
        ));
    }
    let spec = spec.clone();
    std::thread::Builder::new()
        .name("sluice-nft".into())
        .spawn(move || apply_and_verify(&spec))
        .map(|handle| Applying(Some(handle)))
        .map_err(EnforceError::Thread)
}

/// An [`apply_and_verify`] under way ([`start_apply_and_verify`]). Dropped
/// without [`Applying::wait`], it still waits for it to end.
pub(crate) struct Applying(Option<std::thread::JoinHandle<Result<(), EnforceError>>>);

impl Applying {
    /// Wait for the table to be applied and read back.
    pub(crate) fn wait(mut self) -> Result<(), EnforceError> {
        match self.0.take().map(std::thread::JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => Ok(()),
        }
    }
}

impl Drop for Applying {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            let _ = handle.join();
        }
    }
}

/// The first batch, as the text to apply and the tables its `add` objects
/// make (what the read-back is compared with).
fn first_batch(spec: &SandboxSpec) -> Result<(CString, BTreeMap<String, Table>), EnforceError> {
    let batch = serde_json::to_value(first_ruleset(spec)).map_err(parse_err)?;
    let first = CString::new(batch.to_string()).map_err(parse_err)?;
    Ok((first, Table::from_batch(&batch)?))
}

/// [`apply`]'s work on an open session.
fn apply_in(nft: &mut Run<'_>, spec: &SandboxSpec, first: &CStr) -> Result<(), EnforceError> {
    let reply = nft(Output::Json, first);
    if reply.ok {
        return Ok(());
    }
    // EEXIST from `create table`: the batch was refused whole, and the
    // tables there are replaced whole instead.
    if !reply.error.contains("File exists") {
        return Err(apply_error(reply));
    }
    replace_in(nft, spec)
}

/// Replaces the spec's tables whole, with [`ruleset`]'s batch.
fn replace_in(nft: &mut Run<'_>, spec: &SandboxSpec) -> Result<(), EnforceError> {
    let reply = nft(Output::Json, &command(&ruleset(spec))?);
    if reply.ok {
        Ok(())
    } else {
        Err(apply_error(reply))
    }
}

/// What [`verify`] compares the listing with: [`ruleset`]'s tables.
fn wanted(spec: &SandboxSpec) -> Result<BTreeMap<String, Table>, EnforceError> {
    Table::from_batch(&serde_json::to_value(ruleset(spec)).map_err(parse_err)?)
}

/// [`verify`]'s work on an open session.
fn verify_in(
    nft: &mut Run<'_>,
    spec: &SandboxSpec,
    want: &BTreeMap<String, Table>,
) -> Result<(), EnforceError> {
    let ours: Vec<String> = want.keys().cloned().collect();
    let listing = if spec.owns_namespace() {
        Listing::parse(&list(nft, LIST_RULESET, "the ruleset")?, &ours)?
    } else {
        let mut listing = Listing::default();
        for key in &ours {
            let one = Listing::parse(&list(nft, &list_table(key)?, key)?, &ours)?;
            listing.tables.extend(one.tables);
        }
        listing
    };
    readback::compare_all(want, &listing)?;
    if spec.owns_namespace() {
        if let Some(other) = listing.foreign.first() {
            return Err(EnforceError::Mismatch(format!(
                "unexpected table {other} in the sandbox namespace"
            )));
        }
    }
    verify_devices(nft, want, &listing)
}

/// The devices of netdev chains, where the JSON listing did not say: from
/// nft's text listing of each such chain (`type filter hook ingress device
/// "TAP" priority ...`).
fn verify_devices(
    nft: &mut Run<'_>,
    want: &BTreeMap<String, Table>,
    listed: &Listing,
) -> Result<(), EnforceError> {
    for (key, table) in want {
        let said = listed.tables.get(key).map(|t| &t.devices);
        for (chain, device) in &table.devices {
            if said.is_some_and(|d| d.contains(&(chain.clone(), device.clone()))) {
                continue;
            }
            let (family, name) = key.split_once(' ').unwrap_or_default();
            let command = CString::new(format!("list chain {family} {name} {chain}"))
                .map_err(|e| EnforceError::Parse(e.to_string()))?;
            let reply = nft(Output::Text, &command);
            if !reply.ok {
                return Err(EnforceError::List {
                    table: key.clone(),
                    stderr: reply.error,
                });
            }
            let hook = reply
                .output
                .lines()
                .map(str::trim)
                .find(|l| l.starts_with("type "))
                .unwrap_or_default();
            let expected = format!("device \"{device}\" ");
            if !hook.contains(&expected) {
                return Err(EnforceError::Mismatch(format!(
                    "table {key}: chain {chain} is `{hook}`, expected it on device {device}"
                )));
            }
        }
    }
    Ok(())
}

/// Packets dropped so far by the host table's drop rules in this thread's
/// namespace: one read of its named counters (every drop rule counts into
/// [`DROP_COUNTER`]).
pub fn dropped_packets() -> Result<u64, EnforceError> {
    Ok(drop_counts(&SandboxSpec::host(1, 1))?
        .into_iter()
        .map(|(_, n)| n)
        .sum())
}

/// Packets the spec's drop rules dropped so far in this thread's namespace,
/// per reason (host mode counts everything as [`DropReason::Output`]).
pub fn drop_counts(spec: &SandboxSpec) -> Result<Vec<(DropReason, u64)>, EnforceError> {
    let mut counts: BTreeMap<DropReason, u64> = BTreeMap::new();
    for (family, name) in spec.tables() {
        let key = format!("{family} {name}");
        let command = CString::new(format!(
            r#"{{"nftables":[{{"list":{{"counters":{{"family":"{family}","table":"{name}"}}}}}}]}}"#
        ))
        .map_err(|e| EnforceError::Parse(e.to_string()))?;
        let listed = libnft::session(|nft| list(nft, &command, &key))??;
        for (table, counter, packets) in readback::counters(&listed)? {
            if table != key {
                continue;
            }
            let reason = if name == TABLE && counter == DROP_COUNTER {
                Some(DropReason::Output)
            } else {
                DropReason::of_counter(&counter)
            };
            if let Some(reason) = reason {
                let n = counts.entry(reason).or_default();
                *n = n.saturating_add(packets);
            }
        }
    }
    Ok(counts.into_iter().collect())
}

/// The environment variable that sends host mode's table through
/// libnftables too (`SLUICE_TABLE_VIA=libnftables`), as before sluice
/// encoded it: a way round, should a kernel dump the table in a way the
/// netlink read-back does not know (it then refuses to run, failing
/// closed). Anything else, or nothing, means netlink.
pub(crate) const TABLE_VIA: &str = "SLUICE_TABLE_VIA";

/// Whether `spec`'s table is applied and read back over netlink
/// ([`super::netlink`]): host mode, unless [`TABLE_VIA`] says libnftables.
fn over_netlink(spec: &SandboxSpec) -> bool {
    static VIA_LIBNFTABLES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    spec.tap.is_none()
        && !*VIA_LIBNFTABLES
            .get_or_init(|| std::env::var_os(TABLE_VIA).is_some_and(|v| v == "libnftables"))
}

fn validate(spec: &SandboxSpec) -> Result<(), EnforceError> {
    if spec.proxy_port == 0 || spec.dns_port == 0 {
        return Err(EnforceError::InvalidSpec(format!(
            "proxy port {} and dns port {} must both be non-zero",
            spec.proxy_port, spec.dns_port
        )));
    }
    if let Some(fence) = &spec.tap {
        let tap = &fence.name;
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
        if fence.guest == fence.gateway || fence.ipv6.is_some_and(|v6| v6.guest == v6.gateway) {
            return Err(EnforceError::InvalidSpec(
                "the guest and the gateway must have different addresses".into(),
            ));
        }
    }
    Ok(())
}

/// `{"list":{"table":...}}` for `family name`.
fn list_table(key: &str) -> Result<CString, EnforceError> {
    let (family, name) = key.split_once(' ').unwrap_or_default();
    let doc =
        serde_json::json!({"nftables": [{"list": {"table": {"family": family, "name": name}}}]});
    CString::new(doc.to_string()).map_err(|e| EnforceError::Parse(e.to_string()))
}

/// A batch as the NUL-terminated JSON text libnftables takes.
fn command(batch: &nftables::schema::Nftables<'_>) -> Result<CString, EnforceError> {
    let json = serde_json::to_vec(batch)
        .map_err(|e| EnforceError::Parse(format!("serializing the ruleset: {e}")))?;
    // serde_json escapes NUL inside strings, so JSON text never holds one.
    CString::new(json).map_err(|e| EnforceError::Parse(format!("serializing the ruleset: {e}")))
}

/// Runs one listing command (of `what`) and parses its JSON output.
fn list(nft: &mut Run<'_>, command: &CStr, what: &str) -> Result<Value, EnforceError> {
    let reply = nft(Output::Json, command);
    if !reply.ok {
        return Err(if reply.error.contains("No such file or directory") {
            EnforceError::TableMissing(what.to_string())
        } else if is_permission(&reply.error) {
            EnforceError::Permission {
                stderr: reply.error,
            }
        } else {
            EnforceError::List {
                table: what.to_string(),
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

    fn vm(tap: &str) -> SandboxSpec {
        SandboxSpec::vm(1, 2, crate::enforce::example_fence(tap))
    }

    #[test]
    fn invalid_tap_name_is_refused() {
        assert!(validate(&vm("tap\"0")).is_err());
        assert!(validate(&vm("a-very-long-tap-name")).is_err());
        assert!(validate(&vm("tap0")).is_ok());
        assert!(validate(&SandboxSpec::host(0, 2)).is_err());
    }

    #[test]
    fn a_guest_with_the_gateways_address_is_refused() {
        let mut spec = vm("tap0");
        if let Some(fence) = spec.tap.as_mut() {
            fence.guest = fence.gateway;
        }
        assert!(validate(&spec).is_err());
    }

    #[test]
    fn listing_commands_are_valid_json() {
        let table = list_table("netdev sluice-tap0").unwrap();
        for c in [LIST_RULESET, table.as_c_str()] {
            let v: Value = serde_json::from_slice(c.to_bytes()).unwrap();
            assert!(v["nftables"][0]["list"].is_object(), "{v}");
        }
    }
}
