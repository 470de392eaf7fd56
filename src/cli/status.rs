//! `sluice status`: the sandboxes a running daemon serves.

use std::path::PathBuf;

use clap::Args;

use crate::daemon::ClientError;

pub const AFTER_HELP: &str = "Exit status: 0 with the list (empty when no sandbox is attached), \
4 when no daemon answers at the socket (start one with `sluice daemon --config FILE`, or give its \
socket with --socket).";

/// No daemon answers at the socket: `sluice status` exits
/// [`super::exit::NO_DAEMON`].
#[derive(Debug, thiserror::Error)]
#[error("no sluice daemon answers at {}: {cause}; start one with `sluice daemon --config FILE`, or give the socket its config names with --socket", socket.display())]
pub struct NoDaemon {
    socket: PathBuf,
    cause: std::io::Error,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The daemon's control socket (default: $SLUICE_DAEMON_SOCKET, else /run/sluice/daemon.sock).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Show full container ids.
    #[arg(long)]
    pub no_trunc: bool,
}

pub fn execute(args: StatusArgs) -> anyhow::Result<i32> {
    let socket = crate::daemon::socket_path(args.socket.as_deref());
    let client = crate::daemon::Client::new(socket.clone());
    let sandboxes = match client.list() {
        Ok(sandboxes) => sandboxes,
        Err(ClientError::Connect { cause, .. }) => return Err(NoDaemon { socket, cause }.into()),
        Err(err) => return Err(err.into()),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&sandboxes)?);
        return Ok(0);
    }
    if sandboxes.is_empty() {
        println!("no sandboxes attached");
        return Ok(0);
    }
    println!(
        "{:<5} {:<12} {:<24} {:>8} {:>8} {:>10} {:>7} {:>8}",
        "PATH", "ID", "POLICY", "ALLOWED", "DENIED", "WOULD-DENY", "ACTIVE", "DROPPED"
    );
    for s in &sandboxes {
        let id = if args.no_trunc || s.id.len() <= 12 {
            s.id.as_str()
        } else {
            &s.id[..12]
        };
        println!(
            "{:<5} {:<12} {:<24} {:>8} {:>8} {:>10} {:>7} {:>8}",
            s.path,
            id,
            s.policy,
            s.connections.allowed,
            s.connections.denied,
            s.connections.would_deny,
            s.connections.active,
            s.dropped_packets.map_or("-".to_string(), |d| d.to_string()),
        );
    }
    Ok(0)
}
