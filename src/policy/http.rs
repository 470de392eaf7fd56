//! The request (L7) half of a rule: which methods and paths an `http`
//! block admits, the headers an `inject` block sets from secrets, and where
//! a secret's value comes from. Pure data and matching: nothing here reads
//! a secret, a socket or a clock, and nothing here ever holds a secret's
//! value (a [`Template`] renders one only when asked, into its result).
//!
//! Path matching works on the raw request path, one `/`-separated segment
//! at a time, so that a pattern's boundaries are the origin's boundaries.
//! A path an origin might normalise into another path (dot segments, `//`,
//! encoded slashes or backslashes, control bytes, malformed or overlong
//! escapes) matches no pattern at all: sluice cannot know which path the
//! origin would serve, so it refuses rather than guesses.

use std::borrow::Cow;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// One `http` entry: admits every listed method with every listed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpEntry {
    /// Uppercased method tokens; `"*"` admits any method.
    pub(crate) methods: Vec<String>,
    pub(crate) paths: Vec<PathPattern>,
}

impl HttpEntry {
    /// True if `method` (as sent) is listed, or the entry lists `*`.
    /// Methods are compared without regard to ASCII case: the policy's are
    /// uppercased, and an origin reads `get` as `GET` or refuses it.
    pub(crate) fn has_method(&self, method: &str) -> bool {
        self.methods
            .iter()
            .any(|m| m == "*" || m.eq_ignore_ascii_case(method))
    }
}

/// Why a request on a terminated connection was refused by its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum RequestReason {
    /// No `http` entry lists the request's method.
    Method,
    /// An entry lists the method, but none of its paths matches (or the
    /// path is one sluice refuses to match at all).
    Path,
}

impl RequestReason {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            RequestReason::Method => "http-method",
            RequestReason::Path => "http-path",
        }
    }
}

impl fmt::Display for RequestReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One segment of a path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// Matches a segment that decodes to the same bytes.
    Literal(Vec<u8>),
    /// `*`: exactly one non-empty segment.
    One,
    /// `**`: zero or more segments.
    Any,
}

/// A path pattern such as `/repos/*/*/contents/**`: `*` matches exactly
/// one non-empty segment, `**` zero or more segments, and any other
/// segment matches the same segment (compared after percent-decoding,
/// case-sensitively). A trailing `/` is a segment of its own (empty):
/// `/user` does not match `/user/`, `/simple/*/` matches
/// `/simple/requests/`, and `**` matches it too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PathPattern {
    text: String,
    segments: Vec<Segment>,
}

impl PathPattern {
    /// Parses a pattern; the error says what is wrong and what to write.
    pub(crate) fn parse(text: &str) -> Result<PathPattern, String> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!(
                "the path pattern `{text}` does not start with `/`; write it as the path of the request, like \"/repos/*/*\""
            ));
        };
        if let Some(c) = text.chars().find(|c| matches!(c, '?' | '#')) {
            return Err(format!(
                "the path pattern `{text}` contains `{c}`; a pattern matches the path only (the query is ignored), so remove what starts at `{c}`"
            ));
        }
        let parts: Vec<&str> = rest.split('/').collect();
        let last = parts.len() - 1;
        let mut segments = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let segment = match *part {
                "*" => Segment::One,
                "**" => Segment::Any,
                "" if i < last => {
                    return Err(format!(
                        "the path pattern `{text}` has an empty segment (`//`), which no request is admitted with; write one `/`"
                    ))
                }
                _ if part.contains('*') => {
                    return Err(format!(
                        "the path pattern `{text}` has `*` inside the segment `{part}`; `*` (one segment) and `**` (any number of segments) must stand alone between slashes, like \"/files/*\""
                    ))
                }
                _ => match decode(part.as_bytes()) {
                    Ok(bytes) if clean(&bytes) => Segment::Literal(bytes.into_owned()),
                    _ => {
                        return Err(format!(
                            "the path pattern `{text}` has the segment `{part}`, which no request is admitted with (a dot segment, an encoded `/` or `\\`, a control character, a malformed or non-UTF-8 escape); write the path as the origin serves it"
                        ))
                    }
                },
            };
            segments.push(segment);
        }
        Ok(PathPattern {
            text: text.to_string(),
            segments,
        })
    }

    /// The pattern as written.
    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    /// True if the raw request path `path` (without the query) matches.
    /// A path sluice refuses to read ([`refused_path`]) matches nothing.
    #[cfg(test)]
    pub(crate) fn matches(&self, path: &str) -> bool {
        match segments(path) {
            Some(segs) => self.matches_segments(&segs),
            None => false,
        }
    }

    /// Glob matching over segments with `**` as the star: the classic
    /// linear scan that backtracks only to the last `**`, so no pattern
    /// costs more than segments x pattern segments.
    pub(super) fn matches_segments(&self, path: &[Cow<'_, [u8]>]) -> bool {
        let pat = &self.segments;
        let (mut p, mut s) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while s < path.len() {
            match pat.get(p) {
                Some(Segment::Any) => {
                    star = Some((p, s));
                    p += 1;
                    continue;
                }
                Some(Segment::One) if !path[s].is_empty() => {
                    p += 1;
                    s += 1;
                    continue;
                }
                Some(Segment::Literal(l)) if **l == *path[s] => {
                    p += 1;
                    s += 1;
                    continue;
                }
                _ => {}
            }
            match star {
                Some((sp, ss)) => {
                    p = sp + 1;
                    s = ss + 1;
                    star = Some((sp, ss + 1));
                }
                None => return false,
            }
        }
        pat[p..].iter().all(|seg| *seg == Segment::Any)
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// True if sluice refuses to match `path` against any pattern: it does not
/// start with `/`, or it has a segment an origin might read as something
/// else (see [`segments`]).
#[cfg(test)]
pub(crate) fn refused_path(path: &str) -> bool {
    segments(path).is_none()
}

/// The decoded segments of a raw path, or None if an origin might
/// normalise the path into another: it does not start with `/`; it holds a
/// raw control byte, `\`, `#` or `?`; a segment before the last is empty
/// (`//`); a segment decodes to `.` or `..` (also with `;` parameters, as
/// Tomcat reads `..;x`), to something holding `/`, `\` or a control
/// character, or to bytes that are not UTF-8 (overlong `%c0%ae` is a dot
/// to some servers); or an escape is malformed.
pub(super) fn segments(path: &str) -> Option<Vec<Cow<'_, [u8]>>> {
    let rest = path.strip_prefix('/')?;
    if path
        .bytes()
        .any(|b| b.is_ascii_control() || matches!(b, b'\\' | b'#' | b'?'))
    {
        return None;
    }
    let parts: Vec<&str> = rest.split('/').collect();
    let last = parts.len() - 1;
    let mut out = Vec::with_capacity(parts.len());
    for (i, part) in parts.into_iter().enumerate() {
        if part.is_empty() && i < last {
            return None;
        }
        let bytes = decode(part.as_bytes()).ok()?;
        if !clean(&bytes) {
            return None;
        }
        out.push(bytes);
    }
    Some(out)
}

/// Percent-decodes one segment; Err for `%` not followed by two hex digits.
fn decode(raw: &[u8]) -> Result<Cow<'_, [u8]>, ()> {
    if !raw.contains(&b'%') {
        return Ok(Cow::Borrowed(raw));
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            let hex = |b: u8| (b as char).to_digit(16);
            let (Some(hi), Some(lo)) = (
                raw.get(i + 1).copied().and_then(hex),
                raw.get(i + 2).copied().and_then(hex),
            ) else {
                return Err(());
            };
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    Ok(Cow::Owned(out))
}

/// True if a decoded segment names itself only: UTF-8, no `/`, `\` or
/// control character, and not a dot segment (before any `;` parameters).
fn clean(decoded: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(decoded) else {
        return false;
    };
    if text
        .chars()
        .any(|c| c.is_control() || c == '/' || c == '\\')
    {
        return false;
    }
    let name = text.split(';').next().unwrap_or("");
    name != "." && name != ".."
}

/// One `inject` entry: set `header` (replacing whatever the workload sent)
/// to the rendered `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inject {
    /// The header name as written in the policy.
    pub(crate) header: String,
    pub(crate) value: Template,
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Secret(String),
}

/// A header value with `{{name}}` references to secrets, such as
/// `Bearer {{gh}}`. It holds names, never values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    text: String,
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses literal text and `{{name}}` references (spaces inside the
    /// braces are allowed). At least one reference; no control character
    /// but tab in the literal text, which could end the header or smuggle
    /// another. Whether each name is declared is the validator's concern.
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        if let Some(c) = text.chars().find(|c| c.is_control() && *c != '\t') {
            return Err(format!(
                "the header value {text:?} contains the control character {c:?}, which would end the header or start another; remove it"
            ));
        }
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return Err(format!(
                    "the header value {text:?} opens `{{{{` without closing it; write a secret reference as `{{{{name}}}}`"
                ));
            };
            let name = after[..close].trim();
            if !is_secret_name(name) {
                return Err(format!(
                    "`{{{{{}}}}}` in the header value {text:?} is not a secret reference; write `{{{{name}}}}` with the name of a secret from `secrets` (lowercase letters, digits, `_` and `-`)",
                    &after[..close]
                ));
            }
            pieces.push(Piece::Secret(name.to_string()));
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        if !pieces.iter().any(|p| matches!(p, Piece::Secret(_))) {
            return Err(format!(
                "the header value {text:?} references no secret; write it with `{{{{name}}}}` for a secret from `secrets`, like \"Bearer {{{{gh}}}}\" (a fixed header needs no sluice)"
            ));
        }
        Ok(Template {
            text: text.to_string(),
            pieces,
        })
    }

    /// The template as written.
    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    /// The secret names referenced, in order (a name used twice twice).
    pub(crate) fn secrets(&self) -> impl Iterator<Item = &str> {
        self.pieces.iter().filter_map(|p| match p {
            Piece::Secret(name) => Some(name.as_str()),
            Piece::Text(_) => None,
        })
    }

    /// The header value with every reference replaced by its secret's
    /// value. None if a referenced secret has no value, or a value holds a
    /// control character other than tab (CR or LF would end the header:
    /// a secret must never smuggle a header of its own).
    pub(crate) fn render(&self, value_of: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Secret(name) => {
                    let value = value_of(name)?;
                    if value.chars().any(|c| c.is_control() && c != '\t') {
                        return None;
                    }
                    out.push_str(&value);
                }
            }
        }
        Some(out)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// True for a valid secret name: `[a-z0-9_-]{1,64}` (it becomes part of an
/// environment variable's name and of a placeholder).
pub(crate) fn is_secret_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Where a secret's value comes from. Read on the host side by the secret
/// store, never by the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SecretSource {
    /// The whole file (an absolute path), trailing newline trimmed.
    File(PathBuf),
    /// sluice's own environment variable.
    Env(String),
    /// A command run without a shell; its output is the value, re-read
    /// once `ttl` has passed.
    Command { argv: Vec<String>, ttl: Duration },
}

/// One entry of `secrets`: a name rules refer to, and its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SecretRef {
    pub(crate) name: String,
    pub(crate) source: SecretSource,
}

/// A command secret's `ttl` when the policy gives none.
pub(crate) const DEFAULT_SECRET_TTL: Duration = Duration::from_secs(600);
