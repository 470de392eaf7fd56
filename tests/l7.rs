//! Requests, not only connections (DESIGN.md, "Requests"): under a rule
//! with an `http` or `inject` block, `sluice run` terminates the
//! workload's TLS with its sandbox CA (which curl and python trust with no
//! flags), decides every request on the rule, injects the credential only
//! into requests the rule admits, and records each refusal and each
//! injection. The origin is a real rustls server with a test CA that sluice
//! is told to trust (`--upstream-ca`); the clients are real curl and
//! python3 inside the sandbox.

#[path = "common/attack.rs"]
mod attack;
mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::l7::{keepalive_origin, Requests};
use common::*;

const SECRET: &str = "s3cret-value-0451";
const ORIGIN: &str = "198.18.0.1:443";
const OTHER: &str = "198.18.0.2:443";

fn policy(secret_file: &Path) -> String {
    format!(
        r#"
version: 1
name: l7
secrets:
  - name: gh
    file: {}
rules:
  - name: code-host-read
    action: allow
    hosts: ["api.github.test"]
    ports: [443]
    http:
      - methods: [GET, HEAD]
        paths: ["/repos/*/*/contents/**", "/user"]
      - methods: [POST]
        paths: ["/repos/*/*/git-upload-pack"]
      - methods: [GET]
        paths: ["/ws"]
    inject:
      - header: Authorization
        value: "Bearer {{{{gh}}}}"
  - name: other-api
    action: allow
    hosts: ["other.test"]
    ports: [443]
    http:
      - methods: ["*"]
        paths: ["/**"]
dns:
  upstream: []
  hosts:
    api.github.test: ["198.18.0.1"]
    other.test: ["198.18.0.2"]
"#,
        secret_file.display()
    )
}

/// A world with the origins up, the secret written, and the policy.
struct Setup {
    w: World,
    policy: PathBuf,
    origin_ca: PathBuf,
    other_ca: PathBuf,
    seen: std::sync::Arc<Requests>,
    other_seen: std::sync::Arc<Requests>,
    secret_file: PathBuf,
}

fn setup() -> Option<Setup> {
    let w = World::new()?;
    let (origin_ca, seen) = keepalive_origin(&w, ORIGIN, &["api.github.test"]);
    let (other_ca, other_seen) = keepalive_origin(&w, OTHER, &["other.test"]);
    let secret_file = w.dir.path().join("gh-token");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let policy = w.policy(&policy(&secret_file));
    Some(Setup {
        w,
        policy,
        origin_ca,
        other_ca,
        seen,
        other_seen,
        secret_file,
    })
}

impl Setup {
    /// `sluice run` trusting both test origins, audit on.
    fn run(&self, argv: &[&str]) -> Output {
        let child = self
            .w
            .outer
            .command(sluice_bin())
            .arg("-v")
            .arg("run")
            .arg("--policy")
            .arg(&self.policy)
            .arg("--audit")
            .arg(self.w.audit_path())
            .arg("--state-dir")
            .arg(self.w.state_dir())
            .arg("--upstream-ca")
            .arg(&self.origin_ca)
            .arg("--upstream-ca")
            .arg(&self.other_ca)
            .arg("--")
            .args(argv)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn sluice");
        wait_bounded(child, std::time::Duration::from_secs(60))
    }

    fn sh(&self, script: &str) -> Output {
        self.run(&["sh", "-c", script])
    }

    /// Audit records about requests (those with a method).
    fn request_records(&self) -> Vec<serde_json::Value> {
        self.w
            .audit()
            .into_iter()
            .filter(|r| r.get("method").is_some())
            .collect()
    }
}

fn curl_available() -> bool {
    tool_path("curl").is_some()
}

#[test]
fn an_admitted_request_reaches_the_origin_with_the_credential_the_workload_never_held() {
    let Some(s) = setup() else { return };
    if !curl_available() {
        panic!("curl is needed (apt-get install --no-install-recommends curl)");
    }
    let out = s.sh(
        "echo placeholder=$SLUICE_SECRET_GH; curl -sS -H 'Authorization: Bearer mine' https://api.github.test/user",
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("ok /user"), "{text}");
    // The workload holds a placeholder, never the secret.
    assert!(
        text.contains("placeholder=sluice-placeholder-gh-"),
        "{text}"
    );
    assert!(!text.contains(SECRET), "{text}");
    let seen = s.seen.all();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].header("authorization").as_deref(),
        Some(format!("Bearer {SECRET}").as_str()),
        "the workload's own Authorization is replaced"
    );
    // One injection record: the rule, the secret's name and the header.
    let injected: Vec<_> = s
        .request_records()
        .into_iter()
        .filter(|r| r["reason"] == "inject")
        .collect();
    assert_eq!(injected.len(), 1, "{injected:?}");
    assert_eq!(injected[0]["rule"], "code-host-read");
    assert_eq!(injected[0]["secret"], "gh");
    assert_eq!(injected[0]["header"], "authorization");
    assert_eq!(injected[0]["request_path"], "/user");
    // The value is in no record.
    let audit = std::fs::read_to_string(s.w.audit_path()).unwrap();
    assert!(!audit.contains(SECRET));
}

#[test]
fn python_trusts_the_sandbox_ca_with_no_flags() {
    let Some(s) = setup() else { return };
    let Some(python) = tool_path("python3") else {
        panic!("python3 is needed (apt-get install --no-install-recommends python3)");
    };
    let out = s.run(&[
        python.to_str().unwrap(),
        "-c",
        "import urllib.request; print(urllib.request.urlopen('https://api.github.test/repos/a/b/contents/x/y').read().decode())",
    ]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("ok /repos/a/b/contents/x/y"));
}

#[test]
fn a_method_no_entry_lists_is_refused_with_a_403_naming_the_rule_and_audited() {
    let Some(s) = setup() else { return };
    let out = s.sh("curl -sS -X DELETE -D - https://api.github.test/user");
    let text = stdout(&out);
    assert!(text.contains("403"), "{text}\n{}", stderr(&out));
    assert!(
        text.contains("code-host-read") && text.contains("http-method"),
        "{text}"
    );
    assert!(s.seen.all().is_empty(), "the origin saw {:?}", s.seen.all());
    let records = s.request_records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["verdict"], "deny");
    assert_eq!(records[0]["reason"], "http-method");
    assert_eq!(records[0]["method"], "DELETE");
    assert_eq!(records[0]["request_path"], "/user");
}

#[test]
fn a_path_no_pattern_matches_is_refused_and_its_record_drops_the_query() {
    let Some(s) = setup() else { return };
    let out = s.sh("curl -sS 'https://api.github.test/admin/keys?token=abc'");
    assert!(stdout(&out).contains("http-path"), "{}", stdout(&out));
    assert!(s.seen.all().is_empty());
    let records = s.request_records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["reason"], "http-path");
    assert_eq!(records[0]["request_path"], "/admin/keys");
    let audit = std::fs::read_to_string(s.w.audit_path()).unwrap();
    assert!(!audit.contains("token=abc"));
}

#[test]
fn a_dot_segment_path_is_refused_even_when_it_would_normalise_into_an_admitted_one() {
    let Some(s) = setup() else { return };
    let out = s
        .sh("curl -sS --path-as-is 'https://api.github.test/repos/a/b/contents/../../../../admin'");
    assert!(stdout(&out).contains("http-path"), "{}", stdout(&out));
    assert!(s.seen.all().is_empty());
}

#[test]
fn a_host_header_other_than_the_verified_name_is_refused() {
    let Some(s) = setup() else { return };
    let out = s.sh("curl -sS -H 'Host: other.test' https://api.github.test/user");
    assert!(stdout(&out).contains("host-mismatch"), "{}", stdout(&out));
    assert!(s.seen.all().is_empty());
    assert!(s.other_seen.all().is_empty());
}

#[test]
fn a_second_request_on_a_kept_alive_connection_to_a_forbidden_path_is_refused() {
    let Some(s) = setup() else { return };
    // One curl, one connection: the first request is admitted, the second
    // is decided on its own.
    let out =
        s.sh("curl -sS https://api.github.test/user https://api.github.test/admin 2>&1; echo");
    let text = stdout(&out);
    assert!(text.contains("ok /user"), "{text}");
    assert!(text.contains("http-path"), "{text}");
    assert_eq!(s.seen.targets(), ["/user"]);
}

#[test]
fn a_placeholder_in_a_query_string_is_refused_as_secret_misuse() {
    let Some(s) = setup() else { return };
    let out = s.sh("curl -sS \"https://api.github.test/user?t=$SLUICE_SECRET_GH\"");
    assert!(stdout(&out).contains("secret-misuse"), "{}", stdout(&out));
    assert!(s.seen.all().is_empty());
    assert!(s
        .request_records()
        .iter()
        .any(|r| r["reason"] == "secret-misuse"));
}

#[test]
fn a_placeholder_in_a_body_never_reaches_the_origin_whole() {
    let Some(s) = setup() else { return };
    let out = s.sh(
        "curl -sS -X POST --data \"x=$SLUICE_SECRET_GH\" https://api.github.test/repos/a/b/git-upload-pack",
    );
    assert!(stdout(&out).contains("secret-misuse"), "{}", stdout(&out));
    assert!(
        s.seen.all().iter().all(|r| r.body.is_empty()),
        "{:?}",
        s.seen.all()
    );
    assert!(s
        .request_records()
        .iter()
        .any(|r| r["reason"] == "secret-misuse" && r["secret"] == "gh"));
}

#[test]
fn a_placeholder_sent_to_a_host_whose_rule_does_not_inject_it_is_refused() {
    let Some(s) = setup() else { return };
    let out = s.sh("curl -sS -H \"Authorization: Bearer $SLUICE_SECRET_GH\" https://other.test/x");
    assert!(stdout(&out).contains("secret-misuse"), "{}", stdout(&out));
    assert!(s.other_seen.all().is_empty());
}

#[test]
fn request_smuggling_pairs_are_refused_before_the_origin() {
    let Some(s) = setup() else { return };
    let Some(python) = tool_path("python3") else {
        panic!("python3 is needed (apt-get install --no-install-recommends python3)");
    };
    // Raw requests over TLS (the sandbox CA trusted by default): CL+TE,
    // two Content-Lengths, and an obs-folded header.
    let script = r#"
import socket, ssl, sys
ctx = ssl.create_default_context()
pairs = [
  b"POST /repos/a/b/git-upload-pack HTTP/1.1\r\nHost: api.github.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: api.github.test\r\n\r\n",
  b"POST /repos/a/b/git-upload-pack HTTP/1.1\r\nHost: api.github.test\r\nContent-Length: 0\r\nContent-Length: 40\r\n\r\nGET /admin HTTP/1.1\r\nHost: api.github.test\r\n\r\n",
  b"GET /user HTTP/1.1\r\nHost: api.github.test\r\nX-A: a\r\n b\r\n\r\n",
]
for raw in pairs:
    s = ctx.wrap_socket(socket.create_connection(("api.github.test", 443)), server_hostname="api.github.test")
    s.sendall(raw)
    got = b""
    while True:
        try:
            d = s.recv(4096)
        except Exception:
            break
        if not d:
            break
        got += d
    statuses = [l.decode(errors="replace") for l in got.split(b"\r\n") if l.startswith(b"HTTP/1.1 ")]
    print("STATUS", " | ".join(statuses))
"#;
    let out = s.run(&[python.to_str().unwrap(), "-c", script]);
    let text = stdout(&out);
    let statuses: Vec<&str> = text.lines().filter(|l| l.starts_with("STATUS")).collect();
    assert_eq!(statuses.len(), 3, "{text}\n{}", stderr(&out));
    // CL+TE: hyper reads the body as chunked, drops the Content-Length (the
    // origin gets one framing) and closes the connection after answering:
    // the bytes after the chunked body are never a request to anyone.
    assert_eq!(statuses[0], "STATUS HTTP/1.1 200 OK", "{statuses:?}");
    // Two lengths, and an obs-folded header: refused outright.
    assert!(statuses[1].ends_with("400 Bad Request"), "{statuses:?}");
    assert!(statuses[2].ends_with("400 Bad Request"), "{statuses:?}");
    let seen = s.seen.all();
    assert!(seen.iter().all(|r| r.target() != "/admin"), "{seen:?}");
    assert!(
        seen.iter().all(
            |r| r.header("content-length").is_none() || r.header("transfer-encoding").is_none()
        ),
        "{seen:?}"
    );
}

/// One `curl https://api.github.test/user` under `sluice run` with the
/// injecting policy, to an origin whose certificate names `names`, its CA
/// given to sluice with --upstream-ca or not: the request must be refused
/// on the origin's certificate, reach nothing, and be audited, with no
/// injection.
fn refused_on_the_origins_certificate(names: &[&str], trust_its_ca: bool) {
    let Some(w) = World::new() else { return };
    let (ca, seen) = keepalive_origin(&w, ORIGIN, names);
    let secret_file = w.dir.path().join("gh-token");
    std::fs::write(&secret_file, SECRET).unwrap();
    let policy = w.policy(&policy(&secret_file));
    let mut run = w.outer.command(sluice_bin());
    run.arg("run")
        .arg("--policy")
        .arg(&policy)
        .arg("--audit")
        .arg(w.audit_path())
        .arg("--state-dir")
        .arg(w.state_dir());
    if trust_its_ca {
        run.arg("--upstream-ca").arg(&ca);
    }
    let out = run
        .args(["--", "curl", "-sS", "https://api.github.test/user"])
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("upstream-certificate"),
        "{}",
        stdout(&out)
    );
    assert!(seen.all().is_empty(), "{:?}", seen.all());
    let audit = w.audit();
    assert!(
        audit
            .iter()
            .any(|r| r["reason"] == "upstream-certificate" && r["verdict"] == "deny"),
        "{audit:?}"
    );
    assert!(!audit.iter().any(|r| r["reason"] == "inject"), "{audit:?}");
}

#[test]
fn an_origin_whose_certificate_is_not_for_the_name_gets_no_request_and_no_credential() {
    // Its CA is trusted, but the certificate names another host.
    refused_on_the_origins_certificate(&["impostor.test"], true);
}

#[test]
fn an_origin_whose_certificate_no_trusted_ca_signed_gets_no_request_and_no_credential() {
    // The certificate names the host, but its CA is not given to sluice
    // (no --upstream-ca) and is in no system bundle.
    refused_on_the_origins_certificate(&["api.github.test"], false);
}

#[test]
fn the_workload_cannot_read_the_secret_file() {
    let Some(s) = setup() else { return };
    let file = s.secret_file.display().to_string();
    let out = s.sh(&format!("cat {file}; echo status=$?"));
    let text = stdout(&out);
    assert!(!text.contains(SECRET), "{text}");
    assert!(!text.contains("status=0"), "{text}");
}

#[test]
fn a_client_that_pins_its_own_ca_fails_closed_and_nothing_reaches_the_origin() {
    let Some(s) = setup() else { return };
    // curl told to trust only the origin's real CA: sluice's leaf fails.
    let ca = s.origin_ca.display().to_string();
    let out = s.sh(&format!(
        "curl -sS --cacert {ca} https://api.github.test/user; echo status=$?"
    ));
    assert!(!stdout(&out).contains("status=0"), "{}", stdout(&out));
    assert!(s.seen.all().is_empty());
    assert!(s
        .w
        .audit()
        .iter()
        .any(|r| r["reason"] == "tls-handshake" && r["verdict"] == "deny"));
}

#[test]
fn a_websocket_upgrade_is_checked_then_relayed_raw_and_one_to_a_forbidden_path_is_refused() {
    let Some(s) = setup() else { return };
    let Some(python) = tool_path("python3") else {
        panic!("python3 is needed (apt-get install --no-install-recommends python3)");
    };
    let script = r#"
import socket, ssl
ctx = ssl.create_default_context()
for path in ["/ws", "/admin-ws"]:
    s = ctx.wrap_socket(socket.create_connection(("api.github.test", 443)), server_hostname="api.github.test")
    s.sendall(("GET %s HTTP/1.1\r\nHost: api.github.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" % path).encode())
    got = b""
    while b"\r\n\r\n" not in got:
        d = s.recv(4096)
        if not d:
            break
        got += d
    print(path, "STATUS", got.split(b"\r\n")[0].decode())
    if b" 101 " in got.split(b"\r\n")[0]:
        s.sendall(b"raw-bytes-after-upgrade")
        print(path, "ECHO", s.recv(4096).decode())
"#;
    let out = s.run(&[python.to_str().unwrap(), "-c", script]);
    let text = stdout(&out);
    assert!(
        text.contains("/ws STATUS HTTP/1.1 101"),
        "{text}\n{}",
        stderr(&out)
    );
    assert!(text.contains("/ws ECHO raw-bytes-after-upgrade"), "{text}");
    assert!(text.contains("/admin-ws STATUS HTTP/1.1 403"), "{text}");
    assert_eq!(s.seen.targets(), ["/ws"]);
}

#[test]
fn an_upgrade_to_anything_but_websocket_is_refused_so_no_request_escapes_the_decisions() {
    let Some(s) = setup() else { return };
    // h2c would carry HTTP/2 requests sluice no longer reads.
    let out = s.sh(
        "curl -sS -H 'Connection: Upgrade, HTTP2-Settings' -H 'Upgrade: h2c' -H 'HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA' https://api.github.test/user",
    );
    assert!(stdout(&out).contains("http-upgrade"), "{}", stdout(&out));
    assert!(s.seen.all().is_empty(), "{:?}", s.seen.all());
}

#[test]
fn a_secret_read_from_sluices_environment_is_not_in_the_workloads() {
    let Some(w) = World::new() else { return };
    let (ca, seen) = keepalive_origin(&w, ORIGIN, &["api.github.test"]);
    let text =
        policy(Path::new("/unused")).replace("    file: /unused", "    env: SLUICE_TEST_GH_TOKEN");
    let policy = w.policy(&text);
    let out = w
        .outer
        .command(sluice_bin())
        .env("SLUICE_TEST_GH_TOKEN", SECRET)
        .arg("run")
        .arg("--policy")
        .arg(&policy)
        .arg("--state-dir")
        .arg(w.state_dir())
        .arg("--upstream-ca")
        .arg(&ca)
        .args([
            "--",
            "sh",
            "-c",
            "echo token=${SLUICE_TEST_GH_TOKEN:-unset}; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c s3cret; curl -sS https://api.github.test/user",
        ])
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(text.contains("token=unset"), "{text}\n{}", stderr(&out));
    assert!(!text.contains(SECRET), "{text}");
    assert!(text.contains("ok /user"), "{text}");
    let seen = seen.all();
    assert_eq!(
        seen[0].header("authorization").as_deref(),
        Some(format!("Bearer {SECRET}").as_str())
    );
}

#[test]
fn a_root_workload_hunting_through_proc_finds_neither_sluice_nor_a_secret_in_any_memory_it_reads() {
    let Some(s) = setup() else { return };
    // Besides the file's secret (read by sluice after the workload's init
    // was forked), one from sluice's own environment, which that init
    // inherited with the fork.
    const ENV_SECRET: &str = "env-s3cret-value-0452";
    let text = std::fs::read_to_string(&s.policy).unwrap().replace(
        "secrets:\n",
        "secrets:\n  - name: from-env\n    env: SLUICE_TEST_ENV_TOKEN\n",
    );
    let policy = s.w.policy(&text);
    let needles = [hex::encode(SECRET), hex::encode(ENV_SECRET)];
    let mut cmd = attack::sluice_run(
        &s.w,
        &policy,
        &["--state-dir", s.w.state_dir().to_str().unwrap()],
        &[
            attack::python().to_str().unwrap(),
            "-c",
            attack::READ_MEMORY,
        ],
    );
    cmd.args(&needles)
        .env("SLUICE_TEST_ENV_TOKEN", ENV_SECRET)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn sluice");
    // Once the workload runs, `ip netns exec` has become sluice: the
    // child's pid is sluice's.
    let first = attack::read_line(child.stdout.as_mut().unwrap());
    assert_eq!(first, "ready");
    let sluice = child.id();
    let exe = std::fs::read_link(format!("/proc/{sluice}/exe")).unwrap();
    assert!(exe.ends_with("sluice"), "{}", exe.display());
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{sluice}").unwrap();
    }
    let out = wait_bounded(child, std::time::Duration::from_secs(120));
    let text = stdout(&out);
    let says = |line: &str| text.lines().any(|l| l == line);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));

    // The hunt is real: it sees its own process in /proc and reads its own
    // memory through /proc/self/mem (the marker it holds is there).
    let me = text
        .lines()
        .find_map(|l| l.strip_prefix("self "))
        .unwrap_or_else(|| panic!("no self line: {text}"));
    let pids: Vec<&str> = text
        .lines()
        .find_map(|l| l.strip_prefix("pids "))
        .unwrap_or_else(|| panic!("no pids line: {text}"))
        .split(' ')
        .collect();
    assert!(pids.contains(&me), "{text}");
    assert!(says(&format!("marker {me} mem")), "{text}");

    // No secret in anything it read of any process.
    assert!(!text.contains("FOUND"), "{text}");
    // sluice is not among the processes it sees (its own PID namespace
    // holds only its init and itself) ...
    assert!(!pids.contains(&sluice.to_string().as_str()), "{text}");
    for pid in &pids {
        assert!(
            *pid == me || *pid == "1",
            "an unexpected process {pid}: {text}"
        );
    }
    // ... and sluice's pid reaches nothing: no /proc entry, no signal, no
    // pidfd, no trace, no copy of its memory.
    for what in ["status", "cmdline", "environ", "maps", "mem"] {
        assert!(
            says(&format!("refused {sluice} {what} 2")),
            "{what}: {text}"
        );
    }
    for what in ["kill", "pidfd_open", "ptrace", "process_vm_readv"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("refused {sluice} {what} "))),
            "{what}: {text}"
        );
    }
    // Nor its own init's environment or memory (a fork of sluice, holding
    // what sluice held then: the environment's secret among it).
    for what in ["environ", "maps", "ptrace"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("refused 1 {what} "))),
            "{what}: {text}"
        );
    }
    assert!(
        !text.contains("attached") && !text.contains("copied"),
        "{text}"
    );
}
