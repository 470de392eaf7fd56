//! Signed bundles: every refusal on its own, good bundles in both forms,
//! rollback memory, reload (refused keeps the old policy, file watch, trigger)
//! and HTTPS fetching with ETag inside a throwaway namespace.

mod common;

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{test_pki, TestPki};
use sluice::bundle::{
    inspect, keygen, sign_bytes, Bundle, BundleError, PolicyHandle, RevisionState, TrustStore,
};
use sluice::reload::{BundleSource, FetchConfig, ReloadConfig, ReloadOutcome, Reloader};
use time::OffsetDateTime;

const POLICY: &str = "version: 1
name: test-bundle
mode: enforce
rules:
  - name: origin
    action: allow
    cidrs: [\"198.18.0.1/32\"]
    ports: [8080]
";

fn policy_v(n: u16) -> String {
    POLICY.replace("8080", &format!("{}", 8000 + n))
}

struct Keys {
    dir: tempfile::TempDir,
    key: PathBuf,
    trust: PathBuf,
}

impl Keys {
    fn new() -> Keys {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        let trust = dir.path().join("trust.yaml");
        keygen(&key, &trust, "test").unwrap();
        Keys { dir, key, trust }
    }

    fn trust(&self) -> TrustStore {
        TrustStore::load(&self.trust).unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Signs `policy` at `revision` into `out` (valid for a day).
    fn sign(&self, policy: &str, revision: u64, out: &Path) {
        let now = OffsetDateTime::now_utc();
        sign_bytes(
            &self.key,
            policy,
            revision,
            now,
            now + time::Duration::days(1),
            out,
        )
        .unwrap();
    }
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn refusal(path: &Path, trust: &TrustStore) -> BundleError {
    Bundle::load(path, trust, now()).expect_err("the bundle must be refused")
}

/// A .tar.gz with exactly these entries (name, bytes, type).
fn raw_tar_gz(entries: &[(&str, &[u8], tar::EntryType)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (name, data, kind) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(*kind);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        // Written raw so that hostile names ("../x") are not rejected here.
        let bytes = header.as_old_mut().name.as_mut();
        bytes.fill(0);
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        header.set_cksum();
        tar.append(&header, *data).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

fn dir_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for name in ["manifest.yaml", "manifest.sig", "policy.yaml"] {
        out.push((name.to_string(), std::fs::read(dir.join(name)).unwrap()));
    }
    out
}

// ---- good bundles -------------------------------------------------------

#[test]
fn good_directory_bundle_verifies() {
    let k = Keys::new();
    let out = k.path("b");
    k.sign(POLICY, 3, &out);
    let b = Bundle::load(&out, &k.trust(), now()).unwrap();
    assert_eq!(b.label(), "test-bundle@3");
    assert_eq!(b.policy.rules().len(), 1);
    assert_eq!(b.manifest.key_id, "test");
}

#[test]
fn good_tar_gz_bundle_verifies() {
    let k = Keys::new();
    let out = k.path("b.tar.gz");
    k.sign(POLICY, 4, &out);
    assert!(out.is_file());
    let b = Bundle::load(&out, &k.trust(), now()).unwrap();
    assert_eq!(b.label(), "test-bundle@4");
}

#[test]
fn tar_gz_made_by_tar_with_dot_prefix_verifies() {
    let k = Keys::new();
    let dir = k.path("b");
    k.sign(POLICY, 1, &dir);
    let mut entries: Vec<(String, Vec<u8>, tar::EntryType)> =
        vec![("./".into(), vec![], tar::EntryType::Directory)];
    for (name, data) in dir_files(&dir) {
        entries.push((format!("./{name}"), data, tar::EntryType::Regular));
    }
    let refs: Vec<_> = entries
        .iter()
        .map(|(n, d, t)| (n.as_str(), d.as_slice(), *t))
        .collect();
    let archive = k.path("dot.tar.gz");
    std::fs::write(&archive, raw_tar_gz(&refs)).unwrap();
    Bundle::load(&archive, &k.trust(), now()).unwrap();
}

#[test]
fn dev_example_bundle_verifies_with_the_dev_trust_file() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("bundles");
    let trust = TrustStore::load(&root.join("dev-trust.yaml")).unwrap();
    // bundles/resign.sh bumps the revision; the name stays.
    let dir = Bundle::load(&root.join("examples/dev"), &trust, now()).unwrap();
    assert_eq!(dir.manifest.name.as_str(), "dev");
    let archive = Bundle::load(&root.join("examples/dev.tar.gz"), &trust, now()).unwrap();
    assert_eq!(archive.label(), dir.label());
}

#[test]
fn inspect_shows_manifest_and_rules_without_trust() {
    let k = Keys::new();
    let out = k.path("b.tar.gz");
    k.sign(POLICY, 9, &out);
    let text = inspect(&out).unwrap();
    for want in [
        "name:      test-bundle",
        "revision:  9",
        "key id:    test",
        "expires:",
        "policy.yaml  sha256:",
        "  ok",
        "RULE",
        "origin",
        "198.18.0.1/32",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
}

// ---- refusals -------------------------------------------------------------

#[test]
fn tampered_policy_is_a_digest_mismatch() {
    let k = Keys::new();
    let out = k.path("b");
    k.sign(POLICY, 1, &out);
    std::fs::write(out.join("policy.yaml"), POLICY.replace("8080", "1-65535")).unwrap();
    let err = refusal(&out, &k.trust());
    assert!(matches!(&err, BundleError::DigestMismatch { file, .. } if file == "policy.yaml"));
    assert_eq!(err.code(), "digest-mismatch");
    assert!(
        err.to_string().contains("digest mismatch for policy.yaml"),
        "{err}"
    );
}

#[test]
fn tampered_manifest_is_a_bad_signature() {
    let k = Keys::new();
    let out = k.path("b");
    k.sign(POLICY, 1, &out);
    let text = std::fs::read_to_string(out.join("manifest.yaml")).unwrap();
    std::fs::write(
        out.join("manifest.yaml"),
        text.replace("revision: 1", "revision: 99"),
    )
    .unwrap();
    let err = refusal(&out, &k.trust());
    assert!(matches!(err, BundleError::BadSignature { .. }), "{err}");
    assert!(err.to_string().contains("bad signature"), "{err}");
}

#[test]
fn missing_signature_is_refused() {
    let k = Keys::new();
    let out = k.path("b");
    k.sign(POLICY, 1, &out);
    std::fs::remove_file(out.join("manifest.sig")).unwrap();
    let err = refusal(&out, &k.trust());
    assert!(matches!(err, BundleError::MissingSignature { .. }), "{err}");
    assert_eq!(err.code(), "missing-signature");
}

#[test]
fn signature_by_another_key_with_the_same_id_is_a_bad_signature() {
    let k = Keys::new();
    let other_key = k.path("other-key");
    keygen(&other_key, &k.path("other-trust.yaml"), "test").unwrap();
    let out = k.path("b");
    let now = now();
    sign_bytes(
        &other_key,
        POLICY,
        1,
        now,
        now + time::Duration::days(1),
        &out,
    )
    .unwrap();
    let err = refusal(&out, &k.trust());
    assert!(matches!(err, BundleError::BadSignature { .. }), "{err}");
}

#[test]
fn unknown_key_id_is_refused() {
    let k = Keys::new();
    let other_key = k.path("other-key");
    keygen(&other_key, &k.path("other-trust.yaml"), "stranger").unwrap();
    let out = k.path("b");
    let now = now();
    sign_bytes(
        &other_key,
        POLICY,
        1,
        now,
        now + time::Duration::days(1),
        &out,
    )
    .unwrap();
    let err = refusal(&out, &k.trust());
    assert!(
        matches!(&err, BundleError::UnknownKey { id, .. } if id == "stranger"),
        "{err}"
    );
    assert!(
        err.to_string().contains("unknown key id \"stranger\""),
        "{err}"
    );
}

#[test]
fn expired_bundle_is_refused() {
    let k = Keys::new();
    let out = k.path("b");
    let now = now();
    let created = now - time::Duration::days(2);
    sign_bytes(
        &k.key,
        POLICY,
        1,
        created,
        now - time::Duration::days(1),
        &out,
    )
    .unwrap();
    let err = refusal(&out, &k.trust());
    assert!(matches!(err, BundleError::Expired { .. }), "{err}");
    assert!(err.to_string().contains("expired at 20"), "{err}");
}

#[test]
fn rollback_is_refused_and_allow_rollback_overrides_it() {
    let state_dir = tempfile::tempdir().unwrap();
    let mut state = RevisionState::open(state_dir.path()).unwrap();
    state.check("b", 5, false).unwrap();
    state.accept("b", 5).unwrap();
    // Remembered across a restart.
    let mut state = RevisionState::open(state_dir.path()).unwrap();
    state.check("b", 5, false).unwrap();
    state.check("b", 6, false).unwrap();
    let err = state.check("b", 4, false).unwrap_err();
    assert!(
        matches!(
            err,
            BundleError::Rollback {
                revision: 4,
                highest: 5,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--allow-rollback"), "{err}");
    state.check("other", 1, false).unwrap();
    state.check("b", 4, true).unwrap();
    state.accept("b", 4).unwrap();
    assert_eq!(
        RevisionState::open(state_dir.path()).unwrap().highest("b"),
        Some(4)
    );
}

#[test]
fn truncated_archive_is_refused_as_unreadable() {
    let k = Keys::new();
    let out = k.path("b.tar.gz");
    k.sign(POLICY, 1, &out);
    let bytes = std::fs::read(&out).unwrap();
    for cut in [bytes.len() - 4, bytes.len() / 2, 12] {
        std::fs::write(&out, &bytes[..cut]).unwrap();
        let err = refusal(&out, &k.trust());
        assert!(
            matches!(err, BundleError::Unreadable { .. }),
            "cut {cut}: {err}"
        );
        assert!(err.to_string().contains("truncated or unreadable"), "{err}");
    }
}

#[test]
fn oversized_file_is_refused() {
    let k = Keys::new();
    let big = vec![b'#'; (sluice::bundle::MAX_FILE_BYTES + 1) as usize];
    let out = k.path("big.tar.gz");
    std::fs::write(
        &out,
        raw_tar_gz(&[("policy.yaml", &big, tar::EntryType::Regular)]),
    )
    .unwrap();
    let err = refusal(&out, &k.trust());
    assert!(matches!(err, BundleError::Oversized { .. }), "{err}");
    // The same in a directory bundle.
    let dir = k.path("bigdir");
    k.sign(POLICY, 1, &dir);
    std::fs::write(dir.join("policy.yaml"), &big).unwrap();
    assert!(matches!(
        refusal(&dir, &k.trust()),
        BundleError::Oversized { .. }
    ));
}

#[test]
fn gzip_bomb_stops_at_the_uncompressed_cap() {
    let k = Keys::new();
    // Five 4 MiB files of zeros: each under the file cap, together over the
    // archive cap, about 100 KiB compressed.
    let zeros = vec![0u8; sluice::bundle::MAX_FILE_BYTES as usize];
    let names = ["a", "b", "c", "d", "e"];
    let entries: Vec<_> = names
        .iter()
        .map(|n| (*n, zeros.as_slice(), tar::EntryType::Regular))
        .collect();
    let out = k.path("bomb.tar.gz");
    let bytes = raw_tar_gz(&entries);
    assert!(bytes.len() < 1 << 20);
    std::fs::write(&out, bytes).unwrap();
    let err = refusal(&out, &k.trust());
    assert!(matches!(err, BundleError::Oversized { .. }), "{err}");
}

#[test]
fn malformed_manifest_is_refused_with_line_and_column() {
    let k = Keys::new();
    let out = k.path("b");
    k.sign(POLICY, 1, &out);
    let text = std::fs::read_to_string(out.join("manifest.yaml")).unwrap();
    let broken = text.replace("revision: 1", "revision: [1");
    std::fs::write(out.join("manifest.yaml"), broken).unwrap();
    let err = refusal(&out, &k.trust());
    let BundleError::MalformedManifest { line, col, .. } = &err else {
        panic!("expected a malformed manifest, got {err}");
    };
    assert!(*line > 1 && *col > 0, "{err}");
    assert!(
        err.to_string()
            .contains("malformed manifest at manifest.yaml:"),
        "{err}"
    );

    // A wrong type and an unknown key are located as well.
    std::fs::write(
        out.join("manifest.yaml"),
        text.replace("revision: 1", "revision: one"),
    )
    .unwrap();
    let err = refusal(&out, &k.trust());
    assert!(
        matches!(err, BundleError::MalformedManifest { line: 2, .. }),
        "{err}"
    );
    std::fs::write(out.join("manifest.yaml"), format!("{text}extra: 1\n")).unwrap();
    let err = refusal(&out, &k.trust());
    assert!(
        matches!(err, BundleError::MalformedManifest { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("extra"), "{err}");
}

#[test]
fn hostile_manifest_yaml_is_refused() {
    let k = Keys::new();
    let out = k.path("b");
    k.sign(POLICY, 1, &out);
    // Alias bomb.
    let mut bomb = String::from("a: &a [x,x,x,x,x,x,x,x,x,x]\n");
    for i in 1..12 {
        let p = (b'a' + i - 1) as char;
        let c = (b'a' + i) as char;
        bomb.push_str(&format!(
            "{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
        ));
    }
    std::fs::write(out.join("manifest.yaml"), &bomb).unwrap();
    let err = refusal(&out, &k.trust());
    assert!(
        matches!(err, BundleError::MalformedManifest { .. }),
        "{err}"
    );
    // Deep nesting.
    let deep = format!("name: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
    std::fs::write(out.join("manifest.yaml"), deep).unwrap();
    let err = refusal(&out, &k.trust());
    assert!(
        matches!(err, BundleError::MalformedManifest { .. }),
        "{err}"
    );
}

#[test]
fn path_traversal_entry_is_refused() {
    let k = Keys::new();
    for name in ["../policy.yaml", "/etc/policy.yaml", "sub/policy.yaml"] {
        let out = k.path("evil.tar.gz");
        std::fs::write(
            &out,
            raw_tar_gz(&[(name, POLICY.as_bytes(), tar::EntryType::Regular)]),
        )
        .unwrap();
        let err = refusal(&out, &k.trust());
        assert!(
            matches!(err, BundleError::UnexpectedEntry { .. }),
            "{name}: {err}"
        );
    }
    let out = k.path("link.tar.gz");
    std::fs::write(
        &out,
        raw_tar_gz(&[("policy.yaml", b"", tar::EntryType::Symlink)]),
    )
    .unwrap();
    assert!(matches!(
        refusal(&out, &k.trust()),
        BundleError::UnexpectedEntry { .. }
    ));
}

#[test]
fn unlisted_file_is_refused() {
    let k = Keys::new();
    let out = k.path("b");
    k.sign(POLICY, 1, &out);
    std::fs::write(out.join("extra.yaml"), "x: 1\n").unwrap();
    let err = refusal(&out, &k.trust());
    assert!(matches!(&err, BundleError::UnexpectedEntry { entry, .. } if entry == "extra.yaml"));
}

#[test]
fn invalid_policy_is_refused_when_signing_with_the_check_errors() {
    let k = Keys::new();
    let policy = k.path("bad.yaml");
    std::fs::write(&policy, POLICY.replace("action: allow", "action: maybe")).unwrap();
    let err = sluice::bundle::sign(&k.key, &policy, 1, now(), &k.path("out")).unwrap_err();
    let BundleError::Policy(inner) = &err else {
        panic!("expected the policy error, got {err}");
    };
    let check = sluice::policy::Policy::load(&policy).unwrap_err();
    assert_eq!(inner.to_string(), check.to_string());
    assert!(err.to_string().contains("bad.yaml:6:13"), "{err}");
    assert!(!k.path("out").exists());
}

#[test]
fn keygen_writes_a_private_key_0600_and_refuses_to_overwrite() {
    use std::os::unix::fs::PermissionsExt;
    let k = Keys::new();
    let mode = std::fs::metadata(&k.key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let err = keygen(&k.key, &k.trust, "again").unwrap_err();
    assert!(matches!(err, BundleError::Exists { .. }), "{err}");
    // A second key is appended to the trust file (rotation).
    keygen(&k.path("key2"), &k.trust, "second").unwrap();
    let ids: Vec<_> = k.trust().ids().map(str::to_string).collect();
    assert_eq!(ids, ["second", "test"]);
}

// ---- reload ---------------------------------------------------------------

fn reload_config(k: &Keys, source: BundleSource, state: &Path) -> ReloadConfig {
    ReloadConfig {
        source,
        trust: k.trust(),
        state: RevisionState::open(state).unwrap(),
        allow_rollback: false,
        sandbox: "test".into(),
        path: sluice::workload::WorkloadPath::Host,
        fetch: FetchConfig::default(),
    }
}

fn rule_port(handle: &PolicyHandle) -> u16 {
    handle.current().rules()[0].ports[0].start
}

#[tokio::test]
async fn refused_reload_keeps_the_previous_policy_and_is_audited() {
    let k = Keys::new();
    let out = k.path("b");
    k.sign(&policy_v(1), 1, &out);
    let audit_path = k.path("audit.jsonl");
    let (audit, writer) = sluice::audit::AuditWriter::new(Some(&audit_path));
    let writer = tokio::spawn(writer.run());
    let cfg = reload_config(&k, BundleSource::Path(out.clone()), &k.path("state"));
    let mut reloader = Reloader::start(cfg, Some(audit)).await.unwrap();
    let handle = reloader.handle();
    assert_eq!(rule_port(&handle), 8001);
    let before = handle.current();

    std::fs::write(out.join("policy.yaml"), policy_v(2)).unwrap();
    let outcome = reloader.reload_once().await;
    assert!(
        matches!(
            &outcome,
            ReloadOutcome::Refused {
                reason: "digest-mismatch",
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(outcome.result(), "refused");
    assert!(Arc::ptr_eq(&before, &handle.current()));
    assert_eq!(handle.label(), "test-bundle@1");

    drop(reloader);
    writer.await.unwrap().unwrap();
    let log = std::fs::read_to_string(&audit_path).unwrap();
    let refused = log.lines().find(|l| l.contains("\"refused\"")).expect(&log);
    assert!(
        refused.contains("\"reason\":\"digest-mismatch\""),
        "{refused}"
    );
    assert!(refused.contains("\"proto\":\"bundle\""), "{refused}");
}

#[tokio::test]
async fn reload_applies_a_newer_revision_and_refuses_a_rollback() {
    let k = Keys::new();
    let out = k.path("b.tar.gz");
    k.sign(&policy_v(1), 2, &out);
    let cfg = reload_config(&k, BundleSource::Path(out.clone()), &k.path("state"));
    let mut reloader = Reloader::start(cfg, None).await.unwrap();
    let handle = reloader.handle();
    assert_eq!(reloader.reload_once().await, ReloadOutcome::Unchanged);

    let in_flight = handle.current();
    k.sign(&policy_v(3), 3, &out);
    let outcome = reloader.reload_once().await;
    assert_eq!(
        outcome,
        ReloadOutcome::Applied {
            label: "test-bundle@3".into()
        }
    );
    assert_eq!(rule_port(&handle), 8003);
    // A connection that took the old policy keeps it.
    assert_eq!(in_flight.rules()[0].ports[0].start, 8001);

    k.sign(&policy_v(4), 1, &out);
    let outcome = reloader.reload_once().await;
    assert!(
        matches!(
            outcome,
            ReloadOutcome::Refused {
                reason: "rollback",
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(rule_port(&handle), 8003);
}

#[tokio::test]
async fn start_refuses_a_rollback_below_the_remembered_revision() {
    let k = Keys::new();
    let out = k.path("b");
    let state = k.path("state");
    RevisionState::open(&state)
        .unwrap()
        .accept("test-bundle", 7)
        .unwrap();
    k.sign(POLICY, 6, &out);
    let cfg = reload_config(&k, BundleSource::Path(out.clone()), &state);
    let err = Reloader::start(cfg, None).await.err().expect("refused");
    assert!(matches!(err, BundleError::Rollback { .. }), "{err}");
    let mut cfg = reload_config(&k, BundleSource::Path(out), &state);
    cfg.allow_rollback = true;
    Reloader::start(cfg, None).await.unwrap();
}

async fn wait_for(handle: &PolicyHandle, port: u16) -> Duration {
    let start = Instant::now();
    while rule_port(handle) != port {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the handle did not change to port {port}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

#[tokio::test]
async fn writing_a_new_bundle_at_the_watched_path_swaps_the_policy() {
    let k = Keys::new();
    let out = k.path("live.tar.gz");
    k.sign(&policy_v(1), 1, &out);
    let cfg = reload_config(&k, BundleSource::Path(out.clone()), &k.path("state"));
    let mut reloader = Reloader::start(cfg, None).await.unwrap();
    let handle = reloader.handle();
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let seen = outcomes.clone();
    reloader.on_outcome(move |o| seen.lock().unwrap().push(o.clone()));
    // The watch is armed once start returned: no need to wait for run.
    assert!(reloader.is_watching());
    let (stop, stopped) = sluice::drain::trigger();
    let task = tokio::spawn(reloader.run(stopped));

    // sign_bytes writes a temp file and renames it into place.
    k.sign(&policy_v(2), 2, &out);
    wait_for(&handle, 8002).await;
    // An in-place rewrite is seen too.
    let staged = k.path("staged.tar.gz");
    k.sign(&policy_v(3), 3, &staged);
    std::fs::File::create(&out)
        .unwrap()
        .write_all(&std::fs::read(&staged).unwrap())
        .unwrap();
    wait_for(&handle, 8003).await;

    stop.drain();
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .unwrap()
        .unwrap();
    let outcomes = outcomes.lock().unwrap();
    assert!(outcomes.contains(&ReloadOutcome::Applied {
        label: "test-bundle@3".into()
    }));
}

#[tokio::test]
async fn directory_bundle_is_watched_too() {
    let k = Keys::new();
    let out = k.path("live");
    k.sign(&policy_v(1), 1, &out);
    let cfg = reload_config(&k, BundleSource::Path(out.clone()), &k.path("state"));
    let reloader = Reloader::start(cfg, None).await.unwrap();
    let handle = reloader.handle();
    assert!(reloader.is_watching());
    let (stop, stopped) = sluice::drain::trigger();
    let task = tokio::spawn(reloader.run(stopped));
    k.sign(&policy_v(2), 2, &out);
    wait_for(&handle, 8002).await;
    drop(stop);
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn trigger_reloads_now() {
    let k = Keys::new();
    let out = k.path("b.tar.gz");
    k.sign(&policy_v(1), 1, &out);
    let cfg = reload_config(&k, BundleSource::Path(out.clone()), &k.path("state"));
    let reloader = Reloader::start(cfg, None).await.unwrap();
    let handle = reloader.handle();
    let trigger = reloader.trigger();
    let (stop, stopped) = sluice::drain::trigger();
    let task = tokio::spawn(reloader.run(stopped));
    // Replace the file behind the watcher's back via a hard link swap is not
    // needed: the trigger alone must reload.
    k.sign(&policy_v(2), 2, &out);
    trigger.reload_now();
    wait_for(&handle, 8002).await;
    stop.drain();
    task.await.unwrap();
}

#[test]
fn verify_then_swap_of_a_10000_rule_policy() {
    let k = Keys::new();
    let mut policy = String::from("version: 1\nname: big\nmode: enforce\nrules:\n");
    for i in 0..10_000u32 {
        policy.push_str(&format!(
            "  - name: r{i}\n    action: allow\n    cidrs: [\"10.{}.{}.0/24\"]\n    ports: [443, \"8000-8100\"]\n",
            i / 256,
            i % 256
        ));
    }
    let out = k.path("big.tar.gz");
    k.sign(&policy, 1, &out);
    let trust = k.trust();
    let handle = PolicyHandle::new(
        sluice::policy::Policy::from_yaml(POLICY, "p").unwrap(),
        "x".into(),
    );
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let b = Bundle::load(&out, &trust, now()).unwrap();
        let label = b.label();
        handle.swap(b.policy, label);
        best = best.min(start.elapsed());
    }
    assert_eq!(handle.current().rules().len(), 10_000);
    eprintln!(
        "verify-then-swap, 10,000 rules ({} KiB archive): {:.1} ms (best of 3)",
        std::fs::metadata(&out).unwrap().len() / 1024,
        best.as_secs_f64() * 1000.0
    );
}

// ---- HTTPS fetch, inside a throwaway namespace -----------------------------

const SERVER: &str = "198.18.0.10:8443";

fn privileged() -> bool {
    let has_ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .iter()
        .any(|p| Path::new(p).exists());
    if nix::unistd::geteuid().is_root() && has_ip {
        return true;
    }
    if std::env::var("SLUICE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("privileged test cannot run: needs root and ip (SLUICE_REQUIRE_PRIVILEGED=1)");
    }
    eprintln!("SKIPPED: HTTPS fetch tests need root and ip to make a test namespace");
    false
}

/// A test CA and a server certificate for 198.18.0.10 it signed.
fn pki() -> TestPki {
    test_pki(&["198.18.0.10"])
}

/// What the test server serves, and how often it was asked.
#[derive(Default)]
struct Served {
    body: Mutex<(Vec<u8>, String)>,
    hits: AtomicU64,
    not_modified: AtomicU64,
    /// Whether it holds a poll that carries the current ETag and
    /// `Prefer: wait=N` until the body changes (long polling), as a plain
    /// static server does not.
    holds: std::sync::atomic::AtomicBool,
    /// Told (one permit) each time a poll starts being held.
    holding: tokio::sync::Notify,
    /// Tells held polls that the body changed.
    changed: tokio::sync::Notify,
}

impl Served {
    /// Serve `body` as `etag` from now on, waking the polls it holds.
    fn publish(&self, body: Vec<u8>, etag: &str) {
        *self.body.lock().unwrap() = (body, etag.into());
        self.changed.notify_waiters();
    }

    /// Whether the poll with this head may be held, and for how long.
    fn hold_for(&self, head: &str) -> Option<Duration> {
        if !self.holds.load(Ordering::SeqCst) {
            return None;
        }
        head.lines()
            .find_map(|l| l.strip_prefix("prefer:"))
            .and_then(|v| v.trim().strip_prefix("wait="))
            .and_then(|n| n.trim().parse().ok())
            .map(Duration::from_secs)
    }
}

/// Serves `served` over HTTPS at [`SERVER`]; answers 304 to a matching
/// If-None-Match. Runs until the runtime ends or the handle is aborted.
async fn https_server(pki: &TestPki, served: Arc<Served>) -> tokio::task::JoinHandle<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![pki.cert.clone()], pki.key.clone_key())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(SERVER).await.unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let served = served.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                served.hits.fetch_add(1, Ordering::SeqCst);
                let head = String::from_utf8_lossy(&head).to_lowercase();
                let matches = |etag: &str| {
                    head.lines().any(|l| {
                        l.strip_prefix("if-none-match:").map(str::trim)
                            == Some(&etag.to_lowercase())
                    })
                };
                let hold = served.hold_for(&head);
                let mut applied = "";
                if let Some(wait) = hold {
                    let changed = served.changed.notified();
                    tokio::pin!(changed);
                    changed.as_mut().enable();
                    let unchanged = matches(&served.body.lock().unwrap().1);
                    if unchanged {
                        served.holding.notify_one();
                        let _ = tokio::time::timeout(wait, changed).await;
                    }
                    applied = "Preference-Applied: wait\r\n";
                }
                let (body, etag) = served.body.lock().unwrap().clone();
                let reply = if matches(&etag) {
                    served.not_modified.fetch_add(1, Ordering::SeqCst);
                    format!(
                        "HTTP/1.1 304 Not Modified\r\nETag: {etag}\r\n{applied}Connection: close\r\n\r\n"
                    )
                    .into_bytes()
                } else {
                    let mut r = format!(
                        "HTTP/1.1 200 OK\r\nETag: {etag}\r\n{applied}Content-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    r.extend_from_slice(&body);
                    r
                };
                let _ = tls.write_all(&reply).await;
                let _ = tls.shutdown().await;
            });
        }
    })
}

/// Runs `f` on a current-thread runtime inside a fresh namespace holding
/// 198.18.0.10, so every socket stays on this machine.
fn in_namespace<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let addr: IpAddr = "198.18.0.10".parse().unwrap();
    let ns = sluice::testbed::OuterNetns::create("sluice-bundle", &[addr]).unwrap();
    ns.run_in(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(f());
    })
    .unwrap();
}

fn url() -> String {
    let addr: SocketAddr = SERVER.parse().unwrap();
    format!("https://{addr}/bundle.tar.gz")
}

fn https_config(k: &Keys, ca: &Path, state: &Path) -> ReloadConfig {
    let mut cfg = reload_config(k, BundleSource::parse(&url()), state);
    cfg.fetch = FetchConfig {
        ca_file: Some(ca.to_path_buf()),
        system_roots: false,
        interval: Duration::from_millis(200),
        max_backoff: Duration::from_secs(1),
        timeout: Duration::from_secs(5),
        long_poll: Duration::from_secs(30),
    };
    cfg
}

/// Keys, the server's certificate, and its CA written for the client.
fn https_keys() -> (Keys, TestPki, PathBuf) {
    let k = Keys::new();
    let pki = pki();
    let ca = k.path("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    (k, pki, ca)
}

fn signed_archive(k: &Keys, port: u16, revision: u64) -> Vec<u8> {
    let out = k.path(&format!("srv-{revision}.tar.gz"));
    k.sign(&policy_v(port), revision, &out);
    std::fs::read(out).unwrap()
}

#[test]
fn https_200_applies_and_304_does_not_reload() {
    if !privileged() {
        return;
    }
    in_namespace(|| async {
        let (k, pki, ca) = https_keys();
        let served = Arc::new(Served::default());
        *served.body.lock().unwrap() = (signed_archive(&k, 1, 1), "\"v1\"".into());
        let server = https_server(&pki, served.clone()).await;

        let mut reloader = Reloader::start(https_config(&k, &ca, &k.path("state")), None)
            .await
            .unwrap();
        let handle = reloader.handle();
        assert_eq!(rule_port(&handle), 8001);
        assert_eq!(served.hits.load(Ordering::SeqCst), 1);

        let before = handle.current();
        assert_eq!(reloader.reload_once().await, ReloadOutcome::Unchanged);
        assert_eq!(served.not_modified.load(Ordering::SeqCst), 1);
        assert!(Arc::ptr_eq(&before, &handle.current()));

        *served.body.lock().unwrap() = (signed_archive(&k, 2, 2), "\"v2\"".into());
        let outcome = reloader.reload_once().await;
        assert_eq!(
            outcome,
            ReloadOutcome::Applied {
                label: "test-bundle@2".into()
            }
        );
        assert_eq!(rule_port(&handle), 8002);

        // The poller: unchanged polls are all 304s.
        let (stop, stopped) = sluice::drain::trigger();
        let task = tokio::spawn(reloader.run(stopped));
        let waited = Instant::now();
        while served.not_modified.load(Ordering::SeqCst) < 2
            && waited.elapsed() < Duration::from_secs(20)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let polls = served.not_modified.load(Ordering::SeqCst);
        assert!(polls >= 2, "expected polls answered 304, got {polls}");
        *served.body.lock().unwrap() = (signed_archive(&k, 3, 3), "\"v3\"".into());
        wait_for(&handle, 8003).await;
        stop.drain();
        task.await.unwrap();
        server.abort();
    });
}

/// Long polling: the server holds the poll until the bundle changes, so
/// a new revision is applied at once although the interval is an hour.
#[test]
fn a_server_that_holds_the_poll_gets_its_new_bundle_applied_without_waiting_the_interval() {
    if !privileged() {
        return;
    }
    in_namespace(|| async {
        let (k, pki, ca) = https_keys();
        let served = Arc::new(Served::default());
        served.holds.store(true, Ordering::SeqCst);
        served.publish(signed_archive(&k, 1, 1), "\"v1\"");
        let server = https_server(&pki, served.clone()).await;
        let mut config = https_config(&k, &ca, &k.path("state"));
        config.fetch.interval = Duration::from_secs(3600);
        config.fetch.long_poll = Duration::from_secs(3600);
        let mut reloader = Reloader::start(config, None).await.unwrap();
        let handle = reloader.handle();
        let (outcomes_tx, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
        reloader.on_outcome(move |o: &ReloadOutcome| {
            let _ = outcomes_tx.send(o.clone());
        });
        let (stop, stopped) = sluice::drain::trigger();
        let task = tokio::spawn(reloader.run(stopped));
        // sluice's first poll goes at once and is held (a plain poller's
        // would wait an hour).
        served.holding.notified().await;
        served.publish(signed_archive(&k, 2, 2), "\"v2\"");
        let applied = outcomes.recv().await.expect("an outcome");
        assert_eq!(
            applied,
            ReloadOutcome::Applied {
                label: "test-bundle@2".into()
            }
        );
        assert_eq!(rule_port(&handle), 8002);
        // And the next poll is held again at once, with the new ETag; the
        // drain gives it up rather than wait out its hour.
        served.holding.notified().await;
        stop.drain();
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the drain did not end a held poll")
            .unwrap();
        server.abort();
    });
}

/// nginx serving a directory at [`SERVER`] (docs/bundles.md's layout): a
/// plain static server that answers at once (it ignores `Prefer: wait`),
/// with its own ETag and 304. Killed when dropped.
struct Nginx {
    child: std::process::Child,
    access_log: PathBuf,
}

impl Nginx {
    /// Started in the calling thread's namespace, serving `www`; `None`
    /// when nginx is not installed (and the run does not require it).
    fn serve(dir: &Path, www: &Path, pki: &TestPki) -> Option<Nginx> {
        if std::process::Command::new("nginx")
            .arg("-v")
            .output()
            .is_err()
        {
            if std::env::var("SLUICE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
                panic!("nginx is not installed (.ci/run installs it)");
            }
            eprintln!("SKIPPED: nginx is not installed");
            return None;
        }
        std::fs::write(dir.join("cert.pem"), &pki.cert_pem).unwrap();
        std::fs::write(dir.join("key.pem"), &pki.key_pem).unwrap();
        let d = dir.display();
        let conf = format!(
            "daemon off; master_process off; worker_processes 1;\n\
             pid {d}/nginx.pid; error_log {d}/error.log;\n\
             events {{}}\n\
             http {{\n\
               log_format status '$status $request';\n\
               access_log {d}/access.log status;\n\
               client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
               fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
               server {{\n\
                 listen {SERVER} ssl;\n\
                 ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem;\n\
                 root {};\n\
               }}\n\
             }}\n",
            www.display()
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = std::process::Command::new("nginx")
            .arg("-p")
            .arg(dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .spawn()
            .expect("start nginx");
        let mut nginx = Nginx {
            child,
            access_log: dir.join("access.log"),
        };
        // Listening once a connection is accepted (bounded: an nginx that
        // fails to start exits, which ends the wait too).
        let started = Instant::now();
        while std::net::TcpStream::connect(SERVER).is_err() {
            if let Ok(Some(status)) = nginx.child.try_wait() {
                panic!(
                    "nginx exited ({status}): {}",
                    std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "nginx never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(nginx)
    }

    /// Each request it logged (its status, then the request line), once
    /// there are `count`: nginx writes a request's line after it has sent
    /// the answer, so the client can read the answer before the line is
    /// there. Bounded: a line that never comes fails the test.
    fn logged(&self, count: usize) -> Vec<String> {
        let started = Instant::now();
        loop {
            let lines: Vec<String> = std::fs::read_to_string(&self.access_log)
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect();
            if lines.len() >= count || started.elapsed() > Duration::from_secs(30) {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publish `archive` as `www/bundle.tar.gz` the way docs/bundles.md says:
/// written beside it, then renamed over it (never a half-written file),
/// with a later mtime than the one before (nginx's ETag is mtime and size).
fn publish(www: &Path, archive: &[u8], mtime: std::time::SystemTime) {
    let tmp = www.join(".bundle.tar.gz.tmp");
    std::fs::write(&tmp, archive).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::rename(&tmp, www.join("bundle.tar.gz")).unwrap();
}

#[test]
fn a_bundle_directory_served_by_nginx_is_fetched_with_its_etag_answered_304_and_replaced() {
    if !privileged() {
        return;
    }
    in_namespace(|| async {
        let (k, pki, ca) = https_keys();
        let www = k.path("www");
        std::fs::create_dir(&www).unwrap();
        let then = std::time::SystemTime::now() - Duration::from_secs(60);
        publish(&www, &signed_archive(&k, 1, 1), then);
        let Some(nginx) = Nginx::serve(k.dir.path(), &www, &pki) else {
            return;
        };
        let mut reloader = Reloader::start(https_config(&k, &ca, &k.path("state")), None)
            .await
            .unwrap();
        let handle = reloader.handle();
        assert_eq!(rule_port(&handle), 8001);

        // Asked again with nginx's ETag, which did not change: 304, and the
        // policy in force stays.
        assert_eq!(reloader.reload_once().await, ReloadOutcome::Unchanged);
        assert_eq!(
            nginx.logged(2),
            [
                "200 GET /bundle.tar.gz HTTP/1.1",
                "304 GET /bundle.tar.gz HTTP/1.1"
            ],
            "{}",
            std::fs::read_to_string(k.path("error.log")).unwrap_or_default()
        );

        publish(
            &www,
            &signed_archive(&k, 2, 2),
            then + Duration::from_secs(30),
        );
        assert_eq!(
            reloader.reload_once().await,
            ReloadOutcome::Applied {
                label: "test-bundle@2".into()
            }
        );
        assert_eq!(rule_port(&handle), 8002);
        assert_eq!(
            nginx.logged(3).last().map(String::as_str),
            Some("200 GET /bundle.tar.gz HTTP/1.1")
        );
    });
}

#[test]
fn https_server_down_keeps_and_restarts_from_the_last_good_bundle() {
    if !privileged() {
        return;
    }
    in_namespace(|| async {
        let (k, pki, ca) = https_keys();
        let state = k.path("state");
        let served = Arc::new(Served::default());
        *served.body.lock().unwrap() = (signed_archive(&k, 1, 5), "\"v5\"".into());
        let server = https_server(&pki, served.clone()).await;
        let mut reloader = Reloader::start(https_config(&k, &ca, &state), None)
            .await
            .unwrap();
        let handle = reloader.handle();
        server.abort();
        let _ = server.await;

        // Running: the fetch fails, the policy stays.
        let outcome = reloader.reload_once().await;
        assert!(
            matches!(
                &outcome,
                ReloadOutcome::Refused {
                    reason: "fetch-failed",
                    ..
                }
            ),
            "{outcome:?}"
        );
        assert_eq!(handle.label(), "test-bundle@5");

        // Restarting offline: the last good copy under the state dir.
        drop(reloader);
        let restarted = Reloader::start(https_config(&k, &ca, &state), None)
            .await
            .unwrap();
        assert_eq!(restarted.handle().label(), "test-bundle@5");

        // Without a last good copy there is nothing to run.
        let err = Reloader::start(https_config(&k, &ca, &k.path("empty-state")), None)
            .await
            .err()
            .expect("no bundle");
        assert_eq!(err.code(), "fetch-failed");
    });
}

#[test]
fn https_certificate_from_an_untrusted_ca_is_refused() {
    if !privileged() {
        return;
    }
    in_namespace(|| async {
        let k = Keys::new();
        let pki = pki();
        let other = self::pki();
        let ca = k.path("other-ca.pem");
        std::fs::write(&ca, &other.ca_pem).unwrap();
        let served = Arc::new(Served::default());
        *served.body.lock().unwrap() = (signed_archive(&k, 1, 1), "\"v1\"".into());
        let server = https_server(&pki, served.clone()).await;
        let err = Reloader::start(https_config(&k, &ca, &k.path("state")), None)
            .await
            .err()
            .expect("the server's certificate is not trusted");
        assert_eq!(err.code(), "fetch-failed");
        assert!(
            err.to_string().to_lowercase().contains("certificate"),
            "{err}"
        );
        assert_eq!(served.hits.load(Ordering::SeqCst), 0);
        server.abort();
    });
}
