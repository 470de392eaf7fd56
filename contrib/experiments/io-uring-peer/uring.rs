//! `sluice bench-proxy --engine io-uring`: the minimal peer of
//! [`super::peers::serve_minimal_proxy`] with every accept, connect, read,
//! write, shutdown and close submitted through one io_uring instead of
//! tokio's epoll reactor (issue 13, item 4: would io_uring cut the cost of a
//! connection?). It takes the same steps as the tokio peer, so the two
//! differ only in how the kernel is asked: getsockname and SO_ORIGINAL_DST,
//! a socket, TCP_NODELAY on both sockets, a connect, bytes copied both ways
//! through a 16 KiB buffer per direction, each EOF passed on as a
//! half-close, both sockets closed once both directions have ended.
//!
//! A measurement, not a proxy: no policy, no limits, IPv4 only, one thread.
//! Written on the io-uring crate's bindings directly: the state machine is
//! small, and a runtime on top (tokio-uring) would add its own allocations
//! per operation to what is measured.

use std::net::TcpListener;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};

const BUF: usize = 16 * 1024;
const ENTRIES: u32 = 1024;
/// The multishot accept's user data; a connection's are [`tag`]s.
const ACCEPT: u64 = u64::MAX;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Connect,
    Recv,
    Send,
    Shutdown,
    Close,
}

const OPS: [Op; 5] = [Op::Connect, Op::Recv, Op::Send, Op::Shutdown, Op::Close];

/// User data for operation `op` of direction `dir` (0: client to
/// upstream, 1: back) of the connection in `slot`.
fn tag(slot: usize, op: Op, dir: usize) -> u64 {
    let op = OPS.iter().position(|o| *o == op).expect("listed") as u64;
    ((slot as u64) << 8) | (op << 1) | dir as u64
}

fn untag(data: u64) -> (usize, Op, usize) {
    let op = OPS[((data >> 1) & 0x7f) as usize % OPS.len()];
    ((data >> 8) as usize, op, (data & 1) as usize)
}

/// One direction: reads from its source, writes what it read to the other
/// socket.
struct Direction {
    buf: Box<[u8]>,
    len: usize,
    sent: usize,
    ended: bool,
}

struct Conn {
    /// 0: the client, 1: upstream. Direction `d` reads `fds[d]` and writes
    /// `fds[1 - d]`. Taken when closed.
    fds: [Option<OwnedFd>; 2],
    /// The connect's address; boxed, so it stays put while the kernel reads it.
    addr: Box<libc::sockaddr_in>,
    dirs: [Direction; 2],
    /// Operations submitted and not yet completed: the buffers and the
    /// address are freed only when this is zero.
    inflight: u32,
    failed: bool,
    closing: bool,
}

struct Proxy {
    slots: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Entries to submit, in order.
    pending: Vec<squeue::Entry>,
    listener: i32,
}

impl Proxy {
    fn accept(&mut self) {
        self.pending.push(
            opcode::AcceptMulti::new(types::Fd(self.listener))
                .build()
                .user_data(ACCEPT),
        );
    }

    /// A new client: find where it was going and start the connect there.
    fn accepted(&mut self, client: OwnedFd) {
        // What the tokio peer asks too (its local_addr, then the original
        // destination).
        if socket::getsockname::<SockaddrIn>(client.as_raw_fd()).is_err() {
            return;
        }
        let Ok(dst) = socket::getsockopt(&client, sockopt::OriginalDst) else {
            return;
        };
        let Ok(upstream) = socket::socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        ) else {
            return;
        };
        let _ = socket::setsockopt(&client, sockopt::TcpNoDelay, &true);
        let _ = socket::setsockopt(&upstream, sockopt::TcpNoDelay, &true);
        let direction = || Direction {
            buf: vec![0; BUF].into_boxed_slice(),
            len: 0,
            sent: 0,
            ended: false,
        };
        let conn = Conn {
            fds: [Some(client), Some(upstream)],
            addr: Box::new(dst),
            dirs: [direction(), direction()],
            inflight: 0,
            failed: false,
            closing: false,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(conn);
                slot
            }
            None => {
                self.slots.push(Some(conn));
                self.slots.len() - 1
            }
        };
        let conn = self.slots[slot].as_mut().expect("just put");
        let entry = opcode::Connect::new(
            conn_fd(&conn.fds, 1),
            (&*conn.addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
        .build()
        .user_data(tag(slot, Op::Connect, 0));
        conn.inflight += 1;
        self.pending.push(entry);
    }

    fn completed(&mut self, data: u64, res: i32) {
        let (slot, op, dir) = untag(data);
        let Proxy {
            slots,
            free,
            pending: next,
            ..
        } = self;
        let Some(conn) = slots.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        conn.inflight -= 1;
        let queued = next.len();
        if !conn.failed && !conn.closing {
            match op {
                Op::Connect if res < 0 => fail(conn),
                Op::Connect => {
                    for d in 0..2 {
                        next.push(recv(conn, slot, d));
                    }
                }
                Op::Recv if res < 0 => fail(conn),
                Op::Recv if res == 0 => next.push(
                    opcode::Shutdown::new(conn_fd(&conn.fds, 1 - dir), libc::SHUT_WR)
                        .build()
                        .user_data(tag(slot, Op::Shutdown, dir)),
                ),
                Op::Recv => {
                    conn.dirs[dir].len = res as usize;
                    conn.dirs[dir].sent = 0;
                    next.push(send(conn, slot, dir));
                }
                Op::Send if res < 0 => fail(conn),
                Op::Send => {
                    let d = &mut conn.dirs[dir];
                    d.sent += res as usize;
                    next.push(if d.sent < d.len {
                        send(conn, slot, dir)
                    } else {
                        recv(conn, slot, dir)
                    });
                }
                Op::Shutdown => conn.dirs[dir].ended = true,
                Op::Close => {}
            }
        }
        conn.inflight += (next.len() - queued) as u32;
        let done = conn.failed || conn.dirs.iter().all(|d| d.ended);
        if done && conn.inflight == 0 {
            if conn.closing {
                slots[slot] = None;
                free.push(slot);
                return;
            }
            conn.closing = true;
            for (i, fd) in conn.fds.iter_mut().enumerate() {
                if let Some(fd) = fd.take() {
                    conn.inflight += 1;
                    next.push(
                        opcode::Close::new(types::Fd(fd.into_raw_fd()))
                            .build()
                            .user_data(tag(slot, Op::Close, i)),
                    );
                }
            }
        }
    }
}

fn recv(conn: &mut Conn, slot: usize, dir: usize) -> squeue::Entry {
    let buf = &mut conn.dirs[dir].buf;
    opcode::Recv::new(conn_fd(&conn.fds, dir), buf.as_mut_ptr(), buf.len() as u32)
        .build()
        .user_data(tag(slot, Op::Recv, dir))
}

fn send(conn: &Conn, slot: usize, dir: usize) -> squeue::Entry {
    let d = &conn.dirs[dir];
    let left = &d.buf[d.sent..d.len];
    opcode::Send::new(
        conn_fd(&conn.fds, 1 - dir),
        left.as_ptr(),
        left.len() as u32,
    )
    .build()
    .user_data(tag(slot, Op::Send, dir))
}

fn conn_fd(fds: &[Option<OwnedFd>; 2], i: usize) -> types::Fd {
    types::Fd(fds[i].as_ref().map_or(-1, |fd| fd.as_raw_fd()))
}

/// Stop both sockets, so that every operation still pending on them
/// completes; the connection is closed once the last one has.
fn fail(conn: &mut Conn) {
    conn.failed = true;
    for fd in conn.fds.iter().flatten() {
        let _ = socket::shutdown(fd.as_raw_fd(), socket::Shutdown::Both);
    }
}

/// One io_uring, set up before the proxy says it is ready.
pub(crate) struct Ring(IoUring);

impl Ring {
    pub(crate) fn new() -> anyhow::Result<Ring> {
        use anyhow::Context;
        IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(ENTRIES)
            .map(Ring)
            .context("cannot set up an io_uring (kernel.io_uring_disabled may forbid it)")
    }

    /// Serve `listener` (listening in the redirected namespace) until the
    /// process exits.
    pub(crate) fn serve(self, listener: TcpListener) -> anyhow::Result<()> {
        serve(self.0, &listener)
    }
}

/// Why the io_uring peer cannot run here, if it cannot.
pub(crate) fn unavailable() -> Option<String> {
    Ring::new().err().map(|e| format!("{e:#}"))
}

fn serve(mut ring: IoUring, listener: &TcpListener) -> anyhow::Result<()> {
    use anyhow::Context;
    let mut proxy = Proxy {
        slots: Vec::new(),
        free: Vec::new(),
        pending: Vec::new(),
        listener: listener.as_raw_fd(),
    };
    proxy.accept();
    let mut completions: Vec<(u64, i32, u32)> = Vec::new();
    loop {
        for entry in proxy.pending.drain(..) {
            // SAFETY: every pointer in an entry (a buffer, an address) is
            // inside a boxed allocation of its connection, which is freed
            // only when its count of operations in flight is back to zero,
            // that is once the kernel has completed every entry using it.
            while unsafe { ring.submission().push(&entry) }.is_err() {
                ring.submit().context("io_uring submit")?;
            }
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e).context("io_uring wait"),
        }
        completions.extend(
            ring.completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for (data, res, flags) in completions.drain(..) {
            if data == ACCEPT {
                if res >= 0 {
                    // SAFETY: a successful accept's result is a new
                    // descriptor, ours alone.
                    let client = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(res) };
                    proxy.accepted(client);
                }
                if !cqueue::more(flags) {
                    proxy.accept();
                }
            } else {
                proxy.completed(data, res);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_names_its_slot_operation_and_direction() {
        for slot in [0, 1, 4095, 1 << 40] {
            for op in OPS {
                for dir in 0..2 {
                    assert_eq!(untag(tag(slot, op, dir)), (slot, op, dir));
                }
            }
        }
        assert_ne!(tag(usize::MAX >> 8, Op::Close, 1), ACCEPT);
    }
}
