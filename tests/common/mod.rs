//! Shared topology for the end-to-end tests: a throwaway "host" namespace with
//! origin servers (sluice's own `testbed`), a temp dir for policies and
//! audit logs, and helpers that run `sluice run` inside it.
//!
//! Privileged tests need root, `ip` and `nft`. Without them they skip loudly,
//! or fail when SLUICE_REQUIRE_PRIVILEGED=1 (as in CI).

#![allow(dead_code, unused_imports)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod daemon;
pub mod l7;
mod late;
pub mod records;
pub mod vm;

pub use late::{client_hello, test_file, LATE_SENDER};

pub use sluice::testbed::{pattern, OuterNetns};

pub const ORIGIN_V4: &str = "198.18.0.1";
pub const OTHER_V4: &str = "198.18.0.2";
pub const ORIGIN_V6: &str = "2001:db8::1";

pub fn sluice_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sluice")
}

/// True when this test may run; false (after saying so) when it must skip.
pub fn privileged() -> bool {
    let missing = if !nix::unistd::geteuid().is_root() {
        Some("not root")
    } else if !tool_exists("nft") {
        Some("nft not installed (apt-get install nftables)")
    } else if !tool_exists("ip") {
        Some("ip not installed (apt-get install iproute2)")
    } else {
        None
    };
    match missing {
        None => true,
        Some(why) if std::env::var("SLUICE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") => {
            panic!("privileged test cannot run: {why} (SLUICE_REQUIRE_PRIVILEGED=1)")
        }
        Some(why) => {
            eprintln!("SKIPPED: privileged test needs root, nft and ip: {why}");
            false
        }
    }
}

fn tool_exists(tool: &str) -> bool {
    tool_path(tool).is_some()
}

/// Where `tool` is on PATH, if anywhere.
pub fn tool_path(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(tool))
            .find(|p| p.is_file())
    })
}

/// One test's world: the outer namespace, its origins, a temp dir, and a
/// state directory apart from it (a container may bind the temp dir, never
/// a directory that holds an audit checkpoint key).
pub struct World {
    pub outer: OuterNetns,
    pub dir: tempfile::TempDir,
    pub state: tempfile::TempDir,
}

impl World {
    /// The outer namespace with 198.18.0.1, 198.18.0.2 and 2001:db8::1 on
    /// its loopback; None when the test must skip.
    pub fn new() -> Option<World> {
        if !privileged() {
            return None;
        }
        let addrs: Vec<IpAddr> = [ORIGIN_V4, OTHER_V4, ORIGIN_V6]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let outer = OuterNetns::create("sluice-test", &addrs).expect("create test namespace");
        Some(World {
            outer,
            dir: tempfile::tempdir().expect("tempdir"),
            state: tempfile::tempdir().expect("tempdir"),
        })
    }

    pub fn http_origin(&self, addr: &str) -> Arc<std::sync::atomic::AtomicU64> {
        self.outer
            .http_origin(addr.parse().unwrap())
            .expect("http origin")
    }

    pub fn udp_sink(&self, addr: &str) -> Arc<std::sync::atomic::AtomicU64> {
        self.outer
            .udp_sink(addr.parse().unwrap())
            .expect("udp sink")
    }

    /// A TCP server that answers "echo:<what it read>" (a protocol with
    /// neither SNI nor Host).
    pub fn echo_origin(&self, addr: &str) {
        self.serve_each(addr, |mut stream| {
            let mut got = Vec::new();
            let _ = stream.read_to_end(&mut got);
            let _ = stream.write_all(b"echo:");
            let _ = stream.write_all(&got);
        });
    }

    /// A TCP server that says "hello" at once and then holds the
    /// connection until the client closes it.
    pub fn holding_origin(&self, addr: &str) {
        self.serve_each(addr, |mut stream| {
            let _ = stream.write_all(b"hello\n");
            let _ = std::io::copy(&mut stream, &mut std::io::sink());
        });
    }

    /// A server-first TCP server (as SSH or SMTP): sends `banner` at once,
    /// then closes.
    pub fn banner_origin(&self, addr: &str, banner: &'static str) {
        self.serve_each(addr, move |mut stream| {
            let _ = stream.write_all(banner.as_bytes());
        });
    }

    /// An origin that counts the connections it accepts and keeps every
    /// byte it is sent; it answers nothing.
    pub fn recording_origin(&self, addr: &str) -> Arc<Recording> {
        let recording = Arc::new(Recording::default());
        let seen = recording.clone();
        self.serve_each(addr, move |mut stream| {
            seen.accepted
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stream.read(&mut buf) {
                seen.bytes.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        recording
    }

    /// Listen on `addr` in the outer namespace and run `handle` on a thread
    /// for each connection.
    fn serve_each(
        &self,
        addr: &str,
        handle: impl Fn(std::net::TcpStream) + Send + Sync + Clone + 'static,
    ) {
        let addr: SocketAddr = addr.parse().unwrap();
        let listener = self
            .outer
            .run_in(move || TcpListener::bind(addr))
            .unwrap()
            .unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let handle = handle.clone();
                std::thread::spawn(move || handle(stream));
            }
        });
    }

    /// A rustls HTTPS server for `names` on `addr` that says "hello over
    /// tls"; returns the CA file to trust.
    pub fn tls_origin(&self, addr: &str, names: &[&str]) -> PathBuf {
        self.https_server(addr, names, |_| {
            let body = b"hello over tls\n";
            let mut reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            reply.extend_from_slice(body);
            reply
        })
    }

    /// A rustls HTTPS server for `names` on `addr` (certificate from a fresh
    /// test CA) that answers each request with what `respond` makes of its
    /// head; returns the CA file to trust.
    pub fn https_server(
        &self,
        addr: &str,
        names: &[&str],
        respond: impl Fn(&str) -> Vec<u8> + Send + Sync + Clone + 'static,
    ) -> PathBuf {
        let pki = test_pki(names);
        let ca_path = self
            .dir
            .path()
            .join(format!("ca-{}.pem", addr.replace(':', "_")));
        std::fs::write(&ca_path, &pki.ca_pem).unwrap();

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![pki.cert], pki.key)
            .unwrap();
        let config = Arc::new(config);
        self.serve_each(addr, move |stream| {
            let Ok(conn) = rustls::ServerConnection::new(config.clone()) else {
                return;
            };
            let mut tls = rustls::StreamOwned::new(conn, stream);
            let mut buf = [0u8; 4096];
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match tls.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = tls.write_all(&respond(&String::from_utf8_lossy(&head)));
            tls.conn.send_close_notify();
            let _ = tls.flush();
        });
        ca_path
    }

    /// Write a policy file into the temp dir.
    pub fn policy(&self, yaml: &str) -> PathBuf {
        let path = self.dir.path().join("policy.yaml");
        std::fs::write(&path, yaml).unwrap();
        path
    }

    pub fn audit_path(&self) -> PathBuf {
        self.dir.path().join("audit.jsonl")
    }

    /// The audit records written so far.
    pub fn audit(&self) -> Vec<serde_json::Value> {
        audit_records(&self.audit_path())
    }

    /// This test's state directory (`--state-dir`): the audit checkpoint
    /// key goes there, never into the host's /var/lib/sluice.
    pub fn state_dir(&self) -> PathBuf {
        self.state.path().join("state")
    }

    /// `sluice -v run --policy P --audit A --state-dir S -- argv` in the
    /// outer namespace.
    pub fn run_command(&self, policy: &Path, argv: &[&str]) -> Command {
        let mut cmd = self.outer.command(sluice_bin());
        cmd.arg("-v")
            .arg("run")
            .arg("--policy")
            .arg(policy)
            .arg("--audit")
            .arg(self.audit_path())
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--")
            .args(argv);
        cmd
    }

    /// Run to completion (bounded), returning the output.
    pub fn run(&self, policy: &Path, argv: &[&str]) -> Output {
        output_of(self.run_command(policy, argv))
    }

    /// `sluice probe ARGS` inside a sandbox under `policy`.
    pub fn probe(&self, policy: &Path, args: &[&str]) -> Output {
        let mut argv = vec![sluice_bin(), "probe"];
        argv.extend_from_slice(args);
        self.run(policy, &argv)
    }

    /// `sluice probe http --count COUNT --concurrency 8 URL` inside a
    /// sandbox served by `workers` workers (`SLUICE_WORKERS`), with debug
    /// logs on so that [`accepted_per_worker`] can read them.
    pub fn probe_on_workers(&self, policy: &Path, workers: usize, count: u32, url: &str) -> Output {
        let (workers, count) = (workers.to_string(), count.to_string());
        let child = self
            .run_command(
                policy,
                &[
                    sluice_bin(),
                    "probe",
                    "http",
                    "--count",
                    &count,
                    "--concurrency",
                    "8",
                    url,
                ],
            )
            .env("SLUICE_WORKERS", workers)
            .env("RUST_LOG", "sluice=debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice");
        wait_bounded(child, Duration::from_secs(60))
    }
}

/// How many connections each worker's listeners accepted, by worker
/// number, from the debug line each listener logs when it closes.
pub fn accepted_per_worker(out: &Output, workers: usize) -> Vec<u64> {
    let mut accepted = vec![0; workers];
    for line in stderr(out).lines() {
        if !line.contains("proxy listener closed") {
            continue;
        }
        let field = |name: &str| -> Option<u64> {
            line.split(name)
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        if let (Some(worker), Some(count)) = (field("worker="), field("accepted=")) {
            accepted[worker as usize] += count;
        }
    }
    accepted
}

/// Run `cmd` with its output piped, to its end (at most a minute).
pub fn output_of(mut cmd: Command) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    wait_bounded(child, Duration::from_secs(60))
}

/// How many workers served a sandbox: the workers whose listeners logged
/// their close (debug logs on).
pub fn workers_that_listened(out: &Output) -> usize {
    stderr(out)
        .lines()
        .filter(|line| line.contains("proxy listener closed"))
        .filter_map(|line| line.split("worker=").nth(1)?.split_whitespace().next())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// Wait for `child` at most `limit`, killing it (and failing) past that.
pub fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "command did not finish within {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Poll `cond` until it holds or `limit` passes.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    cond()
}

/// Wait (bounded) until `counter` reaches `at_least`; its value then.
pub fn wait_for_count(counter: &std::sync::atomic::AtomicU64, at_least: u64) -> u64 {
    let load = || counter.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(20), || load() >= at_least),
        "the count never reached {at_least} (it is {})",
        load()
    );
    load()
}

/// Wait (bounded) until process `pid` has exited (a zombie not yet reaped
/// counts as exited).
pub fn wait_until_exited(pid: u32) {
    let exited = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state == "Z" || state == "X")
        })
    };
    assert!(
        eventually(Duration::from_secs(20), exited),
        "process {pid} did not exit"
    );
}

/// `cmd` started by a shell that first opens each `(fd, path)` read-only
/// on that descriptor number (0-9: sh's redirections): descriptors its caller hands it, which
/// `sluice run` passes down to the command as any caller's.
pub fn with_descriptors(cmd: &Command, fds: &[(u32, &Path)]) -> Command {
    let mut opens = String::new();
    let mut wrapped = Command::new("sh");
    for (i, (fd, _)) in fds.iter().enumerate() {
        opens.push_str(&format!("exec {fd}<\"${}\"; ", i + 1));
    }
    wrapped
        .arg("-c")
        .arg(format!("{opens}shift {}; exec \"$@\"", fds.len()))
        .arg("sh")
        .args(fds.iter().map(|(_, path)| path.as_os_str()))
        .arg(cmd.get_program())
        .args(cmd.get_args());
    wrapped
}

/// A process that sits in the test's outer namespace (a `cat` reading a
/// pipe that stays open) until dropped: a host pid whose namespace is the
/// one sluice runs in, for a workload to name.
pub struct OuterProcess {
    child: Child,
}

impl OuterProcess {
    /// Started, and (bounded) in the outer namespace once this returns.
    pub fn start(w: &World) -> OuterProcess {
        use std::os::unix::fs::MetadataExt;
        let child = w
            .outer
            .command("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn cat in the outer namespace");
        let held = OuterProcess { child };
        let want = std::fs::metadata(w.outer.path()).unwrap().ino();
        let pid = held.pid();
        assert!(
            eventually(Duration::from_secs(20), || {
                std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| m.ino() == want)
            }),
            "process {pid} never entered the outer namespace"
        );
        held
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for OuterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sandbox namespace inode sluice logged (`netns_inode=N`).
pub fn logged_netns_inode(stderr: &str) -> Option<u64> {
    stderr
        .split("netns_inode=")
        .nth(1)?
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Every pid whose network namespace has this inode.
pub fn processes_in_netns(inode: u64) -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(meta) = std::fs::metadata(format!("/proc/{pid}/ns/net")) {
            use std::os::unix::fs::MetadataExt;
            if meta.ino() == inode {
                pids.push(pid);
            }
        }
    }
    pids
}

impl World {
    /// GET `path` from `addr` in the outer namespace (where sluice runs).
    pub fn http_get_outer(&self, addr: &str, path: &str) -> Option<String> {
        let addr: SocketAddr = addr.parse().unwrap();
        let path = path.to_string();
        self.outer
            .run_in(move || {
                let mut s =
                    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
                write!(
                    s,
                    "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )
                .ok()?;
                let mut out = String::new();
                s.read_to_string(&mut out).ok()?;
                Some(out)
            })
            .ok()
            .flatten()
    }

    /// A positive canary for "nothing arrived": one datagram to `addr`
    /// from the outer namespace, where it does arrive. Once the sink has
    /// counted it, anything the sandbox sent before it would have been
    /// counted too.
    pub fn udp_canary(&self, addr: &str) {
        let addr: SocketAddr = addr.parse().unwrap();
        self.outer
            .run_in(move || {
                let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
                socket.send_to(b"canary", addr).map(drop)
            })
            .unwrap()
            .expect("send the canary datagram");
    }

    /// A marker file the workload waits for (see `wait_for_go`).
    pub fn go_path(&self) -> PathBuf {
        self.dir.path().join("go")
    }

    /// A shell fragment that waits (bounded, 20 s) for the test's go-ahead.
    pub fn wait_for_go(&self) -> String {
        format!(
            "i=0; while [ ! -e {} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done",
            self.go_path().display()
        )
    }
}

/// The value of one sample line `name{labels} value` in a Prometheus text
/// exposition, matching all of `labels` (each `key="value"`).
pub fn metric_value(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' '))
        })
        .find(|l| labels.iter().all(|kv| l.contains(kv)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The complete decision records in `path` (signed checkpoints left out).
/// The writer may be mid-line when this reads, so only newline-terminated
/// lines count, as `audit tail` does.
pub fn audit_records(path: &Path) -> Vec<serde_json::Value> {
    audit_lines(path)
        .into_iter()
        .filter(|l| l["kind"] != "checkpoint")
        .collect()
}

/// The complete signed checkpoint lines in `path`.
pub fn audit_checkpoints(path: &Path) -> Vec<serde_json::Value> {
    audit_lines(path)
        .into_iter()
        .filter(|l| l["kind"] == "checkpoint")
        .collect()
}

/// Every complete line in `path`, records and checkpoints.
pub fn audit_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
        .collect()
}

/// Run `cmd` as a shell runs a foreground job: a session leader whose
/// controlling terminal is a fresh pty (on its stdin, stdout and stderr),
/// its group the terminal's foreground group. Returns the pty's master,
/// where the test types (b"\x03" is Ctrl-C) and reads. Drop `cmd` after
/// spawning it, or the terminal never ends.
pub fn in_terminal(cmd: &mut Command) -> std::fs::File {
    use std::os::unix::process::CommandExt;
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let (master, slave) = (
        std::fs::File::from(pty.master),
        std::fs::File::from(pty.slave),
    );
    cmd.stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave);
    // SAFETY: setsid and ioctl are async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    master
}

/// A fresh test CA (its PEM) and a server certificate it signed for `names`
/// (DNS names or IP addresses), with the certificate's key.
pub struct TestPki {
    pub ca_pem: String,
    pub cert: rustls::pki_types::CertificateDer<'static>,
    pub key: rustls::pki_types::PrivateKeyDer<'static>,
    /// The leaf and its key as PEM, for servers that read files (nginx).
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn test_pki(names: &[&str]) -> TestPki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sluice test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf_params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    TestPki {
        ca_pem: ca_cert.pem(),
        cert_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
        cert: leaf.der().clone(),
        key: rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    }
}

/// Build a local busybox image holding this build of sluice (and the
/// libraries it links against) plus `extra` host programs, tagged `tag`,
/// with containers/build-image.sh; `conf` is the CONTAINERS_CONF to use.
/// The caller removes it (`podman rmi -f TAG`).
pub fn build_test_image(tag: &str, extra: &[&str], conf: Option<&Path>) -> Result<(), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("containers/build-image.sh");
    let mut cmd = Command::new(&script);
    cmd.args(["--sluice", sluice_bin(), "--tag", tag]);
    for program in extra {
        cmd.args(["--add", program]);
    }
    if let Some(conf) = conf {
        cmd.env("CONTAINERS_CONF", conf);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "building the test image failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// A fresh signing key and its trust file in `dir`, and `policy` signed
/// with it as `revision` (valid for a day): (bundle, trust file).
pub fn signed_bundle(dir: &Path, policy: &str, revision: u64) -> (PathBuf, PathBuf) {
    let key = dir.join("bundle-key");
    let trust = dir.join("bundle-trust.yaml");
    sluice::bundle::keygen(&key, &trust, "test").expect("keygen");
    let src = dir.join(format!("bundle-policy-{revision}.yaml"));
    std::fs::write(&src, policy).unwrap();
    let bundle = dir.join(format!("bundle-{revision}.tar.gz"));
    let expires = time::OffsetDateTime::now_utc() + time::Duration::days(1);
    sluice::bundle::sign(&key, &src, revision, expires, &bundle).expect("sign the bundle");
    (bundle, trust)
}

/// The nice value in a /proc/.../stat line (its 19th field; the name in
/// parentheses may hold spaces, so fields are counted after it).
pub fn nice_in_stat(stat: &str) -> i32 {
    let after_name = &stat[stat.rfind(')').expect("a stat line") + 1..];
    after_name
        .split_whitespace()
        .nth(16)
        .expect("19 fields")
        .parse()
        .expect("a number")
}

/// This thread's nice value (what a process it starts inherits).
pub fn own_nice() -> i32 {
    nice_in_stat(&std::fs::read_to_string("/proc/thread-self/stat").expect("own stat"))
}

/// What a [`World::recording_origin`] saw.
#[derive(Default)]
pub struct Recording {
    pub accepted: std::sync::atomic::AtomicUsize,
    pub bytes: std::sync::Mutex<Vec<u8>>,
}

impl Recording {
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn received(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }
}

/// Sandbox ids that break the one rule (`sluice::sandbox_id`): each entry
/// point must refuse every one with [`bad_sandbox_id_message`]. Ones a URL
/// path can carry as they are.
pub fn bad_sandbox_ids() -> Vec<String> {
    vec![
        "../x".to_string(),
        "a:b".to_string(),
        "a".repeat(sluice::sandbox_id::MAX_LEN + 1),
    ]
}

/// What every entry point says of a bad sandbox id.
pub fn bad_sandbox_id_message(id: &str) -> String {
    format!(
        "{id:?} is not a sandbox id: {}",
        sluice::sandbox_id::SandboxId::RULE
    )
}
