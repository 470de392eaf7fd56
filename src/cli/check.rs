//! `sluice check` and `sluice explain`: a policy file read without
//! enforcing anything.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::BadInput;
use crate::policy::{Mode, Policy, Verdict};

pub(crate) const EXPLAIN_AFTER_HELP: &str =
    "Examples:\n  sluice explain --policy policies/dev.yaml 198.18.0.1:8080\n  \
sluice explain --policy policies/dev.yaml 198.18.0.1:443 --host origin.test\n\n\
With --host, the name is assumed to have been resolved by sluice's DNS to DEST.";

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The policy YAML file.
    #[arg(long, value_name = "FILE")]
    pub(crate) policy: PathBuf,
}

#[derive(Debug, Args)]
pub(crate) struct ExplainArgs {
    /// The policy YAML file.
    #[arg(long, value_name = "FILE")]
    pub(crate) policy: PathBuf,
    /// Destination address, with optional port (IPv6 as [addr]:port). Port defaults to 443.
    #[arg(value_name = "DEST[:PORT]")]
    pub(crate) dest: String,
    /// Hostname the connection names (TLS SNI, HTTP Host, or resolved name).
    #[arg(long, value_name = "NAME")]
    pub(crate) host: Option<String>,
}

/// `sluice check`: a summary, or every error with file:line:column.
pub(crate) fn execute_check(args: CheckArgs) -> anyhow::Result<i32> {
    let path = &args.policy;
    let policy = Policy::load(path)?;
    let rules = policy.rules();
    let allows = rules.iter().filter(|r| r.action == Verdict::Allow).count();
    println!(
        "{}: policy \"{}\" is valid: {} rules ({} allow, {} deny), mode {}",
        path.display(),
        policy.name(),
        rules.len(),
        allows,
        rules.len() - allows,
        match policy.mode() {
            Mode::Enforce => "enforce",
            Mode::Audit => "audit",
        }
    );
    Ok(0)
}

/// `sluice explain`: what the policy decides for one destination.
pub(crate) fn execute_explain(args: ExplainArgs) -> anyhow::Result<i32> {
    let policy = Policy::load(&args.policy)?;
    let dst = parse_dest(&args.dest).map_err(BadInput::from)?;
    let host = args.host.as_deref();
    let decision = policy.decide(dst, host, &crate::policy::AnyResolution);
    println!("destination: {dst}");
    if let Some(host) = host {
        println!("host:        {host}");
    }
    println!("verdict:     {}", decision.verdict.as_str());
    println!("rule:        {}", decision.rule_name().unwrap_or("(none)"));
    println!("reason:      {}", decision.reason.as_str());
    if policy.mode() == Mode::Audit && decision.verdict == Verdict::Deny {
        println!(
            "note:        the policy is in audit mode: this deny would be logged, not enforced"
        );
    }
    Ok(0)
}

/// `ADDR`, `ADDR:PORT`, `[V6]:PORT` or a bare IPv6 address; port defaults to 443.
fn parse_dest(dest: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(addr) = dest.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = dest.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, 443));
    }
    anyhow::bail!(
        "`{dest}` is not an address: give DEST as 198.18.0.1, 198.18.0.1:8080, 2001:db8::1 or [2001:db8::1]:443"
    )
}
