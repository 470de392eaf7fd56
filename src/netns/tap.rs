//! A microVM's tap device on the host side: creating one (persistent, owned
//! by the VMM's user, so that a VMM without CAP_NET_ADMIN can open it by
//! name), the sysctls that keep the kernel from treating it as a router's
//! port, and opening a queue of an existing tap (what a VMM does).
//!
//! The tap ioctls are written out here: no maintained crate both creates a
//! persistent tap and sets its owner and group (tun/tap crates open a queue
//! for their own process), and rtnetlink cannot create one (the kernel's tun
//! driver refuses RTM_NEWLINK). Each call is one ioctl on a /dev/net/tun
//! descriptor with a `struct ifreq` or an integer, as <linux/if_tun.h>
//! declares. Everything here acts in the CALLING THREAD's network namespace
//! (the tun driver creates the device in the namespace of the thread that
//! opened /dev/net/tun): callers run it through `SandboxNetns::run_in`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;

use super::NetnsError;

/// The tun driver's control device.
const TUN_DEVICE: &str = "/dev/net/tun";

/// Who may open the tap's queues without CAP_NET_ADMIN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapOwner {
    pub uid: u32,
    pub gid: u32,
}

/// A `struct ifreq` holding a name and the tun flags: the argument of
/// TUNSETIFF.
fn ifreq(name: &str, flags: libc::c_int) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not an interface name (1 to 15 bytes)"),
        ));
    }
    let mut ifr_name = [0 as libc::c_char; libc::IFNAMSIZ];
    for (slot, byte) in ifr_name.iter_mut().zip(name.bytes()) {
        *slot = byte as libc::c_char;
    }
    // The union's largest member, all zero, then the flags written over
    // its first bytes (writing a union field is safe; only reading is not).
    let zero = libc::__c_anonymous_ifru_map {
        mem_start: 0,
        mem_end: 0,
        base_addr: 0,
        irq: 0,
        dma: 0,
        port: 0,
    };
    let mut req = libc::ifreq {
        ifr_name,
        ifr_ifru: libc::__c_anonymous_ifr_ifru { ifru_map: zero },
    };
    req.ifr_ifru.ifru_flags = flags as libc::c_short;
    Ok(req)
}

/// A tun ioctl and its argument, as <linux/if_tun.h> declares them.
enum TunIoctl<'a> {
    /// TUNSETIFF: reads (and may write the name back into) one `struct
    /// ifreq`.
    SetIff(&'a mut libc::ifreq),
    /// TUNSETOWNER, TUNSETGROUP, TUNSETPERSIST: an integer taken by value.
    SetInt(libc::Ioctl, libc::c_ulong),
}

/// The one place this module calls ioctl(2).
fn tun_ioctl(file: &File, call: TunIoctl<'_>) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is an open /dev/net/tun descriptor borrowed for the
    // call. TUNSETIFF gets a pointer to a whole `struct ifreq` (built in
    // `ifreq`: name and zeroed union, then the flags), which the exclusive
    // borrow keeps alive and writable for the call; the
    // integer requests take their argument by value (the kernel follows no
    // pointer).
    let rc = unsafe {
        match call {
            TunIoctl::SetIff(req) => libc::ioctl(fd, libc::TUNSETIFF, std::ptr::from_mut(req)),
            TunIoctl::SetInt(request, value) => libc::ioctl(fd, request, value),
        }
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// TUNSETIFF on `file`: creates the tap `name`, or attaches `file` to it as
/// one of its queues when it exists.
fn set_iff(file: &File, name: &str) -> io::Result<()> {
    let mut req = ifreq(name, libc::IFF_TAP | libc::IFF_NO_PI)?;
    tun_ioctl(file, TunIoctl::SetIff(&mut req))
}

/// One of TUNSETOWNER, TUNSETGROUP, TUNSETPERSIST: an integer argument.
fn set_int(file: &File, request: libc::Ioctl, value: libc::c_ulong) -> io::Result<()> {
    tun_ioctl(file, TunIoctl::SetInt(request, value))
}

fn open_control() -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(TUN_DEVICE)
}

/// Creates the persistent tap `name` owned by `owner` (single queue, no
/// packet information header: what QEMU's and Firecracker's tap backends
/// open), down, in the calling thread's namespace. It lives until it is
/// deleted or its namespace goes.
pub(super) fn create_persistent(name: &str, owner: TapOwner) -> Result<(), NetnsError> {
    let fail = |step: &'static str| {
        move |source: io::Error| NetnsError::Tap {
            tap: name.to_string(),
            step,
            source,
        }
    };
    let file = open_control().map_err(fail("opening /dev/net/tun"))?;
    set_iff(&file, name).map_err(fail("creating the tap (TUNSETIFF)"))?;
    set_int(&file, libc::TUNSETOWNER, libc::c_ulong::from(owner.uid))
        .map_err(fail("setting its owner (TUNSETOWNER)"))?;
    set_int(&file, libc::TUNSETGROUP, libc::c_ulong::from(owner.gid))
        .map_err(fail("setting its group (TUNSETGROUP)"))?;
    set_int(&file, libc::TUNSETPERSIST, 1).map_err(fail("making it persistent (TUNSETPERSIST)"))?;
    Ok(())
}

/// Opens a queue of the existing tap `name` in the calling thread's
/// namespace, as a VMM does: frames written to the file arrive on the tap as
/// if the guest had sent them, frames the host sends to the tap can be read.
pub fn open_queue(name: &str) -> io::Result<File> {
    let file = open_control()?;
    set_iff(&file, name)?;
    Ok(file)
}

/// A sysctl of the tap, and whether a failure to set it is fatal.
struct Knob {
    path: String,
    value: &'static str,
    required: bool,
}

/// The per-tap sysctls: the kernel neither forwards from the tap, nor takes
/// router advertisements or redirects from it, nor accepts a source the
/// route back would not leave by (strict reverse-path filter); the host side
/// gets no link-local or autoconfigured IPv6 address and sends no router
/// solicitations or DAD probes of its own. Set before the tap goes up, since
/// the IPv6 ones act when it does. IPv6 knobs are skipped when the kernel has
/// no IPv6 for the tap.
pub(super) fn harden_sysctls(name: &str) -> Result<(), NetnsError> {
    let v4 = format!("/proc/sys/net/ipv4/conf/{name}");
    let v6 = format!("/proc/sys/net/ipv6/conf/{name}");
    let mut knobs = Vec::new();
    let mut add = |dir: &str, knob: &str, value: &'static str, required: bool| {
        knobs.push(Knob {
            path: format!("{dir}/{knob}"),
            value,
            required,
        })
    };
    add(&v4, "forwarding", "0", true);
    add(&v4, "rp_filter", "1", true);
    add(&v4, "accept_redirects", "0", true);
    add(&v4, "send_redirects", "0", false);
    add(&v4, "accept_source_route", "0", false);
    add(&v4, "proxy_arp", "0", false);
    // Answer ARP only for addresses of the tap itself.
    add(&v4, "arp_ignore", "1", false);
    add(&v4, "arp_announce", "2", false);
    if std::path::Path::new(&v6).exists() {
        add(&v6, "forwarding", "0", true);
        add(&v6, "accept_ra", "0", true);
        add(&v6, "accept_redirects", "0", true);
        add(&v6, "autoconf", "0", false);
        add(&v6, "router_solicitations", "0", false);
        add(&v6, "accept_dad", "0", false);
        add(&v6, "dad_transmits", "0", false);
        add(&v6, "addr_gen_mode", "1", false);
    }
    for knob in knobs {
        match std::fs::write(&knob.path, knob.value) {
            Ok(()) => {}
            Err(source) if knob.required => {
                return Err(NetnsError::Sysctl {
                    path: knob.path,
                    source,
                })
            }
            Err(err) => tracing::debug!(path = %knob.path, %err, "optional tap sysctl not set"),
        }
    }
    // The kernel uses the larger of conf/all and the tap's rp_filter: a
    // shared namespace with all=2 (loose) keeps it loose for the tap too.
    // The fence's own source checks still hold; say so.
    if std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/rp_filter")
        .is_ok_and(|v| v.trim() == "2")
    {
        tracing::warn!(
            tap = name,
            "net.ipv4.conf.all.rp_filter is 2 (loose) in this namespace, so the tap's reverse-path filter is loose too; the fence still admits only the guest's own source addresses"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interface_name_must_fit_ifreq() {
        assert!(ifreq("tap0", libc::IFF_TAP).is_ok());
        assert!(ifreq("", libc::IFF_TAP).is_err());
        assert!(ifreq("sixteen-chars-xx", libc::IFF_TAP).is_err());
        assert!(ifreq("a\0b", libc::IFF_TAP).is_err());
    }
}
