//! The conditions a bench compares: the same client natively, under
//! `sluice run`, in a container under `sluice oci`, behind the peer proxies
//! (`peers`), and in a microVM with and without `sluice vm` (`vm`). Each is a
//! [`ConditionKind`] (its name, whether it enforces) and, once prepared for
//! a run, a [`Condition`] that starts one round's client session.
//!
//! A condition that cannot run here is skipped with one line saying why
//! and what would make it run; it never stands in with another's numbers.
//! This module starts processes only inside the bench's own namespaces.

use std::path::PathBuf;
use std::process::Command;

use super::peers;
use super::session::{Proxy, Session};
use super::{BenchError, Testbed};

/// Every condition `sluice bench` knows, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConditionKind {
    /// The client straight to the origin: no sluice, no nftables.
    Native,
    /// The calibration: the reference pair (`bench::reference`), the
    /// leanest client and origin, where native runs.
    Reference,
    /// The client as the workload of `sluice run`.
    Host,
    /// The client in a local container under `sluice oci`.
    Oci,
    /// The client behind haproxy (`mode tcp`, a fixed upstream) behind the
    /// same nft redirect, no policy.
    Haproxy,
    /// The client behind a minimal tokio proxy (SO_ORIGINAL_DST and
    /// `copy_bidirectional`) behind the same nft redirect, no policy.
    TokioProxy,
    /// The client in a microVM under `sluice vm`.
    Vm,
    /// The same microVM on a plain tap without sluice.
    VmDirect,
}

impl ConditionKind {
    pub const ALL: [ConditionKind; 8] = [
        ConditionKind::Native,
        ConditionKind::Reference,
        ConditionKind::Host,
        ConditionKind::Oci,
        ConditionKind::Haproxy,
        ConditionKind::TokioProxy,
        ConditionKind::Vm,
        ConditionKind::VmDirect,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ConditionKind::Native => "native",
            ConditionKind::Reference => "reference",
            ConditionKind::Host => "host",
            ConditionKind::Oci => "oci",
            ConditionKind::Haproxy => "haproxy",
            ConditionKind::TokioProxy => "tokio-proxy",
            ConditionKind::Vm => "vm",
            ConditionKind::VmDirect => "vm-direct",
        }
    }

    pub fn parse(name: &str) -> Option<ConditionKind> {
        ConditionKind::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Whether this is sluice itself (and DESIGN.md's targets apply).
    pub(crate) fn is_sluice(self) -> bool {
        matches!(
            self,
            ConditionKind::Host | ConditionKind::Oci | ConditionKind::Vm
        )
    }

    /// Whether a policy is enforced (and so the deny check applies): sluice
    /// only. The peers have none: the tokio proxy goes wherever a
    /// connection was headed, haproxy to its one upstream whatever the
    /// destination; and the native client and the plain tap go anywhere.
    pub(crate) fn enforces(self) -> bool {
        self.is_sluice()
    }

    /// Whether this condition runs `workload`, and if not, why (the
    /// report says so): the `l7` workload needs a proxy that terminates
    /// TLS and a client that trusts it.
    pub(crate) fn skips(self, workload: super::Workload) -> Option<&'static str> {
        use super::Workload;
        if self == ConditionKind::Reference
            && matches!(workload, Workload::Stream | Workload::Tls | Workload::L7)
        {
            return Some("the reference pair calibrates the plain workloads only");
        }
        if workload != Workload::L7 {
            return None;
        }
        match self {
            ConditionKind::TokioProxy => {
                Some("a TCP relay with no TLS of its own: nothing to terminate with")
            }
            ConditionKind::Vm | ConditionKind::VmDirect => {
                Some("the guest kit holds no sandbox CA (SLUICE_CA_FILE is not built in)")
            }
            // The container gets the CA bundle and SSL_CERT_FILE from
            // `sluice oci`, as a `sluice run` workload does.
            ConditionKind::Native
            | ConditionKind::Reference
            | ConditionKind::Host
            | ConditionKind::Oci
            | ConditionKind::Haproxy => None,
        }
    }

    /// Whether its proxy adds the `l7` rule's header (and so the origin
    /// must see it on every `l7` request): sluice and haproxy; native
    /// sends none.
    pub(crate) fn injects(self) -> bool {
        self.is_sluice() || self == ConditionKind::Haproxy
    }

    /// Whether this condition runs `workload` ([`ConditionKind::skips`]).
    pub fn runs(self, workload: super::Workload) -> bool {
        self.skips(workload).is_none()
    }

    /// One line on what the condition is, for the report.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            ConditionKind::Native => "the client straight to the origin (no sluice, no nftables)",
            ConditionKind::Reference => "the calibration: the leanest blocking client and origin (a fixed pool of origin threads, one buffer per client thread, status and length checked) where native runs; native within 15% of it means the bench's own client and origin are not what the ratios measure",
            ConditionKind::Host => "the client as the workload of `sluice run` (with --audit and --timings; its defaults: a worker per CPU, no nice lead unless `SLUICE_NICE` is set)",
            ConditionKind::Oci => "the client in a local container under `sluice oci` (podman, runc; with --audit and --timings; its defaults: a worker per CPU, no nice lead unless `SLUICE_NICE` is set)",
            ConditionKind::Haproxy => "haproxy `mode tcp` behind sluice's nft redirect, no policy: plain connections to the one origin, TLS routed by SNI (tls: relayed to the TLS origin; l7: to a second haproxy frontend that terminates TLS with the origin's certificate, allows GET /bytes/*, sets the header and connects to the origin over TLS, verifying it) (started once for the run, so its start+exit is the client's alone)",
            ConditionKind::TokioProxy => "a minimal tokio proxy (SO_ORIGINAL_DST, copy_bidirectional, one thread) behind sluice's nft redirect; no policy (started once for the run, so its start+exit is the client's alone)",
            ConditionKind::Vm => "the client in the test microVM (QEMU microvm, TCG emulation: no KVM here) under `sluice vm` (with --audit and --timings); request times on the guest's clock, start+exit includes the boot",
            ConditionKind::VmDirect => "the same microVM on a plain tap with an origin of its own, without sluice: vm minus vm-direct is sluice's cost",
        }
    }
}

impl std::fmt::Display for ConditionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A condition ready for the run.
pub(crate) trait Condition {
    fn kind(&self) -> ConditionKind;
    /// Start round `round`'s client session.
    fn start(&self, bed: &Testbed, round: usize) -> Result<Session, BenchError>;
    /// The audit log sluice writes for this condition, if any (the deny
    /// check's records must be in it).
    fn audit_log(&self) -> Option<PathBuf> {
        None
    }
}

/// Why a condition does not run here, in one line (with what would make
/// it run).
pub(crate) type Skip = String;

/// Make `kind` ready for the run on `bed`, or say why it cannot run here.
/// With `build`, an image or guest kit that is missing is built first
/// ([`super::provision`]).
pub(crate) fn prepare(
    kind: ConditionKind,
    bed: &Testbed,
    image: &str,
    build: bool,
) -> Result<Result<Box<dyn Condition>, Skip>, BenchError> {
    Ok(match kind {
        ConditionKind::Native => Ok(Box::new(Native)),
        ConditionKind::Reference => Ok(Box::new(Reference)),
        ConditionKind::Host => Ok(Box::new(Sluice {
            kind,
            audit: bed.dir.join("audit-host.jsonl"),
            image: None,
        })),
        ConditionKind::Oci => {
            let lack = match oci_unavailable(image) {
                Some(OciLack::Image(why)) if build => {
                    super::provision::build_image(&bed.exe, image)
                        .err()
                        .map(|failed| format!("{why}; building it: {failed}"))
                }
                lack => lack.map(OciLack::why),
            };
            match lack {
                Some(why) => Err(why),
                None => Ok(Box::new(Sluice {
                    kind,
                    audit: bed.dir.join("audit-oci.jsonl"),
                    image: Some(image.to_string()),
                })),
            }
        }
        ConditionKind::Haproxy => match peers::Peer::haproxy(bed)? {
            Ok(peer) => Ok(Box::new(peer)),
            Err(why) => Err(why),
        },
        ConditionKind::TokioProxy => Ok(Box::new(peers::Peer::minimal_proxy(bed)?)),
        ConditionKind::Vm | ConditionKind::VmDirect => super::vm::prepare(kind, bed, build)?,
    })
}

/// The client command: this very binary's hidden `bench-client`.
/// `sluice SUBCOMMAND` with the bench's policy (trusting the TLS origin's
/// CA), this condition's audit log,
/// a timings file for `round`, and the testbed's own state dir (the audit
/// writer keeps its checkpoint key there: a throwaway one, so a benchmark
/// leaves nothing in /var/lib). The caller adds the rest.
pub(crate) fn sluice_command(
    bed: &Testbed,
    subcommand: &str,
    audit: &std::path::Path,
    kind: ConditionKind,
    round: usize,
) -> Command {
    let mut cmd = Command::new(&bed.exe);
    cmd.arg(subcommand)
        .arg("--policy")
        .arg(&bed.policy)
        .arg("--upstream-ca")
        .arg(&bed.ca_file)
        .arg("--audit")
        .arg(audit)
        .arg("--timings")
        .arg(bed.dir.join(format!("timings-{kind}-{round}.csv")))
        .arg("--state-dir")
        .arg(bed.dir.join("state"));
    cmd
}

pub(crate) fn client_command(bed: &Testbed) -> Command {
    let mut cmd = Command::new(&bed.exe);
    cmd.arg("bench-client");
    cmd
}

struct Native;

impl Condition for Native {
    fn kind(&self) -> ConditionKind {
        ConditionKind::Native
    }

    fn start(&self, bed: &Testbed, _round: usize) -> Result<Session, BenchError> {
        Session::start("native", client_command(bed), &bed.outer, Proxy::None)
    }
}

/// The reference pair: the bench client's lean path (its `reference`
/// commands) to the reference origin, where native runs.
struct Reference;

impl Condition for Reference {
    fn kind(&self) -> ConditionKind {
        ConditionKind::Reference
    }

    fn start(&self, bed: &Testbed, _round: usize) -> Result<Session, BenchError> {
        Session::start("reference", client_command(bed), &bed.outer, Proxy::None)
    }
}

/// `sluice run` or `sluice oci` (with `image`), the client as the workload.
struct Sluice {
    kind: ConditionKind,
    audit: PathBuf,
    image: Option<String>,
}

/// Where the client binary is mounted in the container.
const CLIENT_IN_CONTAINER: &str = "/usr/local/bin/sluice-bench-client";

impl Condition for Sluice {
    fn kind(&self) -> ConditionKind {
        self.kind
    }

    fn audit_log(&self) -> Option<PathBuf> {
        Some(self.audit.clone())
    }

    fn start(&self, bed: &Testbed, round: usize) -> Result<Session, BenchError> {
        let subcommand = if self.image.is_some() { "oci" } else { "run" };
        let mut cmd = sluice_command(bed, subcommand, &self.audit, self.kind, round);
        cmd.arg("--");
        match &self.image {
            None => {
                cmd.arg(&bed.exe).arg("bench-client");
            }
            Some(image) => {
                // The running binary is mounted in, so the client in the
                // container is this very build (the image supplies busybox
                // and the libraries it links against).
                cmd.args(podman_global())
                    .args(["run", "--rm", "-i", "--pull=never"])
                    .args(["--ulimit", "nofile=20000:20000"])
                    .args(["--ulimit", "nproc=4096:4096"])
                    .arg("-v")
                    .arg(format!("{}:{CLIENT_IN_CONTAINER}:ro", bed.exe.display()))
                    .arg(image)
                    .args([CLIENT_IN_CONTAINER, "bench-client"]);
            }
        }
        Session::start(self.kind.name(), cmd, &bed.outer, Proxy::Itself)
    }
}

/// podman's global options that work on these machines (DESIGN.md).
fn podman_global() -> [&'static str; 5] {
    [
        "podman",
        "--runtime",
        "runc",
        "--cgroup-manager",
        "cgroupfs",
    ]
}

/// What the oci condition lacks here.
#[derive(Debug, PartialEq)]
enum OciLack {
    /// A tool to install: nothing the bench can build.
    Tool(Skip),
    /// The image, which the bench can build.
    Image(Skip),
}

impl OciLack {
    fn why(self) -> Skip {
        match self {
            OciLack::Tool(why) | OciLack::Image(why) => why,
        }
    }
}

/// Why containers cannot run here, if they cannot.
fn oci_unavailable(image: &str) -> Option<OciLack> {
    oci_unavailable_with(
        image,
        |tool| crate::program::on_path(tool).is_some(),
        podman_has_image,
    )
}

/// [`oci_unavailable`] with what it looks up given: whether a tool is on
/// PATH, and whether podman has an image.
fn oci_unavailable_with(
    image: &str,
    installed: impl Fn(&str) -> bool,
    has_image: impl Fn(&str) -> bool,
) -> Option<OciLack> {
    for (tool, package) in [("podman", "podman"), ("runc", "runc")] {
        if !installed(tool) {
            return Some(OciLack::Tool(format!(
                "{tool} is not installed (apt-get install --no-install-recommends {package})"
            )));
        }
    }
    if has_image(image) {
        None
    } else {
        Some(OciLack::Image(format!(
            "image {image} not found: build it with containers/build-image.sh --sluice \"$(command -v sluice)\" --tag {image}, or name one with --image"
        )))
    }
}

/// `podman image exists IMAGE`.
fn podman_has_image(image: &str) -> bool {
    Command::new("podman")
        .args(["image", "exists", image])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_condition_is_found_by_its_name() {
        for kind in ConditionKind::ALL {
            assert_eq!(ConditionKind::parse(kind.name()), Some(kind));
        }
        assert_eq!(ConditionKind::parse("qemu"), None);
    }

    #[test]
    fn only_sluice_is_checked_for_denies() {
        assert!(!ConditionKind::Native.enforces());
        assert!(!ConditionKind::VmDirect.enforces());
        assert!(!ConditionKind::Haproxy.enforces());
        assert!(!ConditionKind::TokioProxy.enforces());
        assert!(ConditionKind::Host.enforces() && ConditionKind::Oci.enforces());
    }

    #[test]
    fn without_podman_oci_is_skipped_with_the_package_to_install() {
        let why = oci_unavailable_with("img", |tool| tool != "podman", |_| true);
        assert_eq!(
            why,
            Some(OciLack::Tool(
                "podman is not installed (apt-get install --no-install-recommends podman)".into()
            ))
        );
    }

    #[test]
    fn without_its_image_oci_is_skipped_with_how_to_build_it() {
        let Some(OciLack::Image(why)) =
            oci_unavailable_with("localhost/bench:1", |_| true, |_| false)
        else {
            panic!("an image that is missing is the lack");
        };
        assert!(
            why.starts_with(
                "image localhost/bench:1 not found: build it with containers/build-image.sh "
            ),
            "{why}"
        );
        assert!(
            why.contains("--tag localhost/bench:1, or name one with --image"),
            "{why}"
        );
    }

    #[test]
    fn with_podman_runc_and_the_image_oci_runs() {
        assert_eq!(oci_unavailable_with("img", |_| true, |_| true), None);
    }
}
