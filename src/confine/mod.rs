//! How the workload's process is confined, and what sluice's own process
//! needs for that: root, a reduced capability set for the workload, and the
//! descriptor limits of both. A leaf module: it imports nothing of sluice's,
//! so every command and attach path can use it.

pub mod caps;
pub mod fds;

/// Fail early, with what to do, instead of a confusing EPERM later.
pub fn require_root(what: &str) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!(
            "{what} needs root (it creates a network namespace and nftables rules): run it with sudo or as root"
        );
    }
    Ok(())
}
