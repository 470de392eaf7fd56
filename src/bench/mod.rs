//! `sluice bench`: the published native-vs-proxied method as one command.
//! It builds a throwaway topology (an outer namespace holding the fast
//! origin and a live service the policy forbids), prepares each condition
//! (`condition`, `peers`), and runs rounds: `--warmups` first, then
//! `--batches` formal ones, the condition order shuffled every round with
//! a seeded generator. In each round every condition starts a fresh client
//! session (`session`), runs the deny check and every workload
//! (`workload`), and exits; the bench notes the proxy's CPU time around
//! each workload and the session's start and exit times. `stats` turns the
//! rounds into the report's numbers, `report` and `plot` write them.
//!
//! What it must never do: touch anything outside its own namespaces and
//! temp dir (everything is removed on success, failure and Ctrl-C alike),
//! let a failed batch contribute latency, or carry on past a content check
//! that failed: that ends the run with an error.

pub(crate) mod calibration;
pub(crate) mod client;
pub(crate) mod condition;
mod interrupt;
pub(crate) mod peers;
pub(crate) mod plot;
pub(crate) mod progress;
mod provision;
pub(crate) mod reference;
pub mod report;
pub(crate) mod scale;
pub(crate) mod scale_run;
pub(crate) mod session;
pub(crate) mod stats;
pub(crate) mod vm;
pub(crate) mod workload;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub use condition::ConditionKind;
pub(crate) use workload::Metric;
pub use workload::Workload;

use client::Reply;
use progress::Progress;

/// The origin every condition's client fetches from.
pub(crate) const ORIGIN: &str = "198.18.0.1:8080";
/// A live service the policy forbids (the deny check's target).
pub(crate) const FORBIDDEN: &str = "198.18.0.2:9090";
/// The origin over TLS (the `tls` and `l7` workloads), with a certificate
/// for both names below.
pub(crate) const TLS_ORIGIN: &str = "198.18.0.1:8443";
/// The name the `tls` workload asks for: its rule admits it by SNI.
pub(crate) const TLS_NAME: &str = "tls.bench.test";
/// The name the `l7` workload asks for: its rule decides requests and
/// injects a credential.
pub(crate) const L7_NAME: &str = "l7.bench.test";
/// The header the `l7` rule injects, and the bench secret's value.
pub(crate) const L7_HEADER: &str = "Authorization";
pub(crate) const L7_SECRET: &str = "bench-token-not-a-secret";

/// The origin over HTTP and nothing else (`bench-scale`'s policy).
pub(crate) const PLAIN_POLICY: &str = "version: 1
name: bench
rules:
  - name: origin
    action: allow
    cidrs: [\"198.18.0.1/32\"]
    ports: [8080]
dns:
  upstream: []
";

/// The policy sluice enforces in the bench: the origin over HTTP, over
/// TLS by SNI, and over TLS with every request decided and a credential
/// (read from `secret_file`) injected; nothing else.
pub(crate) fn policy(secret_file: &Path) -> String {
    format!(
        "version: 1
name: bench
secrets:
  - name: token
    file: {secret}
rules:
  - name: origin
    action: allow
    cidrs: [\"198.18.0.1/32\"]
    ports: [8080]
  - name: tls-origin
    action: allow
    hosts: [\"{TLS_NAME}\"]
    ports: [8443]
  - name: l7-origin
    action: allow
    hosts: [\"{L7_NAME}\"]
    ports: [8443]
    http:
      - methods: [GET]
        paths: [\"/bytes/*\"]
    inject:
      - header: {L7_HEADER}
        value: \"Bearer {{{{token}}}}\"
dns:
  upstream: []
  hosts:
    {TLS_NAME}: [\"198.18.0.1\"]
    {L7_NAME}: [\"198.18.0.1\"]
",
        secret = secret_file.display()
    )
}

/// Upper bounds of a plan.
pub(crate) const MAX_CONNS: usize = 100_000;
pub(crate) const MAX_THREADS: usize = 1024;
pub(crate) const MAX_ROUNDS: usize = 10_000;

/// Why a bench run failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BenchError {
    #[error("{0}")]
    BadPlan(String),
    #[error("cannot set up the bench: {what}: {cause}")]
    Setup { what: String, cause: String },
    #[error("cannot start {what} ({program}): {cause}")]
    Spawn {
        what: String,
        program: String,
        #[source]
        cause: std::io::Error,
    },
    #[error("the {what} session failed: {problem}{}", if stderr.is_empty() { String::new() } else { format!("; its stderr ended with:\n{stderr}") })]
    Session {
        what: String,
        problem: String,
        stderr: String,
    },
    #[error("content check failed under {condition}, {workload}: {detail}; the run is void (a proxy that changes bytes must not be timed)")]
    Content {
        condition: ConditionKind,
        workload: &'static str,
        detail: String,
    },
    #[error("{failed} of {total} deny checks failed ({first}); the report says which")]
    DenyFailed {
        failed: usize,
        total: usize,
        first: String,
    },
    #[error("cannot write {}: {cause}", path.display())]
    Output {
        path: PathBuf,
        #[source]
        cause: std::io::Error,
    },
    #[error(transparent)]
    Plot(#[from] crate::timing::PlotError),
    #[error("interrupted: stopped every session and removed the bench's namespaces and files")]
    Interrupted,
}

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) conditions: Vec<ConditionKind>,
    pub(crate) workloads: Vec<Workload>,
    pub(crate) batches: usize,
    pub(crate) warmups: usize,
    pub(crate) conns: usize,
    pub(crate) threads: usize,
    pub(crate) seed: u64,
    /// The image the `oci` condition runs the client in.
    pub(crate) image: String,
    /// Build the oci image or the guest kit when missing, rather than
    /// skip the condition.
    pub(crate) build_missing: bool,
}

impl Plan {
    /// Refuse what cannot give a meaningful report.
    pub(crate) fn check(&self) -> Result<(), BenchError> {
        if !self.conditions.contains(&ConditionKind::Native) {
            return Err(BenchError::BadPlan(
                "--conditions must include native: every ratio and paired difference is to native"
                    .into(),
            ));
        }
        if self.batches < 2 {
            return Err(BenchError::BadPlan(
                "--batches must be 2 or more: a paired difference needs two rounds".into(),
            ));
        }
        // Bounds that keep a run's memory and its replies' size in reason.
        if !(1..=MAX_CONNS).contains(&self.conns) || !(1..=MAX_THREADS).contains(&self.threads) {
            return Err(BenchError::BadPlan(format!(
                "--conns must be 1 to {MAX_CONNS} and --threads 1 to {MAX_THREADS}"
            )));
        }
        if self.batches > MAX_ROUNDS || self.warmups > MAX_ROUNDS {
            return Err(BenchError::BadPlan(format!(
                "--batches and --warmups must be at most {MAX_ROUNDS}"
            )));
        }
        Ok(())
    }
}

/// The throwaway world of one run: the outer namespace (origin and the
/// forbidden service on its loopback), the policy, a temp dir for sluice's
/// records and the peers' configs, and the sluice binary that runs it all.
pub(crate) struct Testbed {
    pub(crate) outer: crate::testbed::OuterNetns,
    pub(crate) dir: PathBuf,
    pub(crate) policy: PathBuf,
    pub(crate) exe: PathBuf,
    /// The TLS origin's CA and certificate (haproxy serves the same one).
    pub(crate) pki: crate::testbed::tls::TestPki,
    /// `pki`'s CA, for `--upstream-ca` and haproxy's `ca-file`.
    pub(crate) ca_file: PathBuf,
    forbidden_hits: Arc<AtomicU64>,
    /// Requests the TLS origin saw carrying the `l7` rule's header.
    injected_seen: Arc<AtomicU64>,
}

impl Testbed {
    pub(crate) fn create() -> Result<Testbed, BenchError> {
        let setup = |what: &str| {
            let what = what.to_string();
            move |e: anyhow::Error| BenchError::Setup {
                what,
                cause: format!("{e:#}"),
            }
        };
        let exe =
            std::env::current_exe().map_err(|e| setup("finding the sluice binary")(e.into()))?;
        let origin: SocketAddr = ORIGIN.parse().expect("literal");
        let forbidden: SocketAddr = FORBIDDEN.parse().expect("literal");
        let addrs: Vec<IpAddr> = vec![origin.ip(), forbidden.ip()];
        let outer = crate::testbed::OuterNetns::create("sluice-bench", &addrs)
            .map_err(setup("creating the outer namespace"))?;
        let dir = std::env::temp_dir().join(outer.name());
        std::fs::create_dir_all(&dir).map_err(|e| BenchError::Output {
            path: dir.clone(),
            cause: e,
        })?;
        let pki = crate::testbed::tls::TestPki::issue(&[TLS_NAME, L7_NAME])
            .map_err(|e| setup("issuing the TLS origin's certificate")(e.into()))?;
        let bed = Testbed {
            policy: dir.join("policy.yaml"),
            ca_file: dir.join("origin-ca.pem"),
            dir,
            exe,
            pki,
            forbidden_hits: Arc::new(AtomicU64::new(0)),
            injected_seen: Arc::new(AtomicU64::new(0)),
            outer,
        };
        let secret = bed.dir.join("token");
        for (path, text) in [
            (&secret, format!("{L7_SECRET}\n")),
            (&bed.policy, policy(&secret)),
            (&bed.ca_file, bed.pki.ca_pem.clone()),
        ] {
            std::fs::write(path, text).map_err(|e| BenchError::Output {
                path: path.clone(),
                cause: e,
            })?;
        }
        bed.outer
            .http_origin(origin)
            .map_err(setup("starting the origin"))?;
        let reference: SocketAddr = reference::REFERENCE_ORIGIN.parse().expect("literal");
        bed.outer
            .run_in(move || reference::serve(std::net::TcpListener::bind(reference)?))
            .and_then(|started| Ok(started?))
            .map_err(setup("starting the reference origin"))?;
        let injected = bed.injected_seen.clone();
        let seen = move |head: &str| {
            if carries_injected_header(head) {
                injected.fetch_add(1, Ordering::SeqCst);
            }
        };
        bed.tls_origin(&bed.outer, Arc::new(seen))
            .map_err(setup("starting the TLS origin"))?;
        let listener = bed
            .outer
            .run_in(move || std::net::TcpListener::bind(forbidden))
            .and_then(|bound| Ok(bound?))
            .map_err(setup("starting the forbidden service"))?;
        let hits = bed.forbidden_hits.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                hits.fetch_add(1, Ordering::SeqCst);
                let _ = stream.write_all(client::FORBIDDEN_BANNER);
            }
        });
        Ok(bed)
    }

    /// Start the TLS origin ([`TLS_ORIGIN`], with `pki`'s certificate) in
    /// `ns`, giving `seen` every request head.
    pub(crate) fn tls_origin(
        &self,
        ns: &crate::testbed::OuterNetns,
        seen: Arc<dyn Fn(&str) + Send + Sync>,
    ) -> anyhow::Result<()> {
        let config = self.pki.server_config()?;
        ns.https_origin(TLS_ORIGIN.parse().expect("literal"), config, seen)
    }

    /// Requests with the `l7` rule's injected header the TLS origin saw so
    /// far.
    pub(crate) fn injected_seen(&self) -> u64 {
        self.injected_seen.load(Ordering::SeqCst)
    }

    /// Connections the forbidden service accepted so far.
    pub(crate) fn forbidden_hits(&self) -> u64 {
        self.forbidden_hits.load(Ordering::SeqCst)
    }
}

/// Whether a request head carries the header the `l7` rule injects, with
/// the bench secret's value.
fn carries_injected_header(head: &str) -> bool {
    let wanted = format!("Bearer {L7_SECRET}");
    head.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case(L7_HEADER) && value.trim() == wanted
        })
    })
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One workload's batch in one round.
#[derive(Debug, Clone)]
pub(crate) struct BatchOutcome {
    pub(crate) workload: Workload,
    pub(crate) reply: Reply,
    /// The proxy's CPU time over the batch.
    pub(crate) cpu_ns: Option<u64>,
}

impl BatchOutcome {
    /// A batch counts only when every request in it succeeded.
    pub(crate) fn ok(&self) -> bool {
        self.reply.failed == 0 && !self.reply.samples.is_empty()
    }

    /// Connections made (successful or not).
    pub(crate) fn connections(&self) -> usize {
        self.reply.samples.len() + self.reply.failed
    }
}

/// The deny check of one condition in one round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DenyCheck {
    pub(crate) passed: bool,
    /// What was seen, in one line.
    pub(crate) detail: String,
}

/// One condition in one formal round.
#[derive(Debug, Clone)]
pub(crate) struct RoundOutcome {
    /// The formal round, from 1.
    pub(crate) batch: usize,
    /// Where the condition ran in the round's shuffled order, from 1.
    pub(crate) position: usize,
    pub(crate) condition: ConditionKind,
    pub(crate) start: Duration,
    pub(crate) exit: Duration,
    pub(crate) deny: Option<DenyCheck>,
    pub(crate) batches: Vec<BatchOutcome>,
}

/// Everything a run measured.
#[derive(Debug, Clone)]
pub(crate) struct Results {
    pub(crate) plan: Plan,
    /// The conditions that ran, in report order.
    pub(crate) ran: Vec<ConditionKind>,
    pub(crate) skipped: Vec<(ConditionKind, String)>,
    pub(crate) rounds: Vec<RoundOutcome>,
    pub(crate) elapsed: Duration,
}

impl Results {
    /// The deny checks that failed, as one line each.
    pub(crate) fn deny_failures(&self) -> Vec<String> {
        self.rounds
            .iter()
            .filter_map(|r| match &r.deny {
                Some(d) if !d.passed => {
                    Some(format!("{} round {}: {}", r.condition, r.batch, d.detail))
                }
                _ => None,
            })
            .collect()
    }
}

/// Run `plan` on a testbed of its own; `progress` hears of every step.
pub(crate) fn run(plan: &Plan, progress: &mut Progress) -> Result<Results, BenchError> {
    plan.check()?;
    interrupt::install().map_err(|e| BenchError::Setup {
        what: "installing the signal handlers".into(),
        cause: e.to_string(),
    })?;
    let began = Instant::now();
    let bed = Testbed::create()?;
    if plan.workloads.iter().any(Workload::is_bulk) {
        // The origin's bulk body, before any batch would pay for it.
        crate::testbed::origin::prepare_bulk();
    }
    let mut prepared = Vec::new();
    let mut skipped = Vec::new();
    let mut kinds = plan.conditions.clone();
    kinds.sort();
    kinds.dedup();
    for kind in kinds {
        if interrupt::raised() {
            return Err(BenchError::Interrupted);
        }
        match condition::prepare(kind, &bed, &plan.image, plan.build_missing)? {
            Ok(ready) => prepared.push(ready),
            Err(why) => {
                progress.skipped(kind, &why);
                skipped.push((kind, why));
            }
        }
    }
    let commands =
        workload::Commands::new(&plan.workloads, plan.conns, plan.threads, &bed.pki.ca_pem);
    let total = plan.warmups + plan.batches;
    progress.begin(total, prepared.len());
    let mut rounds = Vec::new();
    for (round, order) in round_orders(plan.seed, total, prepared.len())
        .iter()
        .enumerate()
    {
        let warmup = round < plan.warmups;
        for (position, &i) in order.iter().enumerate() {
            if interrupt::raised() {
                return Err(BenchError::Interrupted);
            }
            let condition = prepared[i].as_ref();
            let outcome = run_round(condition, &bed, round, &commands)?;
            let outcome = RoundOutcome {
                batch: round.saturating_sub(plan.warmups) + 1,
                position: position + 1,
                ..outcome
            };
            progress.step(round, warmup, &outcome);
            if !warmup {
                rounds.push(outcome);
            }
        }
    }
    progress.end();
    let ran = prepared.iter().map(|c| c.kind()).collect::<Vec<_>>();
    // Peers and namespaces go before the report is written.
    drop(prepared);
    drop(bed);
    Ok(Results {
        plan: plan.clone(),
        ran,
        skipped,
        rounds,
        elapsed: began.elapsed(),
    })
}

/// The order the `conditions` run in, for each of `rounds` rounds: every
/// condition once a round, shuffled afresh every round by a generator
/// seeded with `seed` (so a run's order can be repeated).
fn round_orders(seed: u64, rounds: usize, conditions: usize) -> Vec<Vec<usize>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..rounds)
        .map(|_| {
            let mut order: Vec<usize> = (0..conditions).collect();
            order.shuffle(&mut rng);
            order
        })
        .collect()
}

/// One condition's session in one round: start, deny check, every
/// workload with the proxy's CPU time around it, exit.
fn run_round(
    condition: &dyn condition::Condition,
    bed: &Testbed,
    round: usize,
    commands: &workload::Commands,
) -> Result<RoundOutcome, BenchError> {
    let kind = condition.kind();
    let audited_before = condition.audit_log().map(|p| audited_denies(&p));
    let mut session = condition.start(bed, round)?;
    let mut deny = None;
    if kind.enforces() {
        let hits = bed.forbidden_hits();
        let reply = session.request(&commands.deny)?;
        deny = Some(judge_deny(reply, bed.forbidden_hits() > hits));
    }
    let mut batches = Vec::new();
    for (workload, command) in commands.of(kind) {
        if !kind.runs(*workload) {
            continue;
        }
        let before = session.proxy_cpu_ns();
        let injected = bed.injected_seen();
        let reply = session.request(command)?;
        if *workload == Workload::L7 && kind.injects() {
            check_injected(kind, &reply, bed.injected_seen() - injected)?;
        }
        let cpu_ns = match (before, session.proxy_cpu_ns()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        batches.push(checked_batch(kind, *workload, reply, cpu_ns)?);
    }
    let start = session.start;
    let exit = session.finish()?;
    // sluice's deny is also in its audit log, written by the time it exited.
    if let (Some(Some(before)), Some(path), Some(check)) =
        (audited_before, condition.audit_log(), deny.as_mut())
    {
        let after = audited_denies(&path).unwrap_or(0);
        if check.passed && after <= before {
            check.passed = false;
            check.detail = format!("blocked, but no deny record in {}", path.display());
        }
    }
    Ok(RoundOutcome {
        batch: 0,
        position: 0,
        condition: kind,
        start,
        exit,
        deny,
        batches,
    })
}

/// A workload's batch, or the error that voids the run when any of its
/// bodies had the wrong length or SHA-256: a proxy that changes bytes must
/// not be timed, so such a batch never becomes a sample.
fn checked_batch(
    kind: ConditionKind,
    workload: Workload,
    reply: Reply,
    cpu_ns: Option<u64>,
) -> Result<BatchOutcome, BenchError> {
    if let Some(detail) = &reply.first_mismatch {
        return Err(BenchError::Content {
            condition: kind,
            workload: workload.name(),
            detail: format!(
                "{} of the batch's bodies differ, e.g. {detail}",
                reply.mismatched
            ),
        });
    }
    Ok(BatchOutcome {
        workload,
        reply,
        cpu_ns,
    })
}

/// An `l7` batch counts only when the origin saw the injected header on
/// every request that succeeded: a proxy that did not do the work must not
/// be timed as if it had.
fn check_injected(kind: ConditionKind, reply: &Reply, seen: u64) -> Result<(), BenchError> {
    if seen >= reply.samples.len() as u64 {
        return Ok(());
    }
    Err(BenchError::Content {
        condition: kind,
        workload: Workload::L7.name(),
        detail: format!(
            "the origin saw the injected {L7_HEADER} header on {seen} of {} requests",
            reply.samples.len()
        ),
    })
}

fn judge_deny(reply: Reply, service_hit: bool) -> DenyCheck {
    let Some(probe) = reply.deny else {
        return DenyCheck {
            passed: false,
            detail: "the client did not run the check".into(),
        };
    };
    let blocked = !probe.forbidden_reached && !service_hit;
    DenyCheck {
        passed: blocked && probe.control_ok,
        detail: format!(
            "forbidden {FORBIDDEN}: {} ({}); control: {} ({})",
            if blocked { "blocked" } else { "REACHED" },
            probe.forbidden,
            if probe.control_ok { "ok" } else { "FAILED" },
            probe.control
        ),
    }
}

/// Deny records for the forbidden service in the audit log at `path` (0
/// when it does not exist yet; None when it cannot be read).
fn audited_denies(path: &Path) -> Option<usize> {
    match std::fs::read_to_string(path) {
        Ok(text) => Some(
            text.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| {
                    v["verdict"] == crate::outcome::Verdict::Deny.as_str() && v["dst"] == FORBIDDEN
                })
                .count(),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(0),
        Err(_) => None,
    }
}

impl crate::exit_class::Classified for BenchError {
    /// A plan that cannot be run: bad input; the rest: the machine.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        match self {
            BenchError::BadPlan(_) => crate::exit_class::ExitClass::BadInput,
            _ => crate::exit_class::ExitClass::CannotEnforce,
        }
    }
}

#[cfg(test)]
mod tests;
