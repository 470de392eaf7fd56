//! A microVM behind a tap: who the guest is on its tap ([`VmNet`]: the
//! tap, the guest's MAC and addresses, sluice's gateway addresses), and the
//! [`Attachment`] that fences it. `sluice vm` makes the namespace and the
//! tap for its VMM (`dedicated`: the namespace's own output is confined as a
//! host sandbox's, since the VMM needs no network of its own); `sluice vm
//! attach` fences a tap someone else made, in their namespace, and touches
//! nothing there but that tap.
//!
//! Listeners bind to the gateway's addresses (the fence DNATs the guest's
//! TCP and DNS there), so several taps in one namespace each have their
//! own. This module decides addresses and what the guest is told; it never
//! configures interfaces (`netns`) or rules (`enforce`) itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::{Ipv4Net, Ipv6Net};

use super::{Attachment, DNS_PORT, PROXY_PORT};
use crate::dhcp::{DhcpError, GuestLease};
use crate::enforce::{SandboxSpec, TapFence, TapIpv6};
use crate::mac::MacAddr;
use crate::ndp::GuestRouter;
use crate::netns::{LinkAddress, SANDBOX_V4, SANDBOX_V6};
use crate::workload::WorkloadPath;

/// The tap `sluice vm` makes unless told otherwise.
pub(crate) const DEFAULT_TAP: &str = "tap0";
/// The guest's MAC unless told otherwise (QEMU's prefix, locally administered).
pub(crate) const DEFAULT_GUEST_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x5c, 0xfe, 0x02]);
/// The guest's IPv4 address unless told otherwise: a /30 of the benchmark
/// range that neither the test origins (198.18.0.0/24) nor sluice's sandbox
/// link (198.19.255.0/30) use. Its gateway is 198.19.254.1.
pub(crate) const DEFAULT_GUEST_IP: &str = "198.19.254.2/30";
/// The guest's IPv6 address unless told otherwise; its gateway is `::1`.
pub(crate) const DEFAULT_GUEST_IP6: &str = "2001:db8:5c:fffe::2/64";
/// How long a DHCP lease lasts (a guest renews at half of it).
pub(crate) const LEASE_SECS: u32 = 3600;

/// A VM's addressing as it is asked for, by `sluice vm`'s flags (once
/// its defaults are filled in) and by the daemon's attach request (JSON,
/// each field as text, read with the same `FromStr` as the flags): the one
/// front end of [`VmNet::new`], which checks it ([`VmAddressing::net`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmAddressing {
    pub tap: String,
    pub guest_mac: MacAddr,
    /// The guest's IPv4 address with its prefix.
    pub guest_ip: Ipv4Net,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
    /// The guest's IPv6 address with its prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_ip6: Option<Ipv6Net>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway6: Option<Ipv6Addr>,
}

impl VmAddressing {
    /// The checked addressing (see [`VmNet::new`]).
    pub(crate) fn net(&self) -> Result<VmNet, VmNetError> {
        VmNet::new(
            self.tap.clone(),
            self.guest_mac,
            self.guest_ip,
            self.gateway,
            self.guest_ip6,
            self.gateway6,
        )
    }
}

/// Why a VM's addressing was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VmNetError {
    #[error("{what} {addr} is not inside the guest's prefix {prefix}: give a gateway in that prefix (or none, for the first free address)")]
    GatewayOutside {
        what: &'static str,
        addr: IpAddr,
        prefix: String,
    },
    #[error(
        "the guest's prefix {0} has no address left for the gateway: use a prefix of /30 or wider"
    )]
    NoGateway(String),
    #[error("the guest and the gateway both have {0}: give them different addresses")]
    Same(IpAddr),
    #[error("--gateway6 needs --guest-ip6")]
    Gateway6WithoutGuest,
    #[error("the guest's IPv6 prefix {0} is too narrow for a gateway: use /64 to /126")]
    NarrowV6(Ipv6Net),
    #[error(transparent)]
    Lease(#[from] DhcpError),
}

/// Who the guest is on its tap, and sluice's addresses there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VmNet {
    pub(crate) tap: String,
    pub(crate) mac: MacAddr,
    /// The guest's IPv4 address and prefix.
    pub(crate) guest: Ipv4Net,
    /// sluice's IPv4 address on the tap: the guest's router, DNS and DHCP server.
    pub(crate) gateway: Ipv4Addr,
    /// The guest's IPv6 address and prefix, and sluice's IPv6 address.
    pub(crate) ipv6: Option<(Ipv6Net, Ipv6Addr)>,
}

impl VmNet {
    /// Checks the addresses; a missing gateway is the first usable address of
    /// the guest's prefix that is not the guest's.
    pub(crate) fn new(
        tap: String,
        mac: MacAddr,
        guest: Ipv4Net,
        gateway: Option<Ipv4Addr>,
        guest6: Option<Ipv6Net>,
        gateway6: Option<Ipv6Addr>,
    ) -> Result<VmNet, VmNetError> {
        let gateway = match gateway {
            Some(gw) => gw,
            None => guest
                .hosts()
                .find(|a| *a != guest.addr())
                .ok_or_else(|| VmNetError::NoGateway(guest.to_string()))?,
        };
        if !guest.contains(&gateway) {
            return Err(VmNetError::GatewayOutside {
                what: "the gateway",
                addr: gateway.into(),
                prefix: guest.trunc().to_string(),
            });
        }
        // The lease's own checks: a unicast MAC, host addresses, in prefix.
        GuestLease::new(mac, guest, gateway, LEASE_SECS)?;
        let ipv6 = match (guest6, gateway6) {
            (None, None) => None,
            (None, Some(_)) => return Err(VmNetError::Gateway6WithoutGuest),
            (Some(net), gw) => {
                if net.prefix_len() > 126 {
                    return Err(VmNetError::NarrowV6(net));
                }
                let gw = match gw {
                    Some(gw) => gw,
                    None => {
                        let first = Ipv6Addr::from(u128::from(net.network()) + 1);
                        if first == net.addr() {
                            Ipv6Addr::from(u128::from(net.network()) + 2)
                        } else {
                            first
                        }
                    }
                };
                if !net.contains(&gw) {
                    return Err(VmNetError::GatewayOutside {
                        what: "the IPv6 gateway",
                        addr: gw.into(),
                        prefix: net.trunc().to_string(),
                    });
                }
                if gw == net.addr() {
                    return Err(VmNetError::Same(gw.into()));
                }
                Some((net, gw))
            }
        };
        Ok(VmNet {
            tap,
            mac,
            guest,
            gateway,
            ipv6,
        })
    }

    /// The one DHCP lease sluice hands this guest.
    pub(crate) fn lease(&self) -> GuestLease {
        GuestLease::new(self.mac, self.guest, self.gateway, LEASE_SECS)
            .expect("checked in VmNet::new")
    }

    /// The fence of this guest's tap.
    pub(crate) fn fence(&self, dedicated: bool) -> TapFence {
        TapFence {
            name: self.tap.clone(),
            guest_mac: self.mac,
            guest: self.guest.addr(),
            gateway: self.gateway,
            ipv6: self.ipv6.map(|(net, gw)| TapIpv6 {
                guest: net.addr(),
                gateway: gw,
                slaac: crate::ndp::slaac_address(net, self.mac),
            }),
            dedicated,
        }
    }

    /// The gateway addresses the tap carries, with the guest's prefix; with
    /// IPv6 also sluice's link-local address there
    /// ([`crate::ndp::GATEWAY_LINK_LOCAL`]): the source of its router
    /// advertisements and neighbour solicitations (without one the kernel
    /// sends no solicitation to probe the guest, and its entry for the
    /// guest fails).
    pub(crate) fn gateway_addresses(&self) -> Vec<LinkAddress> {
        let mut out: Vec<LinkAddress> = vec![(self.gateway.into(), self.guest.prefix_len())];
        if let Some((net, gw)) = self.ipv6 {
            out.push((IpAddr::from(gw), net.prefix_len()));
            out.push((crate::ndp::GATEWAY_LINK_LOCAL.into(), 64));
        }
        out
    }

    /// What sluice's router advertisements tell this guest, with IPv6.
    pub(crate) fn router(&self) -> Option<GuestRouter> {
        self.ipv6.map(|(net, _)| GuestRouter {
            guest: net,
            guest_mac: self.mac,
            tap_mac: None,
        })
    }

    /// The attachment: the fence, listeners on the gateway's addresses (and,
    /// in the VMM's own namespace, on loopback, where the namespace's own
    /// output is redirected), DHCP and (with IPv6) router advertisements on
    /// the tap, path `vm`.
    pub(crate) fn attachment(&self, dedicated: bool) -> Attachment {
        let mut ips: Vec<IpAddr> = vec![self.gateway.into()];
        ips.extend(self.ipv6.map(|(_, gw)| IpAddr::from(gw)));
        let mut internal = ips.clone();
        if dedicated {
            ips.extend([
                IpAddr::from(Ipv4Addr::LOCALHOST),
                Ipv6Addr::LOCALHOST.into(),
            ]);
            internal.extend([IpAddr::from(SANDBOX_V4), SANDBOX_V6.into()]);
        }
        let on = |port| ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
        Attachment {
            path: WorkloadPath::Vm,
            spec: SandboxSpec::vm(PROXY_PORT, DNS_PORT, self.fence(dedicated)),
            proxy_binds: on(PROXY_PORT),
            dns_binds: on(DNS_PORT),
            internal,
            dhcp: Some((self.tap.clone(), self.lease())),
            router: self.router().map(|r| (self.tap.clone(), r)),
            listeners_per_address: 1,
            listeners_per_socket: 1,
        }
    }

    /// What the VMM's command is told (`sluice vm`): the tap, the MAC its
    /// guest's NIC must have, the guest's addresses and its gateways, and a
    /// ready kernel `ip=` argument for guests whose NIC driver is built in.
    pub(crate) fn environment(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("SLUICE_TAP".to_string(), self.tap.clone()),
            ("SLUICE_GUEST_MAC".into(), self.mac.to_string()),
            ("SLUICE_GUEST_IP".into(), self.guest.to_string()),
            ("SLUICE_GATEWAY".into(), self.gateway.to_string()),
            ("SLUICE_KERNEL_IP_ARG".into(), self.kernel_ip_arg()),
        ];
        if let Some((net, gw)) = self.ipv6 {
            env.push(("SLUICE_GUEST_IP6".into(), net.to_string()));
            env.push(("SLUICE_GATEWAY6".into(), gw.to_string()));
        }
        env
    }

    /// `ip=CLIENT::GATEWAY:NETMASK::eth0:off:DNS` (the kernel's
    /// nfsroot format; DNS is the gateway, where sluice answers).
    pub(crate) fn kernel_ip_arg(&self) -> String {
        format!(
            "ip={}::{}:{}::eth0:off:{}",
            self.guest.addr(),
            self.gateway,
            self.guest.netmask(),
            self.gateway
        )
    }
}

/// `sluice vm detach`: remove the fence of `tap` in `netns` (both of its
/// tables). The tap itself and its addresses are left alone.
pub(crate) fn remove_fence(
    netns: &crate::netns::SandboxNetns,
    tap: &str,
) -> Result<(), super::AttachError> {
    let spec = SandboxSpec::vm(PROXY_PORT, DNS_PORT, crate::enforce::example_fence(tap));
    netns.run_in(move || crate::enforce::remove(&spec))??;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(guest: &str, gateway: Option<&str>) -> Result<VmNet, VmNetError> {
        VmNet::new(
            "tap0".into(),
            DEFAULT_GUEST_MAC,
            guest.parse().unwrap(),
            gateway.map(|g| g.parse().unwrap()),
            Some(DEFAULT_GUEST_IP6.parse().unwrap()),
            None,
        )
    }

    #[test]
    fn the_default_gateway_is_the_first_free_address_of_the_prefix() {
        let n = net(DEFAULT_GUEST_IP, None).unwrap();
        assert_eq!(n.gateway, Ipv4Addr::new(198, 19, 254, 1));
        assert_eq!(
            n.ipv6.unwrap().1,
            "2001:db8:5c:fffe::1".parse::<Ipv6Addr>().unwrap()
        );
        let n = net("198.19.254.1/30", None).unwrap();
        assert_eq!(n.gateway, Ipv4Addr::new(198, 19, 254, 2));
    }

    #[test]
    fn a_gateway_outside_the_prefix_or_on_the_guest_is_refused() {
        assert!(matches!(
            net(DEFAULT_GUEST_IP, Some("198.18.0.1")),
            Err(VmNetError::GatewayOutside { .. })
        ));
        assert!(net(DEFAULT_GUEST_IP, Some("198.19.254.2")).is_err());
        assert!(matches!(
            net("198.19.254.2/32", None),
            Err(VmNetError::NoGateway(_))
        ));
    }

    #[test]
    fn the_environment_names_everything_a_vmm_script_needs() {
        let n = net(DEFAULT_GUEST_IP, None).unwrap();
        let env: std::collections::BTreeMap<_, _> = n.environment().into_iter().collect();
        assert_eq!(env["SLUICE_TAP"], "tap0");
        assert_eq!(env["SLUICE_GUEST_MAC"], "52:54:00:5c:fe:02");
        assert_eq!(env["SLUICE_GUEST_IP"], "198.19.254.2/30");
        assert_eq!(env["SLUICE_GATEWAY"], "198.19.254.1");
        assert_eq!(env["SLUICE_GUEST_IP6"], "2001:db8:5c:fffe::2/64");
        assert_eq!(env["SLUICE_GATEWAY6"], "2001:db8:5c:fffe::1");
        assert_eq!(
            env["SLUICE_KERNEL_IP_ARG"],
            "ip=198.19.254.2::198.19.254.1:255.255.255.252::eth0:off:198.19.254.1"
        );
    }

    #[test]
    fn a_vm_attachment_listens_on_the_gateway_and_on_loopback_only_in_its_own_namespace() {
        let n = net(DEFAULT_GUEST_IP, None).unwrap();
        let own = n.attachment(true);
        assert_eq!(own.path, WorkloadPath::Vm);
        assert_eq!(own.proxy_binds.len(), 4);
        assert!(own.internal.contains(&IpAddr::from(n.gateway)));
        let shared = n.attachment(false);
        assert_eq!(shared.proxy_binds.len(), 2);
        assert!(shared.proxy_binds.iter().all(|b| !b.ip().is_loopback()));
        assert!(!shared.spec.owns_namespace());
        assert!(shared.dhcp.is_some());
    }

    #[test]
    fn the_daemons_text_addressing_reads_back_as_the_flags_give_it() {
        let asked = VmAddressing {
            tap: "tap0".into(),
            guest_mac: DEFAULT_GUEST_MAC,
            guest_ip: DEFAULT_GUEST_IP.parse().unwrap(),
            gateway: None,
            guest_ip6: Some(DEFAULT_GUEST_IP6.parse().unwrap()),
            gateway6: None,
        };
        let text = serde_json::to_string(&asked).unwrap();
        assert_eq!(
            text,
            r#"{"tap":"tap0","guest_mac":"52:54:00:5c:fe:02","guest_ip":"198.19.254.2/30","guest_ip6":"2001:db8:5c:fffe::2/64"}"#
        );
        let read: VmAddressing = serde_json::from_str(&text).unwrap();
        assert_eq!(read, asked);
        assert_eq!(read.net().unwrap().gateway, Ipv4Addr::new(198, 19, 254, 1));
    }

    #[test]
    fn a_bad_mac_in_the_daemons_request_is_refused_with_the_parsers_reason() {
        let err = serde_json::from_str::<VmAddressing>(
            r#"{"tap":"tap0","guest_mac":"52:54:00:5c:fe","guest_ip":"198.19.254.2/30"}"#,
        )
        .unwrap_err()
        .to_string();
        let flag_err = "52:54:00:5c:fe".parse::<MacAddr>().unwrap_err().to_string();
        assert!(err.contains(&flag_err), "{err}");
    }
}
