//! The single writer task that owns the audit file.

use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::record::{line_hash, AuditEvent, AuditRecord, GENESIS};

/// Records queued before producers start waiting.
const CHANNEL_CAPACITY: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot open audit log {path}: {source}; check that its directory exists and is writable")]
    Open {
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
}

impl AuditLog {
    /// Queue one record; waits (never drops) when the writer is behind.
    pub async fn record(&self, event: AuditEvent) {
        if self.tx.send(event).await.is_err() {
            // The writer only stops at shutdown after all senders are gone,
            // so this means it failed; it logged why.
            tracing::error!("audit writer is gone; a record could not be written");
        }
    }
}

/// The consumer side: run it as one task until every `AuditLog` is dropped.
pub struct AuditWriter {
    rx: mpsc::Receiver<AuditEvent>,
    path: Option<PathBuf>,
}

impl AuditWriter {
    /// A log appending to `path` (or, with `None`, discarding records after
    /// counting them, for runs without `--audit`).
    pub fn new(path: Option<&Path>) -> (AuditLog, AuditWriter) {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        (
            AuditLog { tx },
            AuditWriter {
                rx,
                path: path.map(Path::to_path_buf),
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
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .await
            .map_err(|source| AuditError::Open {
                path: path.clone(),
                source,
            })?;
        let mut written = 0;
        let mut buf = Vec::with_capacity(64 * 1024);
        while let Some(event) = self.rx.recv().await {
            // Drain whatever else is queued into one write.
            let mut next = Some(event);
            while let Some(event) = next.take() {
                let record = AuditRecord::new(event, now_rfc3339(), seq, prev);
                let line = serde_json::to_string(&record).expect("audit record serializes");
                prev = line_hash(&line);
                seq += 1;
                written += 1;
                buf.extend_from_slice(line.as_bytes());
                buf.push(b'\n');
                if buf.len() < 60 * 1024 {
                    next = self.rx.try_recv().ok();
                }
            }
            let io = async {
                file.write_all(&buf).await?;
                file.flush().await
            };
            io.await.map_err(|source| AuditError::Write {
                path: path.clone(),
                source,
            })?;
            buf.clear();
        }
        file.sync_data().await.ok();
        Ok(written)
    }
}

/// The hash and next seq to continue an existing log with.
async fn chain_tail(path: &Path) -> (String, u64) {
    let Ok(text) = tokio::fs::read_to_string(path).await else {
        return (GENESIS.to_string(), 0);
    };
    let Some(last) = text.lines().rev().find(|l| !l.trim().is_empty()) else {
        return (GENESIS.to_string(), 0);
    };
    let seq = serde_json::from_str::<AuditRecord>(last)
        .map(|r| r.seq + 1)
        .unwrap_or(0);
    (line_hash(last), seq)
}

pub(crate) fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| now.unix_timestamp().to_string())
}
