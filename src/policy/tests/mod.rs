//! Behaviour of the policy module, one behaviour per test.

mod decide;
mod dns;
mod embedded;
mod errors;
mod files;
mod l7_errors;
mod limits;
mod reference;
mod requests;

use super::{Decision, Policy, ResolvedNames};
use std::net::{IpAddr, SocketAddr};

/// Builds a policy from YAML or fails the test with the messages.
fn policy(yaml: &str) -> Policy {
    Policy::from_yaml(yaml, "test.yaml").unwrap_or_else(|e| panic!("policy rejected:\n{e}"))
}

/// The error text of a policy that must be rejected.
fn rejected(yaml: &str) -> String {
    match Policy::from_yaml(yaml, "test.yaml") {
        Ok(_) => panic!("policy accepted:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// A DNS history that resolved nothing.
struct NothingResolved;

impl ResolvedNames for NothingResolved {
    fn resolved(&self, _: &str, _: IpAddr) -> bool {
        false
    }
}

/// A DNS history with fixed `(name, ip)` pairs.
struct Resolved(Vec<(&'static str, IpAddr)>);

impl ResolvedNames for Resolved {
    fn resolved(&self, name: &str, ip: IpAddr) -> bool {
        self.0.iter().any(|(n, i)| *n == name && *i == ip)
    }
}

fn show(d: Decision<'_>) -> String {
    format!(
        "{}/{}/{}",
        d.verdict.as_str(),
        d.reason.as_str(),
        d.rule_name().unwrap_or("-")
    )
}
