//! Moving bytes both ways once a connection is allowed.
//!
//! splice(2) through a pipe moves bytes socket -> pipe -> socket inside the
//! kernel: no copy into user space and no per-byte work in sluice. Each
//! direction ends on EOF by shutting down the write side of the other
//! socket (half-close), and the relay ends when both directions have.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{splice, OFlag, SpliceFFlags};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes moved per splice call; also the pipe's capacity.
const CHUNK: usize = 64 * 1024;

/// What the relay observed.
#[derive(Debug, Default, Clone, Copy)]
pub struct Relayed {
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// When the first upstream byte was handed to the client.
    pub first_byte_down: Option<Instant>,
}

/// Relay until both directions are closed (or one fails).
pub async fn relay(client: &TcpStream, upstream: &TcpStream) -> Relayed {
    let (Ok(up_pipe), Ok(down_pipe)) = (Pipe::take(), Pipe::take()) else {
        tracing::warn!(
            "cannot create a pipe for splice (file descriptor limit?); closing the connection"
        );
        return Relayed::default();
    };
    let finished = AtomicBool::new(false);
    let up = pump(client, upstream, up_pipe, &finished);
    let down = pump(upstream, client, down_pipe, &finished);
    let (up, down) = tokio::join!(up, down);
    Relayed {
        bytes_up: up.bytes,
        bytes_down: down.bytes,
        first_byte_down: down.first_write,
    }
}

/// Pipes kept per thread for reuse: creating and closing two pipes per
/// connection would be six system calls out of about thirty.
const PIPES_KEPT: usize = 64;

thread_local! {
    static SPARE_PIPES: std::cell::RefCell<Vec<Pipe>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn take() -> nix::Result<Pipe> {
        if let Some(pipe) = SPARE_PIPES.with(|spare| spare.borrow_mut().pop()) {
            return Ok(pipe);
        }
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        Ok(Pipe { read, write })
    }

    /// Keep an EMPTY pipe for the next connection (a pipe with bytes left in
    /// it is dropped instead: they belong to a finished connection).
    fn give_back(self) {
        SPARE_PIPES.with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.len() < PIPES_KEPT {
                spare.push(self);
            }
        });
    }
}

struct Pumped {
    bytes: u64,
    first_write: Option<Instant>,
}

/// One direction: `from` -> pipe -> `to`, then half-close `to`.
/// `finished` is set by whichever direction ends first; the last one skips
/// its half-close, since both sockets are closed right after anyway.
async fn pump(from: &TcpStream, to: &TcpStream, pipe: Pipe, finished: &AtomicBool) -> Pumped {
    let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
    let mut pumped = Pumped {
        bytes: 0,
        first_write: None,
    };
    loop {
        // Fill the pipe from the source.
        let filled = loop {
            match from
                .async_io(Interest::READABLE, || {
                    splice(from.as_fd(), None, pipe.write.as_fd(), None, CHUNK, flags)
                        .map_err(std::io::Error::from)
                })
                .await
            {
                Ok(n) => break Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(e),
            }
        };
        let mut pending = match filled {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Drain the pipe into the destination.
        while pending > 0 {
            let drained = to
                .async_io(Interest::WRITABLE, || {
                    splice(pipe.read.as_fd(), None, to.as_fd(), None, pending, flags)
                        .map_err(std::io::Error::from)
                })
                .await;
            match drained {
                Ok(n) => {
                    pending -= n;
                    pumped.bytes += n as u64;
                    pumped.first_write.get_or_insert_with(Instant::now);
                }
                Err(e) if e.raw_os_error() == Some(Errno::EINTR as i32) => {}
                Err(_) => {
                    // The destination is gone: stop reading the source too.
                    let _ = nix::sys::socket::shutdown(
                        std::os::fd::AsRawFd::as_raw_fd(from),
                        nix::sys::socket::Shutdown::Read,
                    );
                    return pumped;
                }
            }
        }
    }
    // EOF (or a read error) from the source: pass the half-close on (unless
    // the other direction is done too). The pipe was drained completely, so
    // it can serve another connection.
    if !finished.swap(true, Ordering::Relaxed) {
        let _ = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(to),
            nix::sys::socket::Shutdown::Write,
        );
    }
    pipe.give_back();
    pumped
}
