//! The control API's wire format, shared by the daemon and its clients
//! (`sluice oci-hook`, `sluice status`).
//!
//! Transport: a Unix stream socket (mode 0600, root only). The client's
//! first byte on a connection says whether a descriptor rides along: it is
//! sent with sendmsg(2) and, for an attach, carries the container's network
//! namespace as SCM_RIGHTS ancillary data, so the daemon acts on the very
//! namespace the hook opened and no path can be swapped in between. After
//! that one byte the connection speaks plain HTTP/1.1:
//!
//! ```text
//! POST   /v1/sandboxes        AttachRequest (JSON) -> 201 SandboxInfo   (first byte 'F' + fd;
//!                             with `ca_bundle` when the policy terminates TLS;
//!                             with `vm`: fence that tap in the namespace sent)
//! GET    /v1/sandboxes        -> 200 [SandboxInfo]                       (first byte 'N')
//! DELETE /v1/sandboxes/{id}   -> 200 SandboxInfo | 404                   (first byte 'N';
//!                             a VM's fence stays; `?fence=remove`: its tap's two tables go too)
//! GET    /v1/audit            -> 200 AuditHead                           (first byte 'N')
//! ```
//!
//! Errors are `{"error": "..."}` with a 4xx (the request or its policy is
//! wrong) or 5xx (the namespace could not be enforced) status.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::sandbox_id::SandboxId;

/// Where the daemon listens unless told otherwise.
pub(crate) const DEFAULT_SOCKET: &str = "/run/sluice/daemon.sock";
/// Environment variable naming the socket (hook and `sluice status`).
pub(crate) const SOCKET_ENV: &str = "SLUICE_DAEMON_SOCKET";

/// First byte of a connection whose sendmsg carries a descriptor.
pub(crate) const WITH_FD: u8 = b'F';
/// First byte of a connection without one.
pub(crate) const WITHOUT_FD: u8 = b'N';

/// The collection of attached sandboxes.
pub(crate) const SANDBOXES: &str = "/v1/sandboxes";

/// The head of the daemon's audit log (`crate::audit::AuditHead`): its
/// file, checkpoint key id, newest line and newest checkpoint (seq, hash).
pub(crate) const AUDIT: &str = "/v1/audit";

/// The query of a DELETE that removes a VM's fence too.
pub(crate) const FENCE_REMOVE: &str = "fence=remove";

/// What a `DELETE /v1/sandboxes/{id}` does with a VM's fence (the two
/// tables `sluice-TAP` in the VMM's namespace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Fence {
    /// Leave it (a plain DELETE, or `?fence=keep`): the guest reaches
    /// nothing until the tap goes or the fence is removed.
    #[default]
    Keep,
    /// Remove it after the release (`?fence=remove`, `sluice vm detach
    /// --daemon`): the tap is then open, as before the attach.
    Remove,
}

impl Fence {
    /// The fence a DELETE's query asks for. Anything but `fence=keep` or
    /// `fence=remove` is refused rather than ignored: a typo must not
    /// silently keep (or remove) a fence.
    pub(crate) fn from_query(query: Option<&str>) -> Result<Fence, String> {
        match query {
            None | Some("") | Some("fence=keep") => Ok(Fence::Keep),
            Some(FENCE_REMOVE) => Ok(Fence::Remove),
            Some(other) => Err(format!(
                "unknown query `{other}`: DELETE {SANDBOXES}/ID takes `?{FENCE_REMOVE}` (also remove a VM's fence) or nothing (release it, the fence stays)"
            )),
        }
    }

    /// The query that asks for this fence (empty for [`Fence::Keep`]).
    pub(crate) fn query(self) -> &'static str {
        match self {
            Fence::Keep => "",
            Fence::Remove => FENCE_REMOVE,
        }
    }
}

/// Attach a namespace (sent alongside) as sandbox `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    /// The container id: the `sandbox` of its audit and timing records
    /// (checked as it is deserialised: [`SandboxId::RULE`]).
    pub id: SandboxId,
    /// The container's process; the sandbox is released when it exits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// A plain policy file on the daemon's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PathBuf>,
    /// A signed bundle (directory, .tar.gz or https:// URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    /// The trust file for `bundle` (default: the daemon's `defaults.trust`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<PathBuf>,
    /// The sources of the container's bind mounts: the daemon refuses one
    /// that reaches its audit checkpoint key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub binds: Vec<PathBuf>,
    /// A microVM's tap in the namespace sent, to fence for one guest
    /// (`sluice vm attach --daemon`); absent for a container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm: Option<VmAttach>,
}

/// The tap and the guest `sluice vm attach --daemon` asks the daemon to
/// fence (each address as text; the daemon checks them as `sluice vm`
/// does, with the same parsers).
pub use crate::attach::vm::VmAddressing as VmAttach;

/// A VM's tap and guest address, as `sluice status` shows them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct VmInfo {
    pub(crate) tap: String,
    /// The guest's IPv4 address with its prefix.
    pub(crate) guest: String,
}

impl TryFrom<&crate::attach::oci::hook::ContainerAttach> for AttachRequest {
    type Error = crate::sandbox_id::BadSandboxId;

    /// What the OCI hook asks for a starting container; refused when the
    /// runtime's container id is no sandbox id.
    fn try_from(
        c: &crate::attach::oci::hook::ContainerAttach,
    ) -> Result<AttachRequest, Self::Error> {
        Ok(AttachRequest {
            id: c.id.parse()?,
            pid: Some(c.pid),
            policy: c.policy.clone(),
            bundle: c.bundle.clone(),
            trust: c.trust.clone(),
            binds: c.binds.clone(),
            vm: None,
        })
    }
}

/// One attached sandbox, as `sluice status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub id: SandboxId,
    /// host | oci | vm
    pub path: String,
    /// The policy in force: its name, or `name@revision` for a bundle.
    pub policy: String,
    pub netns_inode: u64,
    #[serde(default)]
    pub pid: Option<i32>,
    /// When it was attached (Unix seconds).
    pub attached: u64,
    pub(crate) connections: Connections,
    /// The nft drop counters, summed (None when they could not be read).
    #[serde(default)]
    pub dropped_packets: Option<u64>,
    /// A microVM's tap and guest (path `vm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) vm: Option<VmInfo>,
    /// In the answer to an attach whose policy terminates TLS: the system
    /// roots plus the sandbox's CA (PEM), for the hook to put over the
    /// container's /etc/ssl/certs/ca-certificates.crt. Not in listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ca_bundle: Option<String>,
}

/// Connection counts of one sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Connections {
    pub(crate) allowed: u64,
    pub(crate) denied: u64,
    pub(crate) would_deny: u64,
    pub(crate) active: i64,
}

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: String,
}

/// A refused request: the HTTP status and one line saying why.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: hyper::StatusCode,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: hyper::StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
    pub(crate) fn conflict(message: impl Into<String>) -> ApiError {
        ApiError {
            status: hyper::StatusCode::CONFLICT,
            message: message.into(),
        }
    }
    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: hyper::StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delete_without_a_query_keeps_the_fence() {
        assert_eq!(Fence::from_query(None), Ok(Fence::Keep));
        assert_eq!(Fence::from_query(Some("")), Ok(Fence::Keep));
        assert_eq!(Fence::from_query(Some("fence=keep")), Ok(Fence::Keep));
    }

    #[test]
    fn fence_remove_asks_for_the_fence_to_go() {
        assert_eq!(Fence::from_query(Some("fence=remove")), Ok(Fence::Remove));
        assert_eq!(
            Fence::from_query(Some(Fence::Remove.query())),
            Ok(Fence::Remove)
        );
        assert_eq!(
            Fence::from_query(Some(Fence::Keep.query())),
            Ok(Fence::Keep)
        );
    }

    #[test]
    fn an_unknown_query_is_refused_naming_the_one_accepted() {
        for query in ["fence=rm", "fence=remove&x=1", "remove", "fence"] {
            let err = Fence::from_query(Some(query)).unwrap_err();
            assert!(err.contains(query), "{err}");
            assert!(err.contains("?fence=remove"), "{err}");
        }
    }
}
