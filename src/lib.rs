//! sluice: a transparent egress proxy for sandboxes.
//!
//! Module layout and dependency direction follow DESIGN.md:
//! cli -> app -> attach -> {enforce, netns, proxy, dns} -> {audit} -> bundle -> policy.
//! `policy` and `bundle` import no tokio and no nftables.

#[cfg(sluice_wip)]
pub mod app;
#[cfg(sluice_wip)]
pub mod attach;
pub mod audit;
#[cfg(sluice_wip)]
pub mod bundle;
#[cfg(sluice_wip)]
pub mod cli;
#[cfg(sluice_wip)]
pub mod demo;
pub mod dns;
pub mod enforce;
pub mod netns;
pub mod policy;
#[cfg(sluice_wip)]
pub mod probe;
pub mod proxy;
