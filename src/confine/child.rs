//! What a forked child does between fork and exec, for every process sluice
//! starts with a setup of its own: the workload's init (sluice re-executed),
//! the workload (from its init) and podman (`sluice oci`); and the one
//! unsafe registration of a descriptor with tokio's reactor ([`async_fd`]).
//!
//! The setup is plain data ([`ChildSetup`]): which namespace to enter,
//! which signal mask, which descriptor to keep, whether to die with the
//! parent, and for the workload its seccomp filters, capabilities and ids.
//! [`prepare`] turns it into the one `pre_exec` hook of the crate, built
//! here, so the code that runs in the child is this module's alone and
//! makes only async-signal-safe system calls on that data: no allocation,
//! no lock, nothing another thread of a multi-threaded parent could hold.
//! This module must never run anything in the child that is not listed in
//! a [`ChildSetup`], and never lets a setup step fail silently.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};

use super::seccomp::LastFilter;
use super::RunAs;

/// Everything a child does before exec, in this order (each step optional).
#[derive(Default)]
pub(crate) struct ChildSetup {
    /// setns(2) into this network namespace, first: the rest needs no
    /// privilege.
    pub(crate) netns: Option<OwnedFd>,
    /// Give the child back the descriptor limit sluice started with.
    pub(crate) restore_fd_limit: bool,
    /// sigprocmask(2) before exec (the mask survives exec).
    pub(crate) signal_mask: Option<(SigmaskHow, SigSet)>,
    /// A descriptor the program after exec inherits (its close-on-exec
    /// flag is cleared in the child only).
    pub(crate) inherit: Option<OwnedFd>,
    /// The signal the child gets when the thread that forked it dies.
    pub(crate) parent_death: Option<Signal>,
    /// Refuse to exec if the parent is gone already (checked after
    /// `parent_death` is armed, which cannot fire for a parent that died
    /// before).
    pub(crate) parent_alive: Option<Parent>,
    /// The workload's own confinement, last.
    pub(crate) workload: Option<WorkloadConfinement>,
    /// Where a failed step is reported before the spawn fails (see
    /// [`read_report`]); without it, the spawn fails with the step's errno.
    pub(crate) report: Option<OwnedFd>,
}

/// How the child tells that its parent is still there.
pub(crate) enum Parent {
    /// The parent's pid, compared with getppid(2).
    Pid(nix::unistd::Pid),
    /// A pidfd of the parent, readable once it has exited: for a child
    /// that is the first of a new PID namespace, whose parent pid is 0.
    Pidfd(OwnedFd),
}

/// The workload's seccomp filter (the last one: its parent, the init,
/// installed the others), capabilities and ids.
pub(crate) struct WorkloadConfinement {
    pub(crate) filter: LastFilter,
    /// Dropped from the bounding set (only those this kernel knows).
    pub(crate) drop_bounding: Vec<rustix::thread::CapabilitySet>,
    pub(crate) run_as: Option<RunAs>,
}

/// A step that can fail, as a report names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Step {
    Netns = b'n',
    FdLimit = b'f',
    SignalMask = b'm',
    Inherit = b'd',
    ParentDeath = b'p',
    ParentGone = b'g',
    Seccomp = b's',
    Bounding = b'b',
    Ambient = b'a',
    Inheritable = b'i',
    Ids = b'u',
}

const STEPS: [Step; 11] = [
    Step::Netns,
    Step::FdLimit,
    Step::SignalMask,
    Step::Inherit,
    Step::ParentDeath,
    Step::ParentGone,
    Step::Seccomp,
    Step::Bounding,
    Step::Ambient,
    Step::Inheritable,
    Step::Ids,
];

impl Step {
    /// What failed, for the message sluice prints.
    pub(crate) fn what(self) -> &'static str {
        match self {
            Step::Netns => "enter the sandbox's network namespace",
            Step::FdLimit => "restore the descriptor limit",
            Step::SignalMask => "set the signal mask",
            Step::Inherit => "pass the report pipe on",
            Step::ParentDeath => "arm the parent-death signal",
            Step::ParentGone => "start: sluice exited during the spawn",
            Step::Seccomp => "install the workload's seccomp filter",
            Step::Bounding => "drop capabilities from the bounding set",
            Step::Ambient => "clear the ambient capability set",
            Step::Inheritable => "clear the inheritable capability set",
            Step::Ids => "switch to the requested uid and gid",
        }
    }
}

/// A failed step's report, as the parent reads it: one byte naming the
/// [`Step`], then its errno (4 bytes, little-endian).
pub(crate) fn read_report(said: &[u8]) -> Option<(Step, i32)> {
    match said {
        [step, e0, e1, e2, e3] => Some((
            STEPS.into_iter().find(|s| *s as u8 == *step)?,
            i32::from_le_bytes([*e0, *e1, *e2, *e3]),
        )),
        _ => None,
    }
}

/// Make `setup` the `pre_exec` hook of `cmd`. The hook owns the setup's
/// descriptors, so they stay open until `cmd` is dropped.
pub(crate) fn prepare(cmd: &mut std::process::Command, setup: ChildSetup) {
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe calls are sound (the parent may be multi-threaded).
    // `ChildSetup::run` makes only system calls, through nix and rustix
    // wrappers that neither allocate nor lock, on data the closure owns:
    // setns, getrlimit/setrlimit, sigprocmask, fcntl, prctl, getppid, poll,
    // seccomp, capget/capset, setgroups/setgid/setuid and write. Errors are
    // raw errnos, which need no allocation.
    unsafe {
        cmd.pre_exec(move || setup.run().map_err(std::io::Error::from_raw_os_error));
    }
}

impl ChildSetup {
    /// The steps, in the child (see [`prepare`] for what they may call).
    fn run(&self) -> Result<(), i32> {
        let fail = |step: Step, errno: i32| {
            if let Some(report) = &self.report {
                let e = errno.to_le_bytes();
                let _ = rustix::io::write(report, &[step as u8, e[0], e[1], e[2], e[3]]);
            }
            errno
        };
        let nix = |step: Step| move |e: nix::Error| fail(step, e as i32);
        if let Some(netns) = &self.netns {
            nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(nix(Step::Netns))?;
        }
        if self.restore_fd_limit {
            super::fds::restore_for_workload().map_err(|e| fail(Step::FdLimit, raw(&e)))?;
        }
        if let Some((how, set)) = &self.signal_mask {
            nix::sys::signal::sigprocmask(*how, Some(set), None).map_err(nix(Step::SignalMask))?;
        }
        if let Some(fd) = &self.inherit {
            nix::fcntl::fcntl(
                fd,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )
            .map_err(nix(Step::Inherit))?;
        }
        if let Some(sig) = self.parent_death {
            nix::sys::prctl::set_pdeathsig(sig).map_err(nix(Step::ParentDeath))?;
        }
        let gone = match &self.parent_alive {
            Some(Parent::Pid(parent)) => nix::unistd::getppid() != *parent,
            Some(Parent::Pidfd(parent)) => {
                let mut alive = [rustix::event::PollFd::new(
                    parent,
                    rustix::event::PollFlags::IN,
                )];
                let now = rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                rustix::event::poll(&mut alive, Some(&now))
                    .map_err(|e| fail(Step::ParentGone, e.raw_os_error()))?
                    != 0
            }
            None => false,
        };
        if gone {
            return Err(fail(Step::ParentGone, libc::ESRCH));
        }
        if let Some(workload) = &self.workload {
            workload.run(&fail)?;
        }
        Ok(())
    }
}

impl WorkloadConfinement {
    /// Filters first (seccompiler sets no_new_privs with them), then the
    /// capabilities, then the ids.
    fn run(&self, fail: &impl Fn(Step, i32) -> i32) -> Result<(), i32> {
        let io = |step: Step| move |e: rustix::io::Errno| fail(step, e.raw_os_error());
        self.filter
            .install_in_child()
            .map_err(|e| fail(Step::Seccomp, e))?;
        for &cap in &self.drop_bounding {
            rustix::thread::remove_capability_from_bounding_set(cap).map_err(io(Step::Bounding))?;
        }
        rustix::thread::clear_ambient_capability_set().map_err(io(Step::Ambient))?;
        let mut sets = rustix::thread::capabilities(None).map_err(io(Step::Inheritable))?;
        sets.inheritable = rustix::thread::CapabilitySet::empty();
        rustix::thread::set_capabilities(None, sets).map_err(io(Step::Inheritable))?;
        if let Some(user) = self.run_as {
            let gid = nix::unistd::Gid::from_raw(user.gid);
            let uid = nix::unistd::Uid::from_raw(user.uid);
            nix::unistd::setgroups(&[gid])
                .and_then(|()| nix::unistd::setgid(gid))
                .and_then(|()| nix::unistd::setuid(uid))
                .map_err(|e| fail(Step::Ids, e as i32))?;
        }
        Ok(())
    }
}

/// A pidfd in tokio's reactor (readable once its process has exited).
pub(crate) fn async_pidfd(pidfd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    async_fd(pidfd, tokio::io::Interest::READABLE)
}

/// `fd` in the runtime's reactor, for `interest` (a non-blocking socket).
pub(crate) fn async_fd(
    fd: OwnedFd,
    interest: tokio::io::Interest,
) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd's descriptor is open and the same for as long as
    // the AsyncFd owns it. (AsyncFd::with_interest, the safe-looking one,
    // is deprecated by tokio as unsound: tokio-rs/tokio#8587.)
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }
        .map_err(std::io::Error::from)
}

fn raw(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_names_its_step_and_errno() {
        for step in STEPS {
            let e = libc::EPERM.to_le_bytes();
            let said = [step as u8, e[0], e[1], e[2], e[3]];
            assert_eq!(read_report(&said), Some((step, libc::EPERM)));
            assert!(!step.what().is_empty());
        }
        assert_eq!(read_report(b"x"), None);
        assert_eq!(read_report(b"zzzzz"), None);
    }
}
