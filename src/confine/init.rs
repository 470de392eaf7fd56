//! The workload's init: PID 1 of its PID namespace. sluice re-executes
//! itself (`/proc/self/exe` with [`MARKER`] as the first argument) as the
//! first process of a fresh PID namespace; this code then sets up the mount
//! namespace, starts the workload confined (seccomp, capabilities, user),
//! reaps orphans, passes on the signals sluice sends, and exits with the
//! workload's status (128+N when signal N ended it). Its exit takes every
//! process left in the namespace with it: the kernel kills them when a PID
//! namespace's init dies.
//!
//! Which signals are passed on: only those a process outside the namespace
//! sent (sluice asking the workload to stop; si_code SI_USER, no sender
//! pid in here). A signal the kernel sent to the terminal's whole
//! foreground group (Ctrl-C, Ctrl-\, a hangup; si_code SI_KERNEL) already
//! reached the workload, which shares that group, and is not sent twice;
//! signals from the workload's own processes are ignored.
//!
//! It must never run the workload unconfined: any failure before the
//! workload's exec is reported to sluice (which then exits 3) and nothing
//! runs. It writes nothing to the workload's stdout or stderr.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::child::{self, ChildSetup, Step, WorkloadConfinement};
use super::mounts::{self, FilePlan};
use super::{seccomp, RunAs};

/// The first argument that makes the sluice binary this init.
pub const MARKER: &str = "__sluice-workload-init";

/// Signals the init takes through its signalfd. sluice blocks them in the
/// child before exec, so none sent while the init starts is lost.
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

/// What sluice tells its init, as command-line arguments after [`MARKER`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InitArgs {
    /// The pipe on which the init says whether the workload started.
    pub report_fd: i32,
    pub run_as: Option<RunAs>,
    pub files: FilePlan,
    pub argv: Vec<OsString>,
}

impl InitArgs {
    pub(crate) fn to_args(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = vec![MARKER.into(), "--report".into()];
        out.push(self.report_fd.to_string().into());
        if let Some(user) = self.run_as {
            out.extend([
                "--uid".into(),
                user.uid.to_string().into(),
                "--gid".into(),
                user.gid.to_string().into(),
            ]);
        }
        for path in &self.files.read_only {
            out.extend(["--read-only".into(), path.clone().into_os_string()]);
        }
        for path in &self.files.hidden {
            out.extend(["--hide".into(), path.clone().into_os_string()]);
        }
        out.push("--".into());
        out.extend(self.argv.iter().cloned());
        out
    }

    /// The inverse of [`InitArgs::to_args`] (from the argument after the marker).
    pub(crate) fn parse(mut args: impl Iterator<Item = OsString>) -> Result<InitArgs, String> {
        let mut report_fd = None;
        let (mut uid, mut gid) = (None, None);
        let mut files = FilePlan::default();
        let number = |v: Option<OsString>, what: &str| -> Result<u32, String> {
            v.and_then(|v| v.to_str()?.parse().ok())
                .ok_or_else(|| format!("{what} needs a number"))
        };
        loop {
            let Some(arg) = args.next() else {
                return Err("no `--` before the command".into());
            };
            match arg.to_str() {
                Some("--") => break,
                Some("--report") => report_fd = Some(number(args.next(), "--report")? as i32),
                Some("--uid") => uid = Some(number(args.next(), "--uid")?),
                Some("--gid") => gid = Some(number(args.next(), "--gid")?),
                Some("--read-only") => files.read_only.push(PathBuf::from(
                    args.next().ok_or("--read-only needs a path")?,
                )),
                Some("--hide") => files
                    .hidden
                    .push(PathBuf::from(args.next().ok_or("--hide needs a path")?)),
                _ => return Err(format!("unknown argument {arg:?}")),
            }
        }
        let argv: Vec<OsString> = args.collect();
        if argv.is_empty() {
            return Err("no command after `--`".into());
        }
        let run_as = match (uid, gid) {
            (Some(uid), Some(gid)) => Some(RunAs { uid, gid }),
            (None, None) => None,
            _ => return Err("--uid and --gid go together".into()),
        };
        Ok(InitArgs {
            report_fd: report_fd.ok_or("no --report")?,
            run_as,
            files,
            argv,
        })
    }
}

/// What the init reports on its pipe: nothing (end of file) once the
/// workload runs; otherwise one of these and the reason.
pub(crate) const REPORT_EXEC_FAILED: u8 = b'E';
pub(crate) const REPORT_CONFINE_FAILED: u8 = b'C';

/// The init's entry point (main.rs calls it before parsing the command
/// line when the first argument is [`MARKER`]).
pub fn main() -> ! {
    let args = match InitArgs::parse(std::env::args_os().skip(2)) {
        Ok(args) => args,
        Err(why) => {
            eprintln!("sluice: error: {MARKER} is sluice's own workload init, started by `sluice run`: {why}");
            std::process::exit(2);
        }
    };
    // Run by hand with a number that names no descriptor: refuse, rather
    // than adopt (and later close) something that is not there.
    if std::fs::symlink_metadata(format!("/proc/self/fd/{}", args.report_fd)).is_err() {
        eprintln!(
            "sluice: error: {MARKER} is sluice's own workload init, started by `sluice run`: descriptor {} is not open",
            args.report_fd
        );
        std::process::exit(2);
    }
    // Adopted without `unsafe`: the pipe reopened through /proc (a new,
    // close-on-exec descriptor of the same pipe: the workload must not
    // inherit it, its close at exec is the "started"), then the inherited
    // number closed. Nothing else in this freshly executed process uses it.
    let reopened = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/self/fd/{}", args.report_fd));
    let _ = nix::unistd::close(args.report_fd);
    let mut report = match reopened {
        Ok(report) => report,
        Err(err) => {
            eprintln!(
                "sluice: error: {MARKER}: cannot reopen descriptor {}: {err}",
                args.report_fd
            );
            std::process::exit(2);
        }
    };
    let code = match start(&args) {
        Ok((workload, signals)) => {
            drop(report);
            serve(workload, signals)
        }
        Err(Failure::Confine(why)) => {
            let _ = write!(report, "{}{why}", REPORT_CONFINE_FAILED as char);
            3
        }
        Err(Failure::Exec(err)) => {
            let _ = write!(
                report,
                "{}{}",
                REPORT_EXEC_FAILED as char,
                err.raw_os_error().unwrap_or(libc::ENOEXEC)
            );
            match err.kind() {
                std::io::ErrorKind::NotFound => 127,
                _ => 126,
            }
        }
    };
    std::process::exit(code)
}

enum Failure {
    Confine(String),
    Exec(std::io::Error),
}

/// Confine, then start the workload; returns its pid and the signal fd.
fn start(args: &InitArgs) -> Result<(Pid, SignalFd), Failure> {
    let confine = |e: &dyn std::fmt::Display| Failure::Confine(e.to_string());
    let taken = taken_signals();
    // Blocked already (sluice did it before exec); again, in case this
    // init was started some other way.
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&taken), None)
        .map_err(|e| confine(&e))?;
    // Close-on-exec: the workload must not inherit the init's signals.
    let signals = SignalFd::with_flags(&taken, nix::sys::signalfd::SfdFlags::SFD_CLOEXEC)
        .map_err(|e| confine(&e))?;
    mounts::confine(&args.files).map_err(|e| confine(&e))?;
    let filters = seccomp::build().map_err(|e| confine(&e))?;
    let run_as = args.run_as;

    // Where the forked child says which step failed before exec: std's
    // spawn carries only an errno back, which cannot tell a confinement
    // failure (exit 3, nothing ran) from a missing program (127).
    let (failure_rx, failure_tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| confine(&e))?;
    let mut cmd = std::process::Command::new(&args.argv[0]);
    cmd.args(&args.argv[1..]);
    child::prepare(
        &mut cmd,
        ChildSetup {
            signal_mask: Some((SigmaskHow::SIG_SETMASK, SigSet::empty())),
            workload: Some(WorkloadConfinement {
                filters,
                drop_bounding: super::caps::bounding_to_drop(),
                run_as,
            }),
            report: Some(failure_tx),
            ..ChildSetup::default()
        },
    );
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

    #[test]
    fn init_arguments_survive_the_round_trip() {
        let args = InitArgs {
            report_fd: 7,
            run_as: Some(RunAs {
                uid: 65534,
                gid: 65534,
            }),
            files: FilePlan {
                read_only: vec!["/etc/sluice/p.yaml".into(), "/var/log/a b".into()],
                hidden: vec!["/run/sluice/daemon.sock".into()],
            },
            argv: vec!["sh".into(), "-c".into(), "--read-only x".into()],
        };
        let line = args.to_args();
        assert_eq!(line[0], MARKER);
        assert_eq!(InitArgs::parse(line.into_iter().skip(1)).unwrap(), args);
    }

    #[test]
    fn bad_init_arguments_are_refused() {
        let parse = |s: &[&str]| InitArgs::parse(s.iter().map(OsString::from));
        assert!(parse(&["--report", "3"]).is_err());
        assert!(parse(&["--report", "3", "--"]).is_err());
        assert!(parse(&["--report", "x", "--", "true"]).is_err());
        assert!(parse(&["--uid", "1", "--report", "3", "--", "true"]).is_err());
        assert!(parse(&["--report", "3", "--", "true"]).is_ok());
    }
}
