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

use std::io;
use std::time::Duration;

use netlink_packet_core::{NlaBuffer, NlasIterator};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::ruleset::{
    DROP_COUNTER, FILTER_PRIORITY, NAT_PRIORITY, OUTPUT_FILTER, OUTPUT_NAT, TABLE,
};
use super::{EnforceError, SandboxSpec};

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

/// How long a reply may take before the kernel is deemed silent (it
/// answers in microseconds; this only bounds a wait that should not hang).
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// One netlink attribute's value.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Attr {
    /// Big-endian, as nf_tables' numbers are.
    U32(u32),
    U64(u64),
    /// Sent NUL-terminated.
    Str(&'static str),
    Bytes(Vec<u8>),
    Nest(Vec<(u16, Attr)>),
}

impl Attr {
    fn put(&self, kind: u16, buf: &mut Vec<u8>) {
        let start = buf.len();
        buf.extend_from_slice(&[0; 4]);
        let mut flag = 0;
        match self {
            Attr::U32(v) => buf.extend_from_slice(&v.to_be_bytes()),
            Attr::U64(v) => buf.extend_from_slice(&v.to_be_bytes()),
            Attr::Str(s) => {
                buf.extend_from_slice(s.as_bytes());
                buf.push(0);
            }
            Attr::Bytes(b) => buf.extend_from_slice(b),
            Attr::Nest(children) => {
                flag = NLA_F_NESTED;
                for (k, a) in children {
                    a.put(*k, buf);
                }
            }
        }
        let len = (buf.len() - start) as u16;
        buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        buf[start + 2..start + 4].copy_from_slice(&(kind | flag).to_ne_bytes());
        buf.resize(buf.len().next_multiple_of(4), 0);
    }

    /// Whether `payload`, as the kernel dumped it, says the same.
    fn matches(&self, payload: &[u8]) -> bool {
        match self {
            Attr::U32(v) => payload == v.to_be_bytes(),
            Attr::U64(v) => payload == v.to_be_bytes(),
            Attr::Str(s) => trim_nul(payload) == s.as_bytes(),
            Attr::Bytes(b) => payload == b.as_slice(),
            Attr::Nest(children) => match attrs_of(payload) {
                Some(got) => {
                    got.len() == children.len()
                        && children
                            .iter()
                            .all(|(k, want)| got.iter().any(|(gk, gp)| gk == k && want.matches(gp)))
                }
                None => false,
            },
        }
    }
}

/// One expression of a rule: its name, the attributes sent, and those the
/// kernel fills in from them and dumps too (each must then say this).
#[derive(Clone, Debug)]
struct Expr {
    name: &'static str,
    sent: Vec<(u16, Attr)>,
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

    fn attr(&self) -> Attr {
        Attr::Nest(vec![
            (NFTA_EXPR_NAME, Attr::Str(self.name)),
            (NFTA_EXPR_DATA, Attr::Nest(self.sent.clone())),
        ])
    }

    /// Whether a dumped expression (name, data attributes) is this one:
    /// every attribute sent, with its value; any other only if the kernel
    /// fills it in, with the value it fills in; nothing else.
    fn matches(&self, name: &str, data: &[(u16, &[u8])]) -> bool {
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

fn meta_l4proto() -> Expr {
    meta(16) // NFT_META_L4PROTO
}

fn meta_oif() -> Expr {
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

fn eq(data: Vec<u8>) -> Expr {
    cmp(0, data)
}

/// The destination port of a TCP or UDP header: 2 bytes at offset 2 of the
/// transport header.
fn transport_dport() -> Expr {
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

fn verdict(code: u32) -> Expr {
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
fn redirect(port: u16) -> [Expr; 2] {
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
fn ct_status_dnat() -> [Expr; 3] {
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
fn drop_counter() -> Expr {
    Expr::new(
        "objref",
        vec![
            (1, Attr::U32(NFT_OBJECT_COUNTER)), // NFTA_OBJREF_IMM_TYPE
            (2, Attr::Str(DROP_COUNTER)),       // NFTA_OBJREF_IMM_NAME
        ],
    )
}

/// A base chain of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
struct BaseChain {
    name: &'static str,
    kind: &'static str,
    hook: u32,
    priority: i32,
    policy: u32,
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

const CHAINS: [BaseChain; 2] = [
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
fn rules(spec: &SandboxSpec) -> Vec<(&'static str, Vec<Expr>)> {
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
struct Request {
    kind: u16,
    flags: u16,
    family: u8,
    attrs: Vec<(u16, Attr)>,
    /// What it does, for an error message.
    what: String,
}

fn table_name() -> (u16, Attr) {
    (NFTA_TABLE_NAME, Attr::Str(TABLE))
}

/// The batch that creates the table in a namespace without one.
fn batch(spec: &SandboxSpec) -> Vec<Request> {
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

/// What one dump returned: each object's family and attributes.
type Dumped = Vec<(u8, Vec<u8>)>;

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

/// A read-back difference in sluice's own table.
fn mismatch(what: String) -> EnforceError {
    EnforceError::Mismatch(format!("table inet {TABLE}: {what}"))
}

/// The only table is sluice's, and it is not dormant.
fn check_tables(nfnl: &Nfnl) -> Result<(), EnforceError> {
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
fn check_chains(nfnl: &Nfnl) -> Result<(), EnforceError> {
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
fn check_rules(nfnl: &Nfnl, spec: &SandboxSpec) -> Result<(), EnforceError> {
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
fn check_objects(nfnl: &Nfnl) -> Result<(), EnforceError> {
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
fn check_no_sets(nfnl: &Nfnl) -> Result<(), EnforceError> {
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

/// A NETLINK_NETFILTER socket in the calling thread's namespace.
struct Nfnl {
    socket: Socket,
}

impl Nfnl {
    fn open() -> Result<Nfnl, EnforceError> {
        let fail = EnforceError::Netlink;
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(fail)?;
        socket.bind_auto().map_err(fail)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(fail)?;
        let timeout = nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as _, 0);
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| fail(e.into()))?;
        Ok(Nfnl { socket })
    }

    fn send(&self, buf: &[u8]) -> Result<(), EnforceError> {
        let sent = self.socket.send(buf, 0).map_err(EnforceError::Exchange)?;
        if sent != buf.len() {
            return Err(EnforceError::Exchange(io::Error::other(format!(
                "sent {sent} of {} bytes",
                buf.len()
            ))));
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> Result<usize, EnforceError> {
        match self.socket.recv(&mut &mut buf[..], 0) {
            Ok(n) => Ok(n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(EnforceError::Exchange(io::Error::other(format!(
                    "the kernel did not answer within {} s",
                    REPLY_TIMEOUT.as_secs()
                ))))
            }
            Err(e) => Err(EnforceError::Exchange(e)),
        }
    }

    /// Every object of one kind in the namespace, of every family.
    fn dump(&self, kind: u16, what: &str) -> Result<Dumped, EnforceError> {
        let mut buf = Vec::with_capacity(32);
        let ty = (NFNL_SUBSYS_NFTABLES << 8) | kind;
        message(
            &mut buf,
            ty,
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            NFPROTO_UNSPEC,
            0,
            &[],
        );
        self.send(&buf)?;
        let mut out = Vec::new();
        let mut reply = vec![0u8; 64 * 1024];
        loop {
            let n = self.recv(&mut reply)?;
            for (ty, flags, _seq, payload) in messages(&reply[..n]) {
                if flags & NLM_F_DUMP_INTR != 0 {
                    return Err(EnforceError::Mismatch(format!(
                        "{what} changed while they were read back"
                    )));
                }
                match ty {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let code = payload
                            .get(..4)
                            .map_or(-libc::EIO, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        let err = io::Error::from_raw_os_error(-code);
                        return Err(if code == -libc::EPERM {
                            EnforceError::Permission {
                                stderr: err.to_string(),
                            }
                        } else {
                            EnforceError::List {
                                table: what.to_string(),
                                stderr: err.to_string(),
                            }
                        });
                    }
                    _ if payload.len() >= 4 => out.push((payload[0], payload[4..].to_vec())),
                    _ => {}
                }
            }
        }
    }
}

/// Appends one netlink message: header, nfgenmsg, attributes.
fn message(
    buf: &mut Vec<u8>,
    ty: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
    attrs: &[(u16, Attr)],
) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]); // length, below
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // to the kernel
    buf.extend_from_slice(&[family, 0]); // NFNETLINK_V0
    buf.extend_from_slice(&res_id.to_be_bytes());
    for (k, a) in attrs {
        a.put(*k, buf);
    }
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// The messages in one datagram: (type, flags, sequence number, payload).
fn messages(mut data: &[u8]) -> Vec<(u16, u16, u32, &[u8])> {
    let mut out = Vec::new();
    while data.len() >= 16 {
        let u32_at =
            |i: usize| u32::from_ne_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
        let len = u32_at(0) as usize;
        if len < 16 || len > data.len() {
            break;
        }
        let ty = u16::from_ne_bytes([data[4], data[5]]);
        let flags = u16::from_ne_bytes([data[6], data[7]]);
        out.push((ty, flags, u32_at(8), &data[16..len]));
        data = &data[len.next_multiple_of(4).min(data.len())..];
    }
    out
}

/// The attributes in `payload` as (type without flags, value); `None` if
/// any is malformed.
fn attrs_of(payload: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    NlasIterator::new(payload)
        .map(|nla| {
            let nla: NlaBuffer<&[u8]> = nla.ok()?;
            let (kind, len) = (nla.kind() & NLA_TYPE_MASK, nla.value_length());
            nla.into_inner().get(4..4 + len).map(|value| (kind, value))
        })
        .collect()
}

fn find(payload: &[u8], kind: u16) -> Option<&[u8]> {
    attrs_of(payload)?
        .into_iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| v)
}

fn string(payload: &[u8], kind: u16) -> String {
    find(payload, kind).map_or_else(String::new, |v| {
        String::from_utf8_lossy(trim_nul(v)).into_owned()
    })
}

fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.try_into().ok()?))
}

fn trim_nul(v: &[u8]) -> &[u8] {
    v.strip_suffix(&[0]).unwrap_or(v)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
