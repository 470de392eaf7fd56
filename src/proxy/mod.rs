//! The proxy: listeners inside the sandbox namespace, the original
//! destination of each redirected connection, a bounded peek at the first
//! bytes (TLS SNI, HTTP Host), the policy decision, the upstream connect from
//! sluice's own namespace, and the byte relay.
//!
//! It knows nothing of nftables, namespaces or how names are resolved: it is
//! handed already-bound listeners, sluice's own addresses
//! ([`InternalAddrs`]) and a [`Resolver`] through its [`ProxyContext`], asks
//! `policy` (through the swappable handle) for decisions, and reports to
//! `audit`, `metrics` and `timing`.

mod connection;
mod decide;
pub mod http1;
mod l7;
mod original_dst;
pub mod peek;
mod relay;
mod session;
mod upstream;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::audit::AuditLog;
use crate::bundle::PolicyHandle;
use crate::drain::Watch;
use crate::metrics::PathMetrics;
use crate::policy::{self, ResolvedNames};
use crate::timing::TimingLog;
use crate::workload::WorkloadPath;

pub(crate) use l7::Interception;
pub(crate) use original_dst::original_dst;

/// Bounds that keep a flood of connections or a slow client at a bounded cost.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Connections relayed at once; further accepts wait for a slot.
    pub(crate) max_connections: usize,
    /// Bytes read from the client while looking for SNI / Host.
    pub(crate) peek_bytes: usize,
    /// How long to wait for the client's first bytes before deciding on the
    /// address alone (server-first protocols such as SSH or SMTP).
    pub(crate) peek_timeout: Duration,
    /// Upstream connect timeout.
    pub(crate) connect_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 4096,
            peek_bytes: 16 * 1024,
            peek_timeout: Duration::from_millis(300),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// What the sandbox's resolver told it: the policy asks whether a name
/// resolved to an address ([`ResolvedNames`]); the proxy also asks which
/// name an address was resolved for, when a connection names none itself,
/// and has a name it does not know verified.
pub(crate) trait Resolver: ResolvedNames + Send + Sync {
    /// The name most recently resolved to `ip`, if that answer still holds.
    fn name_for(&self, ip: IpAddr) -> Option<String>;

    /// Resolve `name` without the sandbox's help and say whether `ip` is
    /// among its addresses (a connection's SNI or Host that the resolver's
    /// memory had no answer for). Bounded in time; `false` when nothing can
    /// be confirmed. The default confirms nothing.
    fn verify<'a>(&'a self, name: &'a str, ip: IpAddr) -> Verifying<'a> {
        let _ = (name, ip);
        Box::pin(std::future::ready(false))
    }
}

/// The answer of [`Resolver::verify`], to be awaited.
pub(crate) type Verifying<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// sluice's own addresses, never a destination whatever the policy says:
/// its addresses inside the sandbox (any port) and its endpoints such as
/// /metrics (that port; an unspecified address matches every address).
/// Destinations are compared in every spelling that reaches the same
/// place: IPv4-mapped IPv6 as its IPv4, the IPv4 inside NAT64, 6to4,
/// Teredo and IPv4-compatible addresses, and an unspecified destination
/// (which the kernel sends to the local host) as every endpoint's.
#[derive(Debug, Clone, Default)]
pub(crate) struct InternalAddrs {
    pub(crate) ips: Vec<IpAddr>,
    pub(crate) endpoints: Vec<SocketAddr>,
}

impl InternalAddrs {
    pub(crate) fn contains(&self, dst: SocketAddr) -> bool {
        let ip = policy::canonical(dst.ip());
        if self.holds(ip, dst.port()) {
            return true;
        }
        match ip {
            IpAddr::V6(v6) => policy::embedded_v4(v6)
                .into_iter()
                .flatten()
                .any(|v4| self.holds(IpAddr::V4(v4), dst.port())),
            IpAddr::V4(_) => false,
        }
    }

    /// `ip` (canonical) on `port` is one of these.
    fn holds(&self, ip: IpAddr, port: u16) -> bool {
        self.ips.iter().any(|own| policy::canonical(*own) == ip)
            || self.endpoints.iter().any(|a| {
                a.port() == port
                    && (a.ip().is_unspecified()
                        || ip.is_unspecified()
                        || policy::canonical(a.ip()) == ip)
            })
    }
}

/// Everything a connection task needs, shared by all of them.
pub(crate) struct ProxyContext {
    pub(crate) policy: PolicyHandle,
    pub(crate) resolver: Arc<dyn Resolver>,
    pub(crate) audit: AuditLog,
    /// Also audit allowed connections (`--audit-allows`).
    pub(crate) audit_allows: bool,
    /// The sandbox id audit records carry.
    pub(crate) sandbox: String,
    /// How the sandbox's workload is attached.
    pub(crate) path: WorkloadPath,
    pub(crate) limits: Limits,
    /// This path's metric handles (`None` when metrics are off).
    pub(crate) metrics: Option<PathMetrics>,
    /// Per-connection timing records (disabled unless `--timings`).
    pub(crate) timings: TimingLog,
    /// sluice's own addresses: refused as destinations whatever the policy
    /// allows.
    pub(crate) internal: InternalAddrs,
    next_id: AtomicU64,
    /// Connections accepted so far (all listeners of this sandbox).
    pub(crate) accepted: AtomicU64,
    slots: Arc<Semaphore>,
    limit_logged: AtomicBool,
    /// Told, after each accept, how many connections this sandbox has in
    /// flight (the new one included). The runtime serving the sandbox
    /// uses it to run further ahead of the workload under load; what it
    /// does is none of the proxy's business. `None`: nobody asks.
    pub(crate) on_accept: Option<fn(usize)>,
    /// What terminating TLS needs (the sandbox CA, the origin side's
    /// roots, the secrets); `None`: rules that decide each request are
    /// refused.
    pub(crate) interception: Option<Arc<Interception>>,
}

impl ProxyContext {
    pub(crate) fn new(
        policy: PolicyHandle,
        resolver: Arc<dyn Resolver>,
        audit: AuditLog,
        sandbox: String,
        path: WorkloadPath,
        limits: Limits,
    ) -> ProxyContext {
        ProxyContext {
            policy,
            resolver,
            audit,
            audit_allows: false,
            metrics: None,
            timings: TimingLog::disabled(),
            internal: InternalAddrs::default(),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            sandbox,
            path,
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            limit_logged: AtomicBool::new(false),
            on_accept: None,
            interception: None,
        }
    }
}

/// Accept connections on `listener` until the drain starts, then let the
/// connections in flight finish until the drain's deadline, when those
/// still open are closed. Returns how many connections this listener
/// accepted.
pub(crate) async fn serve(listener: TcpListener, ctx: Arc<ProxyContext>, drain: Watch) -> u64 {
    // A listener bound to one address accepts only connections to that
    // address: it is every accepted socket's own, known without a
    // getsockname(2) per connection. A wildcard listener's is not.
    let bound = listener
        .local_addr()
        .ok()
        .filter(|addr| !addr.ip().is_unspecified());
    accept_until_drained(listener, ctx, drain, move |stream, peer, ctx| async move {
        connection::handle(stream, peer, bound, &ctx).await
    })
    .await
}

/// [`serve`]'s accept loop, grace and deadline, with `handle` serving each
/// accepted connection (a test hands its connections a destination of
/// its own instead of the redirect's).
async fn accept_until_drained<H, F>(
    listener: TcpListener,
    ctx: Arc<ProxyContext>,
    drain: Watch,
    handle: H,
) -> u64
where
    H: Fn(TcpStream, SocketAddr, Arc<ProxyContext>) -> F + Clone + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    let mut accepted_here = 0;
    // One future for the whole accept loop: nothing is set up per connection.
    let draining = drain.draining();
    tokio::pin!(draining);
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            // Once the drain has started, a connection waiting in the
            // backlog is not accepted (it is reset with the listener).
            biased;
            _ = &mut draining => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(%err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // The slot is taken after accept: the listeners of one sandbox share
        // the slots, and a listener must not sit on one while it waits for a
        // connection. While this connection waits, this listener accepts no
        // more (they queue in the kernel's backlog).
        let permit = match ctx.slots.clone().try_acquire_owned() {
            Ok(permit) => {
                if ctx.limit_logged.load(Ordering::Relaxed) {
                    ctx.limit_logged.store(false, Ordering::Relaxed);
                }
                permit
            }
            Err(_) => {
                if !ctx.limit_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        limit = ctx.limits.max_connections,
                        "connection limit reached: new connections wait until one closes"
                    );
                }
                tokio::select! {
                    permit = ctx.slots.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                    _ = &mut draining => break,
                }
            }
        };
        ctx.accepted.fetch_add(1, Ordering::Relaxed);
        accepted_here += 1;
        if let Some(on_accept) = ctx.on_accept {
            let in_flight = ctx
                .limits
                .max_connections
                .saturating_sub(ctx.slots.available_permits());
            on_accept(in_flight);
        }
        // The handler's future is made inside the task: an async block that
        // awaited a future it had captured would hold it twice (the
        // capture and the awaited value are not laid over each other),
        // which measured 3 KiB more per held connection.
        let (handle, ctx) = (handle.clone(), ctx.clone());
        connections.spawn(async move {
            handle(stream, peer, ctx).await;
            drop(permit);
        });
    }
    // Stop accepting: new connections are refused from here on.
    drop(listener);
    let overdue = tokio::select! {
        _ = async { while connections.join_next().await.is_some() {} } => false,
        _ = drain.overdue() => true,
    };
    if overdue {
        tracing::info!(
            sandbox = %ctx.sandbox,
            closed = connections.len(),
            "connections still open at the drain deadline: closing them"
        );
        // Each connection's outcome guard records it as it is dropped.
        connections.shutdown().await;
    }
    accepted_here
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_refused_on_every_port_and_endpoints_on_theirs() {
        let internal = InternalAddrs {
            ips: vec!["198.19.255.2".parse().unwrap()],
            endpoints: vec![
                "127.0.0.1:9464".parse().unwrap(),
                "[::]:9465".parse().unwrap(),
            ],
        };
        for hit in [
            "198.19.255.2:1",
            "198.19.255.2:443",
            "127.0.0.1:9464",
            "[2001:db8::1]:9465",
        ] {
            assert!(internal.contains(hit.parse().unwrap()), "{hit}");
        }
        for miss in ["127.0.0.1:9466", "198.18.0.1:9464", "198.19.255.3:443"] {
            assert!(!internal.contains(miss.parse().unwrap()), "{miss}");
        }
    }

    #[test]
    fn internal_addresses_are_refused_in_every_spelling() {
        let internal = InternalAddrs {
            ips: vec!["198.19.255.2".parse().unwrap()],
            endpoints: vec!["127.0.0.1:9464".parse().unwrap()],
        };
        for hit in [
            "[::ffff:198.19.255.2]:443", // IPv4-mapped
            "[::c613:ff02]:443",         // IPv4-compatible
            "[64:ff9b::c613:ff02]:443",  // NAT64
            "[2002:c613:ff02::1]:443",   // 6to4
            "[::ffff:127.0.0.1]:9464",   // mapped endpoint
            "[64:ff9b::7f00:1]:9464",    // NAT64 endpoint
            "0.0.0.0:9464",              // the kernel sends it to 127.0.0.1
            "[::]:9464",
        ] {
            assert!(internal.contains(hit.parse().unwrap()), "{hit}");
        }
        for miss in [
            "[::ffff:198.19.255.3]:443",
            "[::ffff:127.0.0.1]:9465",
            "[::1]:443",
        ] {
            assert!(!internal.contains(miss.parse().unwrap()), "{miss}");
        }
    }
}

#[cfg(test)]
mod through;
