//! The sandbox namespace's plumbing, over rtnetlink from the calling
//! thread's namespace: `lo` up, the link `sbx0` (an ifb, which leads
//! nowhere, up), the addresses, and the default routes. Also the list of links, for
//! refusing a namespace that has more than `lo`.
//!
//! One NETLINK_ROUTE socket, opened on the calling thread (so it talks to
//! that thread's namespace), one request at a time, each acknowledged before
//! the next: a failure names the step. No `ip` process. This module must
//! never be called from a thread that has not entered the sandbox namespace:
//! it would plumb sluice's own.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REPLACE, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressHeaderFlags, AddressMessage, AddressScope};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use super::{NetnsError, SANDBOX_LINK, SANDBOX_V4, SANDBOX_V4_PREFIX, SANDBOX_V6};

/// Plumbs the calling thread's namespace (see the module header).
pub(super) fn configure() -> Result<(), NetnsError> {
    quiet_ipv6_defaults();
    let mut rtnl = Rtnl::open()?;
    rtnl.set_up("bringing lo up", "lo")?;
    rtnl.add_ifb(SANDBOX_LINK)?;
    let link = rtnl.index_of(SANDBOX_LINK)?;
    let lo = rtnl.index_of("lo")?;
    rtnl.add_address(
        "adding 198.19.255.2/30 to sbx0",
        link,
        SANDBOX_V4.into(),
        SANDBOX_V4_PREFIX,
        AddressScope::Universe,
    )?;
    // On lo, which sends no MLD reports, and without DAD: the address is
    // usable at once and nothing leaves the namespace to probe for it.
    rtnl.add_address(
        "adding 2001:db8:5c:ffff::2/128 to lo",
        lo,
        SANDBOX_V6.into(),
        128,
        AddressScope::Universe,
    )?;
    rtnl.add_default_route("adding the IPv4 default route via sbx0", link, None)?;
    rtnl.add_default_route(
        "adding the IPv6 default route via sbx0",
        link,
        Some(SANDBOX_V6.into()),
    )?;
    Ok(())
}

/// Names of the calling thread's namespace's links.
pub(super) fn names() -> Result<Vec<String>, NetnsError> {
    let mut rtnl = Rtnl::open()?;
    let mut names = Vec::new();
    rtnl.dump(
        "listing the links",
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
        |msg| {
            if let RouteNetlinkMessage::NewLink(link) = msg {
                names.extend(link.attributes.into_iter().find_map(|a| match a {
                    LinkAttribute::IfName(name) => Some(name),
                    _ => None,
                }));
            }
        },
    )?;
    Ok(names)
}

/// Quiet the kernel's own IPv6 chatter (router solicitations, duplicate
/// address detection) on links created from now on in this thread's
/// namespace (a thread opening /proc/sys/net sees its own namespace's), so
/// the drop counter counts what the workload tried, not noise. Best effort:
/// a kernel without these knobs still enforces the same.
fn quiet_ipv6_defaults() {
    for (knob, value) in [
        ("accept_ra", "0"),
        ("router_solicitations", "0"),
        ("accept_dad", "0"),
        ("dad_transmits", "0"),
        // No link-local addresses: nothing here talks to a neighbour.
        ("addr_gen_mode", "1"),
    ] {
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/default/{knob}"), value);
    }
}

/// What [`Rtnl::link`] found out about a link.
pub(super) struct LinkFacts {
    pub(crate) index: u32,
    /// `IFLA_INFO_KIND`: `tun` for a tap (and a tun), `veth`, ...
    pub(crate) kind: Option<String>,
    pub(crate) mac: Option<Vec<u8>>,
}

/// A NETLINK_ROUTE socket in the calling thread's namespace.
pub(super) struct Rtnl {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    pub(super) fn open() -> Result<Rtnl, NetnsError> {
        let fail = |source| NetnsError::Netlink {
            step: "opening a NETLINK_ROUTE socket",
            source,
        };
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(fail)?;
        socket.bind_auto().map_err(fail)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(fail)?;
        Ok(Rtnl {
            socket,
            seq: 0,
            buf: vec![0; 64 * 1024],
        })
    }

    pub(super) fn set_up(&mut self, step: &'static str, name: &str) -> Result<(), NetnsError> {
        let mut link = LinkMessage::default();
        link.header.flags = LinkFlags::Up;
        link.header.change_mask = LinkFlags::Up;
        link.attributes.push(LinkAttribute::IfName(name.into()));
        self.ack(step, RouteNetlinkMessage::SetLink(link), NLM_F_ACK)
    }

    /// An `ifb` link, created up: one device where a veth pair is two, and
    /// it leads nowhere (an ifb drops what is sent to it unless tc
    /// redirected it there from another link of the same namespace). Not a
    /// bridge, although the kernel refuses to move a bridge to another
    /// namespace: a bridge's teardown waits for RCU (`rcu_barrier` in
    /// `br_multicast_dev_del`) with the rtnl lock held, so the kernel's
    /// cleanup of each exited sandbox stalled every network change on the
    /// host, the next sandbox's start among them, by 50 to 100 ms
    /// (docs/measurements.md, "Start and exit: the bridge's teardown").
    /// (These kernels have no `dummy` link type.)
    fn add_ifb(&mut self, name: &str) -> Result<(), NetnsError> {
        let mut link = LinkMessage::default();
        link.header.flags = LinkFlags::Up;
        link.header.change_mask = LinkFlags::Up;
        link.attributes.push(LinkAttribute::IfName(name.into()));
        link.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]));
        self.ack(
            "creating the link sbx0 (an ifb, which leads nowhere)",
            RouteNetlinkMessage::NewLink(link),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    pub(super) fn index_of(&mut self, name: &str) -> Result<u32, NetnsError> {
        let mut query = LinkMessage::default();
        query.attributes.push(LinkAttribute::IfName(name.into()));
        let mut index = None;
        self.exchange(
            "looking up a link's index",
            RouteNetlinkMessage::GetLink(query),
            NLM_F_ACK,
            |msg| {
                if let RouteNetlinkMessage::NewLink(link) = msg {
                    index = Some(link.header.index);
                }
            },
        )?;
        index.ok_or(NetnsError::Netlink {
            step: "looking up a link's index",
            source: io::Error::other(format!("the kernel returned no link named {name}")),
        })
    }

    pub(super) fn add_address(
        &mut self,
        step: &'static str,
        index: u32,
        addr: IpAddr,
        prefix: u8,
        scope: AddressScope,
    ) -> Result<(), NetnsError> {
        let mut msg = AddressMessage::default();
        msg.header.family = family(addr);
        msg.header.prefix_len = prefix;
        msg.header.scope = scope;
        msg.header.index = index;
        if addr.is_ipv6() {
            msg.header.flags = AddressHeaderFlags::Nodad;
        }
        use netlink_packet_route::address::AddressAttribute;
        msg.attributes.push(AddressAttribute::Local(addr));
        msg.attributes.push(AddressAttribute::Address(addr));
        self.ack(
            step,
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// `ip route add 0.0.0.0/0 dev LINK` or `ip route add ::/0 dev LINK src
    /// SRC`: no gateway, so the scope is link (as `ip` sets it).
    fn add_default_route(
        &mut self,
        step: &'static str,
        oif: u32,
        src: Option<IpAddr>,
    ) -> Result<(), NetnsError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = match src {
            Some(src) => family(src),
            None => AddressFamily::Inet,
        };
        msg.header.destination_prefix_length = 0;
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::Boot;
        msg.header.scope = RouteScope::Link;
        msg.header.kind = RouteType::Unicast;
        msg.attributes.push(RouteAttribute::Oif(oif));
        if let Some(src) = src {
            msg.attributes
                .push(RouteAttribute::PrefSource(RouteAddress::from(src)));
        }
        self.ack(
            step,
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// The kind of link `name` is (`tun` for a tap), its index and MAC
    /// address; `None` when there is no such link.
    pub(super) fn link(&mut self, name: &str) -> Result<Option<LinkFacts>, NetnsError> {
        let mut found = None;
        let mut query = LinkMessage::default();
        query.attributes.push(LinkAttribute::IfName(name.into()));
        let asked = self.exchange(
            "looking up a link",
            RouteNetlinkMessage::GetLink(query),
            NLM_F_ACK,
            |msg| {
                if let RouteNetlinkMessage::NewLink(link) = msg {
                    let mut facts = LinkFacts {
                        index: link.header.index,
                        kind: None,
                        mac: None,
                    };
                    for attribute in link.attributes {
                        match attribute {
                            LinkAttribute::LinkInfo(info) => {
                                facts.kind = info.into_iter().find_map(|i| match i {
                                    LinkInfo::Kind(kind) => Some(kind.to_string()),
                                    _ => None,
                                });
                            }
                            LinkAttribute::Address(mac) => facts.mac = Some(mac),
                            _ => {}
                        }
                    }
                    found = Some(facts);
                }
            },
        );
        match asked {
            Ok(()) => Ok(found),
            Err(NetnsError::Netlink { source, .. })
                if source.raw_os_error() == Some(libc::ENODEV) =>
            {
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// The addresses on link `index`, with their prefix lengths.
    pub(super) fn addresses(&mut self, index: u32) -> Result<Vec<(IpAddr, u8)>, NetnsError> {
        use netlink_packet_route::address::AddressAttribute;
        let mut out = Vec::new();
        self.dump(
            "listing addresses",
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            |msg| {
                if let RouteNetlinkMessage::NewAddress(addr) = msg {
                    if addr.header.index != index {
                        return;
                    }
                    let prefix = addr.header.prefix_len;
                    out.extend(addr.attributes.into_iter().find_map(|a| match a {
                        AddressAttribute::Local(ip) => Some((ip, prefix)),
                        AddressAttribute::Address(ip) if ip.is_ipv6() => Some((ip, prefix)),
                        _ => None,
                    }));
                }
            },
        )?;
        out.dedup();
        Ok(out)
    }

    /// `ip neigh replace ADDR lladdr MAC dev INDEX nud permanent`: the
    /// kernel reaches `addr` at `mac` with no neighbour discovery, and no
    /// timer ever makes the entry stale or failed.
    pub(super) fn pin_neighbour(
        &mut self,
        index: u32,
        addr: IpAddr,
        mac: crate::mac::MacAddr,
    ) -> Result<(), NetnsError> {
        use netlink_packet_route::neighbour::{
            NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
        };
        let mut msg = NeighbourMessage::default();
        msg.header.family = family(addr);
        msg.header.ifindex = index;
        msg.header.state = NeighbourState::Permanent;
        msg.attributes
            .push(NeighbourAttribute::Destination(match addr {
                IpAddr::V4(a) => NeighbourAddress::Inet(a),
                IpAddr::V6(a) => NeighbourAddress::Inet6(a),
            }));
        msg.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.octets().to_vec()));
        self.ack(
            "pinning the guest's neighbour entry on the tap",
            RouteNetlinkMessage::NewNeighbour(msg),
            NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        )
    }

    /// Removes `addr/prefix` from link `index`.
    pub(super) fn del_address(
        &mut self,
        step: &'static str,
        index: u32,
        addr: IpAddr,
        prefix: u8,
    ) -> Result<(), NetnsError> {
        use netlink_packet_route::address::AddressAttribute;
        let mut msg = AddressMessage::default();
        msg.header.family = family(addr);
        msg.header.prefix_len = prefix;
        msg.header.index = index;
        msg.attributes.push(AddressAttribute::Local(addr));
        msg.attributes.push(AddressAttribute::Address(addr));
        self.ack(step, RouteNetlinkMessage::DelAddress(msg), NLM_F_ACK)
    }

    fn ack(
        &mut self,
        step: &'static str,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> Result<(), NetnsError> {
        self.exchange(step, msg, flags, |_| {})
    }

    fn dump(
        &mut self,
        step: &'static str,
        msg: RouteNetlinkMessage,
        each: impl FnMut(RouteNetlinkMessage),
    ) -> Result<(), NetnsError> {
        self.exchange(step, msg, NLM_F_DUMP, each)
    }

    /// Sends one request and reads until its acknowledgement (or the end of
    /// a dump), handing every message that answers it to `each`.
    fn exchange(
        &mut self,
        step: &'static str,
        msg: RouteNetlinkMessage,
        flags: u16,
        mut each: impl FnMut(RouteNetlinkMessage),
    ) -> Result<(), NetnsError> {
        let fail = |source| NetnsError::Netlink { step, source };
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut out = vec![0; packet.buffer_len()];
        packet.serialize(&mut out);
        self.socket.send(&out, 0).map_err(fail)?;
        loop {
            let n = self.socket.recv(&mut &mut self.buf[..], 0).map_err(fail)?;
            let mut at = 0;
            while at < n {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[at..n])
                    .map_err(|e| fail(io::Error::new(io::ErrorKind::InvalidData, e.to_string())))?;
                let len = reply.header.length as usize;
                if len == 0 {
                    break;
                }
                at += len;
                if reply.header.sequence_number != self.seq {
                    continue; // not ours (a late answer to an earlier request)
                }
                match reply.payload {
                    NetlinkPayload::Error(err) => {
                        return match err.code {
                            None => Ok(()), // the acknowledgement
                            Some(_) => Err(fail(err.to_io())),
                        };
                    }
                    NetlinkPayload::Done(_) => return Ok(()),
                    NetlinkPayload::InnerMessage(inner) => each(inner),
                    _ => {}
                }
            }
        }
    }
}

/// rtnetlink's multicast group of link changes (`RTMGRP_LINK`).
const RTMGRP_LINK: u32 = 1;

/// A NETLINK_ROUTE socket subscribed to the link changes of the namespace
/// it was opened in (the calling thread's then), for one link's removal.
pub(crate) struct LinkMonitor {
    socket: Socket,
    index: u32,
    buf: Vec<u8>,
}

impl LinkMonitor {
    /// Subscribes first, then looks the link up, so that a removal after
    /// the lookup is seen; `None` when the link is already gone.
    pub(super) fn open(name: &str) -> Result<Option<LinkMonitor>, NetnsError> {
        let fail = |source| NetnsError::Netlink {
            step: "subscribing to the namespace's link changes",
            source,
        };
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(fail)?;
        socket
            .bind(&SocketAddr::new(0, RTMGRP_LINK))
            .map_err(fail)?;
        let Some(facts) = Rtnl::open()?.link(name)? else {
            return Ok(None);
        };
        Ok(Some(LinkMonitor {
            socket,
            index: facts.index,
            buf: vec![0; 64 * 1024],
        }))
    }

    /// Blocks until the kernel announces the link's removal (`RTM_DELLINK`
    /// of its index). A lost notification (the socket's buffer overran)
    /// is no removal: the watch goes on.
    pub(super) fn wait_removed(&mut self) -> Result<(), NetnsError> {
        loop {
            let n = match self.socket.recv(&mut &mut self.buf[..], 0) {
                Ok(n) => n,
                Err(err) if err.raw_os_error() == Some(libc::ENOBUFS) => continue,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(NetnsError::Netlink {
                        step: "reading the namespace's link changes",
                        source,
                    })
                }
            };
            let mut at = 0;
            while at < n {
                let Ok(msg) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[at..n])
                else {
                    break;
                };
                let len = msg.header.length as usize;
                if len == 0 {
                    break;
                }
                at += len;
                if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(link)) =
                    msg.payload
                {
                    if link.header.index == self.index {
                        return Ok(());
                    }
                }
            }
        }
    }
}

fn family(addr: IpAddr) -> AddressFamily {
    match addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}
