//! Moving bytes both ways once a connection is allowed.
//!
//! Each direction copies through one buffer per thread: a read, then a
//! write of what it read. The buffer is used only between the two calls,
//! never across an await, so it serves every connection on the thread; a
//! connection holds its own copy of bytes only while its destination is
//! full (at most one buffer's worth, per direction). So a connection holds
//! its two sockets and nothing else. splice(2) through a pipe was measured
//! against this and dropped: on these machines the copy moved 32 MiB in
//! 64 KiB writes faster (docs/measurements.md, "round eleven"), and each
//! pipe cost two more descriptors per direction. A sockmap redirect was
//! measured too and dropped ("round sixteen"): slower here, bytes lost at
//! the half-close unless the proxy polls for the kernel's queue to drain,
//! and no backpressure from a client that stops reading.
//!
//! Each direction ends on EOF by shutting down the write side of the other
//! socket (half-close), and the relay ends when both directions have.
//!
//! Writes, and the first read from the client, are tried before the event
//! loop is asked (speculative I/O, as haproxy does): a socket just
//! connected or accepted is nearly always writable, and a client's request
//! is usually waiting by the time its connection is allowed, but tokio
//! learns either only from its next epoll_wait. Going to the kernel first
//! saves that round trip, which at eight connections in flight is a wait
//! behind every other ready connection. A call that would block goes back
//! to tokio's way (wait for readiness, then try_io), which clears only the
//! readiness event it tried on: clearing it by hand after a call of our own
//! could lose an event that another thread's driver saw meanwhile.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// The copy buffer: the most read at a time, and the most a connection
/// holds of its own while its destination is full. 128 KiB to 1 MiB moved
/// bulk no faster against haproxy in the same runs ("round sixteen").
const COPY_BUF: usize = 16 * 1024;

/// What the relay observed.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Relayed {
    pub(crate) bytes_up: u64,
    pub(crate) bytes_down: u64,
    /// When the first upstream byte was handed to the client.
    pub(crate) first_byte_down: Option<Instant>,
}

/// Relay until both directions are closed (or one fails).
pub(crate) async fn relay(client: &TcpStream, upstream: &TcpStream) -> Relayed {
    let finished = AtomicBool::new(false);
    // The client has most likely spoken already; the origin has not.
    let up = pump(client, upstream, &finished, Read::Now);
    let down = pump(upstream, client, &finished, Read::WhenReady);
    let (up, down) = tokio::join!(up, down);
    Relayed {
        bytes_up: up.bytes,
        bytes_down: down.bytes,
        first_byte_down: down.first_write,
    }
}

thread_local! {
    /// Used only between a read and the write of what it read, never
    /// across an await, so one per thread serves every connection on it.
    static COPY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// What one direction moved.
#[derive(Debug, Default)]
pub(super) struct Pumped {
    pub(crate) bytes: u64,
    pub(crate) first_write: Option<Instant>,
}

impl Pumped {
    fn wrote(&mut self, n: usize) {
        if n > 0 {
            self.bytes += n as u64;
            self.first_write.get_or_insert_with(Instant::now);
        }
    }
}

/// How a direction's copying stopped.
enum Copied {
    /// EOF (or a read error) from the source.
    End,
    /// The destination is gone.
    DestinationGone,
}

/// One step of the copy: a read and the write of what it read.
enum Step {
    Again,
    End,
    DestinationGone,
    /// `n` bytes read and written.
    Wrote(usize),
    /// `n` bytes read, `left` of them (copied out) not yet written: the
    /// destination is full.
    Partial {
        n: usize,
        left: Vec<u8>,
    },
}

/// When a direction's first read goes to the kernel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    /// At once: bytes are probably waiting.
    Now,
    /// Once the event loop says the socket is readable.
    WhenReady,
}

/// One direction: `from` -> `to`, copied, then half-close `to`.
/// `finished` is set by whichever direction ends first; the last one skips
/// its half-close, since both sockets are closed right after anyway.
async fn pump(from: &TcpStream, to: &TcpStream, finished: &AtomicBool, first: Read) -> Pumped {
    let mut pumped = Pumped {
        bytes: 0,
        first_write: None,
    };
    let copied = copy(from, to, &mut pumped, first).await;
    match copied {
        Copied::DestinationGone => {
            // Stop reading the source too.
            let _ = nix::sys::socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(from),
                nix::sys::socket::Shutdown::Read,
            );
        }
        // EOF (or a read error) from the source: pass the half-close on
        // (unless the other direction is done too).
        _ => {
            if !finished.swap(true, Ordering::Relaxed) {
                let _ = nix::sys::socket::shutdown(
                    std::os::fd::AsRawFd::as_raw_fd(to),
                    nix::sys::socket::Shutdown::Write,
                );
            }
        }
    }
    pumped
}

/// One direction `from` -> `to`, copied through the thread's buffer until
/// the source ends or the destination goes, counted in `pumped` (which
/// holds what was moved if the copy is cut short). No half-close: that is
/// the caller's (the checked session's responses).
pub(super) async fn copy_to_end(from: &TcpStream, to: &TcpStream, pumped: &mut Pumped) {
    copy(from, to, pumped, Read::WhenReady).await;
}

/// Wait until `from` is readable, then append what one read brings to
/// `buf`: the byte count (0 at the end), `None` on an error. The read goes
/// through the thread's buffer, so `buf` grows only by what came: a
/// connection holds no buffer of its own beyond the bytes it keeps.
pub(super) async fn read_appending(from: &TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        from.readable().await.ok()?;
        let read = COPY.with(|copy| {
            let mut copy = copy.borrow_mut();
            if copy.is_empty() {
                copy.resize(COPY_BUF, 0);
            }
            let n = read_draining(from, &mut copy, Read::WhenReady)?;
            buf.extend_from_slice(&copy[..n]);
            Ok::<_, std::io::Error>(n)
        });
        match read {
            Ok(n) => return Some(n),
            Err(e) if again(&e) || e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// Copy until the source ends or the destination goes.
async fn copy(from: &TcpStream, to: &TcpStream, pumped: &mut Pumped, first: Read) -> Copied {
    let mut read = first;
    loop {
        if read == Read::WhenReady && from.readable().await.is_err() {
            return Copied::End;
        }
        let step = COPY.with(|buf| {
            let mut buf = buf.borrow_mut();
            if buf.is_empty() {
                buf.resize(COPY_BUF, 0);
            }
            read_and_write(from, to, &mut buf, read)
        });
        read = Read::WhenReady;
        match step {
            Step::Again => {}
            Step::End => return Copied::End,
            Step::DestinationGone => return Copied::DestinationGone,
            Step::Wrote(n) => pumped.wrote(n),
            Step::Partial { n, left } => {
                pumped.wrote(n - left.len());
                // The send that left these said the socket is full.
                if !write_all_when_ready(to, &left).await {
                    return Copied::DestinationGone;
                }
                pumped.wrote(left.len());
            }
        }
    }
}

/// One read from `from` into `buf` and as much of it written to `to` as
/// goes without waiting.
fn read_and_write(from: &TcpStream, to: &TcpStream, buf: &mut [u8], read: Read) -> Step {
    let n = match read_draining(from, buf, read) {
        Ok(0) => return Step::End,
        Ok(n) => n,
        Err(e) if again(&e) => return Step::Again,
        Err(_) => return Step::End,
    };
    let mut written = 0;
    while written < n {
        match send_now(to, &buf[written..n]) {
            Ok(0) => return Step::DestinationGone,
            Ok(w) => written += w,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if again(&e) => {
                return Step::Partial {
                    n,
                    left: buf[written..n].to_vec(),
                }
            }
            Err(_) => return Step::DestinationGone,
        }
    }
    Step::Wrote(n)
}

/// One read from `from`; a read shorter than `buf` also forgets the
/// socket's readiness. A short read of a TCP socket emptied its receive
/// queue, and with edge-triggered epoll whatever arrives later is a new
/// event, so the next read waits for it rather than fail with EAGAIN first
/// (one system call a connection saved; tokio's own `poll_read` does the
/// same, tokio-rs/tokio#5866). A FIN already seen stays seen: tokio never
/// clears read-closed readiness. With [`Read::Now`] the read goes to the
/// kernel whatever tokio knows of the socket.
fn read_draining(from: &TcpStream, buf: &mut [u8], read: Read) -> std::io::Result<usize> {
    if read == Read::Now {
        // What tokio knows is left alone: clearing it after the call could
        // clear an event another thread's driver saw meanwhile (the
        // daemon's runtime has several), and the next read waits properly.
        return nix::unistd::read(from, buf).map_err(std::io::Error::from);
    }
    let mut short = None;
    let read = from.try_io(Interest::READABLE, || {
        let n = nix::unistd::read(from, buf).map_err(std::io::Error::from)?;
        if n > 0 && n < buf.len() {
            // WouldBlock is how try_io is told to clear the readiness.
            short = Some(n);
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (read, short) {
        (_, Some(n)) => Ok(n),
        (read, None) => read,
    }
}

/// One read from `from` at once, whatever tokio knows of its readiness.
pub(super) fn read_now(from: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    read_draining(from, buf, Read::Now)
}

/// One send(2) to `to`, whatever tokio knows of its readiness (a socket
/// with room in its send buffer takes it at once). MSG_NOSIGNAL: a
/// destination gone is an error here, never a SIGPIPE. A send that would
/// block is left to [`write_all_when_ready`], which waits the way tokio
/// keeps its readiness right.
fn send_now(to: &TcpStream, buf: &[u8]) -> std::io::Result<usize> {
    nix::sys::socket::send(
        std::os::fd::AsRawFd::as_raw_fd(to),
        buf,
        nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
    )
    .map_err(std::io::Error::from)
}

fn again(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
    )
}

/// Write all of `left`, trying at once and then waiting for room; false if
/// the destination went.
pub(super) async fn write_all(to: &TcpStream, mut left: &[u8]) -> bool {
    while !left.is_empty() {
        match send_now(to, left) {
            Ok(0) => return false,
            Ok(w) => left = &left[w..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if again(&e) => break,
            Err(_) => return false,
        }
    }
    write_all_when_ready(to, left).await
}

/// Write all of `left`, waiting for room before each try; false if the
/// destination went. `try_write` notes which readiness event it tried on
/// before its call, and clears only that one when the call would block.
async fn write_all_when_ready(to: &TcpStream, mut left: &[u8]) -> bool {
    while !left.is_empty() {
        if to.writable().await.is_err() {
            return false;
        }
        match to.try_write(left) {
            Ok(0) => return false,
            Ok(w) => left = &left[w..],
            Err(e) if again(&e) => {}
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// Two ends of one loopback TCP connection.
    async fn connected() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (a, b) = tokio::join!(
            TcpStream::connect(listener.local_addr().unwrap()),
            listener.accept()
        );
        (a.unwrap(), b.unwrap().0)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    /// The client sends `up`, the origin answers `down` once it has read
    /// all of `up`; the client reads the answer `reader_chunk` bytes at a
    /// time. Returns what each side received and what the relay counted.
    async fn exchange(
        up: Vec<u8>,
        down: Vec<u8>,
        reader_chunk: usize,
    ) -> (Vec<u8>, Vec<u8>, Relayed) {
        let (mut client, client_side) = connected().await;
        let (upstream_side, mut origin) = connected().await;
        let relay = tokio::spawn(async move { relay(&client_side, &upstream_side).await });
        let origin = tokio::spawn(async move {
            let mut got = Vec::new();
            origin.read_to_end(&mut got).await.unwrap();
            origin.write_all(&down).await.unwrap();
            origin.shutdown().await.unwrap();
            got
        });
        client.write_all(&up).await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        let mut chunk = vec![0u8; reader_chunk];
        loop {
            let n = client.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
            tokio::task::yield_now().await;
        }
        (origin.await.unwrap(), got, relay.await.unwrap())
    }

    #[tokio::test]
    async fn a_small_exchange_is_copied_both_ways() {
        let (at_origin, at_client, relayed) =
            exchange(pattern(300), pattern(1024), 64 * 1024).await;
        assert_eq!(at_origin, pattern(300));
        assert_eq!(at_client, pattern(1024));
        assert_eq!((relayed.bytes_up, relayed.bytes_down), (300, 1024));
        assert!(relayed.first_byte_down.is_some());
    }

    #[tokio::test]
    async fn a_request_and_its_end_sent_before_the_relay_starts_reach_the_origin() {
        // The relay's first read goes to the kernel at once: what the
        // client sent (and its half-close) is there already.
        let (mut client, client_side) = connected().await;
        let (upstream_side, mut origin) = connected().await;
        client.write_all(b"early request").await.unwrap();
        client.shutdown().await.unwrap();
        let relay = tokio::spawn(async move { relay(&client_side, &upstream_side).await });
        let mut got = Vec::new();
        origin.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"early request");
        origin.write_all(b"answer").await.unwrap();
        origin.shutdown().await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"answer");
        let relayed = relay.await.unwrap();
        assert_eq!((relayed.bytes_up, relayed.bytes_down), (13, 6));
    }

    #[tokio::test]
    async fn a_bulk_transfer_arrives_intact() {
        let size = 4 * 1024 * 1024 + 17;
        let (at_origin, at_client, relayed) =
            exchange(b"GET".to_vec(), pattern(size), 64 * 1024).await;
        assert_eq!(at_origin, b"GET");
        assert!(at_client == pattern(size), "the body differs");
        assert_eq!(relayed.bytes_down, size as u64);
    }

    #[tokio::test]
    async fn bulk_both_ways_to_a_slow_reader_arrives_intact() {
        let (up, down) = (pattern(1024 * 1024 + 5), pattern(3 * 1024 * 1024 + 3));
        let (at_origin, at_client, relayed) = exchange(up.clone(), down.clone(), 100).await;
        assert!(at_origin == up, "the request differs");
        assert!(at_client == down, "the response differs");
        assert_eq!(
            (relayed.bytes_up, relayed.bytes_down),
            (up.len() as u64, down.len() as u64)
        );
    }

    #[tokio::test]
    async fn a_burst_smaller_than_the_buffer_to_a_full_destination_is_written_out() {
        // Many small writes that the client does not read until the origin
        // is done: the relay's writes to it fill its socket buffers, so
        // some are only partly written and must finish later.
        let (mut client, client_side) = connected().await;
        let (upstream_side, mut origin) = connected().await;
        let relay = tokio::spawn(async move { relay(&client_side, &upstream_side).await });
        let writes = 4000;
        let piece = pattern(1000);
        let origin_done = tokio::spawn(async move {
            for _ in 0..writes {
                origin.write_all(&piece).await.unwrap();
            }
            origin.shutdown().await.unwrap();
            origin
        });
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        drop(origin_done.await.unwrap());
        assert_eq!(got.len(), writes * 1000);
        assert!(got.chunks(1000).all(|c| c == pattern(1000).as_slice()));
        assert_eq!(relay.await.unwrap().bytes_down, (writes * 1000) as u64);
    }
}
