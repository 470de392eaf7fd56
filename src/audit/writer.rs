//! The single writer task that owns the audit file: it chains and seals
//! every line, signs checkpoints when they are due, rotates the file, and
//! publishes the head it wrote. It never drops a record: a failing write is
//! retried with the bytes kept, and the queue makes producers wait.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntGauge};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::time::Instant;

use super::checkpoint::{AuditKey, KeyError};
use super::head::{Anchor, AuditHead, HeadCell};
use super::record::{line_hash, seal, AuditEvent, AuditLine, AuditRecord, GENESIS};
use super::rotate::{rotate_files, rotated_path, Rotation};
use crate::drain::Watch;

/// Records queued before producers start waiting.
const CHANNEL_CAPACITY: usize = 4096;

/// A failed write (disk full, I/O error) is retried this often, keeping the
/// records: producers wait on the full queue meanwhile rather than records
/// being lost.
const RETRY_EVERY: Duration = Duration::from_secs(1);
/// Once every producer is gone (shutdown), a failing write is retried this
/// many more times before the writer gives up and says how much was lost.
const RETRIES_AT_SHUTDOWN: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(
        "cannot open audit log {path}: {source}; check that its directory exists and is writable"
    )]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot rotate audit log {path}: {source}; check that its directory is writable")]
    Rotate {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot write audit log {path}: {source}; {lost_bytes} bytes of records were not written"
    )]
    Write {
        path: PathBuf,
        source: std::io::Error,
        lost_bytes: usize,
    },
    #[error("audit log {path} is incomplete: {records} records were still queued at the shutdown deadline and were not written")]
    Unwritten { path: PathBuf, records: usize },
    /// The checkpoint signing key cannot be used.
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// Check, before anything depends on it, that the audit log at `path` can
/// be opened for appending (creating it if missing).
pub(crate) fn check_writable(path: &Path) -> Result<(), AuditError> {
    open_append(path).map(drop)
}

/// The producer side: cheap to clone, shared by every connection task.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<AuditEvent>,
    waits: Option<IntCounter>,
    head: Arc<HeadCell>,
}

impl AuditLog {
    /// Queue one record; waits (never drops) when the writer is behind, and
    /// counts the wait (`sluice_audit_waits_total`).
    pub async fn record(&self, event: AuditEvent) {
        let event = match self.tx.try_send(event) {
            Ok(()) => return,
            Err(TrySendError::Full(event)) => {
                if let Some(waits) = &self.waits {
                    waits.inc();
                }
                event
            }
            Err(TrySendError::Closed(_)) => {
                writer_gone();
                return;
            }
        };
        if self.tx.send(event).await.is_err() {
            writer_gone();
        }
    }

    /// The newest line and checkpoint written so far.
    pub fn head(&self) -> AuditHead {
        self.head.get()
    }
}

fn writer_gone() {
    // The writer only stops at shutdown after all senders are gone, so this
    // means it failed; it logged why.
    tracing::error!("audit writer is gone; a record could not be written");
}

/// When the writer signs a checkpoint (and it always does at shutdown).
#[derive(Debug, Clone)]
pub struct CheckpointOptions {
    pub key: Arc<AuditKey>,
    /// After this many records since the last checkpoint (0: not by count).
    pub every_records: u64,
    /// When a record has waited this long for one (zero: not by time).
    pub interval: Duration,
}

/// Records between checkpoints unless told otherwise.
pub(crate) const CHECKPOINT_EVERY_RECORDS: u64 = 1000;
/// The longest a record waits for a checkpoint unless told otherwise.
pub(crate) const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(10);

/// How the writer keeps its file: rotation, checkpoints, and the metrics
/// it updates.
#[derive(Clone, Default)]
pub struct AuditOptions {
    /// Rotate when the file reaches this many bytes (`None`: never).
    pub max_bytes: Option<u64>,
    /// Rotated files kept (FILE.1 .. FILE.keep); 0 means the default, 10.
    pub keep: usize,
    /// Counts the times a producer found the queue full.
    pub wait_counter: Option<IntCounter>,
    /// Queue length before producers wait; 0 means the default, 4096.
    pub capacity: usize,
    /// Signed checkpoints (`None`: none are written).
    pub checkpoints: Option<CheckpointOptions>,
    /// Set to the seq of the newest line written (-1: none yet).
    pub head_gauge: Option<IntGauge>,
    /// Set to the seq of the newest checkpoint written (-1: none yet).
    pub checkpoint_gauge: Option<IntGauge>,
}

/// The consumer side: run it as one task until every `AuditLog` is dropped.
pub struct AuditWriter {
    rx: mpsc::Receiver<AuditEvent>,
    path: Option<PathBuf>,
    rotation: Option<Rotation>,
    checkpoints: Option<CheckpointOptions>,
    head: Arc<HeadCell>,
}

impl AuditWriter {
    /// A log appending to `path` (or, with `None`, discarding records after
    /// counting them, for runs without `--audit`).
    pub fn new(path: Option<&Path>) -> (AuditLog, AuditWriter) {
        AuditWriter::with_options(path, AuditOptions::default())
    }

    /// `new` with rotation by size, checkpoints and metrics.
    pub fn with_options(path: Option<&Path>, options: AuditOptions) -> (AuditLog, AuditWriter) {
        let capacity = if options.capacity == 0 {
            CHANNEL_CAPACITY
        } else {
            options.capacity
        };
        let (tx, rx) = mpsc::channel(capacity);
        let rotation = options.max_bytes.map(|max_bytes| Rotation {
            max_bytes,
            keep: if options.keep == 0 { 10 } else { options.keep },
        });
        let checkpoints = options.checkpoints.filter(|_| path.is_some());
        let head = HeadCell::new(
            path.map(Path::to_path_buf),
            checkpoints.as_ref().map(|c| c.key.id().to_string()),
            options.head_gauge,
            options.checkpoint_gauge,
        );
        (
            AuditLog {
                tx,
                waits: options.wait_counter,
                head: head.clone(),
            },
            AuditWriter {
                rx,
                path: path.map(Path::to_path_buf),
                rotation,
                checkpoints,
                head,
            },
        )
    }

    /// Write records until all producers are gone. Continues an existing
    /// file's chain (its last line's hash and seq).
    pub async fn run(self) -> Result<u64, AuditError> {
        self.run_until(Watch::never()).await
    }

    /// [`run`](Self::run) as a task of a drain: records keep being written
    /// while the drain waits for the producers to go; at its deadline the
    /// writer stops and says how many records it could not write. A
    /// checkpoint is signed every `every_records` records, when a record
    /// has waited `interval` for one, and when the producers are gone (or,
    /// at the deadline, over what was written by then).
    pub(crate) async fn run_until(mut self, drain: Watch) -> Result<u64, AuditError> {
        let Some(path) = self.path.clone() else {
            let mut n = 0;
            while self.rx.recv().await.is_some() {
                n += 1;
            }
            return Ok(n);
        };
        let tail = chain_tail(&path).await;
        self.head
            .written(tail.head.clone(), tail.checkpoint.clone());
        let mut chain = Chain {
            prev: tail.prev,
            seq: tail.next_seq,
            unanchored: tail.unanchored,
            pushed: false,
            checkpoint: None,
            key: self.checkpoints.clone(),
            due: None,
        };
        chain.schedule();
        let mut sink = Sink {
            file: Some(open_append(&path)?),
            size: 0,
            buf: Vec::with_capacity(64 * 1024),
            path,
            rotation: self.rotation,
        };
        sink.size = sink.file().metadata().map(|m| m.len()).unwrap_or(0);
        let mut written = 0;
        loop {
            let first = tokio::select! {
                // Past the deadline, stop at once rather than race the queue,
                // but sign what is already written.
                biased;
                _ = drain.overdue() => {
                    if chain.checkpoint_due() {
                        let line = chain.checkpoint_line();
                        sink.push(&line, &self.rx, &drain).await?;
                        sink.flush(&self.rx, &drain).await?;
                        chain.publish(&self.head);
                    }
                    sink.file().sync_data().ok();
                    return Err(AuditError::Unwritten {
                        path: sink.path,
                        records: self.rx.len(),
                    });
                }
                _ = sleep_until(chain.due) => None,
                event = self.rx.recv() => match event {
                    Some(event) => Some(event),
                    None => break,
                },
            };
            // Drain whatever else is queued into one write.
            let mut next = first;
            while let Some(event) = next.take() {
                let line = chain.record_line(event);
                sink.push(&line, &self.rx, &drain).await?;
                written += 1;
                if chain.count_due() {
                    let line = chain.checkpoint_line();
                    sink.push(&line, &self.rx, &drain).await?;
                }
                if sink.buf.len() < 60 * 1024 {
                    next = self.rx.try_recv().ok();
                }
            }
            if chain.time_due() {
                let line = chain.checkpoint_line();
                sink.push(&line, &self.rx, &drain).await?;
            }
            chain.schedule();
            sink.flush(&self.rx, &drain).await?;
            chain.publish(&self.head);
        }
        // Every producer is gone: anchor what they left.
        if chain.checkpoint_due() {
            let line = chain.checkpoint_line();
            sink.push(&line, &self.rx, &drain).await?;
            sink.flush(&self.rx, &drain).await?;
            chain.publish(&self.head);
        }
        sink.file().sync_data().ok();
        Ok(written)
    }
}

/// Where the chain is, and when the next checkpoint is due.
struct Chain {
    /// The hash of the newest line (the next line's prev).
    prev: String,
    seq: u64,
    /// Lines since the newest checkpoint.
    unanchored: u64,
    /// Lines were pushed since the last `publish` (the newest is seq - 1,
    /// hash `prev`), and the newest checkpoint among them.
    pushed: bool,
    checkpoint: Option<Anchor>,
    key: Option<CheckpointOptions>,
    /// When the records now unanchored have waited `interval`.
    due: Option<Instant>,
}

impl Chain {
    fn record_line(&mut self, event: AuditEvent) -> String {
        let record = AuditRecord::new(event, now_rfc3339(), self.seq, self.prev.clone());
        let body = serde_json::to_string(&record).expect("audit record serializes");
        self.advance(&body, false)
    }

    fn checkpoint_line(&mut self) -> String {
        let key = &self.key.as_ref().expect("checkpoints are configured").key;
        let checkpoint = key.checkpoint(now_rfc3339(), self.seq, self.prev.clone());
        let body = serde_json::to_string(&checkpoint).expect("checkpoint serializes");
        self.advance(&body, true)
    }

    /// Seal `body` as the next line of the chain.
    fn advance(&mut self, body: &str, checkpoint: bool) -> String {
        let (line, hash) = seal(body);
        if checkpoint {
            self.checkpoint = Some(Anchor {
                seq: self.seq,
                hash: hash.clone(),
            });
            self.unanchored = 0;
            self.due = None;
        } else {
            self.unanchored += 1;
        }
        self.pushed = true;
        self.prev = hash;
        self.seq += 1;
        line
    }

    /// Records wait unsigned (at shutdown, every one must be signed).
    fn checkpoint_due(&self) -> bool {
        self.key.is_some() && self.unanchored > 0
    }

    fn count_due(&self) -> bool {
        self.key
            .as_ref()
            .is_some_and(|k| k.every_records > 0 && self.unanchored >= k.every_records)
    }

    fn time_due(&self) -> bool {
        self.checkpoint_due() && self.due.is_some_and(|due| due <= Instant::now())
    }

    /// Start the clock for records that just became unanchored.
    fn schedule(&mut self) {
        let Some(key) = &self.key else { return };
        if self.unanchored > 0 && self.due.is_none() && !key.interval.is_zero() {
            self.due = Some(Instant::now() + key.interval);
        }
    }

    /// What was pushed is written: export it.
    fn publish(&mut self, cell: &HeadCell) {
        let head = std::mem::take(&mut self.pushed).then(|| Anchor {
            seq: self.seq - 1,
            hash: self.prev.clone(),
        });
        cell.written(head, self.checkpoint.take());
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// The file being appended to, the bytes not yet written, and rotation.
struct Sink {
    path: PathBuf,
    /// Only ever None while a write is in progress.
    file: Option<std::fs::File>,
    /// Bytes in the file (as far as rotation is concerned).
    size: u64,
    buf: Vec<u8>,
    rotation: Option<Rotation>,
}

impl Sink {
    fn file(&self) -> &std::fs::File {
        self.file.as_ref().expect("the audit file is open")
    }

    /// Add one line, first rotating if it would take the file past its
    /// limit. `prev` and `seq` carry over a rotation, so the new file's
    /// first line chains from the old one's last.
    async fn push(
        &mut self,
        line: &str,
        rx: &mpsc::Receiver<AuditEvent>,
        drain: &Watch,
    ) -> Result<(), AuditError> {
        if let Some(rotation) = self.rotation {
            let pending = self.size + self.buf.len() as u64;
            if pending > 0 && pending + line.len() as u64 + 1 > rotation.max_bytes {
                self.flush(rx, drain).await?;
                self.file().sync_data().ok();
                match rotate_files(&self.path, rotation.keep) {
                    Ok(()) => self.file = Some(open_append(&self.path)?),
                    // Records matter more than file sizes: write on in this
                    // file and try again after another max_bytes.
                    Err(source) => tracing::error!(
                        error = %AuditError::Rotate { path: self.path.clone(), source },
                        "writing on in the current audit file"
                    ),
                }
                self.size = 0;
            }
        }
        self.buf.extend_from_slice(line.as_bytes());
        self.buf.push(b'\n');
        Ok(())
    }

    /// Write out every pushed line (see [`write_out`]).
    async fn flush(
        &mut self,
        rx: &mpsc::Receiver<AuditEvent>,
        drain: &Watch,
    ) -> Result<(), AuditError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.size += self.buf.len() as u64;
        let file = self.file.take().expect("the audit file is open");
        let buf = std::mem::take(&mut self.buf);
        let (file, buf) = write_out(file, buf, &self.path, rx, drain).await?;
        self.file = Some(file);
        self.buf = buf;
        Ok(())
    }
}

/// Write all of `buf` (on the blocking pool), then clear it. A failure
/// keeps what is not written yet and retries every [`RETRY_EVERY`], so the
/// chain stays whole and no record is lost while the disk is full; only at
/// shutdown does it give up: after [`RETRIES_AT_SHUTDOWN`] once `rx` is
/// closed, or at the drain's deadline.
async fn write_out<F: Write + Send + 'static>(
    mut file: F,
    mut buf: Vec<u8>,
    path: &Path,
    rx: &mpsc::Receiver<AuditEvent>,
    drain: &Watch,
) -> Result<(F, Vec<u8>), AuditError> {
    let mut failures = 0u32;
    loop {
        let blocking = tokio::task::spawn_blocking(move || {
            let written = write_some(&mut file, &buf);
            (file, buf, written)
        });
        let (f, mut b, (written, error)) = match blocking.await {
            Ok(done) => done,
            Err(join) => {
                return Err(AuditError::Write {
                    path: path.to_path_buf(),
                    source: std::io::Error::other(join.to_string()),
                    lost_bytes: 0,
                })
            }
        };
        file = f;
        b.drain(..written);
        buf = b;
        let Some(error) = error else {
            return Ok((file, buf));
        };
        failures += 1;
        if failures % 60 == 1 {
            tracing::error!(
                path = %path.display(),
                %error,
                pending_bytes = buf.len(),
                "cannot write the audit log; retrying every second, and connections that need a record wait until it is written"
            );
        }
        let give_up = (rx.is_closed() && failures > RETRIES_AT_SHUTDOWN)
            || tokio::select! {
                _ = tokio::time::sleep(RETRY_EVERY) => false,
                _ = drain.overdue() => true,
            };
        if give_up {
            return Err(AuditError::Write {
                path: path.to_path_buf(),
                source: error,
                lost_bytes: buf.len(),
            });
        }
    }
}

/// Write as much of `buf` as the file takes: how much, and the error that
/// stopped it short, if any.
fn write_some(file: &mut impl Write, buf: &[u8]) -> (usize, Option<std::io::Error>) {
    let mut done = 0;
    while done < buf.len() {
        match file.write(&buf[done..]) {
            Ok(0) => return (done, Some(std::io::ErrorKind::WriteZero.into())),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (done, Some(e)),
        }
    }
    (done, None)
}

fn open_append(path: &Path) -> Result<std::fs::File, AuditError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| AuditError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// Lines read back from the end of an existing log for its newest
/// checkpoint.
const TAIL_SCAN: usize = 100_000;

/// Where an existing log's chain ends.
struct Tail {
    prev: String,
    next_seq: u64,
    /// Its last line, and its newest checkpoint (in the file read).
    head: Option<Anchor>,
    checkpoint: Option<Anchor>,
    /// Lines after that checkpoint (all of the file's if none).
    unanchored: u64,
}

/// The chain to continue an existing log with: its last line, or, when
/// FILE is empty or missing right after a rotation, FILE.1's.
async fn chain_tail(path: &Path) -> Tail {
    for candidate in [path.to_path_buf(), rotated_path(path, 1)] {
        if let Some(tail) = last_line_chain(&candidate).await {
            return tail;
        }
    }
    Tail {
        prev: GENESIS.to_string(),
        next_seq: 0,
        head: None,
        checkpoint: None,
        unanchored: 0,
    }
}

async fn last_line_chain(path: &Path) -> Option<Tail> {
    let text = tokio::fs::read_to_string(path).await.ok()?;
    let mut lines = text.lines().rev().filter(|l| !l.trim().is_empty());
    let last = lines.next()?;
    let hash = line_hash(last);
    let parsed = AuditLine::parse(last).ok();
    let seq = parsed.as_ref().map_or(0, AuditLine::seq);
    let head = parsed.as_ref().map(|_| Anchor {
        seq,
        hash: hash.clone(),
    });
    // The newest checkpoint, and how many lines came after it. Looked for
    // among the last lines only: a long log that has none (one written
    // before checkpoints) just gets one soon.
    let mut unanchored = 0;
    let mut checkpoint = None;
    for line in std::iter::once(last).chain(lines).take(TAIL_SCAN) {
        if let Ok(AuditLine::Checkpoint(c)) = AuditLine::parse(line) {
            checkpoint = Some(Anchor {
                seq: c.seq,
                hash: line_hash(line),
            });
            break;
        }
        unanchored += 1;
    }
    Some(Tail {
        prev: hash,
        next_seq: parsed.map_or(0, |l| l.seq() + 1),
        head,
        checkpoint,
        unanchored,
    })
}

pub(crate) fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| now.unix_timestamp().to_string())
}

#[cfg(test)]
mod tests;
