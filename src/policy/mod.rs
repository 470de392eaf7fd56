//! The policy: what a sandbox may connect to. This module owns the YAML
//! format (`version: 1`), its validation with `FILE:LINE:COL` messages for
//! every violation at once, and the compiled matcher that turns a
//! destination (address, port, optional hostname) into a [`Decision`].
//! It is pure: no sockets, no tokio, no nftables, no clock. A [`Policy`] is
//! immutable once built and cheap to share behind an `Arc`; [`Policy::decide`]
//! does not allocate.
//!
//! Semantics (DESIGN.md, "Policy file"): default deny; a matching deny rule
//! wins over any allow; else the first matching allow rule allows. A rule
//! matches when its ports cover the port and its `cidrs` contain the address
//! or its `hosts` match the name. An allow that only a `hosts` rule gives is
//! refused for private addresses and for addresses sluice's own DNS did not
//! return for that name. An IPv6 address that embeds IPv4 (NAT64, 6to4,
//! Teredo, IPv4-compatible) is private if the IPv4 inside is, and IPv4 deny
//! rules deny it; IPv4 allow rules do not admit it (docs/policy.md).
//!
//! Requests (DESIGN.md, "Requests: L7 rules"): an allow rule with `http` or
//! `inject` [`terminates`](Rule::terminates) its connections, and each
//! request is then decided by [`Rule::admits_request`]; `secrets` names
//! where injected values come from, never the values.

mod error;
mod hostname;
mod http;
mod matcher;
mod model;
mod net;
mod validate;
pub(crate) mod yaml;

#[cfg(test)]
mod tests;

pub use error::PolicyError;
pub(crate) use error::Violation;
#[cfg(test)]
pub(crate) use http::refused_path;
pub(crate) use http::{Inject, RequestReason, SecretRef, SecretSource};
#[cfg(test)]
pub(crate) use http::{PathPattern, Template, DEFAULT_SECRET_TTL};
pub(crate) use model::{DnsConfig, DnsLimits, Limits, Rule};
pub use model::{Mode, Reason, Verdict};
pub(crate) use net::{canonical, embedded_v4, is_private};

use matcher::Matcher;
use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

/// At most this many violations are reported; the rest are counted.
const MAX_REPORTED: usize = 100;
/// Largest policy text accepted.
const MAX_BYTES: usize = 4 << 20;

/// Answers "did sluice's own DNS return `ip` for `name`?". Implemented by the
/// DNS cache. `name` is passed lowercased without a trailing dot, and `ip`
/// with IPv4-mapped IPv6 turned into IPv4.
pub trait ResolvedNames {
    fn resolved(&self, name: &str, ip: IpAddr) -> bool;
}

/// Treats every name as having resolved to every address (for `sluice
/// explain`, which has no DNS history).
#[derive(Debug, Clone, Copy, Default)]
pub struct AnyResolution;

impl ResolvedNames for AnyResolution {
    fn resolved(&self, _name: &str, _ip: IpAddr) -> bool {
        true
    }
}

/// The decision for one connection. `rule` borrows the rule name from the
/// policy; it is `None` only for [`Reason::NoRule`] and the reasons the
/// proxy decides itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision<'p> {
    pub verdict: Verdict,
    pub rule: Option<&'p Arc<str>>,
    pub reason: Reason,
}

impl Decision<'_> {
    /// The rule's name, if a rule decided.
    pub(crate) fn rule_name(&self) -> Option<&str> {
        self.rule.map(|r| &**r)
    }
}

/// A validated, compiled policy.
#[derive(Debug)]
pub struct Policy {
    name: String,
    mode: Mode,
    dns: DnsConfig,
    limits: Limits,
    rules: Vec<Rule>,
    /// Rule index by name, for [`Policy::rule_named`].
    by_name: HashMap<Arc<str>, usize>,
    secrets: Vec<SecretRef>,
    matcher: Matcher,
}

impl Policy {
    /// Parses and validates `text`; `origin` names the file in messages.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        let invalid = |problems: Vec<yaml::Problem>| PolicyError::Invalid {
            violations: report(origin, problems),
        };
        if text.len() > MAX_BYTES {
            return Err(invalid(vec![yaml::Problem::new(
                yaml::Pos::START,
                format!(
                    "the policy is {} bytes, over the {} MiB limit; split it or remove unused rules",
                    text.len(),
                    MAX_BYTES >> 20
                ),
            )]));
        }
        let root = yaml::parse(text).map_err(|p| invalid(vec![p]))?;
        let v = validate::validate(&root).map_err(invalid)?;
        Ok(Policy {
            matcher: Matcher::new(&v.rules),
            by_name: v
                .rules
                .iter()
                .enumerate()
                .map(|(i, r)| (r.name.clone(), i))
                .collect(),
            name: v.name,
            mode: v.mode,
            dns: v.dns,
            limits: v.limits,
            rules: v.rules,
            secrets: v.secrets,
        })
    }

    /// Reads `path` (at most 4 MiB) and parses it; messages name the path.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let shown = path.display().to_string();
        let io = |source| PolicyError::Io {
            path: shown.clone(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let mut bytes = Vec::new();
        file.take(MAX_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        match String::from_utf8(bytes) {
            Ok(text) => Policy::from_yaml(&text, &shown),
            Err(e) => {
                let good = &e.as_bytes()[..e.utf8_error().valid_up_to()];
                let line = 1 + good.iter().filter(|b| **b == b'\n').count();
                let column = 1 + good.iter().rev().take_while(|b| **b != b'\n').count();
                Err(PolicyError::Invalid {
                    violations: vec![Violation {
                        origin: shown.clone(),
                        line,
                        column,
                        message: "the file is not UTF-8 text; save it as UTF-8".into(),
                    }],
                })
            }
        }
    }

    /// The policy's `name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn dns(&self) -> &DnsConfig {
        &self.dns
    }

    /// `limits`: what one connection may hold.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The validated rules in file order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule called `name` (names are unique), e.g. the one a
    /// [`Decision`] names.
    pub(crate) fn rule_named(&self, name: &str) -> Option<&Rule> {
        self.by_name.get(name).map(|&i| &self.rules[i])
    }

    /// The `secrets` entries in file order: names and sources, never values.
    pub(crate) fn secrets(&self) -> &[SecretRef] {
        &self.secrets
    }

    /// Decides a connection to `dst`, whose hostname (SNI, Host, or the name
    /// the sandbox resolved) is `host`. The same in both modes; does not
    /// allocate.
    pub fn decide(
        &self,
        dst: SocketAddr,
        host: Option<&str>,
        resolved: &dyn ResolvedNames,
    ) -> Decision<'_> {
        let ip = net::canonical(dst.ip());
        let port = dst.port();
        let mut buf = [0u8; hostname::MAX_NAME];
        let name = host.and_then(|h| hostname::normalize(h, &mut buf));

        if let Some(r) = self.matcher.deny(ip, name, port) {
            return self.decision(Verdict::Deny, r, Reason::DenyRule);
        }
        if let Some(r) = self.matcher.allow_cidr(ip, port) {
            if net::is_local_host(ip) {
                // sluice's own host: a broad rule (0.0.0.0/0, ::/0,
                // 64:ff9b::/96) never reaches it; a rule naming loopback does.
                return match self.allow_loopback(ip, port) {
                    Some(named) => self.decision(Verdict::Allow, named, Reason::AllowRule),
                    None => self.decision(Verdict::Deny, r, Reason::LoopbackAddress),
                };
            }
            return self.decision(Verdict::Allow, r, Reason::AllowRule);
        }
        if let Some(name) = name {
            if let Some(r) = self.matcher.allow_host(name, port) {
                return if is_private(ip) {
                    self.decision(Verdict::Deny, r, Reason::PrivateAddress)
                } else if !self.resolves_to(name, ip, resolved) {
                    self.decision(Verdict::Deny, r, Reason::HostAddressMismatch)
                } else {
                    self.decision(Verdict::Allow, r, Reason::AllowRule)
                };
            }
        }
        Decision {
            verdict: Verdict::Deny,
            rule: None,
            reason: Reason::NoRule,
        }
    }

    /// The first allow rule covering `port` with a prefix inside loopback
    /// that holds `ip` (only plain 127.0.0.0/8 and `::1` can be held: an
    /// embedded or unspecified form never is). Destinations on sluice's own
    /// host are rare: a scan of the rules costs them alone.
    fn allow_loopback(&self, ip: IpAddr, port: u16) -> Option<u32> {
        let index = self.rules.iter().position(|r| {
            r.action == Verdict::Allow
                && r.covers_port(port)
                && r.cidrs
                    .iter()
                    .any(|net| net::names_loopback(net) && net.contains(&ip))
        })?;
        u32::try_from(index).ok()
    }

    /// Whether `name` resolves to `ip` as far as hosts rules are concerned:
    /// a name in `dns.hosts` is pinned to exactly the addresses listed
    /// there (whatever any resolver said), any other name to what sluice's
    /// resolver returned.
    fn resolves_to(&self, name: &str, ip: IpAddr, resolved: &dyn ResolvedNames) -> bool {
        match self.dns.hosts.get(name) {
            Some(pinned) => pinned.iter().any(|p| net::canonical(*p) == ip),
            None => resolved.resolved(name, ip),
        }
    }

    /// True if `name` is in `dns.hosts`: its addresses are the policy's,
    /// never a resolver's.
    pub fn pins(&self, name: &str) -> bool {
        let mut buf = [0u8; hostname::MAX_NAME];
        hostname::normalize(name, &mut buf).is_some_and(|n| self.dns.hosts.contains_key(n))
    }

    /// True if some rule with `hosts` (allow or deny) covers `port`, so the
    /// hostname could change the verdict and is worth peeking for.
    pub(crate) fn host_can_matter(&self, port: u16) -> bool {
        self.matcher.host_can_matter(port)
    }

    /// True if, on a connection to `dst` that was allowed, another hostname
    /// could still change the verdict: the address alone does not admit it
    /// (a hosts rule did), or a deny rule with `hosts` covers the port. Each
    /// request of such a plain-HTTP connection is decided on its own Host.
    pub(crate) fn host_decides_each_request(&self, dst: SocketAddr) -> bool {
        let ip = net::canonical(dst.ip());
        self.matcher.host_can_deny(dst.port()) || self.matcher.allow_cidr(ip, dst.port()).is_none()
    }

    /// For DNS: true if some allow rule's `hosts` match `name` (any port)
    /// and no deny rule covering every port names it.
    pub fn admits_name(&self, name: &str) -> bool {
        let mut buf = [0u8; hostname::MAX_NAME];
        hostname::normalize(name, &mut buf).is_some_and(|n| self.matcher.admits_name(n))
    }

    fn decision(&self, verdict: Verdict, rule: u32, reason: Reason) -> Decision<'_> {
        Decision {
            verdict,
            rule: Some(&self.rules[rule as usize].name),
            reason,
        }
    }
}

/// Renders the problems as violations in file order, at most
/// [`MAX_REPORTED`] of them and a count of the rest.
fn report(origin: &str, mut problems: Vec<yaml::Problem>) -> Vec<Violation> {
    problems.sort_by_key(|p| p.at);
    let total = problems.len();
    let violation = |at: yaml::Pos, message: String| Violation {
        origin: origin.to_string(),
        line: at.line,
        column: at.column,
        message,
    };
    let last = problems
        .get(MAX_REPORTED.min(total).saturating_sub(1))
        .map_or(yaml::Pos::START, |p| p.at);
    let mut out: Vec<Violation> = problems
        .into_iter()
        .take(MAX_REPORTED)
        .map(|p| violation(p.at, p.message))
        .collect();
    if total > MAX_REPORTED {
        out.push(violation(
            last,
            format!(
                "{} more problems not shown; fix the ones above and check again",
                total - MAX_REPORTED
            ),
        ));
    }
    out
}
