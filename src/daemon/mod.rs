//! `sluice daemon`: one proxy process for many sandboxes. It owns the
//! control socket (HTTP/1.1 over a Unix socket, root only; see `api`), the
//! process-wide services (audit, timings, /metrics), and the registry of
//! attached sandboxes, each with its own policy, served until its container
//! is gone. `sluice oci-hook` and `sluice status` are its clients.
//!
//! It must never answer an attach before the namespace is enforced (table
//! applied and read back, listeners bound), and never keep a namespace
//! alive after its container ended: every reference it holds (descriptor,
//! listeners, counters) goes with the sandbox's release.

mod adopt;
pub mod api;
pub mod client;
pub(crate) mod config;
mod exits;
mod fdpass;
mod notify;
mod registry;
mod server;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

pub use client::Client;
pub(crate) use client::{socket_path, ClientError};
pub(crate) use config::DaemonConfig;
pub(crate) use registry::Registry;
pub(crate) use server::SocketError;

use crate::drain::Drain;
use crate::serve::{host_nameservers, ServiceOptions, Services, DRAIN_DEADLINE, DRAIN_GRACE};

/// Run the daemon until SIGINT or SIGTERM; SIGHUP re-reads every sandbox's
/// policy. Returns the exit status.
pub(crate) async fn run(
    config: DaemonConfig,
    workers: crate::serve::runtime::Workers,
) -> Result<i32> {
    let services = Services::start(ServiceOptions {
        workers,
        audit: config.audit.clone(),
        audit_max_bytes: config.audit_max_bytes,
        checkpoints: crate::serve::CheckpointSettings {
            state_dir: config.defaults.state_dir.clone(),
            every_records: config.audit_checkpoint_records,
            interval: config.audit_checkpoint_interval,
        },
        audit_allows: config.audit_allows,
        timings: config.timings.clone(),
        metrics: config.metrics,
        limits: crate::proxy::Limits {
            max_connections: config.defaults.max_connections,
            ..Default::default()
        },
        default_upstream: host_nameservers(),
        upstream_ca: config.upstream_ca.clone(),
    })?;
    let listener = match server::bind(&config.socket) {
        Ok(listener) => listener,
        Err(err) => {
            services.finish(Instant::now() + DRAIN_DEADLINE).await;
            return Err(err).context("cannot open the control socket");
        }
    };
    tracing::info!(socket = %config.socket.display(), "sluice daemon ready");
    let registry = Registry::new(services.shared.clone(), config.defaults.clone());
    registry.readopt().await;
    let mut control = Drain::new("control socket");
    let (ended, mut control_ended) = tokio::sync::oneshot::channel::<()>();
    control.spawn({
        let (registry, watch) = (registry.clone(), control.watch());
        async move {
            server::serve(listener, registry, watch).await;
            let _ = ended.send(());
        }
    });

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    // Ready once the socket listens, the records are re-adopted and the
    // signals are caught: a request or a SIGHUP from now on is served.
    let systemd = notify::Notifier::from_env();
    let listening = format!("listening on {}", config.socket.display());
    systemd.ready(&listening);
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => {
                tracing::info!("SIGHUP received: reloading every sandbox's policy");
                // Each sandbox reloads on its own task; READY=1 says every
                // reload was asked for, not that every one has finished.
                systemd.reloading();
                registry.reload_all();
                systemd.ready(&listening);
            }
            _ = &mut control_ended => {
                tracing::error!("the control socket stopped");
                break;
            }
        }
    }
    systemd.stopping();
    tracing::info!(
        sandboxes = registry.len(),
        "stopping: releasing every sandbox"
    );
    // One deadline for the whole shutdown: requests in flight and every
    // sandbox's connections get DRAIN_GRACE, the writers the rest.
    let start = Instant::now();
    let grace = start + DRAIN_GRACE.min(DRAIN_DEADLINE);
    control.drain(grace).await;
    registry.release_all(grace).await;
    let _ = std::fs::remove_file(&config.socket);
    drop(registry);
    services.finish(start + DRAIN_DEADLINE).await;
    Ok(0)
}
