//! sluice's side of starting a confined workload: the early start of its
//! init in a fresh PID namespace ([`PreparedInit`]), the plan that tells
//! the init what to run (sent early, so that the init confines itself while
//! sluice sets up the network namespace), the go that hands it that
//! namespace ([`start`]), and waiting for the init to say whether the
//! workload started. It must never return a running child whose workload
//! is not confined: the init reports confinement failures before the
//! workload's exec, and this turns them into errors.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::signal::SigmaskHow;
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use rustix::process::{pidfd_open, PidfdFlags, WaitId, WaitIdOptions};
use tokio::io::unix::AsyncFd;

use super::child::{self, ChildSetup, Parent};
use super::init::{
    self, InitArgs, CHUNK, GO, LAST, MORE, REPORT_CONFINE_FAILED, REPORT_EXEC_FAILED, STARTED,
    STDIN,
};
use super::{plan_replacements, scm, ConfineError, RunAs, SluiceFiles};

/// How long the init may take to confine and start the workload.
const START_LIMIT: Duration = Duration::from_secs(30);

/// The workload's init, started ahead of time: PID 1 of a fresh PID
/// namespace, waiting on a socket for what to run. Started while sluice is
/// small, it costs a fork of a small process and an exec of sluice.
/// Dropped unused, it closes the socket, and the init exits at once
/// (quietly, status 0) and is reaped here.
pub struct PreparedInit {
    pid: nix::unistd::Pid,
    /// Until the init is handed a workload (or dropped unused).
    held: Option<Held>,
    /// Once it was sent its plan ([`PreparedInit::plan`]).
    planned: Option<Planned>,
    /// (source, target) pairs for the plan ([`PreparedInit::replace`]).
    replaced: Vec<(PathBuf, PathBuf)>,
    unset: Vec<String>,
}

/// What sluice holds of a prepared init.
struct Held {
    /// sluice's end of the socket pair.
    socket: OwnedFd,
    /// A pidfd of the init.
    pidfd: OwnedFd,
}

/// What sluice keeps of the plan it sent.
struct Planned {
    /// The program, to name in errors.
    program: String,
    /// Why the plan could not be sent whole (the init is gone; it may have
    /// said why, which [`start`] reads).
    unsent: Option<std::io::Error>,
}

impl PreparedInit {
    /// Start the init: sluice itself, executed again as `sluice-init`
    /// (see [`init::run`]) as the first process of a fresh PID namespace.
    /// Call first thing, before sluice raises the descriptor limit or opens
    /// descriptors the workload should not see: the init keeps sluice's
    /// limits as they are now, and its program confines itself while sluice
    /// goes on. Needs root (a PID namespace).
    ///
    /// Must be called from the thread that later spawns the workload and
    /// lives as long as sluice (the main thread): the init gets SIGKILL
    /// when the thread that started it dies, and its death takes its whole
    /// PID namespace with it.
    pub fn fork() -> Result<PreparedInit, ConfineError> {
        let setup = |e: nix::Error| ConfineError::Init(e.into());
        // To tell, after the parent-death signal is armed, whether sluice is
        // already gone (a pid namespace's init has no parent pid to compare).
        let sluice = pidfd_open(rustix::process::getpid(), PidfdFlags::empty())
            .map_err(|e| ConfineError::Init(e.into()))?;
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(setup)?;
        // The init's stdin is its socket until the first message hands it
        // sluice's own stdin (which the workload inherits): a descriptor
        // std places, so that the init need not trust a number it is told.
        let stdin = std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(ConfineError::Init)?;
        let mut cmd = std::process::Command::new("/proc/self/exe");
        cmd.arg0(init::NAME).stdin(theirs);
        child::prepare(
            &mut cmd,
            ChildSetup {
                parent_death: Some(nix::sys::signal::Signal::SIGKILL),
                parent_alive: Some(Parent::Pidfd(sluice)),
                ..ChildSetup::default()
            },
        );
        // PID namespaces for children are per thread: this thread's is
        // switched for the one spawn and set back at once.
        let pid_ns = std::fs::File::open(Path::new("/proc/thread-self/ns/pid_for_children"))
            .map_err(ConfineError::Init)?;
        unshare(CloneFlags::CLONE_NEWPID).map_err(setup)?;
        // Held until the init reads them from its signalfd (the child
        // inherits the mask, and an exec keeps it): a stop sent while it
        // starts is not lost. sluice's own mask is back right after.
        let mut mask = nix::sys::signal::SigSet::empty();
        let blocked = nix::sys::signal::sigprocmask(
            SigmaskHow::SIG_BLOCK,
            Some(&init::taken_signals()),
            Some(&mut mask),
        );
        let spawned = match blocked {
            Ok(()) => cmd.spawn().map_err(ConfineError::Init),
            Err(e) => Err(setup(e)),
        };
        if blocked.is_ok() {
            let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&mask), None);
        }
        let back = setns(pid_ns.as_fd(), CloneFlags::CLONE_NEWPID);
        // The pidfd and sluice's end of the socket (in the hook) close now.
        drop(cmd);
        // Never waited on through std: the init is reaped through its pidfd.
        let pid = nix::unistd::Pid::from_raw(spawned?.id() as i32);
        let sent = scm::send(ours.as_raw_fd(), &[STDIN], Some(stdin.as_fd()));
        // The init is our child and not yet reaped: its pid is its own.
        let pidfd = rustix::process::Pid::from_raw(pid.as_raw())
            .ok_or(rustix::io::Errno::SRCH)
            .and_then(|raw| pidfd_open(raw, PidfdFlags::empty()));
        let pidfd = match (pidfd, sent) {
            (Ok(pidfd), Ok(_)) => pidfd,
            (pidfd, sent) => {
                // Told nothing, the init exits at once: reap it.
                drop(ours);
                let _ = nix::sys::wait::waitpid(pid, None);
                let why = match (pidfd, sent) {
                    (Err(e), _) => format!("cannot open a pidfd of the workload's init: {e}"),
                    (_, Err(e)) => format!("cannot hand the workload's init its stdin: {e}"),
                    _ => unreachable!("one of them failed"),
                };
                return Err(ConfineError::Setup(why));
            }
        };
        let prepared = PreparedInit {
            pid,
            held: Some(Held {
                socket: ours,
                pidfd,
            }),
            planned: None,
            replaced: Vec::new(),
            unset: Vec::new(),
        };
        back.map_err(|e| {
            ConfineError::Setup(format!(
                "cannot return to sluice's own PID namespace after starting the init: {e}"
            ))
        })?;
        Ok(prepared)
    }

    /// The init's pid (in sluice's PID namespace).
    pub fn id(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// Show the workload `source`'s content at `target`, read-only: a file
    /// (or directory) sluice wrote, bound over the workload's own (the
    /// sandbox's CA bundle over the distribution's). Taken into the plan
    /// ([`PreparedInit::plan`]), so call it before that: then a target that
    /// does not exist is left alone, and a source that does not exist is an
    /// error. The source itself is read-only for the workload too.
    pub fn replace(
        &mut self,
        source: impl Into<PathBuf>,
        target: impl Into<PathBuf>,
    ) -> Result<(), ConfineError> {
        if self.planned.is_some() {
            return Err(ConfineError::Setup(
                "the workload's init was told what to run already".into(),
            ));
        }
        self.replaced.push((source.into(), target.into()));
        Ok(())
    }

    /// Remove `name` from the environment the workload inherits from
    /// sluice (a secret sluice reads from its own environment). Call it
    /// before [`PreparedInit::plan`].
    pub(crate) fn unset_env(&mut self, name: impl Into<String>) -> Result<(), ConfineError> {
        if self.planned.is_some() {
            return Err(ConfineError::Setup(
                "the workload's init was told what to run already".into(),
            ));
        }
        self.unset.push(name.into());
        Ok(())
    }

    /// Tell the init what it will run: `argv` as `run_as` (root when
    /// `None`) with `env` added to the environment, in a mount namespace
    /// where `files` are protected: only those that exist now, so call it
    /// once every file sluice writes has been created (its records), and
    /// before the network namespace is made: the init sets up the mounts and
    /// builds the seccomp filter at once, meanwhile; it runs nothing before
    /// [`start`]. Sent on the socket as it is (blocking: the init reads
    /// right away).
    pub fn plan(
        &mut self,
        argv: &[OsString],
        run_as: Option<RunAs>,
        files: &SluiceFiles,
        env: &[(String, String)],
    ) -> Result<(), ConfineError> {
        let (Some(held), None) = (&self.held, &self.planned) else {
            return Err(ConfineError::Setup(
                "the workload's init was told what to run already".into(),
            ));
        };
        let program = argv
            .first()
            .ok_or_else(|| ConfineError::Setup("no command to run".into()))?
            .to_string_lossy()
            .into_owned();
        let cwd = std::env::current_dir().map_err(ConfineError::Init)?;
        let mut plan = files.plan(&cwd)?;
        plan_replacements(&self.replaced, &mut plan)?;
        let message = InitArgs {
            run_as,
            files: plan,
            env: env.iter().map(|(k, v)| (k.into(), v.into())).collect(),
            unset: self.unset.iter().map(Into::into).collect(),
            argv: argv.to_vec(),
        }
        .to_message()
        .map_err(|why| ConfineError::Setup(format!("cannot tell the init what to run: {why}")))?;
        let mut unsent = None;
        let mut parts = message.chunks(CHUNK).peekable();
        while let Some(part) = parts.next() {
            let mut bytes = vec![if parts.peek().is_some() { MORE } else { LAST }];
            bytes.extend_from_slice(part);
            if let Err(e) = scm::send(held.socket.as_raw_fd(), &bytes, None) {
                unsent = Some(e);
                break;
            }
        }
        self.planned = Some(Planned { program, unsent });
        Ok(())
    }
}

impl Drop for PreparedInit {
    fn drop(&mut self) {
        // Unused: the init reads the end of file and exits 0 at once.
        if let Some(Held { socket, pidfd }) = self.held.take() {
            drop(socket);
            let _ = rustix::process::waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED);
        }
    }
}

/// A started workload's init, as sluice holds it: what
/// `tokio::process::Child` offers for it (wait, kill, pid), through a
/// pidfd, and the socket on which the init reports the workload's end.
/// Dropped before it was reaped, it is killed (SIGKILL), unless it
/// reported the end already: then it is on its way out, and the drop
/// waits for it.
pub struct Workload {
    pid: u32,
    pidfd: AsyncFd<OwnedFd>,
    /// Until the init has reported the workload's end, or closed it.
    socket: Option<AsyncFd<OwnedFd>>,
    /// What the init reported: its own exit status to come.
    reported: Option<ExitStatus>,
    /// Once it has been reaped.
    status: Option<ExitStatus>,
}

/// What woke a [`Workload::wait`].
enum Woken {
    Exited,
    Said(Option<ExitStatus>),
    Closed,
}

impl Workload {
    /// The init's pid; `None` once it has been reaped.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid)
    }

    /// Wait for the workload to end: for the init's report (it has killed
    /// and reaped every process left in its namespace, and exits with this
    /// status; it is reaped when this is dropped), or else for the init to
    /// exit (reaping it). Its exit status after that.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            let woken = match &self.socket {
                Some(socket) => tokio::select! {
                    // A pidfd is readable once its process has exited.
                    ready = self.pidfd.readable() => {
                        ready?.clear_ready();
                        Woken::Exited
                    }
                    ready = socket.readable() => {
                        let mut ready = ready?;
                        let mut buf = [0u8; 16];
                        match ready.try_io(|s| scm::recv(s.get_ref(), &mut buf)) {
                            Ok(Ok(got)) if got.bytes == 0 => Woken::Closed,
                            Ok(Ok(got)) => Woken::Said(init::exit_report(&buf[..got.bytes])),
                            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                            Ok(Err(_)) => Woken::Closed,
                            Err(_would_block) => continue,
                        }
                    }
                },
                None => {
                    let mut ready = self.pidfd.readable().await?;
                    ready.clear_ready();
                    Woken::Exited
                }
            };
            match woken {
                Woken::Exited => {}
                // Anything else on the socket is not a report: wait for the
                // init's own exit instead.
                Woken::Said(None) | Woken::Closed => self.socket = None,
                Woken::Said(Some(status)) => {
                    self.socket = None;
                    self.reported = Some(status);
                }
            }
        }
    }

    /// Its status if it has exited (reaping it) or reported the workload's
    /// end, without waiting.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        if let Some(status) = self.reap(WaitIdOptions::NOHANG)? {
            return Ok(Some(status));
        }
        Ok(self.reported)
    }

    /// Reap the init if it has exited (waiting for that without `NOHANG`).
    fn reap(&mut self, options: WaitIdOptions) -> std::io::Result<Option<ExitStatus>> {
        let Some(info) = rustix::process::waitid(
            WaitId::PidFd(self.pidfd.get_ref().as_fd()),
            WaitIdOptions::EXITED | options,
        )?
        else {
            return Ok(None);
        };
        let raw = if let Some(code) = info.exit_status() {
            (code & 0xff) << 8
        } else if let Some(sig) = info.terminating_signal() {
            sig | if info.dumped() { 0x80 } else { 0 }
        } else {
            return Ok(None);
        };
        let status = ExitStatus::from_raw(raw);
        self.status = Some(status);
        Ok(Some(status))
    }

    /// Send SIGKILL (to the init: its namespace goes with it), unless it
    /// has been reaped already.
    pub(crate) fn start_kill(&mut self) -> std::io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        match rustix::process::pidfd_send_signal(
            self.pidfd.get_ref(),
            rustix::process::Signal::KILL,
        ) {
            // Exited already, not reaped yet.
            Err(rustix::io::Errno::SRCH) | Ok(()) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        if self.reported.is_some() {
            // Exiting on its own, with nothing left in its namespace: see it
            // gone before sluice is (its exit is the kernel's work alone).
            let _ = self.reap(WaitIdOptions::empty());
        } else {
            let _ = self.start_kill();
            let _ = self.try_wait();
        }
    }
}

/// Start the workload that `init` was told of ([`PreparedInit::plan`]):
/// hand the init `netns` (it enters it; without one it stays in sluice's)
/// and wait for its report. Ok once the workload runs confined, as the
/// init's child in its PID namespace; a confinement failure, a missing
/// program or an init that does not answer within [`START_LIMIT`] is an
/// error, with the init gone.
pub async fn start(
    mut init: PreparedInit,
    netns: Option<OwnedFd>,
) -> Result<Workload, ConfineError> {
    let Some(Planned { program, unsent }) = init.planned.take() else {
        return Err(ConfineError::Setup(
            "the workload's init was not told what to run".into(),
        ));
    };
    // From here the init is this Workload's: dropped on an error, killed.
    let Some(Held { socket, pidfd }) = init.held.take() else {
        return Err(ConfineError::Setup(
            "the workload's init was handed a workload already".into(),
        ));
    };
    let mut workload = Workload {
        pid: init.id(),
        pidfd: child::async_pidfd(pidfd).map_err(ConfineError::Init)?,
        socket: None,
        reported: None,
        status: None,
    };
    drop(init);

    let said = match tokio::time::timeout(START_LIMIT, tell(socket, unsent, netns)).await {
        Ok(said) => said,
        Err(_) => Err(ConfineError::Setup(format!(
            "the workload's init did not start it within {START_LIMIT:?}"
        ))),
    };
    let failed = match said {
        // The end of file: the init is gone without a report, as when it
        // is killed after the workload's exec and before it could say so.
        // Whatever ran is that init's to account for: its exit status
        // (wait) says how it ended, as for a workload killed later.
        Ok((said, socket)) if said == [STARTED] || said.is_empty() => {
            workload.socket = Some(socket);
            return Ok(workload);
        }
        Ok((said, _)) => report_error(&program, &said),
        Err(err) => err,
    };
    // Nothing runs: see the init gone before saying so.
    let _ = workload.start_kill();
    let _ = workload.wait().await;
    Err(failed)
}

/// Send the init its go (with the network namespace), unless sending the
/// plan failed already, then read its report ([`STARTED`] once the
/// workload runs), and hand back the socket for the report of its end. On the runtime's own thread (the socket non-blocking, in its
/// reactor): a helper thread would cost a thread start, a wake-up more for
/// the report, and a join when the runtime shuts down, all on the path of
/// every start.
async fn tell(
    socket: OwnedFd,
    unsent: Option<std::io::Error>,
    netns: Option<OwnedFd>,
) -> Result<(Vec<u8>, AsyncFd<OwnedFd>), ConfineError> {
    rustix::io::ioctl_fionbio(&socket, true).map_err(|e| ConfineError::Init(e.into()))?;
    let socket = child::async_fd(
        socket,
        tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
    )
    .map_err(ConfineError::Init)?;
    let sent = match unsent {
        Some(e) => Err(e),
        None => loop {
            let mut ready = match socket.writable().await {
                Ok(ready) => ready,
                Err(e) => break Err(e),
            };
            let fd = netns.as_ref().map(|fd| fd.as_fd());
            match ready.try_io(|s| scm::send(s.get_ref().as_raw_fd(), &[GO], fd)) {
                Ok(sent) => break sent.map(|_| ()),
                Err(_would_block) => continue,
            }
        },
    };
    drop(netns);
    // The init may have said why it is gone: read that whether or not the
    // go was sent.
    let mut buf = vec![0u8; 64 * 1024];
    let said = loop {
        let mut ready = socket.readable().await.map_err(ConfineError::Init)?;
        match ready.try_io(|s| scm::recv(s.get_ref(), &mut buf)) {
            Ok(Ok(got)) => break buf[..got.bytes].to_vec(),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Ok(Err(e)) => return Err(ConfineError::Init(e)),
            Err(_would_block) => continue,
        }
    };
    match sent {
        Err(e) if said.is_empty() => Err(ConfineError::Setup(format!(
            "the workload's init is gone: cannot send it what to run: {e}"
        ))),
        _ => Ok((said, socket)),
    }
}

/// The error the init's report names.
fn report_error(program: &str, said: &[u8]) -> ConfineError {
    match said.split_first() {
        Some((&REPORT_EXEC_FAILED, errno)) => {
            let errno = String::from_utf8_lossy(errno)
                .parse()
                .unwrap_or(libc::ENOEXEC);
            ConfineError::Exec {
                program: program.to_string(),
                source: std::io::Error::from_raw_os_error(errno),
            }
        }
        Some((&REPORT_CONFINE_FAILED, why)) => {
            ConfineError::Setup(String::from_utf8_lossy(why).into_owned())
        }
        _ => ConfineError::Setup(format!(
            "the workload's init said {:?}",
            String::from_utf8_lossy(said)
        )),
    }
}
