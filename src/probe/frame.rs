//! `sluice probe frame`: Ethernet frames a hostile guest would send, built
//! byte by byte and sent on a packet socket, so that the tests can attack a
//! tap's fence from inside a root guest (router advertisements, VLAN tags,
//! other ethertypes, spoofed sources, raw IP of any protocol, a TCP
//! handshake to a destination the guest's own kernel will not send to). The
//! builders are pure (bytes out) and also serve the tests that write frames
//! straight into a tap. Nothing here parses what comes back, except the
//! TCP segments of that one handshake.
//!
//! The `unsafe` blocks turn a `sockaddr_ll` into nix's `LinkAddr`, which
//! has no safe constructor.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::mac::MacAddr;

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub(crate) const ETH_P_8021Q: u16 = 0x8100;
/// IEEE 802 local experimental ethertype: no kernel handles it.
pub const ETH_P_EXPERIMENTAL: u16 = 0x88b5;
/// An IP protocol number no stack implements (RFC 3692 experimentation).
pub(crate) const EXPERIMENTAL_PROTOCOL: u8 = 253;

/// An Ethernet II frame.
pub fn ethernet(dst: MacAddr, src: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `frame` with an 802.1Q tag (VLAN `vid`) after its source MAC.
pub fn vlan_tagged(frame: &[u8], vid: u16) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    f.extend_from_slice(&ETH_P_8021Q.to_be_bytes());
    f.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    f.extend_from_slice(&frame[12..]);
    f
}

/// An ARP request or reply (`op` 1 or 2) for Ethernet and IPv4.
pub fn arp(
    src: MacAddr,
    op: u16,
    sender: (MacAddr, Ipv4Addr),
    target: (MacAddr, Ipv4Addr),
) -> Vec<u8> {
    let mut p = Vec::with_capacity(28);
    p.extend_from_slice(&1u16.to_be_bytes());
    p.extend_from_slice(&ETH_P_IP.to_be_bytes());
    p.extend_from_slice(&[6, 4]);
    p.extend_from_slice(&op.to_be_bytes());
    p.extend_from_slice(&sender.0.octets());
    p.extend_from_slice(&sender.1.octets());
    p.extend_from_slice(&target.0.octets());
    p.extend_from_slice(&target.1.octets());
    ethernet(MacAddr::BROADCAST, src, ETH_P_ARP, &p)
}

/// The Internet checksum (RFC 1071) of `parts`, concatenated.
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    let mut odd: Option<u8> = None;
    for part in parts {
        for &b in *part {
            match odd.take() {
                Some(hi) => sum += u32::from(u16::from_be_bytes([hi, b])),
                None => odd = Some(b),
            }
        }
    }
    if let Some(hi) = odd {
        sum += u32::from(u16::from_be_bytes([hi, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 packet of `protocol` carrying `payload` (TTL 64, no options).
pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, payload: &[u8]) -> Vec<u8> {
    let len = (20 + payload.len()) as u16;
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&len.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0x40, 0, 64, protocol, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let sum = checksum(&[&h]);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    h.extend_from_slice(payload);
    h
}

/// A UDP datagram from `sport` to `dport`, checksummed for `src` -> `dst`.
pub fn udp(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, data: &[u8]) -> Vec<u8> {
    let len = (8 + data.len()) as u16;
    let mut d = Vec::with_capacity(len as usize);
    d.extend_from_slice(&sport.to_be_bytes());
    d.extend_from_slice(&dport.to_be_bytes());
    d.extend_from_slice(&len.to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(data);
    let sum = match pseudo_header(src, dst, 17, len as u32) {
        Some(pseudo) => checksum(&[&pseudo, &d]),
        None => 0,
    };
    // 0 means "no checksum" over IPv4; an all-ones sum is sent as 0xffff.
    let sum = if sum == 0 { 0xffff } else { sum };
    d[6..8].copy_from_slice(&sum.to_be_bytes());
    d
}

/// The checksum pseudo-header of `src` -> `dst` (both of one family).
fn pseudo_header(src: IpAddr, dst: IpAddr, protocol: u8, len: u32) -> Option<Vec<u8>> {
    let mut p = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
            p.extend_from_slice(&[0, protocol]);
            p.extend_from_slice(&(len as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
            p.extend_from_slice(&len.to_be_bytes());
            p.extend_from_slice(&[0, 0, 0, protocol]);
        }
        _ => return None,
    }
    Some(p)
}

/// An IPv6 packet with next header `next` carrying `payload`.
pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, hop_limit: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    h.extend_from_slice(&[next, hop_limit]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h.extend_from_slice(payload);
    h
}

/// An ICMPv6 message (`kind`, code 0, `body` after the checksum) in an IPv6
/// packet with hop limit 255, as neighbour discovery requires.
pub(crate) fn icmpv6(src: Ipv6Addr, dst: Ipv6Addr, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, 0];
    m.extend_from_slice(body);
    let pseudo = pseudo_header(src.into(), dst.into(), 58, m.len() as u32).unwrap_or_default();
    let sum = checksum(&[&pseudo, &m]);
    m[2..4].copy_from_slice(&sum.to_be_bytes());
    ipv6(src, dst, 58, 255, &m)
}

/// A router advertisement from `src` (a link-local address, with `mac` as
/// its source link-layer option) to all nodes, offering itself as default
/// router for 30 minutes and `2001:db8:bad::/64` for autoconfiguration.
pub fn router_advertisement(mac: MacAddr, src: Ipv6Addr) -> Vec<u8> {
    let mut body = vec![64, 0];
    body.extend_from_slice(&1800u16.to_be_bytes());
    body.extend_from_slice(&[0; 8]);
    // Source link-layer address option.
    body.extend_from_slice(&[1, 1]);
    body.extend_from_slice(&mac.octets());
    // Prefix information: on-link, autonomous, valid and preferred a day.
    body.extend_from_slice(&[3, 4, 64, 0xc0]);
    body.extend_from_slice(&86400u32.to_be_bytes());
    body.extend_from_slice(&86400u32.to_be_bytes());
    body.extend_from_slice(&[0; 4]);
    body.extend_from_slice(
        &"2001:db8:bad::"
            .parse::<Ipv6Addr>()
            .unwrap_or(Ipv6Addr::UNSPECIFIED)
            .octets(),
    );
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    let packet = icmpv6(src, all_nodes, 134, &body);
    ethernet(MacAddr([0x33, 0x33, 0, 0, 0, 1]), mac, ETH_P_IPV6, &packet)
}

/// A redirect from `src` telling `dst` to reach `target` by way of `via`.
pub fn redirect(
    mac: MacAddr,
    dst_mac: MacAddr,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    via: Ipv6Addr,
    target: Ipv6Addr,
) -> Vec<u8> {
    let mut body = vec![0; 4];
    body.extend_from_slice(&via.octets());
    body.extend_from_slice(&target.octets());
    ethernet(dst_mac, mac, ETH_P_IPV6, &icmpv6(src, dst, 137, &body))
}

/// A DHCPv6 ADVERTISE (a server's answer) from `src` port 547 to the
/// all-DHCP-agents group's client port 546.
pub fn dhcpv6_advertise(mac: MacAddr, src: Ipv6Addr) -> Vec<u8> {
    let dst = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);
    let data = [2, 0x12, 0x34, 0x56];
    let datagram = udp(src.into(), dst.into(), 547, 546, &data);
    ethernet(
        MacAddr([0x33, 0x33, 0, 1, 0, 2]),
        mac,
        ETH_P_IPV6,
        &ipv6(src, dst, 17, 1, &datagram),
    )
}

/// TCP flags.
pub(crate) const TCP_FIN: u8 = 0x01;
pub(crate) const TCP_SYN: u8 = 0x02;
pub(crate) const TCP_RST: u8 = 0x04;
pub(crate) const TCP_PSH: u8 = 0x08;
pub(crate) const TCP_ACK: u8 = 0x10;

/// A TCP segment (no options, window 64240) from `sport` to `dport`,
/// checksummed for `src` -> `dst`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tcp(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    data: &[u8],
) -> Vec<u8> {
    let mut t = Vec::with_capacity(20 + data.len());
    t.extend_from_slice(&sport.to_be_bytes());
    t.extend_from_slice(&dport.to_be_bytes());
    t.extend_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(&ack.to_be_bytes());
    t.extend_from_slice(&[5 << 4, flags]);
    t.extend_from_slice(&64240u16.to_be_bytes());
    t.extend_from_slice(&[0, 0, 0, 0]);
    t.extend_from_slice(data);
    let sum = match pseudo_header(src, dst, 6, t.len() as u32) {
        Some(pseudo) => checksum(&[&pseudo, &t]),
        None => 0,
    };
    t[16..18].copy_from_slice(&sum.to_be_bytes());
    t
}

/// `segment` (a transport payload of `protocol`) in an IP packet of the
/// family of `src` and `dst`, in an Ethernet frame.
fn framed(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: IpAddr,
    dst: IpAddr,
    protocol: u8,
    segment: &[u8],
) -> Result<Vec<u8>, String> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Ok(ethernet(
            dst_mac,
            src_mac,
            ETH_P_IP,
            &ipv4(s, d, protocol, segment),
        )),
        (IpAddr::V6(s), IpAddr::V6(d)) => Ok(ethernet(
            dst_mac,
            src_mac,
            ETH_P_IPV6,
            &ipv6(s, d, protocol, 64, segment),
        )),
        _ => Err("FAIL --src and --dst must be of one family".into()),
    }
}

/// A TCP segment seen in a frame: who sent it to whom, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenSegment {
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) seq: u32,
    pub(crate) ack: u32,
    pub(crate) flags: u8,
    pub(crate) data: Vec<u8>,
}

/// The TCP segment in an untagged Ethernet frame of IPv4 (no fragment) or
/// IPv6 (no extension header), if it holds one.
pub(crate) fn tcp_segment(frame: &[u8]) -> Option<SeenSegment> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let ip = frame.get(14..)?;
    let (src, dst, segment) = match ethertype {
        ETH_P_IP => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            if *ip.get(9)? != 6 || ihl < 20 {
                return None;
            }
            let src: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
            (
                IpAddr::from(src),
                IpAddr::from(dst),
                ip.get(ihl..total.min(ip.len()))?,
            )
        }
        ETH_P_IPV6 => {
            let len = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            if *ip.get(6)? != 6 {
                return None;
            }
            let src: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            (
                IpAddr::from(src),
                IpAddr::from(dst),
                ip.get(40..(40 + len).min(ip.len()))?,
            )
        }
        _ => return None,
    };
    let offset = usize::from(segment.get(12)? >> 4) * 4;
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(
            segment.get(at..at + 4)?.try_into().ok()?,
        ))
    };
    Some(SeenSegment {
        src,
        dst,
        sport: u16::from_be_bytes([*segment.first()?, *segment.get(1)?]),
        dport: u16::from_be_bytes([*segment.get(2)?, *segment.get(3)?]),
        seq: word(4)?,
        ack: word(8)?,
        flags: *segment.get(13)?,
        data: segment.get(offset..)?.to_vec(),
    })
}

/// `sll` as nix's link-layer address (nix has no safe constructor).
fn link_addr(sll: &libc::sockaddr_ll) -> std::io::Result<nix::sys::socket::LinkAddr> {
    use nix::sys::socket::SockaddrLike;
    // SAFETY: `sll` is a fully initialised sockaddr_ll, alive for the call,
    // and the length given is exactly its size; from_raw only copies it.
    unsafe {
        nix::sys::socket::LinkAddr::from_raw(
            (sll as *const libc::sockaddr_ll).cast(),
            Some(std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t),
        )
    }
    .ok_or_else(|| std::io::Error::other("cannot make a link-layer address"))
}

/// A packet socket on `dev` for every ethertype: sends frames as they are,
/// and receives every frame the interface sees (its own sends included).
fn packet_socket(dev: &str) -> std::io::Result<(std::os::fd::OwnedFd, nix::sys::socket::LinkAddr)> {
    use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockProtocol, SockType};
    let index = nix::net::if_::if_nametoindex(dev)?;
    let fd = socket(
        AddressFamily::Packet,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::EthAll,
    )?;
    let sll = libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as u16,
        sll_protocol: (libc::ETH_P_ALL as u16).to_be(),
        sll_ifindex: index as i32,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 6,
        sll_addr: [0xff; 8],
    };
    let addr = link_addr(&sll)?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr)?;
    Ok((fd, addr))
}

/// A TCP handshake made of raw frames on `dev` (SYN, the peer's SYN-ACK,
/// then ACK with `data`), and the peer's first answer (data, FIN or RST),
/// then a RST. For destinations the guest's own kernel will not send to
/// (loopback, IPv4-mapped): the peer's answers come from a source the
/// guest's kernel drops as a martian, so it never resets the handshake.
/// `Ok` says what came back; `Err` when no SYN-ACK came within `wait`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tcp_handshake(
    dev: &str,
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: IpAddr,
    dst: IpAddr,
    port: u16,
    data: &[u8],
    wait: std::time::Duration,
) -> super::Outcome {
    use nix::sys::socket::{recv, sendto, setsockopt, sockopt, MsgFlags};
    use std::os::fd::AsRawFd;
    const SPORT: u16 = 40001;
    const ISS: u32 = 0x5105_0001;
    let fail = |e: std::io::Error| format!("FAIL on {dev}: {e}");
    let (fd, to) = packet_socket(dev).map_err(fail)?;
    let tv = nix::sys::time::TimeVal::new(0, 200_000);
    setsockopt(&fd, sockopt::ReceiveTimeout, &tv).map_err(|e| fail(e.into()))?;
    let send = |seq: u32, ack: u32, flags: u8, payload: &[u8]| -> Result<(), String> {
        let segment = tcp(src, dst, SPORT, port, seq, ack, flags, payload);
        let frame = framed(src_mac, dst_mac, src, dst, 6, &segment)?;
        sendto(fd.as_raw_fd(), &frame, &to, MsgFlags::empty()).map_err(|e| fail(e.into()))?;
        Ok(())
    };
    let end = std::time::Instant::now() + wait;
    let mut buf = vec![0u8; 65536];
    let mut next = || -> Option<SeenSegment> {
        while std::time::Instant::now() < end {
            let Ok(n) = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) else {
                continue;
            };
            if let Some(seg) = tcp_segment(&buf[..n]) {
                if seg.src == dst && seg.sport == port && seg.dst == src && seg.dport == SPORT {
                    return Some(seg);
                }
            }
        }
        None
    };
    send(ISS, 0, TCP_SYN, &[])?;
    let synack = loop {
        match next() {
            Some(seg) if seg.flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK => break seg,
            Some(seg) if seg.flags & TCP_RST != 0 => {
                return Err(format!("FAIL TCP {dst}:{port} reset the SYN"))
            }
            Some(_) => continue,
            None => return Err(format!("FAIL TCP {dst}:{port} no SYN-ACK")),
        }
    };
    let ack = synack.seq.wrapping_add(1);
    send(ISS + 1, ack, TCP_ACK | TCP_PSH, data)?;
    let answer = loop {
        match next() {
            Some(seg) if !seg.data.is_empty() => {
                let text = String::from_utf8_lossy(&seg.data).into_owned();
                break format!(
                    "reply {} bytes: {}",
                    seg.data.len(),
                    text.lines().next().unwrap_or("")
                );
            }
            Some(seg) if seg.flags & TCP_RST != 0 => break "reset".to_string(),
            Some(seg) if seg.flags & TCP_FIN != 0 => break "closed".to_string(),
            Some(_) => continue,
            None => break "no reply".to_string(),
        }
    };
    let _ = send(ISS + 1 + data.len() as u32, ack, TCP_RST, &[]);
    Ok(format!("TCP {dst}:{port} handshake done, {answer}"))
}

/// Sends `frame` as it is on interface `dev` through a packet socket.
pub(crate) fn send(dev: &str, frame: &[u8]) -> std::io::Result<()> {
    use nix::sys::socket::{
        sendto, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType,
    };
    let index = nix::net::if_::if_nametoindex(dev)?;
    let fd = socket(
        AddressFamily::Packet,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::EthAll,
    )?;
    let mut dst = [0u8; 8];
    dst[..6].copy_from_slice(&frame[..6.min(frame.len())]);
    let sll = libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as u16,
        sll_protocol: 0,
        sll_ifindex: index as i32,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: 6,
        sll_addr: dst,
    };
    let addr = link_addr(&sll)?;
    let sent = sendto(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        frame,
        &addr,
        MsgFlags::empty(),
    )?;
    if sent != frame.len() {
        return Err(std::io::Error::other(format!(
            "sent {sent} of {} bytes",
            frame.len()
        )));
    }
    Ok(())
}

/// The MAC address of interface `dev` (from sysfs).
pub(crate) fn mac_of(dev: &str) -> Result<MacAddr, String> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{dev}/address"))
        .map_err(|e| format!("FAIL no interface {dev}: {e}"))?;
    text.trim().parse().map_err(|e| format!("FAIL {dev}: {e}"))
}

/// What `sluice probe frame` sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// UDP to `dst`:`port` from `src` (either family).
    Udp,
    /// A raw IP packet of `protocol` from `src` to `dst`.
    Ip,
    /// An ARP request from `src` asking for `dst` (gratuitous when equal).
    Arp,
    /// A router advertisement from DEV's link-local address.
    Ra,
    /// An ICMPv6 redirect from DEV's link-local address to `dst`.
    Redirect,
    /// A DHCPv6 server message (ADVERTISE) from DEV's link-local address.
    Dhcpv6,
    /// A frame of an ethertype nothing handles (0x88b5).
    Ethertype,
    /// A TCP handshake to `dst`:`port` from `src` made of raw frames, then
    /// an HTTP request, and the first answer ([`tcp_handshake`]).
    Tcp,
}

/// One `sluice probe frame`.
#[derive(Debug, Clone)]
pub(crate) struct FrameProbe {
    pub(crate) dev: String,
    pub(crate) kind: FrameKind,
    pub(crate) src_mac: Option<MacAddr>,
    pub(crate) dst_mac: Option<MacAddr>,
    pub(crate) src: Option<IpAddr>,
    pub(crate) dst: Option<IpAddr>,
    pub(crate) port: u16,
    pub(crate) protocol: u8,
    pub(crate) vlan: Option<u16>,
}

/// Builds and sends the frame; `Ok` says what went out.
pub(crate) fn probe(p: &FrameProbe) -> super::Outcome {
    let own = mac_of(&p.dev)?;
    let src_mac = p.src_mac.unwrap_or(own);
    let dst_mac = p.dst_mac.unwrap_or(MacAddr::BROADCAST);
    let link_local = src_mac.link_local();
    let need =
        |a: Option<IpAddr>, what: &str| a.ok_or_else(|| format!("FAIL {what} needs --{what}"));
    let frame = match p.kind {
        FrameKind::Tcp => {
            let (src, dst) = (need(p.src, "src")?, need(p.dst, "dst")?);
            let host = match dst {
                IpAddr::V4(a) => a.to_string(),
                IpAddr::V6(a) => format!("[{a}]"),
            };
            let request = format!("GET / HTTP/1.1\r\nHost: {host}:{}\r\n\r\n", p.port);
            return tcp_handshake(
                &p.dev,
                src_mac,
                dst_mac,
                src,
                dst,
                p.port,
                request.as_bytes(),
                std::time::Duration::from_secs(10),
            );
        }
        FrameKind::Udp | FrameKind::Ip => {
            let (src, dst) = (need(p.src, "src")?, need(p.dst, "dst")?);
            let (protocol, payload) = match p.kind {
                FrameKind::Udp => (17, udp(src, dst, 40000, p.port, b"sluice-probe-frame")),
                _ => (p.protocol, b"sluice-probe-frame".to_vec()),
            };
            match (src, dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    ethernet(dst_mac, src_mac, ETH_P_IP, &ipv4(s, d, protocol, &payload))
                }
                (IpAddr::V6(s), IpAddr::V6(d)) => ethernet(
                    dst_mac,
                    src_mac,
                    ETH_P_IPV6,
                    &ipv6(s, d, protocol, 64, &payload),
                ),
                _ => return Err("FAIL --src and --dst must be of one family".into()),
            }
        }
        FrameKind::Arp => {
            let (IpAddr::V4(src), IpAddr::V4(dst)) = (need(p.src, "src")?, need(p.dst, "dst")?)
            else {
                return Err("FAIL arp needs IPv4 --src and --dst".into());
            };
            arp(src_mac, 1, (src_mac, src), (MacAddr([0; 6]), dst))
        }
        FrameKind::Ra => router_advertisement(src_mac, link_local),
        FrameKind::Redirect => {
            let IpAddr::V6(dst) = need(p.dst, "dst")? else {
                return Err("FAIL redirect needs an IPv6 --dst".into());
            };
            redirect(
                src_mac,
                dst_mac,
                link_local,
                dst,
                link_local,
                "2001:db8:bad::1".parse().unwrap_or(dst),
            )
        }
        FrameKind::Dhcpv6 => dhcpv6_advertise(src_mac, link_local),
        FrameKind::Ethertype => {
            ethernet(dst_mac, src_mac, ETH_P_EXPERIMENTAL, b"sluice-probe-frame")
        }
    };
    let frame = match p.vlan {
        Some(vid) => vlan_tagged(&frame, vid),
        None => frame,
    };
    send(&p.dev, &frame).map_err(|e| format!("FAIL send on {}: {e}", p.dev))?;
    Ok(format!(
        "FRAME sent {:?} {} bytes on {} from {src_mac}",
        p.kind,
        frame.len(),
        p.dev
    ))
}

#[cfg(test)]
mod tests;
