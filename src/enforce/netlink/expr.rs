//! The expressions of the host table's rules, eight kinds, each as it is
//! sent ([`Expr::attr`]) and as it is recognised in the kernel's dump
//! ([`Expr::matches`]): every attribute sent, with its value, and only the
//! attributes the kernel fills in from them besides. Registers and
//! layouts are libnftables' own, so that libnftables decodes them as the
//! golden table. It must never accept a dumped expression with an
//! attribute it did not send or expect filled in.

use super::wire::Attr;
use super::{
    IPS_DST_NAT, NFTA_DATA_VALUE, NFTA_DATA_VERDICT, NFTA_EXPR_DATA, NFTA_EXPR_NAME,
    NFTA_VERDICT_CODE, NFT_OBJECT_COUNTER, NF_NAT_RANGE_PROTO_SPECIFIED, REG_1, REG_VERDICT,
};
use crate::enforce::ruleset::DROP_COUNTER;

/// One expression of a rule: its name, the attributes sent, and those the
/// kernel fills in from them and dumps too (each must then say this).
#[derive(Clone, Debug)]
pub(super) struct Expr {
    pub(super) name: &'static str,
    pub(super) sent: Vec<(u16, Attr)>,
    filled: Vec<(u16, Attr)>,
}

impl Expr {
    fn new(name: &'static str, sent: Vec<(u16, Attr)>) -> Expr {
        Expr {
            name,
            sent,
            filled: Vec::new(),
        }
    }

    pub(super) fn attr(&self) -> Attr {
        Attr::Nest(vec![
            (NFTA_EXPR_NAME, Attr::Str(self.name)),
            (NFTA_EXPR_DATA, Attr::Nest(self.sent.clone())),
        ])
    }

    /// Whether a dumped expression (name, data attributes) is this one:
    /// every attribute sent, with its value; any other only if the kernel
    /// fills it in, with the value it fills in; nothing else.
    pub(super) fn matches(&self, name: &str, data: &[(u16, &[u8])]) -> bool {
        name == self.name
            && self
                .sent
                .iter()
                .all(|(k, want)| data.iter().any(|(dk, dp)| dk == k && want.matches(dp)))
            && data.iter().all(|(dk, dp)| {
                self.sent.iter().any(|(k, _)| k == dk)
                    || self
                        .filled
                        .iter()
                        .any(|(k, want)| k == dk && want.matches(dp))
            })
    }
}

fn meta(key: u32) -> Expr {
    // NFTA_META_DREG, NFTA_META_KEY
    Expr::new("meta", vec![(1, Attr::U32(REG_1)), (2, Attr::U32(key))])
}

pub(super) fn meta_l4proto() -> Expr {
    meta(16) // NFT_META_L4PROTO
}

pub(super) fn meta_oif() -> Expr {
    meta(5) // NFT_META_OIF
}

/// `cmp` of register 1 with `data` (NFT_CMP_EQ 0, NFT_CMP_NEQ 1).
fn cmp(op: u32, data: Vec<u8>) -> Expr {
    Expr::new(
        "cmp",
        vec![
            (1, Attr::U32(REG_1)), // NFTA_CMP_SREG
            (2, Attr::U32(op)),    // NFTA_CMP_OP
            (3, Attr::Nest(vec![(NFTA_DATA_VALUE, Attr::Bytes(data))])),
        ],
    )
}

pub(super) fn eq(data: Vec<u8>) -> Expr {
    cmp(0, data)
}

/// The destination port of a TCP or UDP header: 2 bytes at offset 2 of the
/// transport header.
pub(super) fn transport_dport() -> Expr {
    Expr::new(
        "payload",
        vec![
            (1, Attr::U32(REG_1)), // NFTA_PAYLOAD_DREG
            (2, Attr::U32(2)),     // NFTA_PAYLOAD_BASE: NFT_PAYLOAD_TRANSPORT_HEADER
            (3, Attr::U32(2)),     // NFTA_PAYLOAD_OFFSET
            (4, Attr::U32(2)),     // NFTA_PAYLOAD_LEN
        ],
    )
}

pub(super) fn verdict(code: u32) -> Expr {
    Expr::new(
        "immediate",
        vec![
            (1, Attr::U32(REG_VERDICT)), // NFTA_IMMEDIATE_DREG
            (
                2, // NFTA_IMMEDIATE_DATA
                Attr::Nest(vec![(
                    NFTA_DATA_VERDICT,
                    Attr::Nest(vec![(NFTA_VERDICT_CODE, Attr::U32(code))]),
                )]),
            ),
        ],
    )
}

/// `redirect to :port`: the port into register 1, then `redir`.
pub(super) fn redirect(port: u16) -> [Expr; 2] {
    let load = Expr::new(
        "immediate",
        vec![
            (1, Attr::U32(REG_1)),
            (
                2,
                Attr::Nest(vec![(
                    NFTA_DATA_VALUE,
                    Attr::Bytes(port.to_be_bytes().into()),
                )]),
            ),
        ],
    );
    let mut redir = Expr::new(
        "redir",
        vec![
            (1, Attr::U32(REG_1)),                        // NFTA_REDIR_REG_PROTO_MIN
            (3, Attr::U32(NF_NAT_RANGE_PROTO_SPECIFIED)), // NFTA_REDIR_FLAGS
        ],
    );
    // The kernel takes the range's top from its bottom.
    redir.filled.push((2, Attr::U32(REG_1))); // NFTA_REDIR_REG_PROTO_MAX
    [load, redir]
}

/// `ct status dnat`, tested non-zero: load, mask, compare.
pub(super) fn ct_status_dnat() -> [Expr; 3] {
    let load = Expr::new(
        "ct",
        vec![(1, Attr::U32(REG_1)), (2, Attr::U32(2))], // NFTA_CT_DREG, NFTA_CT_KEY: NFT_CT_STATUS
    );
    let value = |v: u32| Attr::Nest(vec![(NFTA_DATA_VALUE, Attr::Bytes(v.to_ne_bytes().into()))]);
    let mut mask = Expr::new(
        "bitwise",
        vec![
            (1, Attr::U32(REG_1)),   // NFTA_BITWISE_SREG
            (2, Attr::U32(REG_1)),   // NFTA_BITWISE_DREG
            (3, Attr::U32(4)),       // NFTA_BITWISE_LEN
            (4, value(IPS_DST_NAT)), // NFTA_BITWISE_MASK
            (5, value(0)),           // NFTA_BITWISE_XOR
        ],
    );
    mask.filled.push((6, Attr::U32(0))); // NFTA_BITWISE_OP: NFT_BITWISE_BOOL
    [load, mask, cmp(1, vec![0; 4])]
}

/// `counter name "dropped"`.
pub(super) fn drop_counter() -> Expr {
    Expr::new(
        "objref",
        vec![
            (1, Attr::U32(NFT_OBJECT_COUNTER)), // NFTA_OBJREF_IMM_TYPE
            (2, Attr::Str(DROP_COUNTER)),       // NFTA_OBJREF_IMM_NAME
        ],
    )
}
