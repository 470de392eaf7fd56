//! One way for every long-lived task to stop: a drain with a hard deadline
//! (the shape of ztunnel's `drain.rs` and linkerd's
//! `timeout(grace, drain.drain())`).
//!
//! Whoever owns a group of tasks holds a [`Drain`] and spawns them into it;
//! each task holds a [`Watch`]. Draining has two moments:
//!
//! 1. [`Watch::draining`]: stop taking new work. Listeners stop accepting,
//!    the DNS responder stops reading queries, reloaders stop watching;
//!    writers keep writing until their producers are gone. Work in flight
//!    goes on.
//! 2. [`Watch::overdue`]: the deadline has passed. A task drops what is
//!    still in flight at once (connections are cut, unwritten records
//!    counted) and says what it could not finish.
//!
//! A task still running [`LAST_WORDS`] after the deadline is aborted, and
//! the drain says so: nothing outlives its owner, and no task is detached.
//! This module owns the mechanism only; `app` decides the deadlines.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// How long a task has, once its deadline passed, to say what it could not
/// finish and return before it is aborted.
pub(crate) const LAST_WORDS: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Running,
    Draining,
    Overdue,
}

/// The owner's side of a signal that tasks watch: [`Trigger::drain`] starts
/// draining, [`Trigger::overdue`] says the deadline passed. Dropping it
/// counts as both.
#[derive(Debug)]
pub struct Trigger {
    phase: watch::Sender<Phase>,
}

/// A task's side: when to stop taking work, and when to stop altogether.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Watch {
    /// `None`: a watch whose drain never comes (a task run on its own).
    phase: Option<watch::Receiver<Phase>>,
}

/// A trigger and the first watch of it.
pub fn trigger() -> (Trigger, Watch) {
    let (tx, rx) = watch::channel(Phase::Running);
    (Trigger { phase: tx }, Watch { phase: Some(rx) })
}

impl Trigger {
    /// Another watch of this trigger.
    pub(crate) fn watch(&self) -> Watch {
        Watch {
            phase: Some(self.phase.subscribe()),
        }
    }

    /// Stop taking new work.
    pub fn drain(&self) {
        self.advance(Phase::Draining);
    }

    /// The deadline has passed: stop altogether.
    pub(crate) fn overdue(&self) {
        self.advance(Phase::Overdue);
    }

    fn advance(&self, to: Phase) {
        self.phase.send_if_modified(|phase| {
            let later = to > *phase;
            if later {
                *phase = to;
            }
            later
        });
    }
}

impl Watch {
    /// A watch that never fires, for a task that runs until its own work
    /// ends (a writer whose producers all go away, in a test).
    pub fn never() -> Watch {
        Watch { phase: None }
    }

    /// Resolves once the owner started draining (or is gone).
    pub(crate) async fn draining(&self) {
        self.reached(Phase::Draining).await
    }

    /// Resolves once the deadline has passed (or the owner is gone).
    pub(crate) async fn overdue(&self) {
        self.reached(Phase::Overdue).await
    }

    /// Whether draining has started.
    pub(crate) fn is_draining(&self) -> bool {
        self.phase
            .as_ref()
            .is_some_and(|rx| *rx.borrow() >= Phase::Draining)
    }

    async fn reached(&self, phase: Phase) {
        match &self.phase {
            Some(rx) => {
                let mut rx = rx.clone();
                // Err: the trigger is gone, which counts as every phase.
                let _ = rx.wait_for(|now| *now >= phase).await;
            }
            None => std::future::pending().await,
        }
    }
}

/// A group of long-lived tasks that stop together, by one deadline.
pub(crate) struct Drain {
    what: &'static str,
    trigger: Trigger,
    tasks: JoinSet<()>,
}

/// How a drain went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Drained {
    /// Tasks that finished before the deadline.
    pub(crate) finished: usize,
    /// Tasks that returned after being told they were overdue.
    pub(crate) overdue: usize,
    /// Tasks aborted [`LAST_WORDS`] after the deadline.
    pub(crate) aborted: usize,
}

impl Drain {
    /// An empty group; `what` names it in the drain's own messages.
    pub(crate) fn new(what: &'static str) -> Drain {
        let (trigger, _) = trigger();
        Drain {
            what,
            trigger,
            tasks: JoinSet::new(),
        }
    }

    /// A watch for a task of this group.
    pub(crate) fn watch(&self) -> Watch {
        self.trigger.watch()
    }

    /// Run `task` in this group: it is awaited by [`Drain::drain`], never
    /// detached.
    pub(crate) fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// Tell every task to drain, wait for them until `deadline`, then tell
    /// the rest they are overdue and abort whatever is still running
    /// [`LAST_WORDS`] later.
    pub(crate) async fn drain(mut self, deadline: Instant) -> Drained {
        let mut drained = Drained::default();
        self.trigger.drain();
        while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, self.tasks.join_next()).await
        {
            self.report(joined);
            drained.finished += 1;
        }
        if self.tasks.is_empty() {
            return drained;
        }
        self.trigger.overdue();
        let last = Instant::now().max(deadline) + LAST_WORDS;
        while let Ok(Some(joined)) = tokio::time::timeout_at(last, self.tasks.join_next()).await {
            self.report(joined);
            drained.overdue += 1;
        }
        drained.aborted = self.tasks.len();
        if drained.aborted > 0 {
            tracing::error!(
                what = self.what,
                tasks = drained.aborted,
                "tasks still running {LAST_WORDS:?} after the drain deadline: aborted"
            );
            self.tasks.shutdown().await;
        }
        drained
    }

    fn report(&self, joined: Result<(), tokio::task::JoinError>) {
        if let Err(err) = joined {
            if err.is_panic() {
                tracing::error!(what = self.what, %err, "a task panicked");
            }
        }
    }
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drain")
            .field("what", &self.what)
            .field("tasks", &self.tasks.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tasks_that_stop_when_told_finish_before_the_deadline() {
        let mut drain = Drain::new("test");
        for _ in 0..3 {
            let watch = drain.watch();
            drain.spawn(async move { watch.draining().await });
        }
        let drained = drain.drain(Instant::now() + Duration::from_secs(5)).await;
        assert_eq!(
            drained,
            Drained {
                finished: 3,
                overdue: 0,
                aborted: 0
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_busy_past_the_deadline_is_told_it_is_overdue() {
        let mut drain = Drain::new("test");
        let watch = drain.watch();
        let (said, heard) = tokio::sync::oneshot::channel();
        drain.spawn(async move {
            watch.draining().await;
            // Still busy with work in flight until told it is overdue.
            watch.overdue().await;
            let _ = said.send("cut 1 connection");
        });
        let start = Instant::now();
        let drained = drain.drain(start + Duration::from_secs(2)).await;
        assert_eq!(drained.overdue, 1);
        assert_eq!(drained.aborted, 0);
        assert_eq!(heard.await.unwrap(), "cut 1 connection");
        assert!(Instant::now() >= start + Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ignores_the_drain_is_aborted_after_its_last_words() {
        let mut drain = Drain::new("test");
        let (_keep, never) = tokio::sync::oneshot::channel::<()>();
        drain.spawn(async move {
            let _ = never.await;
        });
        let deadline = Instant::now() + Duration::from_secs(1);
        let drained = drain.drain(deadline).await;
        assert_eq!(drained.aborted, 1);
        assert_eq!(Instant::now(), deadline + LAST_WORDS);
    }

    #[tokio::test]
    async fn a_dropped_trigger_counts_as_every_phase() {
        let (trigger, watch) = trigger();
        assert!(!watch.is_draining());
        drop(trigger);
        watch.draining().await;
        watch.overdue().await;
    }
}
