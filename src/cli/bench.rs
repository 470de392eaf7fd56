//! `sluice bench`: the native-vs-proxied method in one command; and the two
//! hidden helpers it runs, `sluice bench-client` (the client inside each
//! condition's sandbox) and `sluice bench-proxy` (the minimal peer, on tokio).

use std::path::PathBuf;

use clap::Args;

use crate::bench::{self, report, BenchError, ConditionKind, Plan, Workload};

pub(crate) const AFTER_HELP: &str = "\
Builds a throwaway topology (an origin and a service the policy forbids, in a namespace of its \
own; nothing outside it is touched) and runs every condition side by side: native (the client \
straight to the origin), reference (the calibration: the leanest client and origin where native \
runs; always run), host (under `sluice run`), oci (in a container under `sluice oci`; \
needs podman and an image with the client's libraries, see containers/build-image.sh), haproxy \
and tokio-proxy (peers with no policy behind the same nft redirect), vm (the client in the test microVM under \
`sluice vm`) and vm-direct (the same microVM on a plain tap, no sluice; both need \
qemu-system-x86_64 and the guest kit of containers/vm/build-guest.sh, found in $SLUICE_VM_KIT or \
target/vm-kit beside the binary; one boot per session, TCG emulation). A missing oci image or \
guest kit is built first with those scripts from the source tree sluice was built from (unless \
--no-build); a condition that still cannot run here is skipped with one line saying why.

Every round (--warmups, then --batches) starts a fresh session per condition, in a shuffled \
order, and runs: a deny check, small (--conns fresh connections, --threads at once, 1 KiB), \
serial (the same one at a time), bulk (32 MiB in 1 KiB and in 64 KiB writes, length and SHA-256 \
checked), stream (ten 13-byte events 2 ms apart), tls (--conns fresh TLS connections one at a \
time, one 1 KiB GET each, to a name its rule admits by SNI: relayed) and l7 (the same to a name \
whose rule decides each request and injects a header: sluice terminates TLS with the sandbox CA \
and verifies the origin; haproxy does the same in `mode http`; the TCP relays and the VM \
conditions skip it). --workloads picks some. The report gives P50/P95 across batches, the \
ratio to native, the paired difference to native with a 95% bootstrap CI, the proxy's CPU per \
connection and start+exit time, the calibration (native beside the reference pair, the leanest \
client and origin: within 15% or the report says the ratios are compressed) and every request's \
P50/P90/P99; DIR gets report.md, batches.csv, paired.csv, raw.jsonl and two SVG \
plots.

Exit status: 0 done; 1 a content check or a deny check failed (the run is void; a deny failure's \
report is still written); 2 bad arguments; 3 the testbed cannot be built (not root, ip or nft \
missing); 130 interrupted (everything it made is removed).

Examples:
  sluice bench --quick --out /tmp/bench
  sluice bench --conditions native,host,haproxy --batches 30 --out bench-$(date +%F)";

/// The image `containers/build-image.sh` builds by default.
pub(crate) const DEFAULT_IMAGE: &str = "localhost/sluice-busybox:latest";

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Conditions to run, comma-separated (native is required: every ratio
    /// is to it; reference, the calibration, always runs beside it):
    /// native, reference, host, oci, haproxy, tokio-proxy, vm, vm-direct.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "native,reference,host,oci,haproxy,tokio-proxy,vm,vm-direct"
    )]
    pub(crate) conditions: Vec<String>,
    /// Workloads to run, comma-separated: small, serial, bulk-1k,
    /// bulk-64k, stream, tls, l7 (default: all).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "small,serial,bulk-1k,bulk-64k,stream,tls,l7"
    )]
    pub(crate) workloads: Vec<String>,
    /// Formal rounds (default 30; 3 with --quick).
    #[arg(long, value_name = "N")]
    pub(crate) batches: Option<usize>,
    /// Rounds run first and left out (default 3; 1 with --quick).
    #[arg(long, value_name = "N")]
    pub(crate) warmups: Option<usize>,
    /// Fresh connections per small and serial batch.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub(crate) conns: usize,
    /// Client threads of the small workload.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub(crate) threads: usize,
    /// Seed of the condition order and the bootstrap (default: one drawn
    /// now; the report names it, so a run can be repeated).
    #[arg(long, value_name = "N")]
    pub(crate) seed: Option<u64>,
    /// The image the oci condition runs the client in (it must hold the
    /// libraries sluice links against; this sluice binary is mounted in).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_IMAGE)]
    pub(crate) image: String,
    /// Every available condition with few batches: well under two minutes
    /// once the oci image and the guest kit exist.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Skip oci or vm when the image or the guest kit is missing, instead
    /// of building it first with containers/build-image.sh or
    /// containers/vm/build-guest.sh from the source tree sluice was built
    /// from (the kit takes minutes the first time).
    #[arg(long)]
    pub(crate) no_build: bool,
    /// Where the report goes (created if missing).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: PathBuf,
}

impl BenchArgs {
    fn plan(&self) -> Result<Plan, BenchError> {
        let conditions = self
            .conditions
            .iter()
            .map(|name| {
                ConditionKind::parse(name.trim()).ok_or_else(|| {
                    BenchError::BadPlan(format!(
                        "--conditions: unknown condition `{name}`; known: {}",
                        ConditionKind::ALL.map(|c| c.name()).join(", ")
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The calibration belongs to every run: without it a ratio to
        // native cannot say whether native measured the instrument.
        let mut conditions = conditions;
        if !conditions.contains(&ConditionKind::Reference) {
            conditions.push(ConditionKind::Reference);
        }
        let mut workloads = self
            .workloads
            .iter()
            .map(|name| {
                Workload::parse(name.trim()).ok_or_else(|| {
                    BenchError::BadPlan(format!(
                        "--workloads: unknown workload `{name}`; known: {}",
                        Workload::ALL.map(|w| w.name()).join(", ")
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        workloads.sort();
        workloads.dedup();
        let (batches, warmups) = if self.quick { (3, 1) } else { (30, 3) };
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 % 1_000_000)
        });
        let plan = Plan {
            conditions,
            workloads,
            batches: self.batches.unwrap_or(batches),
            warmups: self.warmups.unwrap_or(warmups),
            conns: self.conns,
            threads: self.threads,
            seed,
            image: self.image.clone(),
            build_missing: !self.no_build,
        };
        plan.check()?;
        Ok(plan)
    }
}

pub(crate) fn execute(args: BenchArgs) -> anyhow::Result<i32> {
    let plan = args.plan().map_err(|e| super::BadInput(e.into()))?;
    crate::confine::require_root("sluice bench")?;
    for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
        if crate::program::on_path(tool).is_none() {
            anyhow::bail!("`{tool}` is not installed: apt-get install -y {package}");
        }
    }
    let command = std::env::args()
        .map(|a| shell_word(&a))
        .collect::<Vec<_>>()
        .join(" ");
    let mut machine = report::Machine::observe();
    let mut progress = bench::progress::Progress::for_stderr();
    let results = match bench::run(&plan, &mut progress) {
        Ok(results) => results,
        Err(err @ (BenchError::Interrupted | BenchError::Content { .. })) => {
            progress.end();
            eprintln!("sluice: error: {err}");
            return Ok(if matches!(err, BenchError::Interrupted) {
                130
            } else {
                1
            });
        }
        Err(err) => {
            progress.end();
            return Err(err.into());
        }
    };
    machine.load_after = report::load_average();
    let summary = bench::stats::summarise(&results);
    report::write(&args.out, &results, &summary, &machine, &command)?;
    print!("{}", report::table(&summary));
    println!("\nreport: {}", args.out.join("report.md").display());
    let failures = results.deny_failures();
    if let Some(first) = failures.first() {
        let err = BenchError::DenyFailed {
            failed: failures.len(),
            total: results.rounds.iter().filter(|r| r.deny.is_some()).count(),
            first: first.clone(),
        };
        eprintln!("sluice: error: {err}");
        return Ok(1);
    }
    Ok(0)
}

/// `arg` as a shell would need it to mean itself.
fn shell_word(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:@%+".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

pub(crate) const SCALE_AFTER_HELP: &str = "\
Builds a throwaway topology (an echo origin at 198.18.0.1:8080 in a namespace of its own, and \
--sandboxes plain namespaces each holding one `sleep infinity` process; nothing outside them is \
touched), starts `sluice daemon` there with its own socket, audit log and state in a temp dir, \
attaches the sandboxes one by one through the control API (each attach timed), then opens --conns \
connections spread over the sandboxes, each round-tripping a token through the proxy and held \
open, sampling the daemon's VmRSS and VmHWM at 0, 1/4, 1/2, 3/4 and all of them. Then it closes \
them, waits until the daemon counts none active, samples again, detaches every sandbox and checks \
none is left. DIR gets report.md, attach.csv and rss.csv.

Limits: the daemon holds two descriptors per relayed connection (and the bench two), so the \
bench raises its own RLIMIT_NOFILE (soft and hard, inherited by the daemon) to 2 x --conns + \
4096. Raising the hard limit needs CAP_SYS_RESOURCE (and stops at /proc/sys/fs/nr_open); without \
it, --conns can be at most (ulimit -Hn - 4096) / 2, e.g. 7950 for a hard limit of 20,000. Needs root, ip (iproute2), \
nft (nftables) and sleep.

With --run it measures `sluice run` instead of the daemon: one fresh `sluice run` per mode, plain \
(the origin admitted by a cidrs rule: the plain relay) then checked (admitted by a hosts rule, \
origin.test pinned by dns.hosts: every request decided on its own Host), its workload a client \
(`sluice bench-hold`, a process of its own) that opens --conns connections in four steps, each \
sending one request, reading the origin's whole answer and held idle in keep-alive; the VmRSS, \
VmHWM and RssAnon of the `sluice run` process are sampled before the first connection and at \
each step; a request for another name on a held connection then checks the path (200 plain, 403 \
checked). `sluice run` caps the connections it relays at once at (ulimit -Hn - 256) / 6 (3290 \
for 20,000), so --conns stops there. DIR gets report.md and rss.csv (one row per mode and step).

Exit status: 0 done; 1 the bench failed (a connection did not round-trip, an attach or detach \
failed, a mode check failed, or the testbed could not be built: the message says which); 2 bad \
arguments.

Examples:
  sluice bench-scale --sandboxes 100 --conns 10000 --out /tmp/scale
  sluice bench-scale --run --conns 3200 --out /tmp/scale-run";

/// `sluice bench-scale`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct BenchScaleArgs {
    /// Sandboxes attached to the one daemon (1 to 1000).
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub(crate) sandboxes: usize,
    /// Connections held open at once, spread over the sandboxes (1 to 100000).
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub(crate) conns: usize,
    /// Measure one `sluice run` (plain, then checked connections) instead of the daemon.
    #[arg(long, conflicts_with = "sandboxes")]
    pub(crate) run: bool,
    /// Where the report goes (created if missing).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: PathBuf,
}

pub(crate) fn execute_scale(args: BenchScaleArgs) -> anyhow::Result<i32> {
    if !(1..=1000).contains(&args.sandboxes) || !(1..=bench::MAX_CONNS).contains(&args.conns) {
        return Err(super::BadInput(anyhow::anyhow!(
            "--sandboxes must be 1 to 1000 and --conns 1 to {}",
            bench::MAX_CONNS
        ))
        .into());
    }
    crate::confine::require_root("sluice bench-scale")?;
    for (tool, package) in [
        ("ip", "iproute2"),
        ("nft", "nftables"),
        ("sleep", "coreutils"),
    ] {
        if crate::program::on_path(tool).is_none() {
            anyhow::bail!("`{tool}` is not installed: apt-get install -y {package}");
        }
    }
    let ran = if args.run {
        bench::scale_run::run(&bench::scale_run::RunPlan {
            conns: args.conns,
            out: args.out.clone(),
        })
    } else {
        bench::scale::run(&bench::scale::ScalePlan {
            sandboxes: args.sandboxes,
            conns: args.conns,
            out: args.out.clone(),
        })
    };
    match ran {
        Ok(report) => {
            print!("{report}");
            println!("\nreport: {}", args.out.join("report.md").display());
            Ok(0)
        }
        Err(err) => {
            eprintln!("sluice: error: the scale bench failed: {err:#}");
            Ok(1)
        }
    }
}

/// `sluice bench-proxy`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct BenchProxyArgs {
    /// The network namespace (a path) to listen in.
    #[arg(long, value_name = "PATH")]
    pub(crate) netns: PathBuf,
    /// The port to listen on, on 127.0.0.1 there.
    #[arg(long, value_name = "PORT")]
    pub(crate) port: u16,
}

pub(crate) fn execute_proxy(args: BenchProxyArgs) -> anyhow::Result<i32> {
    bench::peers::serve_minimal_proxy(&args.netns, args.port)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn plan(argv: &[&str]) -> Result<Plan, BenchError> {
        Wrap::try_parse_from(std::iter::once("bench").chain(argv.iter().copied()))
            .unwrap()
            .args
            .plan()
    }

    #[test]
    fn quick_means_few_batches_unless_they_are_given() {
        let p = plan(&["--quick", "--out", "x", "--seed", "5"]).unwrap();
        assert_eq!((p.batches, p.warmups, p.seed), (3, 1, 5));
        let p = plan(&["--quick", "--batches", "4", "--out", "x"]).unwrap();
        assert_eq!(p.batches, 4);
        let p = plan(&["--out", "x"]).unwrap();
        assert_eq!((p.batches, p.warmups), (30, 3));
        assert_eq!(p.conditions.len(), ConditionKind::ALL.len());
    }

    #[test]
    fn a_missing_image_or_kit_is_built_unless_no_build_is_given() {
        assert!(plan(&["--quick", "--out", "x"]).unwrap().build_missing);
        assert!(
            !plan(&["--quick", "--no-build", "--out", "x"])
                .unwrap()
                .build_missing
        );
    }

    #[test]
    fn the_reference_pair_runs_beside_native_unless_named_already() {
        let p = plan(&["--conditions", "native,host", "--out", "x"]).unwrap();
        assert_eq!(
            p.conditions,
            [
                ConditionKind::Native,
                ConditionKind::Host,
                ConditionKind::Reference
            ]
        );
        let p = plan(&["--conditions", "reference,native", "--out", "x"]).unwrap();
        assert_eq!(p.conditions.len(), 2);
    }

    #[test]
    fn an_unknown_condition_is_named() {
        let err = plan(&["--conditions", "native,qemu", "--out", "x"]).unwrap_err();
        assert!(err.to_string().contains("`qemu`"), "{err}");
    }

    #[test]
    fn the_command_line_is_quoted_for_a_shell() {
        assert_eq!(shell_word("--out"), "--out");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
