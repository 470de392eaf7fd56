//! netns: the sandbox network namespace.
//!
//! This module owns creating, opening and entering the network namespace a
//! workload runs in: an ANONYMOUS namespace (never `ip netns add`, so no
//! bind mount under /run/netns can outlive sluice) held only by an fd, with
//! `lo` and one veth pair `sbx0`/`sbx1` whose both ends stay inside, and
//! default routes (v4 and v6) via `sbx0` so that connect() reaches netfilter
//! instead of failing with ENETUNREACH. The kernel frees the namespace with
//! its last reference (this fd, a process inside, or a socket created in it),
//! so nothing is left even if sluice is SIGKILLed.
//!
//! Linux network namespaces are per thread: every operation that must happen
//! "inside" runs on a dedicated, short-lived std::thread that unshare()s or
//! setns()es, so the rest of the process (tokio workers included) never
//! changes namespace. This module must never touch the namespace sluice
//! itself runs in: no links, routes or rules are ever created outside the
//! sandbox namespace. Firewall rules are not this module's job (see
//! `enforce`).

use std::fs::File;
use std::io::{self, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::errno::Errno;
use nix::sched::{setns, unshare, CloneFlags};

/// IPv4 address of the in-namespace veth end `sbx0` (a /30 from the
/// benchmark range, so nothing it could reach exists outside this machine).
pub const SANDBOX_V4: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 2);
/// Prefix length of [`SANDBOX_V4`].
pub const SANDBOX_V4_PREFIX: u8 = 30;
/// IPv6 address of `sbx0` (documentation range, added with `nodad`).
pub const SANDBOX_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0x0db8, 0x5c, 0xffff, 0, 0, 0, 2);
/// Prefix length of [`SANDBOX_V6`].
pub const SANDBOX_V6_PREFIX: u8 = 64;
/// Name of the veth end that carries the addresses and default routes.
pub const SANDBOX_LINK: &str = "sbx0";
/// Name of its peer (also inside the namespace).
pub const SANDBOX_PEER: &str = "sbx1";

/// Errors from creating or entering a sandbox namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("creating a network namespace needs root (CAP_SYS_ADMIN): run sluice as root")]
    CreatePermission,
    #[error("entering network namespace {what} needs root (CAP_SYS_ADMIN): run sluice as root")]
    EnterPermission { what: String },
    #[error(
        "creating a network namespace failed: {0} (does this kernel support network namespaces?)"
    )]
    Create(#[source] Errno),
    #[error("entering network namespace {what} failed: {source}")]
    Enter {
        what: String,
        #[source]
        source: Errno,
    },
    #[error("opening network namespace {}: {source} (is the process still running?)", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not a network namespace", path.display())]
    NotANetns { path: PathBuf },
    #[error("`ip` not found: install iproute2 (apt-get install iproute2)")]
    IpNotFound,
    #[error("running `ip -batch -` in the sandbox namespace failed: {0}")]
    IpSpawn(#[source] io::Error),
    #[error("setting up the sandbox namespace's links and routes failed (ip exited with {status}): {stderr}")]
    IpFailed { status: String, stderr: String },
    #[error("starting a thread for the sandbox namespace failed: {0}")]
    Thread(#[source] io::Error),
    #[error("the thread working inside the sandbox namespace panicked")]
    ThreadPanicked,
}

/// An anonymous network namespace, owned through an fd. Dropping it releases
/// sluice's reference; the kernel frees the namespace once no process, fd or
/// socket refers to it any more.
#[derive(Debug)]
pub struct SandboxNetns {
    fd: OwnedFd,
    ino: u64,
    dev: u64,
}

impl SandboxNetns {
    /// Creates a fresh anonymous namespace with `lo` up, veth `sbx0`/`sbx1`
    /// (both ends inside, both up), [`SANDBOX_V4`]/30 and [`SANDBOX_V6`]/64
    /// (nodad) on `sbx0`, and v4 and v6 default routes via `sbx0`.
    pub fn create() -> Result<SandboxNetns, NetnsError> {
        let handle = std::thread::Builder::new()
            .name("sluice-netns-create".into())
            .spawn(|| -> Result<OwnedFd, NetnsError> {
                unshare(CloneFlags::CLONE_NEWNET).map_err(|e| match e {
                    Errno::EPERM => NetnsError::CreatePermission,
                    e => NetnsError::Create(e),
                })?;
                // /proc/self would name the thread-group leader's namespace,
                // which this thread just left.
                let path = Path::new("/proc/thread-self/ns/net");
                let fd: OwnedFd = File::open(path)
                    .map_err(|source| NetnsError::Open {
                        path: path.to_owned(),
                        source,
                    })?
                    .into();
                // Spawned from this thread, so `ip` runs in the new namespace.
                configure_links()?;
                Ok(fd)
            })
            .map_err(NetnsError::Thread)?;
        let fd = handle.join().map_err(|_| NetnsError::ThreadPanicked)??;
        SandboxNetns::from_fd(fd, Path::new("/proc/thread-self/ns/net"))
    }

    /// Opens an existing namespace, e.g. `/proc/PID/ns/net` of a container.
    pub fn from_path(path: &Path) -> Result<SandboxNetns, NetnsError> {
        let fd: OwnedFd = File::open(path)
            .map_err(|source| NetnsError::Open {
                path: path.to_owned(),
                source,
            })?
            .into();
        SandboxNetns::enterable(fd, path)
    }

    /// Adopts a namespace descriptor handed over by another process (the OCI
    /// hook passes the container's namespace over a Unix socket), checking
    /// that it is a network namespace this process may enter.
    pub fn from_owned_fd(fd: OwnedFd) -> Result<SandboxNetns, NetnsError> {
        SandboxNetns::enterable(fd, Path::new("<received namespace descriptor>"))
    }

    /// Entering `fd` on a throwaway thread proves it is a network namespace
    /// (setns with CLONE_NEWNET refuses anything else) and that we may.
    fn enterable(fd: OwnedFd, path: &Path) -> Result<SandboxNetns, NetnsError> {
        let ns = SandboxNetns::from_fd(fd, path)?;
        ns.run_in(|| ()).map_err(|e| match e {
            NetnsError::Enter {
                source: Errno::EINVAL,
                ..
            } => NetnsError::NotANetns {
                path: path.to_owned(),
            },
            e => e,
        })?;
        Ok(ns)
    }

    /// Names of the links in this namespace other than `lo`.
    pub fn links(&self) -> Result<Vec<String>, NetnsError> {
        let out = self
            .run_in(|| Command::new("ip").args(["-o", "link", "show"]).output())?
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => NetnsError::IpNotFound,
                _ => NetnsError::IpSpawn(e),
            })?;
        if !out.status.success() {
            return Err(NetnsError::IpFailed {
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        // "2: eth0@if7: <...> ..." -> "eth0"
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.split(": ").nth(1))
            .map(|name| name.split('@').next().unwrap_or(name).to_string())
            .filter(|name| name != "lo")
            .collect())
    }

    /// Gives a namespace someone else created (a container's, holding only
    /// `lo`) the same plumbing as [`SandboxNetns::create`]: `lo` up, the
    /// in-namespace veth pair, and default routes, so that connect() reaches
    /// netfilter. Refuse namespaces with other links before calling this.
    pub fn plumb(&self) -> Result<(), NetnsError> {
        self.run_in(configure_links)?
    }

    fn from_fd(fd: OwnedFd, path: &Path) -> Result<SandboxNetns, NetnsError> {
        let st = nix::sys::stat::fstat(&fd).map_err(|e| NetnsError::Open {
            path: path.to_owned(),
            source: e.into(),
        })?;
        Ok(SandboxNetns {
            fd,
            ino: st.st_ino,
            dev: st.st_dev,
        })
    }

    /// A second handle on the same namespace (a duplicated descriptor), for
    /// tasks that outlive the borrow, such as the drop-counter reader.
    pub fn clone_handle(&self) -> Result<SandboxNetns, NetnsError> {
        let fd = self.fd.try_clone().map_err(|source| NetnsError::Open {
            path: "<sandbox namespace descriptor>".into(),
            source,
        })?;
        Ok(SandboxNetns {
            fd,
            ino: self.ino,
            dev: self.dev,
        })
    }

    /// Runs `f` on a fresh thread that has entered this namespace and waits
    /// for it. Sockets created in `f` belong to the namespace; commands
    /// spawned from `f` run in it.
    pub fn run_in<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NetnsError> {
        let fd = self.fd.try_clone().map_err(NetnsError::Thread)?;
        let what = self.describe();
        let handle = std::thread::Builder::new()
            .name("sluice-netns".into())
            .spawn(move || -> Result<T, NetnsError> {
                setns(&fd, CloneFlags::CLONE_NEWNET).map_err(|e| match e {
                    Errno::EPERM => NetnsError::EnterPermission { what },
                    source => NetnsError::Enter { what, source },
                })?;
                drop(fd);
                Ok(f())
            })
            .map_err(NetnsError::Thread)?;
        handle.join().map_err(|_| NetnsError::ThreadPanicked)?
    }

    /// A `pre_exec` hook (std or tokio `Command`) that moves the forked
    /// child into this namespace before exec. The hook owns its own
    /// close-on-exec duplicate of the namespace fd, so it stays valid even if
    /// this `SandboxNetns` is dropped first, and it does nothing but the
    /// setns(2) syscall (async-signal-safe). If the fd cannot be duplicated
    /// (fd limit reached), the hook fails and so does the spawn.
    pub fn enter_fn(&self) -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE));
        move || match &fd {
            Ok(fd) => setns(fd.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from),
            Err(errno) => Err(io::Error::from_raw_os_error(*errno)),
        }
    }

    /// The namespace's inode number (as in `net:[INODE]`).
    pub fn inode(&self) -> u64 {
        self.ino
    }

    /// Pids of processes whose (main thread's) network namespace is this
    /// one. Processes that exit or cannot be inspected during the scan are
    /// skipped.
    pub fn processes_inside(&self) -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut pids = Vec::new();
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(meta) = std::fs::metadata(entry.path().join("ns/net")) else {
                continue;
            };
            use std::os::unix::fs::MetadataExt;
            if meta.ino() == self.ino && meta.dev() == self.dev {
                pids.push(pid);
            }
        }
        pids.sort_unstable();
        pids
    }

    /// SIGKILLs every process inside (never sluice itself), so that nothing
    /// keeps the namespace alive after teardown. Rescans a few times to catch
    /// children forked while the first ones were being killed; killed
    /// processes that are not yet reaped (zombies) no longer count as inside.
    pub fn kill_processes_inside(&self) {
        let me = std::process::id() as i32;
        for _ in 0..5 {
            let pids: Vec<i32> = self
                .processes_inside()
                .into_iter()
                .filter(|&p| p != me)
                .collect();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let pid = nix::unistd::Pid::from_raw(pid);
                if let Err(e) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL) {
                    if e != Errno::ESRCH {
                        tracing::warn!(%pid, error = %e, "could not kill a process inside the sandbox namespace");
                    }
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn describe(&self) -> String {
        format!("net:[{}]", self.ino)
    }
}

impl AsFd for SandboxNetns {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The `ip -batch` script that plumbs a fresh namespace. Each line is one
/// `ip` command; the address family of a route is implied by its prefix.
fn setup_script() -> String {
    format!(
        "link set lo up\n\
         link add {link} type veth peer name {peer}\n\
         link set {link} up\n\
         link set {peer} up\n\
         address add {v4}/{v4p} dev {link}\n\
         address add {v6}/128 dev lo nodad\n\
         route add 0.0.0.0/0 dev {link}\n\
         route add ::/0 dev {link} src {v6}\n",
        link = SANDBOX_LINK,
        peer = SANDBOX_PEER,
        v4 = SANDBOX_V4,
        v4p = SANDBOX_V4_PREFIX,
        v6 = SANDBOX_V6,
    )
}

/// Quiet the kernel's own IPv6 chatter (router solicitations, duplicate
/// address detection) on links created from now on in this thread's
/// namespace, so the drop counter counts what the workload tried, not noise.
/// Best effort: a kernel without these knobs still enforces the same.
fn quiet_ipv6_defaults() {
    for (knob, value) in [
        ("accept_ra", "0"),
        ("router_solicitations", "0"),
        ("accept_dad", "0"),
        ("dad_transmits", "0"),
        // No link-local addresses: nothing here talks to a neighbour.
        ("addr_gen_mode", "1"),
    ] {
        let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/default/{knob}"), value);
    }
}

/// Runs ONE `ip -batch -` in the calling thread's namespace.
fn configure_links() -> Result<(), NetnsError> {
    quiet_ipv6_defaults();
    let mut child = Command::new("ip")
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => NetnsError::IpNotFound,
            _ => NetnsError::IpSpawn(e),
        })?;
    let script = setup_script();
    if let Some(mut stdin) = child.stdin.take() {
        // A write error means ip exited early; its status and stderr say why.
        let _ = stdin.write_all(script.as_bytes());
    }
    let out = child.wait_with_output().map_err(NetnsError::IpSpawn)?;
    if !out.status.success() {
        return Err(NetnsError::IpFailed {
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_netns_can_be_shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<SandboxNetns>();
    }

    #[test]
    fn setup_script_puts_both_veth_ends_and_routes_inside() {
        let s = setup_script();
        assert!(s.contains("link add sbx0 type veth peer name sbx1\n"));
        assert!(!s.contains("netns"), "no link may leave the namespace");
        assert!(s.contains("address add 198.19.255.2/30 dev sbx0\n"));
        // The v6 address sits on lo, which sends no MLD reports.
        assert!(s.contains("address add 2001:db8:5c:ffff::2/128 dev lo nodad\n"));
        assert!(s.contains("route add 0.0.0.0/0 dev sbx0\n"));
        assert!(s.contains("route add ::/0 dev sbx0 src 2001:db8:5c:ffff::2\n"));
    }
}
