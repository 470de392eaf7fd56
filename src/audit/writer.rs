//! The single writer task that owns the audit file.

use std::path::{Path, PathBuf};

use prometheus::IntCounter;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::record::{line_hash, AuditEvent, AuditRecord, GENESIS};
use super::rotate::{rotate_files, rotated_path, Rotation};

/// Records queued before producers start waiting.
const CHANNEL_CAPACITY: usize = 4096;

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
    #[error("cannot write audit log {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The producer side: cheap to clone, shared by every connection task.
#[derive(Clone)]
pub struct AuditLog {
    tx: mpsc::Sender<AuditEvent>,
    waits: Option<IntCounter>,
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
}

fn writer_gone() {
    // The writer only stops at shutdown after all senders are gone, so this
    // means it failed; it logged why.
    tracing::error!("audit writer is gone; a record could not be written");
}

/// How the writer keeps its file: rotation, and the wait counter.
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
}

/// The consumer side: run it as one task until every `AuditLog` is dropped.
pub struct AuditWriter {
    rx: mpsc::Receiver<AuditEvent>,
    path: Option<PathBuf>,
    rotation: Option<Rotation>,
}

impl AuditWriter {
    /// A log appending to `path` (or, with `None`, discarding records after
    /// counting them, for runs without `--audit`).
    pub fn new(path: Option<&Path>) -> (AuditLog, AuditWriter) {
        AuditWriter::with_options(path, AuditOptions::default())
    }

    /// `new` with rotation by size and a wait counter.
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
        (
            AuditLog {
                tx,
                waits: options.wait_counter,
            },
            AuditWriter {
                rx,
                path: path.map(Path::to_path_buf),
                rotation,
            },
        )
    }

    /// Write records until all producers are gone. Continues an existing
    /// file's chain (its last line's hash and seq).
    pub async fn run(mut self) -> Result<u64, AuditError> {
        let Some(path) = self.path.clone() else {
            let mut n = 0;
            while self.rx.recv().await.is_some() {
                n += 1;
            }
            return Ok(n);
        };
        let (mut prev, mut seq) = chain_tail(&path).await;
        let mut file = open_append(&path).await?;
        let mut size = file.metadata().await.map(|m| m.len()).unwrap_or(0);
        let mut written = 0;
        let mut buf = Vec::with_capacity(64 * 1024);
        while let Some(event) = self.rx.recv().await {
            // Drain whatever else is queued into one write.
            let mut next = Some(event);
            while let Some(event) = next.take() {
                let record = AuditRecord::new(event, now_rfc3339(), seq, prev);
                let line = serde_json::to_string(&record).expect("audit record serializes");
                if let Some(rotation) = self.rotation {
                    let pending = size + buf.len() as u64;
                    if pending > 0 && pending + line.len() as u64 + 1 > rotation.max_bytes {
                        // This line would overflow the file: finish it and
                        // start the next one. `prev` and `seq` carry over, so
                        // the new file's first line chains from this one's last.
                        write_out(&mut file, &mut buf, &path).await?;
                        file.sync_data().await.ok();
                        rotate_files(&path, rotation.keep).map_err(|source| {
                            AuditError::Rotate {
                                path: path.clone(),
                                source,
                            }
                        })?;
                        file = open_append(&path).await?;
                        size = 0;
                    }
                }
                prev = line_hash(&line);
                seq += 1;
                written += 1;
                buf.extend_from_slice(line.as_bytes());
                buf.push(b'\n');
                if buf.len() < 60 * 1024 {
                    next = self.rx.try_recv().ok();
                }
            }
            size += buf.len() as u64;
            write_out(&mut file, &mut buf, &path).await?;
        }
        file.sync_data().await.ok();
        Ok(written)
    }
}

/// Write and flush `buf`, then clear it.
async fn write_out(
    file: &mut tokio::fs::File,
    buf: &mut Vec<u8>,
    path: &Path,
) -> Result<(), AuditError> {
    let io = async {
        file.write_all(buf).await?;
        file.flush().await
    };
    io.await.map_err(|source| AuditError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    buf.clear();
    Ok(())
}

async fn open_append(path: &Path) -> Result<tokio::fs::File, AuditError> {
    tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await
        .map_err(|source| AuditError::Open {
            path: path.to_path_buf(),
            source,
        })
}

/// The hash and next seq to continue an existing log with: its last line,
/// or, when FILE is empty or missing right after a rotation, FILE.1's.
async fn chain_tail(path: &Path) -> (String, u64) {
    for candidate in [path.to_path_buf(), rotated_path(path, 1)] {
        if let Some(tail) = last_line_chain(&candidate).await {
            return tail;
        }
    }
    (GENESIS.to_string(), 0)
}

async fn last_line_chain(path: &Path) -> Option<(String, u64)> {
    let text = tokio::fs::read_to_string(path).await.ok()?;
    let last = text.lines().rev().find(|l| !l.trim().is_empty())?;
    let seq = serde_json::from_str::<AuditRecord>(last)
        .map(|r| r.seq + 1)
        .unwrap_or(0);
    Some((line_hash(last), seq))
}

pub(crate) fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| now.unix_timestamp().to_string())
}
