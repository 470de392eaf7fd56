//! Which async runtime serves sandboxes, and how many workers it has.
//!
//! Each worker gets its own proxy listener per address (SO_REUSEPORT, see
//! `attach::set_listeners_per_address`): the kernel spreads connections
//! over the listeners, and a connection's task starts on the worker whose
//! listener accepted it.

use anyhow::{Context, Result};

/// `SLUICE_WORKERS` is not a worker count (bad input, exit 2).
#[derive(Debug, thiserror::Error)]
#[error("SLUICE_WORKERS={0:?} is not a worker count: give a number from 1 to 64, or unset it")]
pub struct BadWorkers(String);

/// How many workers serve sandboxes: `SLUICE_WORKERS` if set (1 to 64),
/// else `default`.
fn workers(default: usize) -> Result<usize, BadWorkers> {
    match std::env::var("SLUICE_WORKERS") {
        Err(_) => Ok(default),
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(n @ 1..=64) => Ok(n),
            _ => Err(BadWorkers(text)),
        },
    }
}

fn build(workers: usize) -> Result<tokio::runtime::Runtime> {
    crate::attach::set_listeners_per_address(workers);
    let mut builder = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// One sandbox (`run`, `oci`) is served on one thread by default: no task
/// ever hops between threads, which measured a little less CPU per
/// connection than a two-worker runtime on these 2-vCPU machines, where the
/// workload and its peers need the other core.
pub fn one_sandbox() -> Result<tokio::runtime::Runtime> {
    build(workers(1)?)
}

/// The daemon serves many sandboxes and gets a worker per core.
pub fn many_sandboxes() -> Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    build(workers(cores)?)
}
