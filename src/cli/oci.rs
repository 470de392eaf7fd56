//! `sluice oci -- podman run ...`: a podman container whose only way out is
//! sluice.

use std::ffi::OsString;

use clap::Args;

use super::args::{policy_source, PolicySourceArgs, RecordArgs};

pub(crate) const AFTER_HELP: &str = "Example:\n  sluice oci --policy policies/dev.yaml -- podman run --rm IMAGE wget -qO- http://origin.test:8080/\n\n\
sluice creates the sandbox namespace as `sluice run` does and adds `--network ns:<it>` to podman's \
options; a --network, --net or --pod of your own is refused. Before the container runs, a hook sluice \
adds checks its final OCI config and refuses (exit 2) CAP_SYS_ADMIN (--privileged), a PID namespace \
not its own (--pid host, ns:PATH, container:ID), CAP_NET_ADMIN unless \
--annotation io.sluice.allow-net-admin=true (never with a bind of /proc or /run/netns), and a bind \
mount that reaches an audit checkpoint key or one of the policy's secret files. When a rule terminates \
TLS, the container gets SLUICE_SECRET_<NAME> placeholders and the system roots plus the \
sandbox CA read-only at /etc/ssl/certs/ca-certificates.crt with SSL_CERT_FILE, CURL_CA_BUNDLE, \
REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS and GIT_SSL_CAINFO pointing there (podman --volume/--env). \
Exits with podman's status (the container's). With \
`podman run -d`, sluice stays until the container stops (`podman stop ID` ends both). Audit, timing \
and metrics records carry path \"oci\" and the container id. Needs root; podman must use runc \
here (see containers/containers.conf and docs/oci.md).";

/// `sluice oci`.
#[derive(Debug, Args)]
pub(crate) struct OciArgs {
    #[command(flatten)]
    pub(crate) source: PolicySourceArgs,
    #[command(flatten)]
    pub(crate) records: RecordArgs,
    /// The podman command, after `--`: `podman run [OPTIONS] IMAGE [COMMAND]`.
    #[arg(last = true, required = true, value_name = "PODMAN RUN")]
    pub(crate) podman: Vec<OsString>,
}

pub(crate) fn execute(args: OciArgs) -> anyhow::Result<i32> {
    let podman = crate::attach::oci::PodmanRun::parse(&args.podman)?;
    let policy = policy_source(&args.source, crate::workload::WorkloadPath::Oci)?;
    crate::confine::require_root("sluice oci")?;
    // Before the sandbox, whose listeners (one per worker) may be bound
    // before the runtime starts.
    let runtime = crate::serve::runtime::plan_one_sandbox()?;
    // The namespace first, on a thread of its own while the runtime and the
    // services start (as for `sluice run`).
    let sandbox = crate::app::start_sandbox(
        &crate::attach::oci::attachment()
            .served_by(runtime.listeners_per_address())
            .sockets_shared_by(runtime.workers_per_socket()),
    )?;
    let (started, workers) = runtime.start()?;
    let opts = crate::app::oci::OciOptions {
        policy,
        services: args
            .records
            .services(&args.source.bundle_opts.state_dir, workers),
        podman,
        sandbox,
    };
    started.block_on(crate::app::oci::run(opts))
}
