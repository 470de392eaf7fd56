//! `sluice audit verify`: re-derive the hash chain of an audit log and say
//! where it first breaks.
//!
//! Every line's `prev` must be the SHA-256 (hex) of the line before it
//! (its exact bytes, without the newline), and `seq` must go up by one. The
//! first line chains from a genesis: 64 zeros and seq 0 for a fresh log, or,
//! for a file started by rotation, the previous file's last line (see
//! `Genesis`). An edited line breaks the next line's `prev`; an inserted,
//! removed or moved line breaks `prev` and `seq` where it happened; a line
//! copied from another log does not chain at all. What a chain cannot show
//! on its own: an edit of the very last line, or lines cut off the end. Keep
//! `VerifySummary::last_hash` somewhere else (a metric, a ticket) to cover
//! those.

use std::path::{Path, PathBuf};

use super::record::{line_hash, AuditRecord, GENESIS};
use super::rotate::rotated_set;

/// What the first line of the (oldest) file must chain from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Genesis {
    /// A fresh log: `prev` is 64 zeros and `seq` is 0.
    #[default]
    Fresh,
    /// A known hash (`--genesis HASH`): `prev` must equal it; `seq` may
    /// start anywhere.
    Hash(String),
    /// The file this one was rotated from (`--after FILE`): `prev` must be
    /// the hash of its last line and `seq` must follow its last seq.
    After(PathBuf),
}

/// What a verified log contained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifySummary {
    /// Files verified, oldest first.
    pub files: Vec<PathBuf>,
    /// Records (lines) verified.
    pub records: u64,
    /// seq of the first and last record (None for an empty log).
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// The `prev` the first line chained from.
    pub genesis: String,
    /// Hash of the last line: the genesis of whatever follows.
    pub last_hash: String,
}

/// Where the chain first breaks: a file, a 1-based line number, and what;
/// or line 0 when a file could not be read at all
/// ([`VerifyError::is_unreadable`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    pub path: PathBuf,
    pub line: usize,
    pub what: String,
}

impl VerifyError {
    /// The file could not be read (missing, no permission): nothing was
    /// checked, which is not the same as a broken chain.
    pub fn is_unreadable(&self) -> bool {
        self.line == 0
    }
}

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_unreadable() {
            write!(f, "{}: {}", self.path.display(), self.what)
        } else {
            write!(f, "{}:{}: {}", self.path.display(), self.line, self.what)
        }
    }
}

impl std::error::Error for VerifyError {}

/// Verify one file that must start a fresh log.
pub fn verify(path: &Path) -> Result<VerifySummary, VerifyError> {
    verify_with(path, &Genesis::Fresh)
}

/// Verify one file whose first line chains from `genesis`.
pub fn verify_with(path: &Path, genesis: &Genesis) -> Result<VerifySummary, VerifyError> {
    verify_files(&[path.to_path_buf()], genesis)
}

/// Verify a rotated log as one chain: FILE.n .. FILE.1, FILE (those that
/// exist, oldest first), the oldest chaining from `genesis`. With no rotated
/// files this is `verify_with(path, genesis)`. What `sluice audit verify
/// FILE` runs.
pub fn verify_rotated(path: &Path, genesis: &Genesis) -> Result<VerifySummary, VerifyError> {
    let mut files = rotated_set(path);
    if files.last().map(PathBuf::as_path) != Some(path) {
        // FILE itself missing: report it as unreadable below.
        files.push(path.to_path_buf());
    }
    verify_files(&files, genesis)
}

/// Verify `files` (oldest first) as one chain.
pub fn verify_files(files: &[PathBuf], genesis: &Genesis) -> Result<VerifySummary, VerifyError> {
    let (mut prev, mut next_seq) = match genesis {
        Genesis::Fresh => (GENESIS.to_string(), Some(0)),
        Genesis::Hash(h) => (h.to_ascii_lowercase(), None),
        Genesis::After(before) => {
            let (hash, seq) = last_line(before)?;
            (hash, Some(seq + 1))
        }
    };
    let mut summary = VerifySummary {
        files: files.to_vec(),
        records: 0,
        first_seq: None,
        last_seq: None,
        genesis: prev.clone(),
        last_hash: prev.clone(),
    };
    for (index, path) in files.iter().enumerate() {
        let bytes = read(path)?;
        let text = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        if text.is_empty() {
            continue;
        }
        for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
            let line_no = i + 1;
            let fail = |what: String| VerifyError {
                path: path.clone(),
                line: line_no,
                what,
            };
            let line = std::str::from_utf8(raw).map_err(|_| {
                fail("not UTF-8: the line was damaged or is not from an audit log".into())
            })?;
            if line.trim().is_empty() {
                return Err(fail(
                    "empty line: audit logs have none; a line was blanked or removed".into(),
                ));
            }
            let record: AuditRecord = serde_json::from_str(line).map_err(|e| {
                fail(format!(
                    "not an audit record ({e}): the line was edited or damaged"
                ))
            })?;
            if record.prev != prev {
                let what = if summary.records == 0 {
                    match genesis {
                        Genesis::Fresh => format!(
                            "the first line chains from {}, not from a fresh log's genesis (64 zeros): \
                             lines were removed from the start, or this file was started by rotation \
                             (verify it with the file before it: --after FILE.1, or --genesis {})",
                            record.prev, record.prev
                        ),
                        _ => format!(
                            "the first line chains from {}, but the genesis given is {prev}: \
                             this file does not follow the one given, or lines were removed from its start",
                            record.prev
                        ),
                    }
                } else if line_no == 1 && index > 0 {
                    format!(
                        "the first line does not chain from the last line of {}: \
                         a file of the rotated set is missing, out of order or was edited at its end",
                        files[index - 1].display()
                    )
                } else {
                    format!(
                        "prev does not match the hash of the line before: \
                         line {} was edited, or a line was inserted, removed or moved here",
                        line_no.saturating_sub(1)
                    )
                };
                return Err(fail(what));
            }
            if let Some(expected) = next_seq {
                if record.seq != expected {
                    return Err(fail(format!(
                        "seq is {} where {expected} was expected: a line was removed, inserted or moved",
                        record.seq
                    )));
                }
            }
            prev = line_hash(line);
            next_seq = Some(record.seq.wrapping_add(1));
            summary.first_seq.get_or_insert(record.seq);
            summary.last_seq = Some(record.seq);
            summary.records += 1;
        }
    }
    summary.last_hash = prev;
    Ok(summary)
}

fn read(path: &Path) -> Result<Vec<u8>, VerifyError> {
    std::fs::read(path).map_err(|e| VerifyError {
        path: path.to_path_buf(),
        line: 0,
        what: format!("cannot read the audit log: {e}; give the file `--audit` wrote"),
    })
}

/// Hash and seq of a file's last line (the genesis of the file after it).
fn last_line(path: &Path) -> Result<(String, u64), VerifyError> {
    let bytes = read(path)?;
    let text = String::from_utf8_lossy(&bytes);
    let count = text.lines().count();
    let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) else {
        return Err(VerifyError {
            path: path.to_path_buf(),
            line: 0,
            what: "empty: it cannot be the file before another".into(),
        });
    };
    let record: AuditRecord = serde_json::from_str(last).map_err(|e| VerifyError {
        path: path.to_path_buf(),
        line: count,
        what: format!("last line is not an audit record: {e}"),
    })?;
    Ok((line_hash(last), record.seq))
}
