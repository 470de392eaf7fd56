//! Live policy changes: loading the first bundle before a workload starts,
//! then verify-then-swap whenever the bundle changes. It owns the triggers
//! (a notify watch on a local bundle path, an HTTPS poller with ETag and
//! jittered backoff for `https://` sources, and an explicit trigger the app
//! wires to SIGHUP) and the decision to swap the [`PolicyHandle`].
//!
//! It must never leave the workload without a verified policy: a refused
//! bundle keeps the last good policy in force, logs why, writes an audit
//! record and reports [`ReloadOutcome::Refused`]. A swap only replaces the
//! `Arc` that new connections read; connections in flight keep the one they
//! took. Verification itself is the pure `bundle` module's job.

mod fetch;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;

use time::OffsetDateTime;
use tokio::sync::mpsc;

use crate::audit::{AuditEvent, AuditLog};
use crate::bundle::{Bundle, BundleError, PolicyHandle, RevisionState, TrustStore, VerifiedBundle};
use crate::drain::Watch;

pub use fetch::FetchConfig;

use fetch::{Fetched, Fetcher};
use watch::BundleWatcher;

/// Where bundles come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleSource {
    /// A directory or .tar.gz on this host, watched for changes.
    Path(PathBuf),
    /// An `https://` URL, polled.
    Url(String),
}

impl BundleSource {
    /// `https://...` is a URL; anything else a path.
    pub fn parse(text: &str) -> BundleSource {
        if text.starts_with("https://") || text.starts_with("http://") {
            BundleSource::Url(text.to_string())
        } else {
            BundleSource::Path(PathBuf::from(text))
        }
    }

    fn shown(&self) -> String {
        match self {
            BundleSource::Path(p) => p.display().to_string(),
            BundleSource::Url(u) => u.clone(),
        }
    }
}

/// Everything a [`Reloader`] needs.
pub struct ReloadConfig {
    pub source: BundleSource,
    pub trust: TrustStore,
    /// Rollback memory and the last good fetched bundle (`--state-dir`).
    pub state: RevisionState,
    /// `--allow-rollback`: accept a lower revision (and remember it).
    pub allow_rollback: bool,
    /// For audit records: the sandbox name and its path (host|oci|vm).
    pub sandbox: String,
    pub path: crate::workload::WorkloadPath,
    pub fetch: FetchConfig,
}

/// What one reload attempt did; `result()` is the
/// `sluice_bundle_reloads_total{result}` label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// A new bundle verified and is now in force.
    Applied { label: String },
    /// Nothing new (same manifest, or HTTP 304).
    Unchanged,
    /// Refused or unreachable; the previous policy stays in force.
    /// `reason` is a short code (`bad-signature`, `rollback`,
    /// `fetch-failed`, ...), `message` the one-line explanation.
    Refused {
        reason: &'static str,
        message: String,
    },
}

impl ReloadOutcome {
    pub fn result(&self) -> &'static str {
        match self {
            ReloadOutcome::Applied { .. } => "applied",
            ReloadOutcome::Unchanged => "unchanged",
            ReloadOutcome::Refused { .. } => "refused",
        }
    }
}

/// Asks a running [`Reloader`] to reload now (SIGHUP). Cheap to clone;
/// requests made while one is pending coalesce.
#[derive(Clone)]
pub struct ReloadTrigger {
    tx: mpsc::Sender<()>,
}

impl ReloadTrigger {
    pub fn reload_now(&self) {
        let _ = self.tx.try_send(());
    }
}

type Observer = Box<dyn Fn(&ReloadOutcome) + Send + Sync>;

/// Owns the policy in force for one bundle source.
pub struct Reloader {
    config: ReloadConfig,
    trust: Arc<TrustStore>,
    handle: PolicyHandle,
    digest: [u8; 32],
    audit: Option<AuditLog>,
    fetcher: Option<Fetcher>,
    trigger_tx: mpsc::Sender<()>,
    trigger_rx: mpsc::Receiver<()>,
    observer: Option<Observer>,
    watcher: Option<BundleWatcher>,
    /// When the bundle in force expires (unix seconds): see
    /// [`Reloader::expiry`].
    expires: Arc<std::sync::atomic::AtomicI64>,
}

impl Reloader {
    /// Loads and verifies the first bundle (for a URL: fetches it, falling
    /// back to the last good copy under the state dir when the fetch fails
    /// or is refused), checks rollback, remembers the revision, and builds
    /// the [`PolicyHandle`]. The workload must not start if this fails.
    ///
    /// A local path's watch is armed before the first load, so by the time
    /// this returns every later change is seen (changes made before
    /// [`run`](Self::run) polls are queued, not lost).
    pub async fn start(
        mut config: ReloadConfig,
        audit: Option<AuditLog>,
    ) -> Result<Reloader, BundleError> {
        let trust = Arc::new(config.trust.clone());
        // Watch before the first load, so a bundle replaced between that load
        // and `run` is not missed.
        let watcher = match &config.source {
            BundleSource::Path(path) => match BundleWatcher::new(path) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "cannot watch the bundle ({e}); reloads only on SIGHUP");
                    None
                }
            },
            BundleSource::Url(_) => None,
        };
        let mut fetcher = match &config.source {
            BundleSource::Url(url) => Some(Fetcher::new(url, &config.fetch)?),
            BundleSource::Path(_) => None,
        };
        let bundle = match (&config.source, fetcher.as_mut()) {
            (BundleSource::Url(url), Some(fetcher)) => {
                initial_from_url(url, fetcher, &trust, &config.state).await?
            }
            (BundleSource::Path(path), _) => load_path(path.clone(), trust.clone()).await?,
            (BundleSource::Url(_), None) => unreachable!("a URL source has a fetcher"),
        };
        let name = bundle.manifest.name.as_str().to_string();
        config
            .state
            .check(&name, bundle.manifest.revision, config.allow_rollback)?;
        config.state.accept(&name, bundle.manifest.revision)?;
        let label = bundle.label();
        tracing::info!(bundle = %label, source = %config.source.shown(), "bundle verified");
        if let Some(audit) = &audit {
            audit
                .record(event(&config, "applied", "verified", label.clone()))
                .await;
        }
        let (trigger_tx, trigger_rx) = mpsc::channel(1);
        let expires = Arc::new(std::sync::atomic::AtomicI64::new(
            bundle.manifest.expires.0.unix_timestamp(),
        ));
        Ok(Reloader {
            expires,
            handle: PolicyHandle::new(bundle.policy, label),
            digest: bundle.digest,
            config,
            trust,
            audit,
            fetcher,
            trigger_tx,
            trigger_rx,
            observer: None,
            watcher,
        })
    }

    /// Whether a local bundle path is watched for changes (false for a URL,
    /// or when the watch could not be set up: then SIGHUP still reloads).
    pub fn is_watching(&self) -> bool {
        self.watcher.is_some()
    }

    /// When the bundle in force expires, in unix seconds, kept current as
    /// bundles are applied (for `sluice_bundle_expiry_timestamp_seconds`).
    pub fn expiry(&self) -> Arc<std::sync::atomic::AtomicI64> {
        self.expires.clone()
    }

    /// The handle proxies and the DNS responder read the policy from.
    pub fn handle(&self) -> PolicyHandle {
        self.handle.clone()
    }

    /// A trigger for SIGHUP (or a control socket).
    pub fn trigger(&self) -> ReloadTrigger {
        ReloadTrigger {
            tx: self.trigger_tx.clone(),
        }
    }

    /// Called with every outcome of the running loop (metrics).
    pub fn on_outcome(&mut self, f: impl Fn(&ReloadOutcome) + Send + Sync + 'static) {
        self.observer = Some(Box::new(f));
    }

    /// One verify-then-swap from the source, now.
    pub async fn reload_once(&mut self) -> ReloadOutcome {
        self.reload_unless(std::future::pending::<()>())
            .await
            .expect("never given up")
    }

    /// [`Reloader::reload_once`], given up (`None`) if `cancel` ends while
    /// the bundle is still being fetched (a long poll the server holds):
    /// nothing is swapped or recorded before the fetch has ended, and once
    /// it has, the reload runs to its end.
    async fn reload_unless<T>(
        &mut self,
        cancel: impl std::future::Future<Output = T>,
    ) -> Option<ReloadOutcome> {
        let shown = self.config.source.shown();
        let (result, raw) = match (&self.config.source, self.fetcher.as_mut()) {
            (BundleSource::Path(path), _) => {
                (load_path(path.clone(), self.trust.clone()).await, None)
            }
            (BundleSource::Url(_), Some(fetcher)) => match tokio::select! {
                fetched = fetcher.fetch() => fetched,
                _ = cancel => return None,
            } {
                Ok(Fetched::NotModified) => return Some(self.observe(ReloadOutcome::Unchanged)),
                Ok(Fetched::Body(bytes)) => {
                    let verified = verify_bytes(bytes.to_vec(), &shown, self.trust.clone()).await;
                    (verified, Some(bytes))
                }
                Err(e) => {
                    tracing::warn!(source = %shown, "bundle fetch failed, keeping {}: {e}", self.handle.label());
                    let outcome = ReloadOutcome::Refused {
                        reason: e.code(),
                        message: e.to_string(),
                    };
                    return Some(self.observe(outcome));
                }
            },
            (BundleSource::Url(_), None) => unreachable!("a URL source has a fetcher"),
        };
        let outcome = match result {
            Ok(bundle) => self.apply(bundle, raw.as_deref()),
            Err(e) => Err(e),
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                let current = self.handle.label();
                tracing::warn!(source = %shown, "bundle refused, keeping {current}: {e}");
                if let Some(audit) = &self.audit {
                    audit
                        .record(event(&self.config, "refused", e.code(), shown))
                        .await;
                }
                ReloadOutcome::Refused {
                    reason: e.code(),
                    message: e.to_string(),
                }
            }
        };
        if let (ReloadOutcome::Applied { label }, Some(audit)) = (&outcome, &self.audit) {
            audit
                .record(event(&self.config, "applied", "verified", label.clone()))
                .await;
        }
        Some(self.observe(outcome))
    }

    /// Rollback check, then the swap. Persisting the revision mark or the
    /// last good copy is best effort: a full disk must not block a policy
    /// update, so failures there are logged and the swap goes ahead.
    fn apply(
        &mut self,
        bundle: VerifiedBundle,
        raw: Option<&[u8]>,
    ) -> Result<ReloadOutcome, BundleError> {
        if bundle.digest == self.digest {
            return Ok(ReloadOutcome::Unchanged);
        }
        let name = bundle.manifest.name.as_str().to_string();
        let revision = bundle.manifest.revision;
        self.config
            .state
            .check(&name, revision, self.config.allow_rollback)?;
        if let Err(e) = self.config.state.accept(&name, revision) {
            tracing::warn!("cannot remember revision {revision} of {name}: {e}");
        }
        if let (Some(raw), BundleSource::Url(url)) = (raw, &self.config.source) {
            if let Err(e) = self.config.state.store_last_good(url, raw) {
                tracing::warn!("cannot keep the last good bundle: {e}");
            }
        }
        let label = bundle.label();
        self.expires.store(
            bundle.manifest.expires.0.unix_timestamp(),
            std::sync::atomic::Ordering::Relaxed,
        );
        self.handle.swap(bundle.policy, label.clone());
        self.digest = bundle.digest;
        tracing::info!(bundle = %label, "bundle applied");
        Ok(ReloadOutcome::Applied { label })
    }

    fn observe(&self, outcome: ReloadOutcome) -> ReloadOutcome {
        if let Some(f) = &self.observer {
            f(&outcome);
        }
        outcome
    }

    /// Reloads on every trigger, file change (path sources) or poll (URL
    /// sources) until the drain starts. A reload in progress finishes
    /// first (a swap is never left half done), but a fetch still waiting
    /// on the server (a held long poll) is given up.
    pub async fn run(mut self, drain: Watch) {
        let mut watcher = self.watcher.take();
        let polling = self.fetcher.is_some();
        let interval = self.config.fetch.interval;
        // With long polling, the first poll goes at once: a server that holds
        // polls then holds it; one that does not answers and is polled
        // every interval from then on.
        let mut delay = match self.config.fetch.long_poll.is_zero() {
            true => fetch::jittered(interval),
            false => fetch::after_held(),
        };
        let mut failures = 0u32;
        let draining = drain.draining();
        tokio::pin!(draining);
        loop {
            tokio::select! {
                _ = &mut draining => return,
                _ = self.trigger_rx.recv() => {}
                Some(()) = next_change(&mut watcher) => {}
                _ = tokio::time::sleep(delay), if polling => {}
            }
            // A poll the server holds ends with the drain.
            let Some(outcome) = self.reload_unless(&mut draining).await else {
                return;
            };
            if let Some(w) = watcher.as_mut() {
                w.rewatch_dir();
            }
            if polling {
                let failed = matches!(&outcome, ReloadOutcome::Refused { reason, .. } if *reason == "fetch-failed");
                failures = if failed { failures + 1 } else { 0 };
                let held = self.fetcher.as_ref().is_some_and(Fetcher::server_holds);
                delay = if failed {
                    fetch::backoff(interval, self.config.fetch.max_backoff, failures)
                } else if held {
                    fetch::after_held()
                } else {
                    fetch::jittered(interval)
                };
            }
        }
    }
}

async fn next_change(watcher: &mut Option<BundleWatcher>) -> Option<()> {
    match watcher {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

fn event(
    config: &ReloadConfig,
    verdict: &'static str,
    reason: &'static str,
    bundle: String,
) -> AuditEvent {
    AuditEvent::of_bundle(&config.sandbox, config.path, verdict, reason, bundle)
}

async fn load_path(path: PathBuf, trust: Arc<TrustStore>) -> Result<VerifiedBundle, BundleError> {
    tokio::task::spawn_blocking(move || Bundle::load(&path, &trust, OffsetDateTime::now_utc()))
        .await
        .expect("bundle verification does not panic")
}

async fn verify_bytes(
    bytes: Vec<u8>,
    shown: &str,
    trust: Arc<TrustStore>,
) -> Result<VerifiedBundle, BundleError> {
    let shown = PathBuf::from(shown);
    tokio::task::spawn_blocking(move || {
        Bundle::from_tar_gz(&bytes, &shown, &trust, OffsetDateTime::now_utc())
    })
    .await
    .expect("bundle verification does not panic")
}

/// First load from a URL: the fetched bundle if it verifies, else the last
/// good copy under the state dir (verified again), else the fetch error.
async fn initial_from_url(
    url: &str,
    fetcher: &mut Fetcher,
    trust: &Arc<TrustStore>,
    state: &RevisionState,
) -> Result<VerifiedBundle, BundleError> {
    let fetched = match fetcher.fetch().await {
        Ok(Fetched::Body(bytes)) => match verify_bytes(bytes.to_vec(), url, trust.clone()).await {
            Ok(bundle) => {
                if let Err(e) = state.store_last_good(url, &bytes) {
                    tracing::warn!("cannot keep the last good bundle: {e}");
                }
                return Ok(bundle);
            }
            Err(e) => e,
        },
        Ok(Fetched::NotModified) => BundleError::Fetch {
            url: url.to_string(),
            msg: "the server answered 304 to a request without an ETag".into(),
        },
        Err(e) => e,
    };
    let Some(bytes) = state.last_good(url) else {
        return Err(fetched);
    };
    let kept = state.last_good_path(url);
    tracing::warn!("{fetched}; using the last good bundle {}", kept.display());
    verify_bytes(bytes, &kept.display().to_string(), trust.clone())
        .await
        .map_err(|e| {
            tracing::warn!("the last good bundle is no longer valid: {e}");
            fetched
        })
}
