//! One message on a Unix socket with at most one descriptor riding along
//! (SCM_RIGHTS): the daemon's opening byte (`daemon::fdpass`) and what
//! sluice tells a workload's init (the sandbox's network namespace).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};

/// Send `bytes` as one message, with `fd` attached when given (blocking
/// socket; no SIGPIPE). Returns how many bytes were sent.
pub(crate) fn send(
    socket: RawFd,
    bytes: &[u8],
    fd: Option<BorrowedFd<'_>>,
) -> std::io::Result<usize> {
    let raw = fd.map(|fd| [fd.as_raw_fd()]);
    let iov = [IoSlice::new(bytes)];
    let cmsg: Vec<ControlMessage<'_>> = raw
        .as_ref()
        .map(|r| ControlMessage::ScmRights(r))
        .into_iter()
        .collect();
    Ok(sendmsg::<()>(
        socket,
        &iov,
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?)
}

/// What one [`recv`] read.
#[derive(Debug)]
pub(crate) struct Received {
    /// Bytes read into the buffer (0: the peer closed, or sent nothing).
    pub(crate) bytes: usize,
    /// The descriptors that came with them (close-on-exec).
    pub(crate) fds: Vec<OwnedFd>,
    /// More descriptors came than fit (4); those were closed.
    pub(crate) fds_truncated: bool,
    /// The message was longer than the buffer (datagram sockets).
    pub(crate) truncated: bool,
}

/// Read one message (at most `buf.len()` bytes) and up to 4 descriptors.
pub(crate) fn recv(socket: impl AsFd, buf: &mut [u8]) -> std::io::Result<Received> {
    let mut iov = [IoSliceMut::new(buf)];
    // rustix hands received descriptors over as OwnedFd: nothing here has to
    // vouch for raw descriptor numbers.
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for cmsg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = cmsg {
            fds.extend(received);
        }
    }
    Ok(Received {
        bytes: msg.bytes,
        fds,
        fds_truncated: msg.flags.contains(ReturnFlags::CTRUNC),
        truncated: msg.flags.contains(ReturnFlags::TRUNC),
    })
}
