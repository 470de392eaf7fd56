//! `sluice run --bundle`: the workload starts only on a verified bundle, and a
//! bundle swapped under live traffic changes policy without failing a
//! connection both policies allow or passing one the active policy denies.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

/// Policy `which` (0 or 1): both allow 198.18.0.1:8080; 0 also allows 8081,
/// 1 also allows 8082.
fn policy(which: u64) -> String {
    let extra = if which == 0 { 8081 } else { 8082 };
    format!(
        "version: 1\nname: swap\nrules:\n  - name: both\n    action: allow\n    cidrs: [\"198.18.0.1/32\"]\n    ports: [8080]\n  - name: only-{which}\n    action: allow\n    cidrs: [\"198.18.0.1/32\"]\n    ports: [{extra}]\ndns:\n  upstream: []\n"
    )
}

struct Signer {
    key: PathBuf,
    trust: PathBuf,
    dir: PathBuf,
}

impl Signer {
    fn new(w: &World) -> Signer {
        let dir = w.dir.path().to_path_buf();
        let key = dir.join("key");
        let trust = dir.join("trust.yaml");
        sluice::bundle::keygen(&key, &trust, "test").unwrap();
        Signer { key, trust, dir }
    }

    /// Sign `policy` as `revision` into a fresh .tar.gz; returns its path.
    fn sign(&self, policy: &str, revision: u64) -> PathBuf {
        let src = self.dir.join(format!("policy-{revision}.yaml"));
        std::fs::write(&src, policy).unwrap();
        let out = self.dir.join(format!("bundle-{revision}.tar.gz"));
        let expires = time::OffsetDateTime::now_utc() + time::Duration::days(1);
        sluice::bundle::sign(&self.key, &src, revision, expires, &out).unwrap();
        out
    }
}

fn run_bundle(w: &World, signer: &Signer, bundle: &Path, argv: &[&str]) -> Command {
    run_bundle_with(w, signer, bundle.as_os_str(), &[], argv)
}

/// `sluice -v run --bundle B` with the test's trust, state and audit, plus
/// `options`.
fn run_bundle_with(
    w: &World,
    signer: &Signer,
    bundle: &OsStr,
    options: &[&OsStr],
    argv: &[&str],
) -> Command {
    let mut cmd = w.outer.command(sluice_bin());
    cmd.arg("-v")
        .arg("run")
        .arg("--bundle")
        .arg(bundle)
        .args(options)
        .arg("--trust")
        .arg(&signer.trust)
        .arg("--state-dir")
        .arg(signer.dir.join("state"))
        .arg("--audit")
        .arg(w.audit_path())
        .arg("--audit-allows")
        .arg("--")
        .args(argv);
    cmd
}

fn output(cmd: &mut Command) -> std::process::Output {
    wait_bounded(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(60),
    )
}

#[test]
fn a_verified_bundle_runs_the_command() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    let signer = Signer::new(&w);
    let bundle = signer.sign(&policy(0), 1);
    let out = output(&mut run_bundle(
        &w,
        &signer,
        &bundle,
        &[sluice_bin(), "probe", "http", "http://198.18.0.1:8080/"],
    ));
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert_eq!(w.audit().last().unwrap()["bundle"], "swap@1");
}

#[test]
fn a_tampered_bundle_never_runs_the_command() {
    let Some(w) = World::new() else { return };
    let signer = Signer::new(&w);
    let good = signer.sign(&policy(0), 1);
    // Unpack, loosen the policy, keep the old manifest and signature.
    let dir = signer.dir.join("tampered");
    std::fs::create_dir_all(&dir).unwrap();
    let unpacked = Command::new("tar")
        .arg("-xzf")
        .arg(&good)
        .arg("-C")
        .arg(&dir)
        .status()
        .unwrap();
    assert!(unpacked.success());
    let policy_file = dir.join("policy.yaml");
    let loosened = std::fs::read_to_string(&policy_file)
        .unwrap()
        .replace("198.18.0.1/32", "0.0.0.0/0");
    std::fs::write(&policy_file, loosened).unwrap();
    let marker = signer.dir.join("ran");
    let touch = format!("touch {}", marker.display());
    let out = output(&mut run_bundle(&w, &signer, &dir, &["sh", "-c", &touch]));
    assert!(out.status.code().unwrap() >= 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("policy.yaml"), "{}", stderr(&out));
    assert!(!marker.exists(), "the workload ran on a tampered bundle");
}

#[test]
fn an_older_revision_is_refused_as_a_rollback() {
    let Some(w) = World::new() else { return };
    let signer = Signer::new(&w);
    let newer = signer.sign(&policy(0), 5);
    let older = signer.sign(&policy(1), 4);
    let first = output(&mut run_bundle(&w, &signer, &newer, &["true"]));
    assert!(first.status.success(), "{}", stderr(&first));
    let second = output(&mut run_bundle(&w, &signer, &older, &["true"]));
    assert!(second.status.code().unwrap() >= 2);
    assert!(
        stderr(&second).contains("rollback") || stderr(&second).contains("revision"),
        "{}",
        stderr(&second)
    );
}

#[test]
fn bundles_swapped_20_times_under_load_never_break_an_allowed_connection() {
    let Some(w) = World::new() else { return };
    for port in [8080, 8081, 8082] {
        w.http_origin(&format!("198.18.0.1:{port}"));
    }
    let signer = Signer::new(&w);
    let live = signer.dir.join("live.tar.gz");
    std::fs::copy(signer.sign(&policy(0), 1), &live).unwrap();
    let bin = sluice_bin();
    // Connections on all three ports, continuously, until the test says
    // stop; one line per batch of 20 on the port both policies allow.
    let traffic = signer.dir.join("traffic.log");
    let script = format!(
        "echo ready; while [ ! -e {go} ]; do \
           {bin} probe http --count 20 --concurrency 2 http://198.18.0.1:8080/ >> {traffic}; \
           {bin} probe http http://198.18.0.1:8081/ >/dev/null; \
           {bin} probe http http://198.18.0.1:8082/ >/dev/null; \
         done",
        go = w.go_path().display(),
        traffic = traffic.display()
    );
    let log = signer.dir.join("sluice.log");
    let mut child = run_bundle(&w, &signer, &live, &["sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        use std::io::Read;
        let _ = out.read_to_string(&mut text);
        text
    });
    assert!(eventually(Duration::from_secs(20), || w
        .audit()
        .iter()
        .any(|r| r["bundle"] == "swap@1")));
    let batches = || {
        std::fs::read_to_string(&traffic)
            .unwrap_or_default()
            .lines()
            .count()
    };
    for revision in 2..=21u64 {
        let next = signer.sign(&policy(revision % 2), revision);
        let staged = signer.dir.join("staged.tar.gz");
        std::fs::copy(&next, &staged).unwrap();
        std::fs::rename(&staged, &live).unwrap();
        let label = format!("swap@{revision}");
        assert!(
            eventually(Duration::from_secs(20), || w
                .audit()
                .iter()
                .any(|r| r["verdict"] == "applied" && r["bundle"] == label)),
            "reload to {label} never applied; sluice said:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        // Traffic under this revision: one more batch before the next swap.
        let before = batches();
        assert!(
            eventually(Duration::from_secs(20), || batches() > before),
            "no traffic after the swap to {label}"
        );
    }
    // However slow this machine, at least 20 batches ran across the swaps.
    assert!(
        eventually(Duration::from_secs(60), || batches() >= 20),
        "too little traffic: {} batches",
        batches()
    );
    std::fs::write(w.go_path(), b"").unwrap();
    let status = child.wait().unwrap();
    let _ = reader.join().unwrap();
    assert!(status.success());

    // Port 8080 is allowed by every revision: no request to it ever failed.
    let text = std::fs::read_to_string(&traffic).unwrap();
    assert!(
        text.lines()
            .all(|l| l.starts_with("HTTP x20") && l.contains("failures 0")),
        "{text}"
    );

    // Every decision agrees with the revision it was made under.
    let mut checked = 0;
    for r in w.audit().iter().filter(|r| r["proto"] == "tcp") {
        let revision: u64 = r["bundle"]
            .as_str()
            .unwrap()
            .trim_start_matches("swap@")
            .parse()
            .unwrap();
        let port: u16 = r["dst"]
            .as_str()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        // Revision 1 is policy(0); revision r > 1 is policy(r % 2).
        let which = if revision == 1 { 0 } else { revision % 2 };
        let allowed = port == 8080 || port == if which == 0 { 8081 } else { 8082 };
        let expected = if allowed { "allow" } else { "deny" };
        assert_eq!(r["verdict"], expected, "{r}");
        checked += 1;
    }
    assert!(checked > 100, "only {checked} decisions audited");
}

#[test]
fn a_refused_reload_keeps_the_previous_policy_in_force() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8081");
    let signer = Signer::new(&w);
    let live = signer.dir.join("live.tar.gz");
    std::fs::copy(signer.sign(&policy(0), 1), &live).unwrap();
    let script = format!(
        "echo ready; {wait}; {bin} probe http http://198.18.0.1:8081/",
        wait = w.wait_for_go(),
        bin = sluice_bin()
    );
    let mut child = run_bundle(&w, &signer, &live, &["sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(20), || w
        .audit()
        .iter()
        .any(|r| r["bundle"] == "swap@1")));
    // A truncated archive arrives at the watched path.
    let next = std::fs::read(signer.sign(&policy(1), 2)).unwrap();
    std::fs::write(signer.dir.join("staged"), &next[..next.len() / 2]).unwrap();
    std::fs::rename(signer.dir.join("staged"), &live).unwrap();
    assert!(
        eventually(Duration::from_secs(20), || w
            .audit()
            .iter()
            .any(|r| r["verdict"] == "refused")),
        "the truncated bundle was not refused"
    );
    std::fs::write(w.go_path(), b"").unwrap();
    let mut out = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{out}");
    // 8081 is allowed only by the previous policy, which is still in force.
    assert!(out.contains("HTTP 200"), "{out}");
}

#[test]
fn a_bundle_fetched_over_https_is_verified_polled_with_etag_and_swapped() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8081");
    w.http_origin("198.18.0.1:8082");
    let signer = Signer::new(&w);
    let first = std::fs::read(signer.sign(&policy(0), 1)).unwrap();
    // What the server serves: the bundle and its ETag; and how many polls it
    // answered with 304.
    let served = Arc::new(Mutex::new((first, "\"rev-1\"".to_string())));
    let not_modified = Arc::new(AtomicU64::new(0));
    let ca = {
        let served = served.clone();
        let not_modified = not_modified.clone();
        w.https_server("198.18.0.2:8443", &["198.18.0.2"], move |head| {
            let (body, etag) = served.lock().unwrap().clone();
            let asked = head.lines().any(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("if-none-match:")
                    .is_some_and(|v| v.trim() == etag)
            });
            if asked {
                not_modified.fetch_add(1, Ordering::SeqCst);
                return format!("HTTP/1.1 304 Not Modified\r\nETag: {etag}\r\n\r\n").into_bytes();
            }
            let mut reply = format!(
                "HTTP/1.1 200 OK\r\nETag: {etag}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            reply.extend_from_slice(&body);
            reply
        })
    };
    let bin = sluice_bin();
    let script = format!(
        "{bin} probe http http://198.18.0.1:8081/ && {wait} && {bin} probe http http://198.18.0.1:8082/",
        wait = w.wait_for_go(),
    );
    let log = signer.dir.join("sluice.log");
    let child = run_bundle_with(
        &w,
        &signer,
        OsStr::new("https://198.18.0.2:8443/bundle.tar.gz"),
        &[
            OsStr::new("--ca"),
            ca.as_os_str(),
            OsStr::new("--poll-interval"),
            OsStr::new("100ms"),
        ],
        &["sh", "-c", &script],
    )
    .stdout(Stdio::piped())
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let sluice_said = || std::fs::read_to_string(&log).unwrap_or_default();

    // Revision 1 came over HTTPS and admits 8081; polls answered 304 change
    // nothing.
    assert!(
        eventually(Duration::from_secs(20), || w
            .audit()
            .iter()
            .any(|r| r["bundle"] == "swap@1" && r["dst"] == "198.18.0.1:8081")),
        "the workload never used revision 1; sluice said:\n{}",
        sluice_said()
    );
    assert!(
        eventually(Duration::from_secs(20), || not_modified
            .load(Ordering::SeqCst)
            >= 3),
        "sluice did not poll with If-None-Match; sluice said:\n{}",
        sluice_said()
    );
    let loads = |w: &World| {
        w.audit()
            .iter()
            .filter(|r| r["verdict"] == "applied")
            .count()
    };
    assert_eq!(loads(&w), 1, "a 304 must not reload");

    // Revision 2 (admits 8082 instead) is served; the next poll swaps it in.
    *served.lock().unwrap() = (
        std::fs::read(signer.sign(&policy(1), 2)).unwrap(),
        "\"rev-2\"".to_string(),
    );
    assert!(
        eventually(Duration::from_secs(20), || w
            .audit()
            .iter()
            .any(|r| r["verdict"] == "applied" && r["bundle"] == "swap@2")),
        "revision 2 was never applied; sluice said:\n{}",
        sluice_said()
    );
    std::fs::write(w.go_path(), b"").unwrap();
    let status = wait_bounded(child, Duration::from_secs(60)).status;
    assert!(status.success(), "sluice said:\n{}", sluice_said());
    assert!(w.audit().iter().any(|r| r["bundle"] == "swap@2"
        && r["dst"] == "198.18.0.1:8082"
        && r["verdict"] == "allow"));
    // The fetched bundle is kept for an offline restart.
    assert!(signer.dir.join("state").read_dir().unwrap().count() > 0);
}
