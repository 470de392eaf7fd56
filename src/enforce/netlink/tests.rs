//! The encoding without a kernel: the batch's requests, an attribute and
//! an expression written and read back, the ports in the redirects. These
//! need no privilege; applying and reading back against a kernel is the
//! privileged tests' work (tests/), never these.

use super::expr::{redirect, Expr};
use super::table::{batch, rules};
use super::wire::{attrs_of, Attr};
use super::*;
use crate::enforce::SandboxSpec;

#[test]
fn the_batch_is_the_table_its_counter_two_chains_and_seven_rules() {
    let batch = batch(&SandboxSpec::host(15001, 15053));
    let kinds: Vec<u16> = batch.iter().map(|r| r.kind).collect();
    let mut want = vec![
        NFT_MSG_NEWTABLE,
        NFT_MSG_NEWOBJ,
        NFT_MSG_NEWCHAIN,
        NFT_MSG_NEWCHAIN,
    ];
    want.extend([NFT_MSG_NEWRULE; 7]);
    assert_eq!(kinds, want);
    assert_ne!(
        batch[0].flags & NLM_F_EXCL,
        0,
        "the table is created, never merged"
    );
}

#[test]
fn an_attribute_reads_back_as_it_was_written() {
    let attr = Attr::Nest(vec![
        (1, Attr::U32(7)),
        (2, Attr::Str("sluice")),
        (3, Attr::Nest(vec![(1, Attr::Bytes(vec![0x3a, 0x99]))])),
    ]);
    let mut buf = Vec::new();
    attr.put(4, &mut buf);
    assert_eq!(buf.len() % 4, 0);
    let outer = attrs_of(&buf).unwrap();
    assert_eq!(outer.len(), 1);
    assert_eq!(outer[0].0, 4);
    assert!(attr.matches(outer[0].1));
    let other = Attr::Nest(vec![(1, Attr::U32(8))]);
    assert!(!other.matches(outer[0].1));
}

#[test]
fn an_expression_with_an_attribute_it_did_not_send_does_not_match() {
    let [_, redir] = redirect(15001);
    let mut data = Vec::new();
    Attr::U32(REG_1).put(1, &mut data);
    Attr::U32(NF_NAT_RANGE_PROTO_SPECIFIED).put(3, &mut data);
    let parsed = attrs_of(&data).unwrap();
    assert!(redir.matches("redir", &parsed));
    assert!(!redir.matches("masq", &parsed));
    // The range's top, as the kernel fills it in: still the same.
    Attr::U32(REG_1).put(2, &mut data);
    assert!(redir.matches("redir", &attrs_of(&data).unwrap()));
    // Another top register is another rule.
    let mut other = Vec::new();
    Attr::U32(REG_1).put(1, &mut other);
    Attr::U32(NF_NAT_RANGE_PROTO_SPECIFIED).put(3, &mut other);
    Attr::U32(2).put(2, &mut other);
    assert!(!redir.matches("redir", &attrs_of(&other).unwrap()));
}

#[test]
fn the_redirects_carry_the_specs_ports_big_endian() {
    let rules = rules(&SandboxSpec::host(15001, 15053));
    let port_of = |exprs: &[Expr]| {
        exprs.iter().find_map(|e| match (e.name, &e.sent[..]) {
            ("immediate", [(1, Attr::U32(REG_1)), (2, Attr::Nest(v))]) => match &v[..] {
                [(NFTA_DATA_VALUE, Attr::Bytes(b))] => Some(b.clone()),
                _ => None,
            },
            _ => None,
        })
    };
    assert_eq!(port_of(&rules[0].1), Some(15053u16.to_be_bytes().to_vec()));
    assert_eq!(port_of(&rules[3].1), Some(15001u16.to_be_bytes().to_vec()));
}
