//! `sluice daemon`: many sandboxes served from one process.

use std::path::PathBuf;

use clap::Args;

pub(crate) const AFTER_HELP: &str =
    "The config (YAML) names the control socket (default /run/sluice/daemon.sock, \
mode 0600), the metrics address, audit and timing files (and when the audit log is signed), and \
defaults for attached sandboxes (defaults.state_dir holds the audit checkpoint key); see docs/oci.md. SIGHUP re-reads every sandbox's policy; SIGINT/SIGTERM stop the daemon (the \
sandboxes' tables stay, so their connections are refused while no daemon runs). A daemon started \
on the same config adopts the containers that still run (records in <state_dir>/sandboxes/).";

#[derive(Debug, Args)]
pub(crate) struct DaemonArgs {
    /// The daemon's YAML config file.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: PathBuf,
}

pub(crate) fn execute(args: DaemonArgs) -> anyhow::Result<i32> {
    let config = crate::daemon::DaemonConfig::load(&args.config)?;
    crate::confine::require_root("sluice daemon")?;
    let (runtime, workers) = crate::serve::runtime::many_sandboxes()?;
    runtime.block_on(crate::daemon::run(config, workers))
}
