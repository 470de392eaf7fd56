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

/// `sluice bench-scale --run` at small size: one `sluice run` per mode holds
/// 64 connections, plain (a cidrs rule) and checked (a hosts rule; the tool
/// itself checks that a request for another name on a held connection gets
/// the origin's 200 when plain and sluice's 403 when checked), and reports
/// an RSS and a per-connection figure for each; nothing is left behind.
#[test]
fn a_small_run_scale_holds_plain_and_checked_connections_and_reports_each_mode() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(sluice_bin())
        .args(["bench-scale", "--run", "--conns", "64", "--out"])
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
    let rss = std::fs::read_to_string(dir.path().join("rss.csv")).unwrap();
    assert_eq!(
        rss.lines().next(),
        Some("mode,step,connections,vmrss_kib,vmhwm_kib,rssanon_kib,fds,threads")
    );
    let rows: Vec<Vec<&str>> = rss
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    for mode in ["plain", "checked"] {
        let steps: Vec<(&str, &str)> = rows
            .iter()
            .filter(|r| r[0] == mode)
            .map(|r| (r[1], r[2]))
            .collect();
        assert_eq!(
            steps,
            [
                ("before", "0"),
                ("16 connections", "16"),
                ("32 connections", "32"),
                ("48 connections", "48"),
                ("64 connections", "64")
            ],
            "{mode}: {rss}"
        );
        for row in rows.iter().filter(|r| r[0] == mode) {
            let kib: u64 = row[3].parse().unwrap();
            assert!(kib > 0, "{mode}: no VmRSS read: {rss}");
        }
        // At 64 connections sluice holds at least two sockets for each.
        let fds = |step: &str| -> u64 {
            rows.iter().find(|r| r[0] == mode && r[1] == step).unwrap()[6]
                .parse()
                .unwrap()
        };
        assert!(
            fds("64 connections") >= fds("before") + 128,
            "{mode}: {rss}"
        );
    }
    let report = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    for mode in ["plain", "checked"] {
        let row = report
            .lines()
            .find(|l| l.starts_with(&format!("| {mode} | ")))
            .unwrap_or_else(|| panic!("no {mode} row: {report}"));
        // before, at 64, per connection, slope, RssAnon per connection.
        let numbers: Vec<f64> = row
            .split('|')
            .skip(2)
            .filter(|c| !c.trim().is_empty())
            .map(|c| c.trim().parse().unwrap())
            .collect();
        assert_eq!(numbers.len(), 5, "{row}");
        assert!(numbers[0] > 0.0 && numbers[1] > 0.0, "{row}");
    }
    let names = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .to_string();
    assert!(
        !names.contains(&format!("sluice-scale-run-{pid}-")),
        "{names}"
    );
    assert!(!std::env::temp_dir()
        .join(format!("sluice-scale-run-{pid}-0"))
        .exists());
}
