//! The terminal sluice was started in the foreground of. An interactive
//! workload (a shell) takes the terminal for a process group of its own,
//! and when it exits it cannot give it back: from inside its PID namespace
//! sluice's process group has no number. So sluice takes it back itself
//! once the workload has ended, as the shell would have. This module must
//! never take a terminal sluice did not have.

#![forbid(unsafe_code)]

use std::os::fd::AsFd;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;

/// sluice's process group and the terminal (on stdin, stdout or stderr)
/// whose foreground group it was when the workload started.
pub(crate) struct Foreground {
    group: Pid,
    which: Stdio,
}

#[derive(Clone, Copy)]
enum Stdio {
    In,
    Out,
    Err,
}

impl Stdio {
    fn with<T>(self, f: impl FnOnce(std::os::fd::BorrowedFd<'_>) -> T) -> T {
        match self {
            Stdio::In => f(std::io::stdin().as_fd()),
            Stdio::Out => f(std::io::stdout().as_fd()),
            Stdio::Err => f(std::io::stderr().as_fd()),
        }
    }
}

impl Foreground {
    /// The terminal sluice is in the foreground of now, if any.
    pub(crate) fn now() -> Option<Foreground> {
        let group = nix::unistd::getpgrp();
        [Stdio::In, Stdio::Out, Stdio::Err]
            .into_iter()
            .find(|s| {
                s.with(|fd| {
                    nix::unistd::isatty(fd).unwrap_or(false)
                        && nix::unistd::tcgetpgrp(fd).is_ok_and(|g| g == group)
                })
            })
            .map(|which| Foreground { group, which })
    }

    /// Make sluice's group the terminal's foreground again, if the workload
    /// left another there. SIGTTOU is held meanwhile: a background group
    /// that sets the foreground would otherwise be stopped by it.
    pub(crate) fn take_back(&self) {
        self.which.with(|fd| {
            if nix::unistd::tcgetpgrp(fd).is_ok_and(|g| g == self.group) {
                return;
            }
            let mut ttou = SigSet::empty();
            ttou.add(Signal::SIGTTOU);
            let mut before = SigSet::empty();
            if nix::sys::signal::pthread_sigmask(
                SigmaskHow::SIG_BLOCK,
                Some(&ttou),
                Some(&mut before),
            )
            .is_err()
            {
                return;
            }
            if let Err(err) = nix::unistd::tcsetpgrp(fd, self.group) {
                tracing::debug!(%err, "could not take the terminal back from the workload");
            }
            let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
        });
    }
}
