//! Serving a prepared sandbox, for every way in (`app`'s `sluice run`,
//! `sluice oci` and `sluice vm`, and the daemon alike): the sandbox's proxy
//! listeners and DNS ([`ServedSandbox`]), the process-wide services
//! ([`Services`]), the policy in force and its reloading ([`ActiveSource`],
//! [`Reloading`]), and the runtime plan (workers, the nice lead). It sits
//! between the commands and `attach`: it never makes a namespace or a rule
//! (`attach` does) and never supervises a workload (`app` does), and it
//! imports neither `app` nor `daemon`.

mod reloading;
pub(crate) mod runtime;
mod sandbox;
mod services;

use std::net::SocketAddr;

use crate::policy::Policy;

pub(crate) use reloading::{bundle_of, Reloading};
pub(crate) use reloading::{ActiveSource, PolicySource};
pub(crate) use sandbox::{ServedSandbox, Shared, DRAIN_GRACE};
pub(crate) use services::{CheckpointSettings, ServiceOptions, Services, DRAIN_DEADLINE};

/// Whether `policy` has a rule whose connections sluice terminates (an
/// `http` or `inject` block): only then does a workload need the sandbox CA.
pub(crate) fn terminates_tls(policy: &Policy) -> bool {
    policy.rules().iter().any(|r| r.terminates())
}

/// The nameservers of the host's resolv.conf, for policies that name no
/// `dns.upstream`.
pub(crate) fn host_nameservers() -> Vec<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}
