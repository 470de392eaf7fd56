//! Host mode's `inet sluice` table over nf_tables netlink, with no
//! libnftables: encoded here, sent as ONE batch (whole or nothing), and read
//! back from the kernel's own dumps before anything runs.
//!
//! Why by hand, beside libnftables: a start of `sluice run` spent about
//! 1.8 ms in libnftables for this table (a context, its caches, parsing and
//! evaluating the JSON, listing it again as JSON: docs/measurements.md,
//! "round nine"), where the kernel's part is about 0.1 ms; and no crate
//! fits (rustables is GPL-3.0 and needs libclang at build time for its
//! bindings; nftnl links libnftnl's C). The table is seven rules of eight
//! expression kinds, so it is written out here as the kernel takes it.
//!
//! This is a second encoding of the table [`super::ruleset`] builds as
//! JSON, so the two are tied by a test, not by trust: the privileged tests
//! apply through here and read back through libnftables
//! (`enforce::verify_with_libnftables`), which must decode exactly the
//! golden `host.json`. The read-back here compares the kernel's dumps
//! with what was sent, attribute by attribute, and refuses any table,
//! chain, rule, object, set or flowtable it did not send.
//!
//! It must never touch anything but `inet sluice`, never apply a partial
//! table (the batch is one transaction and any error aborts all of it),
//! and never report success without every acknowledgement and the
//! read-back. A microVM's fence is not encoded here: it goes through
//! libnftables (see `nft`).
//!
//! The pieces: `wire` is the netlink format (attributes, messages, and
//! reading them back), `socket` the one socket and its dumps, `expr` the
//! expressions as sent and as recognised in a dump, `table` the host
//! table in those expressions (its chains, rules and the batch), `check`
//! the read-back, object kind by object kind. This file holds the kernel's
//! numbers and the two entry points, [`create`] and [`verify`].

mod check;
mod expr;
mod socket;
mod table;
mod wire;

use std::io;

use super::{EnforceError, SandboxSpec};
use check::{check_chains, check_no_sets, check_objects, check_rules, check_tables};
use socket::Nfnl;
use table::batch;
use wire::{message, messages};

// Netlink and nf_tables numbers (linux/netlink.h, linux/netfilter/
// nfnetlink.h, linux/netfilter/nf_tables.h): stable kernel ABI.
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x01;
const NLM_F_ACK: u16 = 0x04;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = !(0x8000 | 0x4000);

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;

const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_NEWOBJ: u16 = 18;
const NFT_MSG_GETOBJ: u16 = 19;
const NFT_MSG_GETFLOWTABLE: u16 = 23;

const NFPROTO_UNSPEC: u8 = 0;
const NFPROTO_INET: u8 = 1;
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NFT_OBJECT_COUNTER: u32 = 1;

// Attribute numbers, per object.
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_HOOK_DEV: u16 = 3;
const NFTA_HOOK_DEVS: u16 = 4;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
/// Sets and flowtables name their table and themselves alike.
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;

/// `NFT_REG_1`, the register libnftables loads into: the read-back through
/// libnftables decodes the same expressions only if they are the same.
const REG_1: u32 = 1;
const REG_VERDICT: u32 = 0;
/// Every network namespace's `lo` (the kernel's LOOPBACK_IFINDEX), what
/// libnftables resolves `oif "lo"` to.
const LOOPBACK_IFINDEX: u32 = 1;
/// `IPS_DST_NAT`, the conntrack status bit of `ct status dnat`.
const IPS_DST_NAT: u32 = 1 << 5;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`: a redirect to a port.
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 1 << 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// What [`create`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Created {
    /// The table is there, as sent, and acknowledged.
    Yes,
    /// A table of that name was there already: nothing was changed.
    AlreadyThere,
}

/// Creates the host table in the calling thread's namespace, in one
/// transaction. Only if a table `inet sluice` exists already is nothing
/// done ([`Created::AlreadyThere`]): replacing it is `nft`'s work.
pub(super) fn create(spec: &SandboxSpec) -> Result<Created, EnforceError> {
    let nfnl = Nfnl::open()?;
    let requests = batch(spec);
    let mut buf = Vec::with_capacity(4096);
    let base = 1;
    message(
        &mut buf,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        base,
        0,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    for (i, r) in requests.iter().enumerate() {
        let ty = (NFNL_SUBSYS_NFTABLES << 8) | r.kind;
        let seq = base + 1 + i as u32;
        message(
            &mut buf,
            ty,
            NLM_F_REQUEST | NLM_F_ACK | r.flags,
            seq,
            r.family,
            0,
            &r.attrs,
        );
    }
    let end = base + 1 + requests.len() as u32;
    message(
        &mut buf,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        end,
        0,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    nfnl.send(&buf)?;

    // Every request is acknowledged, with 0 or its error, only once the
    // transaction is decided; a failed commit is reported first, on the
    // batch's first message. So: all zeros, and nothing else, is success.
    let mut acked = vec![false; requests.len()];
    let mut reply = vec![0u8; 64 * 1024];
    while !acked.iter().all(|a| *a) {
        let n = nfnl.recv(&mut reply)?;
        for (ty, _flags, seq, payload) in messages(&reply[..n]) {
            if ty != NLMSG_ERROR {
                continue;
            }
            let code = payload
                .get(..4)
                .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| apply_error("a truncated acknowledgement".into()))?;
            let index = seq.checked_sub(base + 1).map(|i| i as usize);
            if code == 0 {
                if let Some(a) = index.and_then(|i| acked.get_mut(i)) {
                    *a = true;
                }
                continue;
            }
            let err = io::Error::from_raw_os_error(-code);
            let request = index.and_then(|i| requests.get(i));
            if request.is_some_and(|r| r.kind == NFT_MSG_NEWTABLE)
                && err.kind() == io::ErrorKind::AlreadyExists
            {
                return Ok(Created::AlreadyThere);
            }
            if err.raw_os_error() == Some(libc::EPERM) {
                return Err(EnforceError::Permission {
                    stderr: err.to_string(),
                });
            }
            let what = request.map_or("committing the table", |r| r.what.as_str());
            return Err(apply_error(format!(
                "the kernel refused {what}: {err} (nothing was applied)"
            )));
        }
    }
    Ok(Created::Yes)
}

fn apply_error(stderr: String) -> EnforceError {
    EnforceError::Apply { stderr }
}

/// Reads the calling thread's namespace's whole nf_tables ruleset back and
/// compares it with the host table for `spec`: the one table, its two
/// chains, every rule's expressions in order, its counter, and nothing
/// else (no other table, chain, object, set or flowtable).
pub(super) fn verify(spec: &SandboxSpec) -> Result<(), EnforceError> {
    let nfnl = Nfnl::open()?;
    check_tables(&nfnl)?;
    check_chains(&nfnl)?;
    check_rules(&nfnl, spec)?;
    check_objects(&nfnl)?;
    check_no_sets(&nfnl)
}

#[cfg(test)]
mod tests;
