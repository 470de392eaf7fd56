//! `sluice audit verify|tail`: checking and reading an audit log.

use std::path::PathBuf;

use clap::Subcommand;

use super::BadInput;
use crate::audit::{verify_rotated, Genesis, TailOptions};

pub const VERIFY_AFTER_HELP: &str =
    "Rotated files (FILE.N .. FILE.1, FILE) are checked as one chain. A file whose \
first line continues another file's chain needs --after PREV or --genesis HASH.\n\n\
The chain cannot show an edit of the very last line or lines cut off the end: keep the printed \
last hash elsewhere and compare it later.";

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check the hash chain; exit 1 with the first bad line (FILE:LINE: what) if broken, 2 if a file cannot be read.
    #[command(after_help = VERIFY_AFTER_HELP)]
    Verify {
        file: PathBuf,
        /// The hash the first line must chain from.
        #[arg(long, value_name = "HASH", conflicts_with = "after")]
        genesis: Option<String>,
        /// The file this one continues (its last line's hash is the genesis).
        #[arg(long, value_name = "PREV")]
        after: Option<PathBuf>,
    },
    /// Print records readably, one per line.
    Tail {
        file: PathBuf,
        /// Keep printing records as they are appended.
        #[arg(long, short)]
        follow: bool,
        /// Only records with this verdict (deny, would-deny, allow, refused).
        #[arg(long)]
        verdict: Option<String>,
        /// Print the raw JSON lines.
        #[arg(long)]
        json: bool,
    },
}

pub fn execute(cmd: AuditCommand) -> anyhow::Result<i32> {
    match cmd {
        AuditCommand::Verify {
            file,
            genesis,
            after,
        } => {
            let genesis = match (genesis, after) {
                (Some(hash), _) => Genesis::Hash(hash),
                (None, Some(prev)) => Genesis::After(prev),
                (None, None) => Genesis::Fresh,
            };
            match verify_rotated(&file, &genesis) {
                Ok(summary) => {
                    println!(
                        "{}: chain intact: {} records in {} file(s), seq {}..{}; last hash {}",
                        file.display(),
                        summary.records,
                        summary.files.len(),
                        summary.first_seq.map_or("-".into(), |s| s.to_string()),
                        summary.last_seq.map_or("-".into(), |s| s.to_string()),
                        summary.last_hash
                    );
                    Ok(0)
                }
                // Nothing could be checked: the user's input (exit 2).
                Err(err) if err.is_unreadable() => Err(BadInput(err.into()).into()),
                // A broken chain: where it breaks, on stdout (exit 1).
                Err(err) => {
                    println!("{err}");
                    Ok(1)
                }
            }
        }
        AuditCommand::Tail {
            file,
            follow,
            verdict,
            json,
        } => {
            let options = TailOptions {
                follow,
                verdict,
                json,
                ..TailOptions::default()
            };
            let mut out = std::io::stdout().lock();
            match crate::audit::tail(&file, &options, &mut out) {
                Ok(()) => Ok(0),
                Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    Err(BadInput(anyhow::anyhow!(
                        "cannot read {}: {err}; give the file --audit wrote",
                        file.display()
                    ))
                    .into())
                }
                Err(err) => Err(anyhow::anyhow!("cannot read {}: {err}", file.display())),
            }
        }
    }
}
