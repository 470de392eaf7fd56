//! `sluice doctor`: what this machine has and lacks for each kind of
//! workload (a host command, an OCI container, a microVM, the daemon with
//! its OCI hook), each lack with the command that fixes it. This module owns
//! the list of checks, which kinds need each and how much ([`Need`]), and
//! the [`Report`] the command line prints as text or JSON; docs/doctor.md
//! says what each check means.
//!
//! It checks and never changes the machine: what it tries for real (a
//! network namespace with sluice's table applied and read back, a tap with
//! its fence, the workload's seccomp filter) it tries in a throwaway
//! namespace or on a throwaway thread, gone when the check ends, through the
//! very functions `sluice run` and `sluice vm` use; it never installs,
//! loads a module, writes a file or raises a limit, and never enters or
//! changes the namespace sluice itself runs in. Every check is bounded in
//! time ([`LIMIT`]): one that does not answer by then counts as a lack. A
//! failed probe is a finding, never an error, so nothing here returns one;
//! it prints nothing and never exits (the command line does both).

mod kernel;
mod tools;

use std::time::Duration;

use serde::Serialize;

/// How long one check may take: a probe that has not answered by then is
/// reported as a lack (and a program it ran is killed).
pub(crate) const LIMIT: Duration = Duration::from_secs(10);

/// A kind of workload sluice can confine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    /// `sluice run`: a command on the host.
    Host,
    /// `sluice oci`: a podman container through the wrapper.
    Oci,
    /// `sluice vm`: a microVM's VMM behind a tap.
    Vm,
    /// `sluice daemon` with the OCI hook: containers started by podman.
    Daemon,
}

impl Kind {
    pub(crate) const ALL: [Kind; 4] = [Kind::Host, Kind::Oci, Kind::Vm, Kind::Daemon];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Kind::Host => "host",
            Kind::Oci => "oci",
            Kind::Vm => "vm",
            Kind::Daemon => "daemon",
        }
    }
}

/// What one check says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    /// The machine has it.
    Ok,
    /// A kind that was asked for cannot run without it.
    Missing,
    /// Lacking, but no kind asked for needs it (it costs a feature, a
    /// speed or a capacity).
    Warn,
}

/// How much a kind needs what a check looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// The kind cannot run without it: lacking, it is [`Status::Missing`].
    Required,
    /// The kind runs without it, with less: lacking, it is [`Status::Warn`].
    Recommended,
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Check {
    /// Its name, as docs/doctor.md lists it (`root`, `nftables`, ...).
    pub(crate) name: &'static str,
    /// The kinds asked for that this check was run for.
    pub(crate) kinds: Vec<Kind>,
    /// Those of `kinds` that cannot run without it.
    pub(crate) required_by: Vec<Kind>,
    pub(crate) status: Status,
    /// What was found: a version, a path, a limit, or what is wrong.
    pub(crate) detail: String,
    /// The command (or change) that fixes a lack; none when it is there.
    pub(crate) fix: Option<String>,
}

/// Every check run for the kinds asked for.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub(crate) kinds: Vec<Kind>,
    pub(crate) checks: Vec<Check>,
}

impl Report {
    /// Whether everything `kind` needs is there.
    pub(crate) fn ready(&self, kind: Kind) -> bool {
        self.missing_for(kind).next().is_none()
    }

    /// Whether every kind asked for is ready.
    pub(crate) fn all_ready(&self) -> bool {
        self.kinds.iter().all(|kind| self.ready(*kind))
    }

    /// The checks that `kind` needs and lacks.
    pub(crate) fn missing_for(&self, kind: Kind) -> impl Iterator<Item = &Check> {
        self.checks
            .iter()
            .filter(move |c| c.status == Status::Missing && c.required_by.contains(&kind))
    }

    /// The checks run for `kind` that warn.
    pub(crate) fn warnings_for(&self, kind: Kind) -> impl Iterator<Item = &Check> {
        self.checks
            .iter()
            .filter(move |c| c.status == Status::Warn && c.kinds.contains(&kind))
    }
}

/// What to check for.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The kinds of workload (none: host).
    pub(crate) kinds: Vec<Kind>,
    /// Connections that must fit at once (`--max-connections`): a
    /// descriptor limit too low for them is missing. None: sluice's
    /// default, and a limit too low for it is a warning (sluice then
    /// serves fewer at once and the rest wait).
    pub(crate) max_connections: Option<usize>,
}

/// What a probe found: what is there, or what lacks and its fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    Have(String),
    Lack { detail: String, fix: String },
}

impl Found {
    fn lack(detail: impl Into<String>, fix: impl Into<String>) -> Found {
        Found::Lack {
            detail: detail.into(),
            fix: fix.into(),
        }
    }
}

use Kind::{Daemon, Host, Oci, Vm};
use Need::{Recommended, Required};

/// Needed by every kind.
const EVERY_KIND: &[(Kind, Need)] = &[
    (Host, Required),
    (Oci, Required),
    (Vm, Required),
    (Daemon, Required),
];

/// Run the checks the kinds asked for need, in a fixed order.
pub(crate) fn run(options: &Options) -> Report {
    let mut kinds = options.kinds.clone();
    if kinds.is_empty() {
        kinds.push(Host);
    }
    kinds.sort();
    kinds.dedup();
    let mut checks = Checks {
        asked: &kinds,
        done: Vec::new(),
    };
    checks.run("root", EVERY_KIND, kernel::root);
    checks.run("capabilities", EVERY_KIND, kernel::capabilities);
    // One throwaway namespace answers both, the table needing the namespace.
    let mut namespace = None;
    let mut in_namespace = || {
        namespace
            .get_or_insert_with(kernel::namespace_and_table)
            .clone()
    };
    checks.run("netns", EVERY_KIND, || in_namespace().0);
    checks.run(
        "nftables",
        &[(Host, Required), (Oci, Required), (Daemon, Required)],
        || in_namespace().1,
    );
    checks.run(
        "libnftables",
        &[
            (Host, Recommended),
            (Oci, Recommended),
            (Vm, Required),
            (Daemon, Recommended),
        ],
        kernel::libnftables,
    );
    checks.run("tap-fence", &[(Vm, Required)], kernel::tap_fence);
    checks.run(
        "seccomp",
        &[(Host, Required), (Vm, Required)],
        kernel::seccomp,
    );
    checks.run(
        "user-namespaces",
        &[(Oci, Recommended)],
        kernel::user_namespaces,
    );
    let descriptors = match options.max_connections {
        Some(_) => Required,
        None => Recommended,
    };
    let every_kind: Vec<(Kind, Need)> = Kind::ALL.iter().map(|k| (*k, descriptors)).collect();
    checks.run("descriptors", &every_kind, || {
        kernel::descriptors(options.max_connections)
    });
    let containers = &[(Oci, Required), (Daemon, Required)];
    checks.run("podman", containers, tools::podman);
    checks.run("runc", containers, tools::runc);
    checks.run("oci-hook", &[(Daemon, Required)], tools::oci_hook);
    checks.run("qemu", &[(Vm, Required)], tools::qemu);
    checks.run("kvm", &[(Vm, Recommended)], tools::kvm);
    checks.run("guest-kit", &[(Vm, Recommended)], tools::guest_kit);
    Report {
        checks: checks.done,
        kinds,
    }
}

/// The checks done so far, for the kinds asked.
struct Checks<'a> {
    asked: &'a [Kind],
    done: Vec<Check>,
}

impl Checks<'_> {
    /// Run `probe` if one of the kinds asked is in `needs`.
    fn run(&mut self, name: &'static str, needs: &[(Kind, Need)], probe: impl FnOnce() -> Found) {
        let asked: Vec<(Kind, Need)> = needs
            .iter()
            .filter(|(kind, _)| self.asked.contains(kind))
            .copied()
            .collect();
        if asked.is_empty() {
            return;
        }
        self.done.push(check(name, &asked, probe()));
    }
}

/// A check's result from what its probe found and the needs of the kinds
/// it was run for.
fn check(name: &'static str, needs: &[(Kind, Need)], found: Found) -> Check {
    let kinds: Vec<Kind> = needs.iter().map(|(kind, _)| *kind).collect();
    let required_by: Vec<Kind> = needs
        .iter()
        .filter(|(_, need)| *need == Required)
        .map(|(kind, _)| *kind)
        .collect();
    let (status, detail, fix) = match found {
        Found::Have(detail) => (Status::Ok, detail, None),
        Found::Lack { detail, fix } if required_by.is_empty() => (Status::Warn, detail, Some(fix)),
        Found::Lack { detail, fix } => (Status::Missing, detail, Some(fix)),
    };
    Check {
        name,
        kinds,
        required_by,
        status,
        detail,
        fix,
    }
}

/// `f` on a thread of its own, waited for at most [`LIMIT`]: its result,
/// or why there is none. A thread still running then is left to end with
/// the process (whatever it holds, a throwaway namespace included, goes
/// with it).
fn bounded<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    within(LIMIT, what, f)
}

/// [`bounded`], waiting at most `limit`.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("sluice-doctor".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| format!("cannot start a thread to check {what}: {e}"))?;
    match rx.recv_timeout(limit) {
        Ok(value) => Ok(value),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            Err(format!("checking {what} did not finish within {:?}", limit))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err(format!("checking {what} failed (its thread panicked)"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn have() -> Found {
        Found::Have("there".into())
    }

    fn lack() -> Found {
        Found::lack("absent", "install it")
    }

    #[test]
    fn a_lack_is_missing_where_a_kind_asked_requires_it_and_a_warning_elsewhere() {
        let required = check("x", &[(Host, Recommended), (Vm, Required)], lack());
        assert_eq!(required.status, Status::Missing);
        assert_eq!(required.required_by, vec![Vm]);
        assert_eq!(required.fix.as_deref(), Some("install it"));
        let recommended = check("x", &[(Host, Recommended)], lack());
        assert_eq!(recommended.status, Status::Warn);
        let ok = check("x", &[(Host, Required)], have());
        assert_eq!((ok.status, ok.fix), (Status::Ok, None));
    }

    #[test]
    fn only_a_missing_check_a_kind_requires_makes_it_not_ready() {
        let report = Report {
            kinds: vec![Host, Vm],
            checks: vec![
                check("fence", &[(Vm, Required)], lack()),
                check(
                    "libnftables",
                    &[(Host, Recommended), (Vm, Required)],
                    lack(),
                ),
                check("root", &[(Host, Required), (Vm, Required)], have()),
            ],
        };
        assert!(report.ready(Host));
        assert!(!report.ready(Vm));
        assert!(!report.all_ready());
        let missing: Vec<_> = report.missing_for(Vm).map(|c| c.name).collect();
        assert_eq!(missing, ["fence", "libnftables"]);
        let warned: Vec<_> = report.warnings_for(Host).map(|c| c.name).collect();
        assert!(warned.is_empty(), "{warned:?}");
    }

    #[test]
    fn checks_run_only_for_the_kinds_asked() {
        let asked = [Host];
        let mut checks = Checks {
            asked: &asked,
            done: Vec::new(),
        };
        checks.run("qemu", &[(Vm, Required)], || {
            panic!("qemu is not asked for")
        });
        checks.run("root", &[(Host, Required), (Vm, Required)], have);
        assert_eq!(checks.done.len(), 1);
        assert_eq!(checks.done[0].kinds, vec![Host]);
    }

    #[test]
    fn a_probe_that_does_not_answer_in_time_is_a_lack_and_one_that_does_is_waited_for() {
        assert_eq!(bounded("a sum", || 1 + 1), Ok(2));
        let (_keep, hold) = std::sync::mpsc::channel::<()>();
        let limit = Duration::from_millis(20);
        let started = std::time::Instant::now();
        // Blocks until `_keep` is dropped, at the end of this test.
        let err = within(limit, "a stuck probe", move || hold.recv().is_ok()).unwrap_err();
        assert!(err.contains("a stuck probe did not finish within"), "{err}");
        assert!(started.elapsed() >= limit);
    }
}
