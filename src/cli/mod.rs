//! The command line: one file per command, each with its clap arguments
//! and one `execute`; argument groups several commands share are in `args`.
//! main.rs only parses, sets up logging and maps errors to exit codes
//! ([`exit_status`]). Nothing below this module imports it: the library's
//! modules take plain options, never clap types.

pub(crate) mod args;
pub(crate) mod audit;
#[cfg(feature = "bench")]
pub(crate) mod bench;
pub(crate) mod bundle;
pub(crate) mod check;
pub(crate) mod compare;
pub(crate) mod completions;
pub(crate) mod daemon;
pub(crate) mod demo;
pub(crate) mod doctor;
pub(crate) mod exit;
pub(crate) mod man;
pub(crate) mod oci;
pub(crate) mod oci_hook;
pub(crate) mod probe;
pub(crate) mod run;
pub(crate) mod status;
pub(crate) mod vm;

use std::ffi::OsString;

use clap::{Args, FromArgMatches, Parser, Subcommand};

/// The program's name, as its help and errors say it.
const NAME: &str = "sluice";

#[derive(Debug, Parser)]
#[command(
    name = NAME,
    version,
    about = "A transparent egress proxy for sandboxes",
    long_about = "sluice runs untrusted code in a network namespace whose only way out is sluice.\n\
nftables steers every TCP connection and DNS query to sluice and drops everything else;\n\
sluice decides each connection against a policy, audits every deny, and relays what is allowed.\n\n\
Start with `sluice demo` (as root) to see it work.",
    after_help = "Exit status: `sluice run` (and `sluice vm`, `sluice oci`) exits with the wrapped \
command's status (128+N if signal N ended it; 127 if it was not found, 126 if it could not be run). \
Otherwise 0 done, 1 a check found a problem (`audit verify`: a broken chain; `bench`: a content \
or deny check). sluice's own failures, as the error's class says: 2 bad input (policy, bundle, \
arguments, a sandbox id, an audit, timings or metrics address that cannot be used, a request the \
daemon refused as bad), 3 cannot enforce (not root, libnftables (the nftables package) missing, \
ruleset read-back mismatch, or the machine or sluice itself failed; `doctor`: something a \
kind asked for needs is missing), 4 no daemon answers at the \
control socket (`sluice status`, `--daemon`).\n\nLogging: -v / -vv, or RUST_LOG=sluice=debug."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The options every command takes.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// More log output (-v info, -vv debug). Logs go to stderr.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

impl Cli {
    /// This process's command line, parsed; on bad arguments, `--help` or
    /// `--version` it prints clap's message and exits, as `Parser::parse`.
    pub fn from_command_line() -> Cli {
        Cli::try_from_argv(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// `argv` parsed. `sluice run` is what wraps every short command, so
    /// for it only its own subcommand is built (see [`run_only`]):
    /// building all of sluice's takes about half a millisecond, paid at
    /// every start. Anything else is parsed by the whole command.
    pub(crate) fn try_from_argv(
        argv: impl IntoIterator<Item = OsString>,
    ) -> Result<Cli, clap::Error> {
        let argv: Vec<OsString> = argv.into_iter().collect();
        if argv.get(1).is_some_and(|first| first == "run") {
            let matches = run_only().try_get_matches_from(argv)?;
            return Cli::from_arg_matches(&matches);
        }
        Cli::try_parse_from(argv)
    }
}

/// The part of [`Cli`]'s command that `sluice run ...` reaches: the same
/// names, options and texts (tests pin that its help, usage and errors are
/// the whole command's), without the other subcommands.
fn run_only() -> clap::Command {
    let top = clap::Command::new(NAME);
    let run = <run::RunArgs as Args>::augment_args(clap::Command::new("run"))
        .about(run::ABOUT)
        .after_help(run::AFTER_HELP);
    <GlobalArgs as Args>::augment_args(top)
        .subcommand(run)
        .subcommand_required(true)
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    // Its texts are constants that `run_only` shares.
    #[command(about = run::ABOUT, after_help = run::AFTER_HELP)]
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
    #[cfg(feature = "bench")]
    #[command(after_help = bench::AFTER_HELP)]
    Bench(bench::BenchArgs),
    /// One daemon, many sandboxes, many held connections: attach time and RSS (needs root).
    #[cfg(feature = "bench")]
    #[command(after_help = bench::SCALE_AFTER_HELP)]
    BenchScale(bench::BenchScaleArgs),
    /// Show sluice at work on a throwaway topology (needs root; touches nothing outside it).
    Demo,
    /// What this machine has and lacks for each kind of workload, each lack with its fix.
    #[command(after_help = doctor::AFTER_HELP)]
    Doctor(doctor::DoctorArgs),
    /// A small network client used by the demo and the tests to probe a sandbox from inside.
    #[command(subcommand)]
    Probe(probe::ProbeCommand),
    /// Print the shell completion script for bash, zsh or fish.
    #[command(after_help = completions::AFTER_HELP)]
    Completions(completions::CompletionsArgs),
    /// Write a manual page per command and subcommand into DIR (for packaging).
    #[command(hide = true)]
    Man(man::ManArgs),
    /// The client `sluice bench` runs in each condition's sandbox (JSON lines on stdin and stdout).
    #[cfg(feature = "bench")]
    #[command(hide = true)]
    BenchClient,
    /// The client `sluice bench-scale --run` runs under `sluice run` (lines on stdin and stdout).
    #[cfg(feature = "bench")]
    #[command(hide = true)]
    BenchHold,
    /// The minimal tokio proxy `sluice bench` measures sluice against.
    #[cfg(feature = "bench")]
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
        #[cfg(feature = "bench")]
        Command::Bench(args) => bench::execute(args),
        #[cfg(feature = "bench")]
        Command::BenchScale(args) => bench::execute_scale(args),
        #[cfg(feature = "bench")]
        Command::BenchClient => Ok(crate::bench::client::main()),
        #[cfg(feature = "bench")]
        Command::BenchHold => Ok(crate::bench::scale_run::hold_main()),
        #[cfg(feature = "bench")]
        Command::BenchProxy(args) => bench::execute_proxy(args),
        Command::Demo => demo::execute(),
        Command::Doctor(args) => doctor::execute(args),
        Command::Probe(cmd) => Ok(probe::execute(cmd)),
        Command::Completions(args) => completions::execute(args),
        Command::Man(args) => man::execute(args),
    }
}

/// An error that is the user's input (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub(crate) struct BadInput(#[from] anyhow::Error);

/// The exit status for one of sluice's own failures: the class its
/// outermost classified cause says ([`exit`]).
pub fn exit_status(err: &anyhow::Error) -> i32 {
    exit::class_of(err).code()
}

#[cfg(test)]
mod tests {
    //! `sluice run`'s short parse ([`run_only`]) must be indistinguishable
    //! from the whole command's.

    use clap::CommandFactory;

    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn whole_run() -> clap::Command {
        let mut whole = Cli::command();
        whole.build();
        whole
            .find_subcommand("run")
            .expect("sluice has a run subcommand")
            .clone()
    }

    fn short_run() -> clap::Command {
        let mut short = run_only();
        short.build();
        short
            .find_subcommand("run")
            .expect("run_only has run")
            .clone()
    }

    #[test]
    fn run_help_is_the_same_from_the_short_parse() {
        let (mut whole, mut short) = (whole_run(), short_run());
        assert_eq!(
            short.render_long_help().to_string(),
            whole.render_long_help().to_string()
        );
        assert_eq!(
            short.render_help().to_string(),
            whole.render_help().to_string()
        );
        assert_eq!(
            short.render_usage().to_string(),
            whole.render_usage().to_string()
        );
    }

    #[test]
    fn run_arguments_parse_the_same_from_the_short_parse() {
        for args in [
            &["sluice", "run", "--policy", "p.yaml", "--", "true"][..],
            &[
                "sluice", "run", "-vv", "--bundle", "b", "--trust", "k", "--user", "nobody", "--",
                "sh", "-c", "x",
            ],
            &[
                "sluice", "run", "--policy", "p.yaml", "--audit", "a.log", "--", "env", "-i",
            ],
        ] {
            let short = Cli::try_from_argv(argv(args)).expect("parses");
            let whole = Cli::try_parse_from(args).expect("parses");
            assert_eq!(format!("{short:?}"), format!("{whole:?}"), "{args:?}");
        }
    }

    #[test]
    fn run_errors_are_the_same_from_the_short_parse() {
        for args in [
            &["sluice", "run", "--polcy", "p.yaml", "--", "true"][..],
            &["sluice", "run", "--policy", "p.yaml"],
            &["sluice", "run", "--", "true"],
            &["sluice", "run", "--bundle", "b", "--", "true"],
            &["sluice", "run", "--version"],
            &["sluice", "run", "--help"],
        ] {
            let short = Cli::try_from_argv(argv(args)).expect_err("refused");
            let whole = Cli::try_parse_from(args).expect_err("refused");
            assert_eq!(short.kind(), whole.kind(), "{args:?}");
            assert_eq!(short.render().to_string(), whole.render().to_string());
        }
    }

    #[test]
    fn other_commands_are_parsed_by_the_whole_command() {
        let cli = Cli::try_from_argv(argv(&["sluice", "-v", "run", "--policy", "p", "--", "x"]))
            .expect("parses");
        assert_eq!(cli.global.verbose, 1);
        assert!(matches!(cli.command, Command::Run(_)));
        let cli = Cli::try_from_argv(argv(&["sluice", "check", "--policy", "p"])).expect("parses");
        assert!(matches!(cli.command, Command::Check(_)));
    }
}
