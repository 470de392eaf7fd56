//! Serving one enforced sandbox: its proxy and DNS tasks, started together
//! and drained together. `sluice run` serves one; the daemon serves many.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::time::Instant;

use crate::attach::Sandbox;
use crate::audit::AuditLog;
use crate::bundle::PolicyHandle;
use crate::dns::{DnsCache, DnsContext};
use crate::drain::Drain;
use crate::metrics::{Metrics, SandboxTally};
use crate::policy::ResolvedNames;
use crate::proxy::{Interception, InternalAddrs, Limits, ProxyContext, Resolver, Verifying};
use crate::sandbox_id::SandboxId;
use crate::timing::TimingLog;

/// How long connections get to finish once a sandbox is stopping.
pub(crate) const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// What every sandbox of one sluice process shares.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) audit: AuditLog,
    pub(crate) audit_allows: bool,
    pub(crate) metrics: Option<Arc<Metrics>>,
    pub(crate) timings: TimingLog,
    pub(crate) limits: Limits,
    /// sluice's own endpoints, never a destination.
    pub(crate) internal: Vec<SocketAddr>,
    /// Upstream resolvers for policies without `dns.upstream`.
    pub(crate) default_upstream: Vec<SocketAddr>,
    /// The origin side's TLS trust (system roots plus `--upstream-ca`).
    pub(crate) upstream_tls: crate::intercept::roots::UpstreamTrust,
    /// The workers that serve the process's sandboxes.
    pub(crate) workers: super::runtime::Workers,
}

impl Shared {
    /// When `policy` has a rule that terminates TLS: a fresh sandbox CA for
    /// `id` and the secrets `policy` names, read now. None otherwise: a
    /// sandbox whose policy never terminates pays for no CA, and a rule a
    /// later reload adds is refused (`no-interception`), as its clients
    /// were never given a CA to trust.
    pub(crate) fn interception(
        &self,
        id: &SandboxId,
        policy: &crate::policy::Policy,
    ) -> Result<Option<Arc<Interception>>> {
        if !super::terminates_tls(policy) {
            return Ok(None);
        }
        self.mint_interception(id, policy).map(Some)
    }

    /// [`Shared::interception`] whatever the policy (`sluice vm attach
    /// --ca-file` hands the CA out before any rule needs it).
    pub(crate) fn mint_interception(
        &self,
        id: &SandboxId,
        policy: &crate::policy::Policy,
    ) -> Result<Arc<Interception>> {
        let upstream_tls = self
            .upstream_tls
            .client_config()
            .context("cannot load the CA files for origins (--upstream-ca)")?;
        let ca = crate::intercept::ca::SandboxCa::mint(id.as_str())
            .context("cannot mint the sandbox CA")?;
        let secrets = crate::secret::SecretStore::load(policy.secrets())
            .context("cannot read the policy's secrets")?;
        Ok(Arc::new(Interception {
            ca: Arc::new(ca),
            upstream_tls,
            secrets: Arc::new(secrets),
        }))
    }
}

/// The DNS side of `sandbox`: its cache, and the audit, upstreams and
/// metrics it shares with the process.
fn dns_context(
    sandbox: &Sandbox,
    id: &SandboxId,
    policy: &PolicyHandle,
    shared: &Shared,
) -> Arc<DnsContext> {
    let cache = Arc::new(DnsCache::new());
    let mut dns_ctx = DnsContext::new(
        policy.clone(),
        cache,
        shared.audit.clone(),
        id.to_string(),
        sandbox.attachment.path,
    );
    dns_ctx.default_upstream = shared.default_upstream.clone();
    dns_ctx.metrics = shared.metrics.clone();
    Arc::new(dns_ctx)
}

/// The proxy side of `sandbox`: names resolved through its DNS, its
/// connections counted in `tally` too, sluice's own addresses refused.
fn proxy_context(
    sandbox: &Sandbox,
    id: &SandboxId,
    policy: &PolicyHandle,
    shared: &Shared,
    dns_ctx: &Arc<DnsContext>,
    interception: Option<Arc<Interception>>,
    tally: &Arc<SandboxTally>,
) -> Arc<ProxyContext> {
    let path = sandbox.attachment.path;
    let mut proxy_ctx = ProxyContext::new(
        policy.clone(),
        Arc::new(SandboxResolver(dns_ctx.clone())) as Arc<dyn Resolver>,
        shared.audit.clone(),
        id.to_string(),
        path,
        shared.limits.clone(),
    );
    proxy_ctx.audit_allows = shared.audit_allows;
    proxy_ctx.interception = interception;
    proxy_ctx.metrics = shared
        .metrics
        .as_ref()
        .map(|m| m.path(path).with_tally(tally.clone()));
    proxy_ctx.timings = shared.timings.clone();
    proxy_ctx.on_accept = shared.workers.lead_by_load();
    proxy_ctx.internal = InternalAddrs {
        ips: sandbox.attachment.internal.clone(),
        endpoints: shared.internal.clone(),
    };
    Arc::new(proxy_ctx)
}

/// Serve every proxy listener of `sandbox` in `drain`, each on its worker.
fn spawn_proxy_listeners(
    drain: &mut Drain,
    sandbox: &Sandbox,
    proxy_ctx: &Arc<ProxyContext>,
    side: &[tokio::runtime::Handle],
) -> Result<()> {
    // The listeners come `workers` per address, in order: the k-th of
    // each address is served by worker k (the main runtime is worker
    // 0; see `runtime::Workers::side`).
    for (index, listener) in sandbox.sockets.proxy.iter().enumerate() {
        let (ctx, watch) = (proxy_ctx.clone(), drain.watch());
        let number = index % (side.len() + 1);
        let worker = number.checked_sub(1).map(|k| &side[k]);
        // Registered with the reactor of the runtime that will poll it.
        let _on_worker = worker.map(|w| w.enter());
        let listener = tokio::net::TcpListener::from_std(listener.try_clone()?)?;
        let serve = async move {
            let accepted = crate::proxy::serve(listener, ctx, watch).await;
            tracing::debug!(worker = number, accepted, "proxy listener closed");
        };
        match worker {
            None => drain.spawn(serve),
            Some(worker) => drain.spawn(on_worker(worker, serve)),
        }
    }
    Ok(())
}

/// Serve `sandbox`'s DNS sockets (UDP, then TCP) in `drain`.
fn spawn_dns_servers(
    drain: &mut Drain,
    sandbox: &Sandbox,
    dns_ctx: &Arc<DnsContext>,
) -> Result<()> {
    for socket in &sandbox.sockets.dns_udp {
        let socket = tokio::net::UdpSocket::from_std(socket.try_clone()?)?;
        drain.spawn(crate::dns::serve_udp(
            socket,
            dns_ctx.clone(),
            drain.watch(),
        ));
    }
    for listener in &sandbox.sockets.dns_tcp {
        let listener = tokio::net::TcpListener::from_std(listener.try_clone()?)?;
        drain.spawn(crate::dns::serve_tcp(
            listener,
            dns_ctx.clone(),
            drain.watch(),
        ));
    }
    Ok(())
}

/// Serve `sandbox`'s DHCP and router advertisements, if it has them, in
/// `drain`.
fn spawn_link_servers(drain: &mut Drain, sandbox: &Sandbox) -> Result<()> {
    if let Some((socket, lease)) = &sandbox.sockets.dhcp {
        let socket = tokio::net::UdpSocket::from_std(socket.try_clone()?)?;
        let (lease, watch) = (lease.clone(), drain.watch());
        drain.spawn(async move {
            // Answers until the drain starts; nothing is in flight.
            tokio::select! {
                _ = crate::dhcp::serve(socket, lease) => {}
                _ = watch.draining() => {}
            }
        });
    }

    if let Some((socket, router)) = &sandbox.sockets.router {
        let socket = socket.try_clone()?;
        let (router, watch) = (router.clone(), drain.watch());
        drain.spawn(async move {
            // Advertises until the drain starts; nothing is in flight.
            tokio::select! {
                _ = crate::ndp::serve(socket, router) => {}
                _ = watch.draining() => {}
            }
        });
    }
    Ok(())
}

/// Let `metrics` read the nft drop counters of `sandbox` (in its
/// namespace) under `id`.
fn register_drop_counts(metrics: &Metrics, sandbox: &Sandbox, id: &SandboxId) -> Result<()> {
    let netns = sandbox.netns.clone_handle()?;
    let spec = sandbox.attachment.spec.clone();
    metrics.register_drop_counts(
        id.to_string(),
        Box::new(move || {
            let spec = spec.clone();
            let counts = netns
                .run_in(move || crate::enforce::drop_counts(&spec).ok())
                .ok()
                .flatten()?;
            Some(counts.into_iter().map(|(r, n)| (r.as_str(), n)).collect())
        }),
    );
    Ok(())
}

/// A sandbox being served. Stop it with [`ServedSandbox::stop`].
pub(crate) struct ServedSandbox {
    pub(crate) sandbox: Sandbox,
    /// The `sandbox` field of audit and timing records (the container id,
    /// or `host-<pid>`); the path is the sandbox's attachment's.
    pub(crate) id: SandboxId,
    pub(crate) policy: PolicyHandle,
    /// This sandbox's own connection counts (`sluice status`).
    pub(crate) tally: Arc<SandboxTally>,
    /// Its proxy listeners and DNS servers.
    drain: Drain,
    metrics: Option<Arc<Metrics>>,
    proxy: Arc<ProxyContext>,
    cpu_at_start: u64,
}

impl ServedSandbox {
    /// Start serving `sandbox`'s sockets under `policy`, with the CA and
    /// secrets given ([`Shared::interception`], made before the workload
    /// starts so that it can be given the CA; `None`: rules that terminate
    /// TLS are refused).
    pub(crate) fn start_with(
        sandbox: Sandbox,
        id: SandboxId,
        policy: PolicyHandle,
        shared: &Shared,
        interception: Option<Arc<Interception>>,
    ) -> Result<ServedSandbox> {
        let dns_ctx = dns_context(&sandbox, &id, &policy, shared);
        let tally = Arc::new(SandboxTally::default());
        let proxy_ctx = proxy_context(
            &sandbox,
            &id,
            &policy,
            shared,
            &dns_ctx,
            interception,
            &tally,
        );
        let mut drain = Drain::new("sandbox");
        spawn_proxy_listeners(&mut drain, &sandbox, &proxy_ctx, shared.workers.side())?;
        spawn_dns_servers(&mut drain, &sandbox, &dns_ctx)?;
        spawn_link_servers(&mut drain, &sandbox)?;
        if let Some(metrics) = shared.metrics.as_ref() {
            register_drop_counts(metrics, &sandbox, &id)?;
        }
        Ok(ServedSandbox {
            sandbox,
            id,
            policy,
            tally,
            drain,
            metrics: shared.metrics.clone(),
            proxy: proxy_ctx,
            cpu_at_start: own_cpu_us(),
        })
    }

    /// How the sandbox's workload is attached.
    pub(crate) fn path(&self) -> crate::workload::WorkloadPath {
        self.sandbox.attachment.path
    }

    /// sluice's own CPU time (not any workload's) per connection accepted
    /// since this sandbox started: the number DESIGN.md's speed target is
    /// stated in. In a process serving several sandboxes it covers them all.
    pub(crate) fn log_cpu_per_connection(&self) {
        let connections = self.connections_accepted();
        let cpu_us = own_cpu_us().saturating_sub(self.cpu_at_start);
        tracing::info!(
            sandbox = %self.id,
            connections,
            cpu_us,
            cpu_us_per_connection = cpu_us.checked_div(connections).unwrap_or(0),
            "sluice's own CPU time while serving the sandbox"
        );
    }

    /// Connections accepted from this sandbox so far.
    pub(crate) fn connections_accepted(&self) -> u64 {
        self.proxy
            .accepted
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The nft drop counters of this sandbox, summed, if they can be read.
    pub(crate) fn dropped_packets(&self) -> Option<u64> {
        self.drop_counts()
            .map(|counts| counts.iter().map(|(_, n)| n).sum())
    }

    /// The nft drop counters of this sandbox per reason, if they can be read.
    pub(crate) fn drop_counts(&self) -> Option<Vec<(crate::enforce::DropReason, u64)>> {
        let spec = self.sandbox.attachment.spec.clone();
        self.sandbox
            .netns
            .run_in(move || crate::enforce::drop_counts(&spec).ok())
            .ok()
            .flatten()
    }

    /// Drain: the listeners stop accepting, connections and DNS queries in
    /// flight get until `deadline` (usually [`DRAIN_GRACE`] from now), and
    /// those still open then are closed. Every reference to the namespace
    /// goes with `self`.
    pub(crate) async fn stop(self, deadline: Instant) {
        if let Some(metrics) = self.metrics.as_ref() {
            metrics.unregister_drop_source(self.id.as_str());
        }
        let drained = self.drain.drain(deadline).await;
        tracing::debug!(sandbox = %self.id, ?drained, "sandbox drained");
    }
}

/// The proxy's view of a sandbox's resolver: its memory (which names
/// resolved to which addresses) and its own lookups of names the sandbox did
/// not resolve through it.
struct SandboxResolver(Arc<DnsContext>);

impl ResolvedNames for SandboxResolver {
    fn resolved(&self, name: &str, ip: IpAddr) -> bool {
        self.0.cache.resolved(name, ip)
    }
}

impl Resolver for SandboxResolver {
    fn name_for(&self, ip: IpAddr) -> Option<String> {
        self.0.cache.name_for(ip)
    }

    fn verify<'a>(&'a self, name: &'a str, ip: IpAddr) -> Verifying<'a> {
        Box::pin(self.0.verify(name, ip))
    }
}

/// Run `task` on `worker`'s thread and wait for it here, so the drain that
/// awaits this waits for it; if the drain gives up on this, the task is
/// aborted on its worker too.
fn on_worker(
    worker: &tokio::runtime::Handle,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    struct AbortOnDrop(tokio::task::AbortHandle);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let task = worker.spawn(task);
    async move {
        let _abort = AbortOnDrop(task.abort_handle());
        if let Err(err) = task.await {
            if err.is_panic() {
                tracing::error!(%err, "a worker's listener task panicked");
            }
        }
    }
}

/// This process's CPU time (user + system), in microseconds.
fn own_cpu_us() -> u64 {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else {
        return 0;
    };
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    us(usage.user_time()) + us(usage.system_time())
}
