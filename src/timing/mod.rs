//! Per-connection timing records (DESIGN.md "Records"): one per connection,
//! durations in microseconds from accept on a monotonic clock, written as
//! CSV or JSONL by one writer task (`io`), read back, and compared between
//! two runs, e.g. direct and proxied (`compare`, `plot`, with the
//! statistics in `stats`, which `sluice bench` uses too).
//!
//! The proxy measures with `ConnectionClock` and hands the finished
//! `TimingRecord` to a `TimingLog`. This module never decides anything about
//! a connection and never drops a record: like the audit log, a full queue
//! makes the producer wait.

pub mod compare;
mod io;
mod plot;
pub(crate) mod stats;

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use compare::{compare, load_input, Input};
pub(crate) use io::{check_writable, push_csv, TimingError, TimingLog};
pub use io::{read_file, TimingWriter, CSV_HEADER};
pub use plot::plot_svg;
pub(crate) use plot::PlotError;
// The bench draws its panels with the same hand.
#[cfg(feature = "bench")]
pub(crate) use plot::{ecdf_panel, ecdf_points, PALETTE};

/// One connection, from accept to close. Phases that did not happen (a
/// denied connection never connects; a direct client makes no decision) are
/// `None`. Field order is the contract's (and the CSV column order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TimingRecord {
    pub id: u64,
    pub sandbox: String,
    /// host | oci | vm | direct
    pub path: String,
    pub dst: String,
    pub host: Option<String>,
    pub verdict: String,
    /// Accept time, unix microseconds (wall clock; only for ordering and
    /// joining with other logs).
    pub start: u64,
    pub decide_us: Option<u64>,
    pub connect_us: Option<u64>,
    pub first_byte_us: Option<u64>,
    pub total_us: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Why the connection ended as it did: the decision's reason
    /// (`allow-rule`, `no-rule`, ...), `upstream-refused` and the other
    /// upstream failures, or `drained`. Empty in files written before it,
    /// and for direct clients.
    #[serde(default)]
    pub reason: String,
}

/// Measures one connection's phases from accept (monotonic clock).
#[derive(Debug, Clone)]
pub struct ConnectionClock {
    accepted: Instant,
    start_us: u64,
    decide_us: Option<u64>,
    connect_us: Option<u64>,
    first_byte_us: Option<u64>,
}

impl ConnectionClock {
    /// At accept.
    pub fn start() -> ConnectionClock {
        let start_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        ConnectionClock {
            accepted: Instant::now(),
            start_us,
            decide_us: None,
            connect_us: None,
            first_byte_us: None,
        }
    }

    /// Time since accept.
    pub fn elapsed(&self) -> Duration {
        self.accepted.elapsed()
    }

    fn mark(&self) -> u64 {
        self.accepted.elapsed().as_micros() as u64
    }

    /// The decision is made. Returns the time since accept.
    pub fn decided(&mut self) -> Duration {
        let d = self.elapsed();
        self.decide_us.get_or_insert(d.as_micros() as u64);
        d
    }

    /// The upstream connection is established.
    pub fn connected(&mut self) -> Duration {
        let d = self.elapsed();
        self.connect_us.get_or_insert(d.as_micros() as u64);
        d
    }

    /// The first upstream byte was relayed to the client (first call wins).
    pub fn first_byte(&mut self) -> Duration {
        let d = self.elapsed();
        self.first_byte_us.get_or_insert(d.as_micros() as u64);
        d
    }

    /// The first upstream byte was relayed to the client at `at` (first
    /// call wins); for relays that note the instant themselves.
    pub(crate) fn first_byte_at(&mut self, at: Instant) -> Duration {
        let d = at.saturating_duration_since(self.accepted);
        self.first_byte_us.get_or_insert(d.as_micros() as u64);
        d
    }

    /// The finished record of a connection that ended with `outcome`
    /// (total = now). Set `bytes_up`/`bytes_down` on it.
    pub fn record(
        &self,
        id: u64,
        sandbox: &str,
        path: &str,
        dst: SocketAddr,
        host: Option<&str>,
        outcome: &crate::outcome::Outcome,
    ) -> TimingRecord {
        TimingRecord {
            id,
            sandbox: sandbox.to_string(),
            path: path.to_string(),
            dst: dst.to_string(),
            host: host.map(str::to_string),
            verdict: outcome.verdict.as_str().to_string(),
            reason: outcome.reason().to_string(),
            start: self.start_us,
            decide_us: self.decide_us,
            connect_us: self.connect_us,
            first_byte_us: self.first_byte_us,
            total_us: self.mark(),
            bytes_up: 0,
            bytes_down: 0,
        }
    }
}
