//! Hostname patterns (`example.com`, `*.example.com`): validating what a
//! policy file says, and normalizing a connection's name for lookup without
//! allocating.

use std::net::IpAddr;

/// Longest DNS name in text form, without the trailing dot.
pub(crate) const MAX_NAME: usize = 253;

/// A validated hostname pattern, lowercased, trailing dot removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// Matches exactly this name.
    Exact(String),
    /// `*.suffix`: matches names with one or more labels before `.suffix`.
    /// Holds `suffix` without the leading `*.`.
    Wildcard(String),
}

/// Checks a `hosts` entry; on error returns "what is wrong; what to do".
pub(crate) fn parse_pattern(raw: &str) -> Result<Pattern, String> {
    let lowered = raw.trim_end_matches('.').to_ascii_lowercase();
    if raw.ends_with("..") {
        return Err(format!(
            "hostname `{raw}` ends with more than one dot; write it as `{lowered}`"
        ));
    }
    if lowered.is_empty() {
        return Err("empty hostname; write a name like `example.com` or remove the entry".into());
    }
    if lowered.contains("://") || lowered.contains('/') {
        return Err(format!(
            "`{raw}` is not a hostname; write only the name, without scheme, port or path (for example `example.com`)"
        ));
    }
    if let Some(rest) = lowered.strip_prefix("*.") {
        if rest.contains('*') {
            return Err(wildcard_misplaced(raw));
        }
        check_name(raw, rest)?;
        return Ok(Pattern::Wildcard(rest.to_string()));
    }
    if lowered == "*" {
        return Err(format!(
            "`{raw}` would match every name; write a wildcard under a domain such as `*.example.com`, or use `cidrs: [\"0.0.0.0/0\", \"::/0\"]` to match every address"
        ));
    }
    if lowered.contains('*') {
        return Err(wildcard_misplaced(raw));
    }
    check_name(raw, &lowered)?;
    Ok(Pattern::Exact(lowered))
}

fn wildcard_misplaced(raw: &str) -> String {
    format!(
        "wildcard in `{raw}` is not allowed there; `*` may only be the whole first label, as in `*.example.com`"
    )
}

/// Checks a name without wildcard (already lowercased, no trailing dot).
pub(crate) fn check_name(raw: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!(
            "`{raw}` has nothing after `*.`; write a domain, as in `*.example.com`"
        ));
    }
    if name.parse::<IpAddr>().is_ok() {
        return Err(format!(
            "`{raw}` is an IP address, not a hostname; put it in `cidrs` instead (for example \"{}\")",
            single_cidr(name)
        ));
    }
    if name.len() > MAX_NAME {
        return Err(format!(
            "hostname `{raw}` is {} characters long; DNS names are at most {MAX_NAME}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_' || *c == '.'))
    {
        return Err(format!(
            "hostname `{raw}` contains {bad:?}, which a hostname cannot contain; use letters, digits, `-` and `.` (write internationalized names in their xn-- form)"
        ));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(format!(
                "hostname `{raw}` has an empty label (two dots in a row, or a leading dot); remove the extra dot"
            ));
        }
        if label.len() > 63 {
            return Err(format!(
                "hostname `{raw}` has a label of {} characters; DNS labels are at most 63",
                label.len()
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "hostname `{raw}` has a label `{label}` that starts or ends with `-`; hostnames cannot"
            ));
        }
    }
    Ok(())
}

fn single_cidr(addr: &str) -> String {
    match addr.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => format!("{addr}/32"),
        _ => format!("{addr}/128"),
    }
}

/// Lowercases `name` into `buf` and drops one trailing dot, for lookup.
/// Returns `None` for names no policy pattern can match: empty, too long,
/// leading dot, empty labels, or characters outside `[A-Za-z0-9._-]`.
pub(crate) fn normalize<'b>(name: &str, buf: &'b mut [u8; MAX_NAME]) -> Option<&'b str> {
    let bytes = name.as_bytes();
    let bytes = bytes.strip_suffix(b".").unwrap_or(bytes);
    if bytes.is_empty() || bytes.len() > MAX_NAME {
        return None;
    }
    let mut prev = b'.';
    for (slot, &b) in buf.iter_mut().zip(bytes) {
        let ok = b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && prev != b'.');
        if !ok {
            return None;
        }
        *slot = b.to_ascii_lowercase();
        prev = b;
    }
    // Every byte is ASCII, so this cannot fail.
    std::str::from_utf8(&buf[..bytes.len()]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_names_are_lowercased_and_lose_the_trailing_dot() {
        assert_eq!(
            parse_pattern("PyPI.org."),
            Ok(Pattern::Exact("pypi.org".into()))
        );
    }

    #[test]
    fn wildcard_keeps_only_the_suffix() {
        assert_eq!(
            parse_pattern("*.Example.com"),
            Ok(Pattern::Wildcard("example.com".into()))
        );
    }

    #[test]
    fn misplaced_wildcards_are_refused() {
        for bad in ["foo.*.com", "*foo.com", "*", "*.", "a*.b.com", "*.*.com"] {
            assert!(parse_pattern(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn bad_characters_are_refused() {
        for bad in [
            "exa mple.com",
            "a..b",
            ".a.com",
            "-a.com",
            "https://a.com",
            "a:443",
        ] {
            assert!(parse_pattern(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn ip_address_in_hosts_suggests_cidrs() {
        let msg = parse_pattern("198.18.0.1").unwrap_err();
        assert!(msg.contains("198.18.0.1/32"), "{msg}");
    }

    #[test]
    fn normalize_lowercases_without_allocating() {
        let mut buf = [0u8; MAX_NAME];
        assert_eq!(
            normalize("WWW.Example.COM.", &mut buf),
            Some("www.example.com")
        );
        assert_eq!(normalize("", &mut buf), None);
        assert_eq!(normalize(".a.com", &mut buf), None);
        assert_eq!(normalize("a..com", &mut buf), None);
        assert_eq!(normalize("*.a.com", &mut buf), None);
        assert_eq!(normalize(&"a".repeat(300), &mut buf), None);
    }
}
