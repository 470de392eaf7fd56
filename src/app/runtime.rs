//! Which async runtime serves sandboxes.

use anyhow::{Context, Result};

/// One sandbox (`run`, `oci`) is served on one thread: no task ever hops
/// between threads, which measured a little less CPU per connection than a
/// two-worker runtime on these 2-vCPU machines, where the workload and its
/// peers need the other core.
pub fn one_sandbox() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The daemon serves many sandboxes and gets a worker per core.
pub fn many_sandboxes() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}
