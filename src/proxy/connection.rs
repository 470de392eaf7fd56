//! One redirected connection, from accept to close.

use std::net::SocketAddr;
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::peek::{inspect, Peeked};
use super::{original_dst, relay::relay, ProxyContext};
use crate::audit::{AuditEvent, Proto};
use crate::policy::{Decision, Mode, Reason, Verdict};

/// What the first bytes told us, kept only as long as the decision needs.
#[derive(Default)]
struct FirstBytes {
    buf: Vec<u8>,
    host: Option<String>,
    http: bool,
}

pub(super) async fn handle(mut client: TcpStream, peer: SocketAddr, ctx: &ProxyContext) {
    // Without a redirect there is no NAT entry; conntrack then reports the
    // listener's own address (or nothing) as the original destination.
    let dst = match original_dst(&client) {
        Ok(dst) if Some(dst) != client.local_addr().ok() => dst,
        _ => {
            // Not redirected by our rules: someone connected straight to the
            // listener. There is no destination to decide on.
            deny_without_destination(client, peer, ctx).await;
            return;
        }
    };
    let policy = ctx.policy.current();

    let mut first = FirstBytes::default();
    let mut peeked = false;
    if policy.host_can_matter(dst.port()) {
        first = peek(&mut client, ctx).await;
        peeked = true;
    }
    let host = first
        .host
        .clone()
        .or_else(|| ctx.dns.name_for(dst.ip()).map(|n| n.to_string()));

    let decision = if is_sandbox_internal(dst.ip()) {
        Decision {
            verdict: Verdict::Deny,
            rule: None,
            reason: Reason::PrivateAddress,
        }
    } else {
        policy.decide(dst, host.as_deref(), &*ctx.dns)
    };
    let enforce = policy.mode() == Mode::Enforce;

    match decision.verdict {
        Verdict::Deny => {
            let verdict = if enforce { "deny" } else { "would-deny" };
            ctx.audit
                .record(event(
                    ctx,
                    verdict,
                    &decision,
                    peer,
                    Some(dst),
                    host.clone(),
                ))
                .await;
            tracing::debug!(%peer, %dst, ?host, rule = ?decision.rule, reason = decision.reason.as_str(), "{verdict}");
            if enforce {
                // A denied plain-HTTP client deserves a readable answer; only
                // denies pay for finding out whether it speaks HTTP.
                if !peeked {
                    first = peek(&mut client, ctx).await;
                }
                if first.http {
                    reply_forbidden(client, &decision).await;
                } else {
                    reset(client);
                }
                return;
            }
        }
        Verdict::Allow => {
            if ctx.audit_allows {
                ctx.audit
                    .record(event(
                        ctx,
                        "allow",
                        &decision,
                        peer,
                        Some(dst),
                        host.clone(),
                    ))
                    .await;
            }
        }
    }
    drop(policy);

    let upstream = tokio::time::timeout(ctx.limits.connect_timeout, TcpStream::connect(dst)).await;
    let mut upstream = match upstream {
        Ok(Ok(upstream)) => upstream,
        Ok(Err(err)) => {
            tracing::debug!(%dst, %err, "upstream connect failed");
            reset(client);
            return;
        }
        Err(_) => {
            tracing::debug!(%dst, "upstream connect timed out");
            reset(client);
            return;
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    if !first.buf.is_empty() && upstream.write_all(&first.buf).await.is_err() {
        reset(client);
        return;
    }
    drop(first);
    let _relayed = relay(&client, &upstream).await;
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
                "peek limit reached without a complete ClientHello or HTTP head; deciding on the address alone"
            );
            return first;
        }
        let room = (limit - first.buf.len()).min(4096);
        let start = first.buf.len();
        first.buf.resize(start + room, 0);
        let read = tokio::time::timeout_at(deadline, client.read(&mut first.buf[start..])).await;
        let n = match read {
            Ok(Ok(n)) => n,
            // Silent (server-first protocol), closed, or failed: decide on
            // the address alone.
            Ok(Err(_)) | Err(_) => 0,
        };
        first.buf.truncate(start + n);
        if n == 0 {
            return first;
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
            Peeked::Other => return first,
        }
    }
}

fn event(
    ctx: &ProxyContext,
    verdict: &'static str,
    decision: &Decision<'_>,
    peer: SocketAddr,
    dst: Option<SocketAddr>,
    host: Option<String>,
) -> AuditEvent {
    AuditEvent {
        sandbox: ctx.sandbox.clone(),
        path: ctx.path,
        verdict,
        rule: decision.rule.map(str::to_string),
        reason: decision.reason.as_str(),
        proto: Proto::Tcp,
        src: Some(peer),
        dst,
        host,
        bundle: ctx.policy.label().to_string(),
    }
}

async fn deny_without_destination(client: TcpStream, peer: SocketAddr, ctx: &ProxyContext) {
    tracing::warn!(%peer, "connection straight to sluice's listener (no original destination): refused");
    ctx.audit
        .record(AuditEvent {
            sandbox: ctx.sandbox.clone(),
            path: ctx.path,
            verdict: "deny",
            rule: None,
            reason: "no-original-destination",
            proto: Proto::Tcp,
            src: Some(peer),
            dst: client.local_addr().ok(),
            host: None,
            bundle: ctx.policy.label().to_string(),
        })
        .await;
    reset(client);
}

/// A plain-HTTP client gets a readable answer instead of a bare reset.
async fn reply_forbidden(mut client: TcpStream, decision: &Decision<'_>) {
    let body = format!(
        "sluice: denied by {} ({})\n",
        decision
            .rule
            .map(|r| format!("rule \"{r}\""))
            .unwrap_or_else(|| "default deny".to_string()),
        decision.reason.as_str()
    );
    let head = format!(
        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\nX-Sluice-Reason: {}\r\n\r\n",
        body.len(),
        decision.reason.as_str()
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

/// sluice's own in-namespace addresses are never a destination.
fn is_sandbox_internal(ip: std::net::IpAddr) -> bool {
    ip == crate::netns::SANDBOX_V4 || ip == crate::netns::SANDBOX_V6
}
