//! `sluice demo`, the first thing a new user runs: every step shows what it
//! says it shows, and nothing is left behind.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

#[test]
fn the_demo_shows_each_step_and_cleans_up() {
    if !privileged() {
        return;
    }
    let child = Command::new(sluice_bin())
        .arg("demo")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = wait_bounded(child, Duration::from_secs(120));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    let step = |n: u32| {
        let start = text
            .find(&format!("\n{n}. "))
            .unwrap_or_else(|| panic!("no step {n}:\n{text}"));
        let end = text[start + 1..]
            .find("\n\n")
            .map_or(text.len(), |e| start + 1 + e);
        &text[start..end]
    };
    assert!(step(1).contains("HTTP 200"), "{}", step(1));
    assert!(step(2).contains("HTTP 403"), "{}", step(2));
    assert!(step(2).contains("no-admin"), "{}", step(2));
    assert!(step(3).contains("Refused"), "{}", step(3));
    assert!(step(4).contains("Operation not permitted"), "{}", step(4));
    assert!(step(5).contains("EPERM"), "{}", step(5));
    assert!(step(6).contains("reset"), "{}", step(6));
    assert!(step(7).contains("Permission denied"), "{}", step(7));
    assert!(step(7).contains("Operation not permitted"), "{}", step(7));
    let dropped = step(8)
        .lines()
        .find(|l| l.trim_start().starts_with("sluice_dropped_packets_total{"))
        .unwrap_or_else(|| panic!("no drop counter:\n{}", step(8)));
    // The UDP datagram of step 4; step 5's raw socket cannot even be made
    // (the workload has no CAP_NET_RAW), so it drops nothing.
    assert!(dropped.ends_with("} 1"), "{dropped}");
    for reason in ["deny-rule", "dns-refused", "no-rule"] {
        assert!(step(9).contains(reason), "{}", step(9));
    }
    assert!(
        text.contains("1 request(s) on :8080, 0 on :9090, 0 UDP datagram(s)"),
        "{text}"
    );
    // Step 10 compares direct and sluice side by side and points further.
    assert!(step(10).contains("direct "), "{}", step(10));
    assert!(step(10).contains("x native"), "{}", step(10));
    assert!(step(10).contains("sluice bench --out DIR"), "{}", step(10));
    assert!(text.contains("Cleaned up"), "{text}");
    let namespaces = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !stdout(&namespaces).contains(&format!("sluice-demo-{pid}-")),
        "{}",
        stdout(&namespaces)
    );
    assert!(
        !stdout(&namespaces).contains(&format!("sluice-bench-{pid}-")),
        "{}",
        stdout(&namespaces)
    );
    assert!(!std::env::temp_dir()
        .join(format!("sluice-demo-{pid}"))
        .exists());
}
