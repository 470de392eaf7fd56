//! The processes inside a sandbox namespace: finding them (a scan of
//! /proc), and killing them at teardown so that nothing keeps the namespace
//! alive.
//!
//! Killing goes through pidfds: a pidfd pins its process, so the check that
//! it is inside and the SIGKILL are about the same process even if the pid
//! is recycled meanwhile, and its becoming readable says the process has
//! exited, so a rescan for children forked in the meantime waits for exactly
//! that event instead of a fixed sleep. This module must never signal a
//! process outside the namespace, nor sluice itself.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

/// Scan-kill-wait rounds before giving up on a namespace that keeps
/// gaining processes (something forking as fast as it is killed).
const ROUNDS: usize = 8;
/// How long one round waits for the processes it killed to exit. SIGKILL
/// ends a process at once unless it sits in an uninterruptible sleep.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// The namespace, as its inode number on nsfs (where every namespace
/// lives, so the number alone names it).
#[derive(Clone, Debug)]
pub(super) struct Netns {
    /// `net:[INODE]`, as /proc/PID/ns/net reads.
    link: String,
}

impl Netns {
    pub(super) fn new(ino: u64) -> Netns {
        Netns {
            link: format!("net:[{ino}]"),
        }
    }

    /// Whether process `pid`'s (main thread's) network namespace is this one.
    /// readlink(2) of the ns file only formats its name, where stat(2) has
    /// the kernel open the namespace's nsfs entry: half the cost per process
    /// in a scan of every process on the machine.
    fn holds(&self, pid: i32) -> bool {
        let path = format!("/proc/{pid}/ns/net");
        std::fs::read_link(Path::new(&path)).is_ok_and(|l| l.as_os_str() == self.link.as_str())
    }

    /// Pids inside, sorted. Processes that exit or cannot be inspected
    /// during the scan are skipped; a zombie has no namespace any more.
    pub(super) fn processes(&self) -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut pids: Vec<i32> = dir
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&pid| self.holds(pid))
            .collect();
        pids.sort_unstable();
        pids
    }

    /// SIGKILLs every process inside but sluice, waits for each to exit,
    /// and rescans for children forked meanwhile, until a scan finds none.
    pub(super) fn kill_processes(&self) {
        let me = std::process::id() as i32;
        for _ in 0..ROUNDS {
            let pids: Vec<i32> = self.processes().into_iter().filter(|&p| p != me).collect();
            if pids.is_empty() {
                return;
            }
            let killed: Vec<OwnedFd> = pids.into_iter().filter_map(|p| self.kill(p)).collect();
            wait_exited(killed);
        }
        let left = self.processes();
        if !left.is_empty() {
            tracing::warn!(pids = ?left, "processes inside the sandbox namespace survived {ROUNDS} rounds of SIGKILL");
        }
    }

    /// The pidfd of `pid` after sending it SIGKILL, if it was still inside.
    fn kill(&self, pid: i32) -> Option<OwnedFd> {
        let pidfd = pidfd_open(Pid::from_raw(pid)?, PidfdFlags::empty()).ok()?;
        // The pid may have been recycled between the scan and pidfd_open;
        // from here on the pidfd holds this process, whichever it is.
        if !self.holds(pid) {
            return None;
        }
        match pidfd_send_signal(&pidfd, Signal::KILL) {
            Ok(()) => Some(pidfd),
            Err(Errno::SRCH) => None,
            Err(e) => {
                tracing::warn!(pid, error = %e, "could not kill a process inside the sandbox namespace");
                None
            }
        }
    }
}

/// Waits until every pidfd is readable (its process has exited), or
/// [`EXIT_WAIT`] has passed.
fn wait_exited(mut pidfds: Vec<OwnedFd>) {
    let deadline = Instant::now() + EXIT_WAIT;
    while !pidfds.is_empty() {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return;
        };
        let timeout = Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds: Vec<PollFd<'_>> = pidfds
            .iter()
            .map(|fd| PollFd::new(fd, PollFlags::IN))
            .collect();
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => return,
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(_) => return,
        }
        let exited: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        let mut exited = exited.into_iter();
        pidfds.retain(|_| !exited.next().unwrap_or(false));
    }
}
