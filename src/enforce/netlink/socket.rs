//! The one NETLINK_NETFILTER socket of a [`super::create`] or a
//! [`super::verify`]: opened in the calling thread's namespace, a send
//! that goes out whole, a receive that gives up after a bound, and the
//! dump of every object of one kind. It must never wait on a silent kernel
//! without that bound, and never return a dump the kernel says changed
//! while it was read (`NLM_F_DUMP_INTR`): that is a mismatch, not a retry.

use std::io;
use std::time::Duration;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::wire::{message, messages};
use super::{
    NFNL_SUBSYS_NFTABLES, NFPROTO_UNSPEC, NLMSG_DONE, NLMSG_ERROR, NLM_F_DUMP, NLM_F_DUMP_INTR,
    NLM_F_REQUEST,
};
use crate::enforce::EnforceError;

/// How long a reply may take before the kernel is deemed silent (it
/// answers in microseconds; this only bounds a wait that should not hang).
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// What one dump returned: each object's family and attributes.
type Dumped = Vec<(u8, Vec<u8>)>;

/// A NETLINK_NETFILTER socket in the calling thread's namespace.
pub(super) struct Nfnl {
    socket: Socket,
}

impl Nfnl {
    pub(super) fn open() -> Result<Nfnl, EnforceError> {
        let fail = EnforceError::Netlink;
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(fail)?;
        socket.bind_auto().map_err(fail)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(fail)?;
        let timeout = nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as _, 0);
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| fail(e.into()))?;
        Ok(Nfnl { socket })
    }

    pub(super) fn send(&self, buf: &[u8]) -> Result<(), EnforceError> {
        let sent = self.socket.send(buf, 0).map_err(EnforceError::Exchange)?;
        if sent != buf.len() {
            return Err(EnforceError::Exchange(io::Error::other(format!(
                "sent {sent} of {} bytes",
                buf.len()
            ))));
        }
        Ok(())
    }

    pub(super) fn recv(&self, buf: &mut [u8]) -> Result<usize, EnforceError> {
        match self.socket.recv(&mut &mut buf[..], 0) {
            Ok(n) => Ok(n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(EnforceError::Exchange(io::Error::other(format!(
                    "the kernel did not answer within {} s",
                    REPLY_TIMEOUT.as_secs()
                ))))
            }
            Err(e) => Err(EnforceError::Exchange(e)),
        }
    }

    /// Every object of one kind in the namespace, of every family.
    pub(super) fn dump(&self, kind: u16, what: &str) -> Result<Dumped, EnforceError> {
        let mut buf = Vec::with_capacity(32);
        let ty = (NFNL_SUBSYS_NFTABLES << 8) | kind;
        message(
            &mut buf,
            ty,
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
            NFPROTO_UNSPEC,
            0,
            &[],
        );
        self.send(&buf)?;
        let mut out = Vec::new();
        let mut reply = vec![0u8; 64 * 1024];
        loop {
            let n = self.recv(&mut reply)?;
            for (ty, flags, _seq, payload) in messages(&reply[..n]) {
                if flags & NLM_F_DUMP_INTR != 0 {
                    return Err(EnforceError::Mismatch(format!(
                        "{what} changed while they were read back"
                    )));
                }
                match ty {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let code = payload
                            .get(..4)
                            .map_or(-libc::EIO, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        let err = io::Error::from_raw_os_error(-code);
                        return Err(if code == -libc::EPERM {
                            EnforceError::Permission {
                                stderr: err.to_string(),
                            }
                        } else {
                            EnforceError::List {
                                table: what.to_string(),
                                stderr: err.to_string(),
                            }
                        });
                    }
                    _ if payload.len() >= 4 => out.push((payload[0], payload[4..].to_vec())),
                    _ => {}
                }
            }
        }
    }
}
