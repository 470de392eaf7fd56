//! The chains of a [`TapFence`]'s `inet sluice-TAP`, on what came
//! through the layer-2 chain: the guest's TCP to the proxy and its DNS to
//! the resolver (DNAT to the gateway's address), its DHCP and neighbour
//! discovery let through, everything else from or to the tap counted and
//! dropped on prerouting, input and forward; and, in the VMM's own
//! namespace, its output confined as a host sandbox's. It must never let
//! the guest's traffic leave the namespace other than through sluice's
//! sockets, nor let the namespace's own output out except to sluice and
//! the replies to the guest.

use nftables::expr::{Expression, MetaKey};
use nftables::schema::NfObject;
use nftables::stmt::{NATFamily, Statement, NAT};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use super::{counted, eq, set, udp_ports, DropReason, Rules, TapFence, PREROUTING_FILTER};
use crate::dhcp::{CLIENT_PORT, SERVER_PORT};
use crate::enforce::ruleset::{
    accept, add, base_chain, ct_status_dnat, dport, drop, meta_eq, meta_l4proto, payload, redirect,
    rule_in, FILTER_PRIORITY, FORWARD_FILTER, INPUT_FILTER, NAT_PRIORITY, OUTPUT_FILTER,
    OUTPUT_NAT, PREROUTING_NAT, TCP,
};

/// A base chain: name, type, hook, priority, policy.
type ChainSpec = (&'static str, NfChainType, NfHook, i32, NfChainPolicy);

impl TapFence {
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
    pub(super) fn steering(
        &self,
        proxy_port: u16,
        dns_port: u16,
        out: &mut Vec<NfObject<'static>>,
    ) {
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
