//! `sluice run`: a host command in a fresh, anonymous sandbox namespace.
//!
//! The namespace is anonymous, so the kernel frees it (with its table) when
//! the last process in it and sluice's own references are gone: nothing is
//! left behind even if sluice is killed with SIGKILL.

use std::ffi::OsString;

use nix::unistd::{Gid, Uid, User};
use tokio::process::{Child, Command};

use super::{AttachError, Attachment, Sandbox};
use crate::workload::WorkloadPath;

/// A host command's attachment: a namespace of its own, path `host`.
pub fn attachment() -> Attachment {
    Attachment::dedicated_namespace(WorkloadPath::Host)
}

/// Who the workload runs as.
#[derive(Debug, Clone, Copy)]
pub struct RunAs {
    pub uid: Uid,
    pub gid: Gid,
}

/// Resolve `--user` (a name or a numeric uid).
pub fn resolve_user(user: &str) -> Result<RunAs, AttachError> {
    let found = match user.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)).ok().flatten(),
        Err(_) => User::from_name(user).ok().flatten(),
    };
    let found = found.ok_or_else(|| AttachError::UnknownUser(user.to_string()))?;
    Ok(RunAs {
        uid: found.uid,
        gid: found.gid,
    })
}

/// Start `argv` inside the sandbox namespace.
///
/// Must be called from a thread that lives as long as sluice (the runtime's
/// main thread): the child gets SIGKILL when the thread that forked it dies,
/// so a killed sluice takes its workload with it.
pub fn spawn(
    sandbox: &Sandbox,
    argv: &[OsString],
    user: Option<RunAs>,
) -> Result<Child, AttachError> {
    let program = argv[0].to_string_lossy().into_owned();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    let mut enter = sandbox.netns.enter_fn();
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe calls (setns, prctl, setrlimit, setgroups, setgid,
    // setuid, getppid). The order matters: setns and dropping capabilities need
    // root, so they come before the drop to `--user`, and the kernel clears
    // the parent-death signal on a credential change, so that prctl comes
    // last.
    unsafe {
        cmd.pre_exec(move || {
            enter()?;
            crate::confine::caps::drop_escape_capabilities()?;
            crate::confine::fds::restore_for_workload()?;
            if let Some(user) = user {
                nix::unistd::setgroups(&[user.gid])?;
                nix::unistd::setgid(user.gid)?;
                nix::unistd::setuid(user.uid)?;
            }
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            // sluice died between fork and prctl: do not run unconfined-looking.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("sluice exited during spawn"));
            }
            Ok(())
        });
    }
    cmd.kill_on_drop(true);
    cmd.spawn()
        .map_err(|source| AttachError::Spawn { program, source })
}
