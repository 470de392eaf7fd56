//! sluice's file descriptor budget. A connection is budgeted six
//! descriptors (it holds two sockets today; the budget dates from the
//! spliced relay's two pipes and leaves headroom), so the soft limit a root
//! shell usually starts with (1,024) would cut a busy sandbox off at about
//! 160 connections. sluice raises its own soft limit to the hard one at start,
//! as servers do, and gives the workload back the limit it was started with,
//! so that nothing changes for the command (select(2) users rely on it).

use std::sync::atomic::{AtomicU64, Ordering};

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Descriptors budgeted per relayed connection (it holds two sockets).
pub(crate) const PER_CONNECTION: u64 = 6;
/// Descriptors kept aside for listeners, DNS, log files and the runtime.
const RESERVE: u64 = 256;

/// The soft limit sluice was started with, for the workload; `u64::MAX`
/// until `raise` changed it.
static STARTED_WITH: AtomicU64 = AtomicU64::new(u64::MAX);

/// Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit
/// now in force.
pub(crate) fn raise() -> u64 {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    if soft >= hard {
        return soft;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            STARTED_WITH.store(soft, Ordering::Relaxed);
            hard
        }
        Err(_) => soft,
    }
}

/// How many connections `limit` descriptors can relay at once.
pub(crate) fn connections_within(limit: u64) -> usize {
    usize::try_from(limit.saturating_sub(RESERVE) / PER_CONNECTION).unwrap_or(usize::MAX)
}

/// Runs in the forked workload before exec (async-signal-safe: an atomic
/// load and two system calls): restore the soft limit sluice started with.
pub(crate) fn restore_for_workload() -> std::io::Result<()> {
    let soft = STARTED_WITH.load(Ordering::Relaxed);
    if soft == u64::MAX {
        return Ok(());
    }
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_keeps_a_reserve_and_six_descriptors_per_connection() {
        assert_eq!(connections_within(1024), 128);
        assert_eq!(connections_within(100), 0);
        assert_eq!(connections_within(1_048_576), 174_720);
    }
}
