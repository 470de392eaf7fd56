//! `sluice audit verify|keygen|tail`: checking an audit log and its signed
//! checkpoints, creating the checkpoint key, reading a log.

use std::path::PathBuf;

use clap::Subcommand;

use super::BadInput;
use crate::audit::{
    verify_log, AuditKey, CheckpointKeys, Genesis, TailOptions, VerifyOptions, VerifySummary,
};

pub(crate) const VERIFY_AFTER_HELP: &str =
    "Rotated files (FILE.N .. FILE.1, FILE) are checked as one chain. A file whose \
first line continues another file's chain needs --after PREV or --genesis HASH.\n\n\
With --key (the state directory's audit.pub, or its 64 hex digits) every signed checkpoint is \
verified: no line before the newest checkpoint can be edited, removed or reordered unnoticed. \
The lines after it are reported as unanchored (exit 0): whoever can write the file could still \
rewrite or cut them. --anchor SEQ[:HASH] (a head `sluice status` printed, or the \
sluice_audit_head_seq gauge, kept elsewhere) covers them: the log must reach that seq, with that \
hash.\n\n\
Exit status: 0 intact, 1 broken (FILE:LINE: what, on stdout), 2 a file or key cannot be read.";

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Check the hash chain and signed checkpoints; exit 1 with the first bad line (FILE:LINE: what) if broken, 2 if a file cannot be read.
    #[command(after_help = VERIFY_AFTER_HELP)]
    Verify {
        file: PathBuf,
        /// The hash the first line must chain from.
        #[arg(long, value_name = "HASH", conflicts_with = "after")]
        genesis: Option<String>,
        /// The file this one continues (its last line's hash is the genesis).
        #[arg(long, value_name = "PREV")]
        after: Option<PathBuf>,
        /// Verify every checkpoint's signature with this public key: a file
        /// (audit.pub, or one holding the key's 64 hex digits) or the hex itself.
        #[arg(long, value_name = "PUB")]
        key: Option<String>,
        /// A head recorded elsewhere: the log must reach seq SEQ, and that
        /// line must have hash HASH if given.
        #[arg(long, value_name = "SEQ[:HASH]", value_parser = parse_anchor)]
        anchor: Option<(u64, Option<String>)>,
    },
    /// Create the audit log's checkpoint signing key (STATE_DIR/audit.key, mode 0600; never overwritten) and print its public key.
    #[command(after_help = KEYGEN_AFTER_HELP)]
    Keygen {
        /// The state directory sluice run, sluice oci or the daemon are given.
        #[arg(long, value_name = "DIR", default_value = crate::bundle::DEFAULT_STATE_DIR)]
        state_dir: PathBuf,
    },
    /// Print records readably, one per line.
    Tail {
        file: PathBuf,
        /// Keep printing records as they are appended.
        #[arg(long, short)]
        follow: bool,
        /// Only records with this verdict (deny, would-deny, allow, refused, checkpoint).
        #[arg(long)]
        verdict: Option<String>,
        /// Print the raw JSON lines.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) const KEYGEN_AFTER_HELP: &str =
    "sluice also creates the key on first use (sluice run/oci --audit, or a daemon with `audit`). \
Its public half is written beside it as audit.pub, for `sluice audit verify --key`: copy it to \
wherever logs are verified. The key itself must stay where no workload can read it.";

fn parse_anchor(text: &str) -> Result<(u64, Option<String>), String> {
    let (seq, hash) = match text.split_once(':') {
        Some((seq, hash)) => (seq, Some(hash)),
        None => (text, None),
    };
    let seq = seq
        .parse()
        .map_err(|_| format!("`{seq}` is not a seq; write SEQ or SEQ:HASH, e.g. 41:3f2a..."))?;
    if let Some(hash) = hash {
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "`{hash}` is not a line hash (64 hex digits); write SEQ or SEQ:HASH"
            ));
        }
    }
    Ok((seq, hash.map(str::to_ascii_lowercase)))
}

pub(crate) fn execute(cmd: AuditCommand) -> anyhow::Result<i32> {
    match cmd {
        AuditCommand::Verify {
            file,
            genesis,
            after,
            key,
            anchor,
        } => {
            let genesis = match (genesis, after) {
                (Some(hash), _) => Genesis::Hash(hash),
                (None, Some(prev)) => Genesis::After(prev),
                (None, None) => Genesis::Fresh,
            };
            let keys = key
                .map(|k| CheckpointKeys::parse(&k).map_err(|e| BadInput(anyhow::anyhow!(e))))
                .transpose()?;
            let options = VerifyOptions {
                genesis,
                keys,
                anchor,
            };
            match verify_log(&file, &options) {
                Ok(summary) => {
                    print_summary(&file, &summary, &options);
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
        AuditCommand::Keygen { state_dir } => {
            let key = AuditKey::create(&state_dir).map_err(|e| BadInput(e.into()))?;
            println!("{}", key.public_hex());
            eprintln!(
                "wrote the audit checkpoint key {} (id {}; keep it secret) and its public key {}",
                key.path().display(),
                key.id(),
                crate::audit::checkpoint::public_path(&state_dir).display()
            );
            Ok(0)
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

/// What `verify` found: the chain, then the checkpoints, each one line.
fn print_summary(file: &std::path::Path, s: &VerifySummary, options: &VerifyOptions) {
    let seqs = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => format!("seq {a}..{b}"),
        _ => "no lines".to_string(),
    };
    println!(
        "{}: chain intact: {} records and {} checkpoints in {} file(s), {}; last hash {}",
        file.display(),
        s.records,
        s.checkpoints,
        s.files.len(),
        seqs(s.first_seq, s.last_seq),
        s.last_hash
    );
    match &options.keys {
        None => println!(
            "{}: checkpoints not verified: no --key given (give the state directory's audit.pub)",
            file.display()
        ),
        Some(keys) => {
            if let Some(c) = s.last_checkpoint {
                println!(
                    "{}: {} checkpoints verified with {}; the newest, seq {c}, signs every line before it",
                    file.display(),
                    s.checkpoints,
                    keys.ids().join(", ")
                );
            }
            if s.unanchored == 0 {
                println!(
                    "{}: every record is anchored by a signed checkpoint",
                    file.display()
                );
            } else {
                let (records, are) = match s.unanchored {
                    1 => ("1 record".to_string(), "is"),
                    n => (format!("{n} records"), "are"),
                };
                let which = match s.last_checkpoint {
                    Some(c) => format!("{records} after the newest checkpoint (seq {c}) {are}"),
                    None => format!("no signed checkpoint: {records} {are}"),
                };
                println!(
                    "{}: {which} unanchored: whoever can write the file could rewrite or cut them unnoticed; compare the head (seq {}, hash {}) with one kept elsewhere (--anchor)",
                    file.display(),
                    s.last_seq.map_or("-".into(), |l| l.to_string()),
                    s.last_hash
                );
            }
        }
    }
    if let Some((seq, hash)) = &options.anchor {
        println!(
            "{}: anchor seq {seq}{} found in the chain",
            file.display(),
            if hash.is_some() { " and its hash" } else { "" }
        );
    }
}
