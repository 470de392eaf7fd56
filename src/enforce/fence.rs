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

use std::borrow::Cow;
use std::net::{Ipv4Addr, Ipv6Addr};

use nftables::expr::{Expression, MetaKey, NamedExpression, SetItem};
use nftables::schema::{self, NfListObject, NfObject};
use nftables::stmt::{Counter, NATFamily, Operator, Statement, NAT};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use super::ruleset::{
    accept, add, base_chain, ct_status_dnat, dport, drop, matches, meta_eq, meta_l4proto, payload,
    redirect, rule_in, FILTER_PRIORITY, FORWARD_FILTER, INPUT_FILTER, NAT_PRIORITY, OUTPUT_FILTER,
    OUTPUT_NAT, PREROUTING_NAT, TCP,
};
use crate::dhcp::{CLIENT_PORT, SERVER_PORT};
use crate::mac::MacAddr;

/// Tap mode: the layer-2 chain on the tap's ingress hook.
pub const INGRESS: &str = "ingress";
/// Tap mode: filter chain on prerouting, after the redirects.
pub const PREROUTING_FILTER: &str = "prerouting_filter";
/// Before every other ingress hook (tc, other netdev tables).
const INGRESS_PRIORITY: i32 = -500;
/// The DHCPv6 server port: a guest sends nothing from it.
const DHCPV6_SERVER_PORT: u32 = 547;

/// The rules of one chain, in order.
type Rules = Vec<Vec<Statement<'static>>>;
/// A base chain: name, type, hook, priority, policy.
type ChainSpec = (&'static str, NfChainType, NfHook, i32, NfChainPolicy);

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
    pub slaac: Option<Ipv6Addr>,
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
    pub fn of_counter(name: &str) -> Option<DropReason> {
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
    pub fn reasons(&self) -> Vec<DropReason> {
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
    fn ingress(&self, out: &mut Vec<NfObject<'static>>) {
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

    /// `inet sluice-TAP`: what came through the layer-2 chain.
    ///
    /// ```text
    /// chain prerouting_nat    { type nat hook prerouting priority -100; policy accept;
    ///     iifname TAP meta nfproto ipv4 udp dport 53 dnat ip to GATEWAY:DNS
    ///     iifname TAP meta nfproto ipv4 tcp dport 53 dnat ip to GATEWAY:DNS
    ///     iifname TAP meta nfproto ipv4 meta l4proto tcp dnat ip to GATEWAY:PROXY
    ///     (the same three for ipv6 to [GATEWAY6], with IPv6) }
    /// chain prerouting_filter { type filter hook prerouting priority 0; policy accept;
    ///     iifname TAP ct status dnat accept
    ///     iifname TAP udp sport 68 udp dport 67 accept
    ///     iifname TAP icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept
    ///     iifname TAP counter dropped-not-redirected drop }
    /// chain input_filter      { type filter hook input priority 0; policy accept;
    ///     iifname TAP tcp dport PROXY accept
    ///     iifname TAP tcp dport DNS accept
    ///     iifname TAP udp dport DNS accept
    ///     iifname TAP udp dport 67 accept
    ///     iifname TAP icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept
    ///     iifname TAP counter dropped-input drop }
    /// chain forward_filter    { type filter hook forward priority 0; policy accept;
    ///     iifname TAP counter dropped-forward drop
    ///     oifname TAP counter dropped-forward drop }
    /// ```
    ///
    /// The guest's router solicitations reach sluice's router advertisement
    /// socket (`ndp`); its neighbour discovery reaches the kernel's.
    ///
    /// And, in the VMM's own namespace, its output as a host sandbox's
    /// (everything to sluice, the rest dropped), with the replies to the
    /// guest that are not answers on a redirected connection let out
    /// (DHCP, router advertisements, neighbour discovery):
    ///
    /// ```text
    /// chain output_nat    { type nat hook output priority -100; policy accept;
    ///     udp dport 53 redirect to :DNS
    ///     tcp dport 53 redirect to :DNS
    ///     oif "lo" accept
    ///     meta l4proto tcp redirect to :PROXY }
    /// chain output_filter { type filter hook output priority 0; policy drop;
    ///     oif "lo" accept
    ///     ct status dnat accept
    ///     oifname TAP udp sport 67 udp dport 68 accept
    ///     oifname TAP icmpv6 type { nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert } accept
    ///     counter dropped-output drop }
    /// ```
    fn steering(&self, proxy_port: u16, dns_port: u16, out: &mut Vec<NfObject<'static>>) {
        let table = self.table();
        for (name, kind, hook, prio, policy) in self.steering_chains() {
            out.push(add(base_chain(
                NfFamily::INet,
                &table,
                name,
                kind,
                hook,
                prio,
                policy,
            )));
        }
        let mut chains = vec![
            (PREROUTING_NAT, self.prerouting_nat(proxy_port, dns_port)),
            (PREROUTING_FILTER, self.prerouting_filter()),
            (INPUT_FILTER, self.input_filter(proxy_port, dns_port)),
            (FORWARD_FILTER, self.forward_filter()),
        ];
        if self.dedicated {
            chains.push((OUTPUT_NAT, output_nat(proxy_port, dns_port)));
            chains.push((OUTPUT_FILTER, self.output_filter()));
        }
        for (chain, rules) in chains {
            for stmts in rules {
                out.push(rule_in(NfFamily::INet, &table, chain, stmts));
            }
        }
    }

    /// The base chains of `inet sluice-TAP`, the namespace's output's only
    /// in the VMM's own namespace.
    fn steering_chains(&self) -> Vec<ChainSpec> {
        let mut chains = vec![
            (
                PREROUTING_NAT,
                NfChainType::NAT,
                NfHook::Prerouting,
                NAT_PRIORITY,
                NfChainPolicy::Accept,
            ),
            (
                PREROUTING_FILTER,
                NfChainType::Filter,
                NfHook::Prerouting,
                FILTER_PRIORITY,
                NfChainPolicy::Accept,
            ),
            (
                INPUT_FILTER,
                NfChainType::Filter,
                NfHook::Input,
                FILTER_PRIORITY,
                NfChainPolicy::Accept,
            ),
            (
                FORWARD_FILTER,
                NfChainType::Filter,
                NfHook::Forward,
                FILTER_PRIORITY,
                NfChainPolicy::Accept,
            ),
        ];
        if self.dedicated {
            chains.extend([
                (
                    OUTPUT_NAT,
                    NfChainType::NAT,
                    NfHook::Output,
                    NAT_PRIORITY,
                    NfChainPolicy::Accept,
                ),
                (
                    OUTPUT_FILTER,
                    NfChainType::Filter,
                    NfHook::Output,
                    FILTER_PRIORITY,
                    NfChainPolicy::Drop,
                ),
            ]);
        }
        chains
    }

    /// `prerouting_nat`: the guest's DNS and TCP to sluice, DNAT to the
    /// gateway's address of each family the guest has.
    fn prerouting_nat(&self, proxy_port: u16, dns_port: u16) -> Rules {
        let mut targets = vec![("ipv4", NATFamily::IP, self.gateway.to_string())];
        if let Some(v6) = self.ipv6 {
            targets.push(("ipv6", NATFamily::IP6, v6.gateway.to_string()));
        }
        let mut rules = Vec::new();
        for (nfproto, family, gateway) in targets {
            let to = |port: u16| {
                Statement::DNAT(Some(NAT {
                    addr: Some(Expression::String(gateway.clone().into())),
                    family: Some(family),
                    port: Some(Expression::Number(u32::from(port))),
                    flags: None,
                }))
            };
            let v = || meta_eq(MetaKey::Nfproto, nfproto);
            rules.extend([
                vec![self.iifname_tap(), v(), dport("udp", 53), to(dns_port)],
                vec![self.iifname_tap(), v(), dport("tcp", 53), to(dns_port)],
                vec![self.iifname_tap(), v(), meta_l4proto(TCP), to(proxy_port)],
            ]);
        }
        rules
    }

    /// `prerouting_filter`: from the tap, only what was redirected, DHCP and
    /// neighbour discovery.
    fn prerouting_filter(&self) -> Rules {
        vec![
            vec![self.iifname_tap(), ct_status_dnat(), accept()],
            [
                vec![self.iifname_tap()],
                udp_ports(CLIENT_PORT, SERVER_PORT),
                vec![accept()],
            ]
            .concat(),
            vec![self.iifname_tap(), from_guest_nd(), accept()],
            vec![
                self.iifname_tap(),
                counted(DropReason::NotRedirected),
                drop(),
            ],
        ]
    }

    /// `input_filter`: from the tap, only sluice's ports and neighbour
    /// discovery.
    fn input_filter(&self, proxy_port: u16, dns_port: u16) -> Rules {
        vec![
            vec![self.iifname_tap(), dport("tcp", proxy_port), accept()],
            vec![self.iifname_tap(), dport("tcp", dns_port), accept()],
            vec![self.iifname_tap(), dport("udp", dns_port), accept()],
            vec![self.iifname_tap(), dport("udp", SERVER_PORT), accept()],
            vec![self.iifname_tap(), from_guest_nd(), accept()],
            vec![self.iifname_tap(), counted(DropReason::Input), drop()],
        ]
    }

    /// `forward_filter`: nothing routed from or to the tap.
    fn forward_filter(&self) -> Rules {
        vec![
            vec![self.iifname_tap(), counted(DropReason::Forward), drop()],
            vec![self.oifname_tap(), counted(DropReason::Forward), drop()],
        ]
    }

    /// `output_filter`: the namespace's own output, only to sluice and the
    /// replies to the guest.
    fn output_filter(&self) -> Rules {
        vec![
            vec![meta_eq(MetaKey::Oif, "lo"), accept()],
            vec![ct_status_dnat(), accept()],
            [
                vec![self.oifname_tap()],
                udp_ports(SERVER_PORT, CLIENT_PORT),
                vec![accept()],
            ]
            .concat(),
            vec![self.oifname_tap(), to_guest_nd(), accept()],
            vec![counted(DropReason::Output), drop()],
        ]
    }

    /// `iifname TAP`
    fn iifname_tap(&self) -> Statement<'static> {
        meta_eq(MetaKey::Iifname, &self.name)
    }

    /// `oifname TAP`
    fn oifname_tap(&self) -> Statement<'static> {
        meta_eq(MetaKey::Oifname, &self.name)
    }
}

/// `output_nat`: the namespace's own output, as a host sandbox's.
fn output_nat(proxy_port: u16, dns_port: u16) -> Rules {
    vec![
        vec![dport("udp", 53), redirect(dns_port)],
        vec![dport("tcp", 53), redirect(dns_port)],
        vec![meta_eq(MetaKey::Oif, "lo"), accept()],
        vec![meta_l4proto(TCP), redirect(proxy_port)],
    ]
}

/// What the guest sends a router: solicitations for one (sluice's router
/// advertisement socket answers) and neighbour discovery.
fn from_guest_nd() -> Statement<'static> {
    eq(
        payload("icmpv6", "type"),
        set(&[
            "nd-router-solicit",
            "nd-neighbor-solicit",
            "nd-neighbor-advert",
        ]),
    )
}

/// What sluice's side sends the guest.
fn to_guest_nd() -> Statement<'static> {
    eq(
        payload("icmpv6", "type"),
        set(&[
            "nd-router-advert",
            "nd-neighbor-solicit",
            "nd-neighbor-advert",
        ]),
    )
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
mod tests {
    use super::*;

    #[test]
    fn the_link_local_address_is_the_modified_eui64_of_the_mac() {
        let fence = super::super::example_fence("tap0");
        assert_eq!(
            fence.guest_link_local(),
            "fe80::5054:ff:fe5c:2".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn reasons_name_their_counters_and_back() {
        for reason in DropReason::ALL {
            assert_eq!(DropReason::of_counter(&reason.counter()), Some(reason));
        }
        assert_eq!(DropReason::of_counter("dropped"), None);
        assert_eq!(DropReason::of_counter("dropped-nonsense"), None);
    }

    #[test]
    fn only_the_vmms_own_namespace_counts_output() {
        let mut fence = super::super::example_fence("tap0");
        assert!(fence.reasons().contains(&DropReason::Output));
        fence.dedicated = false;
        assert!(!fence.reasons().contains(&DropReason::Output));
    }
}
