//! The capabilities a workload never keeps, even as root. This module owns
//! the list and the drop; it must never raise a capability.

#![forbid(unsafe_code)]

use rustix::thread::CapabilitySet as Capability;

/// Capabilities the workload can never have, even as root, with why:
/// those that reach around a network namespace (setns into another one,
/// ptrace of sluice, the sandbox's own ruleset, raw frames), around the
/// kernel (modules, raw I/O and device nodes, BPF, file handles, the
/// clock sluice's bundle expiry and audit timestamps rely on), or into
/// the host's kernel log and audit system.
pub(crate) const DROPPED: [(Capability, &str); 22] = [
    (
        Capability::DAC_READ_SEARCH,
        "open_by_handle_at reaches any file by handle, around the mount namespace",
    ),
    (
        Capability::NET_ADMIN,
        "the sandbox's own nftables rules and links",
    ),
    (
        Capability::NET_RAW,
        "raw and packet sockets, whose frames skip nftables' output hooks",
    ),
    (Capability::SYS_MODULE, "loading kernel modules"),
    (
        Capability::SYS_RAWIO,
        "I/O ports and /dev/mem, around every kernel check",
    ),
    (
        Capability::SYS_PTRACE,
        "tracing processes of other users, sluice's included",
    ),
    (
        Capability::SYS_ADMIN,
        "setns into another namespace, mounts, and most of the rest",
    ),
    (Capability::SYS_BOOT, "reboot and kexec"),
    (
        Capability::SYS_TIME,
        "the host's clock (bundle expiry, audit timestamps)",
    ),
    (Capability::SYS_PACCT, "process accounting files"),
    (Capability::SYS_TTY_CONFIG, "vhangup of terminals"),
    (
        Capability::MKNOD,
        "device nodes for the host's disks and memory",
    ),
    (Capability::AUDIT_CONTROL, "the kernel's audit rules"),
    (Capability::AUDIT_READ, "the kernel's audit log"),
    (
        Capability::MAC_OVERRIDE,
        "the mandatory access control policy",
    ),
    (Capability::MAC_ADMIN, "the mandatory access control policy"),
    (Capability::SYSLOG, "the kernel log and its addresses"),
    (Capability::WAKE_ALARM, "waking the host"),
    (Capability::BLOCK_SUSPEND, "keeping the host awake"),
    (
        Capability::PERFMON,
        "perf events on other processes and the kernel",
    ),
    (Capability::BPF, "BPF programs and maps"),
    (
        Capability::CHECKPOINT_RESTORE,
        "choosing pids and reading other processes' state",
    ),
];

/// Which of [`DROPPED`] the workload's process drops from its bounding set
/// (see `child`): those this kernel knows (one it does not know cannot be
/// held). Worked out before the fork; the child also clears its ambient
/// and inheritable sets, which a root `execve` would otherwise add to the
/// new program's permitted set whatever the bounding set says.
pub(crate) fn bounding_to_drop() -> Vec<Capability> {
    let known = |cap: Capability| rustix::thread::capability_is_in_bounding_set(cap).is_ok();
    // The kernel knows every capability up to its last one and none above
    // (PR_CAPBSET_READ fails only above): when it knows the highest listed,
    // it knows them all, and one call answers for the whole list.
    let highest = DROPPED
        .iter()
        .map(|(cap, _)| *cap)
        .max_by_key(|cap| cap.bits());
    let all_known = highest.is_some_and(known);
    DROPPED
        .iter()
        .map(|(cap, _)| *cap)
        .filter(|cap| all_known || known(*cap))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dropped_list_names_each_capability_once() {
        let mut seen = std::collections::HashSet::new();
        for (cap, why) in DROPPED {
            assert!(seen.insert(cap.bits()), "{cap:?} listed twice");
            assert!(!why.is_empty());
        }
        assert!(seen.contains(&Capability::NET_RAW.bits()));
        assert!(seen.contains(&Capability::SYS_ADMIN.bits()));
    }

    #[test]
    fn one_probe_of_the_highest_gives_the_same_drops_as_asking_for_each() {
        let probed: Vec<_> = DROPPED
            .iter()
            .map(|(cap, _)| *cap)
            .filter(|cap| rustix::thread::capability_is_in_bounding_set(*cap).is_ok())
            .collect();
        assert_eq!(bounding_to_drop(), probed);
    }
}
