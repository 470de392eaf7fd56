//! The single writer task that owns the audit file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use prometheus::IntCounter;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::record::{line_hash, AuditEvent, AuditRecord, GENESIS};
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
}

/// Check, before anything depends on it, that the audit log at `path` can
/// be opened for appending (creating it if missing).
pub fn check_writable(path: &Path) -> Result<(), AuditError> {
    open_append(path).map(drop)
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
    pub async fn run(self) -> Result<u64, AuditError> {
        self.run_until(Watch::never()).await
    }

    /// [`run`](Self::run) as a task of a drain: records keep being written
    /// while the drain waits for the producers to go; at its deadline the
    /// writer stops and says how many records it could not write.
    pub async fn run_until(mut self, drain: Watch) -> Result<u64, AuditError> {
        let Some(path) = self.path.clone() else {
            let mut n = 0;
            while self.rx.recv().await.is_some() {
                n += 1;
            }
            return Ok(n);
        };
        let (mut prev, mut seq) = chain_tail(&path).await;
        let mut file = open_append(&path)?;
        let mut size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut written = 0;
        let mut buf = Vec::with_capacity(64 * 1024);
        loop {
            let event = tokio::select! {
                // Past the deadline, stop at once rather than race the queue.
                biased;
                _ = drain.overdue() => {
                    file.sync_data().ok();
                    return Err(AuditError::Unwritten {
                        path,
                        records: self.rx.len(),
                    });
                }
                event = self.rx.recv() => match event {
                    Some(event) => event,
                    None => break,
                },
            };
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
                        (file, buf) = write_out(file, buf, &path, &self.rx, &drain).await?;
                        file.sync_data().ok();
                        match rotate_files(&path, rotation.keep) {
                            Ok(()) => file = open_append(&path)?,
                            // Records matter more than file sizes: write on
                            // in this file and try again after another
                            // max_bytes.
                            Err(source) => tracing::error!(
                                error = %AuditError::Rotate { path: path.clone(), source },
                                "writing on in the current audit file"
                            ),
                        }
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
            (file, buf) = write_out(file, buf, &path, &self.rx, &drain).await?;
        }
        file.sync_data().ok();
        Ok(written)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes `accept` bytes per write, and fails the first `failures`
    /// writes after taking part of them (as a filling disk does).
    struct FillingDisk {
        written: Vec<u8>,
        failures: usize,
        accept: usize,
    }

    impl Write for FillingDisk {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.failures > 0 {
                self.failures -= 1;
                return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = buf.len().min(self.accept);
            self.written.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn open_channel() -> (mpsc::Sender<AuditEvent>, mpsc::Receiver<AuditEvent>) {
        mpsc::channel(1)
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_is_retried_until_every_byte_is_written_once() {
        let (_tx, rx) = open_channel();
        let records = b"{\"seq\":0}\n{\"seq\":1}\n".to_vec();
        let disk = FillingDisk {
            written: Vec::new(),
            failures: 3,
            accept: 5,
        };
        let (disk, rest) = write_out(
            disk,
            records.clone(),
            Path::new("audit.jsonl"),
            &rx,
            &Watch::never(),
        )
        .await
        .unwrap();
        assert!(rest.is_empty());
        assert_eq!(disk.written, records);
    }

    #[tokio::test(start_paused = true)]
    async fn at_shutdown_a_write_that_keeps_failing_gives_up_and_says_how_much_was_lost() {
        let (tx, rx) = open_channel();
        drop(tx);
        let disk = FillingDisk {
            written: Vec::new(),
            failures: usize::MAX,
            accept: 5,
        };
        let err = write_out(
            disk,
            vec![b'x'; 42],
            Path::new("audit.jsonl"),
            &rx,
            &Watch::never(),
        )
        .await
        .err()
        .unwrap();
        assert!(
            matches!(err, AuditError::Write { lost_bytes: 42, .. }),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_drain_deadline_a_failing_write_gives_up_though_producers_remain() {
        let (_producer, rx) = open_channel();
        let (trigger, drain) = crate::drain::trigger();
        trigger.overdue();
        let disk = FillingDisk {
            written: Vec::new(),
            failures: usize::MAX,
            accept: 5,
        };
        let err = write_out(disk, vec![b'x'; 42], Path::new("audit.jsonl"), &rx, &drain)
            .await
            .err()
            .unwrap();
        assert!(
            matches!(err, AuditError::Write { lost_bytes: 42, .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn at_the_drain_deadline_the_writer_says_how_many_records_it_did_not_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let (log, writer) = AuditWriter::new(Some(&path));
        let (trigger, drain) = crate::drain::trigger();
        // The drain is overdue before the writer ever runs, and a producer
        // is still alive: the queued records are reported, not waited for.
        trigger.overdue();
        for _ in 0..3 {
            log.record(AuditEvent {
                sandbox: "sb".into(),
                path: crate::workload::WorkloadPath::Host,
                verdict: "deny",
                rule: None,
                reason: "no-rule",
                proto: super::super::record::Proto::Tcp,
                src: None,
                dst: None,
                host: None,
                bundle: "b@1".into(),
            })
            .await;
        }
        let err = writer.run_until(drain).await.unwrap_err();
        assert!(
            matches!(err, AuditError::Unwritten { records: 3, .. }),
            "{err}"
        );
        drop(log);
    }

    #[test]
    fn an_unwritable_path_is_refused_before_anything_runs() {
        let err = check_writable(Path::new("/nonexistent-dir/audit.jsonl")).unwrap_err();
        assert!(
            err.to_string().contains("check that its directory exists"),
            "{err}"
        );
    }
}
