//! Ctrl-C, SIGTERM and SIGHUP during a bench: the run stops at once and
//! cleans up (sessions stopped, peers killed, namespaces and temp files
//! removed) instead of dying with its namespaces left behind.
//!
//! The bench's children run in process groups of their own, so a Ctrl-C at
//! the terminal reaches the bench alone. A watcher thread takes the signal,
//! raises the flag and sends SIGTERM to every process registered here (the
//! session processes and peers, which stop their own workloads: `sluice run`
//! its command, `sluice oci` its container). Their output then ends, the
//! waiting bench sees that, finds the flag raised and unwinds; every guard
//! on the way cleans up what it holds. A second Ctrl-C quits at once,
//! cleanup or not. This module only signals; it never removes anything.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

struct Watch {
    raised: Arc<AtomicBool>,
    children: Mutex<Vec<i32>>,
}

static WATCH: OnceLock<Watch> = OnceLock::new();

/// Start watching (once per process; later calls do nothing).
pub(crate) fn install() -> std::io::Result<()> {
    if WATCH.get().is_some() {
        return Ok(());
    }
    let raised = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        // A second signal once the first one raised the flag: quit now.
        signal_hook::flag::register_conditional_shutdown(sig, 130, raised.clone())?;
    }
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    let watch = WATCH.get_or_init(|| Watch {
        raised,
        children: Mutex::new(Vec::new()),
    });
    std::thread::Builder::new()
        .name("sluice-bench-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                eprintln!(
                    "sluice bench: {} received: stopping and cleaning up (again to quit at once)",
                    signal_hook::low_level::signal_name(sig).unwrap_or("signal")
                );
                watch.raised.store(true, Ordering::SeqCst);
                stop_children(watch);
            }
        })?;
    Ok(())
}

/// Whether a signal asked the run to stop.
pub(crate) fn raised() -> bool {
    WATCH.get().is_some_and(|w| w.raised.load(Ordering::SeqCst))
}

/// Ask `pid` to stop when a signal comes (and at once if one came already).
pub(crate) fn register(pid: u32) {
    if let Some(watch) = WATCH.get() {
        if let Ok(mut children) = watch.children.lock() {
            children.push(pid as i32);
        }
        if raised() {
            stop_children(watch);
        }
    }
}

/// `pid` is gone (waited for): never signal it again.
pub(crate) fn unregister(pid: u32) {
    if let Some(watch) = WATCH.get() {
        if let Ok(mut children) = watch.children.lock() {
            children.retain(|&p| p != pid as i32);
        }
    }
}

fn stop_children(watch: &Watch) {
    if let Ok(children) = watch.children.lock() {
        for &pid in children.iter() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }
}
