//! The daemon's sandbox CA, put over the distribution's CA bundle inside a
//! container that is being created: what the OCI hook does once the daemon
//! enforces the container and its policy terminates TLS.
//!
//! At the createRuntime stage runc has set up the container's mounts but
//! not yet switched to its root (pivot_root), so the container's rootfs is
//! reachable at its host path inside the container's mount namespace. The
//! bundle is written to a private file, cloned as a detached mount
//! (open_tree), the mount moved onto
//! `<rootfs>/etc/ssl/certs/ca-certificates.crt` from a thread that entered
//! the container's mount namespace, and the file unlinked (the mount keeps
//! it; the kernel refuses to attach a mount of an unlinked file, so not
//! before). Every path inside the
//! rootfs is resolved with RESOLVE_IN_ROOT, so a symlink in the image (an
//! absolute `/etc/ssl/certs -> /etc/pki/...` or a `../../..`) is followed as
//! the container would follow it, and never leads out of its rootfs.
//!
//! This module never changes the host's own mounts (the mount goes into the
//! container's namespace only) and never writes outside the rootfs but the
//! one private file it removes again.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
use rustix::mount::{MoveMountFlags, OpenTreeFlags};

/// Where the private file is written before it is cloned (root-owned; the
/// wrapper's work directories live there too).
const PRIVATE_PARENT: &str = "/run/sluice";

/// Why the CA could not be put into the container.
#[derive(Debug, thiserror::Error)]
#[error("cannot put sluice's CA bundle at {target} in the container (rootfs {}): {step}: {cause}; the container is not started (a read-only rootfs without {target} cannot take it: run it without --read-only, or give the image that file)", rootfs.display())]
pub(crate) struct CaMountError {
    pub(crate) rootfs: PathBuf,
    pub(crate) target: String,
    pub(crate) step: &'static str,
    pub(crate) cause: std::io::Error,
}

/// Bind `pem` read-only over `target` (an absolute path in the container,
/// e.g. `/etc/ssl/certs/ca-certificates.crt`) inside the container whose
/// process is `pid` and whose rootfs on the host is `rootfs`, creating the
/// file (and its directories) in the rootfs if the image lacks it.
pub(crate) fn bind_over(
    pid: i32,
    rootfs: &Path,
    target: &str,
    pem: &str,
) -> Result<(), CaMountError> {
    let fail = |step: &'static str| {
        move |cause: std::io::Error| CaMountError {
            rootfs: rootfs.to_path_buf(),
            target: target.to_string(),
            step,
            cause,
        }
    };
    let (mount, _file) = detached_copy(pem).map_err(fail("writing it to a private file"))?;
    let mnt_ns = File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(fail("opening the container's mount namespace"))?;
    let inside = target.trim_start_matches('/').to_string();
    let rootfs_owned = rootfs.to_path_buf();
    // A thread of its own: setns(CLONE_NEWNS) needs a filesystem context
    // no other thread shares (unshare(CLONE_FS)), and the thread is never
    // used again once it has been in the container's namespace.
    let joined = std::thread::spawn(move || -> Result<(), (&'static str, std::io::Error)> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)
            .map_err(|e| ("leaving the shared filesystem context", e.into()))?;
        nix::sched::setns(mnt_ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(|e| ("entering the container's mount namespace", e.into()))?;
        mount_in_root(&rootfs_owned, &inside, &mount)
    })
    .join();
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err((step, cause))) => Err(fail(step)(cause)),
        Err(_) => Err(fail("the mounting thread")(std::io::Error::other(
            "it panicked",
        ))),
    }
}

/// A private file, unlinked when dropped.
struct Unlinked(PathBuf);

impl Drop for Unlinked {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `pem` in a fresh private file, cloned as a detached mount; the file goes
/// when the guard is dropped.
fn detached_copy(pem: &str) -> std::io::Result<(OwnedFd, Unlinked)> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(PRIVATE_PARENT)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let path =
        Path::new(PRIVATE_PARENT).join(format!("hook-ca-{}.{nanos}.pem", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)?;
    let guard = Unlinked(path);
    file.write_all(pem.as_bytes())?;
    let mount = rustix::mount::open_tree(
        CWD,
        &guard.0,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )?;
    Ok((mount, guard))
}

/// In the container's mount namespace: find or make `inside` under
/// `rootfs` (resolved in the root), move `mount` onto it, make it read-only (and nosuid, nodev, noexec).
fn mount_in_root(
    rootfs: &Path,
    inside: &str,
    mount: &OwnedFd,
) -> Result<(), (&'static str, std::io::Error)> {
    let root = rustix::fs::open(
        rootfs,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ("opening the container's rootfs", e.into()))?;
    let in_root = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
    if let Some((dir, _)) = inside.rsplit_once('/') {
        make_dirs(&root, dir, in_root).map_err(|e| ("creating its directory in the rootfs", e))?;
    }
    // The file itself: created empty if missing, never truncated.
    let target = rustix::fs::openat2(
        &root,
        inside,
        OFlags::RDONLY | OFlags::CREATE | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
        in_root,
    )
    .map_err(|e| ("creating it in the rootfs", e.into()))?;
    if !rustix::fs::fstat(&target)
        .map(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
        })
        .unwrap_or(false)
    {
        return Err((
            "checking it is a file",
            std::io::Error::other("it is not a regular file"),
        ));
    }
    rustix::mount::move_mount(
        mount,
        "",
        &target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(|e| ("mounting it", e.into()))?;
    // The path now leads to the new mount: make that one read-only.
    let mounted = rustix::fs::openat2(
        &root,
        inside,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        in_root,
    )
    .map_err(|e| ("opening the mount", e.into()))?;
    let fd_path = format!("/proc/thread-self/fd/{}", {
        use std::os::fd::AsRawFd;
        mounted.as_raw_fd()
    });
    nix::mount::mount(
        None::<&str>,
        fd_path.as_str(),
        None::<&str>,
        {
            use nix::mount::MsFlags;
            MsFlags::MS_REMOUNT
                | MsFlags::MS_BIND
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV
                | MsFlags::MS_NOEXEC
        },
        None::<&str>,
    )
    .map_err(|e| ("making it read-only", e.into()))
}

/// `mkdir -p dir` under `root`, each step resolved in the root.
fn make_dirs(root: &OwnedFd, dir: &str, in_root: ResolveFlags) -> std::io::Result<()> {
    let mut prefix = String::new();
    for part in dir.split('/').filter(|p| !p.is_empty()) {
        let parent = if prefix.is_empty() {
            ".".to_string()
        } else {
            prefix.clone()
        };
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(part);
        let open = |path: &str| {
            rustix::fs::openat2(
                root,
                path,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                in_root,
            )
        };
        match open(&prefix) {
            Ok(_) => continue,
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let parent = open(&parent)?;
        match rustix::fs::mkdirat(&parent, part, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a private mount namespace of a thread of its own (the host's
    /// mounts never see it): the bundle, mounted under `rootfs`; returns
    /// what the mounted file, expected at `rootfs/<lands>/ssl/certs/...`,
    /// reads and whether writing to it failed.
    fn mount_privately(rootfs: &Path, lands: &str) -> (String, bool) {
        let rootfs = rootfs.to_path_buf();
        let lands = lands.to_string();
        std::thread::spawn(move || {
            use nix::mount::MsFlags;
            use nix::sched::CloneFlags;
            nix::sched::unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS).unwrap();
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .unwrap();
            let (mount, _file) = detached_copy("PEM\n").unwrap();
            mount_in_root(&rootfs, "etc/ssl/certs/ca-certificates.crt", &mount)
                .map_err(|(step, e)| format!("{step}: {e}"))
                .unwrap();
            let target = rootfs.join(lands).join("ssl/certs/ca-certificates.crt");
            let read = std::fs::read_to_string(&target).unwrap();
            let refused = std::fs::OpenOptions::new()
                .append(true)
                .open(&target)
                .is_err();
            (read, refused)
        })
        .join()
        .unwrap()
    }

    #[test]
    fn a_symlink_in_the_image_is_followed_inside_the_rootfs_never_out_of_it() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root (mount namespaces)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(rootfs.join("outside")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        // `etc` climbs above the root: on the host it leads to `outside`
        // next to the rootfs, in the root (`..` of `/` is `/`) to its own.
        std::os::unix::fs::symlink("../outside", rootfs.join("etc")).unwrap();
        let (read, refused) = mount_privately(&rootfs, "outside");
        assert_eq!(read, "PEM\n");
        assert!(refused, "the mounted bundle is writable");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        // Outside the private namespace the file made is empty: the mount
        // was only there.
        let made = rootfs.join("outside/ssl/certs/ca-certificates.crt");
        assert_eq!(std::fs::read_to_string(made).unwrap(), "");
    }

    #[test]
    fn an_absolute_symlink_in_the_image_is_taken_as_the_containers_own_path() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root (mount namespaces)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("inside")).unwrap();
        // A host directory of the same name exists: it must not be used.
        let host_inside = Path::new("/inside");
        assert!(!host_inside.exists(), "the test needs /inside not to exist");
        std::os::unix::fs::symlink("/inside", rootfs.join("etc")).unwrap();
        let (read, _) = mount_privately(&rootfs, "inside");
        assert_eq!(read, "PEM\n");
        assert!(!host_inside.exists());
    }
}
