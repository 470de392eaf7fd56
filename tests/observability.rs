//! Observability without privileges: metric names, labels and counts, the
//! `/metrics` endpoint, the audit chain (tamper detection, rotation, no lost
//! record under load), audit tail, timing files and `compare`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use sluice::audit::{
    self, AuditEvent, AuditOptions, AuditRecord, AuditWriter, Genesis, Proto, TailOptions, Tailer,
};
use sluice::metrics::{Metrics, ReloadResult};
use sluice::outcome::{Cause, DenyReason, Outcome, Verdict};
use sluice::timing::{
    self, compare, compare::two_clusters, ConnectionClock, Input, TimingRecord, TimingWriter,
};
use sluice::workload::WorkloadPath;

// ---------------------------------------------------------------- metrics

/// One sample of the text exposition: name, labels, value.
type Samples = Vec<(String, BTreeMap<String, String>, f64)>;

/// A strict-enough parser of the text format: every non-comment line must
/// be `name{labels} value`.
fn parse_exposition(text: &str) -> Samples {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            if let Some(rest) = line.strip_prefix("# ") {
                assert!(
                    rest.starts_with("HELP ") || rest.starts_with("TYPE "),
                    "unexpected comment: {line}"
                );
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample has a value");
        let value: f64 = value.parse().expect("sample value is a number");
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("labels close");
                let mut labels = BTreeMap::new();
                for pair in body.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").expect("label is k=\"v\"");
                    labels.insert(k.to_string(), v.trim_end_matches('"').to_string());
                }
                (name.to_string(), labels)
            }
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name {name}"
        );
        out.push((name, labels, value));
    }
    out
}

fn value(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && l.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.2)
}

fn scrape(registry: &Registry) -> (String, Samples) {
    let (text, _) = sluice::metrics::render(registry);
    let samples = parse_exposition(&text);
    (text, samples)
}

/// Scrape until `ready` holds (bounded): for the drop counters, which a
/// background thread refreshes.
fn scrape_until(registry: &Registry, ready: impl Fn(&Samples) -> bool) -> (String, Samples) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (text, samples) = scrape(registry);
        if ready(&samples) {
            return (text, samples);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the scrape never got there:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// 3 allowed by `origin`, 1 denied by `no-metadata`, 2 denied by no rule.
fn known_sequence(metrics: &Metrics) {
    let outcome = |verdict, rule: Option<&str>, cause| Outcome {
        verdict,
        rule: rule.map(Into::into),
        cause,
    };
    let host = metrics.path(WorkloadPath::Host);
    for _ in 0..3 {
        let c = host.opened();
        c.connected(Duration::from_micros(80));
        c.first_byte(Duration::from_micros(300));
        c.ended(
            &outcome(Verdict::Allow, Some("origin"), Cause::Allowed),
            100,
            1024,
        );
    }
    let c = host.opened();
    let no_rule = Cause::Denied(DenyReason::Policy(sluice::policy::Reason::NoRule));
    let deny_rule = Cause::Denied(DenyReason::Policy(sluice::policy::Reason::DenyRule));
    c.ended(
        &outcome(Verdict::Deny, Some("no-metadata"), deny_rule),
        0,
        0,
    );
    for _ in 0..2 {
        let c = metrics.path(WorkloadPath::Oci).opened();
        c.ended(&outcome(Verdict::Deny, None, no_rule), 0, 0);
    }
}

#[test]
fn denies_are_counted_by_path_and_the_reason_their_records_give() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    known_sequence(&metrics);
    let (_, s) = scrape(&registry);
    let denies = "sluice_denies_total";
    assert_eq!(
        value(
            &s,
            denies,
            &[
                ("path", "host"),
                ("verdict", "deny"),
                ("reason", "deny-rule")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            denies,
            &[("path", "oci"), ("verdict", "deny"), ("reason", "no-rule")]
        ),
        Some(2.0)
    );
    // An allowed connection is no deny, whatever its reason.
    assert_eq!(
        value(
            &s,
            denies,
            &[
                ("path", "host"),
                ("verdict", "allow"),
                ("reason", "allowed")
            ]
        ),
        None
    );
}

#[test]
fn connections_are_counted_by_path_verdict_and_rule() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    known_sequence(&metrics);
    let (_, s) = scrape(&registry);
    let total = "sluice_connections_total";
    assert_eq!(
        value(
            &s,
            total,
            &[("path", "host"), ("verdict", "allow"), ("rule", "origin")]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &s,
            total,
            &[
                ("path", "host"),
                ("verdict", "deny"),
                ("rule", "no-metadata")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            total,
            &[("path", "oci"), ("verdict", "deny"), ("rule", "none")]
        ),
        Some(2.0)
    );
    assert_eq!(
        value(
            &s,
            "sluice_bytes_total",
            &[("path", "host"), ("direction", "up")]
        ),
        Some(300.0)
    );
    assert_eq!(
        value(
            &s,
            "sluice_bytes_total",
            &[("path", "host"), ("direction", "down")]
        ),
        Some(3072.0)
    );
    assert_eq!(
        value(&s, "sluice_connect_seconds_count", &[("path", "host")]),
        Some(3.0)
    );
    assert_eq!(
        value(
            &s,
            "sluice_connect_seconds_bucket",
            &[("path", "host"), ("le", "0.0001")]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &s,
            "sluice_connect_seconds_bucket",
            &[("path", "host"), ("le", "0.00005")]
        ),
        Some(0.0)
    );
    assert_eq!(
        value(&s, "sluice_first_byte_seconds_count", &[("path", "host")]),
        Some(3.0)
    );
    // Every connection is timed, denied ones too.
    assert_eq!(
        value(&s, "sluice_connection_seconds_count", &[("path", "host")]),
        Some(4.0)
    );
    assert_eq!(
        value(&s, "sluice_connection_seconds_count", &[("path", "oci")]),
        Some(2.0)
    );
    assert_eq!(
        value(&s, "sluice_active_connections", &[("path", "host")]),
        Some(0.0)
    );
}

#[test]
fn active_connections_follow_the_guards() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    let vm = metrics.path(WorkloadPath::Vm);
    let a = vm.opened();
    let b = vm.opened();
    let (_, s) = scrape(&registry);
    assert_eq!(
        value(&s, "sluice_active_connections", &[("path", "vm")]),
        Some(2.0)
    );
    drop(a);
    let (_, s) = scrape(&registry);
    assert_eq!(
        value(&s, "sluice_active_connections", &[("path", "vm")]),
        Some(1.0)
    );
    drop(b);
    let (_, s) = scrape(&registry);
    assert_eq!(
        value(&s, "sluice_active_connections", &[("path", "vm")]),
        Some(0.0)
    );
}

#[test]
fn dropped_packets_are_refreshed_from_their_sources_in_the_background() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(7));
    let c = counter.clone();
    metrics.register_drop_source(
        "sb-1".into(),
        Box::new(move || Some(c.load(std::sync::atomic::Ordering::Relaxed))),
    );
    metrics.register_drop_source("sb-gone".into(), Box::new(|| None));
    let name = "sluice_dropped_packets_total";
    let (_, s) = scrape_until(&registry, |s| {
        value(s, name, &[("sandbox", "sb-1"), ("reason", "output")]) == Some(7.0)
    });
    assert_eq!(
        value(&s, name, &[("sandbox", "sb-gone"), ("reason", "output")]),
        None
    );
    counter.store(9, std::sync::atomic::Ordering::Relaxed);
    scrape_until(&registry, |s| {
        value(s, name, &[("sandbox", "sb-1"), ("reason", "output")]) == Some(9.0)
    });
    metrics.unregister_drop_source("sb-1");
    let (_, s) = scrape(&registry);
    assert_eq!(
        value(&s, name, &[("sandbox", "sb-1"), ("reason", "output")]),
        None
    );
}

#[test]
fn drop_counts_are_exported_per_reason_and_a_single_count_as_output() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    metrics.register_drop_source("sb-host".into(), Box::new(|| Some(3)));
    metrics.register_drop_counts(
        "vm-1".into(),
        Box::new(|| Some(vec![("mac", 2), ("arp", 5)])),
    );
    let name = "sluice_dropped_packets_total";
    let (_, s) = scrape_until(&registry, |s| {
        value(s, name, &[("sandbox", "vm-1"), ("reason", "arp")]) == Some(5.0)
            && value(s, name, &[("sandbox", "sb-host"), ("reason", "output")]).is_some()
    });
    assert_eq!(
        value(&s, name, &[("sandbox", "vm-1"), ("reason", "mac")]),
        Some(2.0)
    );
    assert_eq!(
        value(&s, name, &[("sandbox", "sb-host"), ("reason", "output")]),
        Some(3.0)
    );
}

#[test]
fn the_first_scrape_has_every_registered_drop_source() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    metrics.register_drop_source("sb-1".into(), Box::new(|| Some(4)));
    metrics.register_drop_counts("vm-1".into(), Box::new(|| Some(vec![("arp", 2)])));
    let name = "sluice_dropped_packets_total";
    let (text, s) = scrape(&registry);
    assert_eq!(
        value(&s, name, &[("sandbox", "sb-1"), ("reason", "output")]),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        value(&s, name, &[("sandbox", "vm-1"), ("reason", "arp")]),
        Some(2.0),
        "{text}"
    );
}

#[test]
fn read_from_start_reads_a_drop_source_as_it_is_registered_without_a_scrape() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    metrics.read_drops_from_start();
    let (read_tx, read) = std::sync::mpsc::channel::<()>();
    let read_tx = std::sync::Mutex::new(read_tx);
    metrics.register_drop_source(
        "sb-1".into(),
        Box::new(move || {
            let _ = read_tx.lock().unwrap().send(());
            Some(1)
        }),
    );
    read.recv_timeout(Duration::from_secs(20))
        .expect("the source was never read without a scrape");
}

#[test]
fn a_scrape_never_waits_for_a_refresh_of_a_drop_counter() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    let name = "sluice_dropped_packets_total";
    // A source whose first read is quick and whose later reads block (as
    // entering a namespace and asking nft can) until the test lets them go.
    let (reading_tx, reading) = std::sync::mpsc::channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = std::sync::Mutex::new(released);
    let reads = std::sync::atomic::AtomicU64::new(0);
    metrics.register_drop_source(
        "sb-slow".into(),
        Box::new(move || {
            let n = reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n > 0 {
                let _ = reading_tx.send(());
                let _ = released.lock().unwrap().recv();
            }
            Some(5 + n)
        }),
    );
    let (_, s) = scrape_until(&registry, |s| {
        value(s, name, &[("sandbox", "sb-slow"), ("reason", "output")]).is_some()
    });
    assert_eq!(
        value(&s, name, &[("sandbox", "sb-slow"), ("reason", "output")]),
        Some(5.0)
    );
    reading.recv().unwrap();
    // The refresher is stuck in the second read: scrapes still answer at
    // once, with the last values read.
    let (_, s) = scrape(&registry);
    assert_eq!(
        value(&s, name, &[("sandbox", "sb-slow"), ("reason", "output")]),
        Some(5.0)
    );
    release.send(()).unwrap();
    scrape_until(&registry, |s| {
        value(s, name, &[("sandbox", "sb-slow"), ("reason", "output")]) == Some(6.0)
    });
    // Unblock any later read, so the refresher can stop.
    drop(release);
}

#[test]
fn a_scrape_waits_no_longer_than_the_bound_for_a_first_read_that_hangs() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    metrics.register_drop_source("sb-fast".into(), Box::new(|| Some(1)));
    let name = "sluice_dropped_packets_total";
    scrape_until(&registry, |s| {
        value(s, name, &[("sandbox", "sb-fast"), ("reason", "output")]) == Some(1.0)
    });
    let (reading_tx, reading) = std::sync::mpsc::channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let released = std::sync::Mutex::new(released);
    metrics.register_drop_source(
        "sb-hung".into(),
        Box::new(move || {
            let _ = reading_tx.send(());
            let _ = released.lock().unwrap().recv();
            Some(5)
        }),
    );
    reading.recv().unwrap();
    let started = std::time::Instant::now();
    let (_, s) = scrape(&registry);
    assert!(
        started.elapsed() < sluice::metrics::DROPS_FIRST_READ_WAIT + Duration::from_secs(5),
        "the scrape waited {:?}",
        started.elapsed()
    );
    assert_eq!(
        value(&s, name, &[("sandbox", "sb-fast"), ("reason", "output")]),
        Some(1.0)
    );
    assert_eq!(
        value(&s, name, &[("sandbox", "sb-hung"), ("reason", "output")]),
        None
    );
    release.send(()).unwrap();
    scrape_until(&registry, |s| {
        value(s, name, &[("sandbox", "sb-hung"), ("reason", "output")]) == Some(5.0)
    });
    drop(release);
}

#[test]
fn bundle_dns_build_and_audit_wait_metrics_are_exported() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    metrics.set_bundle_revision("agent-default", 42);
    metrics.bundle_reload(ReloadResult::Applied);
    metrics.bundle_reload(ReloadResult::Refused);
    metrics.bundle_reload(ReloadResult::Refused);
    metrics.dns_query("allow");
    metrics.dns_counter("refused").inc();
    metrics.audit_wait_counter().inc();
    let (_, s) = scrape(&registry);
    assert_eq!(
        value(&s, "sluice_bundle_revision", &[("bundle", "agent-default")]),
        Some(42.0)
    );
    let reloads = "sluice_bundle_reloads_total";
    assert_eq!(value(&s, reloads, &[("result", "applied")]), Some(1.0));
    assert_eq!(value(&s, reloads, &[("result", "unchanged")]), Some(0.0));
    assert_eq!(value(&s, reloads, &[("result", "refused")]), Some(2.0));
    assert_eq!(
        value(&s, "sluice_dns_queries_total", &[("verdict", "allow")]),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "sluice_dns_queries_total", &[("verdict", "refused")]),
        Some(1.0)
    );
    assert_eq!(value(&s, "sluice_audit_waits_total", &[]), Some(1.0));
    assert_eq!(
        value(
            &s,
            "sluice_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
}

#[test]
fn every_metric_has_help_and_type() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    known_sequence(&metrics);
    metrics.register_drop_source("sb".into(), Box::new(|| Some(1)));
    metrics.set_bundle_revision("b", 1);
    metrics.dns_query("allow");
    let (text, _) = scrape_until(&registry, |s| {
        value(
            s,
            "sluice_dropped_packets_total",
            &[("sandbox", "sb"), ("reason", "output")],
        )
        .is_some()
    });
    for name in [
        "sluice_connections_total",
        "sluice_denies_total",
        "sluice_active_connections",
        "sluice_connect_seconds",
        "sluice_first_byte_seconds",
        "sluice_connection_seconds",
        "sluice_bytes_total",
        "sluice_dns_queries_total",
        "sluice_dropped_packets_total",
        "sluice_bundle_revision",
        "sluice_bundle_reloads_total",
        "sluice_build_info",
        "sluice_audit_waits_total",
        "sluice_audit_head_seq",
        "sluice_audit_checkpoint_seq",
    ] {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no help for {name}"
        );
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "no type for {name}"
        );
    }
}

#[test]
fn promtool_accepts_the_exposition() {
    let Some(promtool) = find_on_path("promtool") else {
        if std::env::var("SLUICE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
            panic!("promtool is not installed; install Debian's `prometheus` package (it ships promtool)");
        }
        eprintln!("SKIPPED promtool_accepts_the_exposition: promtool not found (apt-get install prometheus)");
        return;
    };
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    known_sequence(&metrics);
    metrics.register_drop_source("sb".into(), Box::new(|| Some(3)));
    metrics.set_bundle_revision("b", 1);
    metrics.dns_query("allow");
    let (text, _) = scrape(&registry);
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- exposition ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn find_on_path(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_text_format_and_404s_elsewhere() {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    known_sequence(&metrics);
    let listener = sluice::metrics::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (trigger, drain) = sluice::drain::trigger();
    let server = tokio::spawn(sluice::metrics::serve_listener(listener, registry, drain));
    let (ok, missing) =
        tokio::task::spawn_blocking(move || (http_get(addr, "/metrics"), http_get(addr, "/")))
            .await
            .unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(
        ok.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{ok}"
    );
    let body = ok.split_once("\r\n\r\n").unwrap().1;
    let s = parse_exposition(body);
    assert_eq!(
        value(
            &s,
            "sluice_connections_total",
            &[("path", "host"), ("verdict", "allow"), ("rule", "origin")]
        ),
        Some(3.0)
    );
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    trigger.drain();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("server stops when drained")
        .unwrap()
        .unwrap();
}

// ---------------------------------------------------------------- audit

fn deny(i: usize) -> AuditEvent {
    AuditEvent {
        sandbox: "sb-test".into(),
        path: WorkloadPath::Host,
        verdict: if i % 7 == 0 { "allow" } else { "deny" },
        rule: (i % 3 == 0).then(|| "no-metadata".to_string()),
        reason: "no-rule",
        proto: Proto::Tcp,
        src: Some(format!("10.0.0.2:{}", 10000 + i % 50000).parse().unwrap()),
        dst: Some("198.18.0.1:9090".parse().unwrap()),
        host: Some("origin.test".into()),
        bundle: "test@1".into(),
        request: None,
    }
}

async fn write_log(path: &Path, n: usize) {
    let (log, writer) = AuditWriter::new(Some(path));
    let task = tokio::spawn(writer.run());
    for i in 0..n {
        log.record(deny(i)).await;
    }
    drop(log);
    assert_eq!(task.await.unwrap().unwrap(), n as u64);
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_record_is_lost_when_many_tasks_deny_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    let (log, writer) = AuditWriter::with_options(
        Some(&path),
        AuditOptions {
            capacity: 8,
            wait_counter: Some(metrics.audit_wait_counter()),
            ..AuditOptions::default()
        },
    );
    let task = tokio::spawn(writer.run());
    let mut producers = tokio::task::JoinSet::new();
    for t in 0..50 {
        let log = log.clone();
        producers.spawn(async move {
            for i in 0..40 {
                log.record(deny(t * 40 + i)).await;
            }
        });
    }
    drop(log);
    while let Some(r) = producers.join_next().await {
        r.unwrap();
    }
    assert_eq!(task.await.unwrap().unwrap(), 2000);
    assert_eq!(lines(&path).len(), 2000);
    let summary = audit::verify(&path).unwrap();
    assert_eq!(summary.records, 2000);
    assert_eq!((summary.first_seq, summary.last_seq), (Some(0), Some(1999)));
    let (_, s) = scrape(&registry);
    assert!(
        value(&s, "sluice_audit_waits_total", &[]).unwrap() > 0.0,
        "a queue of 8 under 50 producers must have made some wait"
    );
}

#[tokio::test]
async fn verify_accepts_an_untouched_log_and_a_continued_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 10).await;
    write_log(&path, 5).await; // a restart continues the chain
    let summary = audit::verify(&path).unwrap();
    assert_eq!(summary.records, 15);
    assert_eq!(summary.last_seq, Some(14));
    assert_eq!(summary.genesis, audit::GENESIS);
    assert_eq!(
        summary.last_hash,
        audit::line_hash(lines(&path).last().unwrap())
    );
}

async fn tampered(f: impl FnOnce(&mut Vec<String>)) -> audit::VerifyError {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 10).await;
    let mut l = lines(&path);
    f(&mut l);
    write_lines(&path, &l);
    audit::verify(&path).expect_err("tampering must be detected")
}

#[tokio::test]
async fn verify_detects_an_edited_line() {
    // The line no longer matches its own hash.
    let err = tampered(|l| l[4] = l[4].replace("\"deny\"", "\"allow\"")).await;
    assert_eq!(err.line, 5, "{err}");
    assert!(err.what.contains("this line was edited"), "{err}");
    // A one-character change without touching JSON structure, too.
    let err = tampered(|l| l[2] = l[2].replace("198.18.0.1", "198.18.0.2")).await;
    assert_eq!(err.line, 3, "{err}");
    // Given a fresh hash, it breaks the next line's prev.
    let err = tampered(|l| l[4] = resealed(&l[4], |b| b.replace("\"deny\"", "\"allow\""))).await;
    assert_eq!(err.line, 6, "{err}");
    assert!(err.what.contains("line 5 was edited"), "{err}");
}

#[tokio::test]
async fn verify_detects_a_dropped_line() {
    let err = tampered(|l| {
        l.remove(3);
    })
    .await;
    assert_eq!(err.line, 4, "{err}");
    let err = tampered(|l| {
        l.remove(0);
    })
    .await;
    assert_eq!(err.line, 1, "{err}");
    assert!(err.what.contains("genesis"), "{err}");
}

#[tokio::test]
async fn verify_detects_reordered_lines() {
    let err = tampered(|l| l.swap(5, 6)).await;
    assert_eq!(err.line, 6, "{err}");
}

#[tokio::test]
async fn verify_detects_an_inserted_line_from_another_log() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other.jsonl");
    write_log(&other, 10).await;
    let foreign = lines(&other)[7].clone();
    let err = tampered(move |l| l.insert(7, foreign)).await;
    assert_eq!(err.line, 8, "{err}");
    // Even one with the right seq in the right place does not chain.
    let dir2 = tempfile::tempdir().unwrap();
    let other2 = dir2.path().join("other.jsonl");
    write_log(&other2, 10).await;
    let foreign = lines(&other2)[7].clone();
    let replacement = lines(&other2)[7].clone();
    assert_eq!(foreign, replacement);
    let err = tampered(move |l| l[7] = foreign).await;
    // Same content except the timestamp: line 8 or 9 breaks.
    assert!(err.line == 8 || err.line == 9, "{err}");
}

#[tokio::test]
async fn verify_rejects_a_damaged_line() {
    let err = tampered(|l| l[1].truncate(20)).await;
    assert_eq!(err.line, 2, "{err}");
    let err = tampered(|l| l.insert(2, String::new())).await;
    assert_eq!(err.line, 3, "{err}");
}

#[tokio::test]
async fn a_rotation_that_fails_loses_no_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    // FILE.1 is a directory with something in it: no rotation can succeed.
    std::fs::create_dir(audit::rotated_path(&path, 1)).unwrap();
    std::fs::write(audit::rotated_path(&path, 1).join("keep"), b"").unwrap();
    let opts = AuditOptions {
        max_bytes: Some(4 * 1024),
        keep: 1,
        ..AuditOptions::default()
    };
    let (log, writer) = AuditWriter::with_options(Some(&path), opts);
    let task = tokio::spawn(writer.run());
    for i in 0..100 {
        log.record(deny(i)).await;
    }
    drop(log);
    assert_eq!(task.await.unwrap().unwrap(), 100);
    assert_eq!(lines(&path).len(), 100);
    assert_eq!(audit::verify(&path).unwrap().records, 100);
}

#[tokio::test]
async fn rotation_keeps_one_chain_across_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let opts = AuditOptions {
        max_bytes: Some(8 * 1024),
        keep: 20,
        ..AuditOptions::default()
    };
    let (log, writer) = AuditWriter::with_options(Some(&path), opts.clone());
    let task = tokio::spawn(writer.run());
    for i in 0..200 {
        log.record(deny(i)).await;
        if i % 10 == 0 {
            tokio::task::yield_now().await;
        }
    }
    drop(log);
    task.await.unwrap().unwrap();
    let set = audit::rotated_set(&path);
    assert!(set.len() >= 3, "expected several rotated files: {set:?}");
    for f in &set {
        assert!(
            std::fs::metadata(f).unwrap().len() < 8 * 1024 + 64 * 1024,
            "{f:?} far over the limit"
        );
    }
    let summary = audit::verify_rotated(&path, &Genesis::Fresh).unwrap();
    assert_eq!(summary.records, 200);
    assert_eq!(summary.last_seq, Some(199));

    // FILE alone starts mid-chain: refused by default, accepted when told
    // what it follows.
    let err = audit::verify(&path).unwrap_err();
    assert_eq!(err.line, 1);
    assert!(err.what.contains("rotation"), "{err}");
    let previous = audit::rotated_path(&path, 1);
    audit::verify_with(&path, &Genesis::After(previous.clone())).unwrap();
    let first: AuditRecord = serde_json::from_str(&lines(&path)[0]).unwrap();
    audit::verify_with(&path, &Genesis::Hash(first.prev.clone())).unwrap();

    // A missing middle file breaks the set.
    let middle = audit::rotated_path(&path, 2);
    std::fs::remove_file(&middle).unwrap();
    let remaining = audit::verify_rotated(&path, &Genesis::Fresh);
    // FILE.3.. are no longer part of the set (it stops at the gap), so the
    // oldest remaining file, FILE.1, does not start fresh.
    assert!(remaining.is_err());

    // A writer restarted right after a rotation chains from FILE.1.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.jsonl");
    write_log(&path, 3).await;
    std::fs::rename(&path, audit::rotated_path(&path, 1)).unwrap();
    write_log(&path, 2).await;
    let summary = audit::verify_rotated(&path, &Genesis::Fresh).unwrap();
    assert_eq!(summary.records, 5);
}

// ------------------------------------------------------ signed checkpoints

fn signing_key(dir: &Path, name: &str) -> Arc<audit::AuditKey> {
    Arc::new(audit::AuditKey::create(&dir.join(name)).unwrap())
}

fn public(key: &audit::AuditKey) -> audit::CheckpointKeys {
    audit::CheckpointKeys::parse(&key.public_hex()).unwrap()
}

/// `n` records with a checkpoint signed by `key` every `every` records and
/// at the end (never by time).
async fn write_signed_log(path: &Path, key: &Arc<audit::AuditKey>, n: usize, every: u64) {
    let opts = AuditOptions {
        checkpoints: Some(audit::CheckpointOptions {
            key: key.clone(),
            every_records: every,
            interval: Duration::ZERO,
        }),
        ..AuditOptions::default()
    };
    write_log_with(path, n, opts).await;
}

async fn write_log_with(path: &Path, n: usize, opts: AuditOptions) {
    let (log, writer) = AuditWriter::with_options(Some(path), opts);
    let task = tokio::spawn(writer.run());
    for i in 0..n {
        log.record(deny(i)).await;
    }
    drop(log);
    assert_eq!(task.await.unwrap().unwrap(), n as u64);
}

fn verify_signed(
    path: &Path,
    key: &audit::AuditKey,
    anchor: Option<(u64, Option<String>)>,
) -> Result<audit::VerifySummary, audit::VerifyError> {
    let options = audit::VerifyOptions {
        keys: Some(public(key)),
        anchor,
        ..audit::VerifyOptions::default()
    };
    audit::verify_log(path, &options)
}

/// `line` with `edit` applied to its bytes and its hash made to match again,
/// as someone who can write the file would do.
fn resealed(line: &str, edit: impl FnOnce(&str) -> String) -> String {
    let (body, _) = audit::unseal(line);
    audit::seal(&edit(&body)).0
}

fn kinds(path: &Path) -> Vec<(u64, bool)> {
    lines(path)
        .iter()
        .map(|l| {
            let line = audit::AuditLine::parse(l).unwrap();
            (line.seq(), matches!(line, audit::AuditLine::Checkpoint(_)))
        })
        .collect()
}

#[tokio::test]
async fn a_checkpoint_is_signed_every_n_records_and_when_the_producers_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    write_signed_log(&path, &key, 12, 5).await;
    let checkpoints: Vec<u64> = kinds(&path)
        .into_iter()
        .filter(|(_, c)| *c)
        .map(|(seq, _)| seq)
        .collect();
    assert_eq!(checkpoints, [5, 11, 14]);
    let summary = verify_signed(&path, &key, None).unwrap();
    assert_eq!((summary.records, summary.checkpoints), (12, 3));
    assert_eq!((summary.last_checkpoint, summary.unanchored), (Some(14), 0));
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_is_signed_once_a_record_has_waited_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    let opts = AuditOptions {
        checkpoints: Some(audit::CheckpointOptions {
            key: key.clone(),
            every_records: 0,
            interval: Duration::from_secs(10),
        }),
        ..AuditOptions::default()
    };
    let (log, writer) = AuditWriter::with_options(Some(&path), opts);
    let task = tokio::spawn(writer.run());
    log.record(deny(1)).await;
    // The producer stays: only the interval can bring the checkpoint.
    let mut waited = 0;
    while log.head().checkpoint.is_none() {
        assert!(
            waited < 10_000,
            "no checkpoint after {waited} virtual ticks"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += 1;
    }
    assert_eq!(log.head().checkpoint.unwrap().seq, 1);
    assert_eq!(kinds(&path), [(0, false), (1, true)]);
    drop(log);
    task.await.unwrap().unwrap();
    // Nothing was left to sign at the end.
    assert_eq!(kinds(&path).len(), 2);
}

#[tokio::test]
async fn the_head_written_is_exported_with_its_hash_and_as_gauges() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    let (head_gauge, checkpoint_gauge) = metrics.audit_head_gauges();
    let (_, s) = scrape(&registry);
    assert_eq!(value(&s, "sluice_audit_head_seq", &[]), Some(-1.0));
    let opts = AuditOptions {
        checkpoints: Some(audit::CheckpointOptions {
            key: key.clone(),
            every_records: 3,
            interval: Duration::ZERO,
        }),
        head_gauge: Some(head_gauge),
        checkpoint_gauge: Some(checkpoint_gauge),
        ..AuditOptions::default()
    };
    let (log, writer) = AuditWriter::with_options(Some(&path), opts);
    let task = tokio::spawn(writer.run());
    for i in 0..4 {
        log.record(deny(i)).await;
    }
    // Lines 0-2, checkpoint 3, line 4: wait until line 4 is written.
    while log.head().head.as_ref().is_none_or(|h| h.seq < 4) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let head = log.head();
    let last = lines(&path).last().unwrap().clone();
    assert_eq!(head.file.as_deref(), Some(path.as_path()));
    assert_eq!(head.key.as_deref(), Some(key.id()));
    assert_eq!(head.head.as_ref().unwrap().hash, audit::line_hash(&last));
    assert_eq!(head.checkpoint.as_ref().unwrap().seq, 3);
    assert_eq!(head.unanchored(), 1);
    let (_, s) = scrape(&registry);
    assert_eq!(value(&s, "sluice_audit_head_seq", &[]), Some(4.0));
    assert_eq!(value(&s, "sluice_audit_checkpoint_seq", &[]), Some(3.0));
    drop(log);
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn verify_catches_an_edited_last_line_by_its_own_hash() {
    let err = tampered(|l| {
        let last = l.len() - 1;
        l[last] = l[last].replace("\"deny\"", "\"allow\"");
    })
    .await;
    assert_eq!(err.line, 10, "{err}");
    assert!(err.what.contains("this line was edited"), "{err}");
}

#[tokio::test]
async fn verify_with_the_key_catches_a_resealed_last_record_under_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    write_signed_log(&path, &key, 10, 0).await;
    let mut l = lines(&path);
    // Line 10 is the last record, line 11 the shutdown checkpoint.
    l[9] = resealed(&l[9], |b| b.replace("\"deny\"", "\"allow\""));
    write_lines(&path, &l);
    let err = verify_signed(&path, &key, None).unwrap_err();
    assert_eq!(err.line, 11, "{err}");
    assert!(
        err.what
            .contains("the checkpoint's prev is not the hash of line 10"),
        "{err}"
    );
}

#[tokio::test]
async fn verify_with_the_key_catches_a_checkpoint_whose_signature_was_changed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    write_signed_log(&path, &key, 10, 0).await;
    let mut l = lines(&path);
    // Rewrite a record and the checkpoint's prev to match: only the
    // signature can tell.
    l[9] = resealed(&l[9], |b| b.replace("\"deny\"", "\"allow\""));
    let new_prev = audit::line_hash(&l[9]);
    let old_prev = audit::line_hash(&lines(&path)[9]);
    l[10] = resealed(&l[10], |b| b.replace(&old_prev, &new_prev));
    write_lines(&path, &l);
    let err = verify_signed(&path, &key, None).unwrap_err();
    assert_eq!(err.line, 11, "{err}");
    assert!(err.what.starts_with("bad signature"), "{err}");
    // Without the key only the chain is checked, and it holds.
    audit::verify(&path).unwrap();
}

#[tokio::test]
async fn verify_with_the_key_catches_a_checkpoint_signed_with_another_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    let forger = signing_key(dir.path(), "forger");
    write_signed_log(&path, &key, 10, 0).await;
    let mut l = lines(&path);
    l[9] = resealed(&l[9], |b| b.replace("\"deny\"", "\"allow\""));
    let forged = forger.checkpoint("2025-01-01T00:00:00Z".into(), 10, audit::line_hash(&l[9]));
    l[10] = audit::seal(&serde_json::to_string(&forged).unwrap()).0;
    write_lines(&path, &l);
    let err = verify_signed(&path, &key, None).unwrap_err();
    assert_eq!(err.line, 11, "{err}");
    assert!(err.what.contains("not the key given"), "{err}");
}

#[tokio::test]
async fn verify_with_the_key_catches_a_signed_checkpoint_whose_head_is_not_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    write_signed_log(&path, &key, 10, 0).await;
    let mut l = lines(&path);
    // A genuine signature, over a head this chain does not have.
    let elsewhere = key.checkpoint("2025-01-01T00:00:00Z".into(), 10, "ab".repeat(32));
    l[10] = audit::seal(&serde_json::to_string(&elsewhere).unwrap()).0;
    write_lines(&path, &l);
    let err = verify_signed(&path, &key, None).unwrap_err();
    assert_eq!(err.line, 11, "{err}");
    assert!(
        err.what.contains("the checkpoint's prev is not the hash"),
        "{err}"
    );
}

#[tokio::test]
async fn verify_catches_a_tail_cut_before_the_last_checkpoint_against_the_anchored_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    write_signed_log(&path, &key, 12, 5).await;
    // The head an outside collector kept (what `sluice status` showed).
    let head = verify_signed(&path, &key, None).unwrap();
    let anchor = Some((head.last_seq.unwrap(), Some(head.last_hash.clone())));
    // Cut right after the checkpoint at seq 11: what is left is a valid log
    // on its own, ending in a valid checkpoint.
    let l = lines(&path);
    write_lines(&path, &l[..12]);
    verify_signed(&path, &key, None).unwrap();
    let err = verify_signed(&path, &key, anchor).unwrap_err();
    assert_eq!(err.line, 13, "{err}");
    assert!(
        err.what
            .contains("the log ends at seq 11, but seq 14 was anchored"),
        "{err}"
    );
}

#[tokio::test]
async fn verify_catches_a_resealed_line_that_differs_from_the_anchored_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 5).await;
    let head = audit::verify(&path).unwrap();
    let anchor = Some((4, Some(head.last_hash.clone())));
    let mut l = lines(&path);
    l[4] = resealed(&l[4], |b| b.replace("\"deny\"", "\"allow\""));
    write_lines(&path, &l);
    audit::verify(&path).unwrap();
    let options = audit::VerifyOptions {
        anchor,
        ..audit::VerifyOptions::default()
    };
    let err = audit::verify_log(&path, &options).unwrap_err();
    assert_eq!(err.line, 5, "{err}");
    assert!(err.what.contains("as anchored"), "{err}");
}

#[tokio::test]
async fn verify_with_the_key_reports_records_after_the_last_checkpoint_as_unanchored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    write_signed_log(&path, &key, 12, 5).await;
    // Lose the shutdown checkpoint (sluice was killed before writing it).
    let l = lines(&path);
    write_lines(&path, &l[..l.len() - 1]);
    let summary = verify_signed(&path, &key, None).unwrap();
    assert_eq!(summary.last_checkpoint, Some(11));
    assert_eq!(summary.unanchored, 2);
}

#[tokio::test]
async fn verify_with_the_key_passes_an_untouched_signed_log_across_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    let opts = AuditOptions {
        max_bytes: Some(4 * 1024),
        keep: 50,
        checkpoints: Some(audit::CheckpointOptions {
            key: key.clone(),
            every_records: 7,
            interval: Duration::ZERO,
        }),
        ..AuditOptions::default()
    };
    write_log_with(&path, 100, opts).await;
    assert!(audit::rotated_set(&path).len() >= 3);
    let summary = verify_signed(&path, &key, None).unwrap();
    assert_eq!(summary.records, 100);
    assert_eq!(summary.checkpoints, 100 / 7 + 1);
    assert_eq!(summary.unanchored, 0);
}

#[tokio::test]
async fn a_log_written_before_lines_carried_a_hash_verifies_and_is_continued() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 3).await;
    // The old format: no hash member, prev the hash of the whole line.
    let mut old: Vec<String> = Vec::new();
    let mut prev = audit::GENESIS.to_string();
    for line in lines(&path) {
        let (body, _) = audit::unseal(&line);
        let mut record: AuditRecord = serde_json::from_str(&body).unwrap();
        record.prev = prev.clone();
        let text = serde_json::to_string(&record).unwrap();
        prev = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()));
        old.push(text);
    }
    write_lines(&path, &old);
    assert_eq!(audit::verify(&path).unwrap().last_hash, prev);
    write_log(&path, 2).await;
    assert_eq!(audit::verify(&path).unwrap().records, 5);
}

#[tokio::test]
async fn tail_prints_checkpoints_readably_and_filters_them_as_a_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let key = signing_key(dir.path(), "state");
    write_signed_log(&path, &key, 4, 0).await;
    let mut out = Vec::new();
    let opts = TailOptions {
        verdict: Some("checkpoint".into()),
        ..TailOptions::default()
    };
    audit::tail(&path, &opts, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains(&format!("checkpoint key {} signs seq ..3 [#4]", key.id())),
        "{text}"
    );
}

#[tokio::test]
async fn tail_prints_readable_lines_filtered_by_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 14).await; // i % 7 == 0 are allows: 2 of them
    let mut out = Vec::new();
    audit::tail(&path, &TailOptions::default(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 14);
    let first = text.lines().next().unwrap();
    assert!(first.contains(" allow "), "{first}");
    assert!(
        first.contains("no-metadata no-rule tcp 10.0.0.2:10000 -> 198.18.0.1:9090 origin.test"),
        "{first}"
    );

    let mut out = Vec::new();
    let opts = TailOptions {
        verdict: Some("deny".into()),
        ..TailOptions::default()
    };
    audit::tail(&path, &opts, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 12);
    assert!(text.lines().all(|l| l.contains(" deny ")));

    let mut out = Vec::new();
    let opts = TailOptions {
        json: true,
        ..TailOptions::default()
    };
    audit::tail(&path, &opts, &mut out).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        std::fs::read_to_string(&path).unwrap()
    );
}

#[tokio::test]
async fn tail_follow_sees_appended_and_rotated_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    write_log(&path, 3).await;
    let mut tailer = Tailer::new(
        &path,
        TailOptions {
            follow: true,
            ..TailOptions::default()
        },
    );
    let mut out = Vec::new();
    assert_eq!(tailer.poll(&mut out).unwrap(), 3);
    assert_eq!(tailer.poll(&mut out).unwrap(), 0);
    write_log(&path, 2).await;
    assert_eq!(tailer.poll(&mut out).unwrap(), 2);
    std::fs::rename(&path, audit::rotated_path(&path, 1)).unwrap();
    write_log(&path, 4).await;
    assert_eq!(tailer.poll(&mut out).unwrap(), 4);
}

// ---------------------------------------------------------------- timings

fn rec(id: u64, total: u64) -> TimingRecord {
    TimingRecord {
        id,
        sandbox: "sb".into(),
        path: "host".into(),
        dst: "198.18.0.1:8080".into(),
        host: None,
        verdict: "allow".into(),
        start: 1_700_000_000_000_000 + id,
        decide_us: Some(total / 10),
        connect_us: Some(total / 4),
        first_byte_us: Some(total / 2),
        total_us: total,
        bytes_up: 10,
        bytes_down: 1024,
        reason: "allow-rule".into(),
    }
}

fn odd_records() -> Vec<TimingRecord> {
    let mut a = rec(1, 100);
    a.host = Some("we,ird \"name\"".into());
    let mut b = rec(2, 200);
    b.verdict = "deny".into();
    b.connect_us = None;
    b.first_byte_us = None;
    b.decide_us = None;
    vec![a, b, rec(3, 300)]
}

#[tokio::test]
async fn timings_round_trip_through_csv_and_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["t.csv", "t.jsonl"] {
        let path = dir.path().join(name);
        let (log, writer) = TimingWriter::new(&path);
        let task = tokio::spawn(writer.run());
        let records = odd_records();
        for r in records.iter().cloned() {
            log.submit(r);
        }
        drop(log);
        assert_eq!(task.await.unwrap().unwrap(), 3);
        let text = std::fs::read_to_string(&path).unwrap();
        if name.ends_with("csv") {
            assert!(text.starts_with(timing::CSV_HEADER));
        } else {
            assert!(text.starts_with('{'));
        }
        assert_eq!(timing::read_file(&path).unwrap(), records, "{name}");
    }
}

#[test]
fn connection_clock_phases_are_monotone() {
    let mut clock = ConnectionClock::start();
    clock.decided();
    std::thread::sleep(Duration::from_millis(2));
    clock.connected();
    clock.first_byte();
    std::thread::sleep(Duration::from_millis(1));
    clock.first_byte(); // the first call wins
    let r = clock.record(
        1,
        "sb",
        "host",
        "198.18.0.1:80".parse().unwrap(),
        None,
        &Outcome {
            verdict: Verdict::Allow,
            rule: None,
            cause: Cause::Allowed,
        },
    );
    let (d, c, f) = (
        r.decide_us.unwrap(),
        r.connect_us.unwrap(),
        r.first_byte_us.unwrap(),
    );
    assert!(d <= c && c <= f && f <= r.total_us, "{r:?}");
    assert!(c >= 2000 && r.total_us >= f + 1000, "{r:?}");
    assert!(r.start > 1_600_000_000_000_000);
}

fn write_batch(dir: &Path, name: &str, records: &[TimingRecord]) {
    let mut text = String::from(timing::CSV_HEADER) + "\n";
    let path = dir.join(name);
    if name.ends_with(".jsonl") {
        let body: Vec<String> = records
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect();
        std::fs::write(path, body.join("\n") + "\n").unwrap();
    } else {
        for r in records {
            text.push_str(&format!(
                "{},{},{},{},,{},{},{},{},{},{},{},{}\n",
                r.id,
                r.sandbox,
                r.path,
                r.dst,
                r.verdict,
                r.start,
                r.decide_us.unwrap(),
                r.connect_us.unwrap(),
                r.first_byte_us.unwrap(),
                r.total_us,
                r.bytes_up,
                r.bytes_down
            ));
        }
        std::fs::write(path, text).unwrap();
    }
}

#[test]
fn compare_reports_known_medians_paired_difference_and_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let (da, db) = (dir.path().join("direct"), dir.path().join("proxied"));
    std::fs::create_dir_all(&da).unwrap();
    std::fs::create_dir_all(&db).unwrap();
    // Batch i of A: totals 100+i*10 .. (5 values, median 300 + 10 i);
    // B = A + 100 µs exactly, so every paired difference is 100.
    for i in 0..4u64 {
        let a: Vec<TimingRecord> = (0..5).map(|k| rec(k, 100 + 100 * k + 10 * i)).collect();
        let b: Vec<TimingRecord> = a.iter().map(|r| rec(r.id, r.total_us + 100)).collect();
        write_batch(&da, &format!("batch-{i:02}.csv"), &a);
        write_batch(&db, &format!("batch-{i:02}.jsonl"), &b);
    }
    let a = timing::load_input(&da, 256).unwrap();
    let b = timing::load_input(&db, 256).unwrap();
    assert_eq!((a.batches.len(), b.batches.len()), (4, 4));
    let c = compare(&a, &b);
    let total = &c.a.phases[2];
    assert_eq!(total.n, 20);
    // A's 20 totals: {100,200,300,400,500} + {0,10,20,30}: median 300 + 15.
    assert_eq!(total.median_us, Some(315.0));
    assert_eq!(c.b.phases[2].median_us, Some(415.0));
    assert!(total.clusters.is_none());
    let ratio = c.phases[2].ratio.unwrap();
    assert!((ratio - 415.0 / 315.0).abs() < 1e-9);
    let diff = c.phases[2].diff.unwrap();
    assert_eq!(diff.pairs, 4);
    assert_eq!(
        (diff.median_diff_us, diff.ci_low_us, diff.ci_high_us),
        (100.0, 100.0, 100.0)
    );
    let table = c.render_table();
    assert!(table.contains("total"), "{table}");
    assert!(
        table.contains("+0.100 ms [+0.100, +0.100] (4 pairs)"),
        "{table}"
    );
    let csv = c.render_csv();
    assert!(csv.starts_with("input,phase,statistic,value\n"));
    assert!(csv.contains("A,total,median_us,315\n"), "{csv}");
    assert!(csv.contains("B-A,total,median_diff_us,100\n"), "{csv}");
}

#[test]
fn compare_bootstrap_is_seeded_and_brackets_the_estimate() {
    let mk = |shift: &dyn Fn(u64) -> u64| {
        let batches = (0..30u64)
            .map(|i| (0..9).map(|k| rec(k, 200 + 7 * k + shift(i))).collect())
            .collect();
        Input::from_batches("x", batches)
    };
    let a = mk(&|_| 0);
    let b = mk(&|i| 50 + (i * 37) % 41);
    let c1 = compare(&a, &b);
    let c2 = compare(&a, &b);
    assert_eq!(c1, c2, "same inputs, same numbers");
    let d = c1.phases[2].diff.unwrap();
    assert_eq!(d.pairs, 30);
    assert!(
        d.ci_low_us <= d.median_diff_us && d.median_diff_us <= d.ci_high_us,
        "{d:?}"
    );
    assert!(d.ci_low_us >= 50.0 && d.ci_high_us <= 90.0, "{d:?}");
    assert!(d.ci_low_us < d.ci_high_us, "{d:?}");
}

#[test]
fn compare_reports_two_clusters_instead_of_one_median() {
    // 70 transfers near 20 ms and 30 near 90 ms.
    let records: Vec<TimingRecord> = (0..100u64)
        .map(|i| {
            rec(
                i,
                if i < 70 {
                    19_000 + 30 * i
                } else {
                    88_000 + 50 * (i - 70)
                },
            )
        })
        .collect();
    let input = Input::from_records("bulk", records, 25);
    assert_eq!(input.batches.len(), 4);
    let c = compare(&input, &input);
    let [lo, hi] = c.a.phases[2].clusters.expect("two clusters");
    assert_eq!((lo.count, hi.count), (70, 30));
    // Medians of 19000+30i (i<70): i = 34.5 -> 20035; 88000+50j (j<30): j = 14.5 -> 88725.
    assert_eq!((lo.median_us, hi.median_us), (20_035.0, 88_725.0));
    let table = c.render_table();
    assert!(
        table.contains("two clusters: 70 at 20.035 ms and 30 at 88.725 ms"),
        "{table}"
    );
    assert!(c.render_csv().contains("A,total,cluster2_count,30\n"));

    // A single spread-out cluster is not split.
    let spread: Vec<f64> = (0..200).map(|i| 100.0 * 1.01f64.powi(i)).collect();
    assert!(two_clusters(&spread).is_none());
    // Nor is a small outlier group (< 10%).
    let mut v: Vec<f64> = (0..95).map(|i| 100.0 + i as f64).collect();
    v.extend((0..5).map(|i| 10_000.0 + i as f64));
    assert!(two_clusters(&v).is_none());
}

#[test]
fn compare_leaves_denied_records_out_and_cuts_single_files_into_batches() {
    let mut records: Vec<TimingRecord> = (0..600).map(|i| rec(i, 1000 + i)).collect();
    for r in records.iter_mut().take(10) {
        r.verdict = "deny".into();
    }
    let input = Input::from_records("one", records, 256);
    assert_eq!(input.excluded, 10);
    let sizes: Vec<usize> = input.batches.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![256, 256, 78]);
}

#[test]
fn plot_draws_an_svg_of_both_runs() {
    let dir = tempfile::tempdir().unwrap();
    let a = Input::from_records(
        "direct",
        (0..100).map(|i| rec(i, 200 + 3 * i)).collect(),
        50,
    );
    let b = Input::from_records(
        "proxied",
        (0..100).map(|i| rec(i, 300 + 5 * i)).collect(),
        50,
    );
    let path = dir.path().join("cmp.svg");
    timing::plot_svg(&a, &b, &path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
    assert!(svg.contains("proxied") && svg.contains("direct") && svg.contains("first_byte"));
    assert!(
        svg.matches("<polyline").count() >= 6,
        "two curves in each of three panels"
    );
}
