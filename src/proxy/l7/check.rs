//! The pure checks of a terminated connection: whether two names are one
//! DNS name, whether a Host header names the connection's host and port,
//! whether bytes carry a placeholder, and whether a TLS error is the
//! origin's certificate failing to verify.
//!
//! They are pure: no I/O, no state, no allocation. They never say yes to
//! what they cannot read for certain: a Host header that is not text, or
//! whose port does not parse, names no host, and an empty needle is in
//! nothing.

use hyper::header::HeaderValue;

/// True if `err`, from the TLS handshake with the origin, is its
/// certificate (or its absence) failing to verify for the name.
pub(super) fn is_certificate_error(err: &std::io::Error) -> bool {
    err.get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .is_some_and(|e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(_)
                    | rustls::Error::NoCertificatesPresented
                    | rustls::Error::UnsupportedNameType
            )
        })
}

/// True if `a` and `b` are one DNS name (case and a trailing dot aside).
pub(super) fn same_name(a: &str, b: &str) -> bool {
    a.trim_end_matches('.')
        .eq_ignore_ascii_case(b.trim_end_matches('.'))
}

/// True if the Host header `value` names `host` (and, with a port, the
/// connection's port).
pub(super) fn host_header_names(value: &HeaderValue, host: &str, port: u16, plain: bool) -> bool {
    let Ok(value) = value.to_str() else {
        return false;
    };
    let (name, given_port) = match value.rsplit_once(':') {
        Some((name, p)) if !name.contains(':') => match p.parse::<u16>() {
            Ok(p) => (name, Some(p)),
            Err(_) => return false,
        },
        _ => (value, None),
    };
    let default = if plain { 80 } else { 443 };
    same_name(name, host)
        && given_port.is_none_or(|p| p == port || (p == default && port == default))
}

/// Whether `needle` occurs in `haystack`.
pub(super) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
