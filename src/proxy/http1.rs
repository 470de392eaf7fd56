//! HTTP/1 request framing, for the connections whose every request is
//! decided on its own Host ([`super::session`]): where a request head ends,
//! how long the body after it is (Content-Length, or chunked), and which
//! heads sluice refuses to relay because an origin could read them
//! differently than sluice does (the ways requests are smuggled past a
//! proxy): bare CR or LF line endings, control bytes, Content-Length and
//! Transfer-Encoding together, conflicting or malformed lengths, a transfer
//! coding other than a final `chunked`, and protocol switches (Upgrade,
//! CONNECT) after which the bytes are no longer requests.
//!
//! Pure: no I/O, no allocation, linear in its input, never panics; it never
//! modifies the bytes (the session forwards them as they came). The Host is
//! [`super::peek::inspect`]'s to read; this module only frames.

/// Longest chunk-size line (size and extensions), like a small header.
pub(crate) const MAX_CHUNK_LINE: usize = 1024;
/// Largest trailer section after the last chunk.
pub(crate) const MAX_TRAILERS: usize = 16 * 1024;

/// One request head, framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Bytes of the head, its final empty line included.
    pub head_len: usize,
    pub(crate) body: Body,
}

/// What follows a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    None,
    /// Exactly this many bytes (never 0: that is `None`).
    Length(u64),
    /// Chunks up to the last chunk and its trailer section ([`Chunked`]).
    Chunked,
}

/// Why a request is not relayed (the words are shared with every record).
pub(crate) use crate::outcome::Refusal;

/// Frame the request head at the start of `buf`, which
/// [`super::peek::inspect`] found complete (`Peeked::Http`). Its end is the
/// first CRLF CRLF; every line must end in CRLF.
pub fn request(buf: &[u8]) -> Result<Request, Refusal> {
    let head_len = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .ok_or(Refusal::BareLineEnding)?;
    let head = &buf[..head_len];
    for (i, &b) in head.iter().enumerate() {
        match b {
            b'\r' if head.get(i + 1) != Some(&b'\n') => return Err(Refusal::BareLineEnding),
            b'\n' if i == 0 || head[i - 1] != b'\r' => return Err(Refusal::BareLineEnding),
            b'\r' | b'\n' | b'\t' => {}
            0..=0x1f | 0x7f => return Err(Refusal::ControlByte),
            _ => {}
        }
    }
    let mut lines = head[..head_len - 4].split(|&b| b == b'\n').map(trim_cr);
    let request_line = lines.next().unwrap_or_default();
    if request_line.starts_with(b"CONNECT ") {
        return Err(Refusal::Connect);
    }
    let http10 = request_line.ends_with(b" HTTP/1.0");
    let mut length: Option<u64> = None;
    let mut codings = Codings::default();
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue; // inspect refused such a head already
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"content-length") {
            for item in value.split(|&b| b == b',') {
                let n = decimal(item.trim_ascii()).ok_or(Refusal::BadLength)?;
                if length.is_some_and(|l| l != n) {
                    return Err(Refusal::ConflictingLength);
                }
                length = Some(n);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            codings.add(value)?;
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            return Err(Refusal::Upgrade);
        }
    }
    let body = match (codings.seen, length) {
        (true, Some(_)) => return Err(Refusal::ConflictingLength),
        (true, None) if http10 || !codings.chunked_last => {
            return Err(Refusal::BadTransferEncoding)
        }
        (true, None) => Body::Chunked,
        (false, Some(0) | None) => Body::None,
        (false, Some(n)) => Body::Length(n),
    };
    Ok(Request { head_len, body })
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// A Content-Length value: 1 to 18 decimal digits (never overflows).
fn decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 18 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
}

/// The transfer codings of all Transfer-Encoding fields, in order.
#[derive(Default)]
struct Codings {
    seen: bool,
    chunked_last: bool,
}

impl Codings {
    fn add(&mut self, value: &[u8]) -> Result<(), Refusal> {
        for coding in value.split(|&b| b == b',') {
            let coding = coding.trim_ascii();
            let name = coding
                .split(|&b| b == b';')
                .next()
                .unwrap_or_default()
                .trim_ascii();
            if name.is_empty() {
                continue; // empty list elements are allowed
            }
            // Nothing may follow chunked, and it comes once.
            if self.chunked_last {
                return Err(Refusal::BadTransferEncoding);
            }
            self.seen = true;
            self.chunked_last = name.eq_ignore_ascii_case(b"chunked");
        }
        Ok(())
    }
}

/// Walks a chunked body as its bytes arrive, to find where it ends. It only
/// counts; the bytes are forwarded unchanged.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chunked {
    state: State,
    /// Bytes of the current chunk-size line, or of the trailer section.
    line: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum State {
    /// Reading the chunk size: `digits` hex digits so far.
    #[default]
    SizeStart,
    Size {
        digits: u8,
        value: u64,
    },
    /// Whitespace after the size, before `;`.
    SizeSpace {
        value: u64,
    },
    /// A chunk extension, up to CR.
    Extension {
        value: u64,
    },
    /// CR of the size line read; LF expected.
    SizeLf {
        value: u64,
    },
    /// This many data bytes left.
    Data(u64),
    DataCr,
    DataLf,
    /// At the start of a trailer line (or of the final empty line).
    TrailerStart,
    TrailerLine,
    TrailerLf,
    EndLf,
    Done,
}

/// How far [`Chunked::advance`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Bytes of the input that belong to the body.
    pub(crate) consumed: usize,
    /// The body ended within them (the rest is the next request).
    pub(crate) done: bool,
}

impl Chunked {
    /// Read `bytes`, the next bytes of the body.
    pub(crate) fn advance(&mut self, bytes: &[u8]) -> Result<Progress, Refusal> {
        let mut i = 0;
        while i < bytes.len() && self.state != State::Done {
            if let State::Data(left) = self.state {
                let take = left.min((bytes.len() - i) as u64);
                i += take as usize;
                self.state = if take == left {
                    State::DataCr
                } else {
                    State::Data(left - take)
                };
                continue;
            }
            self.step(bytes[i])?;
            i += 1;
        }
        Ok(Progress {
            consumed: i,
            done: self.state == State::Done,
        })
    }

    /// True once the last chunk and its trailers have been read.
    #[cfg(test)]
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    fn step(&mut self, b: u8) -> Result<(), Refusal> {
        use State::*;
        let bad = Err(Refusal::BadChunk);
        if matches!(
            self.state,
            SizeStart | Size { .. } | SizeSpace { .. } | Extension { .. }
        ) {
            self.line += 1;
            if self.line > MAX_CHUNK_LINE {
                return bad;
            }
        }
        if matches!(self.state, TrailerStart | TrailerLine | TrailerLf | EndLf) {
            self.line += 1;
            if self.line > MAX_TRAILERS {
                return bad;
            }
        }
        self.state = match (self.state, b) {
            (SizeStart, _) => match hex(b) {
                Some(d) => Size {
                    digits: 1,
                    value: d,
                },
                None => return bad,
            },
            (Size { digits, value }, _) if hex(b).is_some() => {
                if digits == 15 {
                    return bad; // more than 2^60 bytes: no real chunk
                }
                Size {
                    digits: digits + 1,
                    value: (value << 4) | hex(b).unwrap_or(0),
                }
            }
            (Size { value, .. }, b' ' | b'\t') => SizeSpace { value },
            (Size { value, .. } | SizeSpace { value }, b';') => Extension { value },
            (SizeSpace { value }, b' ' | b'\t') => SizeSpace { value },
            (Size { value, .. } | Extension { value }, b'\r') => SizeLf { value },
            (Extension { value }, _) if b == b'\t' || (b >= 0x20 && b != 0x7f) => {
                Extension { value }
            }
            (SizeLf { value: 0 }, b'\n') => {
                self.line = 0;
                TrailerStart
            }
            (SizeLf { value }, b'\n') => Data(value),
            (DataCr, b'\r') => DataLf,
            (DataLf, b'\n') => {
                self.line = 0;
                SizeStart
            }
            (TrailerStart, b'\r') => EndLf,
            (TrailerLine, b'\r') => TrailerLf,
            (TrailerStart | TrailerLine, _) if b == b'\t' || (b >= 0x20 && b != 0x7f) => {
                TrailerLine
            }
            (TrailerLf, b'\n') => TrailerStart,
            (EndLf, b'\n') => Done,
            _ => return bad,
        };
        Ok(())
    }
}

fn hex(b: u8) -> Option<u64> {
    (b as char).to_digit(16).map(u64::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(head: &str) -> Result<Request, Refusal> {
        request(head.as_bytes())
    }

    #[test]
    fn a_head_without_body_ends_at_its_empty_line() {
        let head = "GET / HTTP/1.1\r\nHost: a.test\r\n\r\nGET /next";
        assert_eq!(
            framed(head),
            Ok(Request {
                head_len: head.len() - "GET /next".len(),
                body: Body::None
            })
        );
    }

    #[test]
    fn content_length_frames_the_body() {
        let head = "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 12\r\n\r\n";
        assert_eq!(framed(head).unwrap().body, Body::Length(12));
        let same = "POST / HTTP/1.1\r\nContent-Length: 5, 5\r\ncontent-length: 5\r\n\r\n";
        assert_eq!(framed(same).unwrap().body, Body::Length(5));
        let zero = "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(framed(zero).unwrap().body, Body::None);
    }

    #[test]
    fn chunked_is_the_body_when_it_is_the_last_coding() {
        let head =
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: Chunked\r\n\r\n";
        assert_eq!(framed(head).unwrap().body, Body::Chunked);
    }

    #[test]
    fn heads_an_origin_could_read_differently_are_refused() {
        for (head, why) in [
            ("GET / HTTP/1.1\nHost: a\n\n", Refusal::BareLineEnding),
            ("GET / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n", Refusal::BareLineEnding),
            ("GET / HTTP/1.1\r\nHost: a\rContent-Length: 5\r\n\r\n", Refusal::BareLineEnding),
            ("GET / HTTP/1.1\r\nHost: a\0b\r\n\r\n", Refusal::ControlByte),
            (
                "POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                Refusal::ConflictingLength,
            ),
            (
                "POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                Refusal::ConflictingLength,
            ),
            ("POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", Refusal::BadLength),
            ("POST / HTTP/1.1\r\nContent-Length: 0x5\r\n\r\n", Refusal::BadLength),
            ("POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", Refusal::BadLength),
            (
                "POST / HTTP/1.1\r\nContent-Length: 1234567890123456789\r\n\r\n",
                Refusal::BadLength,
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                Refusal::BadTransferEncoding,
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                Refusal::BadTransferEncoding,
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: identity\r\n\r\n",
                Refusal::BadTransferEncoding,
            ),
            (
                "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                Refusal::BadTransferEncoding,
            ),
            ("GET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\n", Refusal::Upgrade),
            ("CONNECT a.test:443 HTTP/1.1\r\n\r\n", Refusal::Connect),
        ] {
            assert_eq!(framed(head), Err(why), "{head:?}");
        }
    }

    fn walk(body: &[u8]) -> Result<Progress, Refusal> {
        Chunked::default().advance(body)
    }

    #[test]
    fn a_chunked_body_ends_after_its_trailers() {
        let body =
            b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Sum: 1\r\n\r\nGET /";
        let end = body.len() - b"GET /".len();
        assert_eq!(
            walk(body),
            Ok(Progress {
                consumed: end,
                done: true
            })
        );
        let bare = b"0\r\n\r\n";
        assert_eq!(
            walk(bare),
            Ok(Progress {
                consumed: 5,
                done: true
            })
        );
    }

    #[test]
    fn a_chunked_body_frames_the_same_however_it_arrives() {
        let body = b"A ; x\r\n0123456789\r\n3\r\nabc\r\n0\r\nT: v\r\n\r\n";
        let mut one = Chunked::default();
        let mut consumed = 0;
        for (i, b) in body.iter().enumerate() {
            let p = one.advance(std::slice::from_ref(b)).unwrap();
            consumed += p.consumed;
            assert_eq!(p.done, i == body.len() - 1, "at {i}");
        }
        assert_eq!(consumed, body.len());
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for bad in [
            &b"5\nhello\r\n0\r\n\r\n"[..], // bare LF after the size
            b"5\r\nhello\n0\r\n\r\n",      // bare LF after the data
            b"5\r\nhelloX\r\n0\r\n\r\n",   // data longer than its size
            b"g\r\n",                      // not hex
            b"\r\n",                       // no size
            b"1234567890abcdef0\r\n",      // over 2^60
            b"5 \r\nhello\r\n",            // whitespace without an extension
            b"0\r\nX: y\n\r\n",            // bare LF in the trailers
            b"0\r\n\n",                    // bare LF ending the body
        ] {
            assert_eq!(
                walk(bad),
                Err(Refusal::BadChunk),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long_ext = format!("1;{}\r\n", "x".repeat(MAX_CHUNK_LINE));
        assert_eq!(walk(long_ext.as_bytes()), Err(Refusal::BadChunk));
        let long_trailer = format!("0\r\nX: {}\r\n\r\n", "y".repeat(MAX_TRAILERS));
        assert_eq!(walk(long_trailer.as_bytes()), Err(Refusal::BadChunk));
    }

    #[test]
    fn a_huge_chunk_is_counted_not_buffered() {
        let mut c = Chunked::default();
        assert_eq!(c.advance(b"fffffff\r\n").unwrap().consumed, 9);
        let data = vec![0u8; 1 << 16];
        for _ in 0..100 {
            assert_eq!(c.advance(&data).unwrap().consumed, data.len());
        }
        assert!(!c.is_done());
    }
}
