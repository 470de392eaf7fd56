//! First-bytes inspection: what hostname does a fresh client connection name?
//!
//! The proxy reads the client's first bytes into a bounded buffer and calls
//! [`inspect`] after every read until it says something other than
//! [`Peeked::NeedMore`] (or the buffer fills or a timeout fires; the proxy
//! then decides on the address alone). This module owns parsing a TLS
//! ClientHello (server_name) and an HTTP/1 request head (Host) out of those
//! bytes. It is pure: no I/O, no allocation, and it never modifies `buf`
//! (the proxy forwards those bytes unchanged). Every input, however hostile,
//! is answered in time linear in its length without panicking, and never
//! with a guess: a ClientHello or request head that names a host sluice
//! cannot read for certain (malformed, ambiguous, split, too large) is
//! [`Peeked::Unreadable`], which the proxy denies, because an origin may
//! read a name out of it that sluice did not. A `None` hostname means the
//! bytes name no host at all (a ClientHello without server_name, a request
//! without Host).

use std::str;

/// Largest ClientHello body we accept (its handshake header's length).
pub(crate) const MAX_CLIENT_HELLO: usize = 16 * 1024;

/// Largest TLS plaintext record payload (RFC 8446 section 5.1).
const MAX_RECORD: usize = 1 << 14;

/// Longest hostname (DNS presentation form without the trailing dot).
const MAX_HOSTNAME: usize = 253;

/// The first byte of a TLS handshake record.
pub(crate) const TLS_HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: usize = 0;
const NAME_TYPE_HOST: u8 = 0;

const METHODS: [&[u8]; 9] = [
    b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE",
];

/// The verdict on the first bytes of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peeked<'a> {
    /// Could become TLS or HTTP: read more (if the buffer has room).
    NeedMore,
    /// A TLS ClientHello; `sni` is its validated server_name host_name,
    /// `None` if it has no server_name extension.
    Tls { sni: Option<&'a str> },
    /// An HTTP/1 request head; `host` is the request's authority host (from
    /// the CONNECT target, an absolute-form target, or the Host header),
    /// without port, brackets or trailing dot, not lowercased; `None` if the
    /// request names no host (no Host header, or an empty one).
    Http { host: Option<&'a str> },
    /// A ClientHello (`http: false`) or request head (`http: true`) whose
    /// host cannot be read for certain: a malformed ClientHello or one over
    /// [`MAX_CLIENT_HELLO`], a server_name that is not a valid hostname or
    /// straddles a record boundary; two Host headers, a Host or target
    /// authority that is not a valid host and port, or an absolute-form
    /// target whose host differs from the Host header's.
    Unreadable { http: bool },
    /// Neither, or malformed.
    Other,
}

/// Classify the first bytes of a client connection.
///
/// TLS: returns `NeedMore` until the whole ClientHello has arrived, also when
/// it spans several TLS records (handshake fragments are walked in place).
/// A host_name that itself straddles a record boundary cannot be borrowed
/// from `buf` and is reported as [`Peeked::Unreadable`].
///
/// HTTP/1: returns `NeedMore` until the end of the request head (an empty
/// line, `\r\n\r\n` or bare `\n\n`), so that a second Host header is seen.
/// Empty lines before the request line are skipped, as origins skip them
/// (RFC 9112 section 2.2).
pub fn inspect(buf: &[u8]) -> Peeked<'_> {
    match buf.first() {
        None => Peeked::NeedMore,
        Some(&TLS_HANDSHAKE) => inspect_tls(buf),
        Some(b'\r' | b'\n') => match skip_blank_lines(buf) {
            [] => Peeked::NeedMore,
            [b, ..] if b.is_ascii_uppercase() => inspect_http(skip_blank_lines(buf)),
            _ => Peeked::Other,
        },
        Some(b) if b.is_ascii_uppercase() => inspect_http(buf),
        Some(_) => Peeked::Other,
    }
}

/// `buf` without the CR and LF bytes it starts with.
pub fn skip_blank_lines(buf: &[u8]) -> &[u8] {
    let blank = buf
        .iter()
        .take_while(|&&b| b == b'\r' || b == b'\n')
        .count();
    &buf[blank..]
}

// ---------------------------------------------------------------- TLS ----

/// Why a TLS walk stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The bytes so far are a valid prefix: wait for more.
    More,
    /// Malformed.
    Bad,
}

/// A forward-only reader over the handshake bytes carried by consecutive
/// handshake records in `buf`, skipping record headers; never copies.
#[derive(Clone)]
struct Handshake<'a> {
    buf: &'a [u8],
    /// Next unread byte in `buf`.
    pos: usize,
    /// End (in `buf`) of the current record's payload as declared.
    rec_end: usize,
}

impl<'a> Handshake<'a> {
    /// Position just after the first record's header, which the caller has
    /// validated.
    fn new(buf: &'a [u8], first_len: usize) -> Self {
        Handshake {
            buf,
            pos: 5,
            rec_end: 5 + first_len,
        }
    }

    /// Make sure at least one payload byte is readable at `pos`, moving to
    /// the next record if the current one is used up.
    fn ready(&mut self) -> Result<(), Stop> {
        if self.pos == self.rec_end {
            let h = self.buf.get(self.pos..self.pos + 5).ok_or(Stop::More)?;
            let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
            if h[0] != TLS_HANDSHAKE || h[1] != 3 || len == 0 || len > MAX_RECORD {
                return Err(Stop::Bad);
            }
            self.pos += 5;
            self.rec_end = self.pos + len;
        }
        if self.pos < self.buf.len() {
            Ok(())
        } else {
            Err(Stop::More)
        }
    }

    /// Bytes readable contiguously in the current record right now.
    fn run(&self) -> usize {
        self.rec_end.min(self.buf.len()) - self.pos
    }

    fn u8(&mut self) -> Result<u8, Stop> {
        self.ready()?;
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    fn u16(&mut self) -> Result<usize, Stop> {
        Ok(usize::from(self.u8()?) << 8 | usize::from(self.u8()?))
    }

    fn u24(&mut self) -> Result<usize, Stop> {
        Ok(usize::from(self.u8()?) << 16 | self.u16()?)
    }

    fn skip(&mut self, mut n: usize) -> Result<(), Stop> {
        while n > 0 {
            self.ready()?;
            let k = n.min(self.run());
            self.pos += k;
            n -= k;
        }
        Ok(())
    }

    /// The next `n` bytes if they sit in one record (`None` if they straddle
    /// a record boundary; they are consumed either way).
    fn slice(&mut self, n: usize) -> Result<Option<&'a [u8]>, Stop> {
        if n == 0 {
            return Ok(Some(&[]));
        }
        self.ready()?;
        if self.run() >= n {
            let s = &self.buf[self.pos..self.pos + n];
            self.pos += n;
            Ok(Some(s))
        } else {
            self.skip(n)?;
            Ok(None)
        }
    }
}

/// Handshake-byte counter: how much of the ClientHello body has been read.
struct Body<'a> {
    hs: Handshake<'a>,
    read: usize,
    len: usize,
}

impl<'a> Body<'a> {
    fn left(&self) -> usize {
        self.len - self.read
    }

    fn need(&self, n: usize) -> Result<(), Stop> {
        if n <= self.left() {
            Ok(())
        } else {
            Err(Stop::Bad)
        }
    }

    fn u8(&mut self) -> Result<u8, Stop> {
        self.need(1)?;
        self.read += 1;
        self.hs.u8()
    }

    fn u16(&mut self) -> Result<usize, Stop> {
        self.need(2)?;
        self.read += 2;
        self.hs.u16()
    }

    fn skip(&mut self, n: usize) -> Result<(), Stop> {
        self.need(n)?;
        self.read += n;
        self.hs.skip(n)
    }

    fn slice(&mut self, n: usize) -> Result<Option<&'a [u8]>, Stop> {
        self.need(n)?;
        self.read += n;
        self.hs.slice(n)
    }
}

fn inspect_tls(buf: &[u8]) -> Peeked<'_> {
    // Record header: type 22, version 0x03xx, a sane length.
    if buf.len() >= 2 && buf[1] != 3 {
        return Peeked::Other;
    }
    if buf.len() < 5 {
        return Peeked::NeedMore;
    }
    let first_len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if first_len == 0 || first_len > MAX_RECORD {
        return Peeked::Other;
    }
    let mut hs = Handshake::new(buf, first_len);
    let header = (|| {
        let ty = hs.u8()?;
        let len = hs.u24()?;
        Ok::<_, Stop>((ty, len))
    })();
    let len = match header {
        Err(Stop::More) => return Peeked::NeedMore,
        Err(Stop::Bad) => return UNREADABLE_HELLO,
        Ok((CLIENT_HELLO, len)) => len,
        Ok(_) => return Peeked::Other,
    };
    if len > MAX_CLIENT_HELLO {
        return UNREADABLE_HELLO;
    }
    // Wait for the whole ClientHello before trusting anything in it.
    match hs.clone().skip(len) {
        Ok(()) => {}
        Err(Stop::More) => return Peeked::NeedMore,
        Err(Stop::Bad) => return UNREADABLE_HELLO,
    }
    let mut body = Body { hs, read: 0, len };
    match client_hello_sni(&mut body) {
        Ok(sni) => Peeked::Tls { sni },
        // Everything is present, so running out means a length lied.
        Err(_) => UNREADABLE_HELLO,
    }
}

const UNREADABLE_HELLO: Peeked<'static> = Peeked::Unreadable { http: false };

/// Walk a complete ClientHello body; the validated host_name, if exactly one;
/// `Bad` if a host_name is there but not a valid hostname, or straddles a
/// record boundary (a server reassembles it; sluice does not guess).
fn client_hello_sni<'a>(b: &mut Body<'a>) -> Result<Option<&'a str>, Stop> {
    b.skip(2 + 32)?; // legacy_version, random
    let session_id = usize::from(b.u8()?);
    if session_id > 32 {
        return Err(Stop::Bad);
    }
    b.skip(session_id)?;
    let suites = b.u16()?;
    if suites < 2 || suites % 2 != 0 {
        return Err(Stop::Bad);
    }
    b.skip(suites)?;
    let compression = usize::from(b.u8()?);
    if compression == 0 {
        return Err(Stop::Bad);
    }
    b.skip(compression)?;
    if b.left() == 0 {
        return Ok(None); // no extensions at all
    }
    let ext_total = b.u16()?;
    if ext_total != b.left() {
        return Err(Stop::Bad);
    }
    let mut sni = None;
    let mut seen = false;
    while b.left() > 0 {
        let ty = b.u16()?;
        let len = b.u16()?;
        b.need(len)?;
        if ty != EXT_SERVER_NAME {
            b.skip(len)?;
            continue;
        }
        if seen {
            return Err(Stop::Bad); // duplicate extension
        }
        seen = true;
        let end = b.read + len;
        let list = b.u16()?;
        if list + 2 != len {
            return Err(Stop::Bad);
        }
        let mut hosts = 0;
        while b.read < end {
            let name_type = b.u8()?;
            let n = b.u16()?;
            if b.read + n > end {
                return Err(Stop::Bad);
            }
            let name = b.slice(n)?;
            if name_type == NAME_TYPE_HOST {
                hosts += 1;
                sni = Some(name.and_then(valid_hostname).ok_or(Stop::Bad)?);
            }
        }
        if hosts > 1 {
            return Err(Stop::Bad); // RFC 6066: one name per type
        }
    }
    Ok(sni)
}

/// `name` as a hostname: ASCII letters, digits, `-` and `.`, labels of
/// 1..=63 bytes, at most 253 bytes; one trailing dot is dropped.
fn valid_hostname(name: &[u8]) -> Option<&str> {
    let name = name.strip_suffix(b".").unwrap_or(name);
    if name.is_empty() || name.len() > MAX_HOSTNAME {
        return None;
    }
    let labels_ok = name
        .split(|&b| b == b'.')
        .all(|l| !l.is_empty() && l.len() <= 63);
    let chars_ok = name
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if labels_ok && chars_ok {
        str::from_utf8(name).ok()
    } else {
        None
    }
}

// --------------------------------------------------------------- HTTP ----

fn inspect_http(buf: &[u8]) -> Peeked<'_> {
    // Method token and one space; a prefix of one may still grow into one.
    let Some(sp) = buf.iter().take(8).position(|&b| b == b' ') else {
        let prefix = METHODS
            .iter()
            .any(|m| buf.len() <= m.len() && m.starts_with(buf));
        return if prefix {
            Peeked::NeedMore
        } else {
            Peeked::Other
        };
    };
    let method = &buf[..sp];
    if !METHODS.contains(&method) {
        return Peeked::Other;
    }
    let Some(head) = head_of(buf) else {
        return Peeked::NeedMore;
    };
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let Some(target) = lines.next().and_then(|l| request_target(l, sp)) else {
        return Peeked::Other;
    };
    let mut host_header = None;
    let mut host_count = 0;
    for line in lines {
        if line.is_empty() {
            break; // the end of the head
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Peeked::Other;
        };
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Peeked::Other; // includes obs-fold continuation lines
        }
        if name.eq_ignore_ascii_case(b"host") {
            host_count += 1;
            host_header = Some(line[colon + 1..].trim_ascii());
        }
    }
    const UNREADABLE: Peeked<'static> = Peeked::Unreadable { http: true };
    // Two Host headers are ambiguous (RFC 9112 section 3.2: reject): origins
    // differ in which one they take.
    if host_count > 1 {
        return UNREADABLE;
    }
    let header = match host_header {
        None | Some([]) => None,
        Some(value) => match authority_host(value) {
            Some(host) => Some(host),
            None => return UNREADABLE,
        },
    };
    let authority = if method == b"CONNECT" {
        Some(target)
    } else {
        absolute_authority(target)
    };
    let Some(authority) = authority else {
        return Peeked::Http { host: header };
    };
    // The target's authority is what RFC 9112 says an origin takes; some
    // take the Host header instead, so the two must agree.
    match authority_host(authority) {
        Some(host) if header.is_none_or(|h| h.eq_ignore_ascii_case(host)) => {
            Peeked::Http { host: Some(host) }
        }
        _ => UNREADABLE,
    }
}

/// The request head up to and including its empty line, if complete.
fn head_of(buf: &[u8]) -> Option<&[u8]> {
    let mut from = 0;
    while let Some(i) = buf[from..].iter().position(|&b| b == b'\n') {
        let nl = from + i;
        let rest = &buf[nl + 1..];
        if rest.starts_with(b"\n") {
            return Some(&buf[..nl + 2]);
        }
        if rest.starts_with(b"\r\n") {
            return Some(&buf[..nl + 3]);
        }
        from = nl + 1;
    }
    None
}

/// `METHOD SP target SP HTTP/1.x`: the target.
fn request_target(line: &[u8], sp: usize) -> Option<&[u8]> {
    let rest = &line[sp + 1..];
    let end = rest.iter().position(|&b| b == b' ')?;
    let (target, version) = (&rest[..end], &rest[end + 1..]);
    let visible = |b: &u8| b.is_ascii_graphic();
    if target.is_empty() || !target.iter().all(visible) {
        return None;
    }
    if version != b"HTTP/1.1" && version != b"HTTP/1.0" {
        return None;
    }
    Some(target)
}

/// The authority of an absolute-form target (`http://host:port/path`),
/// which takes precedence over the Host header (RFC 9112 section 3.2.2).
/// Any scheme counts: origins read the host of `ftp://host/` too.
fn absolute_authority(target: &[u8]) -> Option<&[u8]> {
    let scheme_end = target.windows(3).position(|w| w == b"://")?;
    let scheme = &target[..scheme_end];
    // RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ); an origin-form
    // target ("/a?u=http://b") starts with "/" and is not one.
    let scheme_ok = scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return None;
    }
    let rest = &target[scheme_end + 3..];
    let end = rest
        .iter()
        .position(|&b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    let authority = &rest[..end];
    // Drop userinfo.
    Some(match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    })
}

/// `host[:port]` or `[v6][:port]` -> the host (an IPv6 literal without its
/// brackets), validated; `None` if anything is off.
fn authority_host(authority: &[u8]) -> Option<&str> {
    let port_ok = |port: &[u8]| port.len() <= 5 && port.iter().all(u8::is_ascii_digit);
    if let Some(rest) = authority.strip_prefix(b"[") {
        let close = rest.iter().position(|&b| b == b']')?;
        let (literal, after) = (&rest[..close], &rest[close + 1..]);
        let literal_ok = literal.contains(&b':')
            && literal
                .iter()
                .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
        let port = match after {
            [] => &[][..],
            [b':', port @ ..] => port,
            _ => return None,
        };
        return (literal_ok && port_ok(port))
            .then(|| str::from_utf8(literal).ok())
            .flatten();
    }
    let (host, port) = match authority.iter().position(|&b| b == b':') {
        Some(c) => (&authority[..c], &authority[c + 1..]),
        None => (authority, &[][..]),
    };
    if !port_ok(port) {
        return None;
    }
    valid_hostname(host)
}

/// RFC 9110 token characters (header field names).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests;
