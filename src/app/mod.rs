//! The supervisor: owns the tasks of one `sluice run`, its signals, and the
//! one shutdown path (stop accepting, drain with a deadline, flush audit).
//!
//! Every long-lived task is started here and awaited here; none is detached.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::attach::{self, host};
use crate::audit::AuditWriter;
use crate::bundle::PolicyHandle;
use crate::dns::{DnsCache, DnsContext};
use crate::netns::SandboxNetns;
use crate::policy::Policy;
use crate::proxy::{Limits, ProxyContext};

/// How long connections get to finish once the workload is gone.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How long the workload gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Everything `sluice run` was asked to do.
pub struct RunOptions {
    pub policy: Policy,
    pub policy_label: String,
    pub audit: Option<PathBuf>,
    pub audit_allows: bool,
    pub user: Option<String>,
    pub command: Vec<OsString>,
    pub limits: Limits,
}

/// Run the workload under enforcement; returns its exit status (128 + N when
/// a signal N ended it).
pub async fn run(opts: RunOptions) -> Result<i32> {
    let run_as = opts.user.as_deref().map(host::resolve_user).transpose()?;
    let default_upstream = if opts.policy.dns().upstream.is_none() {
        host_nameservers()
    } else {
        Vec::new()
    };

    let netns = SandboxNetns::create().context("cannot create the sandbox network namespace")?;
    let sandbox = attach::prepare(netns).context("cannot enforce the sandbox")?;
    let sandbox_id = format!("host-{}", std::process::id());
    tracing::info!(
        netns_inode = sandbox.netns.inode(),
        sandbox = %sandbox_id,
        "sandbox ready"
    );

    let policy = PolicyHandle::new(opts.policy, opts.policy_label);
    let (audit, audit_writer) = AuditWriter::new(opts.audit.as_deref());
    let audit_task = tokio::spawn(audit_writer.run());
    let cache = Arc::new(DnsCache::new());

    let mut proxy_ctx = ProxyContext::new(
        policy.clone(),
        cache.clone(),
        audit.clone(),
        sandbox_id.clone(),
        "host",
        opts.limits,
    );
    proxy_ctx.audit_allows = opts.audit_allows;
    let proxy_ctx = Arc::new(proxy_ctx);
    let dns_ctx = Arc::new(DnsContext {
        policy: policy.clone(),
        cache,
        audit: audit.clone(),
        sandbox: sandbox_id,
        path: "host",
        default_upstream,
    });
    drop(audit);

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = JoinSet::new();
    for listener in sandbox.sockets.proxy.iter() {
        let listener = tokio::net::TcpListener::from_std(listener.try_clone()?)?;
        servers.spawn(crate::proxy::serve(
            listener,
            proxy_ctx.clone(),
            stop_rx.clone(),
            DRAIN_GRACE,
        ));
    }
    let mut dns_servers = JoinSet::new();
    for socket in sandbox.sockets.dns_udp.iter() {
        let socket = tokio::net::UdpSocket::from_std(socket.try_clone()?)?;
        dns_servers.spawn(crate::dns::serve_udp(socket, dns_ctx.clone()));
    }
    for listener in sandbox.sockets.dns_tcp.iter() {
        let listener = tokio::net::TcpListener::from_std(listener.try_clone()?)?;
        dns_servers.spawn(crate::dns::serve_tcp(listener, dns_ctx.clone()));
    }
    drop(proxy_ctx);

    // Spawned from this (the runtime's main) thread: see host::spawn.
    let mut child = host::spawn(&sandbox, &opts.command, run_as)?;
    let status = supervise(&mut child).await?;

    // The workload is gone: take anything it left running in the namespace
    // with it, then drain and flush.
    sandbox.netns.kill_processes_inside();
    let _ = stop_tx.send(true);
    while servers.join_next().await.is_some() {}
    dns_servers.shutdown().await;
    drop(dns_ctx);
    drop(sandbox);
    match audit_task.await {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => tracing::error!(%err, "audit log incomplete"),
        Err(err) => tracing::error!(%err, "audit writer failed"),
    }
    Ok(status)
}

/// Wait for the child, forwarding SIGINT/SIGTERM to it; SIGKILL after a grace.
async fn supervise(child: &mut tokio::process::Child) -> Result<i32> {
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let forward = tokio::select! {
            status = child.wait() => return Ok(exit_code(status?)),
            _ = sigint.recv() => Some(nix::sys::signal::Signal::SIGINT),
            _ = sigterm.recv() => Some(nix::sys::signal::Signal::SIGTERM),
            _ = sighup.recv() => None,
            _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() => {
                tracing::warn!("the workload did not exit {STOP_GRACE:?} after being asked: killing it");
                let _ = child.start_kill();
                deadline = None;
                None
            }
        };
        if let (Some(sig), Some(pid)) = (forward, child.id()) {
            tracing::info!("{sig} received: stopping the workload");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
            deadline.get_or_insert(tokio::time::Instant::now() + STOP_GRACE);
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// The nameservers of the host's resolv.conf, for policies that name no
/// `dns.upstream`.
fn host_nameservers() -> Vec<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    text.lines()
        .filter_map(|line| line.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}
