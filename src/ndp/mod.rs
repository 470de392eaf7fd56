//! Router advertisements for one microVM guest behind a tap: sluice is the
//! guest's only router, so it answers the guest's router solicitation
//! (ICMPv6 type 133) with a router advertisement that offers its link-local
//! address ([`GATEWAY_LINK_LOCAL`]) as the default router and the guest's
//! /64 for stateless autoconfiguration (SLAAC, RFC 4862). A guest with no
//! IPv6 configuration of its own (a stock cloud image) then forms its
//! address from that prefix and the modified EUI-64 of its MAC, which is
//! the one address outside its fixed one that the fence admits as its
//! source ([`slaac_address`]). No DHCPv6: the kernel does SLAAC by itself,
//! a DHCPv6 client would be one more thing a stock guest must run.
//!
//! This module owns what the advertisement says and the socket it is sent
//! on (`server`). It must never advertise another prefix than the guest's,
//! never set the managed or other-configuration flags (there is no DHCPv6
//! server to ask), and never answer anything but a well-formed router
//! solicitation that arrived on its own tap.
//!
//! The messages are parsed and built with smoltcp's wire types
//! (`smoltcp::wire::NdiscRepr`), the kernel fills in the ICMPv6 checksum
//! (a raw ICMPv6 socket always does) and checks it on what arrives.

mod server;

use std::net::Ipv6Addr;

use ipnet::Ipv6Net;
use smoltcp::wire::{
    Icmpv6Packet, NdiscPrefixInfoFlags, NdiscPrefixInformation, NdiscRepr, NdiscRouterFlags,
    RawHardwareAddress,
};

pub(crate) use server::RouterSocket;
pub(crate) use server::{bind_on_device, serve};

use crate::mac::MacAddr;

/// sluice's link-local address on every tap it fences: the source of its
/// router advertisements and the guest's default router. Link-local
/// addresses are scoped to their link, so every tap can carry the same one.
pub(crate) const GATEWAY_LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// How long the guest keeps sluice as its default router after an
/// advertisement (three times [`UNSOLICITED_INTERVAL`], RFC 4861's default).
pub(crate) const ROUTER_LIFETIME_SECS: u64 = 1800;
/// How long the advertised prefix stays valid, and preferred, after an
/// advertisement.
pub(crate) const PREFIX_VALID_SECS: u64 = 7200;
pub(crate) const PREFIX_PREFERRED_SECS: u64 = 3600;
/// The hop limit the guest is told to use.
const CURRENT_HOP_LIMIT: u8 = 64;
/// Longest message looked at: a solicitation is 8 bytes and its options.
pub(crate) const MAX_MESSAGE: usize = 1280;

/// What one guest is told by its router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GuestRouter {
    /// The guest's address and prefix (the prefix is advertised).
    pub(crate) guest: Ipv6Net,
    /// The guest's MAC.
    pub(crate) guest_mac: MacAddr,
    /// The tap's own MAC (the advertisement's source link-layer option),
    /// when known: the guest then needs no neighbour solicitation for its
    /// router.
    pub(crate) tap_mac: Option<MacAddr>,
}

/// Why a message got no advertisement. Bounded: usable as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ignored {
    /// Longer than [`MAX_MESSAGE`].
    TooLong,
    /// Not a well-formed ICMPv6 neighbour discovery message.
    Malformed,
    /// Another ICMPv6 message (neighbour solicitations and advertisements
    /// reach the same socket; the kernel answers those).
    NotASolicitation,
    /// A solicitation from the unspecified address that carries a source
    /// link-layer option (RFC 4861 6.1.1 says to discard it).
    UnspecifiedWithLinkLayer,
}

impl Ignored {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ignored::TooLong => "too-long",
            Ignored::Malformed => "malformed",
            Ignored::NotASolicitation => "not-a-solicitation",
            Ignored::UnspecifiedWithLinkLayer => "unspecified-with-link-layer",
        }
    }
}

impl GuestRouter {
    /// Whether the guest's prefix can be autoconfigured (SLAAC needs a /64).
    pub(crate) fn autoconfigurable(&self) -> bool {
        self.guest.prefix_len() == 64
    }

    /// Every IPv6 address the guest may use on its tap: its fixed one, its
    /// SLAAC one (with a /64) and its link-local one.
    pub(crate) fn guest_addresses(&self) -> Vec<Ipv6Addr> {
        let mut out = vec![self.guest.addr(), self.guest_mac.link_local()];
        out.extend(slaac_address(self.guest, self.guest_mac));
        out.sort();
        out.dedup();
        out
    }

    /// The router advertisement sent to the guest (an ICMPv6 message, its
    /// checksum left to the kernel): sluice as default router, the guest's
    /// prefix on-link, and autonomous when it is a /64.
    pub(crate) fn advertisement(&self) -> Vec<u8> {
        let mut flags = NdiscPrefixInfoFlags::ON_LINK;
        if self.autoconfigurable() {
            flags |= NdiscPrefixInfoFlags::ADDRCONF;
        }
        let repr = NdiscRepr::RouterAdvert {
            hop_limit: CURRENT_HOP_LIMIT,
            flags: NdiscRouterFlags::empty(),
            router_lifetime: smoltcp::time::Duration::from_secs(ROUTER_LIFETIME_SECS),
            reachable_time: smoltcp::time::Duration::ZERO,
            retrans_time: smoltcp::time::Duration::ZERO,
            lladdr: self
                .tap_mac
                .map(|m| RawHardwareAddress::from_bytes(&m.octets())),
            mtu: None,
            prefix_info: Some(NdiscPrefixInformation {
                prefix_len: self.guest.prefix_len(),
                flags,
                valid_lifetime: smoltcp::time::Duration::from_secs(PREFIX_VALID_SECS),
                preferred_lifetime: smoltcp::time::Duration::from_secs(PREFIX_PREFERRED_SECS),
                prefix: self.guest.trunc().network(),
            }),
        };
        let mut bytes = vec![0u8; repr.buffer_len()];
        repr.emit(&mut Icmpv6Packet::new_unchecked(&mut bytes[..]));
        bytes
    }
}

/// Answer `message` (an ICMPv6 message from `source` that arrived on the
/// guest's tap) with the advertisement, or say why not.
pub(crate) fn respond(
    router: &GuestRouter,
    source: Ipv6Addr,
    message: &[u8],
) -> Result<Vec<u8>, Ignored> {
    if message.len() > MAX_MESSAGE {
        return Err(Ignored::TooLong);
    }
    let packet = Icmpv6Packet::new_checked(message).map_err(|_| Ignored::Malformed)?;
    if packet.msg_type() != smoltcp::wire::Icmpv6Message::RouterSolicit {
        return Err(Ignored::NotASolicitation);
    }
    if packet.msg_code() != 0 {
        return Err(Ignored::Malformed);
    }
    match NdiscRepr::parse(&packet) {
        Ok(NdiscRepr::RouterSolicit { lladdr }) => {
            if source.is_unspecified() && lladdr.is_some() {
                return Err(Ignored::UnspecifiedWithLinkLayer);
            }
            Ok(router.advertisement())
        }
        Ok(_) => Err(Ignored::NotASolicitation),
        Err(_) => Err(Ignored::Malformed),
    }
}

/// The address a guest with `mac` forms in `prefix` (a /64) by SLAAC with
/// the kernel's default interface identifier (the modified EUI-64 of its
/// MAC, RFC 4291 appendix A); `None` for a prefix that is not a /64.
pub(crate) fn slaac_address(prefix: Ipv6Net, mac: MacAddr) -> Option<Ipv6Addr> {
    if prefix.prefix_len() != 64 {
        return None;
    }
    let network = u128::from(prefix.trunc().network());
    let interface = u128::from(mac.link_local()) & u128::from(u64::MAX);
    Some(Ipv6Addr::from(network | interface))
}

#[cfg(test)]
mod tests;
