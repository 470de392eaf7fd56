//! `sluice bench --quick` end to end: every available condition runs (oci in
//! an image built here, haproxy when installed), the report and its data
//! files have the documented shape, every deny check passes under sluice,
//! the vm conditions are skipped with one line when there is no guest kit,
//! and nothing is left behind; an interrupted bench cleans up too. The
//! quick run is made once and shared by the tests that read it; so is a
//! smaller run of native, vm and vm-direct with the guest kit (two boots
//! per VM condition). Timings are never asserted.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use sluice::bench::{ConditionKind, Workload};

/// The quick run: its output, its pid, the report dir, what ran.
struct Run {
    out: Output,
    pid: u32,
    dir: tempfile::TempDir,
    conditions: Vec<&'static str>,
}

static RUN: OnceLock<Option<Run>> = OnceLock::new();

fn quick_run() -> Option<&'static Run> {
    RUN.get_or_init(|| {
        if !privileged() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let mut conditions = vec!["native", "reference", "host", "tokio-proxy"];
        let image = format!("localhost/sluice-bench-test:{}", std::process::id());
        let oci = tool_path("podman").is_some() && tool_path("runc").is_some();
        if oci {
            build_test_image(&image, &[], None).expect("test image");
            conditions.push("oci");
        }
        if tool_path("haproxy").is_some() {
            conditions.push("haproxy");
        }
        let child = Command::new(sluice_bin())
            .args([
                "bench", "--quick", "--seed", "7", "--image", &image, "--out",
            ])
            .arg(dir.path())
            // The VM conditions have a run of their own (vm_run); here
            // they are skipped, not built.
            .arg("--no-build")
            .env("SLUICE_VM_KIT", "/nonexistent/sluice-vm-kit")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = wait_bounded(child, Duration::from_secs(600));
        if oci {
            let _ = Command::new("podman").args(["rmi", "-f", &image]).output();
        }
        Some(Run {
            out,
            pid,
            dir,
            conditions,
        })
    })
    .as_ref()
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn succeeded(run: &Run) {
    assert!(
        run.out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        run.out.status,
        stdout(&run.out),
        stderr(&run.out)
    );
}

/// The rows of a CSV file, each a column -> value map, after checking the
/// header is `header`.
fn csv_rows(text: &str, header: &str) -> Vec<std::collections::HashMap<String, String>> {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(header));
    let columns: Vec<&str> = header.split(',').collect();
    lines
        .map(|line| {
            let values: Vec<&str> = line.split(',').collect();
            assert_eq!(values.len(), columns.len(), "{line}");
            columns
                .iter()
                .map(|c| c.to_string())
                .zip(values.iter().map(|v| v.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn a_quick_bench_writes_the_report_its_data_and_its_plots() {
    let Some(run) = quick_run() else { return };
    succeeded(run);
    for name in ["report.md", "batches.csv", "paired.csv", "raw.jsonl"] {
        assert!(run.dir.path().join(name).is_file(), "{name} missing");
    }
    for svg in ["ecdf-small.svg", "paired.svg"] {
        assert!(read(run.dir.path(), svg).starts_with("<svg"), "{svg}");
    }
    let report = read(run.dir.path(), "report.md");
    for needed in [
        "sluice bench --quick --seed 7",
        "Seed 7.",
        "CPUs",
        "Linux ",
        "| condition | small P50 | small P95 | x native |",
        "## Paired differences to native",
        "## DESIGN.md's targets, host",
    ] {
        assert!(report.contains(needed), "no {needed:?} in:\n{report}");
    }
    for condition in &run.conditions {
        assert!(
            report.contains(&format!("\n| {condition} |")),
            "no row for {condition}:\n{report}"
        );
    }
    // The same table goes to stdout.
    assert!(
        stdout(&run.out).contains("| host |"),
        "{}",
        stdout(&run.out)
    );
}

#[test]
fn batches_csv_has_a_row_per_condition_workload_and_batch() {
    let Some(run) = quick_run() else { return };
    succeeded(run);
    let rows = csv_rows(
        &read(run.dir.path(), "batches.csv"),
        sluice::bench::report::BATCHES_HEADER,
    );
    let mut expected = 0;
    for condition in &run.conditions {
        let kind = ConditionKind::parse(condition).unwrap();
        for workload in Workload::ALL {
            let batches: Vec<&str> = rows
                .iter()
                .filter(|r| r["condition"] == *condition && r["workload"] == workload.name())
                .map(|r| r["batch"].as_str())
                .collect();
            // A condition that cannot run a workload (l7 without a proxy
            // that terminates TLS) has no row for it.
            let wanted: &[&str] = if kind.runs(workload) {
                &["1", "2", "3"]
            } else {
                &[]
            };
            assert_eq!(batches, wanted, "{condition} {}", workload.name());
            expected += wanted.len();
        }
    }
    assert_eq!(rows.len(), expected);
    for r in &rows {
        assert!(
            r["median_ms"].parse::<f64>().is_ok() || r["ok"] == "false",
            "{r:?}"
        );
        // The proxy's CPU is measured where there is a proxy, and only there.
        let proxied = r["condition"] != "native" && r["condition"] != "reference";
        assert_eq!(!r["cpu_us_per_connection"].is_empty(), proxied, "{r:?}");
    }
}

#[test]
fn the_report_sets_l7_beside_tls_for_sluice_and_the_peer_that_terminates() {
    let Some(run) = quick_run() else { return };
    succeeded(run);
    let report = read(run.dir.path(), "report.md");
    let table = report
        .split("## TLS: relayed by SNI (tls) and terminated with a header injected (l7)")
        .nth(1)
        .unwrap_or_else(|| panic!("no TLS section in:\n{report}"));
    let row = |condition: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("| {condition} |")))
            .unwrap_or_else(|| panic!("no TLS row for {condition}:\n{table}"))
            .split('|')
            .map(str::trim)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    // Columns: condition, tls P50, x native, tls tail, l7 P50, x native, l7 tail.
    let mut terminating = vec!["native", "host"];
    if run.conditions.contains(&"haproxy") {
        terminating.push("haproxy");
    }
    for condition in terminating {
        let cells = row(condition);
        for (i, what) in [(2, "tls P50"), (5, "l7 P50")] {
            assert!(
                cells[i].parse::<f64>().is_ok(),
                "{condition} {what}: {cells:?}"
            );
        }
        assert_eq!(cells[7].split(" / ").count(), 3, "{condition}: {cells:?}");
    }
    // A TCP relay has nothing to terminate with: it says so.
    let relay = row("tokio-proxy");
    assert!(relay[2].parse::<f64>().is_ok(), "{relay:?}");
    assert!(relay[7].starts_with("skipped: "), "{relay:?}");
}

#[test]
fn the_report_sets_native_beside_the_reference_pair_and_gives_every_tail() {
    let Some(run) = quick_run() else { return };
    succeeded(run);
    let report = read(run.dir.path(), "report.md");
    let section = report
        .split("## Calibration and tails")
        .nth(1)
        .unwrap_or_else(|| panic!("no calibration section in:\n{report}"));
    let calibration = section
        .lines()
        .find(|l| l.starts_with("Calibration: native's small P50 is "))
        .unwrap_or_else(|| panic!("no calibration line in:\n{section}"));
    let over: f64 = calibration
        .split("native / reference = ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no ratio in {calibration:?}"));
    // Either verdict is a behaviour the report may state; which one is the
    // machine's business. The line must match its ratio.
    assert_eq!(
        calibration.contains("**not calibrated**"),
        (over - 1.0).abs() > 0.15,
        "{calibration}"
    );
    for condition in &run.conditions {
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| {condition} |")))
            .unwrap_or_else(|| panic!("no tails row for {condition}:\n{section}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // small, serial, start+exit: each P50 / P90 / P99.
        for cell in &cells[2..5] {
            let q: Vec<f64> = cell.split(" / ").filter_map(|v| v.parse().ok()).collect();
            assert!(
                q.len() == 3 && q[0] <= q[1] && q[1] <= q[2],
                "{condition}: {row}"
            );
        }
    }
}

#[test]
fn paired_csv_has_the_documented_columns_for_every_condition_but_native() {
    let Some(run) = quick_run() else { return };
    succeeded(run);
    let rows = csv_rows(
        &read(run.dir.path(), "paired.csv"),
        "condition,workload,diff_median_ms,ci_low_ms,ci_high_ms,ratio",
    );
    for condition in run.conditions.iter().filter(|c| **c != "native") {
        let metrics: Vec<&str> = rows
            .iter()
            .filter(|r| r["condition"] == *condition)
            .map(|r| r["workload"].as_str())
            .collect();
        // A metric for every workload the condition runs (no l7 where it
        // has no TLS of its own to terminate with; the reference pair runs
        // the plain workloads only).
        let kind = ConditionKind::parse(condition).unwrap();
        let mut expected = Vec::new();
        for workload in Workload::ALL.into_iter().filter(|w| kind.runs(*w)) {
            match workload.name() {
                "stream" => expected.extend(["stream-first-byte", "stream-last-byte"]),
                name => expected.push(name),
            }
        }
        expected.push("start-exit");
        assert_eq!(metrics, expected, "{condition}");
    }
    assert!(rows.iter().all(|r| r["condition"] != "native"));
    for r in &rows {
        let low: f64 = r["ci_low_ms"].parse().unwrap();
        let mid: f64 = r["diff_median_ms"].parse().unwrap();
        let high: f64 = r["ci_high_ms"].parse().unwrap();
        assert!(low <= mid && mid <= high, "{r:?}");
        assert!(r["ratio"].parse::<f64>().unwrap() > 0.0, "{r:?}");
    }
}

#[test]
fn every_deny_check_passes_under_sluice() {
    let Some(run) = quick_run() else { return };
    succeeded(run);
    let report = read(run.dir.path(), "report.md");
    for condition in run
        .conditions
        .iter()
        .filter(|c| ["host", "oci"].contains(c))
    {
        let row = report
            .lines()
            .find(|l| l.starts_with(&format!("| {condition} |")))
            .unwrap();
        assert!(row.contains("| 3/3 |"), "{row}");
    }
    // Where no policy is enforced there is nothing to check.
    let native = report
        .lines()
        .find(|l| l.starts_with("| native |"))
        .unwrap();
    assert!(!native.contains("/3 |"), "{native}");
    assert!(!report.contains("Deny checks that failed"), "{report}");
}

#[test]
fn raw_jsonl_has_every_request_time() {
    let Some(run) = quick_run() else { return };
    succeeded(run);
    let raw = read(run.dir.path(), "raw.jsonl");
    let records: Vec<serde_json::Value> = raw
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for condition in &run.conditions {
        // 3 batches of 256 small requests, if none failed.
        let small = records
            .iter()
            .filter(|r| r["condition"] == *condition && r["workload"] == "small")
            .count();
        assert!(small > 0 && small <= 3 * 256, "{condition}: {small}");
    }
    for r in &records {
        for field in [
            "batch",
            "seq",
            "connect_us",
            "first_byte_us",
            "last_byte_us",
            "total_us",
        ] {
            assert!(r[field].is_u64(), "{field} in {r}");
        }
        assert!(
            r["first_byte_us"].as_u64() <= r["last_byte_us"].as_u64(),
            "{r}"
        );
    }
}

#[test]
fn the_vm_conditions_are_skipped_with_one_line_each_without_a_guest_kit() {
    let Some(run) = quick_run() else { return };
    succeeded(run);
    let err = stderr(&run.out);
    let report = read(run.dir.path(), "report.md");
    for condition in ["vm", "vm-direct"] {
        let prefix = format!("{condition}: skipped: ");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with(&prefix)).collect();
        assert_eq!(lines.len(), 1, "{err}");
        // It says what is missing and how to get it.
        assert!(
            lines[0].contains("build-guest.sh") || lines[0].contains("apt-get install"),
            "{}",
            lines[0]
        );
        assert!(report.contains(lines[0]), "{report}");
    }
}

/// The run of the VM conditions: its output, its pid, the report dir.
static VM_RUN: OnceLock<Option<Run>> = OnceLock::new();

fn vm_run() -> Option<&'static Run> {
    VM_RUN
        .get_or_init(|| {
            let kit = common::vm::Kit::get()?;
            let dir = tempfile::tempdir().unwrap();
            let child = Command::new(sluice_bin())
                .args(["bench", "--quick", "--conditions", "native,vm,vm-direct"])
                .args(["--batches", "2", "--warmups", "0", "--conns", "16"])
                .args(["--threads", "4", "--seed", "11", "--out"])
                .arg(dir.path())
                .env("SLUICE_VM_KIT", kit.dir())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let pid = child.id();
            let out = wait_bounded(child, Duration::from_secs(900));
            Some(Run {
                out,
                pid,
                dir,
                conditions: vec!["native", "vm", "vm-direct"],
            })
        })
        .as_ref()
}

#[test]
fn the_vm_conditions_run_every_workload_in_the_guest() {
    let Some(run) = vm_run() else { return };
    succeeded(run);
    let report = read(run.dir.path(), "report.md");
    for condition in &run.conditions {
        assert!(
            report.contains(&format!("\n| {condition} |")),
            "no row for {condition}:\n{report}"
        );
    }
    assert!(
        !stderr(&run.out).contains("skipped"),
        "{}",
        stderr(&run.out)
    );
    let rows = csv_rows(
        &read(run.dir.path(), "batches.csv"),
        sluice::bench::report::BATCHES_HEADER,
    );
    for condition in ["vm", "vm-direct"] {
        for workload in ["small", "serial", "bulk-1k", "bulk-64k", "stream", "tls"] {
            let ok: Vec<&str> = rows
                .iter()
                .filter(|r| r["condition"] == condition && r["workload"] == workload)
                .map(|r| r["ok"].as_str())
                .collect();
            assert_eq!(ok, ["true", "true"], "{condition} {workload}");
        }
    }
    // sluice vm's CPU is measured; the plain tap has no proxy.
    for r in rows.iter().filter(|r| r["condition"] != "native") {
        let proxied = r["condition"] == "vm";
        assert_eq!(!r["cpu_us_per_connection"].is_empty(), proxied, "{r:?}");
    }
    assert_nothing_left(run.pid);
}

#[test]
fn every_deny_check_passes_under_sluice_vm() {
    let Some(run) = vm_run() else { return };
    succeeded(run);
    let report = read(run.dir.path(), "report.md");
    let row = |condition: &str| {
        report
            .lines()
            .find(|l| l.starts_with(&format!("| {condition} |")))
            .unwrap_or_else(|| panic!("no {condition} row:\n{report}"))
            .to_string()
    };
    assert!(row("vm").contains("| 2/2 |"), "{}", row("vm"));
    // The plain tap enforces nothing: there is nothing to check.
    assert!(!row("vm-direct").contains("/2 |"), "{}", row("vm-direct"));
    assert!(!report.contains("Deny checks that failed"), "{report}");
}

#[test]
fn a_bench_leaves_no_namespace_or_temp_dir_behind() {
    let Some(run) = quick_run() else { return };
    succeeded(run);
    assert_nothing_left(run.pid);
}

fn assert_nothing_left(pid: u32) {
    let namespaces = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let ours = format!("-{pid}-");
    let left: Vec<String> = stdout(&namespaces)
        .lines()
        .filter(|l| l.starts_with("sluice-bench") && l.contains(&ours))
        .map(str::to_string)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let temp: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy()
                    .starts_with(&format!("sluice-bench{ours}"))
            })
        })
        .collect();
    assert!(temp.is_empty(), "{temp:?}");
}

#[test]
fn a_missing_oci_image_is_built_before_the_run_and_the_oci_condition_runs() {
    if !privileged() || tool_path("podman").is_none() || tool_path("runc").is_none() {
        return;
    }
    let image = format!("localhost/sluice-bench-built:{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(sluice_bin())
        .args([
            "bench",
            "--conditions",
            "native,oci",
            "--workloads",
            "small",
        ])
        .args(["--batches", "2", "--warmups", "0", "--conns", "16"])
        .args(["--threads", "4", "--seed", "13", "--image", &image, "--out"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = wait_bounded(child, Duration::from_secs(600));
    let built = Command::new("podman")
        .args(["image", "exists", &image])
        .status()
        .unwrap()
        .success();
    let _ = Command::new("podman").args(["rmi", "-f", &image]).output();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(built, "{err}");
    assert!(
        err.contains(&format!("oci: building the image {image}")),
        "{err}"
    );
    assert!(!err.contains("oci: skipped"), "{err}");
    let rows = csv_rows(
        &read(dir.path(), "batches.csv"),
        sluice::bench::report::BATCHES_HEADER,
    );
    let oci: Vec<_> = rows.iter().filter(|r| r["condition"] == "oci").collect();
    assert_eq!(oci.len(), 2, "{rows:?}");
    assert_nothing_left(pid);
}

#[test]
fn an_interrupted_bench_stops_and_cleans_up() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(sluice_bin())
        .args(["bench", "--conditions", "native,host,tokio-proxy", "--out"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Interrupt once the first session has run: its progress line is the
    // event.
    let (tx, rx) = mpsc::channel();
    let stderr_pipe = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr_pipe).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("a progress line");
    assert!(first.starts_with('['), "{first}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = wait_bounded(child, Duration::from_secs(120));
    // Everything it said, up to its exit.
    let rest: Vec<String> = rx.iter().collect();
    assert_eq!(out.status.code(), Some(130), "{rest:?}");
    assert!(rest.iter().any(|l| l.contains("interrupted")), "{rest:?}");
    assert!(!dir.path().join("report.md").exists());
    assert_nothing_left(pid);
}

#[test]
fn a_bench_without_native_is_refused_before_it_starts() {
    let out = Command::new(sluice_bin())
        .args([
            "bench",
            "--conditions",
            "host",
            "--out",
            "/nonexistent/never",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("--conditions must include native"), "{err}");
    assert!(!Path::new("/nonexistent/never").exists());
}
