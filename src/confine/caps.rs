//! The capabilities a workload never keeps, even as root.

/// Capabilities the workload can never have, even as root: those that
/// reach around a network namespace (setns into another one, ptrace of
/// sluice, the sandbox's own ruleset) or around the kernel (modules, raw
/// I/O and device nodes, BPF, file handles). Dropped from the bounding set,
/// so no setuid program gives them back. CAP_NET_RAW stays: raw sockets are
/// dropped by the ruleset like any other non-TCP traffic.
const ESCAPE_CAPABILITIES: [(libc::c_ulong, &str); 13] = [
    (2, "CAP_DAC_READ_SEARCH"),
    (12, "CAP_NET_ADMIN"),
    (16, "CAP_SYS_MODULE"),
    (17, "CAP_SYS_RAWIO"),
    (19, "CAP_SYS_PTRACE"),
    (21, "CAP_SYS_ADMIN"),
    (22, "CAP_SYS_BOOT"),
    (27, "CAP_MKNOD"),
    (32, "CAP_MAC_OVERRIDE"),
    (33, "CAP_MAC_ADMIN"),
    (38, "CAP_PERFMON"),
    (39, "CAP_BPF"),
    (40, "CAP_CHECKPOINT_RESTORE"),
];

/// Runs in the forked child before exec (async-signal-safe: prctl only).
pub fn drop_escape_capabilities() -> std::io::Result<()> {
    for (cap, _name) in ESCAPE_CAPABILITIES {
        // SAFETY: PR_CAPBSET_DROP takes an integer capability and no memory.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        // EINVAL: a capability this kernel does not know; nothing to drop.
        if rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
