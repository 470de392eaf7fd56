//! sluice: a transparent egress proxy for sandboxes.
//!
//! Module layout and dependency direction follow DESIGN.md ("Architecture"),
//! top to bottom:
//!
//! ```text
//! cli -> {app, daemon, demo} -> attach -> {enforce, netns, proxy, dns}
//!     -> {metrics, audit, timing} -> bundle -> policy
//! ```
//!
//! Nothing imports `cli`. `attach` turns each way in (host, oci, and next
//! vm) into an `Attachment` that one `prepare` enforces; `proxy` learns
//! sluice's internal addresses and its resolver only through its context.
//! `testbed` (throwaway topology, fast origin, load client) serves the demo,
//! the probe and the tests and is on no enforcement path. Small leaves that
//! any layer may use: `workload` (the path enum), `confine` (root check,
//! capabilities, descriptor limits), `report` (one-line errors). `policy`
//! and `bundle` import no tokio and no nftables.

pub mod app;
pub mod attach;
pub mod audit;
pub mod bundle;
pub mod cli;
pub mod confine;
pub mod daemon;
pub mod demo;
pub mod dns;
pub mod enforce;
pub mod metrics;
pub mod netns;
pub mod policy;
pub mod probe;
pub mod proxy;
pub mod reload;
pub mod report;
pub mod testbed;
pub mod timing;
pub mod workload;
