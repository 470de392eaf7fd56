//! enforce: the `inet sluice` nftables table that makes sluice the sandbox's
//! only way out.
//!
//! This module owns the ruleset as data: [`ruleset`] is a pure function of a
//! [`SandboxSpec`] (golden tests pin its JSON), [`apply`] hands it to
//! libnftables, in process, as ONE transaction that applies whole or not at
//! all, [`verify`] reads the table back and refuses anything that differs,
//! and [`dropped_packets`] reads the named drop counter for metrics. No
//! process is spawned. Every function acts on the network namespace of the
//! CALLING THREAD: callers run them through `netns::SandboxNetns::run_in`.
//! This module must never fail open: no rule-by-rule application, no
//! tolerated partial failure, and it never touches any table but
//! `inet sluice`. It knows nothing of sockets or policy; creating namespaces
//! belongs to `netns`.

mod libnft;
#[forbid(unsafe_code)]
mod nft;
#[forbid(unsafe_code)]
mod readback;
#[forbid(unsafe_code)]
mod ruleset;

pub use nft::{apply, dropped_packets, verify};

/// Starts loading libnftables on a thread of its own and returns at once,
/// so that the first [`apply`] finds it loaded (about 1 ms of dynamic
/// loading here, which a caller can overlap with creating the namespace).
/// Optional: every function loads it when first needed, and reports a
/// missing library then; this thread only ever loads, so nothing is lost if
/// it fails or the process exits first.
pub fn preload() {
    let _ = std::thread::Builder::new()
        .name("sluice-nft-load".into())
        .spawn(|| {
            let _ = libnft::load_now();
        });
}
pub use ruleset::{
    ruleset, DROP_COUNTER, FORWARD_FILTER, INPUT_FILTER, OUTPUT_FILTER, OUTPUT_NAT, PREROUTING_NAT,
    TABLE,
};

/// What the table enforces for one sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxSpec {
    /// Port of sluice's transparent TCP listener inside the namespace; all
    /// TCP (v4 and v6) except port 53 and loopback is redirected here.
    pub proxy_port: u16,
    /// Port of sluice's DNS responder; UDP and TCP port 53 are redirected here.
    pub dns_port: u16,
    /// `None`: host mode (output hooks of a dedicated sandbox namespace).
    /// `Some(tap)`: microVM mode — only traffic arriving on that tap is
    /// redirected (prerouting), admitted (input: proxy/DNS ports) or dropped
    /// (everything else, forward included); the namespace's own traffic is
    /// left alone, since the VMM may share it.
    pub tap: Option<String>,
}

impl SandboxSpec {
    /// Host mode spec (no tap).
    pub fn host(proxy_port: u16, dns_port: u16) -> SandboxSpec {
        SandboxSpec {
            proxy_port,
            dns_port,
            tap: None,
        }
    }

    /// MicroVM mode spec for `tap`.
    pub fn tap(proxy_port: u16, dns_port: u16, tap: impl Into<String>) -> SandboxSpec {
        SandboxSpec {
            proxy_port,
            dns_port,
            tap: Some(tap.into()),
        }
    }
}

/// Errors from applying, verifying or reading the `inet sluice` table.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    #[error("cannot load libnftables ({0}): install nftables (apt-get install nftables)")]
    NftNotFound(String),
    #[error("cannot open a netfilter netlink socket in the sandbox namespace: {0} (does this kernel have nf_tables?)")]
    Netlink(#[source] std::io::Error),
    #[error("libnftables could not set up a context (out of memory?); nothing was applied")]
    Context,
    #[error("invalid sandbox spec: {0}")]
    InvalidSpec(String),
    #[error(
        "changing nftables needs root (CAP_NET_ADMIN in the sandbox namespace): run sluice as root ({stderr})"
    )]
    Permission { stderr: String },
    #[error("libnftables rejected the sluice ruleset, nothing was applied: {stderr}")]
    Apply { stderr: String },
    #[error("table inet sluice does not exist in this namespace: apply the ruleset first")]
    TableMissing,
    #[error("reading back table inet sluice failed: {stderr}")]
    List { stderr: String },
    #[error("could not parse libnftables' JSON output: {0}")]
    Parse(String),
    #[error("table inet sluice differs from what sluice applied ({0}); something else changed the ruleset, refusing to run the workload")]
    Mismatch(String),
}
