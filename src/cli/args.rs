//! Argument groups more than one command shares: where the policy comes
//! from (`--policy` or a signed `--bundle`), and what a sandboxed run
//! records and exports. Turning them into the app's options lives here too,
//! so `run` and `oci` say it once.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::workload::WorkloadPath;

/// Where the policy comes from: a plain file, or a signed bundle.
#[derive(Debug, Args)]
#[group(required = true, multiple = false, id = "policy_source")]
pub(crate) struct PolicySourceArgs {
    /// A policy YAML file (unsigned; for development). SIGHUP re-reads it.
    #[arg(long, value_name = "FILE", group = "policy_source")]
    pub(crate) policy: Option<PathBuf>,
    /// A signed bundle: a directory, a .tar.gz, or an https:// URL polled
    /// with ETag. Verified before the command starts; a new bundle at the
    /// same path (or SIGHUP) is verified, then swapped in.
    #[arg(
        long,
        value_name = "PATH|URL",
        group = "policy_source",
        requires = "trust"
    )]
    pub(crate) bundle: Option<String>,
    #[command(flatten)]
    pub(crate) bundle_opts: BundleOpts,
}

/// Options of a signed bundle source.
#[derive(Debug, Args)]
pub(crate) struct BundleOpts {
    /// The trust file listing the public keys bundles may be signed with.
    #[arg(long, value_name = "FILE")]
    pub(crate) trust: Option<PathBuf>,
    /// Where the highest accepted revision per bundle (rollback protection),
    /// the last good fetched bundle and, with --audit, the audit log's
    /// checkpoint signing key (audit.key, created on first use, and its
    /// public half audit.pub) are kept.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/sluice")]
    pub(crate) state_dir: PathBuf,
    /// Accept a bundle whose revision is lower than one accepted before.
    #[arg(long)]
    pub(crate) allow_rollback: bool,
    /// Extra CA certificate (PEM) to trust when fetching an https:// bundle.
    #[arg(long, value_name = "FILE")]
    pub(crate) ca: Option<PathBuf>,
    /// How often an https:// bundle is polled (give or take a tenth).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) poll_interval: std::time::Duration,
    /// How long an https:// bundle's server may hold a poll until the
    /// bundle changes (`Prefer: wait`; a server that does not hold is
    /// polled every --poll-interval). 0s: never ask.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    pub(crate) long_poll: std::time::Duration,
}

/// What a sandboxed run records and exports, and its connection limit
/// (shared by `sluice run` and `sluice oci`).
#[derive(Debug, Args)]
pub(crate) struct RecordArgs {
    /// Append audit records (JSONL, hash-chained, with signed checkpoints) to FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) audit: Option<PathBuf>,
    /// Audit allowed connections too, not only denies.
    #[arg(long)]
    pub(crate) audit_allows: bool,
    /// Rotate the audit log when it reaches SIZE bytes (FILE.1, FILE.2, ...;
    /// the hash chain continues across files). Under `sluice run` the log's
    /// directory is then read-only for the command: keep it apart from the
    /// command's working directory (e.g. /var/log/sluice/).
    #[arg(long, value_name = "SIZE")]
    pub(crate) audit_max_bytes: Option<u64>,
    /// Sign a checkpoint into the audit log after N records (0: not by
    /// count); one is also signed when a record has waited
    /// --audit-checkpoint-interval, and at shutdown. The key is
    /// STATE_DIR/audit.key, which the command cannot read.
    #[arg(long, value_name = "N", default_value_t = crate::audit::CHECKPOINT_EVERY_RECORDS)]
    pub(crate) audit_checkpoint_records: u64,
    /// The longest a record waits for a signed checkpoint (0s: only by count
    /// and at shutdown).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) audit_checkpoint_interval: std::time::Duration,
    /// Write one timing record per connection to FILE (.csv for CSV, else JSONL).
    #[arg(long, value_name = "FILE")]
    pub(crate) timings: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics, from sluice's own
    /// namespace (never reachable from inside the sandbox).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<SocketAddr>,
    /// Connections relayed at once; more wait for a free slot. Each is budgeted
    /// six file descriptors: sluice raises its own soft limit to the hard one (the
    /// command keeps the limit it was started with) and serves no more than
    /// that allows.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    pub(crate) max_connections: usize,
    /// Also trust the CA certificates in FILE (PEM) when verifying origins
    /// for rules with an `http` or `inject` block, besides the system roots
    /// (/etc/ssl/certs/ca-certificates.crt). Repeatable.
    #[arg(long, value_name = "FILE")]
    pub(crate) upstream_ca: Vec<PathBuf>,
}

impl RecordArgs {
    /// The process-wide services these options ask for; the audit key is in
    /// `state_dir`; `workers` serve.
    pub(crate) fn services(
        self,
        state_dir: &std::path::Path,
        workers: crate::serve::runtime::Workers,
    ) -> crate::app::ServiceOptions {
        crate::app::ServiceOptions {
            audit: self.audit,
            audit_max_bytes: self.audit_max_bytes,
            checkpoints: crate::serve::CheckpointSettings {
                state_dir: state_dir.to_path_buf(),
                every_records: self.audit_checkpoint_records,
                interval: self.audit_checkpoint_interval,
            },
            audit_allows: self.audit_allows,
            timings: self.timings,
            metrics: self.metrics,
            limits: crate::proxy::Limits {
                max_connections: self.max_connections.max(1),
                ..Default::default()
            },
            default_upstream: crate::serve::host_nameservers(),
            upstream_ca: self.upstream_ca,
            workers,
        }
    }
}

/// Turn `--policy` / `--bundle` into what the app loads. A plain policy is
/// validated here, so a bad file fails before anything is created.
pub(crate) fn policy_source(
    args: &PolicySourceArgs,
    path: WorkloadPath,
) -> anyhow::Result<crate::app::PolicySource> {
    use crate::app::PolicySource;
    if let Some(file) = &args.policy {
        let policy = crate::policy::Policy::load(file)?;
        return Ok(PolicySource::File {
            path: file.clone(),
            policy: Box::new(policy),
        });
    }
    let bundle = args
        .bundle
        .as_deref()
        .expect("clap requires --policy or --bundle");
    let opts = &args.bundle_opts;
    let trust_path = opts
        .trust
        .as_deref()
        .expect("clap requires --trust with --bundle");
    let trust = crate::bundle::TrustStore::load(trust_path)?;
    let state = crate::bundle::RevisionState::open(&opts.state_dir)?;
    Ok(PolicySource::Bundle(Box::new(
        crate::reload::ReloadConfig {
            source: crate::reload::BundleSource::parse(bundle),
            trust,
            state,
            allow_rollback: opts.allow_rollback,
            sandbox: format!("{path}-{}", std::process::id()),
            path,
            fetch: crate::reload::FetchConfig {
                ca_file: opts.ca.clone(),
                interval: opts.poll_interval,
                long_poll: opts.long_poll,
                ..Default::default()
            },
        },
    )))
}
