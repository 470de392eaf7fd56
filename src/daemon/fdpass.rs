//! The one byte that opens every control connection, and the descriptor it
//! may carry (SCM_RIGHTS). See `api` for the protocol.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};

use super::api::{WITHOUT_FD, WITH_FD};

/// Send the opening byte, with `fd` attached when given. Blocking socket.
pub(crate) fn send_opening(socket: RawFd, fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
    let byte = [if fd.is_some() { WITH_FD } else { WITHOUT_FD }];
    let sent = crate::confine::scm::send(socket, &byte, fd)?;
    if sent != 1 {
        return Err(std::io::Error::other("short write of the opening byte"));
    }
    Ok(())
}

/// What the opening byte said.
#[derive(Debug)]
pub(crate) enum Opening {
    /// A valid opening byte, and the descriptor that came with it (if any).
    Open(Option<OwnedFd>),
    /// The peer closed before sending anything.
    Closed,
}

/// Read exactly the opening byte (never more: the HTTP request follows) and
/// any descriptors sent with it. Extra descriptors are closed. Call when the
/// socket is readable; returns `WouldBlock` otherwise.
pub(crate) fn recv_opening(socket: impl AsFd) -> std::io::Result<Opening> {
    let mut byte = [0u8; 1];
    let msg = crate::confine::scm::recv(socket, &mut byte)?;
    if msg.bytes == 0 {
        return Ok(Opening::Closed);
    }
    if msg.fds_truncated {
        return Err(std::io::Error::other(
            "too many descriptors sent with the opening byte",
        ));
    }
    let mut fds = msg.fds.into_iter();
    let first = fds.next();
    if fds.next().is_some() {
        return Err(std::io::Error::other(
            "more than one descriptor sent with the opening byte",
        ));
    }
    match (byte[0], &first) {
        (WITH_FD, Some(_)) | (WITHOUT_FD, None) => Ok(Opening::Open(first)),
        (other, _) => Err(std::io::Error::other(format!(
            "bad opening byte {other:#04x} (with {} descriptor)",
            if first.is_some() { "a" } else { "no" }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::{AsFd, AsRawFd};

    #[test]
    fn a_descriptor_rides_with_the_opening_byte_and_nothing_more_is_read() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/ns/net").unwrap();
        send_opening(a.as_raw_fd(), Some(file.as_fd())).unwrap();
        use std::io::Write;
        (&a).write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let Opening::Open(Some(fd)) = recv_opening(&b).unwrap() else {
            panic!("no descriptor");
        };
        let ours = nix::sys::stat::fstat(&file).unwrap();
        let theirs = nix::sys::stat::fstat(&fd).unwrap();
        assert_eq!((ours.st_dev, ours.st_ino), (theirs.st_dev, theirs.st_ino));
        let mut rest = [0u8; 16];
        (&b).read_exact(&mut rest).unwrap();
        assert_eq!(&rest, b"GET / HTTP/1.1\r\n");
    }

    #[test]
    fn an_opening_without_a_descriptor() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        send_opening(a.as_raw_fd(), None).unwrap();
        let Opening::Open(None) = recv_opening(&b).unwrap() else {
            panic!("unexpected descriptor");
        };
        drop(a);
        assert!(matches!(recv_opening(&b).unwrap(), Opening::Closed));
    }
}
