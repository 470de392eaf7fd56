//! The router advertisement socket on one tap, and the loop that answers on
//! it: a raw ICMPv6 socket bound to the tap (`SO_BINDTODEVICE`) that has
//! joined the all-routers group there (where solicitations go; the tap does
//! not forward, so the kernel has not joined it), sending with hop limit
//! 255 as neighbour discovery requires.

use std::io;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::OwnedFd;
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};
use rustix::net::{ipproto, sockopt as rsockopt, AddressFamily, SocketFlags, SocketType};

use super::{respond, GuestRouter, MAX_MESSAGE};

/// Where routers listen for solicitations.
const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
/// Where advertisements go: every node on the tap (the guest).
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// Neighbour discovery's hop limit: a receiver drops anything else.
const ND_HOP_LIMIT: u32 = 255;
/// How often an unsolicited advertisement renews the guest's router and
/// prefix (RFC 4861's default MaxRtrAdvInterval).
pub(crate) const UNSOLICITED_INTERVAL: Duration = Duration::from_secs(600);
/// At most one advertisement per this interval: further solicitations in
/// it are ignored (the guest solicits again), so a flood of them costs one
/// reply per second (RFC 4861 6.2.6 rate-limits multicast ones).
const MIN_BETWEEN_ADVERTISEMENTS: Duration = Duration::from_secs(1);
/// Pause after a socket error, so a persistent one cannot spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// The socket, with the tap's index its sends name. A raw ICMPv6 socket is
/// a datagram socket to std and tokio alike (recvfrom and sendto with a
/// `sockaddr_in6`, port 0), so it is held as a `UdpSocket`: no descriptor
/// of its own to register with the reactor.
pub(crate) struct RouterSocket {
    socket: std::net::UdpSocket,
    index: u32,
}

/// A raw ICMPv6 socket that sees and sends only through `device`, joined
/// to the all-routers group there. It belongs to the network namespace of
/// the calling thread, which must be the tap's. Non-blocking.
pub(crate) fn bind_on_device(device: &str) -> io::Result<RouterSocket> {
    let index = nix::net::if_::if_nametoindex(device)?;
    let fd: OwnedFd = rustix::net::socket_with(
        AddressFamily::INET6,
        SocketType::RAW,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        Some(ipproto::ICMPV6),
    )?;
    setsockopt(
        &fd,
        sockopt::BindToDevice,
        &std::ffi::OsString::from(device),
    )?;
    rsockopt::set_ipv6_add_membership(&fd, &ALL_ROUTERS, index)?;
    rsockopt::set_ipv6_multicast_hops(&fd, ND_HOP_LIMIT)?;
    rsockopt::set_ipv6_unicast_hops(&fd, Some(ND_HOP_LIMIT as u8))?;
    rsockopt::set_ipv6_multicast_if(&fd, index)?;
    rsockopt::set_ipv6_multicast_loop(&fd, false)?;
    Ok(RouterSocket {
        socket: std::net::UdpSocket::from(fd),
        index,
    })
}

impl RouterSocket {
    /// A copy for another task (the same socket).
    pub(crate) fn try_clone(&self) -> io::Result<RouterSocket> {
        Ok(RouterSocket {
            socket: self.socket.try_clone()?,
            index: self.index,
        })
    }
}

/// Advertise to the guest of `router` on `socket` until the task is
/// aborted: once at start, after each solicitation (at most one per
/// second), and every [`UNSOLICITED_INTERVAL`]. One message at a time:
/// each costs a bounded parse and at most one reply.
pub(crate) async fn serve(socket: RouterSocket, router: GuestRouter) {
    let to = SocketAddr::V6(SocketAddrV6::new(ALL_NODES, 0, 0, socket.index));
    let socket = match tokio::net::UdpSocket::from_std(socket.socket) {
        Ok(socket) => socket,
        Err(err) => {
            tracing::warn!(%err, "router advertisements: cannot register the socket");
            return;
        }
    };
    let advertisement = router.advertisement();
    let mut last_sent: Option<tokio::time::Instant> = None;
    let mut renew = tokio::time::interval(UNSOLICITED_INTERVAL);
    // One byte more than the largest message looked at, so that a longer
    // one (truncated by the kernel) is seen as too long.
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    loop {
        let solicited = tokio::select! {
            _ = renew.tick() => None,
            got = socket.recv_from(&mut buf) => Some(got),
        };
        let reply = match solicited {
            None => advertisement.clone(),
            Some(Err(err)) => {
                tracing::warn!(%err, "router advertisements: receive failed");
                tokio::time::sleep(ERROR_BACKOFF).await;
                continue;
            }
            Some(Ok((n, from))) => {
                let from = match from {
                    SocketAddr::V6(a) => *a.ip(),
                    SocketAddr::V4(_) => continue,
                };
                match respond(&router, from, &buf[..n]) {
                    Ok(reply) => reply,
                    Err(why) => {
                        tracing::trace!(%from, reason = why.as_str(), "router advertisements: ignored a message");
                        continue;
                    }
                }
            }
        };
        let now = tokio::time::Instant::now();
        if solicited.is_some()
            && last_sent.is_some_and(|at| now.duration_since(at) < MIN_BETWEEN_ADVERTISEMENTS)
        {
            tracing::debug!("router advertisements: a solicitation within a second of the last advertisement ignored");
            continue;
        }
        match socket.send_to(&reply, to).await {
            Ok(_) => {
                last_sent = Some(now);
                tracing::debug!(solicited = solicited.is_some(), guest = %router.guest, "router advertisement sent");
            }
            // Before the VMM opens the tap there is nobody to send to.
            Err(err) => tracing::debug!(%err, "router advertisements: send failed"),
        }
    }
}
