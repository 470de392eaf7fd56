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
pub const MAX_CLIENT_HELLO: usize = 16 * 1024;

/// Largest TLS plaintext record payload (RFC 8446 section 5.1).
const MAX_RECORD: usize = 1 << 14;

/// Longest hostname (DNS presentation form without the trailing dot).
const MAX_HOSTNAME: usize = 253;

/// The first byte of a TLS handshake record.
pub const TLS_HANDSHAKE: u8 = 22;
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
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;

    fn client_hello(server: &str, sni: bool) -> Vec<u8> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        config.enable_sni = sni;
        let name = rustls::pki_types::ServerName::try_from(server.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        out
    }

    /// Re-frame the handshake bytes of a one-record ClientHello into records
    /// whose payloads end at each of `cuts` (offsets into the handshake).
    fn reframe(hello: &[u8], cuts: &[usize]) -> Vec<u8> {
        let len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
        assert_eq!(hello.len(), 5 + len, "one record expected");
        let hs = &hello[5..];
        let mut out = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain(std::iter::once(&hs.len())) {
            let part = &hs[from..to];
            out.extend_from_slice(&[22, hello[1], hello[2]]);
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
            from = to;
        }
        out
    }

    /// Offset in the handshake bytes of the SNI host_name.
    fn sni_offset(hello: &[u8], name: &str) -> usize {
        hello
            .windows(name.len())
            .position(|w| w == name.as_bytes())
            .unwrap()
            - 5
    }

    #[test]
    fn tls_client_hello_yields_sni() {
        let hello = client_hello("pypi.org", true);
        assert_eq!(
            inspect(&hello),
            Peeked::Tls {
                sni: Some("pypi.org")
            }
        );
    }

    #[test]
    fn tls_without_sni_yields_none() {
        let hello = client_hello("198.18.0.1", true); // IP names send no SNI
        assert_eq!(inspect(&hello), Peeked::Tls { sni: None });
        let hello = client_hello("pypi.org", false);
        assert_eq!(inspect(&hello), Peeked::Tls { sni: None });
    }

    #[test]
    fn tls_one_byte_at_a_time_needs_more_until_complete() {
        let hello = client_hello("files.pythonhosted.org", true);
        for end in 1..hello.len() {
            assert_eq!(inspect(&hello[..end]), Peeked::NeedMore, "at {end}");
        }
        assert_eq!(
            inspect(&hello),
            Peeked::Tls {
                sni: Some("files.pythonhosted.org")
            }
        );
    }

    #[test]
    fn tls_hello_split_across_records_is_reassembled() {
        let hello = client_hello("pypi.org", true);
        let hs_len = hello.len() - 5;
        // Cut inside the handshake header, then in the middle of the body
        // (but not inside the name: rustls orders extensions at random, so
        // the name's offset varies from one ClientHello to the next).
        let at = sni_offset(&hello, "pypi.org");
        let mut mid = hs_len / 2;
        if (at..=at + "pypi.org".len()).contains(&mid) {
            mid = at + "pypi.org".len() + 1;
        }
        let two = reframe(&hello, &[2, mid]);
        assert_eq!(
            inspect(&two),
            Peeked::Tls {
                sni: Some("pypi.org")
            }
        );
        for end in 1..two.len() {
            assert_eq!(inspect(&two[..end]), Peeked::NeedMore, "at {end}");
        }
        // One record per handshake byte.
        let cuts: Vec<usize> = (1..hs_len).collect();
        let many = reframe(&hello, &cuts);
        // The name straddles records: a server reassembles it, sluice does
        // not guess.
        assert_eq!(inspect(&many), Peeked::Unreadable { http: false });
        // A cut just before and just after the name keeps it whole.
        let around = reframe(&hello, &[at, at + "pypi.org".len()]);
        assert_eq!(
            inspect(&around),
            Peeked::Tls {
                sni: Some("pypi.org")
            }
        );
        // A cut inside the name makes it unreadable (denied).
        let inside = reframe(&hello, &[at + 3]);
        assert_eq!(inspect(&inside), Peeked::Unreadable { http: false });
    }

    #[test]
    fn tls_trailing_application_bytes_are_ignored() {
        let mut hello = client_hello("pypi.org", true);
        hello.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
        assert_eq!(
            inspect(&hello),
            Peeked::Tls {
                sni: Some("pypi.org")
            }
        );
    }

    #[test]
    fn tls_record_of_other_type_mid_hello_is_malformed() {
        let hello = client_hello("pypi.org", true);
        let mut two = reframe(&hello, &[10]);
        let second = 5 + 10;
        two[second] = 23;
        assert_eq!(inspect(&two), Peeked::Unreadable { http: false });
    }

    #[test]
    fn tls_truncated_or_lying_lengths_are_rejected() {
        let hello = client_hello("pypi.org", true);
        // Handshake length larger than 16 KiB.
        let mut huge = hello.clone();
        huge[6..9].copy_from_slice(&[0x01, 0x00, 0x00]);
        assert_eq!(inspect(&huge), Peeked::Unreadable { http: false });
        // Record length 0 or beyond 2^14.
        let mut zero = hello.clone();
        zero[3..5].copy_from_slice(&[0, 0]);
        assert_eq!(inspect(&zero), Peeked::Other);
        let mut big = hello.clone();
        big[3..5].copy_from_slice(&[0x40, 0x01]);
        assert_eq!(inspect(&big), Peeked::Other);
        // Handshake length shorter than the real body: extension lengths lie.
        let mut short = hello.clone();
        let real = usize::from(hello[7]) << 8 | usize::from(hello[8]);
        short[7..9].copy_from_slice(&((real - 20) as u16).to_be_bytes());
        assert_eq!(inspect(&short), Peeked::Unreadable { http: false });
        // Not a ClientHello.
        let mut server_hello = hello.clone();
        server_hello[5] = 2;
        assert_eq!(inspect(&server_hello), Peeked::Other);
    }

    #[test]
    fn tls_invalid_hostname_is_unreadable() {
        for bad in ["a..b", "-x_y.com", ".lead", "sp ace.test"] {
            // Same length as "pypi.org.test" so lengths stay right.
            let hello = client_hello("pypi.org.test", true);
            let at = sni_offset(&hello, "pypi.org.test") + 5;
            let mut mutated = hello.clone();
            let mut name = bad.as_bytes().to_vec();
            name.resize(13, b'x');
            mutated[at..at + 13].copy_from_slice(&name);
            assert_eq!(
                inspect(&mutated),
                Peeked::Unreadable { http: false },
                "{bad}"
            );
        }
    }

    #[test]
    fn hostname_validation() {
        assert_eq!(valid_hostname(b"Example.COM."), Some("Example.COM"));
        assert_eq!(valid_hostname(b"a-1.b"), Some("a-1.b"));
        assert_eq!(valid_hostname(b""), None);
        assert_eq!(valid_hostname(b"."), None);
        assert_eq!(valid_hostname(b"a..b"), None);
        assert_eq!(valid_hostname(b"a_b.c"), None);
        assert_eq!(valid_hostname(&[b'a'; 64]), None);
        let long = [&b"abcdefghi."[..]; 26].concat(); // 260 bytes
        assert_eq!(valid_hostname(&long), None);
    }

    #[test]
    fn not_tls_or_http_is_other_at_once() {
        assert_eq!(inspect(b""), Peeked::NeedMore);
        assert_eq!(inspect(b"\x00"), Peeked::Other);
        assert_eq!(inspect(b"SSH-2.0-OpenSSH\r\n"), Peeked::Other);
        assert_eq!(inspect(b"get / HTTP/1.1\r\n"), Peeked::Other);
        assert_eq!(inspect(b"\x16\x02"), Peeked::Other);
        assert_eq!(inspect(b"\x16"), Peeked::NeedMore);
        assert_eq!(inspect(b"\x16\x03\x01"), Peeked::NeedMore);
        assert_eq!(inspect(b"\x80\x2e\x01\x03\x01"), Peeked::Other);
    }

    #[test]
    fn http_host_header_without_port() {
        let req = b"GET /simple/ HTTP/1.1\r\nUser-Agent: x\r\nHost: pypi.org:8080\r\n\r\n";
        assert_eq!(
            inspect(req),
            Peeked::Http {
                host: Some("pypi.org")
            }
        );
    }

    #[test]
    fn http_host_header_plain_lowercase_name_and_whitespace() {
        let req = b"POST /x HTTP/1.1\r\nhost: \t Origin.Test. \r\ncontent-length: 3\r\n\r\nabc";
        assert_eq!(
            inspect(req),
            Peeked::Http {
                host: Some("Origin.Test")
            }
        );
        let req = b"HEAD / HTTP/1.0\nHOST: origin.test\n\n";
        assert_eq!(
            inspect(req),
            Peeked::Http {
                host: Some("origin.test")
            }
        );
    }

    #[test]
    fn http_ipv6_literal_host_loses_brackets() {
        let req = b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\n\r\n";
        assert_eq!(
            inspect(req),
            Peeked::Http {
                host: Some("2001:db8::1")
            }
        );
        let req = b"GET / HTTP/1.1\r\nHost: [2001:db8::1]\r\n\r\n";
        assert_eq!(
            inspect(req),
            Peeked::Http {
                host: Some("2001:db8::1")
            }
        );
        let req = b"GET / HTTP/1.1\r\nHost: [2001:db8::1\r\n\r\n";
        assert_eq!(inspect(req), Peeked::Unreadable { http: true });
    }

    #[test]
    fn http_connect_uses_request_target() {
        for req in [
            &b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n"[..],
            b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: PyPI.org:443\r\n\r\n",
        ] {
            assert_eq!(
                inspect(req),
                Peeked::Http {
                    host: Some("pypi.org")
                }
            );
        }
        let other = b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: other.test\r\n\r\n";
        assert_eq!(inspect(other), Peeked::Unreadable { http: true });
    }

    #[test]
    fn http_absolute_form_target_names_the_host_whatever_its_scheme() {
        for req in [
            &b"GET http://user@pypi.org:80/x HTTP/1.1\r\n\r\n"[..],
            b"GET http://pypi.org/x HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            b"GET ftp://pypi.org/x HTTP/1.1\r\n\r\n",
            b"GET svn+ssh://pypi.org HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(
                inspect(req),
                Peeked::Http {
                    host: Some("pypi.org")
                },
                "{}",
                String::from_utf8_lossy(req)
            );
        }
        // A URL in an origin-form target's query is not an authority.
        let req = b"GET /go?to=http://other.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n";
        assert_eq!(
            inspect(req),
            Peeked::Http {
                host: Some("pypi.org")
            }
        );
    }

    #[test]
    fn http_absolute_form_target_and_host_header_that_differ_are_unreadable() {
        let req = b"GET http://pypi.org/x HTTP/1.1\r\nHost: other.test\r\n\r\n";
        assert_eq!(inspect(req), Peeked::Unreadable { http: true });
        let req = b"GET http://pypi.org:x/ HTTP/1.1\r\n\r\n";
        assert_eq!(inspect(req), Peeked::Unreadable { http: true });
    }

    #[test]
    fn http_missing_or_empty_host_is_none() {
        let req = b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n";
        assert_eq!(inspect(req), Peeked::Http { host: None });
        let req = b"GET / HTTP/1.1\r\nHost: \r\n\r\n";
        assert_eq!(inspect(req), Peeked::Http { host: None });
    }

    #[test]
    fn http_duplicate_or_invalid_host_is_unreadable() {
        for req in [
            &b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a.test\r\nhost: a.test\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.test:x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.test:123456\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a_b.test\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a.test b.test\r\n\r\n",
        ] {
            assert_eq!(
                inspect(req),
                Peeked::Unreadable { http: true },
                "{}",
                String::from_utf8_lossy(req)
            );
        }
    }

    #[test]
    fn http_blank_lines_before_the_request_line_are_skipped() {
        let req = b"\r\n\r\nGET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n";
        assert_eq!(
            inspect(req),
            Peeked::Http {
                host: Some("pypi.org")
            }
        );
        assert_eq!(inspect(b"\r\n"), Peeked::NeedMore);
        assert_eq!(inspect(b"\n\nGE"), Peeked::NeedMore);
        assert_eq!(inspect(b"\r\nSSH-2.0"), Peeked::Other);
        assert_eq!(inspect(b"\r\n\x16\x03"), Peeked::Other);
    }

    #[test]
    fn http_partial_head_needs_more() {
        let req: &[u8] = b"DELETE /a HTTP/1.1\r\nHost: pypi.org\r\n\r\n";
        for end in 1..req.len() {
            assert_eq!(inspect(&req[..end]), Peeked::NeedMore, "at {end}");
        }
        assert_eq!(
            inspect(req),
            Peeked::Http {
                host: Some("pypi.org")
            }
        );
    }

    #[test]
    fn http_invalid_is_other() {
        assert_eq!(inspect(b"GETX / HTTP/1.1\r\n\r\n"), Peeked::Other);
        assert_eq!(inspect(b"FETCH /"), Peeked::Other);
        assert_eq!(inspect(b"GET /\r\n\r\n"), Peeked::Other);
        assert_eq!(inspect(b"GET / HTTP/2.0\r\n\r\n"), Peeked::Other);
        assert_eq!(inspect(b"GET  / HTTP/1.1\r\n\r\n"), Peeked::Other);
        let folded = b"GET / HTTP/1.1\r\nHost: a.test\r\n b.test\r\n\r\n";
        assert_eq!(inspect(folded), Peeked::Other);
        let no_colon = b"GET / HTTP/1.1\r\nHost a.test\r\n\r\n";
        assert_eq!(inspect(no_colon), Peeked::Other);
    }

    #[test]
    fn hostile_inputs_never_panic() {
        // Seeded, so a failure reproduces.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        let hello = client_hello("pypi.org", true);
        let split = reframe(&hello, &[3, 40, 100]);
        let seeds: [&[u8]; 4] = [
            &hello,
            &split,
            b"GET http://a.test/ HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
            b"CONNECT a.test:443 HTTP/1.1\r\n\r\n",
        ];
        for i in 0..20_000 {
            let seed = seeds[i % seeds.len()];
            let mut input = seed.to_vec();
            match rng.random_range(0..4) {
                0 => {
                    for _ in 0..=rng.random_range(0..8) {
                        let at = rng.random_range(0..input.len());
                        input[at] = rng.random::<u8>();
                    }
                }
                1 => input.truncate(rng.random_range(0..=input.len())),
                2 => {
                    let at = rng.random_range(0..input.len());
                    input.insert(at, rng.random::<u8>());
                }
                _ => {
                    let n = rng.random_range(0..64);
                    input = (0..n).map(|_| rng.random::<u8>()).collect();
                    if n > 0 && rng.random_bool(0.5) {
                        input[0] = TLS_HANDSHAKE;
                    }
                }
            }
            let _ = inspect(&input);
        }
    }
}
