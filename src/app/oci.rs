//! `sluice oci -- podman run ...`: the `sluice run` flow with podman as the
//! workload. The sandbox namespace is made and enforced exactly as for
//! `sluice run`; podman is started in sluice's own namespace with
//! `--network ns:<that namespace>` (see `attach::oci` for how the namespace
//! is named); the sandbox is served as soon as podman names the container
//! (its id is the `sandbox` of every record); and everything is torn down
//! when the container ends: at podman's exit, or for `podman run -d` when
//! `podman wait` returns.
//!
//! The sandbox CA and the secrets are made before podman runs (under a
//! provisional name: the container id is not known yet; the records carry
//! the container id all the same): the container gets the secrets'
//! placeholders and, when a rule terminates TLS, the system roots plus the
//! sandbox CA over the distribution's bundle, as `podman run` options.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::AsyncReadExt;

use super::{supervise, supervise_command, CtrlC, PolicySource, ServiceOptions};
use super::{Session, STOP_GRACE};
use crate::attach::oci::{self as podman, PodmanRun};
use crate::attach::oci_check::{Guarded, WrapperHook};
use crate::attach::Sandbox;
use crate::drain::Watch;
use crate::proxy::Interception;
use crate::serve::ServedSandbox;

/// Everything `sluice oci` was asked to do.
pub(crate) struct OciOptions {
    pub(crate) policy: PolicySource,
    pub(crate) services: ServiceOptions,
    pub(crate) podman: PodmanRun,
    /// The container's sandbox namespace, being made since before the
    /// runtime started ([`super::start_sandbox`]).
    pub(crate) sandbox: crate::attach::FreshSandbox,
}

/// How often the container id file is looked for while podman creates the
/// container.
const CIDFILE_POLL: Duration = Duration::from_millis(5);

/// Run the container under enforcement; returns its exit status (podman's
/// own status when podman fails before the container runs).
pub(crate) async fn run(opts: OciOptions) -> Result<i32> {
    // No bind mount of the container may reach a checkpoint key.
    let mut secrets = Guarded::keys(crate::audit::checkpoint::key_paths(
        &opts.services.checkpoints.state_dir,
    ));
    let session = Session::start(opts.services, opts.policy).await?;
    // Nor one of the policy's secret files.
    secrets.extend(Guarded::of_policy(&session.policy()));
    let provisional = crate::sandbox_id::SandboxId::numbered("oci", std::process::id());
    let prepared = session
        .services
        .shared
        .interception(&provisional, &session.policy())
        .context("the container was not started")
        .and_then(|interception| {
            let sandbox = super::fresh_sandbox(opts.sandbox)?;
            let workdir = PrivateDir::create()?;
            let delivery = Delivery::prepare(interception.as_deref(), &session.policy(), &workdir)?;
            Ok((workdir, sandbox, interception, delivery))
        });
    let (workdir, sandbox, interception, delivery) = match prepared {
        Ok(prepared) => prepared,
        Err(err) => {
            session.finish(None, super::Leftovers::Unknown).await;
            return Err(err);
        }
    };
    let status = contain(
        &session,
        sandbox,
        &opts.podman,
        &workdir,
        &secrets,
        interception,
        &delivery,
    )
    .await;
    let (status, served) = match status {
        Ok((status, served)) => (Ok(status), served),
        Err((err, served)) => (Err(err), served),
    };
    // The wrapper's hook refused the container: nothing of it ran; say why
    // as sluice's own bad-input error (exit 2), not as podman's failure.
    let status = match workdir.refusal() {
        Some(why) => Err(podman::OciError::RefusedByHook(why).into()),
        None => status,
    };
    session.finish(served, super::Leftovers::Unknown).await;
    drop(workdir);
    status
}

type Contained =
    std::result::Result<(i32, Option<ServedSandbox>), (anyhow::Error, Option<ServedSandbox>)>;

/// Start podman, serve the sandbox once the container is named, wait for the
/// container to end. Returns the served sandbox for the caller to finish.
async fn contain(
    session: &Session,
    sandbox: Sandbox,
    run: &PodmanRun,
    workdir: &PrivateDir,
    secrets: &[Guarded],
    interception: Option<Arc<Interception>>,
    delivery: &Delivery,
) -> Contained {
    // Kept to clear out the namespace if the sandbox is never served.
    let netns = match sandbox.netns.clone_handle() {
        Ok(netns) => netns,
        Err(err) => return Err((err.into(), None)),
    };
    let ours = workdir.cidfile();
    let cidfile = run.cidfile_or(&ours).to_path_buf();
    let argv = match podman_command(&sandbox, run, workdir, secrets, delivery, &ours) {
        Ok(argv) => argv,
        Err(err) => return Err((err, None)),
    };
    tracing::info!(command = %podman::shown(&argv), "starting podman");
    let mut child = match podman::spawn_podman(&argv, &delivery.unset) {
        Ok(child) => child,
        Err(err) => return Err((err.into(), None)),
    };
    // After podman is started: the container keeps the priority sluice
    // was started with (podman's own wait and stop, started later from
    // this thread, share the lead; they only wait).
    session.services.shared.workers.serve_ahead_of_workload();

    // Drained once podman has returned: the id is then written, or never.
    let (stop_naming, stop_rx) = crate::drain::trigger();
    let own_cidfile = run.cidfile.is_none().then(|| ours.clone());
    let naming = tokio::spawn(serve_when_named(
        cidfile,
        own_cidfile,
        sandbox,
        session.reloading.handle().clone(),
        session.services.shared.clone(),
        interception,
        stop_rx,
    ));
    let status = supervise_command(&mut child, session).await;

    // A detached container runs on after podman returns: wait for it.
    let detached = run.detach && matches!(status, Ok(0));
    let served = match named(naming, &stop_naming, detached).await {
        Ok(Some(served)) => served,
        Ok(None) => {
            // podman failed before it created the container: nothing ran.
            netns.kill_processes_inside();
            return status.map(|s| (s, None)).map_err(|e| (e, None));
        }
        Err(err) => {
            netns.kill_processes_inside();
            return Err((err, None));
        }
    };
    let status = match status {
        Ok(status) => status,
        Err(err) => return Err((err, Some(served))),
    };
    if !run.detach || status != 0 {
        return Ok((status, Some(served)));
    }
    match wait_detached(session, run, served.id.as_str()).await {
        Ok(status) => Ok((status, Some(served))),
        Err(err) => Err((err, Some(served))),
    }
}

/// The podman command line that runs the container in `sandbox`'s
/// namespace, with the wrapper's hook installed for it. The confinement
/// check runs on the container's final config, in that hook (see
/// attach::oci_check).
fn podman_command(
    sandbox: &Sandbox,
    run: &PodmanRun,
    workdir: &PrivateDir,
    secrets: &[Guarded],
    delivery: &Delivery,
    ours: &Path,
) -> Result<Vec<OsString>> {
    let netns_path = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        sandbox.netns.as_fd().as_raw_fd()
    ));
    let argv = run.command_line(&netns_path, sandbox.netns.inode(), ours, &delivery.options);
    let hook = WrapperHook::install(&workdir.0, sandbox.netns.inode(), secrets)
        .map_err(|err| anyhow::Error::from(err).context("cannot write the wrapper's OCI hook"))?;
    Ok(hook.command_line(argv, &run.podman()))
}

/// What serving the sandbox came to once podman returned (`naming` is
/// told to stop looking then): the served sandbox, or `None` if podman
/// never named a container. A `detached` container gets ten seconds more
/// to be named.
async fn named(
    naming: tokio::task::JoinHandle<Result<Option<ServedSandbox>>>,
    stop_naming: &crate::drain::Trigger,
    detached: bool,
) -> Result<Option<ServedSandbox>> {
    let joined = if detached {
        let named = tokio::time::timeout(Duration::from_secs(10), naming).await;
        stop_naming.drain();
        match named {
            Ok(joined) => joined,
            Err(_) => {
                anyhow::bail!("podman started the container but did not write its id: stopped it")
            }
        }
    } else {
        stop_naming.drain();
        naming.await
    };
    joined.unwrap_or_else(|join| Err(anyhow::anyhow!("serving the sandbox failed: {join}")))
}

/// Wait for podman to write the container id, then serve the sandbox under
/// that id. Until then connections wait in the listeners' backlog. `None`:
/// podman ended before it named a container.
async fn serve_when_named(
    cidfile: PathBuf,
    own_cidfile: Option<PathBuf>,
    sandbox: Sandbox,
    policy: crate::bundle::PolicyHandle,
    shared: super::Shared,
    interception: Option<Arc<Interception>>,
    stop: Watch,
) -> Result<Option<ServedSandbox>> {
    loop {
        let stopping = stop.is_draining();
        if let Some(id) = podman::read_cidfile(&cidfile) {
            if let Some(ours) = own_cidfile.as_deref() {
                // Read: nothing needs it any more, so nothing can be left.
                let _ = std::fs::remove_file(ours);
                let _ = ours.parent().map(std::fs::remove_dir);
            }
            tracing::info!(
                netns_inode = sandbox.netns.inode(),
                sandbox = %id,
                "sandbox ready"
            );
            return ServedSandbox::start_with(sandbox, id, policy, &shared, interception).map(Some);
        }
        if stopping {
            return Ok(None);
        }
        tokio::select! {
            _ = tokio::time::sleep(CIDFILE_POLL) => {}
            _ = stop.draining() => {}
        }
    }
}

/// `podman run -d` returned: stay until the container stops (`podman wait`);
/// SIGINT/SIGTERM stop it with `podman stop`.
async fn wait_detached(session: &Session, run: &PodmanRun, id: &str) -> Result<i32> {
    let podman: Vec<OsString> = run.podman();
    let mut wait = podman::spawn_wait(&podman, id)?;
    let mut out = wait.stdout.take().expect("piped stdout");
    let mut err = wait.stderr.take().expect("piped stderr");
    let read = tokio::spawn(async move {
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let _ = tokio::join!(out.read_to_end(&mut o), err.read_to_end(&mut e));
        (o, e)
    });
    let mut stops = Vec::new();
    let grace = STOP_GRACE.saturating_sub(Duration::from_secs(1));
    supervise(
        &mut wait,
        &session.signals,
        &session.reloading,
        CtrlC::SluiceStops,
        |_| {
            if stops.is_empty() {
                match podman::spawn_stop(&podman, id, grace) {
                    Ok(child) => stops.push(child),
                    Err(err) => tracing::warn!(%err, "cannot stop the container"),
                }
            }
        },
    )
    .await?;
    for mut stop in stops {
        let _ = stop.wait().await;
    }
    let (stdout, stderr) = read.await.unwrap_or_default();
    match podman::wait_result(&stdout, &stderr) {
        Ok(code) => Ok(code),
        Err(why) => {
            tracing::warn!(
                container = id,
                "the container ended but its exit status could not be read ({why}); \
                 with --rm podman may have removed it first: reporting 0"
            );
            Ok(0)
        }
    }
}

/// What the container is given of the sandbox CA and the secrets, as
/// `podman run` options, and what podman itself must not pass on.
struct Delivery {
    /// When a rule terminates TLS: `--volume
    /// BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro`, `--env
    /// VAR=/etc/ssl/certs/ca-certificates.crt` for each of
    /// [`super::CA_BUNDLE_VARIABLES`], and `--env
    /// SLUICE_SECRET_<NAME>=<placeholder>` for every secret.
    options: Vec<OsString>,
    /// Variables sluice read secrets from: not podman's (its `-e VAR` and
    /// `--env-host` would copy them into the container).
    unset: Vec<String>,
}

impl Delivery {
    /// Write the bundle (system roots plus the sandbox CA) into `workdir`
    /// when there is an interception (the policy terminates TLS), and say
    /// how podman hands it and the placeholders to the container.
    fn prepare(
        interception: Option<&Interception>,
        policy: &crate::policy::Policy,
        workdir: &PrivateDir,
    ) -> Result<Delivery> {
        let mut options: Vec<OsString> = Vec::new();
        let system = crate::intercept::roots::SYSTEM_BUNDLE;
        if let Some(interception) = interception {
            let pem = crate::intercept::ca::bundle_pem(&interception.ca, Path::new(system));
            let bundle = workdir.0.join("ca-bundle.pem");
            write_readable(&bundle, &pem).with_context(|| {
                format!("cannot write the sandbox CA bundle {}", bundle.display())
            })?;
            let mut volume = bundle.into_os_string();
            volume.push(format!(":{system}:ro"));
            options.push("--volume".into());
            options.push(volume);
            for var in super::CA_BUNDLE_VARIABLES {
                options.push("--env".into());
                options.push(format!("{var}={system}").into());
            }
            for (var, placeholder) in interception.secrets.placeholder_env() {
                options.push("--env".into());
                options.push(format!("{var}={placeholder}").into());
            }
        }
        let unset = policy
            .secrets()
            .iter()
            .filter_map(|s| match &s.source {
                crate::policy::SecretSource::Env(var) => Some(var.clone()),
                _ => None,
            })
            .collect();
        Ok(Delivery { options, unset })
    }
}

/// `text` in a new file any user in the container may read (the directory
/// around it stays root's).
fn write_readable(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)?;
    file.write_all(text.as_bytes())
}

/// Where the wrappers' private directories live (root-owned tmpfs).
const WORK_PARENT: &str = "/run/sluice";

/// A directory only root can enter, for the container id file (removed as
/// soon as the id is read), the wrapper's hook and the CA bundle the
/// container binds; removed on drop. A SIGKILLed wrapper's directory is
/// removed by the next `sluice oci`.
struct PrivateDir(PathBuf);

impl PrivateDir {
    fn create() -> Result<PrivateDir> {
        use std::os::unix::fs::DirBuilderExt;
        let parent = PathBuf::from(WORK_PARENT);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        sweep_stale(&parent);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = parent.join(format!("oci-{}.{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(PrivateDir(path))
    }

    fn cidfile(&self) -> PathBuf {
        self.0.join("cid")
    }

    /// Why the wrapper's hook refused the container, if it did.
    fn refusal(&self) -> Option<String> {
        std::fs::read_to_string(self.0.join(crate::attach::oci_check::REPORT_FILE))
            .ok()
            .filter(|r| !r.is_empty())
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Remove the directories of wrappers that are gone.
fn sweep_stale(parent: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("oci-")
            .and_then(|rest| rest.split('.').next())
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
