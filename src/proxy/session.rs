//! The relay of a plain-HTTP connection whose every request is decided on
//! its own Host: one a hosts rule admitted (or where a deny rule with
//! `hosts` covers the port), so that a kept-alive connection cannot carry a
//! second request for another name to the same address. Client to origin,
//! each request head is read (bounded like the peek), framed
//! ([`super::http1`]) and decided ([`super::decide`]); it and its body
//! (Content-Length or chunked) are then passed on unchanged, pipelined
//! requests included. A request that is denied, or that cannot be framed
//! safely, is not passed on: the origin gets the end of the stream, the
//! client the responses to the requests before it and then a 403 (or 400)
//! naming why, and the connection closes. Origin to client is copied as it
//! comes. Connections admitted by their address alone never come here: they
//! keep the plain relay (`relay`).
//!
//! Each head is bounded in size (the peek's limit: past it a 431) and in
//! time (the policy's `limits.request_head_seconds` from its first byte:
//! past it a 408). The session holds no buffer of its own beyond the bytes
//! it keeps: reads go through the relay's per-thread buffer.
//!
//! In audit mode a request that would be denied is audited `would-deny`
//! and passed on; one that cannot be framed is audited and the rest of the
//! connection is relayed unchecked.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::connection::{audit, reply_and_close, reply_forbidden};
use super::decide::decide;
use super::http1::{self, Body, Chunked, Refusal};
use super::peek::{inspect, skip_blank_lines, Peeked};
use super::relay::{copy_to_end, read_appending, write_all, Pumped, Relayed};
use super::ProxyContext;
use crate::outcome::{Cause, DenyReason, Outcome, Verdict};

/// A buffer emptied in the middle of a request (a body passed on piece by
/// piece) of a larger capacity than this is given back. Between requests
/// none is kept ([`next_request_starts`]).
const KEPT_CAPACITY: usize = 4 * 1024;
/// How long the origin gets, once a request was refused, to finish the
/// responses to the requests before it.
pub(crate) const FINISH_GRACE: Duration = Duration::from_secs(5);

/// True if an allowed connection whose first bytes are `first` (a complete
/// HTTP request head if `http`) takes this path, once the policy says its
/// requests are decided on their own Host: a complete head, or the start of
/// one that the peek did not see end (a slow or padded first request, or
/// only the empty lines an origin skips before one).
pub(super) fn applies(first: &[u8], http: bool) -> bool {
    let request = skip_blank_lines(first);
    http || (!first.is_empty() && request.is_empty())
        || (request.first().is_some_and(u8::is_ascii_uppercase)
            && inspect(request) == Peeked::NeedMore)
}

/// One connection on this path.
pub(super) struct Checked<'c> {
    pub(crate) ctx: &'c ProxyContext,
    pub(crate) peer: SocketAddr,
    pub(crate) dst: SocketAddr,
    /// The name the connection was decided on.
    pub(crate) host: Option<String>,
    /// The first request head in `first` was decided already (the peek saw
    /// all of it).
    pub(crate) first_decided: bool,
    /// How long a request head may take, from its first byte (the first
    /// request's: from `accepted`).
    pub(crate) head_limit: Duration,
    pub(crate) accepted: tokio::time::Instant,
}

/// How the requests ended.
enum End {
    /// The client closed (or failed), or the origin stopped reading.
    Closed,
    /// A request was refused (a deny, or one that cannot be framed
    /// safely): the connection ends so.
    Refused(Ended),
}

/// A request's outcome that became the connection's, with the name that
/// request was decided on.
pub(super) struct Ended {
    pub(crate) outcome: Outcome,
    pub(crate) host: Option<String>,
}

/// Relay `client` and `upstream` (connected, nothing sent yet), `first`
/// being the bytes the peek read. Returns what was relayed and, if a
/// request changed the connection's outcome (refused, or would-deny in
/// audit mode), the new one and the name it was decided on.
pub(super) async fn relay(
    client: TcpStream,
    upstream: TcpStream,
    first: Vec<u8>,
    checked: Checked<'_>,
) -> (Relayed, Option<Ended>) {
    let refusing = AtomicBool::new(false);
    let stop = Notify::new();
    let mut bytes_up = 0u64;
    let mut noted = None;
    let (end, down) = {
        let up = async {
            let end = requests(
                &client,
                &upstream,
                first,
                &checked,
                &mut bytes_up,
                &mut noted,
            )
            .await;
            if !matches!(end, End::Closed) {
                refusing.store(true, Ordering::Relaxed);
                stop.notify_one();
            }
            // The origin sees the end of the stream, finishes what it was
            // asked and (typically) closes.
            half_close(&upstream);
            end
        };
        let down = responses(&upstream, &client, &refusing, &stop);
        tokio::join!(up, down)
    };
    drop(upstream);
    let ended = match end {
        End::Closed => noted,
        End::Refused(ended) => {
            match ended.outcome.cause {
                Cause::Denied(DenyReason::Request(refusal)) => reply_refused(client, refusal).await,
                _ => reply_forbidden(client, &ended.outcome).await,
            }
            Some(ended)
        }
    };
    let relayed = Relayed {
        bytes_up,
        bytes_down: down.bytes,
        first_byte_down: down.first_write,
    };
    (relayed, ended)
}

/// Shut down the write side of `to`: it sees the end of the stream.
fn half_close(to: &TcpStream) {
    let _ = nix::sys::socket::shutdown(
        std::os::fd::AsRawFd::as_raw_fd(to),
        nix::sys::socket::Shutdown::Write,
    );
}

/// Client to origin, request by request, until the client closes or a
/// request is refused. A would-deny (audit mode) is noted in `noted`.
async fn requests(
    from_client: &TcpStream,
    to_origin: &TcpStream,
    mut buf: Vec<u8>,
    c: &Checked<'_>,
    sent: &mut u64,
    noted: &mut Option<Ended>,
) -> End {
    let limit = c.ctx.limits.peek_bytes;
    let mut decided = c.first_decided;
    // The first head began at accept at the latest.
    let mut deadline = c.accepted + c.head_limit;
    loop {
        if buf.is_empty() {
            // Between requests the client may be reading a long response:
            // the next head's deadline starts with its first byte.
            if !next_request_starts(from_client, &mut buf).await {
                return End::Closed;
            }
            deadline = tokio::time::Instant::now() + c.head_limit;
        }
        let head = tokio::time::timeout_at(deadline, next_head(from_client, &mut buf, limit)).await;
        let host = match head {
            Ok(Ok(Some(host))) => host,
            Ok(Ok(None)) => return End::Closed,
            Ok(Err(refusal)) => return refuse(c, refusal, from_client, to_origin, buf, sent).await,
            Err(_) => {
                return refuse(c, Refusal::HeadTimeout, from_client, to_origin, buf, sent).await
            }
        };
        if !std::mem::take(&mut decided) {
            let host = host.or_else(|| c.ctx.resolver.name_for(c.dst.ip()));
            if let Some(denied) = decide_request(c, host, noted).await {
                return denied;
            }
        }
        let request = match http1::request(&buf) {
            Ok(request) => request,
            Err(refusal) => return refuse(c, refusal, from_client, to_origin, buf, sent).await,
        };
        if !send(to_origin, &mut buf, request.head_len, sent).await {
            return End::Closed;
        }
        let body = match request.body {
            Body::None => Ok(true),
            Body::Length(n) => send_length(from_client, to_origin, &mut buf, n, sent).await,
            Body::Chunked => send_chunked(from_client, to_origin, &mut buf, sent).await,
        };
        match body {
            Ok(true) => {}
            Ok(false) => return End::Closed,
            Err(refusal) => return refuse(c, refusal, from_client, to_origin, buf, sent).await,
        }
        // A pipelined request's head is already here: its deadline starts now.
        deadline = tokio::time::Instant::now() + c.head_limit;
    }
}

/// Wait for the first bytes of the next request; false if the client
/// closed (or failed) first. While it waits the session holds no buffer:
/// the one it had (the peek's, 4 KiB, or the last request's) is given back
/// first, so that a connection idle in keep-alive holds what the plain
/// relay holds, and the next read allocates only what came.
async fn next_request_starts(from_client: &TcpStream, buf: &mut Vec<u8>) -> bool {
    if buf.capacity() > 0 {
        *buf = Vec::new();
    }
    matches!(fill(from_client, buf).await, Some(1..))
}

/// Skip the empty lines before a request (RFC 9112 section 2.2; they are
/// not passed on), then read its head, as [`read_head`].
async fn next_head(
    from_client: &TcpStream,
    buf: &mut Vec<u8>,
    limit: usize,
) -> Result<Option<Option<String>>, Refusal> {
    loop {
        let blank = buf.len() - skip_blank_lines(buf).len();
        buf.drain(..blank);
        if !buf.is_empty() {
            break;
        }
        if !matches!(fill(from_client, buf).await, Some(1..)) {
            return Ok(None);
        }
    }
    read_head(from_client, buf, limit).await
}

/// Decide one later request on `host`; `Some` ends the connection.
async fn decide_request(
    c: &Checked<'_>,
    host: Option<String>,
    noted: &mut Option<Ended>,
) -> Option<End> {
    let ctx = c.ctx;
    let policy = ctx.policy.current();
    let decision = decide(ctx, &policy, c.dst, host.as_deref()).await;
    let outcome = Outcome::decided(&decision, policy.mode());
    let changed = host != c.host;
    let allowed = outcome.verdict == Verdict::Allow;
    if !allowed || (ctx.audit_allows && changed) {
        tracing::debug!(peer = %c.peer, dst = %c.dst, ?host, rule = ?outcome.rule, reason = outcome.reason(), "request {}", outcome.verdict);
        let label = policy.label();
        audit(ctx, label, c.peer, Some(c.dst), &outcome, host.clone()).await;
    }
    if allowed {
        return None;
    }
    let ended = Ended { outcome, host };
    if ended.outcome.is_denied() {
        return Some(End::Refused(ended));
    }
    *noted = Some(ended);
    None
}

/// A request that cannot be framed: refused in enforce mode; in audit mode
/// recorded, and the rest of the connection is relayed as it comes.
async fn refuse(
    c: &Checked<'_>,
    refusal: Refusal,
    from_client: &TcpStream,
    to_origin: &TcpStream,
    mut buf: Vec<u8>,
    sent: &mut u64,
) -> End {
    let policy = c.ctx.policy.current();
    let outcome = Outcome::refused(refusal, policy.mode());
    tracing::debug!(peer = %c.peer, dst = %c.dst, reason = refusal.as_str(), "request {}", outcome.verdict);
    audit(
        c.ctx,
        policy.label(),
        c.peer,
        Some(c.dst),
        &outcome,
        c.host.clone(),
    )
    .await;
    drop(policy);
    if outcome.is_denied() {
        return End::Refused(Ended {
            outcome,
            host: c.host.clone(),
        });
    }
    loop {
        let len = buf.len();
        if !send(to_origin, &mut buf, len, sent).await {
            return End::Closed;
        }
        if !matches!(fill(from_client, &mut buf).await, Some(1..)) {
            return End::Closed;
        }
    }
}

/// Read until `buf` starts with a complete request head: `Ok(Some(host))`
/// with the Host it names (lowercased, if any), `Ok(None)` if the client
/// closed first (what it sent of a head is not passed on).
async fn read_head(
    from_client: &TcpStream,
    buf: &mut Vec<u8>,
    limit: usize,
) -> Result<Option<Option<String>>, Refusal> {
    // Bytes already looked at: `inspect` reads the head from its start, so
    // calling it after every read of a head sent a byte at a time would cost
    // time quadratic in the head's length. It is called only while the
    // method may still be undecided and once a read brought the head's end
    // (an empty line), which keeps the whole read linear.
    let mut seen = 0usize;
    loop {
        if !buf.is_empty() && (seen < METHOD_DECIDED || ends_after(buf, seen)) {
            match inspect(buf) {
                Peeked::NeedMore => {}
                Peeked::Http { host } => return Ok(Some(host.map(str::to_ascii_lowercase))),
                Peeked::Unreadable { .. } => return Err(Refusal::UnreadableHost),
                Peeked::Tls { .. } | Peeked::Other => return Err(Refusal::NotRequest),
            }
        }
        if buf.len() >= limit {
            return Err(Refusal::HeadTooLarge);
        }
        seen = buf.len();
        if !matches!(fill(from_client, buf).await, Some(1..)) {
            return Ok(None);
        }
    }
}

/// Bytes after which `inspect` has decided whether a head's method is one
/// (the longest method and its space fit in them).
const METHOD_DECIDED: usize = 8;

/// True if the bytes of `buf` after the first `seen` complete an empty line
/// (`\n\n` or `\n\r\n`), the end of a head that began before them.
fn ends_after(buf: &[u8], seen: usize) -> bool {
    buf[seen.saturating_sub(1)..]
        .windows(2)
        .any(|w| w == b"\n\n")
        || buf[seen.saturating_sub(2)..]
            .windows(3)
            .any(|w| w == b"\n\r\n")
}

/// Pass on the first `n` bytes of `buf`; false if the origin is gone.
async fn send(to_origin: &TcpStream, buf: &mut Vec<u8>, n: usize, sent: &mut u64) -> bool {
    if n == 0 {
        return true;
    }
    if !write_all(to_origin, &buf[..n]).await {
        return false;
    }
    *sent += n as u64;
    buf.drain(..n);
    if buf.is_empty() && buf.capacity() > KEPT_CAPACITY {
        *buf = Vec::new();
    }
    true
}

/// Pass on a body of `left` bytes; `Ok(false)` if either side closed first.
async fn send_length(
    from_client: &TcpStream,
    to_origin: &TcpStream,
    buf: &mut Vec<u8>,
    mut left: u64,
    sent: &mut u64,
) -> Result<bool, Refusal> {
    loop {
        let take = left.min(buf.len() as u64) as usize;
        if !send(to_origin, buf, take, sent).await {
            return Ok(false);
        }
        left -= take as u64;
        if left == 0 {
            return Ok(true);
        }
        if !matches!(fill(from_client, buf).await, Some(1..)) {
            return Ok(false);
        }
    }
}

/// Pass on a chunked body up to its end; `Ok(false)` if either side closed
/// first.
async fn send_chunked(
    from_client: &TcpStream,
    to_origin: &TcpStream,
    buf: &mut Vec<u8>,
    sent: &mut u64,
) -> Result<bool, Refusal> {
    let mut body = Chunked::default();
    loop {
        let progress = body.advance(buf)?;
        if !send(to_origin, buf, progress.consumed, sent).await {
            return Ok(false);
        }
        if progress.done {
            return Ok(true);
        }
        if !matches!(fill(from_client, buf).await, Some(1..)) {
            return Ok(false);
        }
    }
}

/// Read what the client sent next onto the end of `buf`: the byte count,
/// `None` on an error. `buf` grows only by what came.
async fn fill(from_client: &TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    read_appending(from_client, buf).await
}

/// Origin to client, as it comes, until the origin closes; once a request
/// was refused (`stop`), for at most [`FINISH_GRACE`] more. The client's
/// side is half-closed at the end unless a refusal is still to be written.
/// The copy goes through the thread's buffer, as the plain relay's.
async fn responses(
    from_origin: &TcpStream,
    to_client: &TcpStream,
    refusing: &AtomicBool,
    stop: &Notify,
) -> Pumped {
    let mut pumped = Pumped::default();
    {
        let copying = copy_to_end(from_origin, to_client, &mut pumped);
        tokio::pin!(copying);
        let stopped = tokio::select! {
            _ = &mut copying => false,
            _ = stop.notified() => true,
        };
        if stopped {
            let _ = tokio::time::timeout(FINISH_GRACE, &mut copying).await;
        }
    }
    if !refusing.load(Ordering::Relaxed) {
        half_close(to_client);
    }
    pumped
}

/// A request sluice will not relay gets a readable answer (400, or 431 for
/// a head too large, 408 for one too slow), then the end.
async fn reply_refused(client: TcpStream, refusal: Refusal) {
    let body = format!(
        "sluice: refused a request it cannot relay safely on a connection whose every request is checked ({})\n",
        refusal.as_str()
    );
    reply_and_close(client, refusal.status(), refusal.as_str(), &body).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::io::AsyncWriteExt;

    /// The peek's buffer (4 KiB, the first request passed on from it) is
    /// not kept while the session waits for the next request: what the
    /// next read brings is all it holds.
    #[tokio::test(flavor = "current_thread")]
    async fn a_session_waiting_for_its_next_request_keeps_no_buffer_from_the_last() {
        let (mut client, from_client) = pair().await;
        let head = b"GET /next HTTP/1.1\r\nHost: origin.test\r\n\r\n";
        let mut buf = Vec::with_capacity(4096);
        let (started, ()) = tokio::join!(next_request_starts(&from_client, &mut buf), async {
            client.write_all(head).await.unwrap();
        });
        assert!(started);
        assert!(!buf.is_empty() && head.starts_with(&buf));
        assert!(
            buf.capacity() <= 2 * head.len(),
            "waiting for a {}-byte head kept {} bytes of buffer",
            head.len(),
            buf.capacity()
        );
        drop(client);
        let mut buf = Vec::with_capacity(4096);
        let mut rest = Vec::new();
        while matches!(fill(&from_client, &mut rest).await, Some(1..)) {}
        assert!(!next_request_starts(&from_client, &mut buf).await);
        assert_eq!(buf.capacity(), 0, "a closed connection kept its buffer");
    }

    /// A connected pair of loopback sockets: (the end that writes, the end
    /// that reads).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (far, _) = listener.accept().await.unwrap();
        (near, far)
    }

    /// The bytes a checked session keeps, by the ends of what it does with
    /// a request: a read grows its buffer by what came (not by a chunk
    /// reserved ahead, as the two 64 KiB buffers it once held), and a
    /// request passed on leaves it empty and, past `KEPT_CAPACITY`, freed,
    /// so that a connection idle in keep-alive holds no buffer worth
    /// counting beside its two sockets (the plain relay's state).
    #[tokio::test(flavor = "current_thread")]
    async fn a_checked_session_keeps_only_the_bytes_it_holds_and_none_once_idle() {
        let (mut client, from_client) = pair().await;
        let (to_origin, mut origin) = pair().await;
        let head = b"GET / HTTP/1.1\r\nHost: origin.test\r\n\r\n";
        client.write_all(head).await.unwrap();
        let mut buf = Vec::new();
        let mut got = 0;
        while got < head.len() {
            got += fill(&from_client, &mut buf).await.unwrap();
        }
        assert_eq!(buf, head);
        assert!(
            buf.capacity() <= 2 * head.len(),
            "a {}-byte head took {} bytes of buffer",
            head.len(),
            buf.capacity()
        );
        let mut sent = 0;
        assert!(send(&to_origin, &mut buf, head.len(), &mut sent).await);
        assert!(buf.is_empty() && buf.capacity() <= KEPT_CAPACITY);

        // A head near the peek's limit: once passed on, its buffer goes.
        let big = vec![b'a'; 3 * KEPT_CAPACITY];
        let mut buf = big.clone();
        let writing = async { send(&to_origin, &mut buf, big.len(), &mut sent).await };
        let reading = async {
            let mut seen = vec![0u8; big.len() + head.len()];
            tokio::io::AsyncReadExt::read_exact(&mut origin, &mut seen)
                .await
                .unwrap();
        };
        let (written, ()) = tokio::join!(writing, reading);
        assert!(written);
        assert_eq!(
            (buf.len(), buf.capacity()),
            (0, 0),
            "an idle session still holds its last head's buffer"
        );
        assert_eq!(sent, (head.len() + big.len()) as u64);
    }

    /// Remembers nothing, confirms nothing.
    struct NoHistory;

    impl crate::policy::ResolvedNames for NoHistory {
        fn resolved(&self, _: &str, _: std::net::IpAddr) -> bool {
            false
        }
    }

    impl super::super::Resolver for NoHistory {
        fn name_for(&self, _: std::net::IpAddr) -> Option<String> {
            None
        }
    }

    /// The most a checked session's future (its state between polls, kept
    /// in the connection's task for as long as the connection lives) may
    /// take, and the most the whole connection's future, which holds it,
    /// may take. Measured at 2,544 and 3,304 bytes in a test (debug) build
    /// at 1269de3; a growing future is a silent memory cost per held
    /// connection. Its buffers are on the heap, pinned by the test above.
    const SESSION_FUTURE_MOST: usize = 3 * 1024;
    const CONNECTION_FUTURE_MOST: usize = 4 * 1024;

    #[tokio::test(flavor = "current_thread")]
    async fn a_checked_session_and_its_connection_task_stay_within_their_sizes() {
        let policy = crate::policy::Policy::from_yaml(
            "version: 1\nname: t\nrules:\n  - name: o\n    action: allow\n    hosts: [\"origin.test\"]\n",
            "t.yaml",
        )
        .unwrap();
        let (audit, _writer) = crate::audit::AuditWriter::new(None);
        let ctx = ProxyContext::new(
            crate::bundle::PolicyHandle::new(policy, "t@1".to_string()),
            std::sync::Arc::new(NoHistory),
            audit,
            "sb".to_string(),
            crate::workload::WorkloadPath::Host,
            super::super::Limits::default(),
        );
        let (client, _client_end) = pair().await;
        let (upstream, _origin) = pair().await;
        let peer = client.peer_addr().unwrap();
        let dst = upstream.peer_addr().unwrap();
        let checked = Checked {
            ctx: &ctx,
            peer,
            dst,
            host: Some("origin.test".to_string()),
            first_decided: true,
            head_limit: Duration::from_secs(10),
            accepted: tokio::time::Instant::now(),
        };
        let session = relay(client, upstream, Vec::new(), checked);
        let session_size = std::mem::size_of_val(&session);
        drop(session);
        let (client, _client_end) = pair().await;
        let connection = super::super::connection::serve(client, peer, dst, &ctx);
        let connection_size = std::mem::size_of_val(&connection);
        drop(connection);
        assert!(
            session_size <= SESSION_FUTURE_MOST,
            "a checked session's future grew to {session_size} bytes (at most {SESSION_FUTURE_MOST})"
        );
        assert!(
            connection_size <= CONNECTION_FUTURE_MOST,
            "a connection's future grew to {connection_size} bytes (at most {CONNECTION_FUTURE_MOST})"
        );
    }

    #[test]
    fn a_head_end_is_seen_in_the_read_that_completes_it_however_the_head_is_split() {
        for head in [
            &b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"[..],
            b"GET / HTTP/1.1\nHost: a.test\n\n",
        ] {
            for seen in 0..head.len() {
                // One read brings head[seen..], the end among it.
                assert!(ends_after(head, seen), "split at {seen}");
                // A read that stops short of the end does not bring it.
                for end in seen + 1..head.len() {
                    assert!(!ends_after(&head[..end], seen), "end seen in {seen}..{end}");
                }
            }
        }
    }

    #[test]
    fn lines_of_a_head_do_not_look_like_its_end() {
        let partial = b"GET / HTTP/1.1\r\nA: b\r\n\rC: d\r\n";
        for seen in 0..partial.len() {
            assert!(!ends_after(partial, seen), "at {seen}");
        }
    }
}
