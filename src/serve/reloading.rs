//! The policy in force and how it is kept current: the first load (a file,
//! or a bundle verified with its rollback check) and the reloaders that swap
//! a new one in on a change or SIGHUP. It never applies a policy that did
//! not validate (or verify): a refused one leaves the last good in force.

use std::path::PathBuf;

use anyhow::Result;

use super::Shared;
use crate::bundle::PolicyHandle;
use crate::drain::Drain;
use crate::metrics::{Metrics, ReloadResult};
use crate::policy::Policy;
use crate::reload::{ReloadConfig, ReloadOutcome, Reloader};

/// Where the policy in force comes from.
pub(crate) enum PolicySource {
    /// A plain policy file (already validated); SIGHUP re-reads it.
    File { path: PathBuf, policy: Box<Policy> },
    /// A signed bundle, verified before the workload starts and reloaded
    /// (verify, then swap) when it changes or on SIGHUP.
    Bundle(Box<ReloadConfig>),
}

/// The policy in force and how it is kept current.
pub(crate) struct ActiveSource {
    pub(crate) handle: PolicyHandle,
    reload: Reload,
    /// Where SIGHUP's request goes.
    trigger: Option<crate::reload::ReloadTrigger>,
}

enum Reload {
    File(PathBuf),
    Bundle(Box<Reloader>),
}

impl ActiveSource {
    /// Load the first policy (for a bundle: verify it, check rollback). The
    /// workload must not start unless this succeeds.
    pub(crate) async fn load(source: PolicySource, shared: &Shared) -> Result<ActiveSource> {
        match source {
            PolicySource::File { path, policy } => {
                let label = policy.name().to_string();
                Ok(ActiveSource {
                    handle: PolicyHandle::new(*policy, label),
                    reload: Reload::File(path),
                    trigger: None,
                })
            }
            PolicySource::Bundle(config) => {
                let mut reloader = Reloader::start(*config, Some(shared.audit.clone())).await?;
                let handle = reloader.handle();
                if let Some(metrics) = shared.metrics.clone() {
                    let expiry = reloader.expiry();
                    set_revision(&metrics, &handle.label(), &expiry);
                    let for_label = handle.clone();
                    reloader.on_outcome(move |outcome: &ReloadOutcome| {
                        metrics.bundle_reload(match outcome {
                            ReloadOutcome::Applied { .. } => ReloadResult::Applied,
                            ReloadOutcome::Unchanged => ReloadResult::Unchanged,
                            ReloadOutcome::Refused { .. } => ReloadResult::Refused,
                        });
                        if let ReloadOutcome::Applied { .. } = outcome {
                            set_revision(&metrics, &for_label.label(), &expiry);
                        }
                    });
                }
                let trigger = Some(reloader.trigger());
                Ok(ActiveSource {
                    handle,
                    reload: Reload::Bundle(Box::new(reloader)),
                    trigger,
                })
            }
        }
    }

    /// Keep the policy current until `drain` drains: a bundle's
    /// watcher/poller.
    pub(crate) fn spawn(self, drain: &mut Drain) -> Reloading {
        match self.reload {
            Reload::Bundle(reloader) => {
                drain.spawn(reloader.run(drain.watch()));
                Reloading {
                    handle: self.handle,
                    file: None,
                    trigger: self.trigger,
                }
            }
            Reload::File(path) => Reloading {
                handle: self.handle,
                file: Some(path),
                trigger: None,
            },
        }
    }
}

/// What SIGHUP does while the workload runs.
pub(crate) struct Reloading {
    handle: PolicyHandle,
    file: Option<PathBuf>,
    trigger: Option<crate::reload::ReloadTrigger>,
}

impl Reloading {
    /// The policy in force.
    pub(crate) fn handle(&self) -> &PolicyHandle {
        &self.handle
    }

    pub(crate) fn reload_now(&self) {
        if let Some(trigger) = &self.trigger {
            trigger.reload_now();
        }
        if let Some(path) = &self.file {
            match Policy::load(path) {
                Ok(policy) => {
                    let label = policy.name().to_string();
                    self.handle.swap(policy, label);
                    tracing::info!(path = %path.display(), "policy re-read and swapped in");
                }
                Err(err) => tracing::warn!(
                    "policy reload refused, the previous policy stays in force:\n{err}"
                ),
            }
        }
    }
}

/// `name@revision` -> sluice_bundle_revision{bundle="name"} = revision,
/// and the bundle's expiry beside it.
fn set_revision(metrics: &Metrics, label: &str, expiry: &std::sync::atomic::AtomicI64) {
    if let Some((name, rev)) = bundle_of(label) {
        metrics.set_bundle_revision(name, rev);
        metrics.set_bundle_expiry(name, expiry.load(std::sync::atomic::Ordering::Relaxed));
    }
}

/// The bundle name and revision of a policy label (`name@revision`);
/// `None` for a plain policy file's (its name alone).
pub(crate) fn bundle_of(label: &str) -> Option<(&str, u64)> {
    let (name, rev) = label.rsplit_once('@')?;
    Some((name, rev.parse().ok()?))
}
