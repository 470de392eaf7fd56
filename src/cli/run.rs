//! `sluice run`: a command in a fresh sandbox whose only way out is sluice.

use std::ffi::OsString;

use clap::Args;

use super::args::{policy_source, PolicySourceArgs, RecordArgs};

pub const AFTER_HELP: &str =
    "Example:\n  sluice run --policy policies/dev.yaml -- curl -sS http://origin.test:8080/\n\n\
Allowed connections behave as without sluice. Denied plain-HTTP requests get a 403 naming the \
rule and reason; other denied TCP gets a reset; UDP other than DNS, ICMP and raw IP are dropped \
(sends fail with EPERM). Needs root.\n\n\
Signals: SIGTERM, and SIGINT sent to sluice alone, are passed to the command, which is killed 5 s \
later if still running. Ctrl-C at a terminal reaches the command directly, as without sluice, and \
the command decides (a shell carries on). SIGHUP reloads the policy or bundle.";

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub source: PolicySourceArgs,
    #[command(flatten)]
    pub records: RecordArgs,
    /// Run the command as USER (name or uid) instead of root: do this for untrusted code (a root
    /// command cannot leave the namespace, but it still owns the host's files).
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

pub fn execute(args: RunArgs) -> anyhow::Result<i32> {
    let policy = policy_source(&args.source, crate::workload::WorkloadPath::Host)?;
    crate::confine::require_root("sluice run")?;
    let opts = crate::app::RunOptions {
        policy,
        services: args.records.services(),
        user: args.user,
        command: args.command,
    };
    crate::app::runtime::one_sandbox()?.block_on(crate::app::run(opts))
}
