//! The command line: clap definitions and the glue from arguments to the
//! library. main.rs only parses, sets up logging and maps errors to exit
//! codes.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Exit statuses of sluice's own failures (a wrapped command's status is
/// passed through unchanged).
pub mod exit {
    /// Bad input: a malformed policy, bad arguments.
    pub const BAD_INPUT: i32 = 2;
    /// The environment cannot enforce: not root, nft or ip missing, the
    /// ruleset did not read back as applied.
    pub const CANNOT_ENFORCE: i32 = 3;
    /// The wrapped command exists but cannot be run (as `env` and shells say).
    pub const COMMAND_CANNOT_RUN: i32 = 126;
    /// The wrapped command was not found.
    pub const COMMAND_NOT_FOUND: i32 = 127;
}

#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version,
    about = "A transparent egress proxy for sandboxes",
    long_about = "sluice runs untrusted code in a network namespace whose only way out is sluice.\n\
nftables steers every TCP connection and DNS query to sluice and drops everything else;\n\
sluice decides each connection against a policy, audits every deny, and relays what is allowed.\n\n\
Start with `sluice demo` (as root) to see it work.",
    after_help = "Exit status: `sluice run` exits with the wrapped command's status (128+N if signal N \
ended it; 127 if it was not found, 126 if it could not be run). sluice's own failures: 2 bad \
input (policy, bundle, arguments, an audit or timings file that cannot be written), 3 cannot \
enforce (not root, nft/ip missing, ruleset read-back mismatch).\n\nLogging: -v / -vv, or RUST_LOG=sluice=debug."
)]
pub struct Cli {
    /// More log output (-v info, -vv debug). Logs go to stderr.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a sandbox whose only network path is sluice.
    #[command(
        after_help = "Example:\n  sluice run --policy policies/dev.yaml -- curl -sS http://origin.test:8080/\n\n\
Allowed connections behave as without sluice. Denied plain-HTTP requests get a 403 naming the \
rule and reason; other denied TCP gets a reset; UDP other than DNS, ICMP and raw IP are dropped \
(sends fail with EPERM). Needs root.\n\n\
Signals: SIGTERM, and SIGINT sent to sluice alone, are passed to the command, which is killed 5 s \
later if still running. Ctrl-C at a terminal reaches the command directly, as without sluice, and \
the command decides (a shell carries on). SIGHUP reloads the policy or bundle."
    )]
    Run(RunArgs),
    /// Validate a policy file; prints a summary or every error with file:line:column.
    Check {
        /// The policy YAML file.
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
    },
    /// Show what a policy decides for one destination.
    #[command(
        after_help = "Examples:\n  sluice explain --policy policies/dev.yaml 198.18.0.1:8080\n  \
sluice explain --policy policies/dev.yaml 198.18.0.1:443 --host origin.test\n\n\
With --host, the name is assumed to have been resolved by sluice's DNS to DEST."
    )]
    Explain {
        /// The policy YAML file.
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// Destination address, with optional port (IPv6 as [addr]:port). Port defaults to 443.
        #[arg(value_name = "DEST[:PORT]")]
        dest: String,
        /// Hostname the connection names (TLS SNI, HTTP Host, or resolved name).
        #[arg(long, value_name = "NAME")]
        host: Option<String>,
    },
    /// Signed policy bundles: keys, signing, verification.
    #[command(subcommand)]
    Bundle(BundleCommand),
    /// Check or read an audit log.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Compare two timing files (or directories of batches), e.g. direct vs through sluice.
    #[command(
        after_help = "A directory is one batch per file (name order); a single file is cut into \
batches of --batch-size records. Prints count, median and P95 of connect, first byte and total for \
each input, the paired difference of medians by batch with a 95% bootstrap confidence interval \
(5,000 resamples, fixed seed), the ratio of medians, and two clusters instead of one median where \
a distribution has two.\n\nExample:\n  sluice compare direct.csv proxied.csv --plot compare.svg"
    )]
    Compare {
        /// The baseline (e.g. direct) timing file or directory.
        a: PathBuf,
        /// The other (e.g. proxied) timing file or directory.
        b: PathBuf,
        /// Print the numbers as CSV instead of a table.
        #[arg(long)]
        csv: bool,
        /// Also draw the two distributions side by side into FILE.svg.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        /// Records per batch when an input is a single file.
        #[arg(long, default_value_t = 256, value_name = "N")]
        batch_size: usize,
    },
    /// Run a podman container whose only network path is sluice.
    #[command(
        after_help = "Example:\n  sluice oci --policy policies/dev.yaml -- podman run --rm IMAGE wget -qO- http://origin.test:8080/\n\n\
sluice creates the sandbox namespace as `sluice run` does and adds `--network ns:<it>` to podman's \
options; a --network, --net or --pod of your own is refused. Before the container runs, a hook sluice \
adds checks its final OCI config and refuses (exit 2) CAP_SYS_ADMIN (--privileged), a PID namespace \
not its own (--pid host, ns:PATH, container:ID), and CAP_NET_ADMIN unless \
--annotation io.sluice.allow-net-admin=true (never with a bind of /proc or /run/netns). \
Exits with podman's status (the container's). With \
`podman run -d`, sluice stays until the container stops (`podman stop ID` ends both). Audit, timing \
and metrics records carry path \"oci\" and the container id. Needs root; podman must use runc \
here (see containers/containers.conf and docs/oci.md)."
    )]
    Oci(OciArgs),
    /// Serve many sandboxes from one process, attached through a control socket (OCI hook).
    #[command(
        after_help = "The config (YAML) names the control socket (default /run/sluice/daemon.sock, \
mode 0600), the metrics address, audit and timing files, and defaults for attached sandboxes; \
see docs/oci.md. SIGHUP re-reads every sandbox's policy; SIGINT/SIGTERM stop the daemon (the \
sandboxes' tables stay, so their connections are refused while no daemon runs). A daemon started \
on the same config adopts the containers that still run (records in <state_dir>/sandboxes/)."
    )]
    Daemon {
        /// The daemon's YAML config file.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// OCI createRuntime hook: asks the daemon to enforce a starting container (state JSON on stdin).
    #[command(
        after_help = "Install containers/hooks.d/sluice.json in podman's hooks dir. The hook runs for \
containers annotated io.sluice.policy=FILE or io.sluice.bundle=PATH (+ io.sluice.trust=FILE), sends \
the container's network namespace to the daemon and exits 0 only once the daemon enforces it; any \
failure exits non-zero, which aborts the container's start. The socket is the annotation \
io.sluice.socket, else --socket, else $SLUICE_DAEMON_SOCKET, else /run/sluice/daemon.sock. At the \
poststop stage it tells the daemon to release the sandbox (a hint; failures are ignored)."
    )]
    OciHook {
        /// The daemon's control socket.
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
    },
    /// List the sandboxes the daemon serves: path, id, policy, connections, drops.
    Status {
        /// The daemon's control socket (default: $SLUICE_DAEMON_SOCKET, else /run/sluice/daemon.sock).
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Show full container ids.
        #[arg(long)]
        no_trunc: bool,
    },
    /// Show sluice at work on a throwaway topology (needs root; touches nothing outside it).
    Demo,
    /// A small network client used by the demo and the tests to probe a sandbox from inside.
    #[command(subcommand)]
    Probe(ProbeCommand),
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check the hash chain; exit 1 with the first bad line (FILE:LINE: what) if broken.
    #[command(
        after_help = "Rotated files (FILE.N .. FILE.1, FILE) are checked as one chain. A file whose \
first line continues another file's chain needs --after PREV or --genesis HASH.\n\n\
The chain cannot show an edit of the very last line or lines cut off the end: keep the printed \
last hash elsewhere and compare it later."
    )]
    Verify {
        file: PathBuf,
        /// The hash the first line must chain from.
        #[arg(long, value_name = "HASH", conflicts_with = "after")]
        genesis: Option<String>,
        /// The file this one continues (its last line's hash is the genesis).
        #[arg(long, value_name = "PREV")]
        after: Option<PathBuf>,
    },
    /// Print records readably, one per line.
    Tail {
        file: PathBuf,
        /// Keep printing records as they are appended.
        #[arg(long, short)]
        follow: bool,
        /// Only records with this verdict (deny, would-deny, allow, refused).
        #[arg(long)]
        verdict: Option<String>,
        /// Print the raw JSON lines.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub source: PolicySourceArgs,
    #[command(flatten)]
    pub records: RecordArgs,
    /// Run the command as USER (name or uid) instead of root: do this for untrusted code (a root
    /// command cannot leave the namespace, but it still owns the host's files).
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// What a sandboxed run records and exports, and its connection limit
/// (shared by `sluice run` and `sluice oci`).
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Append audit records (JSONL, hash-chained) to FILE.
    #[arg(long, value_name = "FILE")]
    pub audit: Option<PathBuf>,
    /// Audit allowed connections too, not only denies.
    #[arg(long)]
    pub audit_allows: bool,
    /// Rotate the audit log when it reaches SIZE bytes (FILE.1, FILE.2, ...;
    /// the hash chain continues across files). Under `sluice run` the log's
    /// directory is then read-only for the command: keep it apart from the
    /// command's working directory (e.g. /var/log/sluice/).
    #[arg(long, value_name = "SIZE")]
    pub audit_max_bytes: Option<u64>,
    /// Write one timing record per connection to FILE (.csv for CSV, else JSONL).
    #[arg(long, value_name = "FILE")]
    pub timings: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics, from sluice's own
    /// namespace (never reachable from inside the sandbox).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Connections relayed at once; more wait for a free slot. Each takes six
    /// file descriptors: sluice raises its own soft limit to the hard one (the
    /// command keeps the limit it was started with) and serves no more than
    /// that allows.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    pub max_connections: usize,
}

impl RecordArgs {
    /// The process-wide services these options ask for.
    fn services(self) -> crate::app::ServiceOptions {
        crate::app::ServiceOptions {
            audit: self.audit,
            audit_max_bytes: self.audit_max_bytes,
            audit_allows: self.audit_allows,
            timings: self.timings,
            metrics: self.metrics,
            limits: crate::proxy::Limits {
                max_connections: self.max_connections.max(1),
                ..Default::default()
            },
            default_upstream: crate::app::host_nameservers(),
        }
    }
}

/// `sluice oci`.
#[derive(Debug, Args)]
pub struct OciArgs {
    #[command(flatten)]
    pub source: PolicySourceArgs,
    #[command(flatten)]
    pub records: RecordArgs,
    /// The podman command, after `--`: `podman run [OPTIONS] IMAGE [COMMAND]`.
    #[arg(last = true, required = true, value_name = "PODMAN RUN")]
    pub podman: Vec<OsString>,
}

/// Where the policy comes from: a plain file, or a signed bundle.
#[derive(Debug, Args)]
#[group(required = true, multiple = false, id = "policy_source")]
pub struct PolicySourceArgs {
    /// A policy YAML file (unsigned; for development). SIGHUP re-reads it.
    #[arg(long, value_name = "FILE", group = "policy_source")]
    pub policy: Option<PathBuf>,
    /// A signed bundle: a directory, a .tar.gz, or an https:// URL polled
    /// with ETag. Verified before the command starts; a new bundle at the
    /// same path (or SIGHUP) is verified, then swapped in.
    #[arg(
        long,
        value_name = "PATH|URL",
        group = "policy_source",
        requires = "trust"
    )]
    pub bundle: Option<String>,
    #[command(flatten)]
    pub bundle_opts: BundleOpts,
}

/// Options of a signed bundle source.
#[derive(Debug, Args)]
pub struct BundleOpts {
    /// The trust file listing the public keys bundles may be signed with.
    #[arg(long, value_name = "FILE")]
    pub trust: Option<PathBuf>,
    /// Where the highest accepted revision per bundle (rollback protection)
    /// and the last good fetched bundle are kept.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/sluice")]
    pub state_dir: PathBuf,
    /// Accept a bundle whose revision is lower than one accepted before.
    #[arg(long)]
    pub allow_rollback: bool,
    /// Extra CA certificate (PEM) to trust when fetching an https:// bundle.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// How often an https:// bundle is polled.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub poll_interval: std::time::Duration,
}

#[derive(Debug, Subcommand)]
pub enum BundleCommand {
    /// Create an Ed25519 signing key and add its public key to a trust file.
    Keygen {
        /// Where to write the private key (mode 0600; never overwritten).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// The trust file to add the public key to (created if missing).
        #[arg(long, value_name = "FILE")]
        trust: PathBuf,
        /// The key id bundles will name.
        #[arg(long, value_name = "NAME", default_value = "default")]
        id: String,
    },
    /// Validate a policy and sign it into a bundle (a directory, or OUT.tar.gz).
    Sign {
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// The bundle's revision; must grow with every release.
        #[arg(long, value_name = "N")]
        revision: u64,
        /// Expiry as an RFC 3339 UTC time (2027-01-01T00:00:00Z).
        #[arg(long, value_name = "RFC3339", conflicts_with = "ttl")]
        expires: Option<String>,
        /// Expiry as a duration from now (30d, 12h).
        #[arg(long, value_name = "DURATION", default_value = "30d")]
        ttl: String,
        #[arg(long, value_name = "DIR|FILE.tar.gz")]
        out: PathBuf,
    },
    /// Verify a bundle against a trust file; exit 0 if valid, else one line saying why.
    Verify {
        #[arg(long, value_name = "FILE")]
        trust: PathBuf,
        path: PathBuf,
    },
    /// Show a bundle's manifest and rules (no verification).
    Inspect { path: PathBuf },
}

#[derive(Debug, Subcommand)]
pub enum ProbeCommand {
    /// HTTP GET a URL (http:// only); prints status and body length; exit 0 on a 2xx.
    Http {
        url: String,
        /// Print the body to stdout.
        #[arg(long)]
        body: bool,
        /// Make N requests, each on a fresh connection, and print latency
        /// statistics instead of one result.
        #[arg(long, default_value_t = 1, value_name = "N")]
        count: usize,
        /// With --count: requests in flight at once.
        #[arg(long, default_value_t = 1, value_name = "N")]
        concurrency: usize,
        /// With --count: write the client-side timing of each request to FILE
        /// (.csv or JSONL, the record format of `sluice run --timings`).
        #[arg(long, value_name = "FILE")]
        timings: Option<PathBuf>,
        /// The `path` field of those records (e.g. direct, host).
        #[arg(long, default_value = "client", value_name = "NAME")]
        label: String,
    },
    /// TLS handshake with HOST:PORT (or ADDR:PORT with --sni), then HTTP GET /.
    Tls {
        /// Where to connect (host:port or addr:port).
        target: String,
        /// Server name to send (default: the host part of TARGET).
        #[arg(long)]
        sni: Option<String>,
        /// PEM file of the CA to trust.
        #[arg(long, value_name = "FILE")]
        ca: PathBuf,
    },
    /// Open a TCP connection, send LINE, print what comes back.
    Tcp {
        target: String,
        /// What to send before half-closing the connection.
        #[arg(long, default_value = "", conflicts_with = "server_first")]
        send: String,
        /// Send nothing and keep the write side open, reading until the
        /// server closes: a server-first protocol such as SSH or SMTP.
        #[arg(long)]
        server_first: bool,
    },
    /// Serve HTTP on ADDR (`/` says hello, `/bytes/N` sends N bytes) until killed:
    /// the origin side for trying sluice out and for timing comparisons.
    Serve { addr: SocketAddr },
    /// Send one UDP datagram.
    Udp { target: SocketAddr },
    /// Send one ICMP echo request over a raw socket.
    Icmp { target: std::net::IpAddr },
    /// Resolve NAME through the system's configured DNS server.
    Dns {
        name: String,
        /// AAAA instead of A.
        #[arg(long)]
        v6: bool,
        /// Use TCP instead of UDP.
        #[arg(long)]
        tcp: bool,
    },
}

/// Run the parsed command; returns the process exit status.
pub fn execute(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Run(args) => run(args),
        Command::Check { policy } => check(&policy),
        Command::Explain { policy, dest, host } => explain(&policy, &dest, host.as_deref()),
        Command::Audit(cmd) => audit(cmd),
        Command::Bundle(cmd) => bundle(cmd),
        Command::Compare {
            a,
            b,
            csv,
            plot,
            batch_size,
        } => compare(&a, &b, csv, plot.as_deref(), batch_size),
        Command::Oci(args) => oci(args),
        Command::Daemon { config } => daemon(&config),
        Command::OciHook { socket } => oci_hook(socket.as_deref()),
        Command::Status {
            socket,
            json,
            no_trunc,
        } => status(socket.as_deref(), json, no_trunc),
        Command::Demo => crate::demo::run(),
        Command::Probe(probe) => Ok(crate::probe::run(probe)),
    }
}

fn run(args: RunArgs) -> anyhow::Result<i32> {
    let policy = policy_source(&args.source, "host")?;
    crate::confine::require_root("sluice run")?;
    let files = sluice_files(&args.source, &args.records);
    let opts = crate::app::RunOptions {
        policy,
        services: args.records.services(),
        user: args.user,
        command: args.command,
        files,
    };
    runtime()?.block_on(crate::app::run(opts))
}

/// The files this run of sluice reads or writes, which its workload must
/// not change (see `confine::SluiceFiles`).
fn sluice_files(source: &PolicySourceArgs, records: &RecordArgs) -> crate::confine::SluiceFiles {
    let bundle = source
        .bundle
        .as_deref()
        .filter(|b| !b.starts_with("https://") && !b.starts_with("http://"));
    let mut read_only: Vec<PathBuf> = source.policy.iter().cloned().collect();
    read_only.extend(bundle.map(PathBuf::from));
    if source.bundle.is_some() {
        let opts = &source.bundle_opts;
        read_only.extend(opts.trust.iter().cloned());
        read_only.extend(opts.ca.iter().cloned());
        read_only.push(opts.state_dir.clone());
    }
    let records_files = [
        (&records.audit, records.audit_max_bytes.is_some()),
        (&records.timings, false),
    ]
    .into_iter()
    .filter_map(|(path, rotates)| {
        path.clone()
            .map(|path| crate::confine::RecordFile { path, rotates })
    })
    .collect();
    let mut hidden = vec![PathBuf::from(crate::daemon::api::DEFAULT_SOCKET)];
    hidden.push(crate::daemon::socket_path(None));
    hidden.dedup();
    crate::confine::SluiceFiles {
        read_only,
        records: records_files,
        hidden,
    }
}

/// One sandbox (`run`, `oci`) is served on one thread: no task ever hops
/// between threads, which measured a little less CPU per connection than a
/// two-worker runtime on these 2-vCPU machines, where the workload and its
/// peers need the other core. The daemon serves many sandboxes and gets a
/// worker per core.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn runtime_for_many_sandboxes() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn oci(args: OciArgs) -> anyhow::Result<i32> {
    let podman = crate::attach::oci::PodmanRun::parse(&args.podman).map_err(BadInput::from)?;
    let policy = policy_source(&args.source, "oci")?;
    crate::confine::require_root("sluice oci")?;
    let opts = crate::app::oci::OciOptions {
        policy,
        services: args.records.services(),
        podman,
    };
    runtime()?.block_on(crate::app::oci::run(opts))
}

fn daemon(config: &std::path::Path) -> anyhow::Result<i32> {
    let config = crate::daemon::DaemonConfig::load(config).map_err(BadInput::from)?;
    crate::confine::require_root("sluice daemon")?;
    runtime_for_many_sandboxes()?.block_on(crate::daemon::run(config))
}

/// An error that is the user's input (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct BadInput(#[from] anyhow::Error);

impl From<crate::daemon::config::ConfigError> for BadInput {
    fn from(e: crate::daemon::config::ConfigError) -> BadInput {
        BadInput(e.into())
    }
}

impl From<crate::attach::oci::OciError> for BadInput {
    fn from(e: crate::attach::oci::OciError) -> BadInput {
        BadInput(e.into())
    }
}

fn oci_hook(socket: Option<&std::path::Path>) -> anyhow::Result<i32> {
    use crate::attach::oci::{self, HookPlan, OciState, ANNOTATION_SOCKET};
    use anyhow::Context;
    use std::io::Read;
    use std::os::fd::AsFd;

    let mut input = Vec::new();
    std::io::stdin()
        .take(1 << 20)
        .read_to_end(&mut input)
        .context("cannot read the container state from stdin")?;
    let state = OciState::parse(&input).map_err(BadInput::from)?;
    let annotated = state
        .annotations
        .get(ANNOTATION_SOCKET)
        .map(std::path::Path::new);
    let client = crate::daemon::Client::new(crate::daemon::socket_path(annotated.or(socket)));

    if state.is_stopped() {
        // poststop: a hint that lets the daemon release early; the daemon
        // notices the container's end by itself anyway.
        match client.detach(&state.id) {
            Ok(Some(_)) => tracing::info!(container = %state.id, "sandbox released"),
            Ok(None) => {}
            Err(err) => tracing::info!(%err, "poststop: could not tell the daemon"),
        }
        return Ok(0);
    }
    let pid = state.pid.filter(|p| *p > 0).ok_or(oci::OciError::NoPid)?;
    // Whatever started it: a container that could leave its namespace does
    // not start.
    match &state.bundle {
        Some(bundle) => oci::check_bundle_confinement(bundle).map_err(BadInput::from)?,
        None => {
            return Err(BadInput(anyhow::anyhow!(
                "the container state names no bundle: cannot check how the container is confined"
            ))
            .into())
        }
    }
    match HookPlan::from_annotations(&state.annotations).map_err(BadInput::from)? {
        HookPlan::CheckWrapped { inode } => {
            oci::check_wrapped(pid, &inode)?;
            Ok(0)
        }
        HookPlan::Attach {
            policy,
            bundle,
            trust,
        } => {
            for (what, path) in [("io.sluice.policy", &policy), ("io.sluice.trust", &trust)] {
                if let Some(path) = path.as_ref().filter(|p| !p.is_absolute()) {
                    return Err(BadInput(anyhow::anyhow!(
                        "{what}={}: give an absolute path (the daemon reads it on the host)",
                        path.display()
                    ))
                    .into());
                }
            }
            let path = oci::container_netns_path(pid);
            let netns = std::fs::File::open(&path).map_err(|source| oci::OciError::Netns {
                path,
                cause: source,
            })?;
            let request = crate::daemon::api::AttachRequest {
                id: state.id.clone(),
                pid: Some(pid),
                policy,
                bundle,
                trust,
            };
            let info = client
                .attach(&request, netns.as_fd())
                .with_context(|| format!("container {} was not started", state.id))?;
            tracing::info!(
                container = %info.id,
                policy = %info.policy,
                netns_inode = info.netns_inode,
                "container attached to the sluice daemon"
            );
            Ok(0)
        }
    }
}

fn status(socket: Option<&std::path::Path>, json: bool, no_trunc: bool) -> anyhow::Result<i32> {
    let client = crate::daemon::Client::new(crate::daemon::socket_path(socket));
    let sandboxes = client.list()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&sandboxes)?);
        return Ok(0);
    }
    if sandboxes.is_empty() {
        println!("no sandboxes attached");
        return Ok(0);
    }
    println!(
        "{:<5} {:<12} {:<24} {:>8} {:>8} {:>10} {:>7} {:>8}",
        "PATH", "ID", "POLICY", "ALLOWED", "DENIED", "WOULD-DENY", "ACTIVE", "DROPPED"
    );
    for s in &sandboxes {
        let id = if no_trunc || s.id.len() <= 12 {
            s.id.as_str()
        } else {
            &s.id[..12]
        };
        println!(
            "{:<5} {:<12} {:<24} {:>8} {:>8} {:>10} {:>7} {:>8}",
            s.path,
            id,
            s.policy,
            s.connections.allowed,
            s.connections.denied,
            s.connections.would_deny,
            s.connections.active,
            s.dropped_packets.map_or("-".to_string(), |d| d.to_string()),
        );
    }
    Ok(0)
}

/// Turn `--policy` / `--bundle` into what the app loads. A plain policy is
/// validated here, so a bad file fails before anything is created.
pub fn policy_source(
    args: &PolicySourceArgs,
    path: &'static str,
) -> anyhow::Result<crate::app::PolicySource> {
    use crate::app::PolicySource;
    if let Some(file) = &args.policy {
        let policy = crate::policy::Policy::load(file)?;
        return Ok(PolicySource::File {
            path: file.clone(),
            policy: Box::new(policy),
        });
    }
    let bundle = args
        .bundle
        .as_deref()
        .expect("clap requires --policy or --bundle");
    let opts = &args.bundle_opts;
    let trust_path = opts
        .trust
        .as_deref()
        .expect("clap requires --trust with --bundle");
    let trust = crate::bundle::TrustStore::load(trust_path)?;
    let state = crate::bundle::RevisionState::open(&opts.state_dir)?;
    Ok(PolicySource::Bundle(Box::new(
        crate::reload::ReloadConfig {
            source: crate::reload::BundleSource::parse(bundle),
            trust,
            state,
            allow_rollback: opts.allow_rollback,
            sandbox: format!("{path}-{}", std::process::id()),
            path,
            fetch: crate::reload::FetchConfig {
                ca_file: opts.ca.clone(),
                interval: opts.poll_interval,
                ..Default::default()
            },
        },
    )))
}

fn bundle(cmd: BundleCommand) -> anyhow::Result<i32> {
    use crate::bundle;
    match cmd {
        BundleCommand::Keygen { key, trust, id } => {
            bundle::keygen(&key, &trust, &id)?;
            println!(
                "wrote private key {} (keep it secret) and added key `{id}` to {}",
                key.display(),
                trust.display()
            );
            Ok(0)
        }
        BundleCommand::Sign {
            key,
            policy,
            revision,
            expires,
            ttl,
            out,
        } => {
            let expires = match expires {
                Some(at) => bundle::parse_time(&at).map_err(|e| {
                    BadInput(anyhow::anyhow!("--expires {at}: {e}; write an RFC 3339 UTC time such as 2027-01-01T00:00:00Z"))
                })?,
                None => {
                    let d = humantime::parse_duration(&ttl).map_err(|e| {
                        BadInput(anyhow::anyhow!(
                            "--ttl {ttl}: {e}; write a duration such as 30d or 12h"
                        ))
                    })?;
                    time::OffsetDateTime::now_utc() + d
                }
            };
            bundle::sign(&key, &policy, revision, expires, &out)?;
            println!(
                "signed {} revision {revision} into {}",
                policy.display(),
                out.display()
            );
            Ok(0)
        }
        BundleCommand::Verify { trust, path } => {
            let result = bundle::TrustStore::load(&trust).and_then(|trust| {
                bundle::Bundle::load(&path, &trust, time::OffsetDateTime::now_utc())
            });
            match result {
                Ok(verified) => {
                    println!("{}: valid bundle {}", path.display(), verified.label());
                    Ok(0)
                }
                Err(err) => {
                    println!("refused: {err}");
                    Ok(exit::BAD_INPUT)
                }
            }
        }
        BundleCommand::Inspect { path } => {
            print!("{}", bundle::inspect(&path)?);
            Ok(0)
        }
    }
}

fn check(path: &std::path::Path) -> anyhow::Result<i32> {
    let policy = crate::policy::Policy::load(path)?;
    let rules = policy.rules();
    let allows = rules
        .iter()
        .filter(|r| r.action == crate::policy::Verdict::Allow)
        .count();
    println!(
        "{}: policy \"{}\" is valid: {} rules ({} allow, {} deny), mode {}",
        path.display(),
        policy.name(),
        rules.len(),
        allows,
        rules.len() - allows,
        match policy.mode() {
            crate::policy::Mode::Enforce => "enforce",
            crate::policy::Mode::Audit => "audit",
        }
    );
    Ok(0)
}

fn explain(path: &std::path::Path, dest: &str, host: Option<&str>) -> anyhow::Result<i32> {
    let policy = crate::policy::Policy::load(path)?;
    let dst = parse_dest(dest).map_err(BadInput::from)?;
    let decision = policy.decide(dst, host, &crate::policy::AnyResolution);
    println!("destination: {dst}");
    if let Some(host) = host {
        println!("host:        {host}");
    }
    println!("verdict:     {}", decision.verdict.as_str());
    println!("rule:        {}", decision.rule.unwrap_or("(none)"));
    println!("reason:      {}", decision.reason.as_str());
    if policy.mode() == crate::policy::Mode::Audit
        && decision.verdict == crate::policy::Verdict::Deny
    {
        println!(
            "note:        the policy is in audit mode: this deny would be logged, not enforced"
        );
    }
    Ok(0)
}

/// `ADDR`, `ADDR:PORT`, `[V6]:PORT` or a bare IPv6 address; port defaults to 443.
fn parse_dest(dest: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(addr) = dest.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = dest.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, 443));
    }
    anyhow::bail!(
        "`{dest}` is not an address: give DEST as 198.18.0.1, 198.18.0.1:8080, 2001:db8::1 or [2001:db8::1]:443"
    )
}

fn audit(cmd: AuditCommand) -> anyhow::Result<i32> {
    use crate::audit::{verify_rotated, Genesis, TailOptions};
    match cmd {
        AuditCommand::Verify {
            file,
            genesis,
            after,
        } => {
            let genesis = match (genesis, after) {
                (Some(hash), _) => Genesis::Hash(hash),
                (None, Some(prev)) => Genesis::After(prev),
                (None, None) => Genesis::Fresh,
            };
            match verify_rotated(&file, &genesis) {
                Ok(summary) => {
                    println!(
                        "{}: chain intact: {} records in {} file(s), seq {}..{}; last hash {}",
                        file.display(),
                        summary.records,
                        summary.files.len(),
                        summary.first_seq.map_or("-".into(), |s| s.to_string()),
                        summary.last_seq.map_or("-".into(), |s| s.to_string()),
                        summary.last_hash
                    );
                    Ok(0)
                }
                Err(err) => {
                    println!("{err}");
                    Ok(1)
                }
            }
        }
        AuditCommand::Tail {
            file,
            follow,
            verdict,
            json,
        } => {
            let options = TailOptions {
                follow,
                verdict,
                json,
                ..TailOptions::default()
            };
            let mut out = std::io::stdout().lock();
            match crate::audit::tail(&file, &options, &mut out) {
                Ok(()) => Ok(0),
                Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    Err(BadInput(anyhow::anyhow!(
                        "cannot read {}: {err}; give the file --audit wrote",
                        file.display()
                    ))
                    .into())
                }
                Err(err) => Err(anyhow::anyhow!("cannot read {}: {err}", file.display())),
            }
        }
    }
}

fn compare(
    a: &std::path::Path,
    b: &std::path::Path,
    csv: bool,
    plot: Option<&std::path::Path>,
    batch_size: usize,
) -> anyhow::Result<i32> {
    use anyhow::Context;
    let batch_size = batch_size.max(1);
    // The errors name the file that could not be read.
    let left = crate::timing::load_input(a, batch_size)?;
    let right = crate::timing::load_input(b, batch_size)?;
    let comparison = crate::timing::compare(&left, &right);
    if csv {
        print!("{}", comparison.render_csv());
    } else {
        print!("{}", comparison.render_table());
    }
    if let Some(svg) = plot {
        crate::timing::plot_svg(&left, &right, svg)
            .with_context(|| format!("cannot draw {}", svg.display()))?;
        eprintln!("wrote {}", svg.display());
    }
    Ok(0)
}
