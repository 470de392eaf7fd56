//! The audit log: one JSONL record per decision (every deny, allows optional),
//! hash-chained so that an edited, dropped or reordered line is detectable
//! (`verify`), readable with `tail`, rotated by size without breaking the
//! chain (`rotate`).
//!
//! Records travel over a bounded channel to one writer task. When the channel
//! is full, producers wait (and the wait is counted): a record is never
//! dropped, and no `RUST_LOG` filter can silence this sink (it does not go
//! through `tracing`).

mod record;
pub mod rotate;
pub mod tail;
pub mod verify;
mod writer;

pub use record::{line_hash, AuditEvent, AuditRecord, Proto, GENESIS};
pub use rotate::{rotated_path, rotated_set};
pub use tail::{format_record, tail, TailOptions, Tailer};
pub use verify::{verify, verify_rotated, verify_with, Genesis, VerifyError, VerifySummary};
pub use writer::{check_writable, AuditError, AuditLog, AuditOptions, AuditWriter};
