//! `sluice oci-hook`: the OCI createRuntime (and poststop) hook. The
//! checks are `attach::oci::hook`'s; this sends their result to the daemon.

use std::os::fd::AsFd;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::attach::oci::hook::{self, HookStep, OciState};

pub const AFTER_HELP: &str = "Install containers/hooks.d/sluice.json in podman's hooks dir. The hook runs for \
containers annotated io.sluice.policy=FILE or io.sluice.bundle=PATH (+ io.sluice.trust=FILE), sends \
the container's network namespace to the daemon and exits 0 only once the daemon enforces it; any \
failure exits non-zero, which aborts the container's start. The socket is the annotation \
io.sluice.socket, else --socket, else $SLUICE_DAEMON_SOCKET, else /run/sluice/daemon.sock. At the \
poststop stage it tells the daemon to release the sandbox (a hint; failures are ignored).";

#[derive(Debug, Args)]
pub struct OciHookArgs {
    /// The daemon's control socket.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// A file no bind mount of the container may reach (an audit checkpoint
    /// key; the default state directory's is always protected). `sluice oci`
    /// passes its own.
    #[arg(long, value_name = "PATH")]
    pub secret: Vec<PathBuf>,
}

pub fn execute(args: OciHookArgs) -> anyhow::Result<i32> {
    let state = OciState::read(std::io::stdin().lock())?;
    let socket = crate::daemon::socket_path(state.socket().or(args.socket.as_deref()));
    let client = crate::daemon::Client::new(socket);
    let mut secrets =
        crate::audit::checkpoint::key_paths(std::path::Path::new(crate::bundle::DEFAULT_STATE_DIR));
    secrets.extend(args.secret);
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
            Ok(0)
        }
    }
}
