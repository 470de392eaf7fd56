//! The read-back of the host table from the kernel's dumps, one check
//! per object kind: the tables, the chains, each chain's rules in order,
//! the named objects, and no set or flowtable. Each compares what the
//! kernel holds with what [`super::table`] sends and names the first
//! difference. None of them changes anything, and none may pass a dump
//! with anything sluice did not send: another table, chain, rule, object,
//! set or flowtable in the namespace is a mismatch.

use super::expr::Expr;
use super::socket::Nfnl;
use super::table::{rules, BaseChain, CHAINS};
use super::wire::{attrs_of, be32, find, string, trim_nul};
use super::{
    NFPROTO_INET, NFTA_CHAIN_HOOK, NFTA_CHAIN_NAME, NFTA_CHAIN_POLICY, NFTA_CHAIN_TYPE,
    NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_HOOK_DEV, NFTA_HOOK_DEVS, NFTA_HOOK_HOOKNUM,
    NFTA_HOOK_PRIORITY, NFTA_LIST_ELEM, NFTA_OBJ_NAME, NFTA_OBJ_TYPE, NFTA_RULE_CHAIN,
    NFTA_RULE_EXPRESSIONS, NFTA_SET_NAME, NFTA_SET_TABLE, NFTA_TABLE_FLAGS, NFTA_TABLE_NAME,
    NFT_MSG_GETCHAIN, NFT_MSG_GETFLOWTABLE, NFT_MSG_GETOBJ, NFT_MSG_GETRULE, NFT_MSG_GETSET,
    NFT_MSG_GETTABLE, NFT_OBJECT_COUNTER,
};
use crate::enforce::ruleset::{DROP_COUNTER, TABLE};
use crate::enforce::{EnforceError, SandboxSpec};

/// A read-back difference in sluice's own table.
fn mismatch(what: String) -> EnforceError {
    EnforceError::Mismatch(format!("table inet {TABLE}: {what}"))
}

/// The only table is sluice's, and it is not dormant.
pub(super) fn check_tables(nfnl: &Nfnl) -> Result<(), EnforceError> {
    let tables = nfnl.dump(NFT_MSG_GETTABLE, "the tables")?;
    let mut ours = false;
    for (family, attrs) in &tables {
        let name = string(attrs, NFTA_TABLE_NAME);
        if *family == NFPROTO_INET && name == TABLE {
            // A dormant table (flag 1) keeps its rules but unhooks every
            // chain: all of it would read back the same and enforce nothing.
            let flags = find(attrs, NFTA_TABLE_FLAGS).and_then(be32).unwrap_or(0);
            if flags != 0 {
                return Err(mismatch(format!(
                    "the table has flags {flags:#x} (1 is dormant: no chain hooked), expected none"
                )));
            }
            ours = true;
        } else {
            return Err(EnforceError::Mismatch(format!(
                "unexpected table {} {name} in the sandbox namespace",
                family_name(*family)
            )));
        }
    }
    if !ours {
        return Err(EnforceError::TableMissing(format!("inet {TABLE}")));
    }
    Ok(())
}

/// Every chain of [`CHAINS`] is there as the base chain it should be, and
/// no other.
pub(super) fn check_chains(nfnl: &Nfnl) -> Result<(), EnforceError> {
    let chains = nfnl.dump(NFT_MSG_GETCHAIN, "the chains")?;
    for want in &CHAINS {
        let Some((_, attrs)) = chains
            .iter()
            .find(|(_, a)| string(a, NFTA_CHAIN_NAME) == want.name)
        else {
            return Err(mismatch(format!("chain {} is missing", want.name)));
        };
        let have = base_chain(attrs);
        if have.as_ref() != Some(want) {
            let said = have.map_or("not a base chain on one hook".to_string(), |c| {
                c.to_string()
            });
            return Err(mismatch(format!(
                "chain {} is {said}, expected {want}",
                want.name
            )));
        }
    }
    if let Some((_, attrs)) = chains
        .iter()
        .find(|(_, a)| !CHAINS.iter().any(|c| string(a, NFTA_CHAIN_NAME) == c.name))
    {
        return Err(mismatch(format!(
            "unexpected chain {}",
            string(attrs, NFTA_CHAIN_NAME)
        )));
    }
    Ok(())
}

/// Each chain holds exactly the rules sluice applied for `spec`, in order.
pub(super) fn check_rules(nfnl: &Nfnl, spec: &SandboxSpec) -> Result<(), EnforceError> {
    let dumped = nfnl.dump(NFT_MSG_GETRULE, "the rules")?;
    let want = rules(spec);
    for chain in &CHAINS {
        let want: Vec<&Vec<Expr>> = want
            .iter()
            .filter(|(c, _)| *c == chain.name)
            .map(|(_, e)| e)
            .collect();
        let have: Vec<&Vec<u8>> = dumped
            .iter()
            .filter(|(_, a)| string(a, NFTA_RULE_CHAIN) == chain.name)
            .map(|(_, a)| a)
            .collect();
        if have.len() != want.len() {
            return Err(mismatch(format!(
                "chain {} has {} rules, expected {}",
                chain.name,
                have.len(),
                want.len()
            )));
        }
        for (i, (w, h)) in want.iter().zip(&have).enumerate() {
            if !rule_matches(w, h) {
                return Err(mismatch(format!(
                    "chain {} rule {} is not the rule sluice applied",
                    chain.name,
                    i + 1
                )));
            }
        }
    }
    Ok(())
}

/// The drop counter is there, and no other named object.
pub(super) fn check_objects(nfnl: &Nfnl) -> Result<(), EnforceError> {
    let objects = nfnl.dump(NFT_MSG_GETOBJ, "the named objects")?;
    let is_ours = |a: &[u8]| {
        string(a, NFTA_OBJ_NAME) == DROP_COUNTER
            && find(a, NFTA_OBJ_TYPE).and_then(be32) == Some(NFT_OBJECT_COUNTER)
    };
    if !objects.iter().any(|(_, a)| is_ours(a)) {
        return Err(mismatch(format!("counter {DROP_COUNTER} is missing")));
    }
    if let Some((_, a)) = objects.iter().find(|(_, a)| !is_ours(a)) {
        let kind = match find(a, NFTA_OBJ_TYPE).and_then(be32) {
            Some(NFT_OBJECT_COUNTER) => "counter".to_string(),
            n => format!("object (type {})", n.unwrap_or(0)),
        };
        return Err(mismatch(format!(
            "unexpected {kind} {}",
            string(a, NFTA_OBJ_NAME)
        )));
    }
    Ok(())
}

/// No set and no flowtable, in any table.
pub(super) fn check_no_sets(nfnl: &Nfnl) -> Result<(), EnforceError> {
    for (kind, what) in [(NFT_MSG_GETSET, "set"), (NFT_MSG_GETFLOWTABLE, "flowtable")] {
        if let Some((family, a)) = nfnl.dump(kind, "the sets and flowtables")?.first() {
            return Err(EnforceError::Mismatch(format!(
                "unexpected {what} {} in table {} {}",
                string(a, NFTA_SET_NAME),
                family_name(*family),
                string(a, NFTA_SET_TABLE)
            )));
        }
    }
    Ok(())
}

/// The base chain a dumped chain's attributes describe, if it is one
/// (hooked, with no device).
fn base_chain(attrs: &[u8]) -> Option<BaseChain> {
    let hook = attrs_of(find(attrs, NFTA_CHAIN_HOOK)?)?;
    if hook
        .iter()
        .any(|(k, _)| *k == NFTA_HOOK_DEV || *k == NFTA_HOOK_DEVS)
    {
        return None;
    }
    let get = |k| {
        hook.iter()
            .find(|(hk, _)| *hk == k)
            .and_then(|(_, p)| be32(p))
    };
    let name = CHAINS
        .iter()
        .find(|c| c.name == string(attrs, NFTA_CHAIN_NAME))?
        .name;
    let kind = match trim_nul(find(attrs, NFTA_CHAIN_TYPE)?) {
        b"nat" => "nat",
        b"filter" => "filter",
        _ => "another type",
    };
    Some(BaseChain {
        name,
        kind,
        hook: get(NFTA_HOOK_HOOKNUM)?,
        priority: get(NFTA_HOOK_PRIORITY)? as i32,
        policy: find(attrs, NFTA_CHAIN_POLICY).and_then(be32)?,
    })
}

/// Whether a dumped rule's expressions are `want`, one for one, in order.
fn rule_matches(want: &[Expr], rule: &[u8]) -> bool {
    let Some(list) = find(rule, NFTA_RULE_EXPRESSIONS).and_then(attrs_of) else {
        return false;
    };
    list.len() == want.len()
        && list.iter().zip(want).all(|((k, elem), w)| {
            let Some(expr) = attrs_of(elem) else {
                return false;
            };
            let name = expr
                .iter()
                .find(|(k, _)| *k == NFTA_EXPR_NAME)
                .map(|(_, p)| trim_nul(p));
            let data = expr
                .iter()
                .find(|(k, _)| *k == NFTA_EXPR_DATA)
                .and_then(|(_, p)| attrs_of(p))
                .unwrap_or_default();
            *k == NFTA_LIST_ELEM
                && name.is_some_and(|n| w.matches(&String::from_utf8_lossy(n), &data))
        })
}

fn family_name(family: u8) -> String {
    match family {
        1 => "inet".into(),
        2 => "ip".into(),
        3 => "arp".into(),
        5 => "netdev".into(),
        7 => "bridge".into(),
        10 => "ip6".into(),
        n => format!("family-{n}"),
    }
}
