//! The upstream connect, from sluice's own namespace, to a destination the
//! policy allowed.
//!
//! On the paths sluice serves (a veth, a bridge or loopback to the next
//! hop), the kernel usually finishes the handshake inside connect(2)
//! itself: the SYN, the SYN-ACK and the ACK are all handled in the softirq
//! that the SYN's transmit runs. So the socket is asked once, with a poll(2)
//! that does not wait, before the event loop is: a connection already up
//! goes on at once, without a round trip through epoll (which at eight
//! connections in flight is a wait behind every other ready connection)
//! and without arming a timer. Only a connect still under way waits for the
//! event loop, bounded by the connect timeout.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    connect, getsockopt, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType,
    SockaddrStorage,
};
use tokio::net::TcpStream;

/// Connect to `dst` with TCP_NODELAY set, waiting at most `timeout` for a
/// handshake that connect(2) did not finish itself.
pub(super) async fn connect_upstream(dst: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let (socket, up) = start_connect(dst)?;
    let stream = TcpStream::from_std(std::net::TcpStream::from(socket))?;
    if up {
        return Ok(stream);
    }
    match tokio::time::timeout(timeout, stream.writable()).await {
        Ok(ready) => ready?,
        Err(_) => return Err(io::ErrorKind::TimedOut.into()),
    }
    match stream.take_error()? {
        Some(err) => Err(err),
        None => Ok(stream),
    }
}

/// A non-blocking socket connecting to `dst`, and whether its handshake is
/// done already (an error: the connect failed).
fn start_connect(dst: SocketAddr) -> io::Result<(OwnedFd, bool)> {
    let family = match dst {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let socket = socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // Set before the connect: no system call after it. SO_OOBINLINE: an
    // urgent byte from the origin is relayed as data, as the client's is
    // (the listeners set it).
    setsockopt(&socket, sockopt::TcpNoDelay, &true)?;
    setsockopt(&socket, sockopt::OobInline, &true)?;
    match connect(
        std::os::fd::AsRawFd::as_raw_fd(&socket),
        &SockaddrStorage::from(dst),
    ) {
        Ok(()) => return Ok((socket, true)),
        Err(Errno::EINPROGRESS) => {}
        Err(err) => return Err(err.into()),
    }
    let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLOUT)];
    let ready = poll(&mut fds, PollTimeout::ZERO)?;
    let revents = fds[0].revents().unwrap_or(PollFlags::empty());
    if ready == 0 || revents.is_empty() {
        return Ok((socket, false));
    }
    if revents.intersects(PollFlags::POLLERR | PollFlags::POLLHUP) {
        let errno = getsockopt(&socket, sockopt::SocketError)?;
        return Err(match errno {
            0 => io::ErrorKind::ConnectionRefused.into(),
            errno => io::Error::from_raw_os_error(errno),
        });
    }
    Ok((socket, true))
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::Poll;

    use super::*;

    #[tokio::test]
    async fn a_listening_destination_is_connected_with_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dst = listener.local_addr().unwrap();
        let stream = connect_upstream(dst, Duration::from_secs(5)).await.unwrap();
        assert_eq!(stream.peer_addr().unwrap(), dst);
        assert!(stream.nodelay().unwrap());
        let (_, from) = listener.accept().await.unwrap();
        assert_eq!(from, stream.local_addr().unwrap());
    }

    /// A listener whose accept queue holds one connection, and holds it:
    /// the kernel drops every further SYN until a connection is accepted.
    fn full_listener() -> (std::net::TcpListener, SocketAddr, std::net::TcpStream) {
        let socket = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        let any = SockaddrStorage::from("127.0.0.1:0".parse::<SocketAddr>().unwrap());
        nix::sys::socket::bind(std::os::fd::AsRawFd::as_raw_fd(&socket), &any).unwrap();
        // A backlog of 0 admits one connection into the accept queue.
        nix::sys::socket::listen(&socket, nix::sys::socket::Backlog::new(0).unwrap()).unwrap();
        let listener = std::net::TcpListener::from(socket);
        let dst = listener.local_addr().unwrap();
        let queued = std::net::TcpStream::connect(dst).unwrap();
        (listener, dst, queued)
    }

    #[tokio::test]
    async fn a_destination_that_never_answers_times_out() {
        let (_listener, dst, _queued) = full_listener();
        let err = connect_upstream(dst, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_handshake_that_finishes_later_is_waited_for() {
        let (listener, dst, _queued) = full_listener();
        // The SYN is dropped while the queue is full, so the first poll
        // finds the connect under way; the SYN's retransmission (a second
        // later) finds room once the queued connection is accepted.
        let mut connecting = std::pin::pin!(connect_upstream(dst, Duration::from_secs(30)));
        let first = std::future::poll_fn(|cx| Poll::Ready(connecting.as_mut().poll(cx))).await;
        assert!(
            first.is_pending(),
            "the handshake cannot have finished: the queue is full"
        );
        let accepting = tokio::task::spawn_blocking(move || {
            let queued = listener.accept().unwrap();
            let waited = listener.accept().unwrap();
            (queued, waited)
        });
        let (stream, accepted) = tokio::join!(connecting, accepting);
        let stream = stream.unwrap();
        let (_, (_, from)) = accepted.unwrap();
        assert_eq!(from, stream.local_addr().unwrap());
    }

    #[tokio::test]
    async fn a_closed_port_is_refused_at_once_over_either_family() {
        for any in ["127.0.0.1:0", "[::1]:0"] {
            // A port just released: nothing listens there.
            let dst = std::net::TcpListener::bind(any)
                .unwrap()
                .local_addr()
                .unwrap();
            let err = connect_upstream(dst, Duration::from_secs(5))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{dst}");
        }
    }
}
