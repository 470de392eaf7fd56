//! sluice's side of starting a confined workload: the init's command line,
//! the fork into a fresh PID namespace, and waiting for the init to say
//! whether the workload started. It must never return a running child
//! whose workload is not confined: the init reports confinement failures
//! before the workload's exec, and this turns them into errors.

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::signal::{SigmaskHow, Signal};
use tokio::process::{Child, Command};

use super::child::{self, ChildSetup, Parent};
use super::init::{self, InitArgs, REPORT_CONFINE_FAILED, REPORT_EXEC_FAILED};
use super::{ConfineError, RunAs, SluiceFiles};

/// How long the init may take to confine and start the workload.
const START_LIMIT: Duration = Duration::from_secs(30);

/// Start `argv` confined: as the child of an init that is PID 1 of a fresh
/// PID namespace, in a mount namespace where `files` are protected, under
/// the seccomp filter and without the dropped capabilities, as `run_as`.
/// With `netns`, the init (and so the workload) runs in that network
/// namespace (entered in the forked child, before the init's exec).
///
/// Must be called from a thread that lives as long as sluice (the
/// runtime's main thread): the init gets SIGKILL when the thread that
/// forked it dies, and its death takes the whole namespace with it.
pub async fn spawn(
    argv: &[OsString],
    run_as: Option<RunAs>,
    files: &SluiceFiles,
    netns: Option<OwnedFd>,
) -> Result<Child, ConfineError> {
    spawn_with_env(argv, run_as, files, &[], netns).await
}

/// [`spawn`], with `env` added to the environment the workload inherits
/// (the VMM under `sluice vm` is told its tap and its guest's addresses).
pub async fn spawn_with_env(
    argv: &[OsString],
    run_as: Option<RunAs>,
    files: &SluiceFiles,
    env: &[(String, String)],
    netns: Option<OwnedFd>,
) -> Result<Child, ConfineError> {
    let program = argv[0].to_string_lossy().into_owned();
    let cwd = std::env::current_dir().map_err(ConfineError::Init)?;
    let plan = files.plan(&cwd)?;
    let (report_rx, report_tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ConfineError::Init(e.into()))?;
    // To tell, after the parent-death signal is armed, whether sluice is
    // already gone (a pid namespace's init has no parent pid to compare).
    let sluice = rustix::process::pidfd_open(
        rustix::process::getpid(),
        rustix::process::PidfdFlags::empty(),
    )
    .map_err(|e| ConfineError::Init(e.into()))?;
    let args = InitArgs {
        report_fd: report_tx.as_raw_fd(),
        run_as,
        files: plan,
        argv: argv.to_vec(),
    };

    let mut std_cmd = std::process::Command::new("/proc/self/exe");
    std_cmd
        .arg0("sluice-init")
        .args(args.to_args())
        .envs(env.iter().map(|(k, v)| (k, v)));
    child::prepare(
        &mut std_cmd,
        ChildSetup {
            netns,
            restore_fd_limit: true,
            // Held until the init reads them from its signalfd: a stop
            // sent while it starts is not lost.
            signal_mask: Some((SigmaskHow::SIG_BLOCK, init::taken_signals())),
            inherit: Some(report_tx),
            parent_death: Some(Signal::SIGKILL),
            parent_alive: Some(Parent::Pidfd(sluice)),
            ..ChildSetup::default()
        },
    );
    let mut cmd = Command::from(std_cmd);
    cmd.kill_on_drop(true);
    let child = spawn_as_namespace_init(&mut cmd)?;
    // Our copy of the report pipe's write end lives in the closure.
    drop(cmd);

    let mut report = std::fs::File::from(report_rx);
    let read = tokio::task::spawn_blocking(move || {
        let mut said = Vec::new();
        report.read_to_end(&mut said).map(|_| said)
    });
    let said = match tokio::time::timeout(START_LIMIT, read).await {
        Ok(Ok(Ok(said))) => said,
        Ok(Ok(Err(e))) => return Err(ConfineError::Init(e)),
        Ok(Err(_)) => return Err(ConfineError::Setup("the report reader failed".into())),
        Err(_) => {
            return Err(ConfineError::Setup(format!(
                "the workload's init did not start it within {START_LIMIT:?}"
            )))
        }
    };
    match said.split_first() {
        None => Ok(child),
        Some((&REPORT_EXEC_FAILED, errno)) => {
            let errno = String::from_utf8_lossy(errno)
                .parse()
                .unwrap_or(libc::ENOEXEC);
            Err(ConfineError::Exec {
                program,
                source: std::io::Error::from_raw_os_error(errno),
            })
        }
        Some((&REPORT_CONFINE_FAILED, why)) => Err(ConfineError::Setup(
            String::from_utf8_lossy(why).into_owned(),
        )),
        Some(_) => Err(ConfineError::Setup(format!(
            "the workload's init said {:?}",
            String::from_utf8_lossy(&said)
        ))),
    }
}

/// Fork `cmd` as the first process (PID 1) of a new PID namespace. PID
/// namespaces for children are per thread: this thread's is switched for
/// the one fork and set back at once, so nothing else sluice starts lands
/// in the workload's namespace.
fn spawn_as_namespace_init(cmd: &mut Command) -> Result<Child, ConfineError> {
    let ours = std::fs::File::open(Path::new("/proc/thread-self/ns/pid_for_children"))
        .map_err(ConfineError::Init)?;
    unshare(CloneFlags::CLONE_NEWPID).map_err(|e| ConfineError::Init(e.into()))?;
    let spawned = cmd.spawn();
    setns(ours.as_fd(), CloneFlags::CLONE_NEWPID).map_err(|e| {
        ConfineError::Setup(format!(
            "cannot return to sluice's own PID namespace after starting the init: {e}"
        ))
    })?;
    spawned.map_err(ConfineError::Init)
}
