//! The reference pair, the `reference` condition: the leanest blocking
//! client and origin that speak the bench's plain workloads, measured in
//! the same run and namespace as `native`. It is there to calibrate. If
//! `native` (the bench's own client and origin, straight to each other) is
//! much slower than this pair, then the instrument is what the ratios
//! measure, not the path, and every ratio to native is compressed. The
//! report sets native beside it ([`CALIBRATED_WITHIN`]).
//!
//! The pair does nothing it does not need to. The origin is a fixed pool of
//! threads blocked in accept(2), with no thread started per connection; it
//! reads the request line and writes a precomputed body. The client has one
//! buffer per thread, parses the target once and checks only the status and
//! the length. It is never used outside the bench.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::client::{Reply, Sample};

/// Where the reference origin listens (in the bench's outer namespace,
/// beside the bench's own origin).
pub(crate) const REFERENCE_ORIGIN: &str = "198.18.0.1:8081";

/// native's small P50 must be within this share of the reference's for the
/// run to count as calibrated (the bench's client and origin are not the
/// bottleneck).
pub(crate) const CALIBRATED_WITHIN: f64 = 0.15;

/// Origin threads, each blocked in accept: twice the small workload's 8 in
/// flight, so a connection never waits for a thread.
const ORIGIN_THREADS: usize = 16;

/// The largest request head the origin reads.
const MAX_HEAD: usize = 4096;

/// Serve `listener` with [`ORIGIN_THREADS`] threads for the rest of the
/// process.
pub(crate) fn serve(listener: TcpListener) -> std::io::Result<()> {
    for _ in 0..ORIGIN_THREADS {
        let listener = listener.try_clone()?;
        std::thread::Builder::new()
            .name("sluice-bench-reference-origin".into())
            .spawn(move || {
                let mut head = [0u8; MAX_HEAD];
                while let Ok((stream, _)) = listener.accept() {
                    answer(stream, &mut head);
                }
            })?;
    }
    Ok(())
}

/// Answer one `GET /bytes/N[?write=W]` and close.
fn answer(mut stream: TcpStream, head: &mut [u8; MAX_HEAD]) {
    let _ = stream.set_nodelay(true);
    let mut len = 0;
    while !head[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut head[len..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => len += n,
        }
        if len == MAX_HEAD {
            return;
        }
    }
    let Some((size, write)) = target(&head[..len]) else {
        let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        return;
    };
    let body = crate::testbed::origin::pattern_prefix(size);
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if stream.write_all(reply.as_bytes()).is_err() {
        return;
    }
    for chunk in body.chunks(write.max(1)) {
        if stream.write_all(chunk).is_err() {
            return;
        }
    }
}

/// The body size and write size a request line asks for.
fn target(head: &[u8]) -> Option<(usize, usize)> {
    let line = head.split(|&b| b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let path = line.strip_prefix("GET ")?.split(' ').next()?;
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let size: usize = path.strip_prefix("/bytes/")?.parse().ok()?;
    let write = query
        .strip_prefix("write=")
        .and_then(|w| w.parse().ok())
        .unwrap_or(size);
    Some((size, write))
}

/// `count` GETs of `path` at `addr`, each on a fresh connection, `threads`
/// at once; each must answer 200 with `expect_len` body bytes.
pub(crate) fn fetch(
    addr: &str,
    path: &str,
    count: usize,
    threads: usize,
    expect_len: usize,
) -> Reply {
    let addr: SocketAddr = match addr.parse() {
        Ok(addr) => addr,
        Err(e) => {
            return Reply {
                failed: count,
                first_failure: Some(format!("FAIL reference address {addr:?}: {e}")),
                ..Reply::default()
            }
        }
    };
    let request = Arc::new(format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    ));
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..threads.clamp(1, count.max(1)))
        .map(|_| {
            let (next, request) = (next.clone(), request.clone());
            std::thread::spawn(move || {
                let mut reply = Reply::default();
                let mut buf = vec![0u8; 64 << 10];
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    match one(addr, request.as_bytes(), expect_len, &mut buf) {
                        Ok(sample) => reply.samples.push(sample),
                        Err(why) => {
                            reply.failed += 1;
                            reply.first_failure.get_or_insert(why);
                        }
                    }
                }
                reply
            })
        })
        .collect();
    let mut all = Reply::default();
    for worker in workers {
        match worker.join() {
            Ok(reply) => {
                all.samples.extend(reply.samples);
                all.failed += reply.failed;
                if all.first_failure.is_none() {
                    all.first_failure = reply.first_failure;
                }
            }
            Err(_) => {
                all.failed += 1;
                all.first_failure
                    .get_or_insert("FAIL reference client thread panicked".into());
            }
        }
    }
    all
}

/// One request: connect, send, read to the server's close.
fn one(
    addr: SocketAddr,
    request: &[u8],
    expect_len: usize,
    buf: &mut [u8],
) -> Result<Sample, String> {
    let started = Instant::now();
    let us = || started.elapsed().as_micros() as u64;
    let mut stream = TcpStream::connect_timeout(&addr, crate::testbed::load::TIMEOUT)
        .map_err(|e| format!("FAIL connect {addr}: {e}"))?;
    let connect_us = us();
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(crate::testbed::load::TIMEOUT));
    stream
        .write_all(request)
        .map_err(|e| format!("FAIL write: {e}"))?;
    let (mut first_byte_us, mut last_byte_us) = (0, None);
    // Bytes of the body still to come, once the head (in the first read:
    // the origin writes it in one piece) has been seen.
    let mut body_left: Option<usize> = None;
    loop {
        let n = stream.read(buf).map_err(|e| format!("FAIL read: {e}"))?;
        if n == 0 {
            break;
        }
        let body = match body_left {
            Some(_) => n,
            None => {
                first_byte_us = us();
                if !buf[..n].starts_with(b"HTTP/1.1 200 ") {
                    return Err(format!(
                        "FAIL reference origin answered {:?}",
                        String::from_utf8_lossy(&buf[..n.min(32)])
                    ));
                }
                let end = buf[..n]
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .ok_or("FAIL reference origin's head is not in its first write")?;
                n - end - 4
            }
        };
        let left = body_left.unwrap_or(expect_len).saturating_sub(body);
        body_left = Some(left);
        if left == 0 && last_byte_us.is_none() {
            last_byte_us = Some(us());
        }
    }
    let total_us = us();
    match last_byte_us {
        Some(last_byte_us) => Ok(Sample {
            connect_us,
            first_byte_us,
            last_byte_us,
            total_us,
        }),
        None => Err(format!(
            "FAIL reference body short by {} bytes",
            body_left.unwrap_or(expect_len)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_origin_reads_the_size_and_write_from_the_request_line() {
        assert_eq!(
            target(b"GET /bytes/1024 HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some((1024, 1024))
        );
        assert_eq!(
            target(b"GET /bytes/33554432?write=65536 HTTP/1.1\r\n\r\n"),
            Some((33554432, 65536))
        );
        assert_eq!(target(b"GET / HTTP/1.1\r\n\r\n"), None);
        assert_eq!(target(b"POST /bytes/1 HTTP/1.1\r\n\r\n"), None);
    }

    #[test]
    fn the_reference_pair_round_trips_every_request_with_its_length() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        serve(listener).unwrap();
        let reply = fetch(&addr, "/bytes/1024", 64, 4, 1024);
        assert_eq!((reply.samples.len(), reply.failed), (64, 0), "{reply:?}");
        let short = fetch(&addr, "/bytes/1024", 1, 1, 2048);
        assert_eq!(short.failed, 1);
        assert!(
            short.first_failure.unwrap().contains("short by 1024"),
            "a short body is a failure"
        );
    }
}
