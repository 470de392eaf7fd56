//! netns: the sandbox network namespace.
//!
//! This module owns creating, opening and entering the network namespace a
//! workload runs in: an ANONYMOUS namespace (never `ip netns add`, so no
//! bind mount under /run/netns can outlive sluice) held only by an fd, with
//! `lo` and one link `sbx0` (an ifb, which drops what is sent to it, here
//! or in any namespace it is moved to), and default routes (v4 and v6) via
//! `sbx0` so that connect() reaches netfilter instead of failing with
//! ENETUNREACH. The kernel frees the namespace with
//! its last reference (this fd, a process inside, or a socket created in it),
//! so nothing is left even if sluice is SIGKILLed.
//!
//! Linux network namespaces are per thread: every operation that must happen
//! "inside" runs on a dedicated, short-lived std::thread that unshare()s or
//! setns()es, so the rest of the process (tokio workers included) never
//! changes namespace. Links, addresses and routes are set over rtnetlink
//! from that thread (`links`); no `ip` process is spawned. This module must
//! never touch the namespace sluice itself runs in: no links, routes or
//! rules are ever created outside the sandbox namespace, and in a namespace
//! it did not create (a tap attached where its VMM runs) it changes only
//! that tap: its sysctls and the gateway addresses it adds (and removes
//! again). Firewall rules are not this module's job (see `enforce`). A
//! microVM's tap is made and adopted here (`tap`).

#[forbid(unsafe_code)]
mod links;
#[forbid(unsafe_code)]
mod processes;
#[allow(unsafe_code)]
pub mod tap;

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sched::{setns, unshare, CloneFlags};

/// IPv4 address of the in-namespace link `sbx0` (a /30 from the
/// benchmark range, so nothing it could reach exists outside this machine).
pub const SANDBOX_V4: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 2);
/// Prefix length of [`SANDBOX_V4`].
pub(crate) const SANDBOX_V4_PREFIX: u8 = 30;
/// The sandbox's IPv6 source address (documentation range), on `lo` with
/// `nodad` (lo sends no MLD reports); the v6 default route via `sbx0` uses it
/// as its source.
pub const SANDBOX_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0x0db8, 0x5c, 0xffff, 0, 0, 0, 2);
/// Name of the link that carries the addresses and default routes.
pub(crate) const SANDBOX_LINK: &str = "sbx0";
/// What kind of link [`SANDBOX_LINK`] is (`IFLA_INFO_KIND`).
pub(crate) const SANDBOX_LINK_KIND: &str = "ifb";

/// Whether a link of `kind` named [`SANDBOX_LINK`], alone beside `lo`, is
/// one sluice made: an ifb, or the bridge with no ports that sluice made
/// before 2026-12-08 (a daemon upgraded while such a container runs
/// adopts it again). Neither leads anywhere; a veth, which does, is not.
pub(crate) fn is_sandbox_link_kind(kind: Option<&str>) -> bool {
    matches!(kind, Some(SANDBOX_LINK_KIND) | Some("bridge"))
}

pub use tap::TapOwner;

/// An address with its prefix length, as it sits on a link.
pub(crate) type LinkAddress = (IpAddr, u8);

/// A namespace being made on a thread of its own
/// ([`SandboxNetns::start_create_and_run`]), with what was run in it.
/// Dropped without [`Creating::wait`], it still waits for the thread, and
/// the namespace is freed with its descriptor.
pub(crate) struct Creating<T>(Option<std::thread::JoinHandle<Result<(OwnedFd, T), NetnsError>>>);

impl<T> Creating<T> {
    /// Wait for the namespace and what was run in it.
    pub(crate) fn wait(mut self) -> Result<(SandboxNetns, T), NetnsError> {
        let thread = self.0.take().ok_or(NetnsError::ThreadPanicked)?;
        let (fd, done) = thread.join().map_err(|_| NetnsError::ThreadPanicked)??;
        Ok((
            SandboxNetns::from_fd(fd, Path::new("/proc/thread-self/ns/net"))?,
            done,
        ))
    }
}

impl<T> Drop for Creating<T> {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            let _ = thread.join();
        }
    }
}

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
    #[error("setting up the sandbox namespace's network failed while {step}: {source}{}", netlink_hint(.source))]
    Netlink {
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("tap {tap}: {step} failed: {source}{}", tap_hint(.source))]
    Tap {
        tap: String,
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("no link named {tap} in the namespace: create the tap first (e.g. `ip tuntap add dev {tap} mode tap`), or name the one the VMM uses")]
    NoSuchTap { tap: String },
    #[error("{tap} is a {kind} link, not a tap: sluice fences only tap devices")]
    NotATap { tap: String, kind: String },
    #[error("cannot set {path}: {source}")]
    Sysctl {
        path: String,
        #[source]
        source: io::Error,
    },
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
}

impl SandboxNetns {
    /// Creates a fresh anonymous namespace with `lo` up, `sbx0` (an ifb,
    /// which leads nowhere, up), [`SANDBOX_V4`]/30 on `sbx0`,
    /// [`SANDBOX_V6`]/128 (nodad) on `lo`, and v4 and v6 default routes via
    /// `sbx0` (the v6 one with [`SANDBOX_V6`] as its source).
    pub fn create() -> Result<SandboxNetns, NetnsError> {
        Ok(SandboxNetns::create_and_run(|| ())?.0)
    }

    /// [`SandboxNetns::create`], then `f` inside the new namespace on the
    /// same thread: one thread and one hand-off less than `create` followed
    /// by [`SandboxNetns::run_in`], on the path the caller of `sluice run`
    /// waits for.
    pub(crate) fn create_and_run<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<(SandboxNetns, T), NetnsError> {
        SandboxNetns::start_create_and_run(|| (), |()| f())?.wait()
    }

    /// [`SandboxNetns::create_and_run`], returning at once: the namespace
    /// is made on its own thread while the caller goes on, and
    /// [`Creating::wait`] hands it over. `entered` runs in
    /// the new namespace before its links are set up (to start work there
    /// that overlaps with that: see `enforce::start_apply_and_verify`), what
    /// it returns handed to `f`. Whatever `entered` starts must not need the
    /// links (anything but `lo`).
    pub(crate) fn start_create_and_run<E: Send + 'static, T: Send + 'static>(
        entered: impl FnOnce() -> E + Send + 'static,
        f: impl FnOnce(E) -> T + Send + 'static,
    ) -> Result<Creating<T>, NetnsError> {
        std::thread::Builder::new()
            .name("sluice-netns-create".into())
            .spawn(|| -> Result<(OwnedFd, T), NetnsError> {
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
                let under_way = entered();
                // Netlink sockets opened on this thread talk to the new namespace.
                links::configure()?;
                Ok((fd, f(under_way)))
            })
            .map(|thread| Creating(Some(thread)))
            .map_err(NetnsError::Thread)
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
    pub(crate) fn from_owned_fd(fd: OwnedFd) -> Result<SandboxNetns, NetnsError> {
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
        let mut names = self.run_in(links::names)??;
        names.retain(|name| name != "lo");
        Ok(names)
    }

    /// Gives a namespace someone else created (a container's, holding only
    /// `lo`) the same plumbing as [`SandboxNetns::create`]: `lo` up, the
    /// ifb `sbx0`, and default routes, so that connect() reaches
    /// netfilter. Refuse namespaces with other links before calling this.
    pub fn plumb(&self) -> Result<(), NetnsError> {
        self.run_in(links::configure)?
    }

    fn from_fd(fd: OwnedFd, path: &Path) -> Result<SandboxNetns, NetnsError> {
        let st = nix::sys::stat::fstat(&fd).map_err(|e| NetnsError::Open {
            path: path.to_owned(),
            source: e.into(),
        })?;
        Ok(SandboxNetns { fd, ino: st.st_ino })
    }

    /// A second handle on the same namespace (a duplicated descriptor), for
    /// tasks that outlive the borrow, such as the drop-counter reader.
    pub(crate) fn clone_handle(&self) -> Result<SandboxNetns, NetnsError> {
        let fd = self.fd.try_clone().map_err(|source| NetnsError::Open {
            path: "<sandbox namespace descriptor>".into(),
            source,
        })?;
        Ok(SandboxNetns { fd, ino: self.ino })
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

    /// A close-on-exec duplicate of the namespace descriptor, for a child
    /// that enters the namespace between fork and exec (see
    /// `confine::child`): it stays valid even if this `SandboxNetns` is
    /// dropped first.
    pub fn entry(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Creates the persistent tap `name` in this namespace for a VMM running
    /// as `owner`, with the hardened sysctls (`tap::harden_sysctls`),
    /// `addresses` on it (IPv6 without DAD) and up.
    pub fn create_tap(
        &self,
        name: &str,
        owner: TapOwner,
        addresses: &[LinkAddress],
    ) -> Result<(), NetnsError> {
        let (name, addresses) = (name.to_string(), addresses.to_vec());
        self.run_in(move || {
            tap::create_persistent(&name, owner)?;
            tap::harden_sysctls(&name)?;
            let mut rtnl = links::Rtnl::open()?;
            let index = rtnl.index_of(&name)?;
            for &(addr, prefix) in &addresses {
                rtnl.add_address(
                    "adding the gateway address to the tap",
                    index,
                    addr,
                    prefix,
                    netlink_packet_route::address::AddressScope::Universe,
                )?;
            }
            rtnl.set_up("bringing the tap up", &name)
        })?
    }

    /// Takes over the existing tap `name` for a fence: checks it is a tap,
    /// hardens its sysctls, adds those of `addresses` it lacks and brings it
    /// up. Returns the addresses it added (to remove them again with
    /// [`SandboxNetns::remove_tap_addresses`]), none of the tap's own.
    pub fn adopt_tap(
        &self,
        name: &str,
        addresses: &[LinkAddress],
    ) -> Result<Vec<LinkAddress>, NetnsError> {
        let (name, addresses) = (name.to_string(), addresses.to_vec());
        self.run_in(move || {
            let mut rtnl = links::Rtnl::open()?;
            let facts = rtnl
                .link(&name)?
                .ok_or_else(|| NetnsError::NoSuchTap { tap: name.clone() })?;
            match facts.kind.as_deref() {
                Some("tun") => {}
                other => {
                    return Err(NetnsError::NotATap {
                        tap: name,
                        kind: other.unwrap_or("kindless (physical?)").to_string(),
                    })
                }
            }
            tap::harden_sysctls(&name)?;
            let present = rtnl.addresses(facts.index)?;
            let mut added = Vec::new();
            for &(addr, prefix) in &addresses {
                if present.iter().any(|(a, _)| *a == addr) {
                    continue;
                }
                rtnl.add_address(
                    "adding the gateway address to the tap",
                    facts.index,
                    addr,
                    prefix,
                    netlink_packet_route::address::AddressScope::Universe,
                )?;
                added.push((addr, prefix));
            }
            rtnl.set_up("bringing the tap up", &name)?;
            Ok(added)
        })?
    }

    /// Removes `addresses` from tap `name` (what [`SandboxNetns::adopt_tap`]
    /// added); a tap that is gone has none left to remove.
    pub fn remove_tap_addresses(
        &self,
        name: &str,
        addresses: &[LinkAddress],
    ) -> Result<(), NetnsError> {
        let (name, addresses) = (name.to_string(), addresses.to_vec());
        self.run_in(move || {
            let mut rtnl = links::Rtnl::open()?;
            let Some(facts) = rtnl.link(&name)? else {
                return Ok(());
            };
            let present = rtnl.addresses(facts.index)?;
            for &(addr, prefix) in &addresses {
                if present.iter().any(|(a, _)| *a == addr) {
                    rtnl.del_address(
                        "removing the gateway address sluice added",
                        facts.index,
                        addr,
                        prefix,
                    )?;
                }
            }
            Ok(())
        })?
    }

    /// A watch for the removal of link `name` from this namespace (a tap
    /// deleted under an attach): [`LinkRemoval::wait`] returns once it is
    /// gone, at once if it already is.
    pub(crate) fn watch_link_removal(&self, name: &str) -> Result<LinkRemoval, NetnsError> {
        let name = name.to_string();
        let monitor = self.run_in(move || links::LinkMonitor::open(&name))??;
        Ok(LinkRemoval(monitor))
    }

    /// Whether a link named `name` exists in this namespace.
    pub fn has_link(&self, name: &str) -> Result<bool, NetnsError> {
        let name = name.to_string();
        self.run_in(move || Ok(links::Rtnl::open()?.link(&name)?.is_some()))?
    }

    /// What kind of link `name` is (`IFLA_INFO_KIND`: `ifb`, `veth`,
    /// `tun`, ...); `None` when there is no such link or it has no kind
    /// (`lo`).
    pub fn link_kind(&self, name: &str) -> Result<Option<String>, NetnsError> {
        let name = name.to_string();
        self.run_in(move || Ok(links::Rtnl::open()?.link(&name)?.and_then(|f| f.kind)))?
    }

    /// The namespace's inode number (as in `net:[INODE]`).
    pub fn inode(&self) -> u64 {
        self.ino
    }

    /// Pids of processes whose (main thread's) network namespace is this
    /// one. Processes that exit or cannot be inspected during the scan are
    /// skipped.
    pub fn processes_inside(&self) -> Vec<i32> {
        self.netns().processes()
    }

    /// SIGKILLs every process inside (never sluice itself), so that nothing
    /// keeps the namespace alive after teardown: waits for each one killed
    /// to exit (its pidfd), then rescans for children forked meanwhile,
    /// until a scan finds none. An empty namespace costs one scan of /proc.
    /// Killed processes that are not yet reaped (zombies) no longer count as
    /// inside.
    pub fn kill_processes_inside(&self) {
        self.netns().kill_processes();
    }

    fn netns(&self) -> processes::Netns {
        processes::Netns::new(self.ino)
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

/// A link's removal to wait for ([`SandboxNetns::watch_link_removal`]).
pub(crate) struct LinkRemoval(Option<links::LinkMonitor>);

impl LinkRemoval {
    /// Blocks (call it from a thread of its own) until the link is gone.
    pub(crate) fn wait(self) -> Result<(), NetnsError> {
        match self.0 {
            None => Ok(()),
            Some(mut monitor) => monitor.wait_removed(),
        }
    }
}

/// In the CALLING THREAD's namespace (the caller has entered the tap's):
/// pins the guest's IPv6 neighbour entries on tap `tap` (each of
/// `addresses` at `guest_mac`, permanent), so that a reply to the guest
/// never waits on neighbour discovery, and returns the tap's own MAC. Only
/// that tap's neighbour table is touched; the entries go with the tap.
pub(crate) fn tap_ipv6_here(
    tap: &str,
    guest_mac: crate::mac::MacAddr,
    addresses: &[Ipv6Addr],
) -> Result<Option<crate::mac::MacAddr>, NetnsError> {
    let mut rtnl = links::Rtnl::open()?;
    let facts = rtnl
        .link(tap)?
        .ok_or_else(|| NetnsError::NoSuchTap { tap: tap.into() })?;
    for &addr in addresses {
        rtnl.pin_neighbour(facts.index, addr.into(), guest_mac)?;
    }
    Ok(facts.mac.and_then(|m| crate::mac::MacAddr::from_slice(&m)))
}

/// What to do about a tap failure, after what failed.
fn tap_hint(err: &io::Error) -> &'static str {
    match err.raw_os_error() {
        Some(libc::ENOENT) => " (no /dev/net/tun: load the tun module with `modprobe tun`)",
        Some(libc::EPERM) | Some(libc::EACCES) => " (needs root: run sluice as root)",
        Some(libc::EBUSY) | Some(libc::EEXIST) => {
            " (a link of that name exists already: choose another --tap)"
        }
        _ => "",
    }
}

/// What to do about a netlink failure, after what failed.
fn netlink_hint(err: &io::Error) -> &'static str {
    match err.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            " (needs root: CAP_NET_ADMIN in the sandbox namespace; run sluice as root)"
        }
        Some(libc::EOPNOTSUPP) => " (this kernel lacks ifb support: load it with `modprobe ifb`)",
        Some(libc::EEXIST) => {
            " (it exists already: only a namespace holding nothing but lo can be plumbed)"
        }
        _ => "",
    }
}

impl crate::exit_class::Classified for NetnsError {
    /// A namespace, link or socket that cannot be made.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::CannotEnforce
    }
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
    fn only_links_that_lead_nowhere_count_as_sluices_own() {
        assert!(is_sandbox_link_kind(Some("ifb")));
        assert!(
            is_sandbox_link_kind(Some("bridge")),
            "made before 2026-12-08"
        );
        for other in [Some("veth"), Some("vxlan"), Some("tun"), None] {
            assert!(!is_sandbox_link_kind(other), "{other:?}");
        }
    }
}
