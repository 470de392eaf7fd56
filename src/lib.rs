//! sluice: a transparent egress proxy for sandboxes.
//!
//! Module layout and dependency direction follow DESIGN.md ("Architecture"),
//! top to bottom:
//!
//! ```text
//! cli -> {app, daemon, bench, demo} -> serve -> attach -> {enforce, netns, proxy, dns}
//!     -> {metrics, audit, timing} -> bundle -> policy
//! ```
//!
//! Nothing imports `cli`. `attach` turns each way in (host, oci, vm) into an `Attachment` that one `prepare` enforces; `serve` serves a
//! prepared sandbox (listeners, DNS, services, reloading) for `app` and
//! `daemon` alike, so neither imports the other; `proxy` learns
//! sluice's internal addresses and its resolver only through its context.
//! `doctor` (`sluice doctor`) asks the machine what each kind of workload
//! needs through those same modules, in throwaway namespaces, and changes
//! nothing.
//! `testbed` (throwaway topology, fast origin, load client) serves the demo,
//! the probe, `bench` and the tests and is on no enforcement path. `bench`
//! runs sluice, its peers and the native client side by side (the demo's
//! last step is a short run of it). `app` owns
//! shutdown: one deadline, which every long-lived task meets through
//! `drain`. Small leaves that any layer may use: `workload` (the path enum),
//! `outcome` (how a connection ended, which every record reads),
//! `sandbox_id` (the one rule for sandbox ids), `program` (a program on PATH),
//! `drain`, `confine` (root check, capabilities, descriptor limits),
//! `report` (one-line errors), `exit_class` (what kind of failure an error is). `policy`
//! and `bundle` import no tokio and no nftables.
//!
//! `unsafe` is forbidden in every module but the four where an API
//! demands it and no safe wrapper exists (nix, rustix, tokio): `confine`
//! (`child`: the one `pre_exec` hook, which runs a plain-data setup between
//! fork and exec, and tokio's `AsyncFd` registration; `mounts`:
//! mount_setattr),
//! `enforce::libnft` (every call into libnftables), `netns::tap` (the tun
//! driver's ioctls) and `probe::frame` (a `sockaddr_ll` for nix);
//! each says why it is sound, and clippy's
//! `undocumented_unsafe_blocks` is denied.

#[forbid(unsafe_code)]
pub(crate) mod app;
#[forbid(unsafe_code)]
pub(crate) mod attach;
#[forbid(unsafe_code)]
pub mod audit;
// `sluice bench` and its helpers: only in a build with the `bench` feature
// (on by default; the Debian package's build leaves it out).
#[cfg(feature = "bench")]
#[forbid(unsafe_code)]
pub mod bench;
#[forbid(unsafe_code)]
pub mod bundle;
#[forbid(unsafe_code)]
pub mod cli;
#[deny(unsafe_code)]
pub mod confine;
#[forbid(unsafe_code)]
pub mod daemon;
#[forbid(unsafe_code)]
pub(crate) mod demo;
#[forbid(unsafe_code)]
pub mod dhcp;
#[forbid(unsafe_code)]
pub mod dns;
#[forbid(unsafe_code)]
pub(crate) mod doctor;
#[forbid(unsafe_code)]
pub mod drain;
#[deny(unsafe_code)]
pub mod enforce;
#[forbid(unsafe_code)]
pub(crate) mod exit_class;
#[forbid(unsafe_code)]
pub mod intercept;
#[forbid(unsafe_code)]
pub mod mac;
#[forbid(unsafe_code)]
pub mod metrics;
#[forbid(unsafe_code)]
pub(crate) mod ndp;
#[deny(unsafe_code)]
pub mod netns;
#[forbid(unsafe_code)]
pub mod outcome;
#[forbid(unsafe_code)]
pub mod policy;
#[deny(unsafe_code)]
pub mod probe;
#[forbid(unsafe_code)]
pub(crate) mod program;
#[forbid(unsafe_code)]
pub mod proxy;
#[forbid(unsafe_code)]
pub mod reload;
#[forbid(unsafe_code)]
pub mod report;
#[forbid(unsafe_code)]
pub mod sandbox_id;
#[forbid(unsafe_code)]
pub(crate) mod secret;
#[forbid(unsafe_code)]
pub(crate) mod serve;
#[forbid(unsafe_code)]
pub mod testbed;
#[forbid(unsafe_code)]
pub mod timing;
#[forbid(unsafe_code)]
pub mod workload;
