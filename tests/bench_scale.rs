//! `sluice bench-scale` end to end at small size: a daemon with three
//! sandboxes attached through its API relays 30 held connections, each of
//! which round-tripped; the report and its CSVs have the documented shape;
//! nothing is left behind. Timings and RSS values are never asserted.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

#[test]
fn a_small_scale_run_attaches_every_sandbox_round_trips_every_connection_and_leaves_nothing() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(sluice_bin())
        .args(["bench-scale", "--sandboxes", "3", "--conns", "30", "--out"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = wait_bounded(child, Duration::from_secs(300));
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    let report = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    assert!(report.contains("3 sandboxes attached"), "{report}");
    assert!(
        report.contains("30 of 30 connections round-tripped"),
        "{report}"
    );
    let attach = std::fs::read_to_string(dir.path().join("attach.csv")).unwrap();
    assert_eq!(attach.lines().next(), Some("sandbox,attach_ms"));
    assert_eq!(attach.lines().count(), 1 + 3, "{attach}");
    let rss = std::fs::read_to_string(dir.path().join("rss.csv")).unwrap();
    let steps: Vec<&str> = rss
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "attached",
            "7 connections",
            "15 connections",
            "22 connections",
            "30 connections",
            "all closed",
            "all detached"
        ],
        "{rss}"
    );
    let names = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .to_string();
    assert!(
        !names.contains(&format!("sluice-scale-{pid}-"))
            && !names.contains(&format!("sluice-scale-sbx-{pid}-")),
        "{names}"
    );
    assert!(!std::env::temp_dir()
        .join(format!("sluice-scale-{pid}-0"))
        .exists());
}
