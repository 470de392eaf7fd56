//! `sluice audit verify`: re-derive the hash chain of an audit log, check
//! its signed checkpoints, and say where it first breaks.
//!
//! Every line's `hash` (when it has one) must be the SHA-256 of its bytes
//! without it, its `prev` must be the hash of the line before it, and `seq`
//! must go up by one. The first line chains from a genesis: 64 zeros and
//! seq 0 for a fresh log, or, for a file started by rotation, the previous
//! file's last line (see `Genesis`). An edited line no longer matches its
//! own hash or breaks the next line's `prev`; an inserted, removed or moved
//! line breaks `prev` and `seq` where it happened; a line copied from
//! another log does not chain at all.
//!
//! Whoever can write the file can also rewrite the newest lines with fresh
//! hashes, or cut them off: the chain alone cannot show that. Checkpoints
//! can: with the public key (`VerifyOptions::keys`), each checkpoint's
//! signature must verify, so no line before the newest checkpoint can be
//! changed. The lines after it are reported as unanchored; an anchor kept
//! elsewhere (`VerifyOptions::anchor`, the head `sluice status` or the
//! `sluice_audit_head_seq` gauge showed) covers them and a cut tail.

use std::path::{Path, PathBuf};

use super::checkpoint::CheckpointKeys;
use super::record::{line_hash, unseal, AuditLine, GENESIS};
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

/// What to check besides the chain.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    pub genesis: Genesis,
    /// Verify every checkpoint's signature with these keys (`--key`).
    pub keys: Option<CheckpointKeys>,
    /// A head recorded elsewhere (`--anchor SEQ[:HASH]`): the log must
    /// reach seq `seq`, and that line must have hash `hash` if given.
    pub anchor: Option<(u64, Option<String>)>,
}

/// What a verified log contained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifySummary {
    /// Files verified, oldest first.
    pub files: Vec<PathBuf>,
    /// Decision records verified (checkpoints not counted).
    pub records: u64,
    /// Checkpoint lines seen (their signatures verified if `verified`).
    pub checkpoints: u64,
    /// Whether the checkpoints' signatures were checked (a key was given).
    pub verified: bool,
    /// seq of the newest checkpoint: every line before it is anchored.
    pub last_checkpoint: Option<u64>,
    /// Decision records after the newest checkpoint (all, if none).
    pub unanchored: u64,
    /// seq of the first and last line (None for an empty log).
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
    pub(crate) fn is_unreadable(&self) -> bool {
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
    let options = VerifyOptions {
        genesis: genesis.clone(),
        ..VerifyOptions::default()
    };
    verify_files(&[path.to_path_buf()], &options)
}

/// Verify a rotated log as one chain: FILE.n .. FILE.1, FILE (those that
/// exist, oldest first), the oldest chaining from `genesis`. With no rotated
/// files this is `verify_with(path, genesis)`. What `sluice audit verify
/// FILE` runs.
pub fn verify_rotated(path: &Path, genesis: &Genesis) -> Result<VerifySummary, VerifyError> {
    let options = VerifyOptions {
        genesis: genesis.clone(),
        ..VerifyOptions::default()
    };
    verify_log(path, &options)
}

/// [`verify_rotated`] with checkpoints and an anchor checked too: what
/// `sluice audit verify [--key PUB] [--anchor SEQ:HASH] FILE` runs.
pub fn verify_log(path: &Path, options: &VerifyOptions) -> Result<VerifySummary, VerifyError> {
    let mut files = rotated_set(path);
    if files.last().map(PathBuf::as_path) != Some(path) {
        // FILE itself missing: report it as unreadable below.
        files.push(path.to_path_buf());
    }
    verify_files(&files, options)
}

/// Verify `files` (oldest first) as one chain.
pub(crate) fn verify_files(
    files: &[PathBuf],
    options: &VerifyOptions,
) -> Result<VerifySummary, VerifyError> {
    let (prev, next_seq) = start(&options.genesis)?;
    let mut chain = Chain {
        files,
        options,
        summary: VerifySummary {
            files: files.to_vec(),
            records: 0,
            checkpoints: 0,
            verified: options.keys.is_some(),
            last_checkpoint: None,
            unanchored: 0,
            first_seq: None,
            last_seq: None,
            genesis: prev.clone(),
            last_hash: prev.clone(),
        },
        prev,
        next_seq,
        end: (files.last().cloned().unwrap_or_default(), 0),
    };
    for index in 0..files.len() {
        chain.file(index)?;
    }
    chain.reaches_anchor()?;
    chain.summary.last_hash = chain.prev;
    Ok(chain.summary)
}

/// What the first line must chain from: its `prev`, and its `seq` if the
/// genesis says.
fn start(genesis: &Genesis) -> Result<(String, Option<u64>), VerifyError> {
    Ok(match genesis {
        Genesis::Fresh => (GENESIS.to_string(), Some(0)),
        Genesis::Hash(h) => (h.to_ascii_lowercase(), None),
        Genesis::After(before) => {
            let (hash, seq) = last_line(before)?;
            (hash, Some(seq + 1))
        }
    })
}

/// A chain being verified, line by line.
struct Chain<'a> {
    files: &'a [PathBuf],
    options: &'a VerifyOptions,
    summary: VerifySummary,
    /// The hash the next line's `prev` must be.
    prev: String,
    /// The seq the next line must have, if known.
    next_seq: Option<u64>,
    /// Where the last line was, for a report about what follows it.
    end: (PathBuf, usize),
}

impl Chain<'_> {
    /// Verifies every line of `files[index]`.
    fn file(&mut self, index: usize) -> Result<(), VerifyError> {
        let path = &self.files[index];
        let bytes = read(path)?;
        let complete = bytes.ends_with(b"\n");
        let text = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        if text.is_empty() {
            return Ok(());
        }
        let count = text.split(|&b| b == b'\n').count();
        for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
            let line_no = i + 1;
            let cut = !complete && line_no == count;
            self.line(index, line_no, raw, cut)
                .map_err(|what| VerifyError {
                    path: path.clone(),
                    line: line_no,
                    what,
                })?;
        }
        Ok(())
    }

    /// Verifies one line and chains the next from it; `cut`: it is the
    /// file's last and no newline ends it.
    fn line(&mut self, index: usize, line_no: usize, raw: &[u8], cut: bool) -> Result<(), String> {
        let (line, parsed) = parse_line(raw, cut)?;
        let hash = line_hash(line);
        check_seal(line, &parsed, &hash)?;
        if parsed.prev() != self.prev {
            return Err(broken_link(
                &self.summary,
                &self.options.genesis,
                self.files,
                index,
                line_no,
                &parsed,
                &self.prev,
            ));
        }
        if let Some(expected) = self.next_seq {
            if parsed.seq() != expected {
                return Err(format!(
                    "seq is {} where {expected} was expected: a line was removed, inserted or moved",
                    parsed.seq()
                ));
            }
        }
        self.count(&parsed)?;
        if let Some((seq, Some(anchored))) = &self.options.anchor {
            if parsed.seq() == *seq && !anchored.eq_ignore_ascii_case(&hash) {
                return Err(format!(
                    "seq {seq} has hash {hash}, not {anchored} as anchored: this line, or one before it, was changed after the anchor was taken"
                ));
            }
        }
        self.prev = hash;
        self.next_seq = Some(parsed.seq().wrapping_add(1));
        self.summary.first_seq.get_or_insert(parsed.seq());
        self.summary.last_seq = Some(parsed.seq());
        self.end = (self.files[index].clone(), line_no);
        Ok(())
    }

    /// Counts a line into the summary, verifying a checkpoint's signature
    /// if there are keys.
    fn count(&mut self, parsed: &AuditLine) -> Result<(), String> {
        match parsed {
            AuditLine::Checkpoint(checkpoint) => {
                if let Some(keys) = &self.options.keys {
                    keys.check(checkpoint)?;
                }
                self.summary.checkpoints += 1;
                self.summary.last_checkpoint = Some(checkpoint.seq);
                self.summary.unanchored = 0;
            }
            AuditLine::Record(_) => {
                self.summary.records += 1;
                self.summary.unanchored += 1;
            }
        }
        Ok(())
    }

    /// The log reaches the anchored seq, if there is an anchor: a shorter
    /// one was cut.
    fn reaches_anchor(&self) -> Result<(), VerifyError> {
        let Some((seq, _)) = &self.options.anchor else {
            return Ok(());
        };
        if self.summary.last_seq.is_none_or(|last| last < *seq) {
            let ends = self
                .summary
                .last_seq
                .map_or("the log is empty".to_string(), |l| {
                    format!("the log ends at seq {l}")
                });
            return Err(VerifyError {
                path: self.end.0.clone(),
                line: self.end.1 + 1,
                what: format!(
                    "{ends}, but seq {seq} was anchored: lines were cut off its end (or a rotated file is missing)"
                ),
            });
        }
        Ok(())
    }
}

/// A line as text and as the record it is; `cut`: no newline ends it.
fn parse_line(raw: &[u8], cut: bool) -> Result<(&str, AuditLine), String> {
    let line = std::str::from_utf8(raw)
        .map_err(|_| "not UTF-8: the line was damaged or is not from an audit log".to_string())?;
    if line.trim().is_empty() {
        return Err("empty line: audit logs have none; a line was blanked or removed".into());
    }
    let parsed = AuditLine::parse(line).map_err(|e| {
        if cut {
            "the last line is incomplete (no newline ends it): the file was cut mid-line, or sluice is writing it right now".to_string()
        } else {
            format!("not an audit record ({e}): the line was edited or damaged")
        }
    })?;
    Ok((line, parsed))
}

/// The line's own `hash`, if it has one, is its last member and the hash of
/// the rest.
fn check_seal(line: &str, parsed: &AuditLine, hash: &str) -> Result<(), String> {
    match (unseal(line).1, parsed.hash()) {
        (Some(claimed), _) if claimed != hash => Err(format!(
            "the line's hash {claimed} is not the hash of its content ({hash}): this line was edited after it was written"
        )),
        (None, Some(_)) => {
            Err("the hash is not the line's last member: the line was edited".into())
        }
        _ => Ok(()),
    }
}

/// Why a line's `prev` is not the hash of the line before it.
fn broken_link(
    summary: &VerifySummary,
    genesis: &Genesis,
    files: &[PathBuf],
    index: usize,
    line_no: usize,
    line: &AuditLine,
    prev: &str,
) -> String {
    let first = summary.first_seq.is_none();
    if first {
        return match genesis {
            Genesis::Fresh => format!(
                "the first line chains from {}, not from a fresh log's genesis (64 zeros): \
                 lines were removed from the start, or this file was started by rotation \
                 (verify it with the file before it: --after FILE.1, or --genesis {})",
                line.prev(),
                line.prev()
            ),
            _ => format!(
                "the first line chains from {}, but the genesis given is {prev}: \
                 this file does not follow the one given, or lines were removed from its start",
                line.prev()
            ),
        };
    }
    if line_no == 1 && index > 0 {
        return format!(
            "the first line does not chain from the last line of {}: \
             a file of the rotated set is missing, out of order or was edited at its end",
            files[index - 1].display()
        );
    }
    let before = line_no.saturating_sub(1);
    match line {
        AuditLine::Checkpoint(_) => format!(
            "the checkpoint's prev is not the hash of line {before}: \
             the lines it signed were changed, removed or reordered after it was written"
        ),
        AuditLine::Record(_) => format!(
            "prev does not match the hash of the line before: \
             line {before} was edited, or a line was inserted, removed or moved here"
        ),
    }
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
    let record = AuditLine::parse(last).map_err(|e| VerifyError {
        path: path.to_path_buf(),
        line: count,
        what: format!("last line is not an audit record: {e}"),
    })?;
    Ok((line_hash(last), record.seq()))
}
