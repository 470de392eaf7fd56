//! The workload's init: PID 1 of its PID namespace. sluice starts it early
//! ([`super::PreparedInit`]: sluice's own binary executed again, as
//! `sluice-init`, the first process of a fresh PID namespace); it takes
//! its stdin back from sluice, waits on a socket for the
//! plan saying what to run ([`InitArgs`]), sets up the mount namespace and
//! puts itself under the seccomp filters but setns(2)'s while sluice makes
//! the network namespace, waits for the go that hands it that namespace,
//! enters it, starts the workload confined (the setns filter,
//! capabilities, user),
//! reaps orphans, passes on the signals sluice sends, and exits with the
//! workload's status (128+N when signal N ended it). Before that it kills
//! and reaps every process left in the namespace (what the kernel would do
//! at its exit) and reports the status on the socket, so that sluice need
//! not wait for the exit itself. If sluice closes the socket without a message
//! (it failed, or exits, before starting a workload), the init exits 0 at
//! once and writes nothing.
//!
//! Which signals are passed on: only those a process outside the namespace
//! sent (sluice asking the workload to stop; si_code SI_USER, no sender
//! pid in here). A signal the kernel sent to the terminal's whole
//! foreground group (Ctrl-C, Ctrl-\, a hangup; si_code SI_KERNEL) already
//! reached the workload, which shares that group, and is not sent twice;
//! signals from the workload's own processes are ignored.
//!
//! It must never run the workload unconfined: any failure before the
//! workload's exec is reported to sluice on the socket (which then exits 3)
//! and nothing runs. It writes nothing to the workload's stdout or stderr.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::child::{self, ChildSetup, Step, WorkloadConfinement};
use super::mounts::{self, FilePlan};
use super::{scm, seccomp, RunAs};

/// The init's name (its comm: `ps`, `/proc/1/comm` in the sandbox).
pub const NAME: &str = "sluice-init";

/// Signals the init takes through its signalfd. sluice blocks them before
/// it starts the init (which inherits the mask through the fork and keeps
/// it through the exec) and unblocks them in itself right after, so none
/// sent while the init starts is lost.
pub(crate) fn taken_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        set.add(sig);
    }
    set
}

/// What sluice tells its init: one message of NUL-terminated fields (see
/// [`InitArgs::to_message`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InitArgs {
    pub(crate) run_as: Option<RunAs>,
    pub(crate) files: FilePlan,
    /// Added to the environment the workload inherits (not the init's).
    pub(crate) env: Vec<(OsString, OsString)>,
    /// Removed from the environment the workload inherits (a secret that
    /// sluice reads from its own environment).
    pub(crate) unset: Vec<OsString>,
    pub(crate) argv: Vec<OsString>,
}

impl InitArgs {
    /// The message: `uid N gid N`, `read-only PATH`, `replace SOURCE
    /// TARGET`, `hide PATH`, `env K V` fields, then `--` and the command, each field ended by a NUL.
    /// Refused if a field holds a NUL itself.
    pub(crate) fn to_message(&self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        let mut field = |bytes: &[u8]| -> Result<(), String> {
            if bytes.contains(&0) {
                return Err(format!(
                    "{:?} holds a NUL byte",
                    String::from_utf8_lossy(bytes)
                ));
            }
            out.extend_from_slice(bytes);
            out.push(0);
            Ok(())
        };
        if let Some(user) = self.run_as {
            field(b"uid")?;
            field(user.uid.to_string().as_bytes())?;
            field(b"gid")?;
            field(user.gid.to_string().as_bytes())?;
        }
        for path in &self.files.read_only {
            field(b"read-only")?;
            field(path.as_os_str().as_bytes())?;
        }
        for (source, target) in &self.files.replaced {
            field(b"replace")?;
            field(source.as_os_str().as_bytes())?;
            field(target.as_os_str().as_bytes())?;
        }
        for path in &self.files.hidden {
            field(b"hide")?;
            field(path.as_os_str().as_bytes())?;
        }
        for (key, value) in &self.env {
            field(b"env")?;
            field(key.as_bytes())?;
            field(value.as_bytes())?;
        }
        for key in &self.unset {
            field(b"unset")?;
            field(key.as_bytes())?;
        }
        field(b"--")?;
        for arg in &self.argv {
            field(arg.as_bytes())?;
        }
        Ok(out)
    }

    /// The inverse of [`InitArgs::to_message`].
    pub(crate) fn from_message(message: &[u8]) -> Result<InitArgs, String> {
        let Some(fields) = message.strip_suffix(&[0]) else {
            return Err("the message does not end with a NUL".into());
        };
        let mut args = fields
            .split(|b| *b == 0)
            .map(|f| OsString::from_vec(f.to_vec()));
        let mut next = |what: &str| args.next().ok_or_else(|| format!("{what} needs a value"));
        let (mut uid, mut gid) = (None, None);
        let mut files = FilePlan::default();
        let mut env = Vec::new();
        let mut unset = Vec::new();
        let number = |v: OsString, what: &str| -> Result<u32, String> {
            v.to_str()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{what} needs a number"))
        };
        loop {
            let arg = next("the message")?;
            match arg.to_str() {
                Some("--") => break,
                Some("uid") => uid = Some(number(next("uid")?, "uid")?),
                Some("gid") => gid = Some(number(next("gid")?, "gid")?),
                Some("read-only") => files.read_only.push(PathBuf::from(next("read-only")?)),
                Some("replace") => {
                    let source = PathBuf::from(next("replace")?);
                    files
                        .replaced
                        .push((source, PathBuf::from(next("replace")?)));
                }
                Some("hide") => files.hidden.push(PathBuf::from(next("hide")?)),
                Some("env") => env.push((next("env")?, next("env")?)),
                Some("unset") => unset.push(next("unset")?),
                _ => return Err(format!("unknown field {arg:?}")),
            }
        }
        let argv: Vec<OsString> = std::iter::from_fn(|| next("").ok()).collect();
        if argv.is_empty() {
            return Err("no command after `--`".into());
        }
        let run_as = match (uid, gid) {
            (Some(uid), Some(gid)) => Some(RunAs { uid, gid }),
            (None, None) => None,
            _ => return Err("uid and gid go together".into()),
        };
        Ok(InitArgs {
            run_as,
            files,
            env,
            unset,
            argv,
        })
    }
}

/// What the init reports on its socket: [`STARTED`] once the workload
/// runs; otherwise one message, one of these and the reason.
pub(crate) const REPORT_EXEC_FAILED: u8 = b'E';
pub(crate) const REPORT_CONFINE_FAILED: u8 = b'C';
pub(crate) const STARTED: u8 = b'S';
/// Then, once the workload has ended and nothing is left in the
/// namespace: this byte and the status the init exits with, in decimal.
pub(crate) const EXITED: u8 = b'X';

/// The status an [`EXITED`] report names, as the init's exit status.
pub(crate) fn exit_report(said: &[u8]) -> Option<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let code = said.strip_prefix(&[EXITED])?;
    let code: u8 = std::str::from_utf8(code).ok()?.parse().ok()?;
    Some(std::process::ExitStatus::from_raw(i32::from(code) << 8))
}

/// Each message of the plan sluice sends its init: this byte, then up to
/// [`CHUNK`] bytes of [`InitArgs::to_message`]; the last one starts with
/// [`LAST`]. Then one message [`GO`], alone, with the sandbox's network
/// namespace attached (or nothing attached: stay in sluice's).
pub(crate) const MORE: u8 = b'+';
pub(crate) const LAST: u8 = b'.';
pub(crate) const GO: u8 = b'!';
/// The first message, alone, before the plan: sluice's stdin attached, for
/// the init (whose stdin was the socket) to take back as its own.
pub(crate) const STDIN: u8 = b'0';
pub(crate) const CHUNK: usize = 32 * 1024;

/// `sluice-init`'s life, from its `main` (see [`super::PreparedInit::fork`],
/// which set its mask and parent-death signal before the exec); never
/// returns. Its stdin is its end of the socket pair to sluice.
pub fn run() -> ! {
    let stdin = std::io::stdin();
    let is_socket = rustix::fs::fstat(stdin.as_fd()).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Socket
    });
    let socket = match stdin.as_fd().try_clone_to_owned() {
        Ok(socket) if is_socket => socket,
        // Not started by sluice: no socket, no one to report to.
        _ => {
            eprintln!("{NAME}: sluice starts this itself for a workload (`sluice run`, `sluice vm`); it is not a command");
            std::process::exit(2)
        }
    };
    let report = |kind: u8, why: &[u8]| {
        let mut said = vec![kind];
        said.extend_from_slice(why);
        let _ = scm::send(std::os::fd::AsRawFd::as_raw_fd(&socket), &said, None);
    };
    let refuse = |why: String| -> ! {
        report(REPORT_CONFINE_FAILED, why.as_bytes());
        std::process::exit(3)
    };
    let name = std::ffi::CString::new(NAME).expect("no NUL in the name");
    let _ = nix::sys::prctl::set_name(&name);
    match receive_stdin(&socket) {
        Ok(Some(())) => {}
        // sluice closed the socket without a word: exit quietly.
        Ok(None) => std::process::exit(0),
        Err(why) => refuse(why),
    }

    let message = match receive_plan(&socket) {
        Ok(Some(message)) => message,
        // sluice closed the socket without a word: exit quietly.
        Ok(None) => std::process::exit(0),
        Err(why) => refuse(why),
    };
    let args = match InitArgs::from_message(&message) {
        Ok(args) => args,
        Err(why) => refuse(format!("the init's message is wrong: {why}")),
    };
    // While sluice sets up the network namespace.
    let ready = match confine(&args) {
        Ok(ready) => ready,
        Err(why) => refuse(why),
    };
    let netns = match receive_go(&socket) {
        Ok(Some(netns)) => netns,
        // sluice gave up before the go (it failed, or was stopped): nothing
        // runs.
        Ok(None) => std::process::exit(0),
        Err(why) => refuse(why),
    };
    if let Some(netns) = netns {
        if let Err(e) = nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET) {
            refuse(format!("cannot {}: {e}", Step::Netns.what()));
        }
    }
    let code = match launch(ready, args.run_as) {
        Ok((workload, signals)) => {
            // It has exec'd (and did not inherit the socket: close-on-exec).
            // If sluice is gone, the parent-death signal ends this init.
            let _ = scm::send(std::os::fd::AsRawFd::as_raw_fd(&socket), &[STARTED], None);
            let code = serve(workload, signals);
            // What the kernel would do at this init's exit, done first, so
            // that sluice can go on while the exit itself (the mount
            // namespace's teardown) runs.
            end_namespace();
            let mut said = vec![EXITED];
            said.extend_from_slice((code & 0xff).to_string().as_bytes());
            let _ = scm::send(std::os::fd::AsRawFd::as_raw_fd(&socket), &said, None);
            code
        }
        Err(Failure::Confine(why)) => {
            report(REPORT_CONFINE_FAILED, why.as_bytes());
            3
        }
        Err(Failure::Exec(err)) => {
            let errno = err.raw_os_error().unwrap_or(libc::ENOEXEC);
            report(REPORT_EXEC_FAILED, errno.to_string().as_bytes());
            match err.kind() {
                std::io::ErrorKind::NotFound => 127,
                _ => 126,
            }
        }
    };
    std::process::exit(code)
}

/// sluice's stdin, made the init's own (fd 0, in place of the socket);
/// `None` when sluice closed the socket before sending it.
fn receive_stdin(socket: &OwnedFd) -> Result<Option<()>, String> {
    let mut buf = [0u8; 2];
    let got = loop {
        match scm::recv(socket, &mut buf) {
            Ok(got) => break got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read sluice's stdin: {e}")),
        }
    };
    if got.bytes == 0 && got.fds.is_empty() {
        return Ok(None);
    }
    if got.truncated || got.fds_truncated || got.fds.len() != 1 || buf[..got.bytes] != [STDIN] {
        return Err("sluice's stdin is not one descriptor".into());
    }
    nix::unistd::dup2_stdin(&got.fds[0])
        .map_err(|e| format!("cannot take sluice's stdin as the init's: {e}"))?;
    Ok(Some(()))
}

/// sluice's plan, whole; `None` when sluice closed the socket before
/// sending anything.
fn receive_plan(socket: &OwnedFd) -> Result<Option<Vec<u8>>, String> {
    let mut message = Vec::new();
    let mut buf = vec![0u8; CHUNK + 1];
    loop {
        let got = match scm::recv(socket, &mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read sluice's message: {e}")),
        };
        if got.bytes == 0 && message.is_empty() && got.fds.is_empty() {
            return Ok(None);
        }
        if got.truncated || got.fds_truncated || !got.fds.is_empty() {
            return Err("sluice's message does not fit".into());
        }
        match buf[..got.bytes].split_first() {
            Some((&MORE, part)) => message.extend_from_slice(part),
            Some((&LAST, part)) => {
                message.extend_from_slice(part);
                return Ok(Some(message));
            }
            _ => return Err("sluice's message ended early".into()),
        }
    }
}

/// sluice's go, with the network namespace to enter if it sent one;
/// `None` when sluice closed the socket instead.
fn receive_go(socket: &OwnedFd) -> Result<Option<Option<OwnedFd>>, String> {
    let mut buf = [0u8; 2];
    loop {
        let got = match scm::recv(socket, &mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("cannot read sluice's go: {e}")),
        };
        if got.bytes == 0 && got.fds.is_empty() {
            return Ok(None);
        }
        if got.truncated || got.fds_truncated || got.fds.len() > 1 || buf[..got.bytes] != [GO] {
            return Err("sluice's go is not one".into());
        }
        return Ok(Some(got.fds.into_iter().next()));
    }
}

enum Failure {
    Confine(String),
    Exec(std::io::Error),
}

/// What the init has ready before the go: the workload's command, set up
/// to confine itself as it starts, and the signals the init takes.
struct Ready {
    cmd: std::process::Command,
    signals: SignalFd,
    /// Where the forked child says which step failed before exec.
    failure_rx: OwnedFd,
}

/// Everything that need not wait for the network namespace: the signals
/// taken, the mount namespace, the seccomp filters installed (all but the
/// one refusing setns(2)), the command set up.
fn confine(args: &InitArgs) -> Result<Ready, String> {
    let taken = taken_signals();
    // Blocked already (sluice did it before the fork); again, to be sure.
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&taken), None)
        .map_err(|e| e.to_string())?;
    // Close-on-exec: the workload must not inherit the init's signals.
    let signals = SignalFd::with_flags(&taken, nix::sys::signalfd::SfdFlags::SFD_CLOEXEC)
        .map_err(|e| e.to_string())?;
    mounts::confine(&args.files).map_err(|e| e.to_string())?;
    // After the mounts, which the filters refuse.
    let filter = seccomp::build()
        .and_then(seccomp::Filters::install_in_init)
        .map_err(|e| e.to_string())?;

    // std's spawn carries only an errno back, which cannot tell a
    // confinement failure (exit 3, nothing ran) from a missing program
    // (127): the child says which step failed on this pipe.
    let (failure_rx, failure_tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(&args.argv[0]);
    cmd.args(&args.argv[1..])
        .envs(args.env.iter().map(|(k, v)| (k, v)));
    for key in &args.unset {
        cmd.env_remove(key);
    }
    child::prepare(
        &mut cmd,
        ChildSetup {
            signal_mask: Some((SigmaskHow::SIG_SETMASK, SigSet::empty())),
            workload: Some(WorkloadConfinement {
                filter,
                drop_bounding: super::caps::bounding_to_drop(),
                run_as: args.run_as,
            }),
            report: Some(failure_tx),
            ..ChildSetup::default()
        },
    );
    Ok(Ready {
        cmd,
        signals,
        failure_rx,
    })
}

/// Start the workload; returns its pid and the signal fd.
fn launch(ready: Ready, run_as: Option<RunAs>) -> Result<(Pid, SignalFd), Failure> {
    let Ready {
        mut cmd,
        signals,
        failure_rx,
    } = ready;
    let spawned = cmd.spawn();
    // The child's copy is closed at its exec or exit; close ours so that
    // reading sees the end.
    drop(cmd);
    let child = spawned.map_err(|err| {
        let mut said = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::fs::File::from(failure_rx), &mut said);
        match child::read_report(&said) {
            None => Failure::Exec(err),
            Some((step, errno)) => {
                let errno = nix::errno::Errno::from_raw(errno);
                Failure::Confine(match (step, run_as) {
                    (Step::Ids, Some(user)) => format!(
                        "cannot switch to uid {} gid {}: {errno}",
                        user.uid, user.gid
                    ),
                    _ => format!("cannot {}: {errno}", step.what()),
                })
            }
        }
    })?;
    Ok((Pid::from_raw(child.id() as i32), signals))
}

/// Reap and pass on signals until the workload ends; returns its status.
fn serve(workload: Pid, signals: SignalFd) -> i32 {
    loop {
        let info = match signals.read_signal() {
            Ok(Some(info)) => info,
            Ok(None) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            // Cannot happen on a valid signalfd; waiting is all that is left.
            Err(_) => return wait_for(workload),
        };
        let Ok(sig) = Signal::try_from(info.ssi_signo as i32) else {
            continue;
        };
        if sig == Signal::SIGCHLD {
            if let Some(code) = reap(workload) {
                return code;
            }
            continue;
        }
        let from_outside = info.ssi_pid == 0 && info.ssi_code != libc::SI_KERNEL;
        if from_outside {
            let _ = nix::sys::signal::kill(workload, sig);
        }
    }
}

/// Reap every child that has ended; the workload's status once it has.
fn reap(workload: Pid) -> Option<i32> {
    let mut ended = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == workload => ended = Some(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == workload => {
                ended = Some(128 + sig as i32)
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return ended,
            Ok(_) => {}
        }
    }
}

/// Kill every process left in the namespace (kill(-1) from its init) and
/// reap each, until none is left.
fn end_namespace() {
    let _ = nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL);
    loop {
        match waitpid(None, None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            // ECHILD: nothing left.
            Err(_) => return,
        }
    }
}

fn wait_for(workload: Pid) -> i32 {
    loop {
        match waitpid(workload, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> InitArgs {
        InitArgs {
            run_as: Some(RunAs {
                uid: 65534,
                gid: 65534,
            }),
            files: FilePlan {
                read_only: vec!["/etc/sluice/p.yaml".into(), "/var/log/a b".into()],
                replaced: vec![(
                    "/run/sluice/ca bundle.pem".into(),
                    "/etc/ssl/certs/ca-certificates.crt".into(),
                )],
                hidden: vec![
                    "/run/sluice/daemon.sock".into(),
                    "/etc/sluice/secrets/gh".into(),
                ],
            },
            env: vec![
                ("SLUICE_TAP".into(), "tap0".into()),
                ("EMPTY".into(), "".into()),
            ],
            unset: vec!["GH_TOKEN".into()],
            argv: vec![
                "sh".into(),
                "-c".into(),
                "--".into(),
                "".into(),
                "uid x".into(),
            ],
        }
    }

    #[test]
    fn init_arguments_survive_the_round_trip() {
        let args = example();
        let message = args.to_message().unwrap();
        assert_eq!(InitArgs::from_message(&message).unwrap(), args);
        let plain = InitArgs {
            run_as: None,
            files: FilePlan::default(),
            env: vec![],
            unset: vec![],
            argv: vec!["true".into()],
        };
        assert_eq!(
            InitArgs::from_message(&plain.to_message().unwrap()).unwrap(),
            plain
        );
    }

    #[test]
    fn a_field_with_a_nul_cannot_be_sent() {
        let mut args = example();
        args.argv.push(OsString::from_vec(b"a\0b".to_vec()));
        assert!(args.to_message().is_err());
    }

    #[test]
    fn bad_init_messages_are_refused() {
        let parse = |s: &[u8]| InitArgs::from_message(s);
        assert!(parse(b"").is_err());
        assert!(parse(b"--\0").is_err());
        assert!(parse(b"--\0true").is_err());
        assert!(parse(b"uid\0x\0gid\x001\0--\0true\0").is_err());
        assert!(parse(b"uid\x001\0--\0true\0").is_err());
        assert!(parse(b"env\0K\0").is_err());
        assert!(parse(b"replace\0/a\0--\0true\0").is_err());
        assert!(parse(b"what\0--\0true\0").is_err());
        assert!(parse(b"--\0true\0").is_ok());
    }
}
