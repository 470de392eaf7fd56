//! The fence on the host side of a microVM's tap, as data: a [`TapFence`]
//! in, the nftables objects of two tables out. No I/O here; golden tests
//! pin the output (`testdata/vm.json`, `testdata/vm-attach.json`).
//!
//! `netdev sluice-TAP` holds one chain on the tap's ingress hook, before
//! anything else in the kernel sees a frame the guest sent: policy drop,
//! only the guest's MAC, ARP only for the gateway with the guest's own
//! address as sender, IPv4 and IPv6 only from the guest's addresses, no
//! router advertisement, redirect or DHCPv6 server message, no VLAN tag,
//! no other ethertype. Every refusal counts into a named counter of its
//! [`DropReason`]. `inet sluice-TAP` then steers what came through: TCP to
//! the proxy, DNS to the resolver (DNAT to the gateway's address, so that
//! several taps in one namespace never share a listener), and drops the
//! rest on prerouting, input and forward. In the VMM's own namespace
//! (`dedicated`) it confines the namespace's output as a host sandbox's
//! table does, with the replies to the guest (DHCP, neighbour discovery)
//! let out. This module must never admit a frame it cannot attribute to
//! the guest, and never build a chain that lets the guest's traffic leave
//! the namespace other than through sluice's sockets.
//!
//! The pieces: `ingress` builds the layer-2 chain, `steering` the chains
//! of `inet sluice-TAP`; this file holds the fence's types and drop
//! reasons, the two tables and their counters (`TapFence::objects`, which
//! calls both), and the statement helpers both use.

mod ingress;
mod steering;

use std::borrow::Cow;
use std::net::{Ipv4Addr, Ipv6Addr};

use nftables::expr::{Expression, NamedExpression, SetItem};
use nftables::schema::{self, NfListObject, NfObject};
use nftables::stmt::{Counter, Operator, Statement};
use nftables::types::NfFamily;

use super::ruleset::{add, matches, payload};
use crate::mac::MacAddr;

/// Tap mode: the layer-2 chain on the tap's ingress hook.
pub(crate) const INGRESS: &str = "ingress";
/// Tap mode: filter chain on prerouting, after the redirects.
pub(crate) const PREROUTING_FILTER: &str = "prerouting_filter";

/// The rules of one chain, in order.
type Rules = Vec<Vec<Statement<'static>>>;

/// Who sits behind one tap, and what the fence lets it be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TapFence {
    /// The tap's name in the namespace (1-15 of [A-Za-z0-9._-]).
    pub name: String,
    /// The only source MAC a frame from the guest may carry.
    pub guest_mac: MacAddr,
    /// The guest's IPv4 address (its only IPv4 source).
    pub guest: Ipv4Addr,
    /// sluice's address on the tap: the guest's router, DNS and DHCP server.
    pub gateway: Ipv4Addr,
    /// The guest's and the gateway's IPv6 addresses, if it has IPv6.
    pub ipv6: Option<TapIpv6>,
    /// The namespace is the VMM's alone (`sluice vm`): its own output is
    /// confined, and any other table in it is a read-back mismatch. An
    /// attach to someone else's namespace leaves everything but the tap alone.
    pub dedicated: bool,
}

/// The IPv6 side of a [`TapFence`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TapIpv6 {
    pub guest: Ipv6Addr,
    pub gateway: Ipv6Addr,
    /// The address the guest forms by SLAAC from sluice's router
    /// advertisement (its /64 and the modified EUI-64 of its MAC), when its
    /// prefix is a /64: a source the fence admits as the guest's too.
    pub(crate) slaac: Option<Ipv6Addr>,
}

/// Why the fence dropped a packet: the `reason` label of
/// `sluice_dropped_packets_total`, one named counter each. A bounded set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropReason {
    /// A frame whose source MAC is not the guest's.
    Mac,
    /// A VLAN-tagged frame (802.1Q or 802.1ad).
    Vlan,
    /// ARP other than the guest asking for, or answering, the gateway.
    Arp,
    /// IPv4 from an address that is not the guest's.
    Ipv4Source,
    /// A router advertisement, redirect or DHCPv6 server message.
    Ipv6Router,
    /// IPv6 from an address that is not the guest's.
    Ipv6Source,
    /// Any other ethertype.
    Ethertype,
    /// From the tap, neither redirected to sluice, DHCP nor neighbour
    /// discovery: other UDP, ICMP, raw IP, and anything to another VM.
    NotRedirected,
    /// From the tap to a local port other than sluice's.
    Input,
    /// Routed from or to the tap.
    Forward,
    /// Sent by the namespace itself (a host sandbox's workload, a VMM)
    /// other than to sluice.
    Output,
}

impl DropReason {
    pub const ALL: [DropReason; 11] = [
        DropReason::Mac,
        DropReason::Vlan,
        DropReason::Arp,
        DropReason::Ipv4Source,
        DropReason::Ipv6Router,
        DropReason::Ipv6Source,
        DropReason::Ethertype,
        DropReason::NotRedirected,
        DropReason::Input,
        DropReason::Forward,
        DropReason::Output,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Mac => "mac",
            DropReason::Vlan => "vlan",
            DropReason::Arp => "arp",
            DropReason::Ipv4Source => "ipv4-source",
            DropReason::Ipv6Router => "ipv6-router",
            DropReason::Ipv6Source => "ipv6-source",
            DropReason::Ethertype => "ethertype",
            DropReason::NotRedirected => "not-redirected",
            DropReason::Input => "input",
            DropReason::Forward => "forward",
            DropReason::Output => "output",
        }
    }

    /// The named counter of a fence's tables that counts this reason.
    pub fn counter(self) -> String {
        format!("dropped-{}", self.as_str())
    }

    /// The reason a fence counter counts (`dropped-REASON`).
    pub(crate) fn of_counter(name: &str) -> Option<DropReason> {
        let reason = name.strip_prefix("dropped-")?;
        DropReason::ALL.into_iter().find(|r| r.as_str() == reason)
    }

    /// The table family whose counter counts this reason.
    fn family(self) -> NfFamily {
        match self {
            DropReason::Mac
            | DropReason::Vlan
            | DropReason::Arp
            | DropReason::Ipv4Source
            | DropReason::Ipv6Router
            | DropReason::Ipv6Source
            | DropReason::Ethertype => NfFamily::NetDev,
            _ => NfFamily::INet,
        }
    }
}

impl TapFence {
    /// The name of both of the fence's tables (`inet` and `netdev`).
    pub fn table(&self) -> String {
        format!("sluice-{}", self.name)
    }

    /// The guest's link-local address as its kernel makes it by default
    /// (modified EUI-64 of its MAC, RFC 4291).
    pub fn guest_link_local(&self) -> Ipv6Addr {
        self.guest_mac.link_local()
    }

    /// The reasons this fence counts (`Output` only in the VMM's own namespace).
    pub(crate) fn reasons(&self) -> Vec<DropReason> {
        DropReason::ALL
            .into_iter()
            .filter(|r| self.dedicated || *r != DropReason::Output)
            .collect()
    }

    /// Both tables, created (or replaced, when `replace`) in one batch.
    pub(super) fn objects(
        &self,
        proxy_port: u16,
        dns_port: u16,
        replace: bool,
        out: &mut Vec<NfObject<'static>>,
    ) {
        let table = self.table();
        for family in [NfFamily::INet, NfFamily::NetDev] {
            let t = || {
                NfListObject::Table(schema::Table {
                    family,
                    name: table.clone().into(),
                    handle: None,
                })
            };
            if replace {
                out.push(add(t()));
                out.push(NfObject::CmdObject(schema::NfCmd::Delete(t())));
                out.push(add(t()));
            } else {
                out.push(NfObject::CmdObject(schema::NfCmd::Create(t())));
            }
        }
        for reason in self.reasons() {
            out.push(add(NfListObject::Counter(schema::Counter {
                family: reason.family(),
                table: table.clone().into(),
                name: reason.counter().into(),
                handle: None,
                packets: None,
                bytes: None,
            })));
        }
        self.ingress(out);
        self.steering(proxy_port, dns_port, out);
    }
}

/// `udp sport SPORT udp dport DPORT`
fn udp_ports(sport: u16, dport: u16) -> Vec<Statement<'static>> {
    vec![
        eq(
            payload("udp", "sport"),
            Expression::Number(u32::from(sport)),
        ),
        eq(
            payload("udp", "dport"),
            Expression::Number(u32::from(dport)),
        ),
    ]
}

fn eq(left: Expression<'static>, right: Expression<'static>) -> Statement<'static> {
    matches(left, Operator::EQ, right)
}

fn string(s: &'static str) -> Expression<'static> {
    Expression::String(Cow::Borrowed(s))
}

/// An anonymous set of symbolic values, in the order nft lists them
/// (ascending by value: callers give them so).
fn set(items: &[&'static str]) -> Expression<'static> {
    Expression::Named(NamedExpression::Set(
        items.iter().map(|s| SetItem::Element(string(s))).collect(),
    ))
}

fn counted(reason: DropReason) -> Statement<'static> {
    Statement::Counter(Counter::Named(reason.counter().into()))
}

#[cfg(test)]
mod tests;
