//! The UDP and TCP front ends: bounded concurrency, per-query tasks owned
//! by the server, answers sized for the transport. When the sandbox drains
//! they stop reading new queries, answer those in flight until the drain's
//! deadline, and drop what is left then.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::timeout;

use super::message::fit_udp;
use super::{answer, DnsContext};
use crate::drain::Watch;

/// UDP queries answered at once; more wait in the socket buffer.
pub(crate) const MAX_UDP_IN_FLIGHT: usize = 256;
/// TCP connections served at once; more wait in the accept queue.
pub(crate) const MAX_TCP_CONNECTIONS: usize = 64;
/// A TCP connection silent this long (or this slow to send a query) is closed.
pub(crate) const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest UDP query read.
const UDP_READ: usize = 4096;
/// Pause after a socket error, so a persistent one cannot spin.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// Answer queries on `socket` until the drain starts, then finish those
/// in flight (until the drain's deadline).
pub async fn serve_udp(socket: UdpSocket, ctx: Arc<DnsContext>, drain: Watch) {
    let socket = Arc::new(socket);
    let permits = Arc::new(Semaphore::new(MAX_UDP_IN_FLIGHT));
    let mut tasks = JoinSet::new();
    let mut buf = vec![0u8; UDP_READ];
    let draining = drain.draining();
    tokio::pin!(draining);
    loop {
        reap(&mut tasks);
        let received = tokio::select! {
            got = async {
                let permit = permits.clone().acquire_owned().await;
                (permit, socket.recv_from(&mut buf).await)
            } => got,
            _ = &mut draining => break,
        };
        let (Ok(permit), received) = received else {
            break; // the semaphore is never closed
        };
        let (n, client) = match received {
            Ok(got) => got,
            Err(err) => {
                tracing::warn!(%err, "DNS: UDP receive failed");
                tokio::time::sleep(ERROR_BACKOFF).await;
                continue;
            }
        };
        let query = buf[..n].to_vec();
        let (socket, ctx) = (socket.clone(), ctx.clone());
        tasks.spawn(async move {
            let _permit = permit;
            let Some(response) = answer(&query, &ctx, client).await else {
                return;
            };
            let Some(response) = fit_udp(&query, response) else {
                return;
            };
            if let Err(err) = socket.send_to(&response, client).await {
                tracing::debug!(%client, %err, "DNS: UDP send failed");
            }
        });
    }
    finish_in_flight(tasks, &drain, "UDP queries").await;
}

/// Answer queries on connections accepted from `listener` (2-byte length
/// framing, several queries per connection) until the drain starts, then
/// finish the queries in flight; idle connections close.
pub(crate) async fn serve_tcp(listener: TcpListener, ctx: Arc<DnsContext>, drain: Watch) {
    let permits = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    let mut tasks = JoinSet::new();
    let draining = drain.draining();
    tokio::pin!(draining);
    loop {
        reap(&mut tasks);
        let accepted = tokio::select! {
            got = async {
                let permit = permits.clone().acquire_owned().await;
                (permit, listener.accept().await)
            } => got,
            _ = &mut draining => break,
        };
        let (Ok(permit), accepted) = accepted else {
            break;
        };
        let (stream, client) = match accepted {
            Ok(got) => got,
            Err(err) => {
                tracing::warn!(%err, "DNS: TCP accept failed");
                tokio::time::sleep(ERROR_BACKOFF).await;
                continue;
            }
        };
        let (ctx, drain) = (ctx.clone(), drain.clone());
        tasks.spawn(async move {
            let _permit = permit;
            serve_connection(stream, client, &ctx, &drain).await;
        });
    }
    drop(listener);
    finish_in_flight(tasks, &drain, "TCP queries").await;
}

async fn serve_connection(
    mut stream: TcpStream,
    client: SocketAddr,
    ctx: &DnsContext,
    drain: &Watch,
) {
    let _ = stream.set_nodelay(true);
    loop {
        // A connection waiting for its next query closes once the sandbox
        // drains; one whose query is being answered finishes it first.
        let len = tokio::select! {
            len = timeout(TCP_IDLE_TIMEOUT, stream.read_u16()) => len,
            _ = drain.draining() => return,
        };
        let len = match len {
            Ok(Ok(len)) => usize::from(len),
            _ => return, // closed, failed or idle
        };
        let mut query = vec![0u8; len];
        if !matches!(
            timeout(TCP_IDLE_TIMEOUT, stream.read_exact(&mut query)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let Some(response) = answer(&query, ctx, client).await else {
            return; // garbage: stop reading this stream
        };
        let Ok(rlen) = u16::try_from(response.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(response.len() + 2);
        framed.extend_from_slice(&rlen.to_be_bytes());
        framed.extend_from_slice(&response);
        if !matches!(
            timeout(TCP_IDLE_TIMEOUT, stream.write_all(&framed)).await,
            Ok(Ok(()))
        ) {
            return;
        }
    }
}

/// Wait for the queries in flight until the drain's deadline, then drop
/// those left.
async fn finish_in_flight(mut tasks: JoinSet<()>, drain: &Watch, what: &str) {
    let overdue = tokio::select! {
        _ = async {
            while let Some(done) = tasks.join_next().await {
                report(done);
            }
        } => false,
        _ = drain.overdue() => true,
    };
    if overdue && !tasks.is_empty() {
        tracing::info!(
            left = tasks.len(),
            "DNS: {what} still unanswered at the drain deadline: dropping them"
        );
        tasks.shutdown().await;
    }
}

/// Collect finished per-query tasks, reporting any that panicked.
fn reap(tasks: &mut JoinSet<()>) {
    while let Some(done) = tasks.try_join_next() {
        report(done);
    }
}

fn report(done: Result<(), tokio::task::JoinError>) {
    if let Err(err) = done {
        if err.is_panic() {
            tracing::error!(%err, "DNS: a query task panicked");
        }
    }
}
