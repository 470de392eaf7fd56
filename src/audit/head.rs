//! The audit log's head: the newest line written (seq, hash) and the newest
//! checkpoint, as the writer last wrote them, for whoever exports them (the
//! `sluice_audit_head_seq` and `sluice_audit_checkpoint_seq` gauges, the
//! daemon's `GET /v1/audit` and `sluice status`). An outside collector that
//! keeps the head can later show an edit or a cut of lines no checkpoint
//! anchors yet (`sluice audit verify --anchor SEQ:HASH`).
//!
//! Updated once per batch written, never on a connection's path; reading it
//! never waits for the writer.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use prometheus::IntGauge;
use serde::{Deserialize, Serialize};

/// One line of the chain: its seq and hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anchor {
    pub seq: u64,
    pub hash: String,
}

/// What the writer has written so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditHead {
    /// The audit log (None: records are counted, not kept).
    pub file: Option<PathBuf>,
    /// The id of the key checkpoints are signed with (None: no checkpoints).
    pub key: Option<String>,
    /// The newest line written (a record or a checkpoint); None while the
    /// log is empty.
    pub head: Option<Anchor>,
    /// The newest checkpoint line written: every line before it is signed.
    pub checkpoint: Option<Anchor>,
}

impl AuditHead {
    /// Lines written after the newest checkpoint (all of them if none).
    pub fn unanchored(&self) -> u64 {
        match (&self.head, &self.checkpoint) {
            (None, _) => 0,
            (Some(head), None) => head.seq + 1,
            (Some(head), Some(c)) => head.seq.saturating_sub(c.seq),
        }
    }
}

/// The shared head and its gauges.
#[derive(Debug, Default)]
pub(crate) struct HeadCell {
    head: Mutex<AuditHead>,
    head_seq: Option<IntGauge>,
    checkpoint_seq: Option<IntGauge>,
}

impl HeadCell {
    pub(crate) fn new(
        file: Option<PathBuf>,
        key: Option<String>,
        head_seq: Option<IntGauge>,
        checkpoint_seq: Option<IntGauge>,
    ) -> Arc<HeadCell> {
        let cell = HeadCell {
            head: Mutex::new(AuditHead {
                file,
                key,
                head: None,
                checkpoint: None,
            }),
            head_seq,
            checkpoint_seq,
        };
        cell.export(&AuditHead::default());
        Arc::new(cell)
    }

    pub(crate) fn get(&self) -> AuditHead {
        self.head.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Lines up to `head` are written; `checkpoint` if one was among them.
    pub(crate) fn written(&self, head: Option<Anchor>, checkpoint: Option<Anchor>) {
        let mut state = self.head.lock().unwrap_or_else(|e| e.into_inner());
        if head.is_some() {
            state.head = head;
        }
        if checkpoint.is_some() {
            state.checkpoint = checkpoint;
        }
        self.export(&state);
    }

    fn export(&self, state: &AuditHead) {
        let seq = |a: &Option<Anchor>| a.as_ref().map_or(-1, |a| a.seq as i64);
        if let Some(g) = &self.head_seq {
            g.set(seq(&state.head));
        }
        if let Some(g) = &self.checkpoint_seq {
            g.set(seq(&state.checkpoint));
        }
    }
}
