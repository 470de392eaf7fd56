//! The audit log: one JSONL record per decision (every deny, allows optional),
//! hash-chained so that an edited, dropped or reordered line is detectable.
//!
//! Records travel over a bounded channel to one writer task. When the channel
//! is full, producers wait: a record is never dropped, and no `RUST_LOG`
//! filter can silence this sink (it does not go through `tracing`).

mod record;
mod writer;

pub use record::{AuditEvent, AuditRecord, Proto, GENESIS};
pub use writer::{AuditError, AuditLog, AuditWriter};
