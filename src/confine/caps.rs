//! The capabilities a workload never keeps, even as root. This module owns
//! the list and the drop; it must never raise a capability.

#![forbid(unsafe_code)]

use caps::Capability;

/// Capabilities the workload can never have, even as root, with why:
/// those that reach around a network namespace (setns into another one,
/// ptrace of sluice, the sandbox's own ruleset, raw frames), around the
/// kernel (modules, raw I/O and device nodes, BPF, file handles, the
/// clock sluice's bundle expiry and audit timestamps rely on), or into
/// the host's kernel log and audit system.
pub const DROPPED: [(Capability, &str); 22] = [
    (
        Capability::CAP_DAC_READ_SEARCH,
        "open_by_handle_at reaches any file by handle, around the mount namespace",
    ),
    (
        Capability::CAP_NET_ADMIN,
        "the sandbox's own nftables rules and links",
    ),
    (
        Capability::CAP_NET_RAW,
        "raw and packet sockets, whose frames skip nftables' output hooks",
    ),
    (Capability::CAP_SYS_MODULE, "loading kernel modules"),
    (
        Capability::CAP_SYS_RAWIO,
        "I/O ports and /dev/mem, around every kernel check",
    ),
    (
        Capability::CAP_SYS_PTRACE,
        "tracing processes of other users, sluice's included",
    ),
    (
        Capability::CAP_SYS_ADMIN,
        "setns into another namespace, mounts, and most of the rest",
    ),
    (Capability::CAP_SYS_BOOT, "reboot and kexec"),
    (
        Capability::CAP_SYS_TIME,
        "the host's clock (bundle expiry, audit timestamps)",
    ),
    (Capability::CAP_SYS_PACCT, "process accounting files"),
    (Capability::CAP_SYS_TTY_CONFIG, "vhangup of terminals"),
    (
        Capability::CAP_MKNOD,
        "device nodes for the host's disks and memory",
    ),
    (Capability::CAP_AUDIT_CONTROL, "the kernel's audit rules"),
    (Capability::CAP_AUDIT_READ, "the kernel's audit log"),
    (
        Capability::CAP_MAC_OVERRIDE,
        "the mandatory access control policy",
    ),
    (
        Capability::CAP_MAC_ADMIN,
        "the mandatory access control policy",
    ),
    (Capability::CAP_SYSLOG, "the kernel log and its addresses"),
    (Capability::CAP_WAKE_ALARM, "waking the host"),
    (Capability::CAP_BLOCK_SUSPEND, "keeping the host awake"),
    (
        Capability::CAP_PERFMON,
        "perf events on other processes and the kernel",
    ),
    (Capability::CAP_BPF, "BPF programs and maps"),
    (
        Capability::CAP_CHECKPOINT_RESTORE,
        "choosing pids and reading other processes' state",
    ),
];

/// Which of [`DROPPED`] the workload's process drops from its bounding set
/// (see `child`): those this kernel knows (one it does not know cannot be
/// held). Worked out before the fork; the child also clears its ambient
/// and inheritable sets, which a root `execve` would otherwise add to the
/// new program's permitted set whatever the bounding set says.
pub(crate) fn bounding_to_drop() -> Vec<rustix::thread::CapabilitySet> {
    let last = last_known();
    let known = |cap: &Capability| match last {
        Some(last) => cap.index() <= last,
        None => caps::has_cap(None, caps::CapSet::Bounding, *cap).is_ok(),
    };
    DROPPED
        .iter()
        .filter(|(cap, _)| known(cap))
        .map(|(cap, _)| rustix::thread::CapabilitySet::from_bits_retain(1 << cap.index()))
        .collect()
}

/// The highest capability number this kernel knows, from
/// /proc/sys/kernel/cap_last_cap: one read, where asking for each
/// capability (PR_CAPBSET_READ, what is done without it) takes one call
/// each.
fn last_known() -> Option<u8> {
    parse_last_cap(&std::fs::read("/proc/sys/kernel/cap_last_cap").ok()?)
}

fn parse_last_cap(text: &[u8]) -> Option<u8> {
    std::str::from_utf8(text).ok()?.trim_end().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dropped_list_names_each_capability_once() {
        let mut seen = std::collections::HashSet::new();
        for (cap, why) in DROPPED {
            assert!(seen.insert(cap), "{cap} listed twice");
            assert!(!why.is_empty());
        }
        assert!(seen.contains(&Capability::CAP_NET_RAW));
        assert!(seen.contains(&Capability::CAP_SYS_ADMIN));
    }

    #[test]
    fn cap_last_cap_is_read_as_a_number_and_anything_else_as_unknown() {
        assert_eq!(parse_last_cap(b"40\n"), Some(40));
        assert_eq!(parse_last_cap(b""), None);
        assert_eq!(parse_last_cap(b"forty\n"), None);
    }

    #[test]
    fn the_kernel_s_last_capability_gives_the_same_drops_as_asking_for_each() {
        let probed: Vec<_> = DROPPED
            .iter()
            .filter(|(cap, _)| caps::has_cap(None, caps::CapSet::Bounding, *cap).is_ok())
            .map(|(cap, _)| rustix::thread::CapabilitySet::from_bits_retain(1 << cap.index()))
            .collect();
        assert!(last_known().is_some());
        assert_eq!(bounding_to_drop(), probed);
    }
}
