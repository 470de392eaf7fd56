//! The sluice binary: parse, set up logging, run, map errors to exit codes.

use sluice::cli::Cli;

fn main() {
    // The workload's init is this binary executed again under this name
    // (sluice::confine::PreparedInit): it parses no command line.
    if std::env::args_os()
        .next()
        .is_some_and(|a| a == sluice::confine::INIT_NAME)
    {
        sluice::confine::run_init()
    }
    let cli = Cli::from_command_line();
    init_logging(cli.global.verbose);
    let code = match sluice::cli::execute(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("sluice: error: {}", sluice::report::error_line(&err));
            sluice::cli::exit_status(&err)
        }
    };
    std::process::exit(code);
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
