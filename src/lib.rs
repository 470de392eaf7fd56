//! sluice: a transparent egress proxy for sandboxes.
//!
//! Module layout and dependency direction follow DESIGN.md:
//! cli -> app -> attach -> {enforce, netns, proxy, dns} -> {audit} -> bundle -> policy.
//! `policy` and `bundle` import no tokio and no nftables.

pub mod app;
pub mod attach;
pub mod audit;
pub mod bundle;
pub mod cli;
pub mod confine;
pub mod daemon;
pub mod demo;
pub mod dhcp;
pub mod dns;
pub mod enforce;
pub mod mac;
pub mod metrics;
pub mod netns;
pub mod policy;
pub mod probe;
pub mod proxy;
pub mod reload;
pub mod report;
pub mod timing;
