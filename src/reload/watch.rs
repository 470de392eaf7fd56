//! Watching a local bundle path with notify: the parent directory (so an
//! atomic rename into place is seen) and, for a directory bundle, the
//! directory itself. Events are only a hint to reload; the reload itself
//! verifies whatever is there, and an unchanged bundle is a no-op.
//!
//! Every watch in the process shares one notify watcher (one inotify
//! instance): a daemon serving hundreds of containers with local bundles
//! would otherwise run into the host's limit on inotify instances per user
//! (`fs.inotify.max_user_instances`, often 128). Watched directories are
//! counted, so one subscriber's end never blinds another.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Quiet time after the last event before a reload starts, so a burst of
/// writes (three files of a directory bundle) becomes one reload.
pub(crate) const DEBOUNCE: Duration = Duration::from_millis(200);

/// One bundle path's subscription to the shared watcher.
pub(crate) struct BundleWatcher {
    hub: Arc<Hub>,
    id: u64,
    parent: PathBuf,
    target: PathBuf,
    /// Whether this subscription counts a watch on `target` itself (a
    /// directory bundle).
    watching_target: bool,
    pub(crate) events: mpsc::UnboundedReceiver<()>,
}

impl BundleWatcher {
    pub(crate) fn new(target: &Path) -> notify::Result<BundleWatcher> {
        let target = std::path::absolute(target).unwrap_or_else(|_| target.to_path_buf());
        let parent = target
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        let hub = Hub::shared()?;
        let (tx, events) = mpsc::unbounded_channel();
        let id = hub.subscribe(target.clone(), tx);
        if let Err(e) = hub.watch(&parent) {
            hub.unsubscribe(id);
            return Err(e);
        }
        let mut this = BundleWatcher {
            hub,
            id,
            parent,
            target,
            watching_target: false,
            events,
        };
        this.rewatch_dir();
        Ok(this)
    }

    /// (Re)watches a directory bundle's contents; after a directory was
    /// replaced, the old watch points at the old inode.
    pub(crate) fn rewatch_dir(&mut self) {
        if self.watching_target {
            self.hub.unwatch(&self.target);
            self.watching_target = false;
        }
        if self.target.is_dir() {
            match self.hub.rewatch(&self.target) {
                Ok(()) => self.watching_target = true,
                Err(e) => {
                    tracing::warn!(path = %self.target.display(), error = %e, "cannot watch the bundle directory")
                }
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

impl Drop for BundleWatcher {
    fn drop(&mut self) {
        self.hub.unsubscribe(self.id);
        if self.watching_target {
            self.hub.unwatch(&self.target);
        }
        self.hub.unwatch(&self.parent);
    }
}

/// The process's one notify watcher, its subscribers, and how many of them
/// need each watched directory.
struct Hub {
    watcher: Mutex<RecommendedWatcher>,
    subscribers: Arc<Mutex<Subscribers>>,
    watched: Mutex<HashMap<PathBuf, usize>>,
}

#[derive(Default)]
struct Subscribers {
    next_id: u64,
    by_id: HashMap<u64, (PathBuf, mpsc::UnboundedSender<()>)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Hub {
    fn shared() -> notify::Result<Arc<Hub>> {
        static HUB: OnceLock<Arc<Hub>> = OnceLock::new();
        if let Some(hub) = HUB.get() {
            return Ok(hub.clone());
        }
        // Two first callers may both build one; only the first is kept.
        let hub = Hub::new()?;
        Ok(HUB.get_or_init(|| hub).clone())
    }

    fn new() -> notify::Result<Arc<Hub>> {
        let subscribers = Arc::new(Mutex::new(Subscribers::default()));
        let seen = subscribers.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
            let Ok(event) = res else { return };
            for (target, tx) in lock(&seen).by_id.values() {
                if relevant(&event, target) {
                    let _ = tx.send(());
                }
            }
        })?;
        Ok(Arc::new(Hub {
            watcher: Mutex::new(watcher),
            subscribers,
            watched: Mutex::new(HashMap::new()),
        }))
    }

    fn subscribe(&self, target: PathBuf, tx: mpsc::UnboundedSender<()>) -> u64 {
        let mut subs = lock(&self.subscribers);
        let id = subs.next_id;
        subs.next_id += 1;
        subs.by_id.insert(id, (target, tx));
        id
    }

    fn unsubscribe(&self, id: u64) {
        lock(&self.subscribers).by_id.remove(&id);
    }

    /// Count one more user of a watch on `dir`, watching it if it is the first.
    fn watch(&self, dir: &Path) -> notify::Result<()> {
        let mut watched = lock(&self.watched);
        if let Some(n) = watched.get_mut(dir) {
            *n += 1;
            return Ok(());
        }
        lock(&self.watcher).watch(dir, RecursiveMode::NonRecursive)?;
        watched.insert(dir.to_path_buf(), 1);
        Ok(())
    }

    /// Count one more user of a watch on `dir`, and watch it anew whatever
    /// the count: the directory at that path may be a new one.
    fn rewatch(&self, dir: &Path) -> notify::Result<()> {
        let mut watched = lock(&self.watched);
        let mut watcher = lock(&self.watcher);
        let _ = watcher.unwatch(dir);
        if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
            // The other users lost the watch too; they no longer hold it.
            watched.remove(dir);
            return Err(e);
        }
        *watched.entry(dir.to_path_buf()).or_insert(0) += 1;
        Ok(())
    }

    /// One user fewer of the watch on `dir`; the last one removes it.
    fn unwatch(&self, dir: &Path) {
        let mut watched = lock(&self.watched);
        let Some(n) = watched.get_mut(dir) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            watched.remove(dir);
            let _ = lock(&self.watcher).unwatch(dir);
        }
    }

    #[cfg(test)]
    fn users_of(&self, dir: &Path) -> usize {
        lock(&self.watched).get(dir).copied().unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn inotify_instances() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| {
                std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("inotify"))
            })
            .count()
    }

    #[tokio::test]
    async fn many_watchers_share_one_inotify_instance_and_each_sees_its_change() {
        let dir = tempfile::tempdir().unwrap();
        let mut watchers: Vec<BundleWatcher> = (0..200)
            .map(|i| BundleWatcher::new(&dir.path().join(format!("b{i}.tar.gz"))).unwrap())
            .collect();
        assert_eq!(inotify_instances(), 1);
        assert_eq!(Hub::shared().unwrap().users_of(dir.path()), 200);

        std::fs::write(dir.path().join("b7.tar.gz"), b"new").unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(5), watchers[7].next()).await;
        assert_eq!(seen.unwrap(), Some(()));
        assert!(watchers[8].events.try_recv().is_err(), "b8 saw b7's change");

        // Dropping the others leaves the last one watching.
        let mut last = watchers.pop().unwrap();
        drop(watchers);
        assert_eq!(Hub::shared().unwrap().users_of(dir.path()), 1);
        std::fs::write(dir.path().join("b199.tar.gz"), b"new").unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(5), last.next()).await;
        assert_eq!(seen.unwrap(), Some(()));
        drop(last);
        assert_eq!(Hub::shared().unwrap().users_of(dir.path()), 0);
    }

    #[tokio::test]
    async fn two_watchers_of_one_directory_bundle_both_follow_its_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        let mut a = BundleWatcher::new(&bundle).unwrap();
        let mut b = BundleWatcher::new(&bundle).unwrap();
        assert_eq!(Hub::shared().unwrap().users_of(&bundle), 2);

        // Replace the directory, as a deploy would, then let each rewatch.
        let staged = dir.path().join("staged");
        std::fs::create_dir(&staged).unwrap();
        std::fs::remove_dir_all(&bundle).unwrap();
        std::fs::rename(&staged, &bundle).unwrap();
        for w in [&mut a, &mut b] {
            tokio::time::timeout(Duration::from_secs(5), w.next())
                .await
                .unwrap();
            w.rewatch_dir();
        }
        assert_eq!(Hub::shared().unwrap().users_of(&bundle), 2);

        std::fs::write(bundle.join("policy.yaml"), b"x").unwrap();
        for w in [&mut a, &mut b] {
            let seen = tokio::time::timeout(Duration::from_secs(5), w.next()).await;
            assert_eq!(seen.unwrap(), Some(()));
        }
    }
}
