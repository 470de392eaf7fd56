//! `sluice audit tail`: print audit records one per line, readably or as
//! the raw JSON, optionally only one verdict, optionally following the file
//! as it grows (and across a rotation).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::record::{AuditLine, AuditRecord, CheckpointRecord};

/// What to print.
#[derive(Debug, Clone)]
pub struct TailOptions {
    /// Keep polling for appended lines (until writing fails, e.g. a closed
    /// pipe).
    pub follow: bool,
    /// Only records with this verdict (deny, would-deny, allow, refused...;
    /// `checkpoint` for the signed checkpoints).
    pub verdict: Option<String>,
    /// Print the raw JSON lines instead of the readable form.
    pub json: bool,
    /// How often `follow` looks for new lines.
    pub poll: Duration,
}

impl Default for TailOptions {
    fn default() -> TailOptions {
        TailOptions {
            follow: false,
            verdict: None,
            json: false,
            poll: Duration::from_millis(250),
        }
    }
}

/// Print `path`'s records to `out`; with `follow`, never returns unless
/// reading or writing fails.
pub fn tail(path: &Path, options: &TailOptions, out: &mut dyn Write) -> io::Result<()> {
    let mut tailer = Tailer::new(path, options.clone());
    loop {
        tailer.poll(out)?;
        out.flush()?;
        if !options.follow {
            return Ok(());
        }
        std::thread::sleep(options.poll);
    }
}

/// One record in the readable form:
/// `ts verdict rule reason proto src -> dst host bundle`.
pub(crate) fn format_record(r: &AuditRecord) -> String {
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
    let proto = serde_json::to_value(r.proto)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    format!(
        "{} {:<10} {} {} {} {} -> {} {} [{} #{}]",
        r.ts,
        r.verdict,
        dash(&r.rule),
        r.reason,
        proto,
        dash(&r.src),
        dash(&r.dst),
        dash(&r.host),
        r.bundle,
        r.seq
    )
}

/// A checkpoint in the readable form:
/// `ts checkpoint key KEY signs seq ..N [#SEQ]`.
pub(crate) fn format_checkpoint(c: &CheckpointRecord) -> String {
    let anchors = match c.seq.checked_sub(1) {
        Some(last) => format!("signs seq ..{last}"),
        None => "signs nothing".to_string(),
    };
    format!(
        "{} {:<10} key {} {anchors} [#{}]",
        c.ts, "checkpoint", c.key, c.seq
    )
}

/// Any line in its readable form.
pub(crate) fn format_line(line: &AuditLine) -> String {
    match line {
        AuditLine::Record(r) => format_record(r),
        AuditLine::Checkpoint(c) => format_checkpoint(c),
    }
}

/// Incremental reader: each `poll` prints the complete lines appended since
/// the last one. Notices a rotation (FILE replaced) and a truncation.
pub struct Tailer {
    path: PathBuf,
    options: TailOptions,
    file: Option<File>,
    ino: u64,
    pos: u64,
    partial: Vec<u8>,
}

impl Tailer {
    pub fn new(path: &Path, options: TailOptions) -> Tailer {
        Tailer {
            path: path.to_path_buf(),
            options,
            file: None,
            ino: 0,
            pos: 0,
            partial: Vec::new(),
        }
    }

    /// Print what was appended; returns the number of records printed. A
    /// missing file prints nothing (it may appear later) unless not
    /// following, where it is an error.
    pub fn poll(&mut self, out: &mut dyn Write) -> io::Result<usize> {
        let mut printed = 0;
        if self.file.is_none() {
            match File::open(&self.path) {
                Ok(f) => {
                    self.ino = f.metadata()?.ino();
                    self.file = Some(f);
                    self.pos = 0;
                    self.partial.clear();
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound && self.options.follow => {
                    return Ok(0)
                }
                Err(e) => return Err(e),
            }
        }
        printed += self.drain(out)?;
        // Rotated (FILE is a new file) or truncated: start over on FILE.
        let replaced = match std::fs::metadata(&self.path) {
            Ok(m) => m.ino() != self.ino || m.len() < self.pos,
            Err(_) => false,
        };
        if replaced {
            self.file = None;
            printed += self.poll(out)?;
        }
        Ok(printed)
    }

    fn drain(&mut self, out: &mut dyn Write) -> io::Result<usize> {
        let Some(file) = self.file.as_mut() else {
            return Ok(0);
        };
        file.seek(SeekFrom::Start(self.pos))?;
        let mut buf = Vec::new();
        let n = file.read_to_end(&mut buf)?;
        self.pos += n as u64;
        self.partial.extend_from_slice(&buf);
        let Some(end) = self.partial.iter().rposition(|&b| b == b'\n') else {
            return Ok(0);
        };
        let complete: Vec<u8> = self.partial.drain(..=end).collect();
        let mut printed = 0;
        for raw in complete.split(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(raw);
            if line.trim().is_empty() {
                continue;
            }
            match AuditLine::parse(&line) {
                Ok(parsed) => {
                    if let Some(v) = &self.options.verdict {
                        if parsed.verdict() != v.as_str() {
                            continue;
                        }
                    }
                    if self.options.json {
                        writeln!(out, "{line}")?;
                    } else {
                        writeln!(out, "{}", format_line(&parsed))?;
                    }
                }
                Err(_) => writeln!(out, "? unreadable line: {line}")?,
            }
            printed += 1;
        }
        Ok(printed)
    }
}
