//! enforce: the `inet sluice` nftables table that makes sluice the sandbox's
//! only way out.
//!
//! This module owns the ruleset as data: [`ruleset`] is a pure function of a
//! [`SandboxSpec`] (golden tests pin its JSON), [`apply`] installs it as ONE
//! transaction that applies whole or not at all (host mode's table over
//! netlink, encoded in `netlink` and tested against libnftables' reading of
//! the golden JSON; a microVM's fence through libnftables, in process),
//! [`verify`] reads the tables back and refuses anything that differs, and
//! [`dropped_packets`] reads the named drop counter for metrics. No
//! process is spawned. Every function acts on the network namespace of the
//! CALLING THREAD: callers run them through `netns::SandboxNetns::run_in`.
//! This module must never fail open: no rule-by-rule application, no
//! tolerated partial failure, and it never touches any table but
//! `inet sluice`. It knows nothing of sockets or policy; creating namespaces
//! belongs to `netns`.

#[forbid(unsafe_code)]
mod fence;
#[allow(unsafe_code)]
mod libnft;
#[forbid(unsafe_code)]
mod netlink;
#[forbid(unsafe_code)]
mod nft;
#[forbid(unsafe_code)]
mod readback;
#[forbid(unsafe_code)]
mod ruleset;

pub(crate) use nft::start_apply_and_verify;
pub use nft::{
    apply, apply_and_verify, drop_counts, dropped_packets, remove, verify, verify_with_libnftables,
};

pub(crate) use fence::TapIpv6;
#[cfg(test)]
pub(crate) use fence::INGRESS;
pub use fence::{DropReason, TapFence};
pub(crate) use ruleset::TABLE;

use std::net::{Ipv4Addr, Ipv6Addr};

/// What the table enforces for one sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxSpec {
    /// Port of sluice's transparent TCP listener inside the namespace; all
    /// TCP (v4 and v6) except port 53 and loopback is redirected here.
    pub(crate) proxy_port: u16,
    /// Port of sluice's DNS responder; UDP and TCP port 53 are redirected here.
    pub(crate) dns_port: u16,
    /// `None`: host mode (the output hooks of a dedicated sandbox
    /// namespace, table `inet sluice`). `Some(fence)`: a microVM's tap, fenced
    /// on the host side by the tables `netdev sluice-TAP` (layer 2) and
    /// `inet sluice-TAP` (redirects, input, forward; and the namespace's own
    /// output when the namespace is the VMM's alone). See [`fence`].
    pub tap: Option<TapFence>,
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

    /// MicroVM mode spec: `fence` on the host side of its tap.
    pub fn vm(proxy_port: u16, dns_port: u16, fence: TapFence) -> SandboxSpec {
        SandboxSpec {
            proxy_port,
            dns_port,
            tap: Some(fence),
        }
    }

    /// The tables this spec installs, as `(family, name)`.
    pub fn tables(&self) -> Vec<(&'static str, String)> {
        match &self.tap {
            None => vec![("inet", TABLE.to_string())],
            Some(fence) => vec![("inet", fence.table()), ("netdev", fence.table())],
        }
    }

    /// Whether the namespace is the sandbox's alone, so that any table
    /// sluice did not install there is a mismatch.
    pub(crate) fn owns_namespace(&self) -> bool {
        self.tap.as_ref().is_none_or(|fence| fence.dedicated)
    }
}

/// A fence for `tap` in a test or an example: guest 198.19.254.2 behind
/// gateway 198.19.254.1, MAC 52:54:00:5c:00:02, IPv6 2001:db8:5c:fffe::2
/// behind ::1 (and its SLAAC address in that /64), in a namespace that is
/// the VMM's alone.
pub fn example_fence(tap: &str) -> TapFence {
    TapFence {
        name: tap.to_string(),
        guest_mac: crate::mac::MacAddr([0x52, 0x54, 0, 0x5c, 0, 2]),
        guest: Ipv4Addr::new(198, 19, 254, 2),
        gateway: Ipv4Addr::new(198, 19, 254, 1),
        ipv6: Some(TapIpv6 {
            guest: Ipv6Addr::new(0x2001, 0xdb8, 0x5c, 0xfffe, 0, 0, 0, 2),
            gateway: Ipv6Addr::new(0x2001, 0xdb8, 0x5c, 0xfffe, 0, 0, 0, 1),
            slaac: Some(Ipv6Addr::new(
                0x2001, 0xdb8, 0x5c, 0xfffe, 0x5054, 0xff, 0xfe5c, 2,
            )),
        }),
        dedicated: true,
    }
}

/// Whether libnftables loads here (`sluice doctor`): the same load a tap's
/// fence, a replaced table and the drop counters go through. The `nft`
/// program is never needed.
pub(crate) fn libnftables_loads() -> Result<(), EnforceError> {
    libnft::load()
}

/// Errors from applying, verifying or reading the `inet sluice` table.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    #[error("cannot load libnftables ({0}): install nftables (apt-get install nftables)")]
    NftNotFound(String),
    #[error("this sluice is statically linked (like the microVM guest kit's build), and a static binary cannot load libnftables safely; enforce with the dynamically linked build (cargo build --release)")]
    StaticBuild,
    #[error("cannot give the nftables thread its own descriptor table (close_range, Linux 5.9 or later): {0}")]
    Descriptors(#[source] std::io::Error),
    #[error("cannot open a netfilter netlink socket in the sandbox namespace: {0} (does this kernel have nf_tables?)")]
    Netlink(#[source] std::io::Error),
    #[error("talking to nf_tables over netlink in the sandbox namespace failed: {0}; nothing runs without the table")]
    Exchange(#[source] std::io::Error),
    #[error("cannot start the thread that applies the nftables table: {0}")]
    Thread(#[source] std::io::Error),
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
    #[error("table {0} does not exist in this namespace: apply the ruleset first")]
    TableMissing(String),
    #[error("reading back {table} failed: {stderr}")]
    List { table: String, stderr: String },
    #[error("could not parse libnftables' JSON output: {0}")]
    Parse(String),
    #[error("the sluice tables differ from what sluice applied ({0}); something else changed the ruleset, refusing to run the workload")]
    Mismatch(String),
}

impl crate::exit_class::Classified for EnforceError {
    /// Every enforcement failure: libnftables missing, netlink, read-back mismatch.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::CannotEnforce
    }
}
