//! The supervisor: owns the tasks of one `sluice run`, its signals, and the
//! one shutdown path. Every long-lived task belongs to a [`Drain`]: the
//! sandbox's (its proxy listeners and DNS), the reloaders', and the
//! services' (metrics endpoint, audit and timing writers). At shutdown the
//! listeners stop accepting, connections and queries in flight get
//! [`DRAIN_GRACE`], and the writers flush what the producers left until
//! [`DRAIN_DEADLINE`], then say what they could not write.
//!
//! Every long-lived task is started here and awaited here; none is detached.
//! It never decides a connection or writes a rule itself: policy decides,
//! proxy serves, enforce and netns build the sandbox.

pub(crate) mod oci;
pub(crate) mod vm;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

use crate::serve::{
    ActiveSource, Reloading, ServedSandbox, Services, Shared, DRAIN_DEADLINE, DRAIN_GRACE,
};
pub(crate) use crate::serve::{PolicySource, ServiceOptions};

use crate::attach::{self, host};
use crate::drain::Drain;
use crate::policy::Policy;

/// How long the workload gets between SIGTERM and SIGKILL.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(5);

/// Everything `sluice run` was asked to do.
pub(crate) struct RunOptions {
    pub(crate) policy: PolicySource,
    pub(crate) services: ServiceOptions,
    pub(crate) user: Option<String>,
    pub(crate) command: Vec<OsString>,
    /// sluice's own files, which the command must not change.
    pub(crate) files: crate::confine::SluiceFiles,
    /// The command's init, started before the runtime started.
    pub(crate) init: crate::confine::PreparedInit,
    /// The sandbox namespace, being made since just after the init's fork
    /// ([`start_sandbox`]).
    pub(crate) sandbox: attach::FreshSandbox,
}

/// What every enforced workload of one process shares: the services, the
/// policy in force, and the tasks that keep it current. `sluice run` and
/// `sluice oci` each open one, serve one sandbox, and finish it.
pub(crate) struct Session {
    pub(crate) signals: Signals,
    pub(crate) services: Services,
    reloading: Reloading,
    /// The reloaders.
    reload: Drain,
}

impl Session {
    /// Start the services and load the first policy. Nothing may run in the
    /// sandbox unless this succeeds.
    pub(crate) async fn start(options: ServiceOptions, policy: PolicySource) -> Result<Session> {
        let signals = Signals::install()?;
        let services = Services::start(options)?;
        let source = match ActiveSource::load(policy, &services.shared).await {
            Ok(source) => source,
            Err(err) => {
                services.finish(Instant::now() + DRAIN_DEADLINE).await;
                return Err(err.context("the workload was not started"));
            }
        };
        let mut reload = Drain::new("reloaders");
        let reloading = source.spawn(&mut reload);
        Ok(Session {
            signals,
            services,
            reloading,
            reload,
        })
    }

    /// The policy in force now.
    pub(crate) fn policy(&self) -> Arc<crate::bundle::ActivePolicy> {
        self.reloading.handle().current()
    }

    /// Serve `sandbox` as sandbox `id` under this session's policy, with
    /// the sandbox CA and secrets made already (`None`: rules that
    /// terminate TLS are refused).
    pub(crate) fn serve_with(
        &self,
        sandbox: attach::Sandbox,
        id: crate::sandbox_id::SandboxId,
        interception: Option<Arc<crate::proxy::Interception>>,
    ) -> Result<ServedSandbox> {
        tracing::info!(
            netns_inode = sandbox.netns.inode(),
            sandbox = %id,
            "sandbox ready"
        );
        ServedSandbox::start_with(
            sandbox,
            id,
            self.reloading.handle().clone(),
            &self.services.shared,
            interception,
        )
    }

    /// The workload is gone: take anything it left running in the namespace
    /// with it (unless `leftovers` says nothing can be), then drain
    /// (connections get [`DRAIN_GRACE`]) and flush (by [`DRAIN_DEADLINE`]).
    pub(crate) async fn finish(self, served: Option<ServedSandbox>, leftovers: Leftovers) {
        if let Some(served) = &served {
            if leftovers == Leftovers::Unknown {
                served.sandbox.netns.kill_processes_inside();
            }
        }
        self.finish_attached(served).await;
    }

    /// [`Session::finish`] for a namespace that is not the workload's alone
    /// (`sluice vm attach`): its processes are someone else's and stay.
    pub(crate) async fn finish_attached(self, served: Option<ServedSandbox>) {
        if let Some(served) = &served {
            // Read only for the log line (the metric is refreshed apart):
            // at the default level it costs the caller a namespace thread
            // and a libnftables round trip for nothing.
            if tracing::enabled!(tracing::Level::INFO) {
                if let Some(dropped) = served.dropped_packets() {
                    tracing::info!(dropped, "packets dropped by the sandbox's nftables rules");
                }
            }
            served.log_cpu_per_connection();
        }
        let start = Instant::now();
        let grace = start + DRAIN_GRACE.min(DRAIN_DEADLINE);
        let reloaders = self.reload.drain(grace);
        let sandbox = async {
            if let Some(served) = served {
                served.stop(grace).await;
            }
        };
        let _ = tokio::join!(reloaders, sandbox);
        self.services.finish(start + DRAIN_DEADLINE).await;
    }
}

/// Starts making a fresh sandbox namespace, enforced as `attachment` says
/// (table applied and read back, listeners bound), on a thread of its own.
/// `sluice run` and `sluice oci` start it before their runtime and services
/// ([`RunOptions::sandbox`], [`oci::OciOptions::sandbox`]) and wait for it
/// only once those have started: its table's thread is the longest path to
/// the workload's start.
pub(crate) fn start_sandbox(attachment: &attach::Attachment) -> Result<attach::FreshSandbox> {
    attach::start_fresh(attachment).map_err(sandbox_error)
}

/// Waits for a sandbox [`start_sandbox`] started.
pub(crate) fn fresh_sandbox(sandbox: attach::FreshSandbox) -> Result<attach::Sandbox> {
    sandbox.wait().map_err(sandbox_error)
}

/// What a user reads when a sandbox could not be made or enforced.
fn sandbox_error(err: attach::AttachError) -> anyhow::Error {
    match err {
        attach::AttachError::Netns(err) => {
            anyhow::Error::new(err).context("cannot create the sandbox network namespace")
        }
        err => anyhow::Error::new(err).context("cannot enforce the sandbox"),
    }
}

/// What may still run in a sandbox's namespace when its session finishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leftovers {
    /// Anything: scan the namespace and kill what is there.
    Unknown,
    /// Nothing: the only process put in the namespace was the init of its
    /// own PID namespace, and it has been reaped. The kernel kills every
    /// process of a PID namespace when its init exits, and the init's exit
    /// is reported only once they are all gone (zap_pid_namespace), so a
    /// scan would find nothing (`tests/run.rs` `nothing_is_left_*`).
    InitReaped,
}

/// Run the workload under enforcement; returns its exit status (128 + N when
/// a signal N ended it).
pub(crate) async fn run(opts: RunOptions) -> Result<i32> {
    let run_as = opts.user.as_deref().map(host::resolve_user).transpose()?;
    let session = Session::start(opts.services, opts.policy).await?;
    let id = crate::sandbox_id::SandboxId::numbered("host", std::process::id());
    // The sandbox CA and the secrets, before the workload: it gets the CA
    // bundle (when a rule terminates TLS) and the placeholders, never the
    // secrets' files.
    let interception = match session.services.shared.interception(&id, &session.policy()) {
        Ok(interception) => interception,
        Err(err) => {
            session.finish(None, Leftovers::Unknown).await;
            return Err(err.context("the workload was not started"));
        }
    };
    let mut files = opts.files;
    let mut env = Vec::new();
    let mut delivered = None;
    if let Some(interception) = &interception {
        env = interception.secrets.placeholder_env();
        delivered = match deliver_ca(interception, &mut files, &mut env) {
            Ok(delivered) => Some(delivered),
            Err(err) => {
                session.finish(None, Leftovers::Unknown).await;
                return Err(err);
            }
        };
    }
    for file in secret_files(&session.policy()) {
        files.hide(file);
    }
    // Now that sluice's files exist (the session made its records): the
    // init protects them and confines itself while the namespace is made.
    let mut init = opts.init;
    // A secret read from sluice's own environment is not the workload's.
    for secret in session.policy().secrets() {
        if let crate::policy::SecretSource::Env(var) = &secret.source {
            if let Err(err) = init.unset_env(var.clone()) {
                session.finish(None, Leftovers::Unknown).await;
                return Err(attach::AttachError::Confine(err).into());
            }
        }
    }
    if let Some(bundle) = &delivered {
        // Over the distribution's bundle: clients that read it, and not
        // the variables, trust the sandbox CA too.
        let system = PathBuf::from(crate::intercept::roots::SYSTEM_BUNDLE);
        if let Err(err) = init.replace(bundle.clone(), system) {
            session.finish(None, Leftovers::Unknown).await;
            return Err(attach::AttachError::Confine(err).into());
        }
    }
    if let Err(err) = init.plan(&opts.command, run_as, &files, &env) {
        session.finish(None, Leftovers::Unknown).await;
        return Err(attach::AttachError::Confine(err).into());
    }
    let sandbox = match fresh_sandbox(opts.sandbox) {
        Ok(sandbox) => sandbox,
        Err(err) => {
            session.finish(None, Leftovers::Unknown).await;
            return Err(err);
        }
    };
    let served = session.serve_with(sandbox, id, interception)?;

    // The workload comes from the init, started before this thread got its
    // lead, so it keeps the priority sluice was started with.
    session.services.shared.workers.serve_ahead_of_workload();
    let terminal = crate::confine::terminal::Foreground::now();
    // Spawned from this (the runtime's main) thread: see host::spawn.
    let mut child = match host::spawn(init, &served.sandbox).await {
        Ok(child) => child,
        Err(err) => {
            session.finish(Some(served), Leftovers::Unknown).await;
            return Err(err.into());
        }
    };
    let status = supervise_command(&mut child, &session).await;
    if let Some(terminal) = terminal {
        terminal.take_back();
    }
    // Ok: the init was waited for (reaped).
    let leftovers = if status.is_ok() {
        Leftovers::InitReaped
    } else {
        Leftovers::Unknown
    };
    session.finish(Some(served), leftovers).await;
    if let Some(path) = delivered {
        let _ = std::fs::remove_file(path);
    }
    status
}

/// The environment variables that point TLS clients at a CA bundle file.
pub(crate) const CA_BUNDLE_VARIABLES: [&str; 5] = [
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];

/// For a policy with a rule that terminates TLS: write the system roots
/// plus the sandbox CA to a file, point the usual variables at it and put
/// it over the distribution's bundle in the workload's mount namespace.
/// Returns the file written, to remove when the workload is gone.
fn deliver_ca(
    interception: &crate::proxy::Interception,
    files: &mut crate::confine::SluiceFiles,
    env: &mut Vec<(String, String)>,
) -> Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("sluice-ca-{}.pem", std::process::id()));
    write_ca_bundle(interception, &path)?;
    for var in CA_BUNDLE_VARIABLES {
        env.push((var.to_string(), path.display().to_string()));
    }
    files.read_only.push(path.clone());
    Ok(path)
}

/// The files `policy`'s secrets are read from: hidden from the workload
/// whether or not a rule uses them.
pub(crate) fn secret_files(policy: &Policy) -> Vec<PathBuf> {
    policy
        .secrets()
        .iter()
        .filter_map(|s| match &s.source {
            crate::policy::SecretSource::File(path) => Some(path.clone()),
            _ => None,
        })
        .collect()
}

/// Write the system roots plus the sandbox CA to `path`, readable by
/// anyone (certificates only, no key) and writable by no one but root. A
/// file left there (a sluice killed before it removed it) is replaced; the
/// new one is created, never opened through a link someone put there.
pub(crate) fn write_ca_bundle(
    interception: &crate::proxy::Interception,
    path: &std::path::Path,
) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let system = std::path::Path::new(crate::intercept::roots::SYSTEM_BUNDLE);
    let pem = crate::intercept::ca::bundle_pem(&interception.ca, system);
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            return Err(err).with_context(|| {
                format!(
                    "cannot replace {} with the sandbox CA bundle (remove it, or name another path)",
                    path.display()
                )
            })
        }
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)
        .and_then(|mut file| file.write_all(pem.as_bytes()))
        .with_context(|| format!("cannot write the sandbox CA bundle {}", path.display()))
}

/// A CA bundle written by [`write_ca_bundle`] for a guest to trust, removed
/// when this is dropped: the CA it holds dies with the sandbox.
pub(crate) struct CaBundleFile(PathBuf);

impl CaBundleFile {
    pub(crate) fn write(
        interception: &crate::proxy::Interception,
        path: PathBuf,
    ) -> Result<CaBundleFile> {
        write_ca_bundle(interception, &path)?;
        Ok(CaBundleFile(path))
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for CaBundleFile {
    fn drop(&mut self) {
        if let Err(err) = std::fs::remove_file(&self.0) {
            if err.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.0.display(), %err, "cannot remove the sandbox CA bundle");
            }
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught from the moment a session starts: a
/// signal that arrives while the workload is being started is not lost, and
/// never kills sluice with the workload still running.
pub(crate) struct Signals {
    int: tokio::sync::Mutex<tokio::signal::unix::Signal>,
    term: tokio::sync::Mutex<tokio::signal::unix::Signal>,
    hup: tokio::sync::Mutex<tokio::signal::unix::Signal>,
}

impl Signals {
    pub(crate) fn install() -> Result<Signals> {
        let catch = |kind| -> Result<_> {
            Ok(tokio::sync::Mutex::new(
                signal(kind).context("cannot install a signal handler")?,
            ))
        };
        Ok(Signals {
            int: catch(SignalKind::interrupt())?,
            term: catch(SignalKind::terminate())?,
            hup: catch(SignalKind::hangup())?,
        })
    }
}

/// Who answers a Ctrl-C typed at the terminal sluice runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CtrlC {
    /// The child is the user's command, in sluice's process group: the
    /// terminal interrupts it directly, and it decides (a shell carries on).
    ChildDecides,
    /// The child is sluice's helper in a process group of its own (`podman
    /// wait` for a detached container): sluice stops the workload.
    SluiceStops,
}

/// Wait for the child; on SIGTERM, or a SIGINT that the child did not get
/// from the terminal itself (see [`CtrlC`]), call `stop` (the first time,
/// and again for a second signal), then SIGKILL the child [`STOP_GRACE`]
/// later; SIGHUP reloads the policy.
pub(crate) async fn supervise(
    child: &mut impl Supervised,
    signals: &Signals,
    reloading: &Reloading,
    ctrl_c: CtrlC,
    mut stop: impl FnMut(nix::sys::signal::Signal),
) -> Result<i32> {
    let mut sigint = signals.int.lock().await;
    let mut sigterm = signals.term.lock().await;
    let mut sighup = signals.hup.lock().await;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let forward = tokio::select! {
            status = child.wait() => return Ok(exit_code(status?)),
            _ = sigint.recv() => {
                if ctrl_c == CtrlC::ChildDecides && terminal_interrupts_the_workload() {
                    // The terminal sent Ctrl-C to its whole foreground group,
                    // the workload included: what to do is the workload's
                    // call (a shell or a REPL carries on), as without sluice.
                    tracing::info!("Ctrl-C at the terminal: the workload got it too; serving it on");
                    None
                } else {
                    Some(nix::sys::signal::Signal::SIGINT)
                }
            }
            _ = sigterm.recv() => Some(nix::sys::signal::Signal::SIGTERM),
            _ = sighup.recv() => {
                tracing::info!("SIGHUP received: reloading the policy");
                reloading.reload_now();
                None
            }
            _ = sleep_until(deadline), if deadline.is_some() => {
                tracing::warn!("the workload did not exit {STOP_GRACE:?} after being asked: killing it");
                let _ = child.start_kill();
                deadline = None;
                None
            }
        };
        if let Some(sig) = forward {
            tracing::info!("{sig} received: stopping the workload");
            stop(sig);
            deadline.get_or_insert(tokio::time::Instant::now() + STOP_GRACE);
        }
    }
}

/// What [`supervise`] needs of a child: podman's `tokio::process::Child`,
/// or a workload's init (`confine::Workload`).
pub(crate) trait Supervised {
    fn id(&self) -> Option<u32>;
    fn start_kill(&mut self) -> std::io::Result<()>;
    fn wait(&mut self) -> impl std::future::Future<Output = std::io::Result<ExitStatus>>;
}

impl Supervised for tokio::process::Child {
    fn id(&self) -> Option<u32> {
        tokio::process::Child::id(self)
    }
    fn start_kill(&mut self) -> std::io::Result<()> {
        tokio::process::Child::start_kill(self)
    }
    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        tokio::process::Child::wait(self).await
    }
}

impl Supervised for crate::confine::Workload {
    fn id(&self) -> Option<u32> {
        crate::confine::Workload::id(self)
    }
    fn start_kill(&mut self) -> std::io::Result<()> {
        crate::confine::Workload::start_kill(self)
    }
    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        crate::confine::Workload::wait(self).await
    }
}

/// Supervise the user's command (the workload itself, or the podman that
/// runs it): signals to sluice are passed on to it, and a Ctrl-C at the
/// terminal is its own to answer.
pub(crate) async fn supervise_command(
    child: &mut impl Supervised,
    session: &Session,
) -> Result<i32> {
    let pid = child.id();
    supervise(
        child,
        &session.signals,
        &session.reloading,
        CtrlC::ChildDecides,
        |sig| {
            if let Some(pid) = pid {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
            }
        },
    )
    .await
}

/// Whether sluice (and so the workload, which shares its process group)
/// is the foreground job of its controlling terminal, so that a Ctrl-C
/// there reached the workload directly.
fn terminal_interrupts_the_workload() -> bool {
    use std::io::IsTerminal;
    use std::os::fd::AsFd;
    let group = nix::unistd::getpgrp();
    let foreground = |fd: std::os::fd::BorrowedFd<'_>| {
        fd.is_terminal() && nix::unistd::tcgetpgrp(fd) == Ok(group)
    };
    foreground(std::io::stdin().as_fd())
        || foreground(std::io::stdout().as_fd())
        || foreground(std::io::stderr().as_fd())
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(crate) fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
