//! `sluice run`: a host command in a fresh, anonymous sandbox namespace,
//! confined by `crate::confine` (its own PID and mount namespaces, a
//! seccomp filter, fewer capabilities).
//!
//! The namespace is anonymous, so the kernel frees it (with its table) when
//! the last process in it and sluice's own references are gone: nothing is
//! left behind even if sluice is killed with SIGKILL.

use nix::unistd::{Uid, User};

pub(crate) use crate::confine::RunAs;
use crate::confine::{PreparedInit, Workload};

use super::{AttachError, Attachment, Sandbox};
use crate::workload::WorkloadPath;

/// A host command's attachment: a namespace of its own, path `host`.
pub(crate) fn attachment() -> Attachment {
    Attachment::dedicated_namespace(WorkloadPath::Host)
}

/// Resolve `--user` (a name or a numeric uid).
pub(crate) fn resolve_user(user: &str) -> Result<RunAs, AttachError> {
    let found = match user.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)).ok().flatten(),
        Err(_) => User::from_name(user).ok().flatten(),
    };
    let found = found.ok_or_else(|| AttachError::UnknownUser(user.to_string()))?;
    Ok(RunAs {
        uid: found.uid.as_raw(),
        gid: found.gid.as_raw(),
    })
}

/// Start the workload `init` was told of ([`PreparedInit::plan`]) inside
/// the sandbox namespace, confined (`crate::confine`): its own PID and
/// mount namespaces, where the planned files are read-only or absent, the
/// seccomp filter, the reduced capabilities, and the planned user.
///
/// The init was forked by the thread that lives as long as sluice (the main
/// thread): it gets SIGKILL when that thread dies, so a killed sluice takes
/// its workload with it.
pub(crate) async fn spawn(init: PreparedInit, sandbox: &Sandbox) -> Result<Workload, AttachError> {
    let netns = sandbox
        .netns
        .entry()
        .map_err(|e| AttachError::Confine(crate::confine::ConfineError::Init(e)))?;
    crate::confine::start(init, Some(netns))
        .await
        .map_err(|err| match err {
            crate::confine::ConfineError::Exec { program, source } => {
                AttachError::Spawn { program, source }
            }
            err => AttachError::Confine(err),
        })
}
