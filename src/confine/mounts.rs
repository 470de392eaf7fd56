//! The workload's mount namespace: what it sees of the filesystem. This
//! module owns making sluice's own files read-only or absent for the
//! workload, showing it files sluice wrote in place of its own (a CA
//! bundle), giving it a /proc of its own PID namespace, and making the
//! kernel's knobs (/proc/sys, /proc/sysrq-trigger, /sys) read-only, as
//! container runtimes do. It runs in the init, in a fresh mount namespace
//! whose propagation is made slave first, so nothing it mounts reaches the
//! host; it must never mount anything in sluice's own namespace.
//!
//! Why ancestors are bound onto themselves: a read-only bind protects a
//! path's inode, but a root workload could still rename a directory above
//! it and put a file of its own at the old path, which sluice opens again
//! on a reload or a log rotation. The kernel refuses to rename or remove a
//! mount point (EBUSY), so every ancestor of a protected path (below the
//! mount that holds it) becomes one.
//!
//! Read-only is set with mount_setattr(2) (Linux 5.12), recursively: one
//! call makes a whole subtree read-only (/sys and every mount under it,
//! cgroup hierarchies included) and leaves each mount's other flags as
//! they are, where a read-only bind remount had to be made once per mount,
//! with the flags it kept read first. A kernel without it is an error,
//! never a less confined workload.
//!
//! Why a hidden file is /dev/null on a nodev mount: open(2) refuses a
//! device node on a nodev mount (EACCES) whatever the caller's
//! capabilities, so a root workload cannot open a hidden secret at all,
//! where an empty file would read as one. runc's masked /proc entries stay
//! readable and empty, as programs expect.

#![deny(unsafe_code)]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// What the workload must not change, by sluice's paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FilePlan {
    /// Read-only for the workload: files, or directories with all they hold.
    pub(crate) read_only: Vec<PathBuf>,
    /// (source, target): the workload sees the source's content at the
    /// target, read-only (a file, or a directory, bound over the target).
    /// A target gone by the time the init sets up is left as it is.
    pub(crate) replaced: Vec<(PathBuf, PathBuf)>,
    /// Hidden from the workload: a file or socket it cannot open or
    /// connect to, a directory it sees empty.
    pub(crate) hidden: Vec<PathBuf>,
}

/// Errors from setting up the workload's mounts.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} {}: {cause}", path.display())]
pub(crate) struct MountError {
    what: &'static str,
    path: PathBuf,
    cause: String,
}

fn failed<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> MountError + 'a {
    move |e| MountError {
        what,
        path: path.to_path_buf(),
        cause: e.to_string(),
    }
}

/// /proc entries made read-only (runc's `readonlyPaths`): the kernel's
/// tunables, the magic SysRq key, interrupt routing, buses, filesystems.
const READ_ONLY_PROC: [&str; 5] = [
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
];

/// /proc entries hidden (runc's `maskedPaths`): kernel memory, keys and
/// timers of the whole host.
const MASKED_PROC: [&str; 9] = [
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/acpi",
    "/proc/scsi",
    "/sys/firmware",
];

/// Enter a fresh mount namespace and set it up for the workload. Must run
/// in a single-threaded process (the init) that is already in the
/// workload's PID namespace, whose /proc it mounts.
pub(crate) fn confine(plan: &FilePlan) -> Result<(), MountError> {
    let cwd = std::env::current_dir().map_err(|e| MountError {
        what: "read the working directory",
        path: PathBuf::from("."),
        cause: e.to_string(),
    })?;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(failed(
        "enter a new mount namespace for",
        Path::new("the workload"),
    ))?;
    // Slave: mounts made here never propagate back to the host, while the
    // host's later mounts still appear here.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(failed("make mount propagation slave on", Path::new("/")))?;

    // The one read of the mount table: which ancestors are mount points
    // already, and where the host's procfs mounts are.
    let mut points = MountTable::read()?;
    for path in &plan.read_only {
        let path = canonical(path)?;
        pin_ancestors(&path, &mut points)?;
        bind_read_only(&path)?;
        points.add(&path);
    }
    for (source, target) in &plan.replaced {
        // Gone since sluice planned: there is nothing to show in its place.
        let Ok(target) = std::fs::canonicalize(target) else {
            continue;
        };
        replace(&canonical(source)?, &target)?;
        points.add(&target);
    }
    // After the replacements: a path both hidden and replaced is hidden.
    for path in &plan.hidden {
        if let Ok(path) = std::fs::canonicalize(path) {
            pin_ancestors(&path, &mut points)?;
            hide(&path)?;
        }
    }
    own_proc(&points)?;
    for path in READ_ONLY_PROC.iter().map(Path::new).filter(|p| p.exists()) {
        bind_read_only(path)?;
    }
    for path in MASKED_PROC.iter().map(Path::new).filter(|p| p.exists()) {
        mask(path)?;
    }
    read_only_tree(Path::new("/sys"))?;
    // The working directory still names the mounts it was opened through,
    // under the binds just made: enter it again by path, or relative paths
    // would reach around them.
    std::env::set_current_dir(&cwd).map_err(|e| MountError {
        what: "enter the working directory again in the workload's view",
        path: cwd.clone(),
        cause: e.to_string(),
    })
}

fn canonical(path: &Path) -> Result<PathBuf, MountError> {
    std::fs::canonicalize(path).map_err(|e| MountError {
        what: "find",
        path: path.to_path_buf(),
        cause: e.to_string(),
    })
}

/// Make every ancestor of `path` below its mount a mount point of its own
/// (a recursive bind onto itself, writable as before), so that the
/// workload can neither rename nor remove it.
fn pin_ancestors(path: &Path, points: &mut MountTable) -> Result<(), MountError> {
    let mut ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
    ancestors.reverse();
    for dir in ancestors {
        if points.is_mount_point(dir) {
            continue;
        }
        bind(dir, dir, MsFlags::MS_REC).map_err(failed("pin", dir))?;
        points.add(dir);
    }
    Ok(())
}

/// A recursive bind of `path` onto itself, then read-only (every mount in
/// it), keeping the flags it had (nosuid, nodev, noexec, atime).
fn bind_read_only(path: &Path) -> Result<(), MountError> {
    bind(path, path, MsFlags::MS_REC).map_err(failed("bind", path))?;
    read_only_tree(path)
}

/// Make the mount at `top` and every mount under it read-only, in one
/// call; their other flags stay as they are.
fn read_only_tree(top: &Path) -> Result<(), MountError> {
    setattr::read_only_recursive(top).map_err(|e| MountError {
        what: "make read-only",
        path: top.to_path_buf(),
        cause: match e.raw_os_error() {
            Some(libc::ENOSYS) => {
                "this kernel has no mount_setattr(2) (Linux 5.12 or later is needed)".to_string()
            }
            _ => e.to_string(),
        },
    })
}

/// mount_setattr(2), which neither nix nor rustix wraps (rustix lists it as
/// not implemented).
#[allow(unsafe_code)]
mod setattr {
    use std::ffi::CString;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    /// Set MOUNT_ATTR_RDONLY on the mount at `path` (its root) and every
    /// mount below it, clearing nothing.
    pub(super) fn read_only_recursive(path: &Path) -> io::Result<()> {
        let path = CString::new(path.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let attr = libc::mount_attr {
            attr_set: libc::MOUNT_ATTR_RDONLY,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        // SAFETY: `path` is a NUL-terminated string and `attr` a
        // mount_attr, both alive for the call, which only reads them; the
        // size passed is that of the struct pointed to.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                path.as_ptr(),
                libc::AT_RECURSIVE as libc::c_uint,
                &attr as *const libc::mount_attr,
                std::mem::size_of::<libc::mount_attr>(),
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Show `source` at `target`, read-only. The target's ancestors are not
/// pinned: what the workload could do by renaming them is change what it
/// sees itself, never what sluice reads (the source is read-only, see
/// `SluiceFiles::plan`), and a pinned /etc would make renames across it
/// fail (EXDEV) for programs that expect them to work.
fn replace(source: &Path, target: &Path) -> Result<(), MountError> {
    bind(source, target, MsFlags::empty()).map_err(failed("replace", target))?;
    read_only_tree(target)
}

/// Hide `path` from the workload, root included: a directory behind an
/// empty read-only tmpfs, anything else (a file, a socket) behind
/// /dev/null on a read-only nodev mount, which open(2) refuses (EACCES)
/// and connect(2) finds no socket at (ECONNREFUSED).
fn hide(path: &Path) -> Result<(), MountError> {
    if path.is_dir() {
        return mask(path);
    }
    null_over(path, MsFlags::MS_NODEV).map_err(failed("hide", path))
}

/// Cover `path` so that it reads empty (runc's `maskedPaths`): a file with
/// /dev/null, a directory with an empty read-only tmpfs.
fn mask(path: &Path) -> Result<(), MountError> {
    if path.is_dir() {
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=0,mode=0555"),
        )
        .map_err(failed("hide", path))
    } else {
        null_over(path, MsFlags::empty()).map_err(failed("mask", path))
    }
}

/// Bind /dev/null over `path`, then make that mount read-only, nosuid,
/// noexec and `extra`.
fn null_over(path: &Path, extra: MsFlags) -> nix::Result<()> {
    bind(Path::new("/dev/null"), path, MsFlags::empty())?;
    mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NOEXEC
            | extra,
        None::<&str>,
    )
}

/// Detach every procfs (they show the host's processes, sluice's among
/// them) and mount one of the workload's own PID namespace on /proc.
fn own_proc(points: &MountTable) -> Result<(), MountError> {
    // Deepest first, so that no detach finds its mount point gone.
    for point in points.of_type("proc").iter().rev() {
        umount2(point, MntFlags::MNT_DETACH)
            .map_err(failed("detach the host's procfs at", point))?;
    }
    mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(failed("mount the workload's own", Path::new("/proc")))
}

fn bind(from: &Path, to: &Path, extra: MsFlags) -> nix::Result<()> {
    mount(
        Some(from),
        to,
        None::<&str>,
        MsFlags::MS_BIND | extra,
        None::<&str>,
    )
}

/// The mount points of this mount namespace, from /proc/self/mountinfo,
/// plus those added since it was read. Hand-parsed: two fields of a
/// line-oriented kernel file, where a crate (procfs) would bring far more
/// than it is needed for.
#[derive(Debug, Default)]
struct MountTable {
    /// (mount point, filesystem type), in mount order.
    mounts: Vec<(PathBuf, String)>,
    points: BTreeSet<PathBuf>,
}

impl MountTable {
    fn read() -> Result<MountTable, MountError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = std::fs::read(path).map_err(|e| MountError {
            what: "read",
            path: path.to_path_buf(),
            cause: e.to_string(),
        })?;
        Ok(MountTable::parse(&text))
    }

    fn parse(text: &[u8]) -> MountTable {
        let mut table = MountTable::default();
        for line in text.split(|&b| b == b'\n') {
            let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            // id parent major:minor root MOUNTPOINT options [optional...] - TYPE source super
            let Some(dash) = fields.iter().position(|f| *f == b"-") else {
                continue;
            };
            let (Some(point), Some(fstype)) = (fields.get(4), fields.get(dash + 1)) else {
                continue;
            };
            let point = PathBuf::from(OsString::from_vec(unescape(point)));
            table.points.insert(point.clone());
            table
                .mounts
                .push((point, String::from_utf8_lossy(fstype).into_owned()));
        }
        table
    }

    fn is_mount_point(&self, path: &Path) -> bool {
        self.points.contains(path)
    }

    fn add(&mut self, path: &Path) {
        self.points.insert(path.to_path_buf());
    }

    fn of_type(&self, fstype: &str) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = self
            .mounts
            .iter()
            .filter(|(_, t)| t == fstype)
            .map(|(p, _)| p.clone())
            .collect();
        found.sort_by_key(|p| p.as_os_str().as_bytes().len());
        found.dedup();
        found
    }
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (field[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

impl crate::exit_class::Classified for MountError {
    /// The workload's mount namespace could not be set up.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::CannotEnforce
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &[u8] =
        b"22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw\n\
23 1 0:22 / /sys rw,nosuid shared:6 - sysfs sysfs rw\n\
30 23 0:26 / /sys/fs/cgroup ro shared:9 - tmpfs tmpfs ro\n\
40 1 8:1 / /srv/with\\040space rw - ext4 /dev/sda1 rw\n\
41 40 0:50 / /srv/with\\040space/proc rw - proc proc rw\n\
1 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw\n";

    #[test]
    fn mountinfo_gives_mount_points_and_types() {
        let t = MountTable::parse(MOUNTINFO);
        assert!(t.is_mount_point(Path::new("/srv/with space")));
        assert!(!t.is_mount_point(Path::new("/srv")));
        assert_eq!(
            t.of_type("proc"),
            vec![
                PathBuf::from("/proc"),
                PathBuf::from("/srv/with space/proc")
            ]
        );
        assert!(t.is_mount_point(Path::new("/sys/fs/cgroup")));
    }

    #[test]
    fn unescape_reads_octal_escapes_and_leaves_the_rest() {
        assert_eq!(unescape(b"a\\040b\\134c"), b"a b\\c");
        assert_eq!(unescape(b"\\04"), b"\\04");
    }
}
