//! Writing and reading timing files. `.csv` (a header row, then one row per
//! record) or anything else as JSONL; readers sniff the content, so either
//! can be read back whatever its name.
//!
//! A run's file is created afresh (truncated) when the writer starts.
//! Rows reach the file in batches, at most [`FLUSH_AFTER`] after their
//! connection ended, and all of them when the writer stops.
//! Backpressure is the audit log's: a bounded queue, and a producer that
//! finds it full waits; no record is dropped.

use std::io::Write;
use std::path::{Path, PathBuf};

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::TimingRecord;
use crate::drain::Watch;

const CHANNEL_CAPACITY: usize = 4096;

/// How long a row may wait in memory before it is written, and how many
/// bytes of rows are written at once at most.
pub(crate) const FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(50);
const FLUSH_AT: usize = 60 * 1024;

/// The CSV header (DESIGN.md's field order).
pub const CSV_HEADER: &str = "id,sandbox,path,dst,host,verdict,start,decide_us,connect_us,first_byte_us,total_us,bytes_up,bytes_down,reason";

#[derive(Debug, thiserror::Error)]
pub enum TimingError {
    #[error("cannot open timings file {path}: {source}; check that its directory exists and is writable")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write timings file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("timings file {path} is incomplete: {records} records were still queued at the shutdown deadline and were not written")]
    Unwritten { path: PathBuf, records: usize },
    #[error("cannot read timings {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {what}")]
    Parse {
        path: PathBuf,
        line: usize,
        what: String,
    },
}

/// The producer side. `disabled()` costs nothing per record.
#[derive(Clone, Default)]
pub struct TimingLog {
    tx: Option<mpsc::Sender<TimingRecord>>,
}

impl TimingLog {
    /// A log that discards records (no `--timings`).
    pub(crate) fn disabled() -> TimingLog {
        TimingLog { tx: None }
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Queue one record, waiting while the writer is behind.
    pub async fn record(&self, record: TimingRecord) {
        if let Some(tx) = &self.tx {
            if tx.send(record).await.is_err() {
                tracing::error!("timings writer is gone; a record could not be written");
            }
        }
    }

    /// Queue one record from synchronous code (a guard's `Drop`): queued at
    /// once, or, when the queue is full, by a task that waits for room (the
    /// record is still not dropped). Must run inside a tokio runtime.
    pub fn submit(&self, record: TimingRecord) {
        let Some(tx) = &self.tx else {
            return;
        };
        match tx.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(record)) => {
                let tx = tx.clone();
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn(async move {
                            let _ = tx.send(record).await;
                        });
                    }
                    Err(_) => {
                        let _ = tx.blocking_send(record);
                    }
                }
            }
            Err(TrySendError::Closed(_)) => {
                tracing::error!("timings writer is gone; a record could not be written");
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Csv,
    Jsonl,
}

fn format_for(path: &Path) -> Format {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("csv") => Format::Csv,
        _ => Format::Jsonl,
    }
}

/// Check, before anything depends on it, that a timings file can be
/// created at `path` (the writer truncates it when it starts).
pub(crate) fn check_writable(path: &Path) -> Result<(), TimingError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(drop)
        .map_err(|source| TimingError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// The consumer side: one task writing `path` until every `TimingLog` is
/// dropped.
pub struct TimingWriter {
    rx: mpsc::Receiver<TimingRecord>,
    path: PathBuf,
}

impl TimingWriter {
    pub fn new(path: &Path) -> (TimingLog, TimingWriter) {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        (
            TimingLog { tx: Some(tx) },
            TimingWriter {
                rx,
                path: path.to_path_buf(),
            },
        )
    }

    /// Write until all producers are gone; returns the records written.
    pub async fn run(self) -> Result<u64, TimingError> {
        self.run_until(Watch::never()).await
    }

    /// [`run`](Self::run) as a task of a drain: at the drain's deadline the
    /// writer stops and says how many records it could not write.
    pub(crate) async fn run_until(mut self, drain: Watch) -> Result<u64, TimingError> {
        let path = self.path.clone();
        let write_err = |source| TimingError::Write {
            path: path.clone(),
            source,
        };
        // Written with plain write(2) on this task's thread: an append to
        // the page cache takes microseconds, while tokio::fs would hand each
        // write to a blocking-pool thread and back (two wake-ups and a
        // context switch each way, several microseconds of CPU for every
        // connection or two).
        let mut file = std::fs::File::create(&path).map_err(|source| TimingError::Open {
            path: path.clone(),
            source,
        })?;
        let format = format_for(&path);
        let mut buf = String::with_capacity(64 * 1024);
        if format == Format::Csv {
            buf.push_str(CSV_HEADER);
            buf.push('\n');
        }
        let mut written = 0;
        // Rows wait in `buf` for up to FLUSH_AFTER (or until FLUSH_AT bytes)
        // and go out in one write(2): a write per connection was the one
        // system call sluice made per connection that a plain proxy does
        // not (about 0.7 a connection at 8 in flight). One timer per window,
        // armed only while rows wait.
        let window = tokio::time::sleep(FLUSH_AFTER);
        tokio::pin!(window);
        let mut waiting = false;
        loop {
            let record = tokio::select! {
                // Past the deadline, stop at once rather than race the queue.
                biased;
                _ = drain.overdue() => {
                    let _ = file.write_all(buf.as_bytes());
                    return Err(TimingError::Unwritten {
                        path: path.clone(),
                        records: self.rx.len(),
                    });
                }
                record = self.rx.recv() => match record {
                    Some(record) => Some(record),
                    None => break,
                },
                () = &mut window, if waiting => None,
            };
            if let Some(record) = record {
                let mut next = Some(record);
                while let Some(record) = next.take() {
                    match format {
                        Format::Csv => push_csv(&mut buf, &record),
                        Format::Jsonl => {
                            buf.push_str(
                                &serde_json::to_string(&record).expect("timing record serializes"),
                            );
                            buf.push('\n');
                        }
                    }
                    written += 1;
                    if buf.len() < FLUSH_AT {
                        next = self.rx.try_recv().ok();
                    }
                }
                if buf.len() < FLUSH_AT {
                    if !waiting {
                        window
                            .as_mut()
                            .reset(tokio::time::Instant::now() + FLUSH_AFTER);
                        waiting = true;
                    }
                    continue;
                }
            }
            file.write_all(buf.as_bytes()).map_err(write_err)?;
            buf.clear();
            waiting = false;
        }
        if !buf.is_empty() {
            file.write_all(buf.as_bytes()).map_err(write_err)?;
        }
        file.sync_data().ok();
        Ok(written)
    }
}

/// Append one record as a CSV row.
pub(crate) fn push_csv(buf: &mut String, r: &TimingRecord) {
    use std::fmt::Write;
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    let _ = writeln!(
        buf,
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
        r.id,
        csv_field(&r.sandbox),
        csv_field(&r.path),
        csv_field(&r.dst),
        csv_field(r.host.as_deref().unwrap_or("")),
        csv_field(&r.verdict),
        r.start,
        opt(r.decide_us),
        opt(r.connect_us),
        opt(r.first_byte_us),
        r.total_us,
        r.bytes_up,
        r.bytes_down,
        csv_field(&r.reason)
    );
}

fn csv_field(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\"")).into()
    } else {
        s.into()
    }
}

/// Read a timing file, CSV or JSONL (sniffed from its first character).
pub fn read_file(path: &Path) -> Result<Vec<TimingRecord>, TimingError> {
    let text = std::fs::read_to_string(path).map_err(|source| TimingError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let parse_err = |line: usize, what: String| TimingError::Parse {
        path: path.to_path_buf(),
        line,
        what,
    };
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    if trimmed.starts_with('{') {
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            out.push(serde_json::from_str(line).map_err(|e| parse_err(i + 1, e.to_string()))?);
        }
        return Ok(out);
    }
    let rows = parse_csv(&text);
    let Some((header, rows)) = rows.split_first() else {
        return Ok(Vec::new());
    };
    let col = |name: &str| header.iter().position(|h| h.trim() == name);
    let required = |name: &str| {
        col(name).ok_or_else(|| {
            parse_err(
                1,
                format!("the header has no `{name}` column (expected {CSV_HEADER})"),
            )
        })
    };
    let cols = [required("id")?, required("total_us")?];
    let opt_cols = [
        "sandbox",
        "path",
        "dst",
        "host",
        "verdict",
        "start",
        "decide_us",
        "connect_us",
        "first_byte_us",
        "bytes_up",
        "bytes_down",
        "reason",
    ]
    .map(col);
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let line = i + 2;
        if row.len() == 1 && row[0].is_empty() {
            continue;
        }
        let get = |c: Option<usize>| c.and_then(|c| row.get(c)).map(String::as_str).unwrap_or("");
        let num = |c: Option<usize>, name: &str| -> Result<Option<u64>, TimingError> {
            let v = get(c).trim();
            if v.is_empty() {
                return Ok(None);
            }
            v.parse()
                .map(Some)
                .map_err(|_| parse_err(line, format!("`{name}` is `{v}`, not a whole number")))
        };
        let [sandbox, path_c, dst, host, verdict, start, decide, connect, first, up, down, reason] =
            opt_cols;
        out.push(TimingRecord {
            id: num(Some(cols[0]), "id")?.unwrap_or(0),
            sandbox: get(sandbox).to_string(),
            path: get(path_c).to_string(),
            dst: get(dst).to_string(),
            host: Some(get(host).to_string()).filter(|h| !h.is_empty()),
            verdict: get(verdict).to_string(),
            start: num(start, "start")?.unwrap_or(0),
            decide_us: num(decide, "decide_us")?,
            connect_us: num(connect, "connect_us")?,
            first_byte_us: num(first, "first_byte_us")?,
            total_us: num(Some(cols[1]), "total_us")?
                .ok_or_else(|| parse_err(line, "`total_us` is empty".into()))?,
            bytes_up: num(up, "bytes_up")?.unwrap_or(0),
            bytes_down: num(down, "bytes_down")?.unwrap_or(0),
            reason: get(reason).to_string(),
        });
    }
    Ok(out)
}

/// RFC 4180-ish: quoted fields may hold commas, quotes ("") and newlines.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                c => field.push(c),
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            ',' => row.push(std::mem::take(&mut field)),
            '\r' => {}
            '\n' => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            c => field.push(c),
        }
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn record(id: u64) -> TimingRecord {
        TimingRecord {
            id,
            sandbox: "sb".into(),
            path: "host".into(),
            dst: "198.18.0.1:8080".into(),
            host: None,
            verdict: "allow".into(),
            reason: "allow-rule".into(),
            start: 0,
            decide_us: Some(1),
            connect_us: Some(2),
            first_byte_us: Some(3),
            total_us: 4,
            bytes_up: 5,
            bytes_down: 6,
        }
    }

    #[tokio::test]
    async fn at_the_drain_deadline_the_writer_says_how_many_records_it_did_not_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("timings.csv");
        let (log, writer) = TimingWriter::new(&path);
        let (trigger, drain) = crate::drain::trigger();
        // The drain is overdue before the writer ever runs, and a producer
        // is still alive: the queued records are reported, not waited for.
        trigger.overdue();
        for id in 0..3 {
            log.record(record(id)).await;
        }
        let err = writer.run_until(drain).await.unwrap_err();
        assert!(
            matches!(err, TimingError::Unwritten { records: 3, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("3 records"), "{err}");
        // What it had (the header) is in the file; none of the records are.
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{CSV_HEADER}\n")
        );
        drop(log);
    }

    fn rows(path: &Path) -> usize {
        let text = std::fs::read_to_string(path).unwrap();
        text.lines().filter(|l| *l != CSV_HEADER).count()
    }

    #[tokio::test(start_paused = true)]
    async fn a_row_waits_at_most_the_flush_window_while_producers_live() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("timings.csv");
        let (log, writer) = TimingWriter::new(&path);
        let writing = tokio::spawn(writer.run());
        log.record(record(1)).await;
        log.record(record(2)).await;
        // (The clock is paused: each sleep ends only once every task that
        // could run has run.)
        tokio::time::sleep(FLUSH_AFTER - Duration::from_millis(1)).await;
        assert_eq!(rows(&path), 0, "written before the window closed");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(rows(&path), 2, "not written when the window closed");
        // A later row opens a window of its own.
        log.record(record(3)).await;
        tokio::time::sleep(FLUSH_AFTER + Duration::from_millis(1)).await;
        assert_eq!(rows(&path), 3);
        drop(log);
        assert_eq!(writing.await.unwrap().unwrap(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn every_row_is_written_at_once_when_the_last_producer_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("timings.jsonl");
        let (log, writer) = TimingWriter::new(&path);
        let writing = tokio::spawn(writer.run());
        for id in 0..5 {
            log.record(record(id)).await;
        }
        drop(log);
        // No time passes: the writer does not wait out its window.
        assert_eq!(writing.await.unwrap().unwrap(), 5);
        assert_eq!(read_file(&path).unwrap().len(), 5);
    }
}
