//! The DHCP server socket on one tap, and the loop that answers on it.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::time::Duration;

use nix::sys::socket::{
    bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
};
use tokio::net::UdpSocket;

use super::{respond, DhcpError, GuestLease, MAX_PACKET};

/// Where a DHCP server listens.
pub(crate) const SERVER_PORT: u16 = 67;
/// Where a DHCP client listens.
pub(crate) const CLIENT_PORT: u16 = 68;
/// Pause after a socket error, so a persistent one cannot spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// A UDP socket on 0.0.0.0:67 that sees and sends only through `device`
/// (`SO_BINDTODEVICE`): one per tap, each answering its own guest. It
/// belongs to the network namespace of the calling thread, which must be
/// the tap's. A second socket on the same device fails (EADDRINUSE).
/// Non-blocking, ready for [`tokio::net::UdpSocket::from_std`].
pub fn bind_on_device(device: &str) -> Result<std::net::UdpSocket, DhcpError> {
    let err = |source: nix::Error| DhcpError::Bind {
        device: device.to_string(),
        source: source.into(),
    };
    let fd: OwnedFd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(err)?;
    setsockopt(
        &fd,
        sockopt::BindToDevice,
        &std::ffi::OsString::from(device),
    )
    .map_err(err)?;
    // Replies go to 255.255.255.255 while the guest has no address.
    setsockopt(&fd, sockopt::Broadcast, &true).map_err(err)?;
    // No SO_REUSEADDR: sockets on different devices do not conflict, and
    // a second responder on the same tap fails here instead of sharing it.
    let any = SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, SERVER_PORT));
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &any).map_err(err)?;
    Ok(std::net::UdpSocket::from(fd))
}

/// Answer the guest of `lease` on `socket` until the task is aborted. One
/// packet at a time: each costs a bounded decode and at most one reply, so
/// a flood only fills the socket's buffer.
pub async fn serve(socket: UdpSocket, lease: GuestLease) {
    // One byte more than the largest packet looked at, so that a longer
    // datagram (truncated by the kernel) is seen as too long.
    let mut buf = vec![0u8; MAX_PACKET + 1];
    loop {
        let (n, from) = match socket.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(err) => {
                tracing::warn!(%err, "DHCP: receive failed");
                tokio::time::sleep(ERROR_BACKOFF).await;
                continue;
            }
        };
        match respond(&lease, &buf[..n]) {
            Ok(reply) => {
                tracing::debug!(kind = ?reply.kind, to = %reply.to, guest = %lease.address(), "DHCP: answering");
                if let Err(err) = socket.send_to(&reply.bytes, SocketAddr::V4(reply.to)).await {
                    tracing::warn!(%err, to = %reply.to, "DHCP: send failed");
                }
            }
            Err(why) => tracing::debug!(%from, reason = why.as_str(), "DHCP: ignored a packet"),
        }
    }
}
