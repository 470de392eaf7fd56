//! The daemon's watch on its containers' processes: one thread polls the
//! pidfd of every attached container (a pidfd becomes readable when its
//! process exits) and a wake-up eventfd, and says which ones exited. One
//! thread and one poll(2) for every container, instead of a registration
//! with the async runtime's reactor per container (whose safe constructors
//! tokio deprecated for descriptors it cannot own).
//!
//! This module only watches: it never signals a process and never decides
//! what an exit means (the registry releases the sandbox). A watch that is
//! dropped before its process exits is forgotten at the next wake-up, with
//! its pidfd.

use std::os::fd::OwnedFd;
use std::sync::mpsc;
use std::sync::Arc;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use tokio::sync::oneshot;

/// The thread that watches, and how to hand it a process.
pub(super) struct ExitWatcher {
    /// `None` once dropping: the thread sees its channel closed and ends.
    new: Option<mpsc::Sender<Watched>>,
    wake: Arc<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Watched {
    pidfd: OwnedFd,
    exited: oneshot::Sender<()>,
}

/// Resolves once the watched process has exited; `Err` if the watcher
/// stopped first (then watch some other way).
pub(super) struct Exit {
    exited: oneshot::Receiver<()>,
    wake: Arc<OwnedFd>,
}

impl ExitWatcher {
    pub(super) fn start() -> std::io::Result<ExitWatcher> {
        let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let (new, incoming) = mpsc::channel();
        let woken = wake.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-exits".into())
            .spawn(move || watch(&woken, &incoming))?;
        Ok(ExitWatcher {
            new: Some(new),
            wake,
            thread: Some(thread),
        })
    }

    /// Watch the process behind `pidfd` until it exits.
    pub(super) fn watch(&self, pidfd: OwnedFd) -> Exit {
        let (exited, rx) = oneshot::channel();
        if let Some(new) = &self.new {
            // A closed channel drops `exited`: the Exit resolves to Err.
            let _ = new.send(Watched { pidfd, exited });
        }
        wake(&self.wake);
        Exit {
            exited: rx,
            wake: self.wake.clone(),
        }
    }
}

impl Drop for ExitWatcher {
    fn drop(&mut self) {
        drop(self.new.take());
        wake(&self.wake);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Exit {
    /// Ok once the process exited; Err if the watcher is gone.
    pub(super) async fn exited(&mut self) -> Result<(), oneshot::error::RecvError> {
        (&mut self.exited).await
    }
}

impl Drop for Exit {
    fn drop(&mut self) {
        // Let the thread forget this pidfd now rather than at its exit.
        self.exited.close();
        wake(&self.wake);
    }
}

fn wake(eventfd: &OwnedFd) {
    let _ = rustix::io::write(eventfd, &1u64.to_ne_bytes());
}

/// The thread: take new watches, forget abandoned ones, poll, report exits,
/// until the watcher is dropped.
fn watch(wake: &OwnedFd, incoming: &mpsc::Receiver<Watched>) {
    let mut watched: Vec<Watched> = Vec::new();
    loop {
        loop {
            match incoming.try_recv() {
                Ok(w) => watched.push(w),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        }
        watched.retain(|w| !w.exited.is_closed());
        let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::new(wake, PollFlags::IN))
            .chain(watched.iter().map(|w| PollFd::new(&w.pidfd, PollFlags::IN)))
            .collect();
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(err) => {
                // Cannot happen with valid descriptors; every watch resolves
                // to Err (dropped senders) and is watched some other way.
                tracing::warn!(%err, "cannot poll the containers' pidfds: watching their namespaces instead");
                return;
            }
        }
        let done: Vec<bool> = fds
            .iter()
            .skip(1)
            .map(|f| !f.revents().is_empty())
            .collect();
        drop(fds);
        let _ = rustix::io::read(wake, &mut [0u8; 8]);
        watched = watched
            .into_iter()
            .zip(done)
            .filter_map(|(w, exited)| {
                if exited {
                    let _ = w.exited.send(());
                    None
                } else {
                    Some(w)
                }
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper() -> (std::process::Child, OwnedFd) {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pidfd = rustix::process::pidfd_open(
            rustix::process::Pid::from_child(&child),
            rustix::process::PidfdFlags::empty(),
        )
        .unwrap();
        (child, pidfd)
    }

    #[tokio::test]
    async fn only_the_process_that_exited_is_reported() {
        let watcher = ExitWatcher::start().unwrap();
        let (mut running, running_fd) = sleeper();
        let (mut stopped, stopped_fd) = sleeper();
        let mut still = watcher.watch(running_fd);
        let mut gone = watcher.watch(stopped_fd);
        stopped.kill().unwrap();
        gone.exited().await.unwrap();
        stopped.wait().unwrap();
        assert!(matches!(
            still.exited.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        running.kill().unwrap();
        still.exited().await.unwrap();
        running.wait().unwrap();
    }

    #[tokio::test]
    async fn a_watch_made_after_the_watcher_stopped_says_so() {
        let mut watcher = ExitWatcher::start().unwrap();
        drop(watcher.new.take());
        let (mut child, pidfd) = sleeper();
        let mut exit = watcher.watch(pidfd);
        assert!(exit.exited().await.is_err());
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
