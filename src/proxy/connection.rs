//! One redirected connection, from accept to close: the peek, the
//! decision, the upstream connect, the relay, and the connection's one
//! [`Outcome`], which its [`Record`] turns into the metrics and the timing
//! record when it ends and [`audit`] into its audit record. It never
//! formats a verdict or a reason itself (`crate::outcome` does), and never
//! lets a denied connection's bytes reach the origin.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::decide::decide;
use super::peek::{inspect, Peeked, TLS_HANDSHAKE};
use super::relay::{read_now, relay, write_all, Relayed};
use super::upstream::connect_upstream;
use super::{l7, original_dst, session, ProxyContext};
use crate::audit::{AuditEvent, Flow};
use crate::bundle::ActivePolicy;
use crate::metrics::{ConnectionMetrics, PathMetrics};
use crate::outcome::{Cause, DenyReason, Outcome, UpstreamFailure, Verdict};
use crate::policy::{Mode, Reason};
use crate::timing::ConnectionClock;

/// What the first bytes told us, kept only as long as the decision needs.
#[derive(Default)]
struct FirstBytes {
    buf: Vec<u8>,
    host: Option<String>,
    http: bool,
    /// They name a host that cannot be read for certain: denied.
    unreadable: bool,
    /// The client sent nothing before the peek's deadline.
    silent: bool,
}

/// The one place a connection's records are made (metrics and timing), on
/// drop, from its one [`Outcome`], so connections that end early, fail or
/// are cut at shutdown are recorded exactly once too, and every record
/// says the same (ztunnel's `ConnectionResult`). The audit record of the
/// same outcome is written where it is decided ([`audit`]).
struct Record<'c> {
    ctx: &'c ProxyContext,
    clock: ConnectionClock,
    metrics: Option<ConnectionMetrics>,
    dst: SocketAddr,
    host: Option<String>,
    outcome: Outcome,
    /// The connection reached its end by itself (not cut at the drain).
    finished: bool,
    relayed: Relayed,
}

impl<'c> Record<'c> {
    fn start(ctx: &'c ProxyContext, dst: SocketAddr) -> Record<'c> {
        Record {
            ctx,
            clock: ConnectionClock::start(),
            metrics: ctx.metrics.as_ref().map(PathMetrics::opened),
            dst,
            host: None,
            // What a connection cut before its decision reports.
            outcome: Outcome {
                verdict: Verdict::Deny,
                rule: None,
                cause: Cause::Drained,
            },
            finished: false,
            relayed: Relayed::default(),
        }
    }

    /// The connection is decided (a later decision replaces an earlier).
    fn decided(&mut self, outcome: Outcome, host: Option<String>) {
        self.outcome = outcome;
        self.host = host;
        self.clock.decided();
    }

    /// It ends here, as `outcome` says.
    fn ended(&mut self, outcome: Outcome) {
        self.outcome = outcome;
        self.finished = true;
    }

    /// When it was accepted, on tokio's clock.
    fn accepted(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() - self.clock.elapsed()
    }

    fn connected(&mut self) {
        let since = self.clock.connected();
        if let Some(m) = self.metrics.as_ref() {
            m.connected(since);
        }
    }

    /// A terminated connection ended, as `served` says.
    fn served(&mut self, served: l7::Served) {
        if served.connected {
            self.connected();
        }
        if let Some(outcome) = served.outcome {
            self.outcome = outcome;
        }
        self.relayed(Relayed {
            bytes_up: served.bytes_up,
            bytes_down: served.bytes_down,
            first_byte_down: served.first_byte_down,
        });
    }

    /// What a checked session starts from: the connection as decided so
    /// far.
    fn checked_session(
        &self,
        peer: SocketAddr,
        first: &FirstBytes,
        head_limit: Duration,
    ) -> session::Checked<'c> {
        session::Checked {
            ctx: self.ctx,
            peer,
            dst: self.dst,
            host: self.host.clone(),
            first_decided: first.http && !first.unreadable,
            head_limit,
            accepted: self.accepted(),
        }
    }

    /// A checked session ended; a request that changed the connection's
    /// outcome (refused, or would-deny in audit mode) leaves it, with the
    /// name that request was decided on.
    fn session_ended(&mut self, relayed: Relayed, ended: Option<session::Ended>) {
        if let Some(ended) = ended {
            self.outcome = ended.outcome;
            self.host = ended.host;
        }
        self.relayed(relayed);
    }

    fn relayed(&mut self, relayed: Relayed) {
        self.relayed = relayed;
        self.finished = true;
        if let Some(at) = relayed.first_byte_down {
            let since = self.clock.first_byte_at(at);
            if let Some(m) = self.metrics.as_ref() {
                m.first_byte(since);
            }
        }
    }
}

impl Drop for Record<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.outcome.ended_by(Cause::Drained);
        }
        let (up, down) = (self.relayed.bytes_up, self.relayed.bytes_down);
        if let Some(m) = self.metrics.take() {
            m.ended(&self.outcome, up, down);
        }
        if self.ctx.timings.is_enabled() {
            let id = self.ctx.next_id.fetch_add(1, Ordering::Relaxed);
            let mut record = self.clock.record(
                id,
                &self.ctx.sandbox,
                self.ctx.path.as_str(),
                self.dst,
                self.host.as_deref(),
                &self.outcome,
            );
            record.bytes_up = up;
            record.bytes_down = down;
            self.ctx.timings.submit(record);
        }
    }
}

/// Serve a connection accepted on a listener bound to `bound` (`None`: a
/// wildcard listener, whose sockets are asked for their own address).
pub(super) async fn handle(
    client: TcpStream,
    peer: SocketAddr,
    bound: Option<SocketAddr>,
    ctx: &ProxyContext,
) {
    // Without a redirect there is no NAT entry; conntrack then reports the
    // listener's own address (or nothing) as the original destination.
    let local = bound.unwrap_or_else(|| {
        client
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    });
    let dst = match original_dst(&client, local) {
        Ok(dst) if dst != local => dst,
        _ => {
            // Not redirected by our rules: someone connected straight to the
            // listener. There is no destination to decide on.
            tracing::warn!(%peer, "connection straight to sluice's listener (no original destination): refused");
            let mut record = Record::start(ctx, local);
            let outcome = Outcome::refused(DenyReason::NoOriginalDestination, Mode::Enforce);
            audit(
                ctx,
                ctx.policy.current().label(),
                peer,
                Some(local),
                &outcome,
                None,
            )
            .await;
            record.decided(outcome, None);
            record.finished = true;
            reset(client);
            return;
        }
    };
    serve(client, peer, dst, ctx).await;
}

/// Decide and relay a connection from `peer` whose original destination is
/// `dst`.
pub(super) async fn serve(
    mut client: TcpStream,
    peer: SocketAddr,
    dst: SocketAddr,
    ctx: &ProxyContext,
) {
    let mut record = Record::start(ctx, dst);
    // One policy decides whether to peek and what the peek saw, even if a
    // reload swaps it meanwhile. It is kept (an Arc, no copy) until the
    // allowed connection's record names it, and dropped before the relay.
    let mut policy = ctx.policy.current();
    let peeked = policy.host_can_matter(dst.port());
    let mut first = FirstBytes::default();
    if peeked {
        first = peek(&mut client, ctx).await;
    }
    let mut each_request = admit(ctx, &policy, peer, dst, &first, peeked, &mut record).await;
    if record.outcome.is_denied() {
        record.finished = true;
        return refuse(client, first, peeked, &record.outcome, ctx).await;
    }

    // A rule that decides each request: sluice terminates the connection
    // and serves it request by request (its own upstream connection).
    if let Some(conn) = terminated(&policy, &record, &first, peer, dst, ctx) {
        drop(policy);
        drop(first);
        // Boxed: its state (TLS, hyper) would otherwise grow every
        // connection's future, terminated or not (pinned by a size test).
        let served = Box::pin(l7::serve(client, conn)).await;
        record.served(served);
        return;
    }
    let upstream = match connect_upstream(dst, ctx.limits.connect_timeout).await {
        Ok(upstream) => upstream,
        Err(err) => {
            upstream_failed(ctx, &policy, peer, &err, &mut record).await;
            reset(client);
            return;
        }
    };
    record.connected();
    // A client silent through the peek was decided on its address and the
    // name it resolved: it may be waiting for a server-first protocol's
    // greeting, or it may be hiding its ClientHello or request head from
    // the peek. Whoever speaks first says which: if the client does, its
    // first bytes are read and decided like a first peek's, before any of
    // them reaches the origin; that decision is the connection's.
    if first.silent && client_speaks_first(&client, &upstream).await {
        first = peek(&mut client, ctx).await;
        policy = ctx.policy.current();
        each_request = admit(ctx, &policy, peer, dst, &first, true, &mut record).await;
        if record.outcome.is_denied() {
            drop(upstream);
            record.finished = true;
            return refuse(client, first, true, &record.outcome, ctx).await;
        }
    }
    // An allowed connection is audited (when asked) once all is decided,
    // with the name it was decided on.
    if ctx.audit_allows && record.outcome.verdict == Verdict::Allow {
        audit(
            ctx,
            policy.label(),
            peer,
            Some(dst),
            &record.outcome,
            record.host.clone(),
        )
        .await;
    }
    let head_limit = policy.limits().request_head;
    drop(policy);
    if each_request {
        let checked = record.checked_session(peer, &first, head_limit);
        let (relayed, ended) = session::relay(client, upstream, first.buf, checked).await;
        record.session_ended(relayed, ended);
        return;
    }
    relay_plain(client, upstream, first, &mut record).await;
}

/// The origin could not be reached: the connection's outcome ends as an
/// upstream failure, audited when allows are.
async fn upstream_failed(
    ctx: &ProxyContext,
    policy: &ActivePolicy,
    peer: SocketAddr,
    err: &std::io::Error,
    record: &mut Record<'_>,
) {
    let dst = record.dst;
    let failure = UpstreamFailure::of(err);
    tracing::debug!(%dst, %err, reason = failure.as_str(), "upstream connect failed");
    let mut outcome = record.outcome.clone();
    outcome.ended_by(Cause::Upstream(failure));
    if ctx.audit_allows {
        audit(
            ctx,
            policy.label(),
            peer,
            Some(dst),
            &outcome,
            record.host.clone(),
        )
        .await;
    }
    record.ended(outcome);
}

/// Relay a connection decided once and for all: the peeked bytes first,
/// then both ways until either side ends.
async fn relay_plain(
    client: TcpStream,
    upstream: TcpStream,
    first: FirstBytes,
    record: &mut Record<'_>,
) {
    if !first.buf.is_empty() && !write_all(&upstream, &first.buf).await {
        record.finished = true;
        reset(client);
        return;
    }
    let peeked_bytes = first.buf.len() as u64;
    drop(first);
    let mut relayed = relay(&client, &upstream).await;
    relayed.bytes_up += peeked_bytes;
    record.relayed(relayed);
}

/// The connection to serve request by request, if the rule that allowed
/// it has an `http` or `inject` block. Its first bytes must be a
/// ClientHello or a request head (or nothing yet: a ClientHello is awaited).
fn terminated<'c>(
    policy: &ActivePolicy,
    record: &Record<'_>,
    first: &FirstBytes,
    peer: SocketAddr,
    dst: SocketAddr,
    ctx: &'c ProxyContext,
) -> Option<l7::Terminated<'c>> {
    if record.outcome.verdict != Verdict::Allow {
        return None;
    }
    let rule = record.outcome.rule.clone()?;
    if !policy.rule_named(&rule).is_some_and(|r| r.terminates()) {
        return None;
    }
    Some(l7::Terminated {
        ctx,
        peer,
        dst,
        // A hosts rule admitted it: it was decided on a name.
        host: record.host.clone().unwrap_or_default(),
        rule,
        first: first.buf.clone(),
        plain: first.http,
    })
}

/// Write the audit record of a request's (or a terminated connection's)
/// outcome, with the request's fields.
pub(super) async fn audit_request(
    ctx: &ProxyContext,
    peer: SocketAddr,
    dst: SocketAddr,
    outcome: &Outcome,
    host: Option<String>,
    request: Option<crate::audit::RequestFields>,
) {
    let label = ctx.policy.current().label().to_string();
    let flow = Flow {
        sandbox: &ctx.sandbox,
        path: ctx.path,
        src: peer,
        dst: Some(dst),
        bundle: &label,
    };
    let mut event = AuditEvent::of_outcome(flow, outcome, host);
    event.request = request;
    ctx.audit.record(event).await;
}

/// Decide a connection on its first bytes (or its address and the name it
/// resolved) and record the decision in `record`; a deny or would-deny is
/// audited here. Returns whether each of its requests is decided on its
/// own Host (only for an allowed connection).
async fn admit(
    ctx: &ProxyContext,
    policy: &ActivePolicy,
    peer: SocketAddr,
    dst: SocketAddr,
    first: &FirstBytes,
    peeked: bool,
    record: &mut Record<'_>,
) -> bool {
    // The name the sandbox resolved for this address matters to the decision
    // only when a hosts rule covers the port; otherwise it is looked up only
    // for the records, and only if there will be one.
    let resolved_name = || ctx.resolver.name_for(dst.ip());
    let mut host = first.host.clone();
    if host.is_none() && peeked {
        host = resolved_name();
    }
    let outcome = if first.unreadable {
        Outcome::refused(Reason::UnreadableName, policy.mode())
    } else {
        Outcome::decided(
            &decide(ctx, policy, dst, host.as_deref()).await,
            policy.mode(),
        )
    };
    let allowed = outcome.verdict == Verdict::Allow;
    let recorded = !allowed || ctx.audit_allows || ctx.timings.is_enabled();
    if host.is_none() && !peeked && recorded {
        host = resolved_name();
    }
    if !allowed {
        tracing::debug!(%peer, %dst, rule = ?outcome.rule, reason = outcome.reason(), "{}", outcome.verdict);
        audit(ctx, policy.label(), peer, Some(dst), &outcome, host.clone()).await;
    }
    let denied = outcome.is_denied();
    record.decided(outcome, host);
    // A plain-HTTP connection whose Host could change the verdict has each
    // of its requests decided; any other keeps the plain relay.
    !denied && session::applies(&first.buf, first.http) && policy.host_decides_each_request(dst)
}

/// Answer a denied connection: a plain-HTTP client gets a readable 403
/// (only denies pay for finding out whether it speaks HTTP), anything else
/// a reset.
async fn refuse(
    mut client: TcpStream,
    mut first: FirstBytes,
    peeked: bool,
    outcome: &Outcome,
    ctx: &ProxyContext,
) {
    if !peeked {
        first = peek(&mut client, ctx).await;
    }
    if first.http {
        reply_forbidden(client, outcome).await;
    } else {
        reset(client);
    }
}

/// True if the client has something to say (bytes, or its end) before the
/// origin does.
async fn client_speaks_first(client: &TcpStream, upstream: &TcpStream) -> bool {
    tokio::select! {
        biased;
        _ = client.readable() => true,
        _ = upstream.readable() => false,
    }
}

/// Read the client's first bytes until SNI / Host is known, the protocol is
/// clearly neither, the buffer is full, or the client stays silent.
async fn peek(client: &mut TcpStream, ctx: &ProxyContext) -> FirstBytes {
    let limit = ctx.limits.peek_bytes;
    let mut first = FirstBytes {
        buf: Vec::with_capacity(limit.min(4096)),
        ..FirstBytes::default()
    };
    let deadline = tokio::time::Instant::now() + ctx.limits.peek_timeout;
    loop {
        if first.buf.len() >= limit {
            tracing::warn!(
                limit,
                "peek limit reached without a complete ClientHello or HTTP head"
            );
            return unfinished(first);
        }
        let room = (limit - first.buf.len()).min(4096);
        let start = first.buf.len();
        first.buf.resize(start + room, 0);
        // The first read goes to the kernel at once: the client has most
        // likely spoken by now, and then no timer is armed.
        let now = match start {
            0 => read_now(client, &mut first.buf[start..]),
            _ => Err(std::io::ErrorKind::WouldBlock.into()),
        };
        let read = match now {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::timeout_at(deadline, client.read(&mut first.buf[start..])).await
            }
            now => Ok(now),
        };
        let n = match read {
            Ok(Ok(n)) => n,
            // Closed, or failed.
            Ok(Err(_)) => 0,
            // Silent (a server-first protocol, or a client hiding its first
            // bytes from the peek: `serve` tells which).
            Err(_) => {
                first.silent = start == 0;
                0
            }
        };
        first.buf.truncate(start + n);
        if n == 0 {
            return unfinished(first);
        }
        match inspect(&first.buf) {
            Peeked::NeedMore => continue,
            Peeked::Tls { sni } => {
                first.host = sni.map(str::to_ascii_lowercase);
                return first;
            }
            Peeked::Http { host } => {
                first.host = host.map(str::to_ascii_lowercase);
                first.http = true;
                return first;
            }
            Peeked::Unreadable { http } => {
                first.unreadable = true;
                first.http = http;
                return first;
            }
            Peeked::Other => return first,
        }
    }
}

/// The peek ended before `inspect` decided (limit, deadline or end). A
/// ClientHello begun and not finished names a host sluice cannot read: it is
/// unreadable. An HTTP head begun is left to the checked session, which
/// reads on (the path every request of a connection whose Host matters
/// takes); anything else is decided on the address and resolved name.
fn unfinished(mut first: FirstBytes) -> FirstBytes {
    if first.buf.first() == Some(&TLS_HANDSHAKE) {
        first.unreadable = true;
    }
    first
}

/// Write the audit record of `outcome` for a connection (or a request on
/// one) from `peer` to `dst`, decided under the bundle `label`.
pub(super) async fn audit(
    ctx: &ProxyContext,
    label: &str,
    peer: SocketAddr,
    dst: Option<SocketAddr>,
    outcome: &Outcome,
    host: Option<String>,
) {
    let flow = Flow {
        sandbox: &ctx.sandbox,
        path: ctx.path,
        src: peer,
        dst,
        bundle: label,
    };
    ctx.audit
        .record(AuditEvent::of_outcome(flow, outcome, host))
        .await;
}

/// A plain-HTTP client gets a readable answer instead of a bare reset.
pub(super) async fn reply_forbidden(client: TcpStream, outcome: &Outcome) {
    let body = denial_text(outcome);
    reply_and_close(client, "403 Forbidden", outcome.reason(), &body).await;
}

/// The body of a refusal: the rule (or the default deny) and the reason.
pub(super) fn denial_text(outcome: &Outcome) -> String {
    format!(
        "sluice: denied by {} ({})\n",
        outcome
            .rule_name()
            .map(|r| format!("rule \"{r}\""))
            .unwrap_or_else(|| "default deny".to_string()),
        outcome.reason()
    )
}

/// Answers with `status`, the reason in `X-Sluice-Reason` and `body`, then
/// closes the connection once the client has read it (or after a second).
pub(super) async fn reply_and_close(mut client: TcpStream, status: &str, reason: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\nX-Sluice-Reason: {reason}\r\n\r\n",
        body.len(),
    );
    let _ = client.write_all(head.as_bytes()).await;
    let _ = client.write_all(body.as_bytes()).await;
    let _ = client.shutdown().await;
    // Let the client read the answer before the socket goes.
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Close with RST so the client fails at once rather than seeing a clean EOF.
fn reset(client: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let _ = setsockopt(&client, sockopt::Linger, &linger);
    drop(client);
}
