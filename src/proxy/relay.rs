//! Moving bytes both ways once a connection is allowed.

use tokio::io::copy_bidirectional_with_sizes;
use tokio::net::TcpStream;

/// Large buffers keep the per-byte cost to a few big reads and writes;
/// `copy_bidirectional` forwards a half-close (EOF one way shuts down the
/// write side of the other) and finishes when both directions have.
const RELAY_BUFFER: usize = 64 * 1024;

/// Relay until both directions are closed; returns (bytes up, bytes down).
pub async fn relay(client: &mut TcpStream, upstream: &mut TcpStream) -> (u64, u64) {
    copy_bidirectional_with_sizes(client, upstream, RELAY_BUFFER, RELAY_BUFFER)
        .await
        .unwrap_or((0, 0))
}
