//! The validated policy's plain data: rules as written (normalized), modes,
//! verdicts and reasons. Nothing here parses or matches.

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
    /// The destination is sluice itself (its sandbox addresses or its own
    /// endpoints such as /metrics); no policy can allow it. Decided by the
    /// proxy, never by `Policy::decide`.
    SluiceInternal,
}

impl Reason {
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::AllowRule => "allow-rule",
            Reason::DenyRule => "deny-rule",
            Reason::NoRule => "no-rule",
            Reason::HostAddressMismatch => "host-address-mismatch",
            Reason::PrivateAddress => "private-address",
            Reason::SluiceInternal => "sluice-internal",
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    pub action: Verdict,
    pub cidrs: Vec<IpNet>,
    pub hosts: Vec<String>,
    pub ports: Vec<PortRange>,
}

impl Rule {
    /// True if the rule applies to `port`.
    pub fn covers_port(&self, port: u16) -> bool {
        self.ports.is_empty() || self.ports.iter().any(|r| r.contains(port))
    }
}

/// The `dns:` section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DnsConfig {
    /// `None`: not given (use the host's resolv.conf). `Some(vec![])`:
    /// answer only from `hosts`.
    pub upstream: Option<Vec<SocketAddr>>,
    /// Static answers; names lowercased without a trailing dot.
    pub hosts: HashMap<String, Vec<IpAddr>>,
}
