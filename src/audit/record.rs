//! The audit log's lines (DESIGN.md "Records"): a decision record or a
//! signed checkpoint, each ending in its own hash, chained through `prev`.
//!
//! A line's hash is the SHA-256 (hex) of its bytes without its `hash`
//! member: the line is `BODY` with `,"hash":"<64 hex>"` inserted before its
//! closing `}`, and the hash is over `BODY`. `prev` is inside `BODY`, so each
//! hash covers the whole chain before it. A line without a `hash` member (a
//! log written before records carried one) is its own `BODY`, which is how
//! `prev` was defined then: old and new lines chain alike.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// `prev` of the first record of a fresh log: 64 zeros.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The `kind` of a checkpoint line (decision records have none).
pub(crate) const CHECKPOINT_KIND: &str = "checkpoint";

/// Transport of the audited flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
    Dns,
    /// A bundle load or reload (verdict `applied` or `refused`).
    Bundle,
}

/// What a producer (proxy, DNS responder) reports; the writer adds `ts`,
/// `seq`, `prev` and `hash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    pub sandbox: String,
    pub path: crate::workload::WorkloadPath,
    pub verdict: &'static str,
    pub rule: Option<String>,
    pub reason: &'static str,
    pub proto: Proto,
    pub src: Option<std::net::SocketAddr>,
    pub dst: Option<std::net::SocketAddr>,
    pub host: Option<String>,
    pub bundle: String,
    /// The request a record is about, on a connection whose rule decides
    /// each request (`None`: the record is about a connection).
    pub request: Option<RequestFields>,
}

/// What a request's record adds: its method and path (never the query),
/// and for an injection the secret's name and the header (never the value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFields {
    pub method: Option<String>,
    pub request_path: Option<String>,
    pub secret: Option<String>,
    pub header: Option<String>,
}

/// Where a connection's audited outcome happened: the sandbox and path it
/// came from, its ends and name, and the bundle that decided it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Flow<'a> {
    pub(crate) sandbox: &'a str,
    pub(crate) path: crate::workload::WorkloadPath,
    pub(crate) src: std::net::SocketAddr,
    pub(crate) dst: Option<std::net::SocketAddr>,
    pub(crate) bundle: &'a str,
}

impl AuditEvent {
    /// The record of how a TCP connection, or a request on one, ended: the
    /// one builder the proxy uses, so the audit record says exactly what
    /// the timing record and the metrics say.
    pub(crate) fn of_outcome(
        flow: Flow<'_>,
        outcome: &crate::outcome::Outcome,
        host: Option<String>,
    ) -> AuditEvent {
        AuditEvent {
            sandbox: flow.sandbox.to_string(),
            path: flow.path,
            verdict: outcome.verdict.as_str(),
            rule: outcome.rule_name().map(str::to_string),
            reason: outcome.reason(),
            proto: Proto::Tcp,
            src: Some(flow.src),
            dst: flow.dst,
            host,
            bundle: flow.bundle.to_string(),
            request: None,
        }
    }

    /// The record of a DNS query the responder refused (or would have, in
    /// audit mode): who asked for which name, and why.
    pub(crate) fn of_dns_refusal(
        sandbox: &str,
        path: crate::workload::WorkloadPath,
        verdict: &'static str,
        reason: &'static str,
        client: std::net::SocketAddr,
        host: String,
        bundle: &str,
    ) -> AuditEvent {
        AuditEvent {
            sandbox: sandbox.to_string(),
            path,
            verdict,
            rule: None,
            reason,
            proto: Proto::Dns,
            src: Some(client),
            dst: None,
            host: Some(host),
            bundle: bundle.to_string(),
            request: None,
        }
    }

    /// The record of a bundle loaded, swapped in or refused.
    pub(crate) fn of_bundle(
        sandbox: &str,
        path: crate::workload::WorkloadPath,
        verdict: &'static str,
        reason: &'static str,
        bundle: String,
    ) -> AuditEvent {
        AuditEvent {
            sandbox: sandbox.to_string(),
            path,
            verdict,
            rule: None,
            reason,
            proto: Proto::Bundle,
            src: None,
            dst: None,
            host: None,
            bundle,
            request: None,
        }
    }
}

/// One decision line of the audit log, exactly as serialized (field order
/// is the contract's order; `hash` is added by [`seal`] when written).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub ts: String,
    pub seq: u64,
    pub sandbox: String,
    pub path: String,
    pub verdict: String,
    pub rule: Option<String>,
    pub reason: String,
    pub proto: Proto,
    pub src: Option<String>,
    pub dst: Option<String>,
    pub host: Option<String>,
    pub bundle: String,
    /// A request's method, path, secret and header (DESIGN.md, "Requests"):
    /// present only on the records of requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    pub prev: String,
    /// This line's hash (absent in logs written before lines carried one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
}

impl AuditRecord {
    pub fn new(event: AuditEvent, ts: String, seq: u64, prev: String) -> AuditRecord {
        let request = event.request.unwrap_or_default();
        AuditRecord {
            ts,
            seq,
            sandbox: event.sandbox,
            path: event.path.as_str().to_string(),
            verdict: event.verdict.to_string(),
            rule: event.rule,
            reason: event.reason.to_string(),
            proto: event.proto,
            src: event.src.map(|a| a.to_string()),
            dst: event.dst.map(|a| a.to_string()),
            host: event.host,
            bundle: event.bundle,
            method: request.method,
            request_path: request.request_path,
            secret: request.secret,
            header: request.header,
            prev,
            hash: None,
        }
    }
}

/// A signed checkpoint line: the key `key` signed that the record before it
/// (seq `seq - 1`) has hash `prev`, which anchors every line before it (see
/// `checkpoint::message` for the exact bytes signed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRecord {
    pub ts: String,
    pub seq: u64,
    /// Always [`CHECKPOINT_KIND`].
    pub kind: String,
    /// The signing key's id (`audit-` and 16 hex digits of its public key's
    /// SHA-256).
    pub key: String,
    /// The Ed25519 signature, hex (128 digits).
    pub sig: String,
    pub prev: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
}

/// One line of the audit log, whichever kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditLine {
    Record(Box<AuditRecord>),
    Checkpoint(CheckpointRecord),
}

/// The fields every line has, read first to tell the kinds apart.
#[derive(Deserialize)]
struct Kind {
    #[serde(default)]
    kind: Option<String>,
}

impl AuditLine {
    /// Parse one line (without its newline).
    pub fn parse(line: &str) -> Result<AuditLine, serde_json::Error> {
        let kind: Kind = serde_json::from_str(line)?;
        match kind.kind.as_deref() {
            Some(CHECKPOINT_KIND) => Ok(AuditLine::Checkpoint(serde_json::from_str(line)?)),
            Some(other) => Err(serde::de::Error::custom(format!(
                "unknown line kind {other:?}"
            ))),
            None => Ok(AuditLine::Record(Box::new(serde_json::from_str(line)?))),
        }
    }

    pub fn seq(&self) -> u64 {
        match self {
            AuditLine::Record(r) => r.seq,
            AuditLine::Checkpoint(c) => c.seq,
        }
    }

    pub fn prev(&self) -> &str {
        match self {
            AuditLine::Record(r) => &r.prev,
            AuditLine::Checkpoint(c) => &c.prev,
        }
    }

    pub fn hash(&self) -> Option<&str> {
        match self {
            AuditLine::Record(r) => r.hash.as_deref(),
            AuditLine::Checkpoint(c) => c.hash.as_deref(),
        }
    }

    /// A decision record's verdict; `checkpoint` for a checkpoint.
    pub fn verdict(&self) -> &str {
        match self {
            AuditLine::Record(r) => &r.verdict,
            AuditLine::Checkpoint(_) => CHECKPOINT_KIND,
        }
    }
}

/// Length of the hash member [`seal`] inserts: `,"hash":"` + 64 + `"`.
const HASH_MEMBER_LEN: usize = 9 + 64 + 1;

/// Turn `body` (a JSON object serialized without `hash`) into its line:
/// `body` with `,"hash":"H"` before the closing brace, H = SHA-256(body).
/// Returns the line and H.
pub fn seal(body: &str) -> (String, String) {
    debug_assert!(body.ends_with('}'));
    let hash = hex::encode(Sha256::digest(body.as_bytes()));
    let mut line = String::with_capacity(body.len() + HASH_MEMBER_LEN);
    line.push_str(&body[..body.len() - 1]);
    line.push_str(",\"hash\":\"");
    line.push_str(&hash);
    line.push_str("\"}");
    (line, hash)
}

/// The bytes a line's hash is over: the line without its trailing hash
/// member (or the whole line, if it has none), and the hash it claims.
pub fn unseal(line: &str) -> (std::borrow::Cow<'_, str>, Option<&str>) {
    let Some(head) = line.strip_suffix("\"}") else {
        return (line.into(), None);
    };
    if head.len() < HASH_MEMBER_LEN - 1 {
        return (line.into(), None);
    }
    let (before, member) = head.split_at(head.len() - (HASH_MEMBER_LEN - 1));
    let Some(claimed) = member.strip_prefix(",\"hash\":\"") else {
        return (line.into(), None);
    };
    if !claimed.bytes().all(|b| b.is_ascii_hexdigit()) {
        return (line.into(), None);
    }
    (format!("{before}}}").into(), Some(claimed))
}

/// The hash of one line (without its trailing newline): SHA-256 (hex) of
/// its bytes without the hash member. It is the `prev` of the line after.
pub fn line_hash(line: &str) -> String {
    let (body, _) = unseal(line);
    hex::encode(Sha256::digest(body.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64) -> AuditRecord {
        AuditRecord::new(
            AuditEvent {
                sandbox: "sb".into(),
                path: crate::workload::WorkloadPath::Host,
                verdict: "deny",
                rule: None,
                reason: "no-rule",
                proto: Proto::Tcp,
                src: None,
                dst: Some("198.18.0.1:80".parse().unwrap()),
                host: None,
                bundle: "b@1".into(),
                request: None,
            },
            "2025-01-01T00:00:00Z".into(),
            seq,
            GENESIS.into(),
        )
    }

    #[test]
    fn a_sealed_line_ends_with_the_hash_of_its_bytes_without_it() {
        let body = serde_json::to_string(&record(0)).unwrap();
        let (line, hash) = seal(&body);
        assert!(line.ends_with(&format!(",\"hash\":\"{hash}\"}}")), "{line}");
        assert_eq!(hash, hex::encode(Sha256::digest(body.as_bytes())));
        assert_eq!(line_hash(&line), hash);
        let (unsealed, claimed) = unseal(&line);
        assert_eq!(
            (unsealed.as_ref(), claimed),
            (body.as_str(), Some(hash.as_str()))
        );
        let parsed = AuditLine::parse(&line).unwrap();
        assert_eq!(parsed.hash(), Some(hash.as_str()));
    }

    #[test]
    fn a_line_without_a_hash_member_hashes_whole_as_before() {
        let body = serde_json::to_string(&record(0)).unwrap();
        assert_eq!(
            line_hash(&body),
            hex::encode(Sha256::digest(body.as_bytes()))
        );
        assert_eq!(unseal(&body).1, None);
    }

    #[test]
    fn lines_of_each_kind_parse_and_an_unknown_kind_is_refused() {
        let body = r#"{"ts":"t","seq":3,"kind":"checkpoint","key":"k","sig":"00","prev":"p"}"#;
        assert!(matches!(
            AuditLine::parse(body).unwrap(),
            AuditLine::Checkpoint(CheckpointRecord { seq: 3, .. })
        ));
        let odd = r#"{"ts":"t","seq":3,"kind":"other","prev":"p"}"#;
        assert!(AuditLine::parse(odd).is_err());
    }
}
