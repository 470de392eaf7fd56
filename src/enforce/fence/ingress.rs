//! The layer-2 chain of a [`TapFence`], `netdev sluice-TAP`'s `ingress`
//! on the tap's ingress hook: policy drop, then frame by frame only what
//! the guest may send (its MAC, no VLAN tag, ARP with the gateway, its
//! own IPv4 and IPv6 sources, nothing only a router sends), each refusal
//! counted into its [`DropReason`]'s counter. It must never accept a
//! frame from another MAC, with a VLAN tag, or of another ethertype, and
//! never admit an IP source that is not the guest's (the one exception,
//! the unspecified address, only for its DHCP request and its neighbour
//! solicitations before it has an address).

use std::net::{Ipv4Addr, Ipv6Addr};

use nftables::expr::{Expression, NamedExpression, SetItem};
use nftables::schema::{self, NfListObject, NfObject};
use nftables::stmt::{Operator, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use super::{counted, eq, set, string, udp_ports, DropReason, Rules, TapFence, INGRESS};
use crate::dhcp::{CLIENT_PORT, SERVER_PORT};
use crate::enforce::ruleset::{accept, add, drop, matches, payload, rule_in};

/// Before every other ingress hook (tc, other netdev tables).
const INGRESS_PRIORITY: i32 = -500;
/// The DHCPv6 server port: a guest sends nothing from it.
const DHCPV6_SERVER_PORT: u32 = 547;

impl TapFence {
    /// `netdev sluice-TAP`: the layer-2 chain.
    ///
    /// ```text
    /// chain ingress { type filter hook ingress device TAP priority -500; policy drop;
    ///     ether saddr != MAC                       counter dropped-mac drop
    ///     ether type { 8021q, 8021ad }             counter dropped-vlan drop
    ///     arp htype 1 arp ptype ip arp hlen 6 arp plen 4 arp operation { request, reply }
    ///         arp saddr ether MAC arp saddr ip GUEST arp daddr ip GATEWAY accept
    ///     ether type arp                           counter dropped-arp drop
    ///     ip saddr GUEST accept
    ///     ip saddr 0.0.0.0 ip daddr 255.255.255.255 udp sport 68 udp dport 67 accept
    ///     ether type ip                            counter dropped-ipv4-source drop
    ///     icmpv6 type { nd-router-advert, nd-redirect }  counter dropped-ipv6-router drop
    ///     ether type ip6 udp sport 547             counter dropped-ipv6-router drop
    ///     ip6 saddr { GUEST6, LINK-LOCAL, SLAAC } accept   (with IPv6; SLAAC with a /64)
    ///     ip6 saddr :: icmpv6 type nd-neighbor-solicit accept
    ///     ether type ip6                           counter dropped-ipv6-source drop
    ///     counter dropped-ethertype drop }
    /// ```
    ///
    /// The ARP, IPv4 and ICMPv6 matches carry their ethertype as the
    /// implicit dependency nft adds (and leaves out of its listing, so it is
    /// left out here too for the read-back to compare equal). A VLAN tag the
    /// kernel moved into the packet's metadata is still seen by `ether
    /// type`: nft reads link-layer fields with the tag put back.
    pub(super) fn ingress(&self, out: &mut Vec<NfObject<'static>>) {
        let table = self.table();
        out.push(add(NfListObject::Chain(schema::Chain {
            family: NfFamily::NetDev,
            table: table.clone().into(),
            name: INGRESS.into(),
            _type: Some(NfChainType::Filter),
            hook: Some(NfHook::Ingress),
            prio: Some(INGRESS_PRIORITY),
            dev: Some(self.name.clone().into()),
            policy: Some(NfChainPolicy::Drop),
            ..schema::Chain::default()
        })));
        let rules = [
            self.frame_rules(),
            self.arp_rules(),
            self.ipv4_rules(),
            self.ipv6_rules(),
            vec![count_drop(DropReason::Ethertype)],
        ]
        .concat();
        for stmts in rules {
            out.push(rule_in(NfFamily::NetDev, &table, INGRESS, stmts));
        }
    }

    /// Frames dropped whatever they carry: from another MAC, or VLAN-tagged.
    fn frame_rules(&self) -> Rules {
        vec![
            [
                vec![matches(
                    payload("ether", "saddr"),
                    Operator::NEQ,
                    address(self.guest_mac),
                )],
                count_drop(DropReason::Mac),
            ]
            .concat(),
            [
                vec![eq(payload("ether", "type"), set(&["8021q", "8021ad"]))],
                count_drop(DropReason::Vlan),
            ]
            .concat(),
        ]
    }

    /// ARP: only the guest asking for, or answering, the gateway.
    fn arp_rules(&self) -> Rules {
        vec![
            vec![
                eq(payload("arp", "htype"), Expression::Number(1)),
                eq(payload("arp", "ptype"), string("ip")),
                eq(payload("arp", "hlen"), Expression::Number(6)),
                eq(payload("arp", "plen"), Expression::Number(4)),
                eq(payload("arp", "operation"), set(&["request", "reply"])),
                eq(payload("arp", "saddr ether"), address(self.guest_mac)),
                eq(payload("arp", "saddr ip"), address(self.guest)),
                eq(payload("arp", "daddr ip"), address(self.gateway)),
                accept(),
            ],
            [vec![ether_type("arp")], count_drop(DropReason::Arp)].concat(),
        ]
    }

    /// IPv4: from the guest's address, or its DHCP request before it has one.
    fn ipv4_rules(&self) -> Rules {
        vec![
            vec![eq(payload("ip", "saddr"), address(self.guest)), accept()],
            [
                vec![
                    eq(payload("ip", "saddr"), address(Ipv4Addr::UNSPECIFIED)),
                    eq(payload("ip", "daddr"), address(Ipv4Addr::BROADCAST)),
                ],
                udp_ports(CLIENT_PORT, SERVER_PORT),
                vec![accept()],
            ]
            .concat(),
            [vec![ether_type("ip")], count_drop(DropReason::Ipv4Source)].concat(),
        ]
    }

    /// IPv6: nothing only a router sends; from the guest's addresses (with
    /// IPv6), or its neighbour solicitation before it has one.
    fn ipv6_rules(&self) -> Rules {
        let mut rules = vec![
            [
                vec![eq(
                    payload("icmpv6", "type"),
                    set(&["nd-router-advert", "nd-redirect"]),
                )],
                count_drop(DropReason::Ipv6Router),
            ]
            .concat(),
            [
                vec![
                    ether_type("ip6"),
                    eq(
                        payload("udp", "sport"),
                        Expression::Number(DHCPV6_SERVER_PORT),
                    ),
                ],
                count_drop(DropReason::Ipv6Router),
            ]
            .concat(),
        ];
        if let Some(v6) = self.ipv6 {
            let mut own = vec![v6.guest, self.guest_link_local()];
            own.extend(v6.slaac);
            own.sort();
            own.dedup();
            rules.push(vec![
                eq(
                    payload("ip6", "saddr"),
                    Expression::Named(NamedExpression::Set(
                        own.iter().map(|a| SetItem::Element(address(*a))).collect(),
                    )),
                ),
                accept(),
            ]);
            rules.push(vec![
                eq(payload("ip6", "saddr"), address(Ipv6Addr::UNSPECIFIED)),
                eq(payload("icmpv6", "type"), string("nd-neighbor-solicit")),
                accept(),
            ]);
        }
        rules.push([vec![ether_type("ip6")], count_drop(DropReason::Ipv6Source)].concat());
        rules
    }
}

/// An address (MAC, IPv4 or IPv6) as nft writes it.
fn address(a: impl std::fmt::Display) -> Expression<'static> {
    Expression::String(a.to_string().into())
}

/// `ether type TYPE`
fn ether_type(t: &'static str) -> Statement<'static> {
    eq(payload("ether", "type"), string(t))
}

/// Counts the packet into the reason's counter and drops it.
fn count_drop(reason: DropReason) -> Vec<Statement<'static>> {
    vec![counted(reason), drop()]
}
