//! The command line: one file per command, each with its clap arguments
//! and one `execute`; argument groups several commands share are in `args`.
//! main.rs only parses, sets up logging and maps errors to exit codes
//! ([`exit_status`]). Nothing below this module imports it: the library's
//! modules take plain options, never clap types.

pub mod args;
pub mod audit;
pub mod bench;
pub mod bundle;
pub mod check;
pub mod compare;
pub mod daemon;
pub mod demo;
pub mod oci;
pub mod oci_hook;
pub mod probe;
pub mod run;
pub mod status;
pub mod vm;

use clap::{Parser, Subcommand};

/// Exit statuses of sluice's own failures (a wrapped command's status is
/// passed through unchanged).
pub mod exit {
    /// Bad input: a malformed policy, bad arguments.
    pub const BAD_INPUT: i32 = 2;
    /// The environment cannot enforce: not root, libnftables missing, the
    /// ruleset did not read back as applied.
    pub const CANNOT_ENFORCE: i32 = 3;
    /// `sluice status`: no daemon answers at the control socket.
    pub const NO_DAEMON: i32 = 4;
    /// The wrapped command exists but cannot be run (as `env` and shells say).
    pub const COMMAND_CANNOT_RUN: i32 = 126;
    /// The wrapped command was not found.
    pub const COMMAND_NOT_FOUND: i32 = 127;
}

#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "A transparent egress proxy for sandboxes",
    long_about = "sluice runs untrusted code in a network namespace whose only way out is sluice.\n\
nftables steers every TCP connection and DNS query to sluice and drops everything else;\n\
sluice decides each connection against a policy, audits every deny, and relays what is allowed.\n\n\
Start with `sluice demo` (as root) to see it work.",
    after_help = "Exit status: `sluice run` exits with the wrapped command's status (128+N if signal N \
ended it; 127 if it was not found, 126 if it could not be run). sluice's own failures: 2 bad \
input (policy, bundle, arguments, an audit or timings file that cannot be written), 3 cannot \
enforce (not root, libnftables (the nftables package) missing, ruleset read-back mismatch), 4 no daemon answers (`sluice \
status`).\n\nLogging: -v / -vv, or RUST_LOG=sluice=debug."
)]
pub struct Cli {
    /// More log output (-v info, -vv debug). Logs go to stderr.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a sandbox whose only network path is sluice.
    #[command(after_help = run::AFTER_HELP)]
    Run(run::RunArgs),
    /// Validate a policy file; prints a summary or every error with file:line:column.
    Check(check::CheckArgs),
    /// Show what a policy decides for one destination.
    #[command(after_help = check::EXPLAIN_AFTER_HELP)]
    Explain(check::ExplainArgs),
    /// Signed policy bundles: keys, signing, verification.
    #[command(subcommand)]
    Bundle(bundle::BundleCommand),
    /// Check or read an audit log and its signed checkpoints, or create the checkpoint key.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Compare two timing files (or directories of batches), e.g. direct vs through sluice.
    #[command(after_help = compare::AFTER_HELP)]
    Compare(compare::CompareArgs),
    /// Run a podman container whose only network path is sluice.
    #[command(after_help = oci::AFTER_HELP)]
    Oci(oci::OciArgs),
    /// Run a microVM's VMM behind a tap whose only way out is sluice (or fence an existing tap).
    #[command(after_help = vm::AFTER_HELP)]
    Vm(vm::VmArgs),
    /// Serve many sandboxes from one process, attached through a control socket (OCI hook).
    #[command(after_help = daemon::AFTER_HELP)]
    Daemon(daemon::DaemonArgs),
    /// OCI createRuntime hook: asks the daemon to enforce a starting container (state JSON on stdin).
    #[command(after_help = oci_hook::AFTER_HELP)]
    OciHook(oci_hook::OciHookArgs),
    /// List the sandboxes the daemon serves: path, id, policy, connections, drops.
    #[command(after_help = status::AFTER_HELP)]
    Status(status::StatusArgs),
    /// Measure sluice side by side with the native path and peer proxies (needs root).
    #[command(after_help = bench::AFTER_HELP)]
    Bench(bench::BenchArgs),
    /// One daemon, many sandboxes, many held connections: attach time and RSS (needs root).
    #[command(after_help = bench::SCALE_AFTER_HELP)]
    BenchScale(bench::BenchScaleArgs),
    /// Show sluice at work on a throwaway topology (needs root; touches nothing outside it).
    Demo,
    /// A small network client used by the demo and the tests to probe a sandbox from inside.
    #[command(subcommand)]
    Probe(probe::ProbeCommand),
    /// The client `sluice bench` runs in each condition's sandbox (JSON lines on stdin and stdout).
    #[command(hide = true)]
    BenchClient,
    /// The minimal tokio proxy `sluice bench` measures sluice against.
    #[command(hide = true)]
    BenchProxy(bench::BenchProxyArgs),
}

/// Run the parsed command; returns the process exit status.
pub fn execute(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Run(args) => run::execute(args),
        Command::Check(args) => check::execute_check(args),
        Command::Explain(args) => check::execute_explain(args),
        Command::Audit(cmd) => audit::execute(cmd),
        Command::Bundle(cmd) => bundle::execute(cmd),
        Command::Compare(args) => compare::execute(args),
        Command::Oci(args) => oci::execute(args),
        Command::Vm(args) => vm::execute(args),
        Command::Daemon(args) => daemon::execute(args),
        Command::OciHook(args) => oci_hook::execute(args),
        Command::Status(args) => status::execute(args),
        Command::Bench(args) => bench::execute(args),
        Command::BenchScale(args) => bench::execute_scale(args),
        Command::BenchClient => Ok(crate::bench::client::main()),
        Command::BenchProxy(args) => bench::execute_proxy(args),
        Command::Demo => demo::execute(),
        Command::Probe(cmd) => Ok(probe::execute(cmd)),
    }
}

/// An error that is the user's input (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BadInput(#[from] anyhow::Error);

impl From<crate::daemon::config::ConfigError> for BadInput {
    fn from(e: crate::daemon::config::ConfigError) -> BadInput {
        BadInput(e.into())
    }
}

impl From<crate::attach::oci::OciError> for BadInput {
    fn from(e: crate::attach::oci::OciError) -> BadInput {
        BadInput(e.into())
    }
}

/// The exit status for one of sluice's own failures.
pub fn exit_status(err: &anyhow::Error) -> i32 {
    use crate::attach::AttachError;
    for cause in err.chain() {
        match cause.downcast_ref::<AttachError>() {
            Some(AttachError::Spawn { source, .. }) => {
                return match source.kind() {
                    std::io::ErrorKind::NotFound => exit::COMMAND_NOT_FOUND,
                    _ => exit::COMMAND_CANNOT_RUN,
                }
            }
            Some(AttachError::UnknownUser(_)) => return exit::BAD_INPUT,
            Some(AttachError::Confine(e)) if e.is_bad_input() => return exit::BAD_INPUT,
            _ => {}
        }
        if cause.is::<status::NoDaemon>() {
            return exit::NO_DAEMON;
        }
    }
    use crate::attach::oci::OciError;
    let refused_container = err.chain().any(|e| {
        matches!(
            e.downcast_ref::<OciError>(),
            Some(OciError::RefusedByHook(_) | OciError::Unconfined(_))
        )
    });
    if refused_container {
        return exit::BAD_INPUT;
    }
    let bad_input = err.chain().any(|e| {
        e.is::<crate::policy::PolicyError>()
            || e.is::<crate::bundle::BundleError>()
            || e.is::<BadInput>()
            || e.is::<crate::audit::AuditError>()
            || e.is::<crate::timing::TimingError>()
            || e.is::<crate::app::runtime::BadWorkers>()
    });
    if bad_input {
        exit::BAD_INPUT
    } else {
        exit::CANNOT_ENFORCE
    }
}
