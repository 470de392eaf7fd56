//! `sluice vm` and `sluice vm attach`: serving one microVM's tap.
//!
//! The wrapper makes an anonymous namespace, a persistent tap in it owned
//! by the VMM's user, fences the tap (applied and read back), binds the
//! listeners and the DHCP socket on the gateway's addresses, then runs the
//! VMM confined there (as `sluice run` runs a command) and exits with its
//! status. The namespace, and the tap and tables in it, go with the last
//! process inside: nothing is left, even after SIGKILL of sluice (the VMM
//! dies with it). `attach` fences a tap in someone else's namespace and
//! serves it until SIGINT or SIGTERM; stopping leaves the fence in place
//! (the guest reaches nothing) until the tap goes or `sluice vm detach`
//! removes it. When the tap itself is removed under it, attach removes the
//! tap's fence and exits 1. Neither ever kills a process it did not start.

use std::ffi::OsString;

use anyhow::{Context, Result};

use super::{supervise_command, PolicySource, ServiceOptions, Session};
use crate::attach::{self, host, vm::VmNet};
use crate::confine::{RunAs, SluiceFiles};
use crate::netns::{SandboxNetns, TapOwner};
use crate::serve::runtime::Workers;

/// The VMM's variable naming the CA bundle its guest should trust.
pub(crate) const CA_FILE_VARIABLE: &str = "SLUICE_CA_FILE";

/// Everything `sluice vm -- VMM ...` was asked to do.
pub(crate) struct VmOptions {
    pub(crate) policy: PolicySource,
    pub(crate) services: ServiceOptions,
    pub(crate) net: VmNet,
    /// The `sandbox` field of its records.
    pub(crate) id: crate::sandbox_id::SandboxId,
    /// Who the VMM runs as (and who owns the tap); root when absent.
    pub(crate) user: Option<String>,
    pub(crate) command: Vec<OsString>,
    pub(crate) files: SluiceFiles,
    /// The VMM's init, started before the runtime started.
    pub(crate) init: crate::confine::PreparedInit,
}

/// Run the VMM behind a fenced tap; returns its exit status.
pub(crate) async fn run(opts: VmOptions) -> Result<i32> {
    let run_as = opts.user.as_deref().map(host::resolve_user).transpose()?;
    let owner = run_as.map_or(TapOwner { uid: 0, gid: 0 }, |RunAs { uid, gid }| TapOwner {
        uid,
        gid,
    });
    let session = Session::start(opts.services, opts.policy).await?;
    // The sandbox CA and the secrets, before the VMM: it gets the CA bundle
    // for its guest (when a rule terminates TLS), never a secret.
    let interception = match session
        .services
        .shared
        .interception(&opts.id, &session.policy())
    {
        Ok(interception) => interception,
        Err(err) => {
            session.finish(None, super::Leftovers::Unknown).await;
            return Err(err.context("the VMM was not started"));
        }
    };
    let mut files = opts.files;
    for file in super::secret_files(&session.policy()) {
        files.hide(file);
    }
    let mut env = opts.net.environment();
    // Removed when this returns (the CA dies with the sandbox).
    let ca_file = match vmm_ca_file(interception.as_deref()) {
        Ok(file) => file,
        Err(err) => {
            session.finish(None, super::Leftovers::Unknown).await;
            return Err(err.context("the VMM was not started"));
        }
    };
    if let Some(file) = &ca_file {
        // Read-only for the VMM, root or not: the guest's trust is sluice's.
        files.read_only.push(file.path().to_path_buf());
        env.push((CA_FILE_VARIABLE.into(), file.path().display().to_string()));
    }
    // Now that sluice's files exist (the session made its records): the
    // init protects them and confines itself while the namespace is made.
    let mut init = opts.init;
    // A secret read from sluice's own environment is not the VMM's.
    for secret in session.policy().secrets() {
        if let crate::policy::SecretSource::Env(var) = &secret.source {
            if let Err(err) = init.unset_env(var.clone()) {
                session.finish(None, super::Leftovers::Unknown).await;
                return Err(attach::AttachError::Confine(err).into());
            }
        }
    }
    if let Err(err) = init.plan(&opts.command, run_as, &files, &env) {
        session.finish(None, super::Leftovers::Unknown).await;
        return Err(attach::AttachError::Confine(err).into());
    }
    let sandbox = match own_namespace(&opts.net, owner, &session.services.shared.workers) {
        Ok(sandbox) => sandbox,
        Err(err) => {
            session.finish(None, super::Leftovers::Unknown).await;
            return Err(err);
        }
    };
    let served = session.serve_with(sandbox, opts.id, interception)?;
    // The VM's command comes from the init, started before: it keeps
    // sluice's starting priority.
    session.services.shared.workers.serve_ahead_of_workload();
    let terminal = crate::confine::terminal::Foreground::now();
    // Started from this (the runtime's main) thread: see host::spawn.
    let spawned = match served.sandbox.netns.entry() {
        Ok(netns) => crate::confine::start(init, Some(netns)).await,
        Err(err) => Err(crate::confine::ConfineError::Init(err)),
    };
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => {
            session
                .finish(Some(served), super::Leftovers::Unknown)
                .await;
            return Err(match err {
                crate::confine::ConfineError::Exec { program, source } => {
                    attach::AttachError::Spawn { program, source }.into()
                }
                err => attach::AttachError::Confine(err).into(),
            });
        }
    };
    let status = supervise_command(&mut child, &session).await;
    if let Some(terminal) = terminal {
        terminal.take_back();
    }
    session
        .finish(Some(served), super::Leftovers::Unknown)
        .await;
    drop(ca_file);
    status
}

/// The CA bundle the VMM gets for its guest, when the policy terminates TLS.
fn vmm_ca_file(
    interception: Option<&crate::proxy::Interception>,
) -> Result<Option<super::CaBundleFile>> {
    let Some(interception) = interception else {
        return Ok(None);
    };
    let path = std::env::temp_dir().join(format!("sluice-vm-ca-{}.pem", std::process::id()));
    super::CaBundleFile::write(interception, path).map(Some)
}

/// A fresh namespace with the tap in it, fenced, listeners bound.
fn own_namespace(net: &VmNet, owner: TapOwner, workers: &Workers) -> Result<attach::Sandbox> {
    let netns = SandboxNetns::create().context("cannot create the VMM's network namespace")?;
    netns
        .create_tap(&net.tap, owner, &net.gateway_addresses())
        .with_context(|| format!("cannot create the tap {}", net.tap))?;
    let attachment = net
        .attachment(true)
        .served_by(workers.listeners_per_address())
        .sockets_shared_by(workers.workers_per_socket());
    attach::prepare(netns, &attachment).context("cannot fence the tap")
}

/// Everything `sluice vm attach` was asked to do.
pub(crate) struct AttachOptions {
    pub(crate) policy: PolicySource,
    pub(crate) services: ServiceOptions,
    /// The namespace the tap is in.
    pub(crate) netns: SandboxNetns,
    pub(crate) net: VmNet,
    pub(crate) id: crate::sandbox_id::SandboxId,
    /// Where to write the CA bundle for the guest (`--ca-file`), removed
    /// when the attach stops.
    pub(crate) ca_file: Option<std::path::PathBuf>,
}

/// Fence and serve a tap someone else made until SIGINT or SIGTERM; the
/// fence stays after (see the module's note). Returns 0; 1 (after saying
/// so on stderr) when the tap was removed, its fence removed with it.
pub(crate) async fn attach(opts: AttachOptions) -> Result<i32> {
    let session = Session::start(opts.services, opts.policy).await?;
    // With --ca-file the CA is made whatever the policy: the VM manager
    // was promised a file to build the guest with.
    let shared = &session.services.shared;
    let interception = match &opts.ca_file {
        Some(_) => shared
            .mint_interception(&opts.id, &session.policy())
            .map(Some),
        None => shared.interception(&opts.id, &session.policy()),
    };
    let interception = match interception {
        Ok(interception) => interception,
        Err(err) => {
            session.finish(None, super::Leftovers::Unknown).await;
            return Err(err);
        }
    };
    // Removed when this returns, whichever way (the CA dies with sluice).
    let _ca_file = match (opts.ca_file, &interception) {
        (Some(path), Some(interception)) => match super::CaBundleFile::write(interception, path) {
            Ok(file) => Some(file),
            Err(err) => {
                session.finish(None, super::Leftovers::Unknown).await;
                return Err(err);
            }
        },
        _ => None,
    };
    let net = opts.net;
    let netns = opts.netns;
    let added = match netns.adopt_tap(&net.tap, &net.gateway_addresses()) {
        Ok(added) => added,
        Err(err) => {
            session.finish(None, super::Leftovers::Unknown).await;
            return Err(
                anyhow::Error::from(err).context(format!("cannot take over tap {}", net.tap))
            );
        }
    };
    let kept = netns.clone_handle()?;
    let removal = match netns.watch_link_removal(&net.tap) {
        Ok(removal) => removal,
        Err(err) => {
            let _ = kept.remove_tap_addresses(&net.tap, &added);
            session.finish(None, super::Leftovers::Unknown).await;
            return Err(anyhow::Error::from(err)
                .context(format!("cannot watch tap {} for its removal", net.tap)));
        }
    };
    let attachment = net
        .attachment(false)
        .served_by(session.services.shared.workers.listeners_per_address())
        .sockets_shared_by(session.services.shared.workers.workers_per_socket());
    let sandbox = match attach::prepare(netns, &attachment) {
        Ok(sandbox) => sandbox,
        Err(err) => {
            let _ = kept.remove_tap_addresses(&net.tap, &added);
            session.finish(None, super::Leftovers::Unknown).await;
            return Err(anyhow::Error::from(err).context("cannot fence the tap"));
        }
    };
    let served = session.serve_with(sandbox, opts.id, interception)?;
    // The guest is someone else's process: nothing here inherits the lead.
    session.services.shared.workers.serve_ahead_of_workload();
    tracing::info!(tap = %net.tap, guest = %net.guest, "serving the tap until SIGINT or SIGTERM");
    let stop = tokio::select! {
        _ = wait_for_stop(&session) => Stop::Signal,
        _ = tap_removed(removal, &net.tap) => Stop::TapRemoved,
    };
    if stop == Stop::TapRemoved {
        // Its addresses went with it; the tables would fence a tap of the
        // same name made later, for another guest: they go too.
        session.finish_attached(Some(served)).await;
        let removed = crate::attach::vm::remove_fence(&kept, &net.tap);
        eprintln!(
            "sluice: the tap {} was removed while sluice vm attach served it{}; exiting 1",
            net.tap,
            match &removed {
                Ok(()) => ": its fence is removed too, nothing is left for it".to_string(),
                Err(err) => format!(" and its fence could not be removed ({err:#}): run `sluice vm detach --tap {}` for that namespace", net.tap),
            }
        );
        return Ok(1);
    }
    tracing::info!(
        tap = %net.tap,
        "stopping: the fence stays on the tap (the guest reaches nothing) until the tap goes or `sluice vm detach` removes it"
    );
    session.finish_attached(Some(served)).await;
    if let Err(err) = kept.remove_tap_addresses(&net.tap, &added) {
        tracing::warn!(tap = %net.tap, "cannot remove the gateway addresses sluice added: {err}");
    }
    Ok(0)
}

/// Why a foreground attach stopped serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Signal,
    TapRemoved,
}

/// Until `tap` is removed from its namespace. The watch blocks on a thread
/// of its own (a netlink socket subscribed to the namespace's link
/// changes); if it fails, the attach goes on until a signal.
async fn tap_removed(removal: crate::netns::LinkRemoval, tap: &str) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("tap-watch".into())
        .spawn(move || {
            let _ = tx.send(removal.wait());
        });
    let outcome = match spawned {
        Ok(_) => rx.await,
        Err(err) => {
            tracing::warn!(tap, %err, "cannot watch the tap for its removal");
            return std::future::pending().await;
        }
    };
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(err)) => {
            tracing::warn!(tap, "cannot watch the tap for its removal: {err}");
            std::future::pending().await
        }
        Err(_) => std::future::pending().await,
    }
}

/// Until SIGINT or SIGTERM; SIGHUP reloads the policy.
async fn wait_for_stop(session: &Session) {
    let mut sigint = session.signals.int.lock().await;
    let mut sigterm = session.signals.term.lock().await;
    let mut sighup = session.signals.hup.lock().await;
    loop {
        tokio::select! {
            _ = sigint.recv() => return,
            _ = sigterm.recv() => return,
            _ = sighup.recv() => {
                tracing::info!("SIGHUP received: reloading the policy");
                session.reloading.reload_now();
            }
        }
    }
}
