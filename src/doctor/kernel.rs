//! The checks of what the kernel and this process offer: root and
//! capabilities, a network namespace with sluice's table, libnftables and a
//! tap's fence, the seccomp filter, user namespaces, descriptors. What is
//! tried for real goes through sluice's own functions (`netns`, `enforce`,
//! `confine`) in a throwaway namespace or on a throwaway thread. Nothing
//! here ever runs in, or changes, the namespace sluice itself runs in, or
//! lasts beyond its check.

use rustix::thread::CapabilitySet;

use super::{bounded, Found};
use crate::enforce::{EnforceError, SandboxSpec};
use crate::netns::{NetnsError, SandboxNetns, TapOwner};

/// Ports the throwaway tables redirect to (nothing listens: no packet is
/// ever sent there).
const PROXY_PORT: u16 = 15001;
const DNS_PORT: u16 = 15053;
/// The throwaway tap `tap-fence` makes in its throwaway namespace.
const TAP: &str = "sluice-doctor0";

/// What the fix for a lack of root says.
const AS_ROOT: &str = "run sluice as root (sudo sluice ...)";

/// `root`: sluice's commands refuse to start without it.
pub(super) fn root() -> Found {
    match crate::confine::require_root("sluice") {
        Ok(()) => Found::Have("running as root (uid 0)".into()),
        Err(err) => Found::lack(
            format!("running as uid {}: {err}", nix::unistd::geteuid()),
            AS_ROOT,
        ),
    }
}

/// The capabilities sluice uses, with what for.
const CAPABILITIES: [(CapabilitySet, &str, &str); 3] = [
    (
        CapabilitySet::NET_ADMIN,
        "CAP_NET_ADMIN",
        "nftables tables, links, taps",
    ),
    (
        CapabilitySet::SYS_ADMIN,
        "CAP_SYS_ADMIN",
        "network, mount and PID namespaces",
    ),
    (
        CapabilitySet::SETPCAP,
        "CAP_SETPCAP",
        "dropping the workload's capabilities",
    ),
];

/// `capabilities`: root alone is not enough where a container or a unit
/// took capabilities away.
pub(super) fn capabilities() -> Found {
    let effective = match rustix::thread::capabilities(None) {
        Ok(sets) => sets.effective,
        Err(e) => {
            return Found::lack(
                format!("cannot read this process's capabilities: {e}"),
                AS_ROOT,
            )
        }
    };
    let lacking: Vec<String> = CAPABILITIES
        .iter()
        .filter(|(cap, _, _)| !effective.contains(*cap))
        .map(|(_, name, what)| format!("{name} ({what})"))
        .collect();
    if lacking.is_empty() {
        let names: Vec<&str> = CAPABILITIES.iter().map(|(_, name, _)| *name).collect();
        return Found::Have(format!("effective: {}", names.join(", ")));
    }
    let names: Vec<&str> = CAPABILITIES.iter().map(|(_, name, _)| *name).collect();
    Found::lack(
        format!("not effective: {}", lacking.join(", ")),
        format!(
            "{AS_ROOT} with {} (a container needs --cap-add for them, a systemd unit \
             CapabilityBoundingSet= and AmbientCapabilities= that include them)",
            names.join(", ")
        ),
    )
}

/// `netns` and `nftables`: a sandbox namespace made as `sluice run` makes
/// it (`lo`, the `sbx0` ifb link, default routes), and host mode's table
/// applied in it over netlink and read back. The namespace is freed with
/// its descriptor when the check ends.
pub(super) fn namespace_and_table() -> (Found, Found) {
    let made = bounded("a network namespace", || {
        let ns = SandboxNetns::create()?;
        let table = ns.run_in(|| {
            crate::enforce::apply_and_verify(&SandboxSpec::host(PROXY_PORT, DNS_PORT))
        })?;
        Ok::<_, NetnsError>(table)
    });
    match made {
        Err(why) => (
            Found::lack(why.clone(), "see the detail"),
            Found::lack(format!("not checked: {why}"), "see the detail"),
        ),
        Ok(Err(err)) => {
            let fix = netns_fix(&err);
            (
                Found::lack(err.to_string(), fix),
                Found::lack(
                    "not checked: no network namespace could be made (see netns)",
                    fix,
                ),
            )
        }
        Ok(Ok(table)) => (
            Found::Have(
                "a sandbox namespace (lo, the sbx0 ifb link, default routes) can be made".into(),
            ),
            match table {
                Ok(()) => Found::Have(
                    "the inet sluice table applies over netlink and reads back in a throwaway namespace"
                        .into(),
                ),
                Err(err) => Found::lack(err.to_string(), enforce_fix(&err)),
            },
        ),
    }
}

/// `libnftables`: the library a tap's fence and the drop counters go
/// through (`nft` itself is never run).
pub(super) fn libnftables() -> Found {
    match crate::enforce::libnftables_loads() {
        Ok(()) => {
            Found::Have("libnftables.so.1 loads (the nft program itself is not needed)".into())
        }
        Err(err) => {
            let detail = format!(
                "{err}; host sandboxes run without it, but report no drop counts (sluice_dropped_packets_total, the summary at exit)"
            );
            Found::lack(detail, enforce_fix(&err))
        }
    }
}

/// `tap-fence`: a tap made as `sluice vm` makes it, in a throwaway
/// namespace, and its fence (the netdev family's ingress chain and the
/// inet table, through libnftables) applied and read back. The tap goes
/// with the namespace.
pub(super) fn tap_fence() -> Found {
    #[derive(Debug)]
    enum Failed {
        Netns(NetnsError),
        Enforce(EnforceError),
    }
    let fenced = bounded("a tap's fence", || {
        let ns = SandboxNetns::create().map_err(Failed::Netns)?;
        ns.create_tap(TAP, TapOwner { uid: 0, gid: 0 }, &[])
            .map_err(Failed::Netns)?;
        let spec = SandboxSpec::vm(PROXY_PORT, DNS_PORT, crate::enforce::example_fence(TAP));
        ns.run_in(move || crate::enforce::apply_and_verify(&spec))
            .map_err(Failed::Netns)?
            .map_err(Failed::Enforce)
    });
    match fenced {
        Ok(Ok(())) => Found::Have(
            "a tap can be made and its fence (netdev ingress and inet tables) applies and reads back"
                .into(),
        ),
        Ok(Err(Failed::Netns(err @ NetnsError::Tap { .. }))) => Found::lack(
            err.to_string(),
            "modprobe tun (the tun driver and /dev/net/tun)",
        ),
        Ok(Err(Failed::Netns(err))) => Found::lack(err.to_string(), netns_fix(&err)),
        Ok(Err(Failed::Enforce(err))) => Found::lack(err.to_string(), enforce_fix(&err)),
        Err(why) => Found::lack(why, "see the detail"),
    }
}

/// `seccomp`: the workload's filter, built and installed on a throwaway
/// thread (a filter is per thread; it ends with it).
pub(super) fn seccomp() -> Found {
    let installed = bounded("the seccomp filter", || {
        let filters = crate::confine::seccomp::build().map_err(|e| e.to_string())?;
        let last = filters.install_in_init().map_err(|e| e.to_string())?;
        last.install_in_child().map_err(|errno| {
            format!(
                "cannot install the workload's last seccomp filter: {}",
                std::io::Error::from_raw_os_error(errno)
            )
        })
    });
    match installed {
        Ok(Ok(())) => Found::Have("the workload's seccomp filter installs".into()),
        Ok(Err(why)) | Err(why) => Found::lack(
            why,
            "a kernel with seccomp filters (CONFIG_SECCOMP_FILTER=y, as Debian's)",
        ),
    }
}

/// The sysctl that bounds user namespaces.
const MAX_USER_NAMESPACES: &str = "/proc/sys/user/max_user_namespaces";

/// `user-namespaces`: sluice itself does not make any; rootless podman and
/// containers run with `--userns` do.
pub(super) fn user_namespaces() -> Found {
    match std::fs::read_to_string(MAX_USER_NAMESPACES) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(0) => Found::lack(
                format!("{MAX_USER_NAMESPACES} is 0: containers with --userns (and rootless podman) cannot start; sluice itself makes none"),
                "sysctl -w user.max_user_namespaces=15000",
            ),
            Ok(n) => Found::Have(format!("up to {n} (sluice itself makes none; podman --userns does)")),
            Err(_) => Found::lack(
                format!("{MAX_USER_NAMESPACES} reads {:?}", text.trim()),
                "sysctl -w user.max_user_namespaces=15000",
            ),
        },
        Err(e) => Found::lack(
            format!("cannot read {MAX_USER_NAMESPACES}: {e} (a kernel without user namespaces?)"),
            "a kernel with CONFIG_USER_NS=y (Debian's has it)",
        ),
    }
}

/// `descriptors`: whether the hard RLIMIT_NOFILE (sluice raises its soft
/// limit to it) holds `asked` connections at once, sluice's default if
/// none, at `confine::fds`' budget per connection.
pub(super) fn descriptors(asked: Option<usize>) -> Found {
    use nix::sys::resource::{getrlimit, Resource};
    let hard = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((_, hard)) => hard,
        Err(e) => return Found::lack(format!("cannot read RLIMIT_NOFILE: {e}"), "see the detail"),
    };
    let fits = crate::confine::fds::connections_within(hard);
    let wanted = asked.unwrap_or_else(|| crate::proxy::Limits::default().max_connections);
    let per = crate::confine::fds::PER_CONNECTION;
    let which = match asked {
        Some(_) => "--max-connections",
        None => "sluice's default --max-connections",
    };
    if fits >= wanted {
        return Found::Have(format!(
            "the hard RLIMIT_NOFILE, {hard}, holds {fits} connections at once at {per} descriptors each ({wanted}: {which})"
        ));
    }
    let need = descriptors_for(wanted);
    Found::lack(
        format!(
            "the hard RLIMIT_NOFILE, {hard}, holds {fits} connections at once at {per} descriptors each, fewer than {wanted} ({which}): sluice relays {fits} at a time and the rest wait"
        ),
        format!(
            "raise the hard limit to {need} where sluice starts: `ulimit -Hn {need}` (as root) in its shell, \
             LimitNOFILE={need} in its systemd unit, or `prlimit --nofile={need}:{need} sluice ...`"
        ),
    )
}

/// The smallest descriptor limit that holds `connections` at once, as
/// `confine::fds` counts them.
fn descriptors_for(connections: usize) -> u64 {
    let (mut low, mut high) = (0u64, u64::MAX);
    while low < high {
        let mid = low + (high - low) / 2;
        if crate::confine::fds::connections_within(mid) >= connections {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    low
}

/// The fix for a namespace that cannot be made.
fn netns_fix(err: &NetnsError) -> &'static str {
    match err {
        NetnsError::CreatePermission | NetnsError::EnterPermission { .. } => {
            "run sluice as root (sudo sluice ...), with CAP_SYS_ADMIN"
        }
        NetnsError::Create(_) => "a kernel with network namespaces (CONFIG_NET_NS=y, as Debian's)",
        NetnsError::Netlink { .. } => "modprobe ifb (the sandbox's sbx0 link is an ifb)",
        NetnsError::Tap { .. } => "modprobe tun (the tun driver and /dev/net/tun)",
        _ => "see the detail",
    }
}

/// The fix for a table that cannot be applied or read back.
fn enforce_fix(err: &EnforceError) -> &'static str {
    match err {
        EnforceError::NftNotFound(_) => "apt-get install nftables (it brings libnftables1)",
        EnforceError::StaticBuild => {
            "use the dynamically linked build of sluice (cargo build --release)"
        }
        EnforceError::Netlink(_) | EnforceError::Exchange(_) => {
            "modprobe nf_tables (a kernel with CONFIG_NF_TABLES, as Debian's)"
        }
        EnforceError::Apply { .. } => {
            "a kernel with nf_tables' inet and netdev families and nat (modprobe nf_tables nft_chain_nat)"
        }
        EnforceError::Permission { .. } => {
            "run sluice as root (sudo sluice ...), with CAP_NET_ADMIN"
        }
        EnforceError::Descriptors(_) => "Linux 5.9 or later (close_range)",
        EnforceError::Mismatch(_) => {
            "report it; meanwhile SLUICE_TABLE_VIA=libnftables sends host tables through libnftables"
        }
        _ => "see the detail",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptors_asked_for_are_the_least_that_hold_the_connections() {
        for n in [1, 128, 4096] {
            let need = descriptors_for(n);
            assert!(crate::confine::fds::connections_within(need) >= n);
            assert!(crate::confine::fds::connections_within(need - 1) < n);
        }
    }

    #[test]
    fn a_limit_too_low_for_the_connections_asked_says_how_many_descriptors_fix_it() {
        let Found::Lack { detail, fix } = descriptors(Some(usize::MAX)) else {
            panic!("no limit holds that many connections");
        };
        assert!(detail.contains("--max-connections"), "{detail}");
        assert!(fix.contains("LimitNOFILE="), "{fix}");
    }
}
