//! The blocking part of an attach: adopt the namespace sent, tie it to the
//! container's (or VMM's) process, plumb it or take over its tap, and
//! enforce it. Owns the checks that refuse a namespace with a way out or
//! one another sluice serves; it never touches the registry's table.

use std::os::fd::OwnedFd;

use crate::attach::vm::VmNet;
use crate::daemon::adopt;
use crate::daemon::api::{ApiError, AttachRequest};
use crate::netns::{is_sandbox_link_kind, LinkAddress, SandboxNetns, SANDBOX_LINK};

/// Refuse `req` if one of its container's bind sources reaches one of
/// `guarded`.
pub(super) fn refuse_binds(
    req: &AttachRequest,
    guarded: &[crate::attach::oci_check::Guarded],
) -> Result<(), ApiError> {
    let binds: Vec<(std::path::PathBuf, String)> = req
        .binds
        .iter()
        .map(|source| (source.clone(), String::new()))
        .collect();
    let reasons = crate::attach::oci_check::secret_binds(&binds, guarded);
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(ApiError::bad(format!(
            "container {} refused: {}",
            req.id,
            reasons.join("; ")
        )))
    }
}

/// A VM attach's addressing, checked as `sluice vm` checks it.
pub(super) fn vm_net(vm: &crate::daemon::api::VmAttach) -> Result<VmNet, ApiError> {
    vm.net()
        .map_err(|e| ApiError::bad(format!("bad VM addressing: {e}")))
}

/// The sandbox, the process that ends it, and the addresses a VM attach added.
pub(super) type Enforced = (crate::attach::Sandbox, Option<Pidfd>, Vec<LinkAddress>);

/// Blocking part of an attach: adopt the namespace, tie it to the
/// container's (or VMM's) process, give it its plumbing (a VM: take over
/// its tap), enforce it, with `listeners` proxy listeners per address.
pub(super) fn enforce(
    fd: OwnedFd,
    pid: Option<i32>,
    vm: Option<&VmNet>,
    listeners: usize,
) -> Result<Enforced, ApiError> {
    let netns = SandboxNetns::from_owned_fd(fd).map_err(|e| ApiError::bad(e.to_string()))?;
    let process = match pid {
        Some(pid) => Some(Pidfd::for_process_in(pid, &netns)?),
        None => None,
    };
    if let Some(net) = vm {
        // Someone else's namespace: only the tap is touched.
        let added = netns
            .adopt_tap(&net.tap, &net.gateway_addresses())
            .map_err(|e| ApiError::bad(format!("cannot take over tap {}: {e}", net.tap)))?;
        let kept = netns
            .clone_handle()
            .map_err(|e| ApiError::internal(e.to_string()))?;
        return match crate::attach::prepare(netns, &net.attachment(false).served_by(listeners)) {
            Ok(sandbox) => Ok((sandbox, process, added)),
            Err(e) => {
                let _ = kept.remove_tap_addresses(&net.tap, &added);
                Err(ApiError::internal(format!("cannot fence the tap: {e}")))
            }
        };
    }
    let attachment = crate::attach::oci::attachment().served_by(listeners);
    let links = netns
        .links()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    // Plumbed already (a second attach of the same namespace) only if the
    // one link is sluice's by name and by kind: a link of another kind
    // named sbx0 (a veth whose peer is elsewhere) is a way out.
    let ours = || -> Result<bool, ApiError> {
        Ok(links == [SANDBOX_LINK]
            && is_sandbox_link_kind(
                netns
                    .link_kind(SANDBOX_LINK)
                    .map_err(|e| ApiError::internal(e.to_string()))?
                    .as_deref(),
            ))
    };
    if links.is_empty() {
        netns
            .plumb()
            .map_err(|e| ApiError::internal(e.to_string()))?;
    } else if !ours()? {
        return Err(ApiError::bad(format!(
            "the container's network namespace has a link out ({}): run the container with --network none, so that sluice is its only way out",
            links.join(", ")
        )));
    } else if let Some(addr) = listened_on(&netns, &attachment)? {
        // Plumbed by a sluice that still serves it (a `sluice oci`, another
        // daemon): this daemon's registry cannot know of it, the kernel can.
        return Err(ApiError::conflict(already_served(&format!(
            "by another sluice (something listens on {addr} there)"
        ))));
    }
    let sandbox = crate::attach::prepare(netns, &attachment)
        .map_err(|e| ApiError::internal(format!("cannot enforce the sandbox: {e}")))?;
    Ok((sandbox, process, Vec::new()))
}

/// Which of `attachment`'s proxy addresses something listens on already in
/// `netns`, if any: a namespace sluice plumbed is attached again only once
/// the sluice that served it is gone (a restarted daemon adopting it).
pub(super) fn listened_on(
    netns: &SandboxNetns,
    attachment: &crate::attach::Attachment,
) -> Result<Option<std::net::SocketAddr>, ApiError> {
    let binds = attachment.proxy_binds.clone();
    netns
        .run_in(move || {
            // Without SO_REUSEPORT, so that a listener that has it (and
            // SO_REUSEADDR, as every one has) still makes this bind fail.
            binds.into_iter().find(|addr| {
                matches!(std::net::TcpListener::bind(addr),
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse)
            })
        })
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// Why a namespace served already is refused, and what to do instead.
pub(super) fn already_served(by_whom: &str) -> String {
    format!(
        "the container's network namespace is already served by sluice {by_whom}: containers that share one network namespace (podman --pod, --network container:ID or ns:PATH) share one sandbox and one policy, so give the sluice annotation to one of them only"
    )
}

/// A pidfd: readable once the process has exited; immune to pid reuse.
pub(super) struct Pidfd(pub(super) OwnedFd);

impl Pidfd {
    /// Open `pid` and check that it lives in `netns` (so its exit means the
    /// container's end, not some unrelated process's).
    pub(super) fn for_process_in(pid: i32, netns: &SandboxNetns) -> Result<Pidfd, ApiError> {
        let pidfd = Pidfd(
            adopt::pidfd_open(pid)
                .map_err(|e| ApiError::bad(format!("process {pid} is not running: {e}")))?,
        );
        let path = format!("/proc/{pid}/ns/net");
        let inode = std::fs::metadata(&path).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        // Checked after opening the pidfd: if the process is still alive now,
        // /proc/PID above was that same process.
        if pidfd.exited() {
            return Err(ApiError::bad(format!(
                "process {pid} exited during the attach"
            )));
        }
        match inode {
            Ok(inode) if inode == netns.inode() => Ok(pidfd),
            Ok(inode) => Err(ApiError::bad(format!(
                "process {pid} is in namespace net:[{inode}], not in the one sent (net:[{}])",
                netns.inode()
            ))),
            Err(err) => Err(ApiError::bad(format!("cannot read {path}: {err}"))),
        }
    }

    pub(super) fn exited(&self) -> bool {
        adopt::exited(&self.0)
    }
}
