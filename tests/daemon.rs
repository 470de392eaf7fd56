//! A real `sluice daemon`: what it exports on /metrics as sandboxes come
//! and go, scraped as an operator would (the drop counters of a sandbox in
//! the first scrape after its attach, no bundle revision of a bundle no
//! sandbox enforces any more), and the sandbox ids its API refuses. A real daemon, real namespaces; no container
//! runtime (a process stands in for the container). Needs root; skips loudly
//! without it, fails under SLUICE_REQUIRE_PRIVILEGED=1.

mod common;

use common::daemon::{Daemon, StandInVmm};
use common::*;

const POLICY: &str = "version: 1\nname: scraped\nrules:\n  - name: origin\n    action: allow\n    cidrs: [\"198.18.0.1/32\"]\n    ports: [8080]\n";

const METRICS: &str = "127.0.0.1:19470";

/// A container's namespace as the OCI hook sends it (no link out), with a
/// process standing in for the container.
fn container(name: &str) -> (OuterNetns, StandInVmm) {
    let ns = OuterNetns::create(name, &[]).expect("container namespace");
    let process = StandInVmm::start(&ns);
    (ns, process)
}

fn scrape(w: &World) -> String {
    let text = w.http_get_outer(METRICS, "/metrics").expect("scrape");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

#[test]
fn the_first_scrape_after_an_attach_has_the_sandboxs_drop_counters() {
    let Some(w) = World::new() else { return };
    let daemon = Daemon::start_with_metrics(&w, METRICS);
    let (ns, process) = container("sluice-dm-drops");
    daemon.attach_container(
        "ctr-drops",
        &ns.path(),
        process.pid(),
        Some(w.policy(POLICY)),
        None,
    );
    let text = scrape(&w);
    assert_eq!(
        metric_value(
            &text,
            "sluice_dropped_packets_total",
            &[r#"sandbox="ctr-drops""#, r#"reason="output""#]
        ),
        Some(0.0),
        "{text}\ndaemon: {}",
        daemon.log_text()
    );
}

#[test]
fn a_bundles_revision_series_goes_when_its_last_sandbox_is_detached() {
    let Some(w) = World::new() else { return };
    let daemon = Daemon::start_with_metrics(&w, METRICS);
    let (bundle, trust) = signed_bundle(w.dir.path(), POLICY, 7);
    let (ns_a, a) = container("sluice-dm-a");
    let (ns_b, b) = container("sluice-dm-b");
    let with_bundle = || Some((bundle.clone(), trust.clone()));
    daemon.attach_container("ctr-a", &ns_a.path(), a.pid(), None, with_bundle());
    daemon.attach_container("ctr-b", &ns_b.path(), b.pid(), None, with_bundle());
    let revision =
        |text: &str| metric_value(text, "sluice_bundle_revision", &[r#"bundle="scraped""#]);
    let text = scrape(&w);
    assert_eq!(revision(&text), Some(7.0), "{text}");

    let client = sluice::daemon::Client::new(&daemon.socket);
    let detach = |id: &str| {
        client
            .detach(&id.parse().unwrap())
            .unwrap_or_else(|e| panic!("detach {id}: {e}"))
            .unwrap_or_else(|| panic!("{id} was not attached"));
    };
    detach("ctr-a");
    // ctr-b still enforces the bundle.
    let text = scrape(&w);
    assert_eq!(revision(&text), Some(7.0), "{text}");
    detach("ctr-b");
    let text = scrape(&w);
    assert_eq!(revision(&text), None, "{text}");
}

#[test]
fn a_bundles_expiry_is_exported_beside_its_revision_and_goes_with_it() {
    let Some(w) = World::new() else { return };
    let daemon = Daemon::start_with_metrics(&w, METRICS);
    let before = time::OffsetDateTime::now_utc().unix_timestamp();
    // Signed to expire a day from now.
    let (bundle, trust) = signed_bundle(w.dir.path(), POLICY, 3);
    let after = time::OffsetDateTime::now_utc().unix_timestamp();
    let (ns, process) = container("sluice-dm-exp");
    daemon.attach_container(
        "ctr-exp",
        &ns.path(),
        process.pid(),
        None,
        Some((bundle, trust)),
    );
    let expiry = |text: &str| {
        metric_value(
            text,
            "sluice_bundle_expiry_timestamp_seconds",
            &[r#"bundle="scraped""#],
        )
    };
    let text = scrape(&w);
    let day = 86_400.0;
    let at = expiry(&text).unwrap_or_else(|| panic!("no expiry: {text}"));
    // The manifest keeps whole seconds.
    assert!(
        at >= (before as f64 + day - 1.0) && at <= (after as f64 + day + 1.0),
        "{at} not a day after {before}..{after}"
    );
    sluice::daemon::Client::new(&daemon.socket)
        .detach(&"ctr-exp".parse().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(expiry(&scrape(&w)), None);
}

#[test]
fn the_daemon_refuses_an_attach_of_a_bad_sandbox_id_naming_the_rule() {
    let Some(w) = World::new() else { return };
    let daemon = Daemon::start(&w);
    let policy = w.policy(POLICY);
    for id in bad_sandbox_ids()
        .into_iter()
        .chain(["".to_string(), "a b".to_string()])
    {
        let body = serde_json::json!({"id": id, "policy": policy}).to_string();
        let (status, answer) = daemon.raw_request("POST", "/v1/sandboxes", &body);
        assert_eq!(status, 400, "{id:?}: {answer}");
        let error: serde_json::Value = serde_json::from_str(&answer).expect("a JSON error");
        let error = error["error"].as_str().expect("an error message");
        assert!(
            error.contains(&bad_sandbox_id_message(&id)),
            "{id:?}: {error}"
        );
    }
}

#[test]
fn the_daemon_refuses_a_detach_of_a_bad_sandbox_id_naming_the_rule() {
    let Some(w) = World::new() else { return };
    let daemon = Daemon::start(&w);
    for id in bad_sandbox_ids() {
        let (status, answer) = daemon.raw_request("DELETE", &format!("/v1/sandboxes/{id}"), "");
        assert_eq!(status, 400, "{id:?}: {answer}");
        let error: serde_json::Value = serde_json::from_str(&answer).expect("a JSON error");
        assert_eq!(error["error"], bad_sandbox_id_message(&id), "{id:?}");
    }
}
