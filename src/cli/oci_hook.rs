//! `sluice oci-hook`: the OCI createRuntime (and poststop) hook. The
//! checks are `attach::oci::hook`'s; this sends their result to the daemon.

use std::os::fd::AsFd;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::attach::oci::ca_mount;
use crate::attach::oci::hook::{self, HookStep, OciState};
use crate::attach::oci_check::Guarded;
use crate::intercept::roots::SYSTEM_BUNDLE;

pub(crate) const AFTER_HELP: &str = "Install containers/hooks.d/sluice.json in podman's hooks dir. The hook runs for \
containers annotated io.sluice.policy=FILE or io.sluice.bundle=PATH (+ io.sluice.trust=FILE), sends \
the container's network namespace to the daemon and exits 0 only once the daemon enforces it; any \
failure exits non-zero, which aborts the container's start. The socket is the annotation \
io.sluice.socket, else --socket, else $SLUICE_DAEMON_SOCKET, else /run/sluice/daemon.sock. At the \
poststop stage it tells the daemon to release the sandbox (a hint; failures are ignored). When the \
policy terminates TLS, the hook mounts the system roots plus the sandbox CA read-only over the \
container's /etc/ssl/certs/ca-certificates.crt (which curl, openssl, python's ssl and `sluice probe tls` \
read); it cannot set the container's environment: give `-e SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt` \
(or NODE_EXTRA_CA_CERTS, REQUESTS_CA_BUNDLE, ...) for clients that do not read that path. A bind \
mount of an audit checkpoint key or of one of the policy's secret files is refused.";

#[derive(Debug, Args)]
pub(crate) struct OciHookArgs {
    /// The daemon's control socket.
    #[arg(long, value_name = "PATH")]
    pub(crate) socket: Option<PathBuf>,
    /// A file no bind mount of the container may reach (an audit checkpoint
    /// key; the default state directory's is always protected). `sluice oci`
    /// passes its own.
    #[arg(long, value_name = "PATH")]
    pub(crate) secret: Vec<PathBuf>,
    /// A secret file of the policy, which no bind mount of the container may
    /// reach either (`sluice oci` passes its policy's; the daemon checks the
    /// annotated policy's itself).
    #[arg(long, value_name = "PATH")]
    pub(crate) policy_secret: Vec<PathBuf>,
}

pub(crate) fn execute(args: OciHookArgs) -> anyhow::Result<i32> {
    let state = OciState::read(std::io::stdin().lock())?;
    let socket = crate::daemon::socket_path(state.socket().or(args.socket.as_deref()));
    let client = crate::daemon::Client::new(socket);
    let mut secrets = Guarded::keys(crate::audit::checkpoint::key_paths(std::path::Path::new(
        crate::bundle::DEFAULT_STATE_DIR,
    )));
    secrets.extend(Guarded::keys(args.secret));
    secrets.extend(Guarded::policy_secrets(args.policy_secret));
    match hook::plan(&state, &secrets)? {
        HookStep::Release { id } => {
            // An id that is no sandbox id was never attached.
            let Ok(id) = id.parse::<crate::sandbox_id::SandboxId>() else {
                return Ok(0);
            };
            match client.detach(&id) {
                Ok(Some(_)) => tracing::info!(container = %id, "sandbox released"),
                Ok(None) => {}
                Err(err) => tracing::info!(%err, "poststop: could not tell the daemon"),
            }
            Ok(0)
        }
        HookStep::Wrapped => Ok(0),
        HookStep::Attach(container) => {
            let request =
                crate::daemon::api::AttachRequest::try_from(&container).with_context(|| {
                    format!(
                        "container {} was not started: the daemon knows sandboxes by id",
                        container.id
                    )
                })?;
            let info = client
                .attach(&request, container.netns.as_fd())
                .with_context(|| format!("container {} was not started", container.id))?;
            tracing::info!(
                container = %info.id,
                policy = %info.policy,
                netns_inode = info.netns_inode,
                "container attached to the sluice daemon"
            );
            if let Some(pem) = &info.ca_bundle {
                // The container's process has not run yet: a failure here
                // aborts its start (the daemon releases the sandbox when the
                // process is gone).
                let rootfs = container.rootfs.as_deref().with_context(|| {
                    format!(
                        "container {} was not started: its runtime config names no root filesystem to put sluice's CA bundle in",
                        container.id
                    )
                })?;
                ca_mount::bind_over(container.pid, rootfs, SYSTEM_BUNDLE, pem)
                    .with_context(|| format!("container {} was not started", container.id))?;
                tracing::info!(container = %info.id, path = SYSTEM_BUNDLE, "sandbox CA bundle mounted in the container");
            }
            Ok(0)
        }
    }
}
