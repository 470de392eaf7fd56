//! The workload's seccomp filter: the system calls a sandboxed program has
//! no business making, refused with EPERM (never a kill, so programs fail
//! the way they do without the privilege). This module owns the list and
//! installs it; it must never allow anything: every filter here can only
//! refuse more, and a filter, once installed, stays for the workload and
//! every process it starts.
//!
//! The filters are built with `seccompiler` (Firecracker's). Syscall
//! numbers come from `libc` for the architecture sluice is compiled for
//! (x86_64 or aarch64); a system call of another ABI (a 32-bit program, or
//! `int 0x80` on x86_64) is killed by seccompiler's architecture check,
//! because its numbers are not the ones listed here. docs/enforcement.md
//! lists every refused call with why.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("sluice's seccomp filter lists system calls for x86_64 and aarch64 only");

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

/// Errors from building or installing the filter.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} the workload's seccomp filter: {cause}")]
pub(crate) struct SeccompError {
    what: &'static str,
    cause: String,
}

fn not_built(cause: impl std::fmt::Display) -> SeccompError {
    SeccompError {
        what: "build",
        cause: cause.to_string(),
    }
}

/// System calls refused outright, with why (docs/enforcement.md says more).
const REFUSED: &[(libc::c_long, &str)] = &[
    // Other processes: reading, writing or borrowing from them.
    (libc::SYS_ptrace, "tracing another process"),
    (
        libc::SYS_process_vm_readv,
        "reading another process's memory",
    ),
    (
        libc::SYS_process_vm_writev,
        "writing another process's memory",
    ),
    (
        libc::SYS_pidfd_getfd,
        "borrowing another process's descriptors",
    ),
    (libc::SYS_kcmp, "comparing other processes' descriptors"),
    (
        libc::SYS_process_madvise,
        "advising on another process's memory",
    ),
    // The kernel itself.
    (libc::SYS_kexec_load, "replacing the running kernel"),
    (libc::SYS_kexec_file_load, "replacing the running kernel"),
    (libc::SYS_reboot, "rebooting the host"),
    (libc::SYS_init_module, "loading kernel code"),
    (libc::SYS_finit_module, "loading kernel code"),
    (libc::SYS_delete_module, "unloading kernel code"),
    (libc::SYS_bpf, "BPF programs in the kernel"),
    (
        libc::SYS_perf_event_open,
        "kernel and hardware performance events",
    ),
    (
        libc::SYS_userfaultfd,
        "stalling the kernel on a page fault (exploit aid)",
    ),
    (libc::SYS_keyctl, "the kernel keyring, shared with the host"),
    (
        libc::SYS_add_key,
        "the kernel keyring, shared with the host",
    ),
    (
        libc::SYS_request_key,
        "the kernel keyring, shared with the host",
    ),
    (
        libc::SYS_io_uring_setup,
        "io_uring, whose operations seccomp cannot see",
    ),
    (
        libc::SYS_io_uring_enter,
        "io_uring, whose operations seccomp cannot see",
    ),
    (
        libc::SYS_io_uring_register,
        "io_uring, whose operations seccomp cannot see",
    ),
    (
        libc::SYS_open_by_handle_at,
        "opening files by handle, around the mounts",
    ),
    (libc::SYS_acct, "process accounting to a host file"),
    (libc::SYS_swapon, "the host's swap"),
    (libc::SYS_swapoff, "the host's swap"),
    (libc::SYS_syslog, "the kernel log"),
    (libc::SYS_vhangup, "hanging up terminals"),
    // Mounts: the workload's view of sluice's files and of /proc and /sys.
    (libc::SYS_mount, "changing the mounts"),
    (libc::SYS_umount2, "changing the mounts"),
    (libc::SYS_pivot_root, "changing the mounts"),
    (libc::SYS_fsopen, "changing the mounts"),
    (libc::SYS_fsconfig, "changing the mounts"),
    (libc::SYS_fsmount, "changing the mounts"),
    (libc::SYS_fspick, "changing the mounts"),
    (libc::SYS_move_mount, "changing the mounts"),
    (libc::SYS_open_tree, "changing the mounts"),
    (libc::SYS_mount_setattr, "changing the mounts"),
    // Namespaces: joining one (setns) is refused whatever the flags.
    (libc::SYS_setns, "joining another namespace"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_iopl, "raw I/O ports"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_ioperm, "raw I/O ports"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_modify_ldt, "16-bit segments (exploit aid)"),
    #[cfg(target_arch = "x86_64")]
    (libc::SYS_uselib, "obsolete library loading"),
];

/// Namespace flags of unshare(2) and clone(2): a namespace the workload
/// made would be one it controls (a user namespace with every capability,
/// a network namespace without sluice's rules).
const NAMESPACE_FLAGS: [libc::c_int; 8] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    // CLONE_NEWTIME; clone(2) cannot take it (its low byte is the exit
    // signal), unshare(2) can.
    0x80,
];

/// ioctl(2) requests refused on any descriptor: pushing characters into a
/// terminal's input (the shell that started sluice runs them after it
/// exits), and the console's paste and other subcommands.
const REFUSED_IOCTLS: [(libc::c_ulong, &str); 2] = [
    (libc::TIOCSTI, "typing into a terminal"),
    (libc::TIOCLINUX, "the virtual console's paste and selection"),
];

/// The socket families a sandboxed program may create: local sockets, IP
/// (which sluice's rules steer), and netlink (read the namespace's own
/// links and routes). Packet sockets skip nftables' output hooks; vsock
/// reaches the hypervisor's host, which no network namespace contains;
/// the rest are kernel attack surface.
const SOCKET_FAMILIES: [libc::c_int; 4] = [
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];

/// personality(2) values a program may set: the default, 32-bit uname, and
/// the query (0xffffffff). Others reopen old holes (READ_IMPLIES_EXEC,
/// ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO).
const PERSONALITIES: [u64; 5] = [0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

/// Every filter, built; installed in two steps (see [`Filters::install_in_init`]).
pub(crate) struct Filters {
    /// Every refusal but setns(2).
    early: Vec<BpfProgram>,
    /// setns(2) alone.
    last: BpfProgram,
}

/// The filter the workload's process still adds between fork and exec:
/// what [`Filters::install_in_init`] leaves, and the only way to get it.
pub(crate) struct LastFilter(BpfProgram);

/// Build every filter (done in the init, before the workload is forked).
pub(crate) fn build() -> Result<Filters, SeccompError> {
    let refused = refuse(refused_rules()?, libc::EPERM)?;
    // glibc falls back to clone(2), whose flags the filter above can see,
    // only when clone3 fails with ENOSYS: clone3's flags sit in memory
    // that seccomp cannot read.
    let clone3 = refuse(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        libc::ENOSYS,
    )?;
    let mut early = vec![clone3, refused];
    #[cfg(target_arch = "x86_64")]
    early.push(x32_guard());
    let last = refuse(
        [(libc::SYS_setns, Vec::new())].into_iter().collect(),
        libc::EPERM,
    )?;
    Ok(Filters { early, last })
}

impl Filters {
    /// Install every filter but setns(2)'s on the calling thread: the
    /// init's, before sluice's go, so that the kernel's check of the long
    /// filter (about 0.2 ms) is not on the start's longest path. The init
    /// runs under them from then on, which it can: after its mounts it
    /// makes none of the calls they refuse, but the setns(2) into the
    /// sandbox's namespace at the go, which [`LastFilter`] refuses in the
    /// workload's process. The workload gets every filter either way: it
    /// inherits these, and it can be confined only with the `LastFilter`
    /// that this returns. seccompiler sets no_new_privs first, so a setuid
    /// or file-capability program in the sandbox gains nothing.
    pub(crate) fn install_in_init(self) -> Result<LastFilter, SeccompError> {
        for program in &self.early {
            seccompiler::apply_filter(program).map_err(|e| SeccompError {
                what: "install",
                cause: e.to_string(),
            })?;
        }
        Ok(LastFilter(self.last))
    }
}

impl LastFilter {
    /// Install the last filter on the calling thread: the workload's
    /// process, between fork and exec (see `child`), so nothing here
    /// allocates; a failure is its errno.
    pub(crate) fn install_in_child(&self) -> Result<(), i32> {
        seccompiler::apply_filter(&self.0).map_err(|e| match e {
            seccompiler::Error::Prctl(e) | seccompiler::Error::Seccomp(e) => {
                e.raw_os_error().unwrap_or(libc::EINVAL)
            }
            _ => libc::EINVAL,
        })
    }
}

fn refuse(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    errno: libc::c_int,
) -> Result<BpfProgram, SeccompError> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        ARCH,
    )
    .map_err(not_built)?;
    filter.try_into().map_err(not_built)
}

fn refused_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let cond = |arg, op, value| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(not_built)
    };
    let rule = |conditions| SeccompRule::new(conditions).map_err(not_built);

    // setns(2) is the last filter's (see `Filters::install_in_init`).
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = REFUSED
        .iter()
        .filter(|(nr, _why)| *nr != libc::SYS_setns)
        .map(|(nr, _why)| (*nr, Vec::new()))
        .collect();
    let namespace_rules = |arg, flags: &[libc::c_int]| -> Result<Vec<SeccompRule>, SeccompError> {
        flags
            .iter()
            .map(|&f| {
                let f = f as u32 as u64;
                rule(vec![cond(arg, SeccompCmpOp::MaskedEq(f), f)?])
            })
            .collect()
    };
    rules.insert(libc::SYS_unshare, namespace_rules(0, &NAMESPACE_FLAGS)?);
    rules.insert(
        libc::SYS_clone,
        namespace_rules(0, &NAMESPACE_FLAGS[..NAMESPACE_FLAGS.len() - 1])?,
    );
    // The request is compared as 32 bits, as the kernel's tty code does
    // (bubblewrap and flatpak mask it the same way): high bits set in a
    // 64-bit argument do not hide TIOCSTI.
    rules.insert(
        libc::SYS_ioctl,
        REFUSED_IOCTLS
            .iter()
            .map(|(request, _why)| rule(vec![cond(1, SeccompCmpOp::Eq, *request as u32 as u64)?]))
            .collect::<Result<_, _>>()?,
    );
    rules.insert(
        libc::SYS_socket,
        vec![rule(
            SOCKET_FAMILIES
                .iter()
                .map(|&family| cond(0, SeccompCmpOp::Ne, family as u64))
                .collect::<Result<_, _>>()?,
        )?],
    );
    rules.insert(
        libc::SYS_personality,
        vec![rule(
            PERSONALITIES
                .iter()
                .map(|&p| cond(0, SeccompCmpOp::Ne, p))
                .collect::<Result<_, _>>()?,
        )?],
    );
    Ok(rules)
}

/// On x86_64 kernels built with the x32 ABI, a system call number with bit
/// 30 set is the x32 variant of a call and carries the x86_64 audit
/// architecture, so the number-by-number filter above would not see it.
/// seccompiler has no rule on a range of numbers, so this four-instruction
/// filter is written by hand: every x32 call fails with ENOSYS (as on a
/// kernel without x32).
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let op = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        // seccomp_data.nr is at offset 0; the other filters check the arch.
        op(LD_W_ABS, 0, 0, 0),
        op(JSET_K, 0, 1, X32_SYSCALL_BIT),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// For docs and tests: every refused call's name and why.
#[cfg(test)]
pub(crate) fn refused_calls() -> Vec<(&'static str, &'static str)> {
    let mut calls: Vec<(&str, &str)> = REFUSED
        .iter()
        .map(|(nr, why)| (syscall_name(*nr), *why))
        .collect();
    calls.push((
        "unshare/clone with a namespace flag",
        "a namespace the workload controls",
    ));
    calls.push(("clone3 (ENOSYS)", "its flags are out of seccomp's sight"));
    calls.push(("ioctl TIOCSTI, TIOCLINUX", "typing into a terminal"));
    calls.push((
        "socket outside AF_UNIX/INET/INET6/NETLINK",
        "packet, vsock and other families",
    ));
    calls.push(("personality other than the default", "old exploit aids"));
    calls
}

#[cfg(test)]
fn syscall_name(nr: libc::c_long) -> &'static str {
    // Only for messages; the list is short.
    macro_rules! names {
        ($($name:ident),* $(,)?) => {
            $( if nr == libc::$name { return &stringify!($name)[4..]; } )*
        };
    }
    names!(
        SYS_ptrace,
        SYS_process_vm_readv,
        SYS_process_vm_writev,
        SYS_pidfd_getfd,
        SYS_kcmp,
        SYS_process_madvise,
        SYS_kexec_load,
        SYS_kexec_file_load,
        SYS_reboot,
        SYS_init_module,
        SYS_finit_module,
        SYS_delete_module,
        SYS_bpf,
        SYS_perf_event_open,
        SYS_userfaultfd,
        SYS_keyctl,
        SYS_add_key,
        SYS_request_key,
        SYS_io_uring_setup,
        SYS_io_uring_enter,
        SYS_io_uring_register,
        SYS_open_by_handle_at,
        SYS_acct,
        SYS_swapon,
        SYS_swapoff,
        SYS_syslog,
        SYS_vhangup,
        SYS_mount,
        SYS_umount2,
        SYS_pivot_root,
        SYS_fsopen,
        SYS_fsconfig,
        SYS_fsmount,
        SYS_fspick,
        SYS_move_mount,
        SYS_open_tree,
        SYS_mount_setattr,
        SYS_setns,
    );
    #[cfg(target_arch = "x86_64")]
    names!(SYS_iopl, SYS_ioperm, SYS_modify_ldt, SYS_uselib);
    "?"
}

impl crate::exit_class::Classified for SeccompError {
    /// The seccomp filter could not be built or installed.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::CannotEnforce
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_build_for_this_architecture() {
        let filters = build().unwrap();
        assert!(filters.early.len() >= 2);
        assert!(filters.early.iter().all(|p| !p.is_empty()));
        assert!(!filters.last.is_empty());
    }

    #[test]
    fn every_refused_call_has_a_name_and_a_reason() {
        for (name, why) in refused_calls() {
            assert_ne!(name, "?", "a refused call without a name ({why})");
            assert!(!why.is_empty(), "{name}");
        }
    }
}
