//! Watching a local bundle path with notify: the parent directory (so an
//! atomic rename into place is seen) and, for a directory bundle, the
//! directory itself. Events are only a hint to reload; the reload itself
//! verifies whatever is there, and an unchanged bundle is a no-op.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Quiet time after the last event before a reload starts, so a burst of
/// writes (three files of a directory bundle) becomes one reload.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

pub(crate) struct BundleWatcher {
    watcher: RecommendedWatcher,
    target: PathBuf,
    pub(crate) events: mpsc::UnboundedReceiver<()>,
}

impl BundleWatcher {
    pub(crate) fn new(target: &Path) -> notify::Result<BundleWatcher> {
        let target = std::path::absolute(target).unwrap_or_else(|_| target.to_path_buf());
        let parent = target
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        let (tx, events) = mpsc::unbounded_channel();
        let wanted = target.clone();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
            let Ok(event) = res else { return };
            if relevant(&event, &wanted) {
                let _ = tx.send(());
            }
        })?;
        watcher.watch(&parent, RecursiveMode::NonRecursive)?;
        let mut this = BundleWatcher {
            watcher,
            target,
            events,
        };
        this.rewatch_dir();
        Ok(this)
    }

    /// (Re)watches a directory bundle's contents; after a directory was
    /// replaced, the old watch points at the old inode.
    pub(crate) fn rewatch_dir(&mut self) {
        let _ = self.watcher.unwatch(&self.target);
        if self.target.is_dir() {
            if let Err(e) = self
                .watcher
                .watch(&self.target, RecursiveMode::NonRecursive)
            {
                tracing::warn!(path = %self.target.display(), error = %e, "cannot watch the bundle directory");
            }
        }
    }

    /// Waits for an event, then for [`DEBOUNCE`] of quiet. `None` when the
    /// watcher is gone.
    pub(crate) async fn next(&mut self) -> Option<()> {
        self.events.recv().await?;
        loop {
            match tokio::time::timeout(DEBOUNCE, self.events.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) => return None,
                Err(_) => return Some(()),
            }
        }
    }
}

/// Changes to the target (or inside it); never our own reads.
fn relevant(event: &Event, target: &Path) -> bool {
    let change = match event.kind {
        EventKind::Create(_) | EventKind::Remove(_) => true,
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => false,
        EventKind::Modify(_) => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) | EventKind::Other => false,
        EventKind::Any => true,
    };
    change
        && event
            .paths
            .iter()
            .any(|p| p.starts_with(target) || p.file_name() == target.file_name())
}
