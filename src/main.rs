//! The sluice binary: parse, set up logging, run, map errors to exit codes.

use clap::Parser;
use sluice::cli::{exit, Cli};

fn main() {
    // sluice re-executed as a workload's init (see confine::init): before
    // clap, which knows nothing of it.
    if std::env::args_os().nth(1).as_deref() == Some(sluice::confine::init::MARKER.as_ref()) {
        sluice::confine::init::main();
    }
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let code = match sluice::cli::execute(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("sluice: error: {}", sluice::report::error_line(&err));
            exit_status(&err)
        }
    };
    std::process::exit(code);
}

/// The exit status for one of sluice's own failures.
fn exit_status(err: &anyhow::Error) -> i32 {
    use sluice::attach::AttachError;
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
    }
    use sluice::attach::oci::OciError;
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
        e.is::<sluice::policy::PolicyError>()
            || e.is::<sluice::bundle::BundleError>()
            || e.is::<sluice::cli::BadInput>()
            || e.is::<sluice::audit::AuditError>()
            || e.is::<sluice::timing::TimingError>()
    });
    if bad_input {
        exit::BAD_INPUT
    } else {
        exit::CANNOT_ENFORCE
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "sluice=warn",
        1 => "sluice=info",
        _ => "sluice=debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
