//! How one connection (or one DNS query) ended: a typed value made once,
//! where it ends, and the only thing the audit record, the timing record
//! and the metrics read. This module is their shared vocabulary and holds
//! the only serialisers of verdicts and reasons ([`Verdict::as_str`],
//! [`Cause::as_str`]); no other module turns a verdict into text.
//!
//! A small leaf below `audit`, `metrics` and `timing` (it imports only
//! `policy`'s reasons): it never records anything itself.

use std::fmt;
use std::io;
use std::sync::Arc;

use crate::policy::{self, Mode};

/// What a record says was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    Allow,
    Deny,
    /// Audit mode: it would have been denied, and was let through.
    WouldDeny,
}

impl Verdict {
    /// A policy's verdict in `mode`.
    pub fn of(verdict: policy::Verdict, mode: Mode) -> Verdict {
        match (verdict, mode) {
            (policy::Verdict::Allow, _) => Verdict::Allow,
            (policy::Verdict::Deny, Mode::Enforce) => Verdict::Deny,
            (policy::Verdict::Deny, Mode::Audit) => Verdict::WouldDeny,
        }
    }

    /// The records' and labels' text.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::WouldDeny => "would-deny",
        }
    }
}

/// Why a connection or a request was refused before it reached the
/// origin, or (audit mode) would have been.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenyReason {
    /// The policy's reason (a deny rule, no rule, a private or loopback
    /// address, ...), or one sluice applies with the policy's words
    /// (`internal-address`, `unreadable-name`).
    Policy(policy::Reason),
    /// A request on a checked connection that cannot be relayed safely.
    Request(Refusal),
    /// Someone connected straight to sluice's listener: no redirect, so
    /// no destination to decide on.
    NoOriginalDestination,
    /// A request on a connection whose rule decides each request.
    L7(RequestDenial),
}

impl DenyReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::Policy(reason) => reason.as_str(),
            DenyReason::Request(refusal) => refusal.as_str(),
            DenyReason::NoOriginalDestination => "no-original-destination",
            DenyReason::L7(denial) => denial.as_str(),
        }
    }
}

impl From<policy::Reason> for DenyReason {
    fn from(reason: policy::Reason) -> DenyReason {
        DenyReason::Policy(reason)
    }
}

impl From<Refusal> for DenyReason {
    fn from(refusal: Refusal) -> DenyReason {
        DenyReason::Request(refusal)
    }
}

/// Why a request on a checked connection is not relayed (the framing
/// rules are `proxy::http1`'s; the words are here, with the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A line ends in a bare LF, or a bare CR is inside a line.
    BareLineEnding,
    /// A NUL or other control byte in the head.
    ControlByte,
    /// Both Content-Length and Transfer-Encoding, or differing lengths.
    ConflictingLength,
    /// A Content-Length that is not a decimal number.
    BadLength,
    /// A transfer coding whose last step is not `chunked`, `chunked` twice,
    /// or any Transfer-Encoding on an HTTP/1.0 request.
    BadTransferEncoding,
    /// An `Upgrade` request (WebSocket over ws://, h2c): after the switch
    /// the bytes are no longer requests sluice can decide.
    Upgrade,
    /// A CONNECT request: the same, for a tunnel.
    Connect,
    /// A chunk-size line, a chunk's end or the trailer section is malformed
    /// or too long.
    BadChunk,
    /// The bytes where a request should start are not an HTTP/1 request.
    NotRequest,
    /// A request head longer than the head limit (answered 431).
    HeadTooLarge,
    /// A request head not complete within the head deadline (answered 408).
    HeadTimeout,
    /// A request whose host cannot be read for certain: two Host headers,
    /// a Host that is not a host and port, or a target whose host differs
    /// from the Host header's.
    UnreadableHost,
}

impl Refusal {
    /// The audit record's `reason` and the deny reply's.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::BareLineEnding => "http-bare-line-ending",
            Refusal::ControlByte => "http-control-byte",
            Refusal::ConflictingLength => "http-conflicting-length",
            Refusal::BadLength => "http-bad-length",
            Refusal::BadTransferEncoding => "http-bad-transfer-encoding",
            Refusal::Upgrade => "http-upgrade",
            Refusal::Connect => "http-connect",
            Refusal::BadChunk => "http-bad-chunk",
            Refusal::NotRequest => "http-not-a-request",
            Refusal::HeadTooLarge => "http-head-too-large",
            Refusal::HeadTimeout => "http-head-timeout",
            Refusal::UnreadableHost => "http-unreadable-host",
        }
    }

    /// The HTTP status the client is answered with.
    pub fn status(self) -> &'static str {
        match self {
            Refusal::HeadTooLarge => "431 Request Header Fields Too Large",
            Refusal::HeadTimeout => "408 Request Timeout",
            _ => "400 Bad Request",
        }
    }
}

/// Why a request (or the TLS connection it came on) was refused on a
/// connection whose rule has an `http` or `inject` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestDenial {
    /// No `http` entry of the rule lists the method.
    HttpMethod,
    /// An entry lists the method, and none of its paths matches.
    HttpPath,
    /// The Host header, the ClientHello's SNI or the target names another
    /// host than the one the connection was decided on (or the target is
    /// absolute-form or authority-form, or there is not exactly one Host).
    HostMismatch,
    /// A secret's placeholder where it is not admitted: in the target or
    /// the body, or in a header of a request whose rule does not inject it.
    SecretMisuse,
    /// A secret the rule injects has no value (unreadable, or its command
    /// failed): the request is not sent without it.
    SecretUnavailable,
    /// An `inject` rule's request on plain HTTP: a credential travels only
    /// inside TLS to a verified origin.
    InjectNeedsTls,
    /// The origin's certificate did not verify for the name.
    UpstreamCertificate,
    /// The client's TLS handshake with sluice failed (a client that pins
    /// certificates or does not trust the sandbox CA), or the first bytes
    /// were not a ClientHello or a request.
    BadHandshake,
    /// The sandbox has no CA to terminate TLS with.
    NoInterception,
}

impl RequestDenial {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestDenial::HttpMethod => "http-method",
            RequestDenial::HttpPath => "http-path",
            RequestDenial::HostMismatch => "host-mismatch",
            RequestDenial::SecretMisuse => "secret-misuse",
            RequestDenial::SecretUnavailable => "secret-unavailable",
            RequestDenial::InjectNeedsTls => "inject-needs-tls",
            RequestDenial::UpstreamCertificate => "upstream-certificate",
            RequestDenial::BadHandshake => "tls-handshake",
            RequestDenial::NoInterception => "no-interception",
        }
    }
}

/// Why an allowed connection's upstream connect failed (a bounded label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpstreamFailure {
    /// The origin answered with a reset: nothing listens there.
    Refused,
    /// No answer within the connect timeout.
    Timeout,
    /// The connection was reset or aborted while it was being made.
    Reset,
    /// Anything else: no route, host or network unreachable, refused by
    /// the host's own firewall.
    Unreachable,
}

impl UpstreamFailure {
    pub const ALL: [UpstreamFailure; 4] = [
        UpstreamFailure::Refused,
        UpstreamFailure::Timeout,
        UpstreamFailure::Reset,
        UpstreamFailure::Unreachable,
    ];

    /// The class of a failed connect.
    pub fn of(err: &io::Error) -> UpstreamFailure {
        match err.kind() {
            io::ErrorKind::ConnectionRefused => UpstreamFailure::Refused,
            io::ErrorKind::TimedOut => UpstreamFailure::Timeout,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => UpstreamFailure::Reset,
            _ => UpstreamFailure::Unreachable,
        }
    }

    /// The metric's `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamFailure::Refused => "refused",
            UpstreamFailure::Timeout => "timeout",
            UpstreamFailure::Reset => "reset",
            UpstreamFailure::Unreachable => "unreachable",
        }
    }

    /// The records' `reason`.
    fn record_reason(self) -> &'static str {
        match self {
            UpstreamFailure::Refused => "upstream-refused",
            UpstreamFailure::Timeout => "upstream-timeout",
            UpstreamFailure::Reset => "upstream-reset",
            UpstreamFailure::Unreachable => "upstream-unreachable",
        }
    }
}

/// Why a connection ended the way it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Allowed by a rule and relayed until either side closed.
    Allowed,
    /// Refused (or, in audit mode, would have been) for this reason.
    Denied(DenyReason),
    /// Allowed, and the upstream connect failed.
    Upstream(UpstreamFailure),
    /// Allowed, and cut at the drain deadline (shutdown or reload).
    Drained,
    /// A request admitted with a credential injected (its audit record
    /// names the secret and the header, never the value).
    Injected,
}

impl Cause {
    /// The records' `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Allowed => policy::Reason::AllowRule.as_str(),
            Cause::Denied(reason) => reason.as_str(),
            Cause::Upstream(failure) => failure.record_reason(),
            Cause::Drained => "drained",
            Cause::Injected => "inject",
        }
    }
}

/// How one connection ended: what was decided, by which rule, and why it
/// ended as it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub verdict: Verdict,
    /// The deciding rule (`None`: the default deny, or a reason sluice
    /// applies itself).
    pub rule: Option<Arc<str>>,
    pub cause: Cause,
}

impl Outcome {
    /// A policy decision in `mode`: allowed, denied or would-deny.
    pub(crate) fn decided(decision: &policy::Decision<'_>, mode: Mode) -> Outcome {
        let verdict = Verdict::of(decision.verdict, mode);
        let cause = match decision.verdict {
            policy::Verdict::Allow => Cause::Allowed,
            policy::Verdict::Deny => Cause::Denied(decision.reason.into()),
        };
        Outcome {
            verdict,
            rule: decision.rule.cloned(),
            cause,
        }
    }

    /// Refused for `reason` by sluice's own checks (no rule decided).
    pub fn refused(reason: impl Into<DenyReason>, mode: Mode) -> Outcome {
        Outcome {
            verdict: Verdict::of(policy::Verdict::Deny, mode),
            rule: None,
            cause: Cause::Denied(reason.into()),
        }
    }

    /// The same decision, ended by `cause` instead (an upstream failure,
    /// the drain). A verdict of deny is never turned into anything else.
    pub(crate) fn ended_by(&mut self, cause: Cause) {
        if self.verdict != Verdict::Deny {
            self.cause = cause;
        }
    }

    /// True if the connection is refused (enforce mode) and must not reach
    /// the origin.
    pub(crate) fn is_denied(&self) -> bool {
        self.verdict == Verdict::Deny
    }

    /// The rule's name, if one decided.
    pub(crate) fn rule_name(&self) -> Option<&str> {
        self.rule.as_deref()
    }

    /// The records' `reason`.
    pub fn reason(&self) -> &'static str {
        self.cause.as_str()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Decision, Reason};

    #[test]
    fn a_deny_in_audit_mode_is_recorded_as_would_deny_with_its_reason() {
        let rule: Arc<str> = "no-b".into();
        let decision = Decision {
            verdict: policy::Verdict::Deny,
            rule: Some(&rule),
            reason: Reason::DenyRule,
        };
        let o = Outcome::decided(&decision, Mode::Audit);
        assert_eq!(o.verdict.as_str(), "would-deny");
        assert_eq!(o.reason(), "deny-rule");
        assert_eq!(o.rule_name(), Some("no-b"));
        assert!(!o.is_denied());
    }

    #[test]
    fn an_upstream_failure_ends_an_allowed_connection_but_never_a_denied_one() {
        let mut allowed = Outcome {
            verdict: Verdict::Allow,
            rule: None,
            cause: Cause::Allowed,
        };
        allowed.ended_by(Cause::Upstream(UpstreamFailure::Refused));
        assert_eq!(allowed.reason(), "upstream-refused");
        let mut denied = Outcome::refused(Reason::NoRule, Mode::Enforce);
        denied.ended_by(Cause::Drained);
        assert_eq!(denied.reason(), "no-rule");
    }

    #[test]
    fn connect_errors_fall_into_the_four_failure_classes() {
        let of = |e: io::ErrorKind| UpstreamFailure::of(&e.into()).as_str();
        assert_eq!(of(io::ErrorKind::ConnectionRefused), "refused");
        assert_eq!(of(io::ErrorKind::TimedOut), "timeout");
        assert_eq!(of(io::ErrorKind::ConnectionReset), "reset");
        let unreachable = io::Error::from_raw_os_error(libc::EHOSTUNREACH);
        assert_eq!(UpstreamFailure::of(&unreachable).as_str(), "unreachable");
    }
}
