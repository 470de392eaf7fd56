//! Turning "a workload" into "a namespace sluice enforces".
//!
//! Each way in is a small module that describes its [`Attachment`]: which
//! ruleset the namespace gets, where sluice's listeners bind in it, which
//! path the records carry, and sluice's own addresses there. `host` runs a
//! command in a fresh namespace (`sluice run`); `oci` puts a podman
//! container in one (`sluice oci`) or checks a container for the OCI hook;
//! `vm` fences a microVM's tap (`sluice vm`, `sluice vm attach`).
//! [`prepare`] does the rest for all of them: install and read back the
//! namespace's sluice tables and bind the listeners (and a VM's DHCP
//! socket) inside it. Nothing here serves connections (`serve` does) or
//! decides policy.

pub(crate) mod host;
pub(crate) mod oci;
pub(crate) mod oci_check;
pub(crate) mod vm;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::enforce::{self, SandboxSpec};
use crate::netns::{NetnsError, SandboxNetns, SANDBOX_V4, SANDBOX_V6};
use crate::workload::WorkloadPath;

/// Ports of sluice's listeners inside every sandbox namespace. The namespace
/// is fresh, so fixed ports cannot collide, and fixed ports keep the ruleset
/// the same for every sandbox.
pub(crate) const PROXY_PORT: u16 = 15001;
pub(crate) const DNS_PORT: u16 = 15053;

#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachError {
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
    #[error(transparent)]
    Dhcp(#[from] crate::dhcp::DhcpError),
    #[error("cannot open the router advertisement socket on {tap}: {source}")]
    Router {
        tap: String,
        #[source]
        source: std::io::Error,
    },
}

/// How one kind of workload is attached: what [`prepare`] installs and
/// binds in its namespace, and how its records are labelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attachment {
    /// The `path` of every record and metric of this sandbox.
    pub(crate) path: WorkloadPath,
    /// The ruleset the namespace gets (host-style output hooks, or a tap's).
    pub(crate) spec: SandboxSpec,
    /// Where the transparent proxy listens inside the namespace.
    pub(crate) proxy_binds: Vec<SocketAddr>,
    /// Where the DNS responder listens (UDP and TCP) inside the namespace.
    pub(crate) dns_binds: Vec<SocketAddr>,
    /// sluice's own addresses in the namespace: never a destination.
    pub(crate) internal: Vec<IpAddr>,
    /// A microVM's tap and the one lease sluice's DHCP responder hands out there.
    pub(crate) dhcp: Option<(String, crate::dhcp::GuestLease)>,
    /// A microVM's tap and what sluice's router advertisements tell its
    /// guest (with IPv6). The guest's IPv6 neighbour entries on the tap are
    /// pinned too (its MAC, permanent), so that no reply to it waits on
    /// neighbour discovery.
    pub(crate) router: Option<(String, crate::ndp::GuestRouter)>,
    /// Proxy listeners per proxy address: one per worker of the runtime
    /// that serves them ([`Attachment::served_by`]), each accepting on its
    /// worker.
    pub(crate) listeners_per_address: usize,
    /// How many of those listeners accept on one bound socket
    /// ([`Attachment::sockets_shared_by`]); the sockets of one address
    /// share it through SO_REUSEPORT, and the kernel spreads connections
    /// over them by their addresses.
    pub(crate) listeners_per_socket: usize,
}

impl Attachment {
    /// The same attachment, with `listeners` proxy listeners per address
    /// (at least one): one per worker (`serve::runtime::Workers`).
    pub(crate) fn served_by(mut self, listeners: usize) -> Attachment {
        self.listeners_per_address = listeners.max(1);
        self
    }

    /// The same attachment, with `listeners` of each address's listeners
    /// accepting on one socket (at least one; none shared unless it divides
    /// their number, so that each socket has as many). Workers that share
    /// a socket take whichever connection comes while they are free, where
    /// SO_REUSEPORT's hash can queue one behind a busy worker while another
    /// idles (`serve::runtime::WORKERS_PER_SOCKET` says what was measured).
    pub(crate) fn sockets_shared_by(mut self, listeners: usize) -> Attachment {
        self.listeners_per_socket = listeners.max(1);
        self
    }

    /// A namespace that is the workload's alone (`sluice run`'s, a
    /// container's): its output hooks redirect every TCP connection and DNS
    /// query to listeners on its loopback, v4 and v6.
    pub(crate) fn dedicated_namespace(path: WorkloadPath) -> Attachment {
        let on_loopback = |port| {
            vec![
                SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
            ]
        };
        Attachment {
            path,
            spec: SandboxSpec::host(PROXY_PORT, DNS_PORT),
            proxy_binds: on_loopback(PROXY_PORT),
            dns_binds: on_loopback(DNS_PORT),
            internal: vec![SANDBOX_V4.into(), SANDBOX_V6.into()],
            dhcp: None,
            router: None,
            listeners_per_address: 1,
            listeners_per_socket: 1,
        }
    }
}

/// The sockets sluice serves inside one sandbox namespace.
pub(crate) struct SandboxSockets {
    pub(crate) proxy: Vec<std::net::TcpListener>,
    pub(crate) dns_udp: Vec<std::net::UdpSocket>,
    pub(crate) dns_tcp: Vec<std::net::TcpListener>,
    /// A microVM's DHCP server socket (on its tap) and its lease.
    pub(crate) dhcp: Option<(std::net::UdpSocket, crate::dhcp::GuestLease)>,
    /// A microVM's router advertisement socket (on its tap) and what it says.
    pub(crate) router: Option<(crate::ndp::RouterSocket, crate::ndp::GuestRouter)>,
}

/// An enforced sandbox: the namespace, how it is attached (its verified
/// table among it), its sockets.
pub(crate) struct Sandbox {
    pub(crate) netns: SandboxNetns,
    pub(crate) attachment: Attachment,
    pub(crate) sockets: SandboxSockets,
}

/// Install `attachment`'s table in `netns`, read it back, and bind its
/// listeners there. Only when this returns Ok is the namespace
/// non-bypassable.
pub(crate) fn prepare(
    netns: SandboxNetns,
    attachment: &Attachment,
) -> Result<Sandbox, AttachError> {
    let inside = attachment.clone();
    let sockets = netns.run_in(move || enforce_inside(&inside))??;
    tracing::info!(
        network_non_bypassable = true,
        path = %attachment.path,
        "sandbox tables applied and read back"
    );
    Ok(Sandbox {
        netns,
        attachment: attachment.clone(),
        sockets,
    })
}

/// A listener on `addr` that other listeners of this process share
/// (SO_REUSEPORT; SO_REUSEADDR as std sets it), non-blocking, close-on-exec.
/// std's `TcpListener::bind` cannot set an option before bind.
fn reuseport_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use nix::sys::socket::{
        bind, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
        SockaddrStorage,
    };
    use std::os::fd::AsRawFd;
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    setsockopt(&fd, sockopt::ReusePort, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    listen(&fd, Backlog::MAXCONN)?;
    Ok(std::net::TcpListener::from(fd))
}

/// [`prepare`] for a namespace made for it: created, plumbed, enforced and
/// bound on a thread of its own, started at once, so that the caller can
/// start its services meanwhile (`sluice run` and `sluice oci` do);
/// [`FreshSandbox::wait`] hands the sandbox over once it is enforced.
pub(crate) fn start_fresh(attachment: &Attachment) -> Result<FreshSandbox, AttachError> {
    let inside = attachment.clone();
    let spec = attachment.spec.clone();
    // The table is applied and read back (over netlink, no libnftables) on
    // a thread of its own while the links are set up: the table names no
    // link but `lo`. The listeners bind to addresses on the links, after.
    let creating = SandboxNetns::start_create_and_run(
        move || enforce::start_apply_and_verify(&spec),
        move |applying| {
            applying?.wait()?;
            bind_sockets(&inside)
        },
    )?;
    Ok(FreshSandbox {
        creating,
        attachment: attachment.clone(),
    })
}

/// A sandbox namespace being made and enforced ([`start_fresh`]). Dropped
/// without [`FreshSandbox::wait`], it waits for that work to end and frees
/// the namespace.
pub(crate) struct FreshSandbox {
    creating: crate::netns::Creating<Result<SandboxSockets, AttachError>>,
    attachment: Attachment,
}

impl FreshSandbox {
    /// Wait until the namespace exists, its table is applied and read back,
    /// and its listeners are bound. Only when this returns Ok is the
    /// namespace non-bypassable.
    pub(crate) fn wait(self) -> Result<Sandbox, AttachError> {
        let (netns, sockets) = self.creating.wait()?;
        let sockets = sockets?;
        tracing::info!(
            network_non_bypassable = true,
            path = %self.attachment.path,
            "sandbox table applied and read back"
        );
        Ok(Sandbox {
            netns,
            attachment: self.attachment,
            sockets,
        })
    }
}

/// Runs on a thread inside the sandbox namespace: install and read back
/// the table, then bind.
fn enforce_inside(attachment: &Attachment) -> Result<SandboxSockets, AttachError> {
    enforce::apply_and_verify(&attachment.spec)?;
    bind_sockets(attachment)
}

/// Runs on a thread inside the sandbox namespace.
fn bind_sockets(attachment: &Attachment) -> Result<SandboxSockets, AttachError> {
    let listeners = attachment.listeners_per_address.max(1);
    // Shared only when every socket gets as many listeners: SO_REUSEPORT
    // spreads connections evenly over the sockets, and so over the workers.
    let per_socket = match attachment.listeners_per_socket.clamp(1, listeners) {
        n if listeners % n == 0 => n,
        _ => 1,
    };
    let bound_per_address = listeners / per_socket;
    let tcp = |what, addr, reuseport: bool| {
        let bound = if reuseport {
            reuseport_listener(addr)
        } else {
            std::net::TcpListener::bind(addr)
        };
        let l = bound.map_err(|source| AttachError::Bind { what, addr, source })?;
        l.set_nonblocking(true)
            .map_err(|source| AttachError::Bind { what, addr, source })?;
        // Accepted sockets inherit TCP_NODELAY (one system call less per
        // connection than setting it on each) and SO_OOBINLINE: a TCP
        // urgent byte arrives in the stream, where the relay reads it and
        // passes it on as data, instead of waiting out of band, where no
        // read of the stream sees it and the bytes after it stall.
        let set = |opt: &dyn Fn(&std::net::TcpListener) -> nix::Result<()>| {
            opt(&l).map_err(|e| AttachError::Bind {
                what,
                addr,
                source: e.into(),
            })
        };
        set(&|l| nix::sys::socket::setsockopt(l, nix::sys::socket::sockopt::TcpNoDelay, &true))?;
        set(&|l| nix::sys::socket::setsockopt(l, nix::sys::socket::sockopt::OobInline, &true))?;
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
    let mut sockets = SandboxSockets {
        proxy: Vec::new(),
        dns_udp: Vec::new(),
        dns_tcp: Vec::new(),
        dhcp: None,
        router: None,
    };
    for &addr in &attachment.proxy_binds {
        let reuseport = bound_per_address > 1;
        let mut bound = Vec::with_capacity(bound_per_address);
        for _ in 0..bound_per_address {
            bound.push(tcp("proxy", addr, reuseport)?);
        }
        // In worker order: the k-th listener is worker k's, on socket
        // k / per_socket.
        for k in 0..listeners {
            let socket = bound[k / per_socket]
                .try_clone()
                .map_err(|source| AttachError::Bind {
                    what: "proxy",
                    addr,
                    source,
                })?;
            sockets.proxy.push(socket);
        }
    }
    for &addr in &attachment.dns_binds {
        sockets.dns_udp.push(udp(addr)?);
        sockets.dns_tcp.push(tcp("DNS (TCP)", addr, false)?);
    }
    if let Some((tap, lease)) = &attachment.dhcp {
        sockets.dhcp = Some((crate::dhcp::bind_on_device(tap)?, lease.clone()));
    }
    if let Some((tap, router)) = &attachment.router {
        let mut router = router.clone();
        router.tap_mac =
            crate::netns::tap_ipv6_here(tap, router.guest_mac, &router.guest_addresses())?;
        let socket = crate::ndp::bind_on_device(tap).map_err(|source| AttachError::Router {
            tap: tap.clone(),
            source,
        })?;
        sockets.router = Some((socket, router));
    }
    Ok(sockets)
}

impl crate::exit_class::Classified for AttachError {
    /// A command that cannot start: 127 or 126; a user that does not exist: bad input; the rest as the cause says.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        match self {
            AttachError::Spawn { source, .. } => crate::exit_class::ExitClass::of_spawn(source),
            AttachError::UnknownUser(_) => crate::exit_class::ExitClass::BadInput,
            AttachError::Confine(e) => e.exit_class(),
            AttachError::Netns(e) => e.exit_class(),
            AttachError::Enforce(e) => e.exit_class(),
            AttachError::Dhcp(e) => e.exit_class(),
            AttachError::Bind { .. } | AttachError::Router { .. } => {
                crate::exit_class::ExitClass::CannotEnforce
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dedicated_namespace_redirects_to_loopback_listeners_with_the_host_ruleset() {
        let a = Attachment::dedicated_namespace(WorkloadPath::Oci);
        assert_eq!(a.path, WorkloadPath::Oci);
        assert_eq!(a.spec, SandboxSpec::host(PROXY_PORT, DNS_PORT));
        assert!(a
            .proxy_binds
            .iter()
            .all(|b| b.ip().is_loopback() && b.port() == PROXY_PORT));
        assert!(a
            .dns_binds
            .iter()
            .all(|b| b.ip().is_loopback() && b.port() == DNS_PORT));
        assert_eq!(a.proxy_binds.len(), 2);
        assert!(a.internal.contains(&IpAddr::from(SANDBOX_V4)));
    }
}
