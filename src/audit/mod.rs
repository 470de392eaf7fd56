//! The audit log: one JSONL line per decision (every deny, allows
//! optional), each sealed with its own hash and chained through `prev`, so
//! that an edited, dropped or reordered line is detectable (`verify`), with
//! signed checkpoints (`checkpoint`) that anchor every line before them
//! under a key the workload cannot read, so that an edit of the newest lines
//! or a cut of the tail shows too; readable with `tail`, rotated by size
//! without breaking the chain (`rotate`); its head exported (`head`).
//!
//! Records travel over a bounded channel to one writer task. When the channel
//! is full, producers wait (and the wait is counted): a record is never
//! dropped, and no `RUST_LOG` filter can silence this sink (it does not go
//! through `tracing`).

pub mod checkpoint;
mod head;
mod record;
pub(crate) mod rotate;
pub(crate) mod tail;
pub mod verify;
mod writer;

pub use checkpoint::{AuditKey, CheckpointKeys};
pub(crate) use head::{Anchor, AuditHead};
pub use record::{line_hash, seal, unseal, AuditEvent, AuditLine, AuditRecord, Proto, GENESIS};
pub(crate) use record::{Flow, RequestFields};
pub use rotate::{rotated_path, rotated_set};
pub(crate) use tail::format_line;
pub use tail::{tail, TailOptions, Tailer};
pub use verify::{
    verify, verify_log, verify_rotated, verify_with, Genesis, VerifyError, VerifyOptions,
    VerifySummary,
};
pub(crate) use writer::{
    check_writable, AuditError, AuditLog, CHECKPOINT_EVERY_RECORDS, CHECKPOINT_INTERVAL,
};
pub use writer::{AuditOptions, AuditWriter, CheckpointOptions};
