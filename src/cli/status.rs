//! `sluice status`: the sandboxes a running daemon serves, and the head of
//! its audit log (newest line and newest signed checkpoint) for an outside
//! collector to keep.

use std::path::PathBuf;

use clap::Args;

use crate::daemon::ClientError;

pub(crate) const AFTER_HELP: &str =
    "The first line is the audit log's head: the seq and hash of its newest \
line and of its newest signed checkpoint. Kept elsewhere (`sluice status --audit --json` prints it \
alone), it later shows lines that were rewritten or cut off before a checkpoint signed them: \
`sluice audit verify --key audit.pub --anchor SEQ:HASH FILE`.\n\n\
Exit status: 0 with the list (empty when no sandbox is attached), \
4 when no daemon answers at the socket (start one with `sluice daemon --config FILE`, or give its \
socket with --socket).";

/// No daemon answers at the socket: `sluice status` exits
/// [`ExitClass::NoDaemon`](crate::exit_class::ExitClass::NoDaemon).
#[derive(Debug, thiserror::Error)]
#[error("no sluice daemon answers at {}: {cause}; start one with `sluice daemon --config FILE`, or give the socket its config names with --socket", socket.display())]
pub(crate) struct NoDaemon {
    socket: PathBuf,
    cause: std::io::Error,
}

impl NoDaemon {
    /// Nothing answered at `socket` (the connect failed with `cause`).
    pub(crate) fn new(socket: PathBuf, cause: std::io::Error) -> NoDaemon {
        NoDaemon { socket, cause }
    }
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The daemon's control socket (default: $SLUICE_DAEMON_SOCKET, else /run/sluice/daemon.sock).
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Show full container ids.
    #[arg(long)]
    pub(crate) no_trunc: bool,
    /// Only the audit log's head (with --json: file, key, head and checkpoint as JSON).
    #[arg(long)]
    pub(crate) audit: bool,
}

pub(crate) fn execute(args: StatusArgs) -> anyhow::Result<i32> {
    let socket = crate::daemon::socket_path(args.socket.as_deref());
    let client = crate::daemon::Client::new(socket.clone());
    let no_daemon = |err| match err {
        ClientError::Connect { cause, .. } => {
            anyhow::Error::from(NoDaemon::new(socket.clone(), cause))
        }
        err => err.into(),
    };
    if args.audit {
        let head = client.audit_head().map_err(no_daemon)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&head)?);
        } else {
            println!("{}", audit_line(&head));
        }
        return Ok(0);
    }
    let sandboxes = client.list().map_err(no_daemon)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&sandboxes)?);
        return Ok(0);
    }
    match client.audit_head() {
        Ok(head) => println!("{}", audit_line(&head)),
        Err(err) => println!("audit: head unknown ({err})"),
    }
    if sandboxes.is_empty() {
        println!("no sandboxes attached");
        return Ok(0);
    }
    println!(
        "{:<5} {:<12} {:<24} {:>8} {:>8} {:>10} {:>7} {:>8}  VM (TAP GUEST)",
        "PATH", "ID", "POLICY", "ALLOWED", "DENIED", "WOULD-DENY", "ACTIVE", "DROPPED"
    );
    for s in &sandboxes {
        let id = s.id.as_str();
        // ASCII (the id's rule): any byte is a character boundary.
        let id = if args.no_trunc || id.len() <= 12 {
            id
        } else {
            &id[..12]
        };
        println!(
            "{:<5} {:<12} {:<24} {:>8} {:>8} {:>10} {:>7} {:>8}  {}",
            s.path,
            id,
            s.policy,
            s.connections.allowed,
            s.connections.denied,
            s.connections.would_deny,
            s.connections.active,
            s.dropped_packets.map_or("-".to_string(), |d| d.to_string()),
            s.vm.as_ref()
                .map_or("-".to_string(), |vm| format!("{} {}", vm.tap, vm.guest)),
        );
    }
    Ok(0)
}

/// `audit FILE: head seq N HASH; checkpoint seq M HASH (K lines after it); key ID`.
fn audit_line(head: &crate::audit::AuditHead) -> String {
    let Some(file) = &head.file else {
        return "audit: off (the daemon's config names no `audit` file)".to_string();
    };
    let anchor = |a: &Option<crate::audit::Anchor>| {
        a.as_ref()
            .map_or("none".to_string(), |a| format!("seq {} {}", a.seq, a.hash))
    };
    let after = match head.unanchored() {
        1 => "1 line".to_string(),
        n => format!("{n} lines"),
    };
    format!(
        "audit {}: head {}; checkpoint {} ({after} after it); key {}",
        file.display(),
        anchor(&head.head),
        anchor(&head.checkpoint),
        head.key.as_deref().unwrap_or("none")
    )
}

impl crate::exit_class::Classified for NoDaemon {
    /// Nothing answers at the socket.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::NoDaemon
    }
}
