//! Where a redirected connection was going before nftables redirected it.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use nix::sys::socket::{getsockopt, sockopt};
use tokio::net::TcpStream;

/// SO_ORIGINAL_DST (IPv4) or IP6T_SO_ORIGINAL_DST (IPv6), chosen by the
/// family of the accepted socket (`local`, its own address). Errors when the connection was not
/// redirected (no conntrack NAT entry), e.g. a direct connect to the listener.
pub(crate) fn original_dst(stream: &TcpStream, local: SocketAddr) -> std::io::Result<SocketAddr> {
    if local.is_ipv4() {
        let sa = getsockopt(stream, sockopt::OriginalDst)?;
        let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
        Ok(SocketAddr::V4(SocketAddrV4::new(
            ip,
            u16::from_be(sa.sin_port),
        )))
    } else {
        let sa = getsockopt(stream, sockopt::Ip6tOriginalDst)?;
        let ip = Ipv6Addr::from(sa.sin6_addr.s6_addr);
        let dst = SocketAddrV6::new(ip, u16::from_be(sa.sin6_port), 0, 0);
        Ok(SocketAddr::V6(dst))
    }
}
