//! The fast origin: a small HTTP/1.1 server on plain threads, one per
//! connection, that answers `/` with a greeting and `/bytes/N` with N bytes
//! of a fixed pattern (precomputed for bulk sizes, so a transfer measures
//! the network path and not the origin). The testbed namespace, `sluice
//! probe serve` and the benchmark use it. It reads at most a 64 KiB request
//! head and never keeps a connection open after answering.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};

/// The body `/bytes/N` serves: byte i is (i * 31 + 7) mod 251.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 31 + 7) % 251) as u8).collect()
}

/// Serve HTTP on `listener` until it fails, a thread per connection.
pub fn serve_http_forever(listener: TcpListener) {
    serve_http_counting(listener, &AtomicU64::new(0));
}

pub(crate) fn serve_http_counting(listener: TcpListener, counter: &AtomicU64) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { break };
        counter.fetch_add(1, Ordering::Relaxed);
        std::thread::spawn(move || serve_http(stream));
    }
}

fn serve_http(mut stream: std::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 64 * 1024 {
            return;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    let body: std::borrow::Cow<'static, [u8]> = match path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(n) if n <= 1 << 20 => pattern(n).into(),
        Some(n) => patterned()[..n.min(MAX_BODY)].into(),
        None => b"hello from origin\n"[..].into(),
    };
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(reply.as_bytes());
    let _ = stream.write_all(&body);
}

/// The largest `/bytes/N` body.
const MAX_BODY: usize = 64 << 20;

/// [`pattern`] of [`MAX_BODY`] bytes, computed once, for bodies over 1 MiB:
/// a bulk transfer then measures the network path, not the origin computing
/// its body.
fn patterned() -> &'static [u8] {
    static BODY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BODY.get_or_init(|| pattern(MAX_BODY))
}
