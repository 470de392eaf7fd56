//! The host table in nf_tables' terms: its two base chains ([`CHAINS`]),
//! its seven rules ([`rules`], what `ruleset::ruleset` says as JSON), and
//! the requests of the one batch that creates it with its counter
//! ([`batch`]). Pure data, for sending and for the read-back alike. It
//! must never differ from the golden `host.json` (the privileged tests
//! read it back through libnftables), and never merge into a table that
//! is there already: the table is created with `NLM_F_EXCL`.

use super::expr::{
    ct_status_dnat, drop_counter, eq, meta_l4proto, meta_oif, redirect, transport_dport, verdict,
    Expr,
};
use super::wire::Attr;
use super::{
    IPPROTO_TCP, IPPROTO_UDP, LOOPBACK_IFINDEX, NFPROTO_INET, NFTA_CHAIN_HOOK, NFTA_CHAIN_NAME,
    NFTA_CHAIN_POLICY, NFTA_CHAIN_TABLE, NFTA_CHAIN_TYPE, NFTA_COUNTER_BYTES, NFTA_COUNTER_PACKETS,
    NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY, NFTA_LIST_ELEM, NFTA_OBJ_DATA, NFTA_OBJ_NAME,
    NFTA_OBJ_TABLE, NFTA_OBJ_TYPE, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS, NFTA_RULE_TABLE,
    NFTA_TABLE_FLAGS, NFTA_TABLE_NAME, NFT_MSG_NEWCHAIN, NFT_MSG_NEWOBJ, NFT_MSG_NEWRULE,
    NFT_MSG_NEWTABLE, NFT_OBJECT_COUNTER, NF_ACCEPT, NF_DROP, NF_INET_LOCAL_OUT, NLM_F_APPEND,
    NLM_F_CREATE, NLM_F_EXCL,
};
use crate::enforce::ruleset::{
    DROP_COUNTER, FILTER_PRIORITY, NAT_PRIORITY, OUTPUT_FILTER, OUTPUT_NAT, TABLE,
};
use crate::enforce::SandboxSpec;

/// A base chain of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct BaseChain {
    pub(super) name: &'static str,
    pub(super) kind: &'static str,
    pub(super) hook: u32,
    pub(super) priority: i32,
    pub(super) policy: u32,
}

impl std::fmt::Display for BaseChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hook = match self.hook {
            NF_INET_LOCAL_OUT => "output".to_string(),
            n => format!("#{n}"),
        };
        let policy = match self.policy {
            NF_ACCEPT => "accept".to_string(),
            NF_DROP => "drop".to_string(),
            n => format!("#{n}"),
        };
        write!(
            f,
            "type {} hook {hook} priority {}; policy {policy}",
            self.kind, self.priority
        )
    }
}

pub(super) const CHAINS: [BaseChain; 2] = [
    BaseChain {
        name: OUTPUT_NAT,
        kind: "nat",
        hook: NF_INET_LOCAL_OUT,
        priority: NAT_PRIORITY,
        policy: NF_ACCEPT,
    },
    BaseChain {
        name: OUTPUT_FILTER,
        kind: "filter",
        hook: NF_INET_LOCAL_OUT,
        priority: FILTER_PRIORITY,
        policy: NF_DROP,
    },
];

/// The host table's rules, chain by chain, in order: what
/// `ruleset::ruleset` says in nft's terms (its doc comment shows them).
pub(super) fn rules(spec: &SandboxSpec) -> Vec<(&'static str, Vec<Expr>)> {
    let dport_53 = || eq(53u16.to_be_bytes().into());
    let lo = || [meta_oif(), eq(LOOPBACK_IFINDEX.to_ne_bytes().into())];
    let accept = verdict(NF_ACCEPT);
    let to_dns = |proto: u8| {
        let mut r = vec![
            meta_l4proto(),
            eq(vec![proto]),
            transport_dport(),
            dport_53(),
        ];
        r.extend(redirect(spec.dns_port));
        (OUTPUT_NAT, r)
    };
    let (udp_dns, tcp_dns) = (to_dns(IPPROTO_UDP), to_dns(IPPROTO_TCP));
    let mut to_proxy = vec![meta_l4proto(), eq(vec![IPPROTO_TCP])];
    to_proxy.extend(redirect(spec.proxy_port));
    let lo_accept = || {
        let mut r = lo().to_vec();
        r.push(accept.clone());
        r
    };
    let mut dnat_accept = ct_status_dnat().to_vec();
    dnat_accept.push(accept.clone());
    vec![
        udp_dns,
        tcp_dns,
        (OUTPUT_NAT, lo_accept()),
        (OUTPUT_NAT, to_proxy),
        (OUTPUT_FILTER, lo_accept()),
        (OUTPUT_FILTER, dnat_accept),
        (OUTPUT_FILTER, vec![drop_counter(), verdict(NF_DROP)]),
    ]
}

/// One request of a batch or a dump.
pub(super) struct Request {
    pub(super) kind: u16,
    pub(super) flags: u16,
    pub(super) family: u8,
    pub(super) attrs: Vec<(u16, Attr)>,
    /// What it does, for an error message.
    pub(super) what: String,
}

fn table_name() -> (u16, Attr) {
    (NFTA_TABLE_NAME, Attr::Str(TABLE))
}

/// The batch that creates the table in a namespace without one.
pub(super) fn batch(spec: &SandboxSpec) -> Vec<Request> {
    let create = NLM_F_CREATE;
    let mut out = vec![
        Request {
            kind: NFT_MSG_NEWTABLE,
            flags: create | NLM_F_EXCL,
            family: NFPROTO_INET,
            attrs: vec![table_name(), (NFTA_TABLE_FLAGS, Attr::U32(0))],
            what: format!("creating table inet {TABLE}"),
        },
        Request {
            kind: NFT_MSG_NEWOBJ,
            flags: create,
            family: NFPROTO_INET,
            attrs: vec![
                (NFTA_OBJ_TABLE, Attr::Str(TABLE)),
                (NFTA_OBJ_NAME, Attr::Str(DROP_COUNTER)),
                (NFTA_OBJ_TYPE, Attr::U32(NFT_OBJECT_COUNTER)),
                (
                    NFTA_OBJ_DATA,
                    Attr::Nest(vec![
                        (NFTA_COUNTER_BYTES, Attr::U64(0)),
                        (NFTA_COUNTER_PACKETS, Attr::U64(0)),
                    ]),
                ),
            ],
            what: format!("adding counter {DROP_COUNTER}"),
        },
    ];
    for chain in &CHAINS {
        out.push(Request {
            kind: NFT_MSG_NEWCHAIN,
            flags: create,
            family: NFPROTO_INET,
            attrs: vec![
                (NFTA_CHAIN_TABLE, Attr::Str(TABLE)),
                (NFTA_CHAIN_NAME, Attr::Str(chain.name)),
                (
                    NFTA_CHAIN_HOOK,
                    Attr::Nest(vec![
                        (NFTA_HOOK_HOOKNUM, Attr::U32(chain.hook)),
                        (NFTA_HOOK_PRIORITY, Attr::U32(chain.priority as u32)),
                    ]),
                ),
                (NFTA_CHAIN_POLICY, Attr::U32(chain.policy)),
                (NFTA_CHAIN_TYPE, Attr::Str(chain.kind)),
            ],
            what: format!("adding chain {}", chain.name),
        });
    }
    for (i, (chain, exprs)) in rules(spec).into_iter().enumerate() {
        out.push(Request {
            kind: NFT_MSG_NEWRULE,
            flags: create | NLM_F_APPEND,
            family: NFPROTO_INET,
            attrs: vec![
                (NFTA_RULE_TABLE, Attr::Str(TABLE)),
                (NFTA_RULE_CHAIN, Attr::Str(chain)),
                (
                    NFTA_RULE_EXPRESSIONS,
                    Attr::Nest(exprs.iter().map(|e| (NFTA_LIST_ELEM, e.attr())).collect()),
                ),
            ],
            what: format!("adding rule {} to chain {chain}", i + 1),
        });
    }
    out
}
