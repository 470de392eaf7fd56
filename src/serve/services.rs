//! The process-wide services: the audit and timing writers, the metrics
//! registry and endpoint, and the state every sandbox of the process shares
//! ([`Shared`]). Started before any sandbox, finished after all. It never
//! serves a connection itself.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use anyhow::{Context, Result};

use super::Shared;
use crate::audit::{AuditOptions, AuditWriter};
use crate::drain::Drain;
use crate::metrics::Metrics;
use crate::proxy::Limits;
use crate::timing::{TimingLog, TimingWriter};

/// The hard deadline of a shutdown, counted from its start: connections get
/// [`DRAIN_GRACE`] of it, the audit and timing writers the rest to write
/// what the connections left them.
pub(crate) const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// The process-wide services: audit and timing writers, the metrics
/// registry and endpoint. Started before any sandbox, finished after all.
pub(crate) struct Services {
    pub(crate) shared: Shared,
    /// The metrics endpoint and the writers.
    drain: Drain,
}

/// What the process-wide services are asked to do.
pub(crate) struct ServiceOptions {
    pub(crate) audit: Option<PathBuf>,
    pub(crate) audit_max_bytes: Option<u64>,
    /// Where the audit log's checkpoint key is, and when checkpoints are
    /// signed (only with `audit`).
    pub(crate) checkpoints: CheckpointSettings,
    pub(crate) audit_allows: bool,
    pub(crate) timings: Option<PathBuf>,
    pub(crate) metrics: Option<SocketAddr>,
    pub(crate) limits: Limits,
    pub(crate) default_upstream: Vec<SocketAddr>,
    /// CA files trusted for origins besides the system roots
    /// (`--upstream-ca`), when sluice terminates TLS.
    pub(crate) upstream_ca: Vec<PathBuf>,
    /// The workers that serve (the runtime plan, as the runtime started).
    pub(crate) workers: super::runtime::Workers,
}

/// Signed checkpoints of the audit log.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointSettings {
    /// The state directory that holds (or will hold) `audit.key`.
    pub(crate) state_dir: PathBuf,
    /// Records between checkpoints (0: not by count).
    pub(crate) every_records: u64,
    /// Longest a record waits for one (zero: not by time).
    pub(crate) interval: Duration,
}

impl Services {
    pub(crate) fn start(opts: ServiceOptions) -> Result<Services> {
        // The origin side's roots: an unreadable --upstream-ca is an error
        // now, not a failed request later.
        let upstream_tls = crate::intercept::roots::UpstreamTrust::new(
            std::path::Path::new(crate::intercept::roots::SYSTEM_BUNDLE),
            &opts.upstream_ca,
        )
        .context("cannot load the CA files for origins (--upstream-ca)")?;
        // Files first: nothing may run while its records would be lost, or
        // could not be signed.
        let checkpoints = open_audit(&opts)?;
        if let Some(path) = opts.timings.as_deref() {
            crate::timing::check_writable(path)?;
        }
        let limits = within_descriptors(opts.limits);
        let registry = prometheus::Registry::new();
        let metrics = Arc::new(Metrics::new(&registry).context("cannot register metrics")?);
        let mut drain = Drain::new("services");
        if let Some(addr) = opts.metrics {
            serve_metrics(addr, &metrics, &registry, &mut drain)?;
        }
        let audit = spawn_audit_writer(
            opts.audit.as_deref(),
            opts.audit_max_bytes,
            checkpoints,
            &metrics,
            &mut drain,
        );
        let timings = match opts.timings.as_deref() {
            Some(path) => spawn_timing_writer(path, &mut drain),
            None => TimingLog::disabled(),
        };
        Ok(Services {
            shared: Shared {
                audit,
                audit_allows: opts.audit_allows,
                metrics: Some(metrics),
                timings,
                limits,
                internal: opts.metrics.into_iter().collect(),
                default_upstream: opts.default_upstream,
                upstream_tls,
                workers: opts.workers,
            },
            drain,
        })
    }

    /// Flush and stop, by `deadline`: the metrics endpoint stops accepting,
    /// and the writers finish once every producer is gone (drop every
    /// sandbox first), or say at the deadline what they could not write.
    pub(crate) async fn finish(self, deadline: Instant) {
        drop(self.shared);
        let drained = self.drain.drain(deadline).await;
        tracing::debug!(?drained, "services stopped");
    }
}

/// With an audit log asked for: check that it can be written, and open
/// (or create) the key its checkpoints are signed with.
fn open_audit(opts: &ServiceOptions) -> Result<Option<crate::audit::CheckpointOptions>> {
    let Some(path) = opts.audit.as_deref() else {
        return Ok(None);
    };
    crate::audit::check_writable(path)?;
    let settings = &opts.checkpoints;
    let key = crate::audit::AuditKey::open_or_create(&settings.state_dir)
        .map_err(crate::audit::AuditError::from)?;
    Ok(Some(crate::audit::CheckpointOptions {
        key: Arc::new(key),
        every_records: settings.every_records,
        interval: settings.interval,
    }))
}

/// `limits` with at most the connections the descriptor limit (raised as
/// far as it goes) can hold at once.
fn within_descriptors(mut limits: Limits) -> Limits {
    let fd_limit = crate::confine::fds::raise();
    let fits = crate::confine::fds::connections_within(fd_limit).max(1);
    if limits.max_connections > fits {
        tracing::info!(
            asked = limits.max_connections,
            serving = fits,
            fd_limit,
            "the descriptor limit caps connections relayed at once (more wait their turn); raise `ulimit -Hn` for more"
        );
        limits.max_connections = fits;
    }
    limits
}

/// Serve `registry` on `addr`, on a thread of its own, until `drain`.
fn serve_metrics(
    addr: SocketAddr,
    metrics: &Metrics,
    registry: &prometheus::Registry,
    drain: &mut Drain,
) -> Result<()> {
    // Every sandbox's drop counters are read as it starts, so that
    // the first scrape has them (docs/observability.md).
    metrics.read_drops_from_start();
    // Bound here, in sluice's own namespace: the sandbox cannot reach it.
    let listener =
        crate::metrics::bind(addr).with_context(|| format!("cannot serve metrics on {addr}"))?;
    tracing::info!(%addr, "serving /metrics");
    // On a thread of its own: a scrape never waits for connections
    // to yield, and connections never wait for a scrape.
    let serving = crate::metrics::serve_on_thread(listener, registry.clone(), drain.watch())
        .context("cannot start the metrics thread")?;
    drain.spawn(async move {
        if let Err(err) = serving.await {
            tracing::error!(%err, "metrics endpoint failed");
        }
    });
    Ok(())
}

/// The audit log (to `path`, or nowhere), its writer running in `drain`.
fn spawn_audit_writer(
    path: Option<&std::path::Path>,
    max_bytes: Option<u64>,
    checkpoints: Option<crate::audit::CheckpointOptions>,
    metrics: &Metrics,
    drain: &mut Drain,
) -> crate::audit::AuditLog {
    let (head_gauge, checkpoint_gauge) = metrics.audit_head_gauges();
    let (audit, audit_writer) = AuditWriter::with_options(
        path,
        AuditOptions {
            max_bytes,
            keep: 0,
            wait_counter: Some(metrics.audit_wait_counter()),
            capacity: 0,
            checkpoints,
            head_gauge: Some(head_gauge),
            checkpoint_gauge: Some(checkpoint_gauge),
        },
    );
    let watch = drain.watch();
    drain.spawn(async move {
        if let Err(err) = audit_writer.run_until(watch).await {
            tracing::error!(%err, "audit log incomplete");
        }
    });
    audit
}

/// The timing log to `path`, its writer running in `drain`.
fn spawn_timing_writer(path: &std::path::Path, drain: &mut Drain) -> TimingLog {
    let (log, writer) = TimingWriter::new(path);
    let watch = drain.watch();
    drain.spawn(async move {
        if let Err(err) = writer.run_until(watch).await {
            tracing::error!(%err, "timing records incomplete");
        }
    });
    log
}
