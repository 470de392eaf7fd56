//! The audit record's fields (DESIGN.md "Records") and its chained hash.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// `prev` of the first record of a fresh log: 64 zeros.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

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
/// `seq` and `prev`.
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
}

/// One line of the audit log, exactly as serialized (field order is the
/// contract's order).
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
    pub prev: String,
}

impl AuditRecord {
    pub fn new(event: AuditEvent, ts: String, seq: u64, prev: String) -> AuditRecord {
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
            prev,
        }
    }
}

/// SHA-256 (hex) of one serialized line, without its trailing newline: the
/// `prev` of the line after it.
pub fn line_hash(line: &str) -> String {
    hex::encode(Sha256::digest(line.as_bytes()))
}
