//! DHCPv4 for one microVM guest behind a tap: sluice is the only other end
//! of the tap, so it answers the guest's DISCOVER and REQUEST with the one
//! lease it was configured with (the guest's address and prefix, router and
//! DNS server = sluice's gateway address on the tap, a lease time). Stock
//! cloud images then come up on the address sluice's rules expect.
//!
//! [`respond`] is pure message handling on the `dhcproto` crate: bytes in,
//! at most one reply out, or the bounded reason it was ignored. It answers
//! only a client request (BOOTREQUEST over Ethernet, not relayed) from the
//! configured MAC, never a reply or any other server's traffic (a guest
//! posing as a DHCP server gets nothing), never a second address; its work
//! per packet is bounded by [`MAX_PACKET`] and it never panics on any input.
//! [`bind_on_device`] makes the server socket (UDP 67, `SO_BINDTODEVICE` to
//! the tap, so a host with many taps answers each one separately, from that
//! tap's own address) and [`serve`] answers on it until aborted, one packet
//! at a time.
//!
//! This module never configures interfaces, addresses or firewall rules and
//! never enters a namespace: the caller creates the socket in the tap's
//! namespace. It trusts no field of a packet: the MAC it matches is the one
//! in the DHCP message, so the tap's layer-2 fence (which admits only the
//! guest's source MAC) is what stops another sender from using it.

mod message;
mod server;
#[cfg(test)]
mod tests;

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::mac::{MacAddr, MacError};

#[cfg(test)]
pub(crate) use message::Reply;
pub(crate) use message::{respond, MAX_PACKET};
#[cfg(test)]
pub(crate) use message::{Ignored, ReplyKind};
pub use server::{bind_on_device, serve};
pub(crate) use server::{CLIENT_PORT, SERVER_PORT};

/// Shortest lease offered: a guest renews at half of it.
pub(crate) const MIN_LEASE_SECS: u32 = 60;

/// The one lease this responder hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestLease {
    mac: MacAddr,
    address: Ipv4Net,
    gateway: Ipv4Addr,
    lease_secs: u32,
}

/// Why a lease or a server socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DhcpError {
    #[error("guest MAC: {0}")]
    Mac(#[from] MacError),
    #[error("the gateway {gateway} is not inside the guest's prefix {address}: use an address of that prefix")]
    GatewayOutsidePrefix { gateway: Ipv4Addr, address: Ipv4Net },
    #[error("the gateway and the guest both have {0}: give them different addresses")]
    GatewayIsGuest(Ipv4Addr),
    #[error("{what} {addr} is the network or broadcast address of {prefix}: use a host address")]
    NotHostAddress {
        what: &'static str,
        addr: Ipv4Addr,
        prefix: Ipv4Net,
    },
    #[error("a lease of {0} s is too short: at least {MIN_LEASE_SECS} s")]
    LeaseTooShort(u32),
    #[error("cannot open the DHCP server socket on {device}: {source}")]
    Bind {
        device: String,
        #[source]
        source: std::io::Error,
    },
}

impl GuestLease {
    /// A lease of `address` (the guest's address and prefix) to `mac`, with
    /// `gateway` as router, DNS server and DHCP server identifier.
    pub fn new(
        mac: MacAddr,
        address: Ipv4Net,
        gateway: Ipv4Addr,
        lease_secs: u32,
    ) -> Result<GuestLease, DhcpError> {
        let mac = mac.check_guest()?;
        if !address.contains(&gateway) {
            return Err(DhcpError::GatewayOutsidePrefix { gateway, address });
        }
        if gateway == address.addr() {
            return Err(DhcpError::GatewayIsGuest(gateway));
        }
        // /31 and /32 have no network or broadcast address (RFC 3021).
        if address.prefix_len() <= 30 {
            let prefix = address.trunc();
            for (what, addr) in [
                ("the guest's address", address.addr()),
                ("the gateway", gateway),
            ] {
                if addr == prefix.network() || addr == prefix.broadcast() {
                    return Err(DhcpError::NotHostAddress { what, addr, prefix });
                }
            }
        }
        if lease_secs < MIN_LEASE_SECS {
            return Err(DhcpError::LeaseTooShort(lease_secs));
        }
        Ok(GuestLease {
            mac,
            address,
            gateway,
            lease_secs,
        })
    }

    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// The guest's address with its prefix length.
    pub fn address(&self) -> Ipv4Net {
        self.address
    }

    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    pub(crate) fn lease_secs(&self) -> u32 {
        self.lease_secs
    }
}
