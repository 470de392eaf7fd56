//! Prometheus metrics: the metric set of DESIGN.md ("Records"), registered in
//! a registry the caller passes in (tests get their own), and the `/metrics`
//! endpoint that serves it (`server`), on a thread and runtime of its own so
//! that a scrape never runs where connections are handled; the one metric
//! that needs a system call to read (the nft drop counters, `drops`) is
//! read in the background, never by a scrape.
//!
//! Each metric's name and help text sit next to the field that updates it.
//! Label values are bounded: paths (host|oci|vm), verdicts, rule names from
//! the policy, bundle names, sandbox ids, reload results. This module never
//! puts an address or a hostname in a label, never blocks, and never
//! allocates on the per-connection path once a path's handles are resolved
//! (`Metrics::path`).

mod drops;
mod server;

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use crate::outcome::{Cause, Outcome, UpstreamFailure, Verdict};
use crate::workload::WorkloadPath;

pub use drops::FIRST_READ_WAIT as DROPS_FIRST_READ_WAIT;
pub(crate) use drops::{DropCounts, DropSource, SINGLE_REASON};
pub use server::{bind, render, serve_listener};
pub(crate) use server::{serve_on_thread, ServeError};

/// Histogram buckets for a loopback proxy: 10 µs up to a minute.
pub(crate) const LATENCY_BUCKETS: &[f64] = &[
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The `rule` label of a decision that no rule made (default deny).
pub(crate) const NO_RULE: &str = "none";

/// Outcome of a bundle (re)load, the `result` label of
/// `sluice_bundle_reloads_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadResult {
    /// A new revision was verified and swapped in.
    Applied,
    /// The bundle on disk is the revision already running.
    Unchanged,
    /// The bundle was refused (signature, digest, expiry, rollback, policy).
    Refused,
}

impl ReloadResult {
    pub fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Applied => "applied",
            ReloadResult::Unchanged => "unchanged",
            ReloadResult::Refused => "refused",
        }
    }
}

/// sluice's metrics. Cheap to share behind an `Arc`; hand `PathMetrics` to
/// the proxy of each path.
pub struct Metrics {
    /// sluice_connections_total{path,verdict,rule}
    connections: IntCounterVec,
    /// sluice_denies_total{path,verdict,reason}
    denies: IntCounterVec,
    /// sluice_active_connections{path}
    active: IntGaugeVec,
    /// sluice_connect_seconds{path}
    connect: HistogramVec,
    /// sluice_first_byte_seconds{path}
    first_byte: HistogramVec,
    /// sluice_connection_seconds{path}
    connection: HistogramVec,
    /// sluice_bytes_total{path,direction}
    bytes: IntCounterVec,
    /// sluice_upstream_failures_total{path,reason}
    upstream_failures: IntCounterVec,
    /// sluice_dns_queries_total{verdict}
    dns_queries: IntCounterVec,
    /// sluice_dns_limited_total{limit}
    dns_limited: IntCounterVec,
    /// sluice_hostname_lookups_total{result}
    hostname_lookups: IntCounterVec,
    /// sluice_dropped_packets_total{sandbox,reason}, read in the background.
    drops: Arc<drops::DroppedPackets>,
    /// sluice_bundle_revision{bundle}
    bundle_revision: IntGaugeVec,
    /// sluice_bundle_expiry_timestamp_seconds{bundle}
    bundle_expiry: IntGaugeVec,
    /// sluice_bundle_reloads_total{result}
    bundle_reloads: IntCounterVec,
    /// sluice_audit_waits_total
    audit_waits: IntCounter,
    /// sluice_audit_head_seq
    audit_head_seq: IntGauge,
    /// sluice_audit_checkpoint_seq
    audit_checkpoint_seq: IntGauge,
}

impl Metrics {
    /// Create every metric and register it (and `sluice_build_info`) in
    /// `registry`. Fails only if `registry` already holds these names.
    pub fn new(registry: &Registry) -> Result<Metrics, prometheus::Error> {
        let metrics = Metrics::create()?;
        let build_info = build_info()?;
        metrics.register(registry, build_info)?;

        // Reload results are few and known: export them at 0 from the start
        // so that rate() works from the first scrape.
        for r in [
            ReloadResult::Applied,
            ReloadResult::Unchanged,
            ReloadResult::Refused,
        ] {
            metrics.bundle_reloads.with_label_values(&[r.as_str()]);
        }
        Ok(metrics)
    }

    /// Every metric, registered nowhere yet.
    fn create() -> Result<Metrics, prometheus::Error> {
        let metrics = Metrics {
            connections: counter_vec(
                "sluice_connections_total",
                "Connections decided, by path, verdict (allow, deny, would-deny) and the policy rule that decided (none for the default deny).",
                &["path", "verdict", "rule"],
            )?,
            denies: counter_vec(
                "sluice_denies_total",
                "Connections denied (verdict deny, or would-deny in audit mode), by path and the reason their records give (no-rule, private-address, http-path, ...).",
                &["path", "verdict", "reason"],
            )?,
            active: gauge_vec(
                "sluice_active_connections",
                "Connections accepted and not yet closed, by path.",
                &["path"],
            )?,
            connect: histogram(
                "sluice_connect_seconds",
                "Time from accepting a connection to its upstream connection being established.",
            )?,
            first_byte: histogram(
                "sluice_first_byte_seconds",
                "Time from accepting a connection to relaying the first upstream byte to the client.",
            )?,
            connection: histogram(
                "sluice_connection_seconds",
                "Time from accepting a connection to closing it, for every connection (denied ones too).",
            )?,
            bytes: counter_vec(
                "sluice_bytes_total",
                "Bytes relayed, by path and direction (up: client to upstream, down: upstream to client).",
                &["path", "direction"],
            )?,
            upstream_failures: counter_vec(
                "sluice_upstream_failures_total",
                "Allowed connections whose upstream connect failed, by path and reason (refused, timeout, reset, unreachable).",
                &["path", "reason"],
            )?,
            dns_queries: counter_vec(
                "sluice_dns_queries_total",
                "DNS queries answered by sluice's resolver, by verdict (allow, refused, ...).",
                &["verdict"],
            )?,
            dns_limited: counter_vec(
                "sluice_dns_limited_total",
                "DNS queries kept from the upstreams by the policy's dns.limits (refused in enforce mode), by limit (query-type, name-length, queries, names).",
                &["limit"],
            )?,
            hostname_lookups: counter_vec(
                "sluice_hostname_lookups_total",
                "Hostnames sluice resolved itself to verify a connection's SNI or Host that its cache did not know, by result (confirmed, mismatch, no-answer, limited).",
                &["result"],
            )?,
            drops: Arc::new(drops::DroppedPackets::new()?),
            bundle_revision: gauge_vec(
                "sluice_bundle_revision",
                "Revision of the policy bundle currently enforced, by bundle name.",
                &["bundle"],
            )?,
            bundle_expiry: gauge_vec(
                "sluice_bundle_expiry_timestamp_seconds",
                "When the policy bundle currently enforced expires (its manifest's expires), in unix seconds, by bundle name.",
                &["bundle"],
            )?,
            bundle_reloads: counter_vec(
                "sluice_bundle_reloads_total",
                "Bundle load attempts, by result (applied, unchanged, refused).",
                &["result"],
            )?,
            audit_waits: IntCounter::new(
                "sluice_audit_waits_total",
                "Times a connection or resolver waited because the audit log's queue was full (records are never dropped).",
            )?,
            // Seqs, not hashes: a hash as a label value would be a new series
            // per line. The hash is in `sluice status` (daemon) instead.
            audit_head_seq: IntGauge::new(
                "sluice_audit_head_seq",
                "seq of the newest audit line written (-1 while the log is empty); an outside collector that keeps it can show lines cut off the log later.",
            )?,
            audit_checkpoint_seq: IntGauge::new(
                "sluice_audit_checkpoint_seq",
                "seq of the newest signed audit checkpoint written (-1: none yet); every line before it is signed.",
            )?,
        };
        metrics.audit_head_seq.set(-1);
        metrics.audit_checkpoint_seq.set(-1);
        Ok(metrics)
    }

    /// Registers every metric, and `build_info`, in `registry`.
    fn register(
        &self,
        registry: &Registry,
        build_info: IntGaugeVec,
    ) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.connections.clone()))?;
        registry.register(Box::new(self.denies.clone()))?;
        registry.register(Box::new(self.active.clone()))?;
        registry.register(Box::new(self.connect.clone()))?;
        registry.register(Box::new(self.first_byte.clone()))?;
        registry.register(Box::new(self.connection.clone()))?;
        registry.register(Box::new(self.bytes.clone()))?;
        registry.register(Box::new(self.upstream_failures.clone()))?;
        registry.register(Box::new(self.dns_queries.clone()))?;
        registry.register(Box::new(self.dns_limited.clone()))?;
        registry.register(Box::new(self.hostname_lookups.clone()))?;
        registry.register(Box::new(drops::Collector(self.drops.clone())))?;
        registry.register(Box::new(self.bundle_revision.clone()))?;
        registry.register(Box::new(self.bundle_expiry.clone()))?;
        registry.register(Box::new(self.bundle_reloads.clone()))?;
        registry.register(Box::new(self.audit_waits.clone()))?;
        registry.register(Box::new(self.audit_head_seq.clone()))?;
        registry.register(Box::new(self.audit_checkpoint_seq.clone()))?;
        registry.register(Box::new(build_info))
    }

    /// Pre-resolved handles for one path (host | oci | vm). Resolve once per
    /// listener, not per connection.
    pub fn path(&self, path: WorkloadPath) -> PathMetrics {
        let path = path.as_str();
        PathMetrics {
            tally: None,
            path,
            connections: self.connections.clone(),
            denies: self.denies.clone(),
            active: self.active.with_label_values(&[path]),
            connect: self.connect.with_label_values(&[path]),
            first_byte: self.first_byte.with_label_values(&[path]),
            connection: self.connection.with_label_values(&[path]),
            bytes_up: self.bytes.with_label_values(&[path, "up"]),
            bytes_down: self.bytes.with_label_values(&[path, "down"]),
            // Resolved here, so each path exports every reason at 0 from
            // its first scrape.
            upstream_failures: UpstreamFailure::ALL.map(|f| {
                self.upstream_failures
                    .with_label_values(&[path, f.as_str()])
            }),
        }
    }

    /// Count one DNS query by its verdict (e.g. "allow", "refused").
    pub fn dns_query(&self, verdict: &str) {
        self.dns_queries.with_label_values(&[verdict]).inc();
    }

    /// The counter of one DNS verdict, to keep in the resolver and `inc()`.
    pub fn dns_counter(&self, verdict: &str) -> IntCounter {
        self.dns_queries.with_label_values(&[verdict])
    }

    /// Count one DNS query kept from the upstreams by `dns.limits`
    /// (`limit`: query-type, name-length, queries or names).
    pub(crate) fn dns_limited(&self, limit: &str) {
        self.dns_limited.with_label_values(&[limit]).inc();
    }

    /// Count one hostname lookup sluice made itself (`result`: confirmed,
    /// mismatch, no-answer or limited).
    pub(crate) fn hostname_lookup(&self, result: &str) {
        self.hostname_lookups.with_label_values(&[result]).inc();
    }

    /// Count one bundle load attempt.
    pub fn bundle_reload(&self, result: ReloadResult) {
        self.bundle_reloads
            .with_label_values(&[result.as_str()])
            .inc();
    }

    /// Record the revision of the bundle now enforced. A bundle loaded from a
    /// plain policy file has no revision: pass 0.
    pub fn set_bundle_revision(&self, bundle: &str, revision: u64) {
        self.bundle_revision
            .with_label_values(&[bundle])
            .set(i64::try_from(revision).unwrap_or(i64::MAX));
    }

    /// Record when the bundle now enforced expires (unix seconds).
    pub(crate) fn set_bundle_expiry(&self, bundle: &str, unix_seconds: i64) {
        self.bundle_expiry
            .with_label_values(&[bundle])
            .set(unix_seconds);
    }

    /// Forget a bundle's revision and expiry series (when its sandbox goes
    /// away).
    pub(crate) fn clear_bundle_revision(&self, bundle: &str) {
        let _ = self.bundle_revision.remove_label_values(&[bundle]);
        let _ = self.bundle_expiry.remove_label_values(&[bundle]);
    }

    /// The counter to give the audit log (`AuditWriter::with_options`): it
    /// counts the times a producer found the audit queue full.
    pub fn audit_wait_counter(&self) -> IntCounter {
        self.audit_waits.clone()
    }

    /// The gauges to give the audit log: the seq of its newest line and of
    /// its newest checkpoint.
    pub fn audit_head_gauges(&self) -> (IntGauge, IntGauge) {
        (
            self.audit_head_seq.clone(),
            self.audit_checkpoint_seq.clone(),
        )
    }

    /// Read `sandbox`'s dropped-packet counter with `f`, in the background
    /// (once at once, then every [`drops::REFRESH`] while someone scrapes;
    /// never on a scrape's thread): scrapes export the last value read,
    /// wait (briefly) for the first, and leave the series out while there
    /// is none (`f` returned `None`).
    /// Registering the same sandbox again replaces its source.
    pub fn register_drop_source(&self, sandbox: String, f: DropSource) {
        self.drops.register(
            sandbox,
            Box::new(move || f().map(|n| vec![(SINGLE_REASON, n)])),
        );
    }

    /// [`register_drop_source`](Self::register_drop_source) for a sandbox
    /// whose counters say why they dropped (a microVM's tap fence): one
    /// series per reason `f` returns.
    pub fn register_drop_counts(&self, sandbox: String, f: DropCounts) {
        self.drops.register(sandbox, f);
    }

    /// Read every sandbox's dropped-packet counters as soon as it is
    /// registered, not from the first scrape on: for a sluice that serves
    /// `/metrics`, whose first scrape must already have every series.
    pub fn read_drops_from_start(&self) {
        self.drops.read_from_start();
    }

    /// Stop exporting `sandbox`'s dropped-packet counter.
    pub fn unregister_drop_source(&self, sandbox: &str) {
        self.drops.unregister(sandbox);
    }
}

fn histogram(name: &str, help: &str) -> Result<HistogramVec, prometheus::Error> {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
        &["path"],
    )
}

fn counter_vec(
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, prometheus::Error> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec, prometheus::Error> {
    IntGaugeVec::new(Opts::new(name, help), labels)
}

/// `sluice_build_info`, at 1 for this version.
fn build_info() -> Result<IntGaugeVec, prometheus::Error> {
    let build_info = gauge_vec(
        "sluice_build_info",
        "Always 1; the version label says which sluice is running.",
        &["version"],
    )?;
    build_info
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
    Ok(build_info)
}

/// One sandbox's own connection counts (for `sluice status`; not exported
/// as Prometheus series, since sandbox ids are unbounded over time).
#[derive(Debug, Default)]
pub(crate) struct SandboxTally {
    allowed: std::sync::atomic::AtomicU64,
    denied: std::sync::atomic::AtomicU64,
    would_deny: std::sync::atomic::AtomicU64,
    active: std::sync::atomic::AtomicI64,
}

/// A snapshot of a [`SandboxTally`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TallySnapshot {
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    pub(crate) would_deny: u64,
    pub(crate) active: i64,
}

impl SandboxTally {
    pub(crate) fn snapshot(&self) -> TallySnapshot {
        use std::sync::atomic::Ordering::Relaxed;
        TallySnapshot {
            allowed: self.allowed.load(Relaxed),
            denied: self.denied.load(Relaxed),
            would_deny: self.would_deny.load(Relaxed),
            active: self.active.load(Relaxed),
        }
    }

    fn ended(&self, verdict: Verdict) {
        use std::sync::atomic::Ordering::Relaxed;
        match verdict {
            Verdict::Allow => &self.allowed,
            Verdict::WouldDeny => &self.would_deny,
            Verdict::Deny => &self.denied,
        }
        .fetch_add(1, Relaxed);
    }
}

/// One path's metric handles: cloned into each listener's context.
#[derive(Clone)]
pub struct PathMetrics {
    /// Also count into one sandbox's own tally (see [`PathMetrics::with_tally`]).
    tally: Option<Arc<SandboxTally>>,
    path: &'static str,
    connections: IntCounterVec,
    denies: IntCounterVec,
    active: IntGauge,
    connect: Histogram,
    first_byte: Histogram,
    connection: Histogram,
    bytes_up: IntCounter,
    bytes_down: IntCounter,
    /// In [`UpstreamFailure::ALL`]'s order.
    upstream_failures: [IntCounter; 4],
}

impl PathMetrics {
    /// The same handles, also counting every connection into `tally` (one
    /// sandbox's own numbers, as `sluice status` shows them).
    pub(crate) fn with_tally(mut self, tally: Arc<SandboxTally>) -> PathMetrics {
        self.tally = Some(tally);
        self
    }

    /// At accept: counts the connection as active until the returned guard
    /// is dropped, which also observes `sluice_connection_seconds` (the
    /// guard's age). Keep the guard in the connection's own outcome guard.
    pub fn opened(&self) -> ConnectionMetrics {
        self.active.inc();
        if let Some(tally) = &self.tally {
            tally
                .active
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        ConnectionMetrics {
            metrics: self.clone(),
            accepted: std::time::Instant::now(),
        }
    }
}

/// The metrics side of one connection, from accept to close.
pub struct ConnectionMetrics {
    metrics: PathMetrics,
    accepted: std::time::Instant,
}

impl ConnectionMetrics {
    /// Where the connection ends (once; then drop it): counts
    /// `sluice_connections_total{path,verdict,rule}` as `outcome` says, its
    /// upstream failure if it had one, and the bytes relayed.
    pub fn ended(self, outcome: &Outcome, up: u64, down: u64) {
        let m = &self.metrics;
        if let Some(tally) = &m.tally {
            tally.ended(outcome.verdict);
        }
        m.connections
            .with_label_values(&[
                m.path,
                outcome.verdict.as_str(),
                outcome.rule_name().unwrap_or(NO_RULE),
            ])
            .inc();
        if outcome.verdict != Verdict::Allow {
            m.denies
                .with_label_values(&[m.path, outcome.verdict.as_str(), outcome.reason()])
                .inc();
        }
        if let Cause::Upstream(failure) = outcome.cause {
            let index = UpstreamFailure::ALL.iter().position(|f| *f == failure);
            if let Some(counter) = index.and_then(|i| m.upstream_failures.get(i)) {
                counter.inc();
            }
        }
        self.bytes(up, down);
    }

    /// Upstream connected, `since_accept` after accept.
    pub fn connected(&self, since_accept: Duration) {
        self.metrics.connect.observe(since_accept.as_secs_f64());
    }

    /// First upstream byte relayed to the client, `since_accept` after accept.
    pub fn first_byte(&self, since_accept: Duration) {
        self.metrics.first_byte.observe(since_accept.as_secs_f64());
    }

    /// Bytes relayed.
    fn bytes(&self, up: u64, down: u64) {
        if up > 0 {
            self.metrics.bytes_up.inc_by(up);
        }
        if down > 0 {
            self.metrics.bytes_down.inc_by(down);
        }
    }
}

impl Drop for ConnectionMetrics {
    fn drop(&mut self) {
        self.metrics.active.dec();
        if let Some(tally) = &self.metrics.tally {
            tally
                .active
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.metrics
            .connection
            .observe(self.accepted.elapsed().as_secs_f64());
    }
}
