//! The commands that need no privileges, as a user types them: `check`,
//! `explain`, and how bad input is answered.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

fn sluice(args: &[&str]) -> Output {
    Command::new(sluice_bin())
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

fn bad_policy(dir: &Path) -> String {
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "version: 1\nname: bad\nrules:\n  - name: x\n    action: allow\n    cidrs: [\"300.1.1.1/8\"]\n    ports: [\"9-2\"]\n  - name: x\n    action: allow\n    hosts: [\"a.*.com\"]\n    colour: red\n",
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn check_accepts_every_shipped_policy() {
    for policy in ["policies/dev.yaml", "policies/demo.yaml"] {
        let out = sluice(&["check", "--policy", policy]);
        assert!(out.status.success(), "{policy}: {}", stderr(&out));
        assert!(stdout(&out).contains("is valid"), "{}", stdout(&out));
    }
}

#[test]
fn check_reports_every_error_with_its_line_and_column_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = bad_policy(dir.path());
    let out = sluice(&["check", "--policy", &path]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    for (at, what) in [
        (":6:13:", "is not a CIDR"),
        (":7:13:", "runs backwards"),
        (":8:11:", "duplicate rule name `x`"),
        (":10:13:", "wildcard"),
        (":11:5:", "unknown key `colour`"),
    ] {
        assert!(
            text.lines().any(|l| l.contains(at) && l.contains(what)),
            "no `{what}` at {at}:\n{text}"
        );
    }
}

#[test]
fn explain_prints_verdict_rule_and_reason() {
    let allowed = sluice(&[
        "explain",
        "--policy",
        "policies/dev.yaml",
        "198.18.0.1:8080",
    ]);
    let text = stdout(&allowed);
    assert!(allowed.status.success(), "{}", stderr(&allowed));
    assert!(text.contains("verdict:     allow"), "{text}");
    assert!(text.contains("rule:        origin"), "{text}");
    assert!(text.contains("reason:      allow-rule"), "{text}");

    let denied = sluice(&[
        "explain",
        "--policy",
        "policies/dev.yaml",
        "169.254.169.254:80",
    ]);
    let text = stdout(&denied);
    assert!(text.contains("verdict:     deny"), "{text}");
    assert!(text.contains("rule:        no-metadata"), "{text}");
    assert!(text.contains("reason:      deny-rule"), "{text}");

    let unknown = sluice(&[
        "explain",
        "--policy",
        "policies/dev.yaml",
        "[2001:db8::9]:443",
    ]);
    assert!(
        stdout(&unknown).contains("reason:      no-rule"),
        "{}",
        stdout(&unknown)
    );
}

#[test]
fn explain_refuses_something_that_is_not_an_address_and_says_what_to_give() {
    let out = sluice(&["explain", "--policy", "policies/dev.yaml", "nonsense"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is not an address"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_missing_policy_file_is_named_once_with_what_to_do() {
    let out = sluice(&["check", "--policy", "/nonexistent/policy.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(text.contains("/nonexistent/policy.yaml"), "{text}");
    assert!(text.contains("check the path"), "{text}");
    assert_eq!(
        text.matches("No such file or directory").count(),
        1,
        "{text}"
    );
}

#[test]
fn a_bad_ttl_or_expiry_when_signing_is_bad_input_with_an_example() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out_dir = out_dir.to_str().unwrap();
    let key = dir.path().join("key");
    let key = key.to_str().unwrap();
    let base = [
        "bundle",
        "sign",
        "--key",
        key,
        "--policy",
        "policies/dev.yaml",
    ];
    let ttl = sluice(
        &[
            &base[..],
            &["--revision", "1", "--ttl", "3x", "--out", out_dir],
        ]
        .concat(),
    );
    assert_eq!(ttl.status.code(), Some(2), "{}", stderr(&ttl));
    assert!(stderr(&ttl).contains("such as 30d"), "{}", stderr(&ttl));
    let expires = sluice(
        &[
            &base[..],
            &["--revision", "1", "--expires", "tomorrow", "--out", out_dir],
        ]
        .concat(),
    );
    assert_eq!(expires.status.code(), Some(2), "{}", stderr(&expires));
    assert!(
        stderr(&expires).contains("RFC 3339"),
        "{}",
        stderr(&expires)
    );
}

#[test]
fn audit_tail_of_a_missing_file_is_bad_input() {
    let out = sluice(&["audit", "tail", "/nonexistent/audit.jsonl"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent/audit.jsonl"),
        "{}",
        stderr(&out)
    );
}

/// What a command said, on either stream (`bundle verify` says why it
/// refused on stdout).
fn said(out: &Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

/// A fresh signing key and trust file in `dir`.
fn keygen(dir: &Path) -> (String, String) {
    let key = dir.join("signing.key").to_str().unwrap().to_string();
    let trust = dir.join("trust.yaml").to_str().unwrap().to_string();
    let out = sluice(&[
        "bundle", "keygen", "--key", &key, "--trust", &trust, "--id", "t",
    ]);
    assert!(out.status.success(), "{}", said(&out));
    (key, trust)
}

#[test]
fn signing_with_a_missing_key_names_the_signing_key_and_the_file_to_give() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("b");
    let out = sluice(&[
        "bundle",
        "sign",
        "--key",
        "/nonexistent/signing.key",
        "--policy",
        "policies/dev.yaml",
        "--revision",
        "1",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let text = stderr(&out);
    assert!(
        text.contains("cannot read the signing key /nonexistent/signing.key: "),
        "{text}"
    );
    assert!(
        text.contains("give the file `sluice bundle keygen --key` wrote"),
        "{text}"
    );
}

#[test]
fn verifying_against_a_missing_trust_file_names_the_trust_file() {
    let out = sluice(&[
        "bundle",
        "verify",
        "--trust",
        "/nonexistent/trust.yaml",
        "bundles/examples/dev",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("cannot read the trust file /nonexistent/trust.yaml: "),
        "{}",
        said(&out)
    );
}

#[test]
fn verifying_a_missing_bundle_names_the_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let (_, trust) = keygen(dir.path());
    let out = sluice(&["bundle", "verify", "--trust", &trust, "/nonexistent/bundle"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let text = said(&out);
    assert!(
        text.contains("cannot read the bundle /nonexistent/bundle: "),
        "{text}"
    );
    assert!(text.contains("`sluice bundle sign` wrote"), "{text}");
}

#[test]
fn an_unknown_manifest_key_is_named_with_the_keys_allowed_and_no_serde_words() {
    let dir = tempfile::tempdir().unwrap();
    let (key, trust) = keygen(dir.path());
    let bundle = dir.path().join("b");
    let signed = sluice(&[
        "bundle",
        "sign",
        "--key",
        &key,
        "--policy",
        "policies/dev.yaml",
        "--revision",
        "1",
        "--out",
        bundle.to_str().unwrap(),
    ]);
    assert!(signed.status.success(), "{}", said(&signed));
    let manifest = bundle.join("manifest.yaml");
    let mut text = std::fs::read_to_string(&manifest).unwrap();
    text.push_str("version: 1\n");
    std::fs::write(&manifest, text).unwrap();
    let out = sluice(&[
        "bundle",
        "verify",
        "--trust",
        &trust,
        bundle.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let text = said(&out);
    assert!(
        text.contains("malformed manifest at manifest.yaml:8:1: unknown key `version` in the manifest; remove it; the allowed keys are `name`, `revision`, `created`, `expires`, `key_id`, `files`"),
        "{text}"
    );
    assert!(!text.contains("field"), "{text}");
}

#[test]
fn a_yaml_syntax_error_in_a_policy_prints_its_position_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.yaml");
    std::fs::write(
        &path,
        "version: 1\nname: t\nrules:\n  - name: a\n   action: allow\n",
    )
    .unwrap();
    let out = sluice(&["check", "--policy", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(text.contains("p.yaml:5:4: "), "{text}");
    assert!(!text.contains("line 5"), "{text}");
    assert!(!text.contains("column"), "{text}");
}

/// A hosts rule on 443; every IPv6 address allowed on 8443 except what the
/// IPv4 deny rule for 10.0.0.0/8 names.
const EMBEDDED_POLICY: &str = r#"version: 1
name: embedded
rules:
  - name: web
    action: allow
    hosts: ["origin.test"]
    ports: [443]
  - name: any-v6
    action: allow
    cidrs: ["::/0"]
    ports: [8443]
  - name: no-internal
    action: deny
    cidrs: ["10.0.0.0/8"]
    ports: [8443]
"#;

/// `sluice explain` for `ip` on 443 as origin.test, then on 8443: both must
/// be judged by the IPv4 10.0.0.1 inside it.
fn explain_is_judged_as_ten_0_0_1(ip: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("embedded.yaml");
    std::fs::write(&path, EMBEDDED_POLICY).unwrap();
    let policy = path.to_str().unwrap();
    let by_name = sluice(&[
        "explain",
        "--policy",
        policy,
        &format!("[{ip}]:443"),
        "--host",
        "origin.test",
    ]);
    let text = stdout(&by_name);
    assert!(by_name.status.success(), "{}", stderr(&by_name));
    assert!(text.contains("verdict:     deny"), "{ip}:\n{text}");
    assert!(
        text.contains("reason:      private-address"),
        "{ip}:\n{text}"
    );
    let by_address = sluice(&["explain", "--policy", policy, &format!("[{ip}]:8443")]);
    let text = stdout(&by_address);
    assert!(text.contains("verdict:     deny"), "{ip}:\n{text}");
    assert!(text.contains("rule:        no-internal"), "{ip}:\n{text}");
    assert!(text.contains("reason:      deny-rule"), "{ip}:\n{text}");
}

#[test]
fn explain_judges_nat64_by_the_ipv4_inside() {
    explain_is_judged_as_ten_0_0_1("64:ff9b::a00:1");
}

#[test]
fn explain_judges_local_use_nat64_by_the_ipv4_inside() {
    explain_is_judged_as_ten_0_0_1("64:ff9b:1:a00:0:100::");
}

#[test]
fn explain_judges_6to4_by_the_ipv4_inside() {
    explain_is_judged_as_ten_0_0_1("2002:a00:1::1");
}

#[test]
fn explain_judges_a_teredo_client_by_the_ipv4_inside() {
    explain_is_judged_as_ten_0_0_1("2001:0:c633:6401::f5ff:fffe");
}

#[test]
fn explain_judges_a_teredo_server_by_the_ipv4_inside() {
    explain_is_judged_as_ten_0_0_1("2001:0:a00:1::39ed:fffe");
}

#[test]
fn explain_judges_ipv4_compatible_by_the_ipv4_inside() {
    explain_is_judged_as_ten_0_0_1("::a00:1");
}

#[test]
fn audit_verify_of_a_missing_file_is_bad_input_on_stderr() {
    let out = sluice(&["audit", "verify", "/nonexistent/audit.jsonl"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("/nonexistent/audit.jsonl"), "{text}");
    assert!(text.contains("give the file `--audit` wrote"), "{text}");
    assert!(!text.contains("audit.jsonl:0:"), "{text}");
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
}

#[test]
fn a_refused_bundle_is_said_on_stderr_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (key, trust, other_trust, bundle) = (
        path("key"),
        path("trust.yaml"),
        path("other-trust.yaml"),
        path("b.tar.gz"),
    );
    let ok = |out: &Output| assert!(out.status.success(), "{}", stderr(out));
    ok(&sluice(&[
        "bundle", "keygen", "--key", &key, "--trust", &trust, "--id", "ops",
    ]));
    ok(&sluice(&[
        "bundle",
        "keygen",
        "--key",
        &path("other-key"),
        "--trust",
        &other_trust,
        "--id",
        "stranger",
    ]));
    ok(&sluice(&[
        "bundle",
        "sign",
        "--key",
        &key,
        "--policy",
        "policies/dev.yaml",
        "--revision",
        "1",
        "--out",
        &bundle,
    ]));
    let valid = sluice(&["bundle", "verify", "--trust", &trust, &bundle]);
    ok(&valid);
    assert!(
        stdout(&valid).contains("valid bundle"),
        "{}",
        stdout(&valid)
    );

    let refused = sluice(&["bundle", "verify", "--trust", &other_trust, &bundle]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(stdout(&refused).is_empty(), "{}", stdout(&refused));
    let text = stderr(&refused);
    assert!(text.contains("bundle refused"), "{text}");
    assert!(text.contains(&bundle), "{text}");
}

#[test]
fn status_without_a_daemon_says_to_start_one_and_exits_4() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-daemon.sock");
    let out = sluice(&["status", "--socket", socket.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("no sluice daemon answers"), "{text}");
    assert!(text.contains("sluice daemon --config FILE"), "{text}");
}

// ------------------------------------------------------ audit checkpoints

/// `sluice audit keygen --state-dir DIR/state`: the key's public half.
fn audit_keygen(dir: &Path) -> String {
    let state = dir.join("state");
    let out = sluice(&["audit", "keygen", "--state-dir", state.to_str().unwrap()]);
    assert!(out.status.success(), "{}", said(&out));
    stdout(&out).trim().to_string()
}

/// A log of `n` denies signed with the key in DIR/state, checkpoints every
/// `every` records and at the end, written as sluice writes it.
fn signed_log(dir: &Path, n: usize, every: u64) -> std::path::PathBuf {
    use sluice::audit::{AuditEvent, AuditKey, AuditOptions, AuditWriter, CheckpointOptions};
    let path = dir.join("audit.jsonl");
    let key = std::sync::Arc::new(AuditKey::open_or_create(&dir.join("state")).unwrap());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let opts = AuditOptions {
            checkpoints: Some(CheckpointOptions {
                key,
                every_records: every,
                interval: std::time::Duration::ZERO,
            }),
            ..AuditOptions::default()
        };
        let (log, writer) = AuditWriter::with_options(Some(&path), opts);
        let task = tokio::spawn(writer.run());
        for _ in 0..n {
            log.record(AuditEvent {
                sandbox: "sb".into(),
                path: sluice::workload::WorkloadPath::Host,
                verdict: "deny",
                rule: None,
                reason: "no-rule",
                proto: sluice::audit::Proto::Tcp,
                src: None,
                dst: Some("198.18.0.2:7000".parse().unwrap()),
                host: None,
                bundle: "b".into(),
                request: None,
            })
            .await;
        }
        drop(log);
        task.await.unwrap().unwrap();
    });
    path
}

#[test]
fn audit_keygen_writes_a_key_only_its_owner_reads_prints_the_public_key_and_never_overwrites() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let public = audit_keygen(dir.path());
    assert_eq!(public.len(), 64, "{public}");
    let key = dir.path().join("state/audit.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let trust = std::fs::read_to_string(dir.path().join("state/audit.pub")).unwrap();
    assert!(trust.contains(&public), "{trust}");
    let state = dir.path().join("state");
    let again = sluice(&["audit", "keygen", "--state-dir", state.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2), "{}", said(&again));
    assert!(
        stderr(&again).contains("already exists"),
        "{}",
        stderr(&again)
    );
}

#[test]
fn audit_verify_with_the_key_says_every_record_is_anchored_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let public = audit_keygen(dir.path());
    let log = signed_log(dir.path(), 7, 3);
    let out = sluice(&["audit", "verify", "--key", &public, log.to_str().unwrap()]);
    assert!(out.status.success(), "{}", said(&out));
    let text = stdout(&out);
    assert!(
        text.contains("chain intact: 7 records and 3 checkpoints"),
        "{text}"
    );
    assert!(text.contains("3 checkpoints verified"), "{text}");
    assert!(text.contains("every record is anchored"), "{text}");
}

#[test]
fn audit_verify_with_the_key_file_says_how_many_records_are_unanchored_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    audit_keygen(dir.path());
    let log = signed_log(dir.path(), 7, 3);
    // The shutdown checkpoint is lost (sluice was killed before it).
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&log, lines[..lines.len() - 1].join("\n") + "\n").unwrap();
    let public = dir.path().join("state/audit.pub");
    let out = sluice(&[
        "audit",
        "verify",
        "--key",
        public.to_str().unwrap(),
        log.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", said(&out));
    let text = stdout(&out);
    assert!(
        text.contains("1 record after the newest checkpoint (seq 7) is unanchored"),
        "{text}"
    );
}

#[test]
fn audit_verify_without_a_key_says_checkpoints_were_not_verified() {
    let dir = tempfile::tempdir().unwrap();
    let log = signed_log(dir.path(), 2, 0);
    let out = sluice(&["audit", "verify", log.to_str().unwrap()]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        stdout(&out).contains("checkpoints not verified: no --key given"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn audit_verify_of_a_checkpoint_under_another_key_exits_1_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = signed_log(dir.path(), 2, 0);
    let other = tempfile::tempdir().unwrap();
    let public = audit_keygen(other.path());
    let out = sluice(&["audit", "verify", "--key", &public, log.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with(&format!("{}:3: the checkpoint names key", log.display())),
        "{text}"
    );
}

#[test]
fn audit_verify_with_a_key_that_is_not_one_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let log = signed_log(dir.path(), 1, 0);
    let out = sluice(&[
        "audit",
        "verify",
        "--key",
        "/nonexistent/audit.pub",
        log.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        stderr(&out).contains("--key /nonexistent/audit.pub"),
        "{}",
        stderr(&out)
    );
}

/// `sluice ARGS... --id ID AFTER...`: exit 2 and the one message for a
/// bad sandbox id.
fn assert_bad_id_refused(args: &[&str], id: &str, after: &[&str]) {
    let mut argv = args.to_vec();
    argv.extend(["--id", id]);
    argv.extend(after);
    let out = sluice(&argv);
    assert_eq!(out.status.code(), Some(2), "{argv:?}: {}", stderr(&out));
    assert!(
        stderr(&out).contains(&bad_sandbox_id_message(id)),
        "{argv:?}: {}",
        stderr(&out)
    );
}

fn bad_ids_for_the_command_line() -> Vec<String> {
    let mut ids = bad_sandbox_ids();
    ids.extend(["".to_string(), "a b".to_string()]);
    ids
}

#[test]
fn sluice_vm_refuses_a_bad_sandbox_id_naming_the_rule() {
    for id in bad_ids_for_the_command_line() {
        assert_bad_id_refused(
            &["vm", "--policy", "policies/dev.yaml"],
            &id,
            &["--", "true"],
        );
    }
}

#[test]
fn sluice_vm_attach_refuses_a_bad_sandbox_id_naming_the_rule() {
    for id in bad_ids_for_the_command_line() {
        assert_bad_id_refused(
            &[
                "vm",
                "attach",
                "--policy",
                "policies/dev.yaml",
                "--tap",
                "tap0",
                "--netns",
                "vm1",
                "--guest-mac",
                "52:54:00:12:34:56",
                "--guest-ip",
                "198.19.254.2/30",
            ],
            &id,
            &[],
        );
    }
}

#[test]
fn sluice_vm_detach_through_the_daemon_refuses_a_bad_sandbox_id_naming_the_rule() {
    for id in bad_ids_for_the_command_line() {
        assert_bad_id_refused(&["vm", "detach", "--daemon"], &id, &[]);
    }
}

#[test]
fn a_sandbox_id_of_the_longest_length_is_taken() {
    let longest = "a".repeat(sluice::sandbox_id::MAX_LEN);
    assert!(longest.parse::<sluice::sandbox_id::SandboxId>().is_ok());
    // Past the id, `sluice vm detach --daemon` fails for want of a daemon
    // (exit 4), not for the id (exit 2).
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-daemon.sock");
    let out = sluice(&[
        "vm",
        "detach",
        "--daemon",
        "--socket",
        socket.to_str().unwrap(),
        "--id",
        &longest,
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
}

// ------------------------------------------------- exit statuses (README)
// One per documented status; the others are pinned where their cause is:
// 1 `audit_verify_of_a_checkpoint_under_another_key_exits_1_naming_its_line`,
// 2 `check_reports_every_error_with_its_line_and_column_and_exits_2`,
// 4 `status_without_a_daemon_says_to_start_one_and_exits_4`; tests/run.rs
// has 0, 1 and 2 of `sluice run`, 126, 127 and 128+N.

#[test]
fn exit_status_0_when_the_policy_checks() {
    let out = sluice(&["check", "--policy", "policies/dev.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn exit_status_3_when_sluice_run_is_not_root() {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(sluice_bin());
    cmd.args(["run", "--policy", "policies/dev.yaml", "--", "true"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if nix::unistd::geteuid().is_root() {
        // As nobody: the real cause, not a stand-in for it.
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("sluice run needs root"),
        "{}",
        stderr(&out)
    );
}
