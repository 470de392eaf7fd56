//! Which async runtime serves sandboxes, and how many workers it has: a
//! plan read once from the environment at start ([`plan_one_sandbox`],
//! [`many_sandboxes`]) and passed down as a value ([`Workers`]), never a
//! process-wide global.
//!
//! Each worker gets its own proxy listener per address
//! (`Attachment::served_by`). One sandbox's workers accept in pairs on one
//! socket per pair ([`WORKERS_PER_SOCKET`]; the daemon's, on a socket each),
//! and the sockets of one address share it through SO_REUSEPORT, the
//! kernel spreading connections over them. One sandbox (`run`, `oci`,
//! `vm`) with more than one worker is served thread-per-core: the main thread's single-threaded
//! runtime and, per extra worker, a thread with a single-threaded runtime
//! of its own ([`Workers::side`]) that accepts on its own listeners and
//! keeps every connection it accepted, so no task or wake-up crosses
//! threads. The daemon keeps tokio's multi-threaded runtime.
//!
//! With `SLUICE_NICE=N` (opt-in) the threads that serve one sandbox run N
//! nice steps ahead of its workload ([`serve_ahead_of_workload`]): every
//! connection the workload makes waits on them, so when the two compete for
//! a CPU the proxy's turn comes first. While many connections are in flight
//! they run a few steps further ahead ([`lead_by_load`]). The workload keeps
//! the priority it was started with.

use anyhow::{Context, Result};
use tokio::runtime::Handle;

/// `SLUICE_WORKERS` is not a worker count (bad input, exit 2).
#[derive(Debug, thiserror::Error)]
#[error("SLUICE_WORKERS={0:?} is not a worker count: give a number from 1 to 64, or unset it")]
pub(crate) struct BadWorkers(String);

/// `SLUICE_NICE` is not a number of nice steps (bad input, exit 2).
#[derive(Debug, thiserror::Error)]
#[error("SLUICE_NICE={0:?} is not a number of nice steps: give 0 to 19 (0 serves at the workload's own priority), or unset it")]
pub(crate) struct BadNice(String);

/// How many nice steps a sandbox's serving threads run ahead of its
/// workload unless `SLUICE_NICE` says otherwise: none. The lead is opt-in:
/// on the calibrated bench (docs/measurements.md, issue 34) it gained
/// nothing at 8 in flight once a sandbox had a worker per CPU, haproxy given
/// the same lead got slower, and a lead changes CPU fairness for every
/// other process on the host.
const NICE_AHEAD: i32 = 0;

/// The most workers one sandbox gets by default, however many CPUs there
/// are: each worker binds its own listener per address and keeps a thread.
/// `SLUICE_WORKERS` may go to 64.
const MAX_DEFAULT_WORKERS: usize = 16;

/// The CPUs this process may run on: its affinity mask and its cgroup's CPU
/// quota, as `std::thread::available_parallelism` reads them (1 if they
/// cannot be read).
fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Nice steps a serving thread takes on top of its lead while [`BUSY_AT`]
/// or more of the sandbox's connections are in flight. Measured on these
/// 2-vCPU machines (docs/measurements.md, round fifteen): at 8 in flight
/// 0.92 of haproxy's time against 0.98 with the lead alone, one at a time,
/// the stream and bulk unchanged. A lead this big all the time cost one at
/// a time and bulk (round thirteen); taken only under load, the connections
/// that pay for it are not there.
const LEAD_UNDER_LOAD: i32 = 3;

/// Connections in flight from which a serving thread takes
/// [`LEAD_UNDER_LOAD`]; it gives it back at the first accept with fewer.
const BUSY_AT: usize = 4;

std::thread_local! {
    /// The nice this serving thread returns to once the load is gone, while
    /// it runs [`LEAD_UNDER_LOAD`] further ahead; `None` when it does not.
    static BEFORE_LOAD: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
}

/// Take or give back [`LEAD_UNDER_LOAD`] on the calling thread, given the
/// connections in flight. A system call only when the load crosses
/// [`BUSY_AT`]; a thread that may not raise its priority (no CAP_SYS_NICE)
/// stays where it is.
fn follow_load(in_flight: usize) {
    let busy = in_flight >= BUSY_AT;
    BEFORE_LOAD.with(|before| match (busy, before.get()) {
        (true, None) => {
            // Marked as taken even if refused: no retry on every accept.
            if let Ok(now) = run_ahead_by(LEAD_UNDER_LOAD) {
                before.set(Some(now));
            }
        }
        (false, Some(now)) => {
            let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), now);
            before.set(None);
        }
        _ => {}
    });
}

/// Run the calling thread `steps` nice steps ahead of where it is now (nice
/// -20 at most). Returns where it was, also when the raise was refused (no
/// CAP_SYS_NICE); an error only if its priority could not be read.
fn run_ahead_by(steps: i32) -> rustix::io::Result<i32> {
    let me = rustix::thread::gettid();
    let now = rustix::process::getpriority_process(Some(me))?;
    if let Err(err) = rustix::process::setpriority_process(Some(me), (now - steps).max(-20)) {
        tracing::debug!(%err, "cannot raise the serving thread's priority: it serves where it is");
    }
    Ok(now)
}

/// Nice steps ahead from `SLUICE_NICE`'s value (`None`: unset).
fn nice_ahead(value: Option<&str>) -> Result<i32, BadNice> {
    match value {
        None => Ok(NICE_AHEAD),
        Some(text) => match text.trim().parse::<i32>() {
            Ok(n @ 0..=19) => Ok(n),
            _ => Err(BadNice(text.to_string())),
        },
    }
}

/// How many workers serve sandboxes: `SLUICE_WORKERS` if set (1 to 64),
/// else `default`.
fn workers(default: usize) -> Result<usize, BadWorkers> {
    match std::env::var("SLUICE_WORKERS") {
        Err(_) => Ok(default),
        Ok(text) => match text.trim().parse::<usize>() {
            Ok(n @ 1..=64) => Ok(n),
            _ => Err(BadWorkers(text)),
        },
    }
}

/// A runtime driven by `threads` threads: single-threaded for one.
fn build(threads: usize) -> Result<tokio::runtime::Runtime> {
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Start `n` threads, each driving a single-threaded runtime of its own.
/// They park in their runtime until the process exits: nothing waits for
/// them at exit, and a sandbox's drain waits for the tasks it put there.
fn start_side_workers(n: usize, plan: Plan) -> Result<Vec<Handle>> {
    (1..=n)
        .map(|index| {
            let runtime = build(1).context("cannot start a worker's async runtime")?;
            let handle = runtime.handle().clone();
            std::thread::Builder::new()
                .name(format!("sluice-worker-{index}"))
                .spawn(move || {
                    // Nothing is spawned from these threads: the lead is theirs alone.
                    plan.serve_ahead_of_workload();
                    runtime.block_on(std::future::pending::<()>())
                })
                .context("cannot start a worker thread")?;
            Ok(handle)
        })
        .collect()
}

/// How many workers serve a process's sandboxes and how far ahead of the
/// workload they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Worker threads, each with its own proxy listener per address.
    pub(crate) workers: usize,
    /// How many workers' listeners accept on one socket (1: each its own
    /// SO_REUSEPORT socket).
    pub(crate) workers_per_socket: usize,
    /// Nice steps the serving threads run ahead of the workload (0: none).
    pub(crate) nice_ahead: i32,
}

impl Plan {
    /// Run the calling thread, and the threads it starts from then on, the
    /// planned number of nice steps ahead of the workload (nice -20 at
    /// most). Call it where the workload's own processes cannot inherit it:
    /// in `sluice run` and `sluice vm` the workload comes from the init,
    /// started before; in `sluice oci`, after podman is started. A thread
    /// that may not raise its priority (no CAP_SYS_NICE) serves at the
    /// workload's.
    pub(crate) fn serve_ahead_of_workload(&self) {
        if self.nice_ahead > 0 {
            let _ = run_ahead_by(self.nice_ahead);
        }
    }
}

/// The workers that serve, as the runtime started them: the plan, and the
/// runtimes of the workers after the first (the main thread's), each driven
/// by a thread of its own for the rest of the process. A task spawned on one
/// stays on that thread, and so do the sockets it opens.
#[derive(Debug, Clone)]
pub(crate) struct Workers {
    plan: Plan,
    side: Vec<Handle>,
}

impl Default for Workers {
    /// One worker, no lead: what a process that planned nothing gets.
    fn default() -> Workers {
        Workers {
            plan: Plan {
                workers: 1,
                workers_per_socket: 1,
                nice_ahead: 0,
            },
            side: Vec::new(),
        }
    }
}

impl Workers {
    /// The side workers, in order (worker 1 is the first); empty for one
    /// worker, and for the daemon's multi-threaded runtime.
    pub(crate) fn side(&self) -> &[Handle] {
        &self.side
    }

    /// Proxy listeners to bind per address: one per worker.
    pub(crate) fn listeners_per_address(&self) -> usize {
        self.plan.workers
    }

    /// How many of them accept on one socket ([`WORKERS_PER_SOCKET`] for
    /// one sandbox's workers, 1 for the daemon's).
    pub(crate) fn workers_per_socket(&self) -> usize {
        self.plan.workers_per_socket
    }

    /// What a sandbox's proxy calls after each accept (its `on_accept`),
    /// or `None` where serving threads do not run ahead of the workload
    /// (the daemon, or `SLUICE_NICE=0`).
    pub(crate) fn lead_by_load(&self) -> Option<fn(usize)> {
        (self.plan.nice_ahead > 0).then_some(follow_load as fn(usize))
    }

    /// See [`Plan::serve_ahead_of_workload`].
    pub(crate) fn serve_ahead_of_workload(&self) {
        self.plan.serve_ahead_of_workload();
    }
}

/// One sandbox (`run`, `oci`, `vm`) is served by a worker per available
/// CPU (at most [`MAX_DEFAULT_WORKERS`]), thread-per-core: each accepts on
/// its own listeners and keeps what it accepted, so no task hops between
/// threads. `SLUICE_WORKERS=n` sets the count. Measured on these 2-vCPU
/// machines (docs/measurements.md, issue 34): two workers took 8 in flight
/// from behind haproxy to ahead of it, one at a time and bulk no worse.
pub(crate) fn one_sandbox() -> Result<(tokio::runtime::Runtime, Workers)> {
    plan_one_sandbox()?.start()
}

/// The workers [`one_sandbox`] will start, decided without starting them:
/// call it before binding the sandbox's listeners (one per worker, see
/// [`OneSandbox::listeners_per_address`]), which may happen before the
/// runtime starts.
pub(crate) fn plan_one_sandbox() -> Result<OneSandbox> {
    let workers = workers(available_cpus().min(MAX_DEFAULT_WORKERS))?;
    let nice_ahead = nice_ahead(std::env::var("SLUICE_NICE").ok().as_deref())?;
    Ok(OneSandbox {
        plan: Plan {
            workers,
            workers_per_socket: WORKERS_PER_SOCKET,
            nice_ahead,
        },
    })
}

/// A runtime for one sandbox, planned ([`plan_one_sandbox`]), not started.
pub(crate) struct OneSandbox {
    plan: Plan,
}

impl OneSandbox {
    /// Proxy listeners to bind per address: one per worker.
    pub(crate) fn listeners_per_address(&self) -> usize {
        self.plan.workers
    }

    /// How many of them accept on one socket: [`WORKERS_PER_SOCKET`].
    pub(crate) fn workers_per_socket(&self) -> usize {
        self.plan.workers_per_socket
    }

    /// Start the side workers and the main thread's runtime.
    pub(crate) fn start(self) -> Result<(tokio::runtime::Runtime, Workers)> {
        let side = if self.plan.workers > 1 {
            start_side_workers(self.plan.workers - 1, self.plan)?
        } else {
            Vec::new()
        };
        let workers = Workers {
            plan: self.plan,
            side,
        };
        Ok((build(1)?, workers))
    }
}

/// One sandbox's workers accept in pairs on one socket per pair (the pairs'
/// sockets share the address through SO_REUSEPORT). On one socket, the
/// worker that is free takes the next connection; with a SO_REUSEPORT
/// socket each, the kernel's hash of the connection's addresses picks the
/// worker, busy or not. Measured on these 2-vCPU machines (8 in flight,
/// six paired `sluice bench` runs, docs/measurements.md, issue 34): one
/// socket for both workers took sluice from 1.09-1.18 of haproxy's time to
/// 1.00-1.07, with its CPU per connection below haproxy's in every pair. Every worker on a socket
/// is woken for each connection and all but one find nothing to accept, so
/// the sharing stops at two, the number measured.
pub(crate) const WORKERS_PER_SOCKET: usize = 2;

/// The daemon serves many sandboxes and gets a worker per core, on tokio's
/// multi-threaded runtime, with no lead over its workloads.
pub(crate) fn many_sandboxes() -> Result<(tokio::runtime::Runtime, Workers)> {
    let workers = workers(available_cpus())?;
    // Not measured with a shared socket: the daemon's workers are one
    // multi-threaded runtime, whose one reactor would wake two accept
    // tasks for each connection.
    let plan = Plan {
        workers,
        workers_per_socket: 1,
        nice_ahead: 0,
    };
    Ok((
        build(workers)?,
        Workers {
            plan,
            side: Vec::new(),
        },
    ))
}

impl crate::exit_class::Classified for BadWorkers {
    /// SLUICE_WORKERS out of range.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::BadInput
    }
}

impl crate::exit_class::Classified for BadNice {
    /// A nice value out of range.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::BadInput
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn there_is_no_nice_lead_unless_sluice_nice_sets_one() {
        assert_eq!(nice_ahead(None).unwrap(), 0);
    }

    #[test]
    fn a_nice_lead_from_0_to_19_is_taken() {
        assert_eq!(nice_ahead(Some("0")).unwrap(), 0);
        assert_eq!(nice_ahead(Some(" 19 ")).unwrap(), 19);
    }

    #[test]
    fn a_nice_lead_out_of_range_or_not_a_number_is_refused() {
        for bad in ["20", "-1", "five", ""] {
            let err = nice_ahead(Some(bad)).unwrap_err();
            assert!(err.to_string().contains("SLUICE_NICE"), "{err}");
        }
    }
}
