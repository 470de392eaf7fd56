//! The validated policy's plain data: rules as written (normalized), modes,
//! verdicts and reasons. Nothing here parses or matches (request matching
//! lives in `http`).

use super::http::{self, HttpEntry, Inject, RequestReason};
use ipnet::IpNet;
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// What `mode:` says: enforce blocks would-deny connections, audit only
/// records them. `Policy::decide` answers the same in both modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Enforce,
    Audit,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
        }
    }
}

/// Allow or deny: a rule's action, and a decision's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    Allow,
    Deny,
}

impl Verdict {
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
        }
    }
}

/// Why a decision came out the way it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// An allow rule matched.
    AllowRule,
    /// A deny rule matched (deny rules win over allow rules).
    DenyRule,
    /// No rule matched: the default is deny.
    NoRule,
    /// Only a hosts rule matched, and sluice's DNS never returned this
    /// address for that name.
    HostAddressMismatch,
    /// Only a hosts rule matched, and the address is loopback, private,
    /// link-local or otherwise internal.
    PrivateAddress,
    /// The destination is sluice itself (its sandbox and gateway addresses
    /// or its own endpoints such as /metrics); no policy can allow it.
    /// Decided by the proxy, never by `Policy::decide`.
    InternalAddress,
    /// A cidrs rule matched a destination on sluice's own host (loopback,
    /// unspecified, or an IPv6 form embedding them), and no allow rule
    /// names loopback itself (a prefix inside 127.0.0.0/8, or `::1/128`).
    LoopbackAddress,
    /// The connection's first bytes name a host that cannot be read for
    /// certain (a malformed, split or oversized ClientHello, two Host
    /// headers, a Host that is not a host and port): an origin might read
    /// a name out of them that sluice did not. Decided by the proxy, on
    /// ports where a hosts rule could change the verdict.
    UnreadableName,
}

impl Reason {
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::AllowRule => "allow-rule",
            Reason::DenyRule => "deny-rule",
            Reason::NoRule => "no-rule",
            Reason::HostAddressMismatch => "host-address-mismatch",
            Reason::PrivateAddress => "private-address",
            Reason::InternalAddress => "internal-address",
            Reason::LoopbackAddress => "loopback-address",
            Reason::UnreadableName => "unreadable-name",
        }
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
display_as_str!(Mode, Verdict, Reason);

/// An inclusive port range; a single port has `start == end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRange {
    pub start: u16,
    pub end: u16,
}

impl PortRange {
    pub fn contains(&self, port: u16) -> bool {
        self.start <= port && port <= self.end
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

/// One validated rule, in file order. Hosts are lowercased without a
/// trailing dot (`*.example.com` stays a wildcard); CIDRs are in network
/// form, IPv4-mapped IPv6 networks turned into IPv4; `ports` empty = any.
/// `http` and `inject` are empty unless the rule is an allow rule with
/// `hosts` and no `cidrs` (the validator sees to it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Shared, so that a connection's record can hold it past a reload
    /// without a copy.
    pub name: std::sync::Arc<str>,
    pub action: Verdict,
    pub cidrs: Vec<IpNet>,
    pub hosts: Vec<String>,
    pub ports: Vec<PortRange>,
    /// What requests it admits; empty: every request.
    pub(crate) http: Vec<HttpEntry>,
    /// Headers set from secrets on the requests it admits.
    pub(crate) inject: Vec<Inject>,
}

impl Rule {
    /// True if the rule applies to `port`.
    pub fn covers_port(&self, port: u16) -> bool {
        self.ports.is_empty() || self.ports.iter().any(|r| r.contains(port))
    }

    /// Connections this rule admits are terminated and each request decided.
    pub(crate) fn terminates(&self) -> bool {
        !self.http.is_empty() || !self.inject.is_empty()
    }

    /// One request (method as sent, path WITHOUT the query) under this rule.
    /// With no `http` entries every request is admitted (an inject-only
    /// rule); otherwise some entry must list the method (or `*`) and have a
    /// path pattern that matches. No entry with the method: `Method`;
    /// else `Path`, also for a path sluice refuses to match at all.
    pub(crate) fn admits_request(&self, method: &str, path: &str) -> Result<(), RequestReason> {
        if self.http.is_empty() {
            return Ok(());
        }
        let mut with_method = self.http.iter().filter(|e| e.has_method(method)).peekable();
        if with_method.peek().is_none() {
            return Err(RequestReason::Method);
        }
        // Split and decode the path once for every pattern.
        let Some(segments) = http::segments(path) else {
            return Err(RequestReason::Path);
        };
        if with_method
            .flat_map(|e| &e.paths)
            .any(|p| p.matches_segments(&segments))
        {
            Ok(())
        } else {
            Err(RequestReason::Path)
        }
    }
}

/// The `dns:` section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DnsConfig {
    /// `None`: not given (use the host's resolv.conf). `Some(vec![])`:
    /// answer only from `hosts`.
    pub upstream: Option<Vec<SocketAddr>>,
    /// Static answers; names lowercased without a trailing dot. These names
    /// are pinned: no upstream answer adds an address to them.
    pub hosts: HashMap<String, Vec<IpAddr>>,
    /// What may be forwarded to the upstreams, per sandbox.
    pub(crate) limits: DnsLimits,
}

/// `limits`: bounds on what one connection may hold of sluice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Limits {
    /// How long a request head on a connection whose every request is
    /// checked may take to arrive, from its first byte (the first
    /// request's: from accept). Past it: 408 and an audit record.
    pub(crate) request_head: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            request_head: std::time::Duration::from_secs(10),
        }
    }
}

/// `dns.limits`: bounds on what a sandbox's queries may carry to the
/// upstream resolvers (names answered from `dns.hosts` or refused never
/// leave sluice and are not counted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DnsLimits {
    /// Query types forwarded (RFC 1035 type codes), ascending.
    pub(crate) query_types: Vec<u16>,
    /// Longest name forwarded, in characters without the trailing dot.
    pub(crate) max_name_length: usize,
    /// Queries forwarded per minute (a bucket refilled evenly; a full
    /// minute's worth may come at once).
    pub(crate) queries_per_minute: u32,
    /// Distinct names forwarded within any 60 seconds.
    pub(crate) names_per_minute: u32,
}

impl DnsLimits {
    /// True if queries of type `code` may be forwarded.
    pub(crate) fn forwards_type(&self, code: u16) -> bool {
        self.query_types.binary_search(&code).is_ok()
    }
}

impl Default for DnsLimits {
    /// What ordinary clients need: addresses (A, AAAA), CNAME, and the
    /// HTTPS/SVCB records browsers and newer curl ask for; names up to 128
    /// characters; 6,000 queries and 120 distinct names a minute.
    fn default() -> DnsLimits {
        DnsLimits {
            query_types: DEFAULT_QUERY_TYPES.iter().map(|(_, code)| *code).collect(),
            max_name_length: 128,
            queries_per_minute: 6_000,
            names_per_minute: 120,
        }
    }
}

/// The default `dns.limits.query_types`, ascending by code.
pub(crate) const DEFAULT_QUERY_TYPES: &[(&str, u16)] = &[
    ("A", 1),
    ("CNAME", 5),
    ("AAAA", 28),
    ("SVCB", 64),
    ("HTTPS", 65),
];

/// Query types a policy may name, by mnemonic (any other is written
/// `TYPEnnn`, RFC 3597).
pub(crate) const QUERY_TYPES: &[(&str, u16)] = &[
    ("A", 1),
    ("NS", 2),
    ("CNAME", 5),
    ("SOA", 6),
    ("PTR", 12),
    ("MX", 15),
    ("TXT", 16),
    ("AAAA", 28),
    ("SRV", 33),
    ("NAPTR", 35),
    ("DS", 43),
    ("SSHFP", 44),
    ("RRSIG", 46),
    ("DNSKEY", 48),
    ("TLSA", 52),
    ("SVCB", 64),
    ("HTTPS", 65),
    ("ANY", 255),
    ("CAA", 257),
];
