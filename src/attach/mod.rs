//! Turning "a workload" into "a namespace sluice enforces".
//!
//! `prepare` does the part every path shares: install and read back the
//! `inet sluice` table in a namespace and bind the proxy and DNS sockets
//! inside it. `host` runs a command in a fresh namespace (`sluice run`);
//! `oci` puts a podman container in one (`sluice oci`) or hands a container's
//! namespace to the daemon (`sluice oci-hook`).

pub mod host;
pub mod oci;
pub mod oci_check;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::enforce::{self, SandboxSpec};
use crate::netns::{NetnsError, SandboxNetns};

/// Ports of sluice's listeners inside every sandbox namespace. The namespace
/// is fresh, so fixed ports cannot collide, and fixed ports keep the ruleset
/// the same for every sandbox.
pub const PROXY_PORT: u16 = 15001;
pub const DNS_PORT: u16 = 15053;

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Enforce(#[from] enforce::EnforceError),
    #[error("cannot bind sluice's {what} socket on {addr} inside the sandbox: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the workload `{program}`: {source}; check that it exists in PATH and is executable")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("unknown user `{0}`: give a user name or numeric uid that exists on this host")]
    UnknownUser(String),
    #[error(transparent)]
    Confine(#[from] crate::confine::ConfineError),
}

/// The sockets sluice serves inside one sandbox namespace.
pub struct SandboxSockets {
    pub proxy: Vec<std::net::TcpListener>,
    pub dns_udp: Vec<std::net::UdpSocket>,
    pub dns_tcp: Vec<std::net::TcpListener>,
}

/// An enforced sandbox: the namespace, its verified table, its sockets.
pub struct Sandbox {
    pub netns: SandboxNetns,
    pub spec: SandboxSpec,
    pub sockets: SandboxSockets,
}

/// Install the table in `netns`, read it back, and bind the listeners there.
/// Only when this returns Ok is the namespace non-bypassable.
pub fn prepare(netns: SandboxNetns) -> Result<Sandbox, AttachError> {
    let spec = SandboxSpec::host(PROXY_PORT, DNS_PORT);
    let spec_in = spec.clone();
    let sockets = netns.run_in(move || -> Result<SandboxSockets, AttachError> {
        enforce::apply(&spec_in)?;
        enforce::verify(&spec_in)?;
        bind_sockets()
    })??;
    tracing::info!(
        network_non_bypassable = true,
        "sandbox table applied and read back"
    );
    Ok(Sandbox {
        netns,
        spec,
        sockets,
    })
}

/// Runs on a thread inside the sandbox namespace.
fn bind_sockets() -> Result<SandboxSockets, AttachError> {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, PROXY_PORT));
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, PROXY_PORT));
    let dns4 = SocketAddr::from((Ipv4Addr::LOCALHOST, DNS_PORT));
    let dns6 = SocketAddr::from((Ipv6Addr::LOCALHOST, DNS_PORT));
    let tcp = |what, addr| {
        let l = std::net::TcpListener::bind(addr).map_err(|source| AttachError::Bind {
            what,
            addr,
            source,
        })?;
        l.set_nonblocking(true)
            .map_err(|source| AttachError::Bind { what, addr, source })?;
        // Accepted sockets inherit TCP_NODELAY: one system call less per
        // connection than setting it on each.
        nix::sys::socket::setsockopt(&l, nix::sys::socket::sockopt::TcpNoDelay, &true).map_err(
            |e| AttachError::Bind {
                what,
                addr,
                source: e.into(),
            },
        )?;
        Ok::<_, AttachError>(l)
    };
    let udp = |addr| {
        let s = std::net::UdpSocket::bind(addr).map_err(|source| AttachError::Bind {
            what: "DNS (UDP)",
            addr,
            source,
        })?;
        s.set_nonblocking(true)
            .map_err(|source| AttachError::Bind {
                what: "DNS (UDP)",
                addr,
                source,
            })?;
        Ok::<_, AttachError>(s)
    };
    Ok(SandboxSockets {
        proxy: vec![tcp("proxy", v4)?, tcp("proxy", v6)?],
        dns_udp: vec![udp(dns4)?, udp(dns6)?],
        dns_tcp: vec![tcp("DNS (TCP)", dns4)?, tcp("DNS (TCP)", dns6)?],
    })
}
