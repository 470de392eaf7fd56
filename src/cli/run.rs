//! `sluice run`: a command in a fresh sandbox whose only way out is sluice.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Args;

use super::args::{policy_source, PolicySourceArgs, RecordArgs};

/// `sluice run --help`'s first line.
pub(crate) const ABOUT: &str = "Run a command in a sandbox whose only network path is sluice.";

pub(crate) const AFTER_HELP: &str =
    "Example:\n  sluice run --policy policies/dev.yaml -- curl -sS http://origin.test:8080/\n\n\
Allowed connections behave as without sluice. Denied plain-HTTP requests get a 403 naming the \
rule and reason; other denied TCP gets a reset; UDP other than DNS, ICMP and raw IP are dropped \
(sends fail with EPERM). Needs root.\n\n\
Signals: SIGTERM, and SIGINT sent to sluice alone, are passed to the command, which is killed 5 s \
later if still running. Ctrl-C at a terminal reaches the command directly, as without sluice, and \
the command decides (a shell carries on). SIGHUP reloads the policy or bundle.";

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) source: PolicySourceArgs,
    #[command(flatten)]
    pub(crate) records: RecordArgs,
    /// Run the command as USER (name or uid) instead of root: do this for untrusted code (a root
    /// command cannot leave the namespace, but it still owns the host's files).
    #[arg(long, value_name = "USER")]
    pub(crate) user: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

pub(crate) fn execute(args: RunArgs) -> anyhow::Result<i32> {
    let policy = policy_source(&args.source, crate::workload::WorkloadPath::Host)?;
    crate::confine::require_root("sluice run")?;
    // Before the sandbox, whose listeners (one per worker) may be bound
    // before the runtime starts.
    let runtime = crate::serve::runtime::plan_one_sandbox()?;
    // The init, while sluice is still small (see PreparedInit).
    let init = crate::confine::PreparedInit::fork()?;
    // Then the namespace, on a thread of its own while the runtime and the
    // services start: its table's thread is the longest path to the go.
    let sandbox = crate::app::start_sandbox(
        &crate::attach::host::attachment()
            .served_by(runtime.listeners_per_address())
            .sockets_shared_by(runtime.workers_per_socket()),
    )?;
    let files = sluice_files(&args.source, &args.records);
    let (started, workers) = runtime.start()?;
    let opts = crate::app::RunOptions {
        policy,
        services: args
            .records
            .services(&args.source.bundle_opts.state_dir, workers),
        user: args.user,
        command: args.command,
        files,
        init,
        sandbox,
    };
    started.block_on(crate::app::run(opts))
}

/// The files this run of sluice reads or writes, which its workload must
/// not change (see `confine::SluiceFiles`).
pub(crate) fn sluice_files(
    source: &PolicySourceArgs,
    records: &RecordArgs,
) -> crate::confine::SluiceFiles {
    let bundle = source
        .bundle
        .as_deref()
        .filter(|b| !b.starts_with("https://") && !b.starts_with("http://"));
    let opts = &source.bundle_opts;
    let mut read_only: Vec<PathBuf> = source.policy.iter().cloned().collect();
    read_only.extend(bundle.map(PathBuf::from));
    if source.bundle.is_some() {
        read_only.extend(opts.trust.iter().cloned());
        read_only.extend(opts.ca.iter().cloned());
    }
    if source.bundle.is_some() || records.audit.is_some() {
        read_only.push(opts.state_dir.clone());
    }
    let records_files = [
        (&records.audit, records.audit_max_bytes.is_some()),
        (&records.timings, false),
    ]
    .into_iter()
    .filter_map(|(path, rotates)| {
        path.clone()
            .map(|path| crate::confine::RecordFile { path, rotates })
    })
    .collect();
    let mut hidden = vec![PathBuf::from(crate::daemon::api::DEFAULT_SOCKET)];
    hidden.push(crate::daemon::socket_path(None));
    // Whoever reads a checkpoint key can forge checkpoints: this run's, and
    // the default state directory's (the daemon's, unless it is told
    // otherwise), whether or not this run writes an audit log.
    hidden.extend(crate::audit::checkpoint::key_paths(&opts.state_dir));
    hidden.dedup();
    crate::confine::SluiceFiles {
        read_only,
        records: records_files,
        hidden,
    }
}
