//! Metrics, audit records and timings of a real `sluice run`, observed the
//! way an operator would: scraping /metrics from sluice's namespace, reading
//! the audit log and the timing file.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;

const POLICY: &str = r#"
version: 1
name: observed
rules:
  - name: origin
    action: allow
    cidrs: ["198.18.0.0/24"]
    ports: [8080, 9464]
dns:
  upstream: []
  hosts:
    origin.test: ["198.18.0.1"]
"#;

/// Start `script` under sluice with extra flags; returns the child once the
/// workload printed "ready", with what it printed until then.
fn start(w: &World, flags: &[&str], script: &str) -> (std::process::Child, String) {
    let mut cmd = w.outer.command(sluice_bin());
    cmd.arg("run")
        .arg("--policy")
        .arg(w.policy(POLICY))
        .arg("--audit")
        .arg(w.audit_path())
        .arg("--state-dir")
        .arg(w.state_dir())
        .args(flags)
        .args(["--", "sh", "-c", script]);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 512];
    use std::io::Read;
    while !String::from_utf8_lossy(&seen).contains("ready") {
        let n = out.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "workload ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    (child, String::from_utf8_lossy(&seen).into_owned())
}

fn finish(w: &World, child: std::process::Child) -> std::process::Output {
    std::fs::write(w.go_path(), b"").unwrap();
    wait_bounded(child, Duration::from_secs(30))
}

#[test]
fn metrics_count_allowed_and_denied_connections_by_rule() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    let bin = sluice_bin();
    let script = format!(
        "{bin} probe http http://198.18.0.1:8080/ >/dev/null; \
         {bin} probe http http://origin.test:8080/bytes/1000 >/dev/null; \
         {bin} probe http http://198.18.0.1:8081/ >/dev/null; \
         {bin} probe dns nowhere.example >/dev/null; \
         {bin} probe udp 198.18.0.1:9 >/dev/null; \
         echo ready; {}",
        w.wait_for_go()
    );
    let (child, _) = start(&w, &["--metrics", "127.0.0.1:19464"], &script);
    // The drop counter is read in the background: scrape until it has
    // caught up with the UDP datagram the workload tried to send.
    let mut text = String::new();
    let caught_up = eventually(Duration::from_secs(20), || {
        text = w
            .http_get_outer("127.0.0.1:19464", "/metrics")
            .expect("scrape");
        metric_value(&text, "sluice_dropped_packets_total", &[]).is_some_and(|v| v >= 1.0)
    });
    let _ = finish(&w, child);
    assert!(caught_up, "the drop counter never showed the drop:\n{text}");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let v = |name: &str, labels: &[&str]| metric_value(&text, name, labels);
    assert_eq!(
        v(
            "sluice_connections_total",
            &[r#"verdict="allow""#, r#"rule="origin""#, r#"path="host""#]
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        v(
            "sluice_connections_total",
            &[r#"verdict="deny""#, r#"rule="none""#]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        v(
            "sluice_denies_total",
            &[r#"path="host""#, r#"verdict="deny""#, r#"reason="no-rule""#]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        v("sluice_dns_queries_total", &[r#"verdict="refused""#]),
        Some(1.0),
        "{text}"
    );
    // The resolver asks for A and AAAA.
    assert!(
        v("sluice_dns_queries_total", &[r#"verdict="allow""#]).unwrap() >= 1.0,
        "{text}"
    );
    assert!(
        v("sluice_bytes_total", &[r#"direction="down""#]).unwrap() >= 1000.0,
        "{text}"
    );
    assert!(
        v("sluice_dropped_packets_total", &[]).unwrap() >= 1.0,
        "{text}"
    );
    assert_eq!(
        v("sluice_connect_seconds_count", &[r#"path="host""#]),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        v("sluice_first_byte_seconds_count", &[r#"path="host""#]),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        v("sluice_active_connections", &[r#"path="host""#]),
        Some(0.0),
        "{text}"
    );
}

#[test]
fn the_first_scrape_of_sluice_run_already_has_the_drop_counters() {
    let Some(w) = World::new() else { return };
    let script = format!("echo ready; {}", w.wait_for_go());
    let (child, _) = start(&w, &["--metrics", "127.0.0.1:19468"], &script);
    let sandbox = format!(r#"sandbox="host-{}""#, child.id());
    // One scrape, as a one-off `curl /metrics` or an absent() alert sees it.
    let text = w
        .http_get_outer("127.0.0.1:19468", "/metrics")
        .expect("scrape");
    let _ = finish(&w, child);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(
        metric_value(
            &text,
            "sluice_dropped_packets_total",
            &[&sandbox, r#"reason="output""#]
        ),
        Some(0.0),
        "{text}"
    );
}

#[test]
fn a_metrics_address_in_use_is_bad_input_and_exits_2() {
    let Some(w) = World::new() else { return };
    let taken = w
        .outer
        .run_in(|| std::net::TcpListener::bind("127.0.0.1:19469"))
        .unwrap()
        .expect("take the port");
    let marker = w.dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let out = run_with(&w, &["--metrics", "127.0.0.1:19469"], &["sh", "-c", &touch]);
    drop(taken);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("pick a free address for --metrics"),
        "{}",
        stderr(&out)
    );
    assert!(!marker.exists(), "the command ran without its metrics");
}

#[test]
fn the_metrics_endpoint_is_not_reachable_from_the_sandbox() {
    let Some(w) = World::new() else { return };
    // Listening on the origin's address, on a port the policy allows: the
    // proxy still refuses it, and the sandbox's own loopback has nothing.
    let bin = sluice_bin();
    let script = format!(
        "{bin} probe http http://198.18.0.1:9464/metrics; \
         {bin} probe http http://127.0.0.1:9464/metrics; echo ready; {}",
        w.wait_for_go()
    );
    let (child, text) = start(&w, &["--metrics", "198.18.0.1:9464"], &script);
    let scraped = w
        .http_get_outer("198.18.0.1:9464", "/metrics")
        .expect("scrape from outside");
    let _ = finish(&w, child);
    assert!(scraped.contains("sluice_build_info"), "{scraped}");
    assert!(!text.contains("HTTP 200"), "{text}");
    assert!(text.contains("HTTP 403"), "{text}");
    let audit = w.audit();
    assert!(
        audit.iter().any(|r| r["reason"] == "internal-address"),
        "{audit:?}"
    );
}

#[test]
fn every_deny_is_audited_when_denies_come_as_fast_as_a_client_can_make_them() {
    let Some(w) = World::new() else { return };
    let out = w.probe(
        &w.policy(POLICY),
        &[
            "http",
            "--count",
            "2000",
            "--concurrency",
            "16",
            "http://198.18.0.1:8081/",
        ],
    );
    assert!(stdout(&out).contains("failures 2000"), "{}", stdout(&out));
    let audit = w.audit();
    assert_eq!(audit.len(), 2000);
    let verify = std::process::Command::new(sluice_bin())
        .args(["audit", "verify"])
        .arg(w.audit_path())
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", stdout(&verify));
    assert!(
        stdout(&verify).contains("2000 records"),
        "{}",
        stdout(&verify)
    );
}

#[test]
fn timings_have_one_record_per_connection_with_monotone_phases() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    let timings = w.dir.path().join("timings.csv");
    let policy = w.policy(POLICY);
    let mut cmd = w.run_command(
        &policy,
        &[
            sluice_bin(),
            "probe",
            "http",
            "--count",
            "50",
            "--concurrency",
            "4",
            "http://198.18.0.1:8080/bytes/2048",
        ],
    );
    // Flags after `run` and before `--`: rebuild with --timings.
    let mut args: Vec<std::ffi::OsString> = cmd.get_args().map(|a| a.to_owned()).collect();
    let run_at = args.iter().position(|a| a == "run").unwrap();
    args.insert(run_at + 1, timings.clone().into());
    args.insert(run_at + 1, "--timings".into());
    cmd = std::process::Command::new(cmd.get_program());
    cmd.args(args);
    let out = wait_bounded(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let records = sluice::timing::read_file(&timings).expect("timing file");
    assert_eq!(records.len(), 50);
    for r in &records {
        let decide = r.decide_us.expect("decided");
        let connect = r.connect_us.expect("connected");
        let first = r.first_byte_us.expect("first byte");
        assert!(
            decide <= connect && connect <= first && first <= r.total_us,
            "{r:?}"
        );
        assert_eq!(r.verdict, "allow");
        assert!(r.bytes_down > 2048, "{r:?}");
        assert!(r.bytes_up > 0, "{r:?}");
    }
}

#[test]
fn a_real_prometheus_server_scrapes_sluice() {
    let Some(w) = World::new() else { return };
    let Some(prometheus) = tool_path("prometheus") else {
        if std::env::var("SLUICE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
            panic!("prometheus is not installed (apt-get install prometheus)");
        }
        eprintln!("SKIPPED: prometheus is not installed (apt-get install prometheus)");
        return;
    };
    w.http_origin("198.18.0.1:8080");
    let script = format!(
        "{} probe http http://198.18.0.1:8080/ >/dev/null; echo ready; {}",
        sluice_bin(),
        w.wait_for_go()
    );
    let (child, _) = start(&w, &["--metrics", "127.0.0.1:19465"], &script);

    let config = w.dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: sluice\n    static_configs: [{targets: ['127.0.0.1:19465']}]\n",
    )
    .unwrap();
    let mut server = w
        .outer
        .command(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            w.dir.path().join("tsdb").display()
        ))
        .arg("--web.listen-address=127.0.0.1:19090")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let query = "/api/v1/query?query=sluice_connections_total%7Bverdict%3D%22allow%22%7D";
    let mut answer = String::new();
    let scraped = eventually(Duration::from_secs(40), || {
        answer = w
            .http_get_outer("127.0.0.1:19090", query)
            .unwrap_or_default();
        answer.contains(r#""rule":"origin""#)
    });
    let _ = server.kill();
    let _ = server.wait();
    let _ = finish(&w, child);
    assert!(scraped, "Prometheus never returned the counter: {answer}");
    assert!(answer.contains(r#""1"]"#), "{answer}");
}

#[test]
fn scrapes_and_connections_both_succeed_at_once() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    let bin = sluice_bin();
    let stop = w.dir.path().join("stop");
    let result = w.dir.path().join("result");
    // Fresh connections one after another until the test says stop.
    let script = format!(
        "echo ready; {}; i=0; fails=0; \
         while [ ! -e {stop} ] && [ $i -lt 5000 ]; do \
           {bin} probe http http://198.18.0.1:8080/ >/dev/null || fails=$((fails+1)); i=$((i+1)); \
         done; echo requests=$i fails=$fails > {result}",
        w.wait_for_go(),
        stop = stop.display(),
        result = result.display()
    );
    let (child, _) = start(&w, &["--metrics", "127.0.0.1:19466"], &script);
    std::fs::write(w.go_path(), b"").unwrap();
    // Scrape while the connections go on, until the scrapes have seen the
    // count of connections grow twice: both were served at the same time.
    let mut seen: Vec<f64> = Vec::new();
    let mut scrapes = 0;
    let both = eventually(Duration::from_secs(60), || {
        let text = w
            .http_get_outer("127.0.0.1:19466", "/metrics")
            .expect("a scrape during the connections failed");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        scrapes += 1;
        let allowed =
            metric_value(&text, "sluice_connections_total", &[r#"verdict="allow""#]).unwrap_or(0.0);
        if seen.last() != Some(&allowed) {
            seen.push(allowed);
        }
        seen.len() >= 3
    });
    std::fs::write(&stop, b"").unwrap();
    let out = finish(&w, child);
    assert!(
        both,
        "connections were not counted while scraping: {seen:?}"
    );
    let text = std::fs::read_to_string(&result).unwrap_or_default();
    let requests: u64 = text
        .split("requests=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no request count: {text}\n{}", stderr(&out)));
    assert!(requests >= 2, "{text}");
    assert!(text.contains("fails=0"), "{text}\n{}", stderr(&out));
    assert!(scrapes >= 3);
}

/// `sluice run --policy POLICY --audit A --state-dir S FLAGS -- argv`, to
/// completion.
fn run_with(w: &World, flags: &[&str], argv: &[&str]) -> std::process::Output {
    let mut cmd = w.outer.command(sluice_bin());
    cmd.arg("run")
        .arg("--policy")
        .arg(w.policy(POLICY))
        .arg("--audit")
        .arg(w.audit_path())
        .arg("--state-dir")
        .arg(w.state_dir())
        .args(flags)
        .arg("--")
        .args(argv);
    wait_bounded(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(60),
    )
}

#[test]
fn a_signed_checkpoint_is_written_at_shutdown_and_anchors_every_record() {
    let Some(w) = World::new() else { return };
    // Neither by count nor by time: only shutdown can sign.
    let out = run_with(
        &w,
        &[
            "--audit-checkpoint-records",
            "0",
            "--audit-checkpoint-interval",
            "0s",
        ],
        &[sluice_bin(), "probe", "http", "http://198.18.0.1:8081/"],
    );
    assert!(stdout(&out).contains("HTTP 403"), "{}", stderr(&out));
    let lines = audit_lines(&w.audit_path());
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["verdict"], "deny");
    assert_eq!(lines[1]["kind"], "checkpoint", "{lines:?}");
    let public = w.state_dir().join("audit.pub");
    let verify = std::process::Command::new(sluice_bin())
        .args(["audit", "verify", "--key"])
        .arg(&public)
        .arg(w.audit_path())
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", stdout(&verify));
    assert!(
        stdout(&verify).contains("every record is anchored"),
        "{}",
        stdout(&verify)
    );
}

#[test]
fn the_audit_head_seq_is_exported_as_a_metric() {
    let Some(w) = World::new() else { return };
    let bin = sluice_bin();
    let script = format!(
        "{bin} probe http http://198.18.0.1:8081/ >/dev/null; echo ready; {}",
        w.wait_for_go()
    );
    let (child, _) = start(
        &w,
        &[
            "--metrics",
            "127.0.0.1:19467",
            "--audit-checkpoint-interval",
            "0s",
        ],
        &script,
    );
    let mut text = String::new();
    let shown = eventually(Duration::from_secs(20), || {
        text = w
            .http_get_outer("127.0.0.1:19467", "/metrics")
            .expect("scrape");
        metric_value(&text, "sluice_audit_head_seq", &[]).is_some_and(|v| v >= 0.0)
    });
    let lines = audit_lines(&w.audit_path());
    let _ = finish(&w, child);
    assert!(shown, "the head never showed the deny:\n{text}");
    let last = lines.last().expect("a record");
    assert_eq!(
        metric_value(&text, "sluice_audit_head_seq", &[]),
        last["seq"].as_f64(),
        "{text}"
    );
    // No checkpoint is due yet (1000 records, no interval).
    assert_eq!(
        metric_value(&text, "sluice_audit_checkpoint_seq", &[]),
        Some(-1.0),
        "{text}"
    );
}
