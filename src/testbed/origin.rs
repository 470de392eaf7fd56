//! The fast origin: a small HTTP/1.1 server on plain threads, one per
//! connection, that answers `/` with a greeting and `/bytes/N` with N bytes
//! of a fixed pattern (precomputed for bulk sizes, so a transfer measures
//! the network path and not the origin), written in `?write=W`-byte writes
//! when asked; and `/stream?events=E&size=S&gap_ms=G` with E events of S
//! pattern bytes, G ms apart (the first one with the head). The testbed
//! namespace, `sluice probe serve` and the benchmark use it (over TLS too:
//! `tls`). It reads at
//! most a 64 KiB request head, bounds every parameter, and never keeps a
//! connection open after answering.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The body `/bytes/N` serves: byte i is (i * 31 + 7) mod 251.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 31 + 7) % 251) as u8).collect()
}

/// Serve HTTP on `listener` until it fails, a thread per connection in
/// flight.
pub(crate) fn serve_http_forever(listener: TcpListener) {
    serve_http_counting(listener, Arc::new(AtomicU64::new(0)));
}

/// [`serve_http_forever`], counting the connections accepted in `counter`.
///
/// The threads are a pool that grows: each blocks in accept(2), serves what
/// it accepted and goes back to accept, and the one that takes the last
/// idle place starts another. So no thread is started while the pool is
/// big enough for what is in flight (the bench measured a thread started
/// per connection as most of its native time: issue 34), and a test that
/// holds many connections open still gets each one served. The calling
/// thread is the first of them; this returns when its accept fails.
pub(crate) fn serve_http_counting(listener: TcpListener, counter: Arc<AtomicU64>) {
    let pool = Arc::new(Pool {
        listener,
        idle: AtomicUsize::new(0),
        counter,
    });
    accept_and_serve(&pool);
}

/// The origin's threads and what they share.
struct Pool {
    listener: TcpListener,
    /// Threads blocked in accept.
    idle: AtomicUsize,
    counter: Arc<AtomicU64>,
}

fn accept_and_serve(pool: &Arc<Pool>) {
    loop {
        pool.idle.fetch_add(1, Ordering::SeqCst);
        let accepted = pool.listener.accept();
        let idle = pool.idle.fetch_sub(1, Ordering::SeqCst) - 1;
        let Ok((stream, _)) = accepted else { return };
        pool.counter.fetch_add(1, Ordering::Relaxed);
        if idle == 0 {
            let pool = pool.clone();
            std::thread::spawn(move || accept_and_serve(&pool));
        }
        serve_http(stream);
    }
}

fn serve_http(mut stream: std::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    serve_http_on(&mut stream, &|_| {});
}

/// Answer one request on `stream` (plain TCP, or TLS: `tls`); `seen` gets
/// the request's head (for an origin that counts what reached it).
pub(crate) fn serve_http_on<S: Read + Write>(stream: &mut S, seen: &dyn Fn(&str)) {
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
    seen(&text);
    let target = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.parse::<usize>().ok())
    };
    if path == "/stream" {
        let events = param("events").unwrap_or(10).clamp(1, MAX_EVENTS);
        let size = param("size").unwrap_or(13).clamp(1, MAX_EVENT_SIZE);
        let gap = Duration::from_millis(param("gap_ms").unwrap_or(2).min(MAX_GAP_MS) as u64);
        let body = pattern(events * size);
        let mut first = head_of(body.len()).into_bytes();
        first.extend_from_slice(&body[..size]);
        if stream.write_all(&first).is_err() {
            return;
        }
        for event in body[size..].chunks(size) {
            std::thread::sleep(gap);
            if stream.write_all(event).is_err() {
                return;
            }
        }
        return;
    }
    let body: std::borrow::Cow<'static, [u8]> = match path
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(n) if n <= 1 << 20 => pattern(n).into(),
        Some(n) => patterned()[..n.min(MAX_BODY)].into(),
        None => b"hello from origin\n"[..].into(),
    };
    let _ = stream.write_all(head_of(body.len()).as_bytes());
    let write = param("write").unwrap_or(body.len()).clamp(1, MAX_WRITE);
    for chunk in body.chunks(write) {
        if stream.write_all(chunk).is_err() {
            return;
        }
    }
}

fn head_of(len: usize) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    )
}

/// Bounds of `/stream` and of `?write=`: one stream lasts at most 10 s
/// (100 events, 100 ms apart) and sends at most 6.4 MiB.
const MAX_EVENTS: usize = 100;
const MAX_EVENT_SIZE: usize = 64 << 10;
const MAX_GAP_MS: usize = 100;
const MAX_WRITE: usize = 1 << 20;

/// The largest `/bytes/N` body.
const MAX_BODY: usize = 64 << 20;

/// Compute the bulk body now, so that the first bulk request does not pay
/// for it.
#[cfg(feature = "bench")]
pub(crate) fn prepare_bulk() {
    patterned();
}

/// The first `len` bytes of [`pattern`] (at most [`MAX_BODY`]), computed
/// once for the whole process.
#[cfg(feature = "bench")]
pub(crate) fn pattern_prefix(len: usize) -> &'static [u8] {
    static SMALL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    match SMALL.get_or_init(|| pattern(1 << 20)) {
        small if len <= small.len() => &small[..len],
        _ => &patterned()[..len.min(MAX_BODY)],
    }
}

/// [`pattern`] of [`MAX_BODY`] bytes, computed once, for bodies over 1 MiB:
/// a bulk transfer then measures the network path, not the origin computing
/// its body.
fn patterned() -> &'static [u8] {
    static BODY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BODY.get_or_init(|| pattern(MAX_BODY))
}
