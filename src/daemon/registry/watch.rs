//! The watch that releases a sandbox once its container is gone: its
//! process's pidfd, or a scan of the namespace without one. It only ever
//! asks the registry to release; it never holds its table.

use std::sync::Arc;

use super::adoption::Pidfd;
use super::{Afterwards, Registry, SCAN_INTERVAL};
use crate::netns::SandboxNetns;
use crate::sandbox_id::SandboxId;

/// Release the sandbox once its container is gone: when its process exits
/// (pidfd), or, without a pid, when no process is left in the namespace.
pub(super) async fn watch_until_gone(
    registry: std::sync::Weak<Registry>,
    id: SandboxId,
    generation: u64,
    process: Option<Pidfd>,
    netns: Arc<SandboxNetns>,
) {
    let exit = match (process, registry.upgrade()) {
        (Some(process), Some(registry)) => registry.exits.as_ref().map(|w| w.watch(process.0)),
        _ => None,
    };
    let why = match exit {
        Some(mut exit) => match exit.exited().await {
            Ok(()) => "the container's process exited",
            Err(_) => {
                tracing::warn!(
                    "cannot watch the container's process: watching its namespace instead"
                );
                scan_until_empty(&netns).await
            }
        },
        None => scan_until_empty(&netns).await,
    };
    drop(netns);
    if let Some(registry) = registry.upgrade() {
        registry
            .release(&id, Some(generation), why, Afterwards::Forget)
            .await;
    }
}

async fn scan_until_empty(netns: &Arc<SandboxNetns>) -> &'static str {
    let mut empty_scans = 0;
    loop {
        tokio::time::sleep(SCAN_INTERVAL).await;
        let ns = netns.clone();
        let empty = tokio::task::spawn_blocking(move || ns.processes_inside().is_empty())
            .await
            .unwrap_or(false);
        empty_scans = if empty { empty_scans + 1 } else { 0 };
        if empty_scans >= 2 {
            return "no process is left in the namespace";
        }
    }
}
