//! The load client: HTTP GETs, each on a fresh connection, timed from the
//! client's side (connect, first byte, total), one at a time or many in
//! flight, and their timing records in the format `sluice run --timings`
//! writes, so `sluice compare` can set a direct run beside a proxied one.
//! `sluice probe http`, the benchmark and the tests use it.
//!
//! Blocking sockets on plain threads, on purpose: the client runs beside
//! the proxy it measures and must not share its runtime. It speaks just
//! enough HTTP/1.1 for the testbed's origin (`Connection: close`, read to
//! the end), in the clear or over rustls ([`TlsTarget`]), and never follows
//! redirects or reuses a connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::timing::TimingRecord;

/// Connect, read and write timeout of every request.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);

/// Connect to `target` (`host:port`), trying each address it resolves to.
/// The error is one line starting with FAIL.
pub(crate) fn connect(target: &str) -> Result<TcpStream, String> {
    connect_to(target).map(|(stream, _)| stream)
}

/// [`connect`], with the address it connected to.
fn connect_to(target: &str) -> Result<(TcpStream, SocketAddr), String> {
    let addrs: Vec<SocketAddr> = target
        .to_socket_addrs()
        .map_err(|e| format!("FAIL resolve {target}: {e}"))?
        .collect();
    let mut last = format!("FAIL resolve {target}: no addresses");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, TIMEOUT) {
            Ok(s) => {
                let _ = s.set_read_timeout(Some(TIMEOUT));
                let _ = s.set_write_timeout(Some(TIMEOUT));
                return Ok((s, addr));
            }
            Err(e) => last = format!("FAIL connect {addr}: {e}"),
        }
    }
    Err(last)
}

/// One GET on a fresh connection, with its phases measured by the client.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
    /// The address connected to.
    pub(crate) dst: SocketAddr,
    /// When the request started (Unix µs).
    pub(crate) start_us: u64,
    pub(crate) connect_us: u64,
    pub(crate) first_byte_us: u64,
    /// When the body's last byte (by Content-Length) arrived; the close
    /// that ends the response follows.
    // Read by the bench only.
    #[cfg_attr(not(feature = "bench"), allow(dead_code))]
    pub(crate) last_byte_us: u64,
    /// When the server closed the connection (the response's end).
    pub(crate) total_us: u64,
    pub(crate) bytes_up: u64,
}

impl Fetched {
    pub(crate) fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// GET `url` (http:// only) on a fresh connection and read the response to
/// its end. The error is one line starting with FAIL.
pub(crate) fn fetch(url: &str) -> Result<Fetched, String> {
    fetch_with(url, None)
}

/// Where an https:// request goes: the TLS client configuration (the CAs
/// it trusts) and the name it asks for and verifies (SNI), whatever the
/// URL's authority (an address, so that no name needs resolving).
#[derive(Clone)]
pub(crate) struct TlsTarget {
    pub(crate) config: Arc<rustls::ClientConfig>,
    pub(crate) name: String,
}

/// A fresh connection, in the clear or in TLS.
enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// [`fetch`], or with `tls` an https:// URL: the handshake (with `tls`'s
/// name as SNI and Host) is part of the request's time, as for any
/// client. The error is one line starting with FAIL.
pub(crate) fn fetch_with(url: &str, tls: Option<&TlsTarget>) -> Result<Fetched, String> {
    let (target, host, path) = split_url(url, tls)?;
    let start_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let started = Instant::now();
    let (tcp, dst) = connect_to(&target)?;
    let connect_us = micros_since(started);
    let _ = tcp.set_nodelay(true);
    let mut stream = open_stream(tcp, tls)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: sluice-probe\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("FAIL send: {e}"))?;
    let read = read_response(&mut stream, started)?;
    let total_us = micros_since(started);
    let mut response = read.bytes;
    let head_end = find(&response, b"\r\n\r\n").ok_or("FAIL no HTTP response".to_string())?;
    let head = String::from_utf8_lossy(&response[..head_end]).to_string();
    let status: u16 = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    response.drain(..head_end + 4);
    Ok(Fetched {
        status,
        body: response,
        dst,
        start_us,
        connect_us,
        first_byte_us: read.first_byte_us,
        last_byte_us: read.last_byte_us.unwrap_or(total_us),
        total_us,
        bytes_up: request.len() as u64,
    })
}

/// Microseconds since `since`.
fn micros_since(since: Instant) -> u64 {
    since.elapsed().as_micros() as u64
}

/// Where `url` goes: the `host:port` to connect to, the Host to send (over
/// TLS the name verified, with the port the URL gave) and the path.
fn split_url<'u>(
    url: &'u str,
    tls: Option<&TlsTarget>,
) -> Result<(String, String, &'u str), String> {
    let (rest, default_port) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(rest), _) if tls.is_none() => (rest, 80),
        (_, Some(rest)) if tls.is_some() => (rest, 443),
        _ if tls.is_some() => return Err(format!("FAIL {url}: TLS needs an https:// URL")),
        _ => return Err(format!("FAIL {url}: only http:// URLs")),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let target = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']')
    {
        authority.to_string()
    } else {
        format!("{authority}:{default_port}")
    };
    let host = match tls {
        Some(tls) => match target.rsplit_once(':') {
            Some((_, "443")) | None => tls.name.clone(),
            Some((_, port)) => format!("{}:{port}", tls.name),
        },
        None => authority.to_string(),
    };
    Ok((target, host, path))
}

/// `tcp` as is, or with `tls` a TLS client on it (its handshake happens on
/// the first write).
fn open_stream(tcp: TcpStream, tls: Option<&TlsTarget>) -> Result<Conn, String> {
    let Some(tls) = tls else {
        return Ok(Conn::Plain(tcp));
    };
    let name = rustls::pki_types::ServerName::try_from(tls.name.clone())
        .map_err(|e| format!("FAIL TLS name {:?}: {e}", tls.name))?;
    let conn = rustls::ClientConnection::new(tls.config.clone(), name)
        .map_err(|e| format!("FAIL TLS: {e}"))?;
    Ok(Conn::Tls(Box::new(rustls::StreamOwned::new(conn, tcp))))
}

/// A response read to its end (head and body), when its first byte came
/// and when its body's last (µs since the request started).
struct Received {
    bytes: Vec<u8>,
    first_byte_us: u64,
    last_byte_us: Option<u64>,
}

/// Response buffers made ready before the clock ([`ready_buffers`]), for
/// the next requests to read into.
static READY: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());
/// How many [`READY`] holds, read without its lock: a request with none
/// ready (every small one) takes no lock.
static READY_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Make `count` response buffers of `len` bytes ready, every page written,
/// for the next `count` requests to read into. A bulk body then costs the
/// client what it costs the reference pair's (which keeps no body): no
/// page faults on a fresh 32 MiB allocation while the clock runs. Call it
/// before the clock starts.
#[cfg(feature = "bench")]
pub(crate) fn ready_buffers(count: usize, len: usize) {
    let mut ready = READY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for _ in 0..count {
        let mut buffer = vec![1u8; len];
        buffer.clear();
        ready.push(buffer);
    }
    READY_COUNT.store(ready.len(), Ordering::SeqCst);
}

/// A buffer made ready, or a new one.
fn response_buffer() -> Vec<u8> {
    if READY_COUNT.load(Ordering::Relaxed) == 0 {
        return Vec::new();
    }
    READY.lock().map_or_else(
        |_| Vec::new(),
        |mut ready| {
            let buffer = ready.pop().unwrap_or_default();
            READY_COUNT.store(ready.len(), Ordering::SeqCst);
            buffer
        },
    )
}

/// Read the response on `stream` until the server closes it.
fn read_response(stream: &mut Conn, started: Instant) -> Result<Received, String> {
    let mut response = response_buffer();
    // Enough for a small response in one read; a bulk body is read
    // straight into `response`, below.
    let mut buf = [0u8; 16 * 1024];
    let mut first_byte_us = 0;
    let mut last_byte_us = None;
    // Where the body starts and how long it is, once the head is in.
    let mut body_at: Option<(usize, Option<usize>)> = None;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if response.is_empty() {
                    first_byte_us = micros_since(started);
                }
                response.extend_from_slice(&buf[..n]);
                if body_at.is_none() {
                    if let Some(end) = find(&response, b"\r\n\r\n") {
                        let length = content_length(&response[..end]);
                        // A bulk body is read without regrowing the buffer
                        // (bounded: the origin is the testbed's own).
                        if let Some(len) = length {
                            response.reserve(len.min(MAX_RESERVE));
                        }
                        body_at = Some((end + 4, length));
                    }
                }
                if let Some((start, Some(len))) = body_at {
                    if last_byte_us.is_none() && response.len() < start + len {
                        // The rest of the body straight into the response
                        // (no copy through `buf`): a bulk body is then
                        // written once, as the reference pair's is.
                        let rest = (start + len - response.len()) as u64;
                        match (&mut *stream).take(rest).read_to_end(&mut response) {
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(format!("FAIL read: {e}")),
                        }
                    }
                    if last_byte_us.is_none() && response.len() >= start + len {
                        last_byte_us = Some(micros_since(started));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A TLS peer that closed without close_notify after the whole
            // body: the body is all there (Content-Length says so).
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && last_byte_us.is_some() => {
                break
            }
            Err(e) => return Err(format!("FAIL read: {e}")),
        }
    }
    Ok(Received {
        bytes: response,
        first_byte_us,
        last_byte_us,
    })
}

/// The largest body buffer reserved up front.
const MAX_RESERVE: usize = 64 << 20;

/// The Content-Length of a response head, if it has one.
fn content_length(head: &[u8]) -> Option<usize> {
    String::from_utf8_lossy(head).lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
}

/// What a batch of requests gave: the successful ones, and how many failed
/// (could not connect, or answered other than 2xx).
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) fetched: Vec<Fetched>,
    pub(crate) failures: usize,
    /// What the first failure was (its FAIL line, or the status it got).
    pub(crate) first_failure: Option<String>,
}

impl Batch {
    /// Total request times in milliseconds, sorted.
    pub(crate) fn totals_ms(&self) -> Vec<f64> {
        let mut times: Vec<f64> = self
            .fetched
            .iter()
            .map(|f| f.total_us as f64 / 1e3)
            .collect();
        times.sort_by(f64::total_cmp);
        times
    }

    /// The timing records of the successful requests, oldest first, with
    /// `label` as their `path`.
    pub(crate) fn records(&self, label: &str) -> Vec<TimingRecord> {
        let mut records: Vec<TimingRecord> = self
            .fetched
            .iter()
            .enumerate()
            .map(|(i, f)| TimingRecord {
                id: i as u64,
                sandbox: "probe".to_string(),
                path: label.to_string(),
                dst: f.dst.to_string(),
                host: None,
                verdict: crate::outcome::Verdict::Allow.as_str().to_string(),
                start: f.start_us,
                decide_us: None,
                connect_us: Some(f.connect_us),
                first_byte_us: Some(f.first_byte_us),
                total_us: f.total_us,
                bytes_up: f.bytes_up,
                bytes_down: f.body.len() as u64,
                reason: String::new(),
            })
            .collect();
        records.sort_by_key(|r| r.start);
        records
    }
}

/// `count` GETs of `url`, each on a fresh connection, `concurrency` in
/// flight at once (one thread each).
pub(crate) fn fetch_many(url: &str, count: usize, concurrency: usize) -> Result<Batch, String> {
    fetch_many_with(url, count, concurrency, None)
}

/// [`fetch_many`] with [`fetch_with`]'s `tls`.
pub(crate) fn fetch_many_with(
    url: &str,
    count: usize,
    concurrency: usize,
    tls: Option<TlsTarget>,
) -> Result<Batch, String> {
    let concurrency = concurrency.clamp(1, count.max(1));
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let next = next.clone();
            let url = url.to_string();
            let tls = tls.clone();
            std::thread::spawn(move || {
                let mut batch = Batch::default();
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    match fetch_with(&url, tls.as_ref()) {
                        Ok(f) if f.is_success() => batch.fetched.push(f),
                        Ok(f) => {
                            batch.failures += 1;
                            let why = format!("FAIL {url}: HTTP {}", f.status);
                            batch.first_failure.get_or_insert(why);
                        }
                        Err(why) => {
                            batch.failures += 1;
                            batch.first_failure.get_or_insert(why);
                        }
                    }
                }
                batch
            })
        })
        .collect();
    let mut all = Batch {
        fetched: Vec::with_capacity(count),
        failures: 0,
        first_failure: None,
    };
    for worker in workers {
        let batch = worker
            .join()
            .map_err(|_| "FAIL worker panicked".to_string())?;
        all.fetched.extend(batch.fetched);
        all.failures += batch.failures;
        if all.first_failure.is_none() {
            all.first_failure = batch.first_failure;
        }
    }
    Ok(all)
}

/// Write `records` to `path`: CSV when it ends in .csv, else JSONL.
pub(crate) fn write_timings(path: &Path, records: &[TimingRecord]) -> std::io::Result<()> {
    let mut text = String::new();
    let csv = path.extension().is_some_and(|e| e == "csv");
    if csv {
        text.push_str(crate::timing::CSV_HEADER);
        text.push('\n');
    }
    for r in records {
        if csv {
            crate::timing::push_csv(&mut text, r);
        } else {
            text.push_str(&serde_json::to_string(r).map_err(std::io::Error::other)?);
            text.push('\n');
        }
    }
    std::fs::write(path, text)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
