//! The daemon's attached sandboxes: attach (adopt a namespace, enforce it,
//! serve it), release (stop serving, drop every reference to it), and the
//! watch that releases a sandbox once its container is gone.
//!
//! An attach answers OK only after `attach::prepare` applied and read back
//! the table and bound the listeners; any failure before that leaves nothing
//! attached and the namespace as it was given, except for the in-namespace
//! plumbing (an ifb link, see `SandboxNetns::plumb`), which leads nowhere.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::StatusCode;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use super::adopt::{self, Records};
use super::api::{ApiError, AttachRequest, Connections, Fence, SandboxInfo, FENCE_REMOVE};
use super::config::Defaults;
use super::exits::ExitWatcher;
use crate::attach::vm::VmNet;
use crate::drain::Drain;
use crate::netns::{LinkAddress, SandboxNetns};
use crate::sandbox_id::SandboxId;
use crate::serve::{ActiveSource, PolicySource, Reloading, ServedSandbox, Shared, DRAIN_GRACE};
use crate::workload::WorkloadPath;

mod adoption;
mod watch;

use adoption::{already_served, enforce, refuse_binds, vm_net};
use watch::watch_until_gone;

/// How often a sandbox attached without a pid is checked for processes.
const SCAN_INTERVAL: Duration = Duration::from_secs(1);

enum Slot {
    /// An attach for this id is in progress, of the namespace with this
    /// inode, for a microVM's tap or not.
    Pending {
        inode: u64,
        vm: bool,
    },
    Ready(Box<Entry>),
}

impl Slot {
    /// The namespace this slot is for, and whether for a microVM's tap.
    fn namespace(&self) -> (u64, bool) {
        match self {
            Slot::Pending { inode, vm } => (*inode, *vm),
            Slot::Ready(entry) => (entry.served.sandbox.netns.inode(), entry.vm.is_some()),
        }
    }
}

struct Entry {
    generation: u64,
    served: ServedSandbox,
    /// A second handle for reading the drop counter outside the lock.
    netns: Arc<SandboxNetns>,
    pid: Option<i32>,
    attached: u64,
    /// A microVM's tap: who it fences, and the gateway addresses the
    /// attach added (removed again at release; the fence itself stays
    /// unless a detach asks for it to go).
    vm: Option<(VmNet, Vec<LinkAddress>)>,
    reloading: Reloading,
    /// The sandbox's reloader.
    reload: Drain,
    watcher: Option<JoinHandle<()>>,
}

impl Entry {
    /// Drain the reloader and the sandbox together, by `deadline`.
    async fn stop(self, deadline: Instant) {
        tokio::join!(self.reload.drain(deadline), self.served.stop(deadline));
    }
}

/// What a release does with the sandbox's restart record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Afterwards {
    /// The container ended or was detached: a restarted daemon must not
    /// look for it.
    Forget,
    /// The daemon is stopping: the next one adopts the sandbox again.
    Remember,
}

/// Every sandbox the daemon serves, by id.
pub(crate) struct Registry {
    shared: Shared,
    defaults: Defaults,
    records: Records,
    slots: Mutex<BTreeMap<SandboxId, Slot>>,
    next_generation: AtomicU64,
    /// Watches every container's process (`None`: it could not start, and
    /// sandboxes are watched by scanning their namespaces).
    exits: Option<ExitWatcher>,
}

impl Registry {
    pub(crate) fn new(shared: Shared, defaults: Defaults) -> Arc<Registry> {
        Arc::new(Registry {
            shared,
            records: Records::new(&defaults.state_dir),
            defaults,
            slots: Mutex::new(BTreeMap::new()),
            next_generation: AtomicU64::new(1),
            exits: ExitWatcher::start()
                .inspect_err(|err| tracing::warn!(%err, "cannot start the thread that watches containers' processes: watching their namespaces instead"))
                .ok(),
        })
    }

    /// The newest line and checkpoint of the daemon's audit log.
    pub(crate) fn audit_head(&self) -> crate::audit::AuditHead {
        self.shared.audit.head()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<SandboxId, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Attach the namespace `fd` as sandbox `req.id`: load its policy, give
    /// the namespace its plumbing, enforce it, serve it, and watch for its
    /// end. Returns once the sandbox is enforced and served.
    pub(crate) async fn attach(
        self: &Arc<Self>,
        req: AttachRequest,
        fd: OwnedFd,
    ) -> Result<SandboxInfo, ApiError> {
        self.check_binds(&req)?;
        let stale = self.reserve(&req.id, &fd, req.vm.is_some())?;
        if let Some(stale) = stale {
            tracing::info!(sandbox = %req.id, "the container restarted in a new namespace: releasing the old one");
            stale.stop(Instant::now() + DRAIN_GRACE).await;
        }
        let id = req.id.clone();
        let remembered = req.clone();
        match self.attach_reserved(req, fd).await {
            Ok((entry, ca_bundle)) => {
                if remembered.pid.is_some() {
                    if let Err(err) = self.records.save(&remembered, entry.netns.inode()) {
                        tracing::warn!(sandbox = %id, %err, "cannot write the sandbox's restart record: a restarted daemon will not adopt it again");
                    }
                }
                let info = SandboxInfo {
                    ca_bundle,
                    ..self.info_of(&id, &entry)
                };
                self.lock().insert(id, Slot::Ready(entry));
                Ok(info)
            }
            Err(err) => {
                self.lock().remove(&id);
                tracing::warn!(sandbox = %id, error = %err.message, "attach refused");
                Err(err)
            }
        }
    }

    /// A container that could read the daemon's checkpoint key could forge
    /// its audit log's checkpoints: refuse it before anything is attached.
    fn check_binds(&self, req: &AttachRequest) -> Result<(), ApiError> {
        let keys = crate::attach::oci_check::Guarded::keys(crate::audit::checkpoint::key_paths(
            &self.defaults.state_dir,
        ));
        refuse_binds(req, &keys)
    }

    /// Mark `id` as being attached. Another attach of the same namespace is
    /// a conflict; the same id in a different namespace is a restarted
    /// container, whose old entry is handed back to be released.
    ///
    /// A namespace served (or being attached) under another id is a
    /// conflict too, unless both are microVM taps (each fenced by tables of
    /// its own): two containers in one namespace (a pod, `--network
    /// container:ID`) would get two policies behind one set of redirects,
    /// and the kernel would spread their connections over both.
    fn reserve(
        &self,
        id: &SandboxId,
        fd: &OwnedFd,
        vm: bool,
    ) -> Result<Option<Box<Entry>>, ApiError> {
        let inode = nix::sys::stat::fstat(fd)
            .map_err(|e| ApiError::bad(format!("cannot inspect the namespace descriptor: {e}")))?
            .st_ino;
        let mut slots = self.lock();
        let shared = slots.iter().find(|(other, slot)| {
            let (their_inode, their_vm) = slot.namespace();
            *other != id && their_inode == inode && !(vm && their_vm)
        });
        if let Some((other, _)) = shared {
            return Err(ApiError::conflict(already_served(&format!(
                "as sandbox {other}"
            ))));
        }
        let stale = match slots.get(id) {
            None => None,
            Some(Slot::Pending { .. }) => {
                return Err(ApiError::conflict(format!(
                    "sandbox {id} is being attached by another request"
                )))
            }
            Some(Slot::Ready(entry)) if entry.served.sandbox.netns.inode() == inode => {
                return Err(ApiError::conflict(format!(
                    "sandbox {id} is already attached to this namespace (net:[{inode}])"
                )))
            }
            Some(Slot::Ready(_)) => match slots.remove(id) {
                Some(Slot::Ready(entry)) => Some(entry),
                _ => None,
            },
        };
        slots.insert(id.clone(), Slot::Pending { inode, vm });
        Ok(stale)
    }

    /// Attach and serve; returns the entry and, when the policy terminates
    /// TLS, the CA bundle for the container (see [`SandboxInfo::ca_bundle`]).
    async fn attach_reserved(
        self: &Arc<Self>,
        req: AttachRequest,
        fd: OwnedFd,
    ) -> Result<(Box<Entry>, Option<String>), ApiError> {
        // The policy first: a bad one must not touch the namespace.
        let source = self.policy_source(&req)?;
        let active = ActiveSource::load(source, &self.shared)
            .await
            .map_err(|e| ApiError::bad(crate::report::error_line(&e)))?;
        let policy = active.handle.current();
        // A container that could read one of the policy's secret files
        // would hold the credential sluice injects for it.
        refuse_binds(&req, &crate::attach::oci_check::Guarded::of_policy(&policy))?;
        // The CA and the secrets before the namespace changes: a secret that
        // cannot be read refuses the container with nothing attached.
        let interception = self
            .shared
            .interception(&req.id, &policy)
            .map_err(|e| ApiError::bad(crate::report::error_line(&e)))?;
        let ca_bundle = interception.as_ref().map(|interception| {
            crate::intercept::ca::bundle_pem(
                &interception.ca,
                std::path::Path::new(crate::intercept::roots::SYSTEM_BUNDLE),
            )
        });

        let pid = req.pid;
        let vm = req.vm.as_ref().map(vm_net).transpose()?;
        let for_vm = vm.clone();
        let listeners = self.shared.workers.listeners_per_address();
        let (sandbox, process, added) =
            tokio::task::spawn_blocking(move || enforce(fd, pid, for_vm.as_ref(), listeners))
                .await
                .map_err(|e| ApiError::internal(format!("attach task failed: {e}")))??;
        let netns = Arc::new(
            sandbox
                .netns
                .clone_handle()
                .map_err(|e| ApiError::internal(e.to_string()))?,
        );

        let mut reload = Drain::new("reloader");
        let reloading = active.spawn(&mut reload);
        let served = match ServedSandbox::start_with(
            sandbox,
            req.id.clone(),
            reloading.handle().clone(),
            &self.shared,
            interception,
        ) {
            Ok(served) => served,
            Err(err) => {
                reload.drain(Instant::now() + DRAIN_GRACE).await;
                return Err(ApiError::internal(format!(
                    "cannot serve the sandbox: {}",
                    crate::report::error_line(&err)
                )));
            }
        };
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let watcher = tokio::spawn(watch_until_gone(
            Arc::downgrade(self),
            req.id.clone(),
            generation,
            process,
            netns.clone(),
        ));
        tracing::info!(
            sandbox = %req.id,
            netns_inode = netns.inode(),
            policy = %served.policy.label(),
            "sandbox attached"
        );
        let entry = Box::new(Entry {
            generation,
            served,
            netns,
            pid,
            attached: unix_now(),
            vm: vm.map(|net| (net, added)),
            reloading,
            reload,
            watcher: Some(watcher),
        });
        Ok((entry, ca_bundle))
    }

    fn policy_source(&self, req: &AttachRequest) -> Result<PolicySource, ApiError> {
        match (&req.policy, &req.bundle) {
            (Some(path), None) => {
                let policy =
                    crate::policy::Policy::load(path).map_err(|e| ApiError::bad(e.to_string()))?;
                Ok(PolicySource::File {
                    path: path.clone(),
                    policy: Box::new(policy),
                })
            }
            (None, Some(bundle)) => {
                let trust_path = req.trust.as_ref().or(self.defaults.trust.as_ref()).ok_or_else(|| {
                    ApiError::bad(
                        "a bundle needs a trust file: annotate the container with io.sluice.trust=FILE, or set defaults.trust in the daemon config",
                    )
                })?;
                let trust = crate::bundle::TrustStore::load(trust_path)
                    .map_err(|e| ApiError::bad(e.to_string()))?;
                let state = crate::bundle::RevisionState::open(&self.defaults.state_dir)
                    .map_err(|e| ApiError::internal(e.to_string()))?;
                Ok(PolicySource::Bundle(Box::new(
                    crate::reload::ReloadConfig {
                        source: crate::reload::BundleSource::parse(bundle),
                        trust,
                        state,
                        allow_rollback: false,
                        sandbox: req.id.to_string(),
                        path: if req.vm.is_some() {
                            WorkloadPath::Vm
                        } else {
                            WorkloadPath::Oci
                        },
                        fetch: crate::reload::FetchConfig {
                            interval: self.defaults.poll_interval,
                            long_poll: self.defaults.long_poll,
                            ..Default::default()
                        },
                    },
                )))
            }
            (Some(_), Some(_)) => Err(ApiError::bad("give either a policy or a bundle, not both")),
            (None, None) => Err(ApiError::bad("give a policy or a bundle")),
        }
    }

    /// Adopt again every sandbox a previous daemon left recorded whose
    /// container still runs in the same namespace; forget the others.
    pub(crate) async fn readopt(self: &Arc<Self>) {
        for record in self.records.load_all() {
            let id = record.request.id.clone();
            let fd = match adopt::reopen(&record) {
                Ok(fd) => fd,
                Err(stale) => {
                    tracing::info!(sandbox = %id, why = %stale, "not adopting a sandbox of the previous daemon");
                    self.records.remove(id.as_str());
                    continue;
                }
            };
            match self.attach(record.request, fd).await {
                Ok(info) => {
                    tracing::info!(sandbox = %id, policy = %info.policy, "adopted a sandbox of the previous daemon")
                }
                // The record stays: the next daemon tries again, and drops
                // it once the container is gone.
                Err(err) => {
                    tracing::error!(sandbox = %id, error = %err.message, "cannot adopt a sandbox of the previous daemon: it stays cut off until it is adopted or its container restarts");
                }
            }
        }
    }

    /// Stop serving `id` and drop every reference to its namespace. With
    /// `generation`, only that incarnation (a watcher must not release a
    /// newer attach of the same id). A VM's fence stays.
    pub(crate) async fn release(
        &self,
        id: &SandboxId,
        generation: Option<u64>,
        why: &str,
        afterwards: Afterwards,
    ) -> Option<SandboxInfo> {
        self.release_by(
            id,
            generation,
            why,
            afterwards,
            Instant::now() + DRAIN_GRACE,
        )
        .await
    }

    /// A detach asked through the control API: release `id` and forget it;
    /// with [`Fence::Remove`], a VM's fence goes too (its tap's two tables,
    /// removed as `sluice vm detach` removes them). Refused, with nothing
    /// released, when `id` is not attached (404) or the fence of a sandbox
    /// that is not a VM is asked to go (400).
    pub(crate) async fn detach(
        &self,
        id: &SandboxId,
        fence: Fence,
    ) -> Result<SandboxInfo, ApiError> {
        let entry = self.take(id, |entry| match (&entry.vm, fence) {
            (None, Fence::Remove) => Err(ApiError::bad(format!(
                "sandbox {id} is not a VM (path {}): it has no tap fence to remove; a DELETE without ?{FENCE_REMOVE} releases it",
                entry.served.path().as_str()
            ))),
            _ => Ok(()),
        })?;
        self.release_entry(
            id,
            entry,
            true,
            "detached on request",
            Afterwards::Forget,
            Instant::now() + DRAIN_GRACE,
            fence,
        )
        .await
    }

    /// Take `id`'s entry out of the registry if it is attached and `check`
    /// accepts it; otherwise leave everything as it is.
    fn take(
        &self,
        id: &SandboxId,
        check: impl FnOnce(&Entry) -> Result<(), ApiError>,
    ) -> Result<Box<Entry>, ApiError> {
        let not_attached = || ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("no sandbox {id} is attached"),
        };
        let mut slots = self.lock();
        match slots.get(id) {
            Some(Slot::Ready(entry)) => check(entry)?,
            _ => return Err(not_attached()),
        }
        match slots.remove(id) {
            Some(Slot::Ready(entry)) => Ok(entry),
            _ => Err(not_attached()),
        }
    }

    /// [`release`](Self::release), its connections drained by `deadline`.
    async fn release_by(
        &self,
        id: &SandboxId,
        generation: Option<u64>,
        why: &str,
        afterwards: Afterwards,
        deadline: Instant,
    ) -> Option<SandboxInfo> {
        let entry = self
            .take(id, |entry| match generation {
                Some(g) if g != entry.generation => Err(ApiError::conflict("a newer attach")),
                _ => Ok(()),
            })
            .ok()?;
        // Keeping the fence, the release cannot fail.
        self.release_entry(
            id,
            entry,
            generation.is_none(),
            why,
            afterwards,
            deadline,
            Fence::Keep,
        )
        .await
        .ok()
    }

    /// Stop serving a taken entry, remove the gateway addresses a VM attach
    /// added and, with [`Fence::Remove`], the VM's fence. Only the fence's
    /// removal can fail: the sandbox is released all the same, and the
    /// error says so.
    #[allow(clippy::too_many_arguments)]
    async fn release_entry(
        &self,
        id: &SandboxId,
        mut entry: Box<Entry>,
        from_outside: bool,
        why: &str,
        afterwards: Afterwards,
        deadline: Instant,
        fence: Fence,
    ) -> Result<SandboxInfo, ApiError> {
        let info = self.info_of(id, &entry);
        if from_outside {
            // Asked from outside: the watcher is not needed any more. (The
            // watcher releasing its own entry must not abort itself.)
            if let Some(watcher) = entry.watcher.take() {
                watcher.abort();
            }
        }
        let netns = entry.netns.clone();
        let vm = entry.vm.take();
        let label = entry.served.policy.label();
        entry.stop(deadline).await;
        self.forget_bundle_unless_used(&label);
        let mut unfenced = Ok(());
        if let Some((net, added)) = vm {
            // Unless asked to go, the fence stays: the guest reaches nothing
            // until the tap goes or `sluice vm detach` removes it.
            let tap = net.tap.clone();
            let done = tokio::task::spawn_blocking(move || {
                let removed = netns.remove_tap_addresses(&net.tap, &added);
                let unfenced = match fence {
                    Fence::Keep => Ok(()),
                    Fence::Remove => crate::attach::vm::remove_fence(&netns, &net.tap)
                        .map_err(|e| format!("cannot remove the fence of tap {}: {e}", net.tap)),
                };
                (removed, unfenced)
            })
            .await;
            let (removed, fence_removed) = match done {
                Ok((removed, unfenced)) => (removed.is_ok(), unfenced),
                Err(e) => (false, Err(format!("the removal task failed: {e}"))),
            };
            if !removed {
                tracing::warn!(sandbox = %id, "cannot remove the gateway addresses the attach added");
            }
            unfenced = fence_removed.map_err(|cause| {
                tracing::error!(sandbox = %id, %tap, %cause, "cannot remove the fence");
                ApiError::internal(format!(
                    "sandbox {id} was released, but the fence of tap {tap} could not be removed ({cause}): the tap stays closed; remove the fence with `sluice vm detach --tap {tap} --netns NAME|PATH` (or --pid VMM_PID)"
                ))
            });
            if fence == Fence::Remove && unfenced.is_ok() {
                tracing::info!(sandbox = %id, %tap, "fence removed");
            }
        }
        if afterwards == Afterwards::Forget {
            self.records.remove(id.as_str());
        }
        tracing::info!(sandbox = %id, why, "sandbox released");
        unfenced.map(|()| info)
    }

    /// A sandbox under the policy `label` is gone: when it was a bundle's
    /// and no other sandbox enforces that bundle, its
    /// `sluice_bundle_revision` series goes too; otherwise it shows the
    /// highest revision still enforced.
    fn forget_bundle_unless_used(&self, label: &str) {
        let (Some(metrics), Some((bundle, _))) =
            (self.shared.metrics.as_ref(), crate::serve::bundle_of(label))
        else {
            return;
        };
        let still = self
            .lock()
            .values()
            .filter_map(|slot| match slot {
                Slot::Ready(entry) => Some(entry.served.policy.label()),
                Slot::Pending { .. } => None,
            })
            .filter_map(|label| {
                crate::serve::bundle_of(&label)
                    .filter(|(name, _)| *name == bundle)
                    .map(|(_, rev)| rev)
            })
            .max();
        match still {
            Some(revision) => metrics.set_bundle_revision(bundle, revision),
            None => metrics.clear_bundle_revision(bundle),
        }
    }

    /// Release everything (daemon shutdown), every sandbox's connections
    /// drained by the same `deadline`. The namespaces keep their tables:
    /// with the listeners gone, their connections are refused until the
    /// next daemon adopts them again.
    pub(crate) async fn release_all(self: &Arc<Self>, deadline: Instant) {
        let ids: Vec<SandboxId> = self.lock().keys().cloned().collect();
        let mut releases = JoinSet::new();
        for id in ids {
            let registry = self.clone();
            releases.spawn(async move {
                registry
                    .release_by(
                        &id,
                        None,
                        "the daemon is stopping",
                        Afterwards::Remember,
                        deadline,
                    )
                    .await;
            });
        }
        while releases.join_next().await.is_some() {}
    }

    /// SIGHUP: re-read every sandbox's policy.
    pub(crate) fn reload_all(&self) {
        for slot in self.lock().values() {
            if let Slot::Ready(entry) = slot {
                entry.reloading.reload_now();
            }
        }
    }

    /// Every attached sandbox, with its counters.
    pub(crate) async fn list(&self) -> Vec<SandboxInfo> {
        type Listed = (SandboxInfo, Arc<SandboxNetns>, crate::enforce::SandboxSpec);
        let snapshot: Vec<Listed> = self
            .lock()
            .iter()
            .filter_map(|(id, slot)| match slot {
                Slot::Ready(entry) => Some((
                    self.info_of(id, entry),
                    entry.netns.clone(),
                    entry.served.sandbox.attachment.spec.clone(),
                )),
                Slot::Pending { .. } => None,
            })
            .collect();
        tokio::task::spawn_blocking(move || {
            snapshot
                .into_iter()
                .map(|(mut info, netns, spec)| {
                    info.dropped_packets = netns
                        .run_in(move || crate::enforce::drop_counts(&spec).ok())
                        .ok()
                        .flatten()
                        .map(|counts| counts.iter().map(|(_, n)| n).sum());
                    info
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    /// How many sandboxes are attached (or being attached).
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn info_of(&self, id: &SandboxId, entry: &Entry) -> SandboxInfo {
        let tally = entry.served.tally.snapshot();
        SandboxInfo {
            id: id.clone(),
            path: entry.served.path().as_str().to_string(),
            policy: entry.served.policy.label(),
            netns_inode: entry.netns.inode(),
            pid: entry.pid,
            attached: entry.attached,
            vm: entry.vm.as_ref().map(|(net, _)| super::api::VmInfo {
                tap: net.tap.clone(),
                guest: net.guest.to_string(),
            }),
            connections: Connections {
                allowed: tally.allowed,
                denied: tally.denied,
                would_deny: tally.would_deny,
                active: tally.active,
            },
            dropped_packets: None,
            ca_bundle: None,
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
