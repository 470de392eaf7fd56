//! Forwarding one query to the upstream resolvers, from sluice's own
//! namespace: UDP first, TCP when the answer comes back truncated. What is
//! sent is rebuilt from the query's question ([`upstream_query`]), never the
//! client's bytes.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{timeout_at, Instant};

use super::message::{upstream_answer, upstream_query};

/// How long one upstream gets (UDP and any TCP retry together).
pub(crate) const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// Upstreams tried per query at most.
pub(crate) const MAX_ATTEMPTS: usize = 3;
/// Largest UDP answer read from an upstream.
const UDP_READ: usize = 4096;

/// A validated upstream answer: the raw bytes (id already set back to the
/// client's) and their parse.
pub(crate) struct Forwarded {
    pub(crate) bytes: Vec<u8>,
    pub(crate) message: Message,
}

/// Ask each upstream in turn the question of `parsed` until one gives a
/// usable answer. SERVFAIL and REFUSED move on to the next upstream; the
/// last such answer is returned if none does better.
pub(crate) async fn forward(parsed: &Message, upstreams: &[SocketAddr]) -> Option<Forwarded> {
    let mut fallback = None;
    for &upstream in upstreams.iter().take(MAX_ATTEMPTS) {
        let deadline = Instant::now() + UPSTREAM_TIMEOUT;
        let Some(answer) = forward_one(parsed, upstream, deadline).await else {
            continue;
        };
        match answer.message.metadata.response_code {
            ResponseCode::ServFail | ResponseCode::Refused => fallback = Some(answer),
            _ => return Some(answer),
        }
    }
    fallback
}

async fn forward_one(
    parsed: &Message,
    upstream: SocketAddr,
    deadline: Instant,
) -> Option<Forwarded> {
    // A fresh id towards the upstream (the client's may be predictable);
    // the client's goes back into the answer.
    let client_id = parsed.metadata.id;
    let id = random_u16();
    let out = upstream_query(parsed, id)?;

    let result = timeout_at(deadline, async {
        let mut answer = udp_exchange(&out, parsed, upstream, id).await?;
        if answer.message.metadata.truncation {
            answer = tcp_exchange(&out, parsed, upstream, id).await?;
        }
        Some(answer)
    })
    .await;
    let mut answer = match result {
        Ok(Some(answer)) => answer,
        Ok(None) => return None,
        Err(_) => {
            tracing::debug!(%upstream, "upstream DNS timed out");
            return None;
        }
    };
    answer.bytes[..2].copy_from_slice(&client_id.to_be_bytes());
    answer.message.metadata.id = client_id;
    Some(answer)
}

async fn udp_exchange(
    out: &[u8],
    parsed: &Message,
    upstream: SocketAddr,
    id: u16,
) -> Option<Forwarded> {
    let local: SocketAddr = if upstream.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await.ok()?;
    // connect(): the kernel drops datagrams from anyone but the upstream.
    if let Err(err) = socket.connect(upstream).await {
        tracing::debug!(%upstream, %err, "cannot reach upstream DNS");
        return None;
    }
    socket.send(out).await.ok()?;
    let mut buf = vec![0u8; UDP_READ];
    loop {
        let n = match socket.recv(&mut buf).await {
            Ok(n) => n,
            Err(err) => {
                tracing::debug!(%upstream, %err, "upstream DNS failed");
                return None;
            }
        };
        // Anything that is not the answer to this question is ignored.
        if let Some(message) = upstream_answer(&buf[..n], parsed, id) {
            buf.truncate(n);
            return Some(Forwarded {
                bytes: buf,
                message,
            });
        }
    }
}

async fn tcp_exchange(
    out: &[u8],
    parsed: &Message,
    upstream: SocketAddr,
    id: u16,
) -> Option<Forwarded> {
    let mut stream = TcpStream::connect(upstream).await.ok()?;
    let len = u16::try_from(out.len()).ok()?;
    let mut framed = Vec::with_capacity(out.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(out);
    stream.write_all(&framed).await.ok()?;
    let n = usize::from(stream.read_u16().await.ok()?);
    let mut buf = vec![0u8; n];
    stream.read_exact(&mut buf).await.ok()?;
    let message = upstream_answer(&buf, parsed, id)?;
    Some(Forwarded {
        bytes: buf,
        message,
    })
}

fn random_u16() -> u16 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    hasher.finish() as u16
}
