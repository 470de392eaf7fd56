//! OCI containers end to end: real podman with runc, as root. Every behaviour
//! is checked from inside a container, once through the wrapper
//! (`sluice oci -- podman run ...`) and once through the daemon and its OCI
//! hook (`podman run --annotation io.sluice.policy=...`).
//!
//! Topology: each test's outer namespace (tests/common) holds the origins,
//! sluice (started there with `nsenter --net`, so it shares the test's mount
//! namespace and podman's storage) and, for the hook, the daemon. Containers
//! get `--network none` or sluice's namespace, never podman's bridge, so the
//! root namespace's links and rules are never touched (the test
//! containers.conf also makes `none` podman's default).
//!
//! The image (busybox, sluice, nft) is built once per test binary with
//! containers/build-image.sh and removed when the binary exits.
//!
//! Start-time numbers (reported, not asserted; 20 starts on demand):
//!   SLUICE_START_RUNS=20 cargo test --release --test oci -- --nocapture start_time

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;

const POLICY: &str = r#"
version: 1
name: oci-e2e
rules:
  - name: origin
    action: allow
    cidrs: ["198.18.0.1/32", "2001:db8::1/128"]
    ports: [8080, 7000]
  - name: names
    action: allow
    hosts: ["origin.test"]
    ports: [8081]
dns:
  upstream: []
  hosts:
    origin.test: ["198.18.0.1"]
"#;

// ---------------------------------------------------------------------------
// The per-binary podman environment: image, containers.conf, hooks dir.

struct OciEnv {
    image: String,
    dir: PathBuf,
    conf: PathBuf,
}

static ENV: OnceLock<Result<OciEnv, String>> = OnceLock::new();

/// The world and the podman environment; None when the test must skip.
fn setup() -> Option<(World, &'static OciEnv)> {
    let w = World::new()?;
    let env = ENV.get_or_init(build_env);
    match env {
        Ok(env) => Some((w, env)),
        Err(why) if std::env::var("SLUICE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") => {
            panic!("OCI test cannot run: {why} (SLUICE_REQUIRE_PRIVILEGED=1)")
        }
        Err(why) => {
            eprintln!("SKIPPED: OCI test: {why}");
            None
        }
    }
}

fn build_env() -> Result<OciEnv, String> {
    for tool in ["podman", "runc", "nsenter"] {
        if !Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return Err(format!(
                "{tool} not installed (apt-get install --no-install-recommends podman runc busybox-static)"
            ));
        }
    }
    sweep_stale();
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("sluice-oci-test.{pid}"));
    std::fs::create_dir_all(dir.join("hooks")).map_err(|e| e.to_string())?;

    // The shipped hook file, pointed at this build of sluice.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("containers/hooks.d/sluice.json");
    let mut hook: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&shipped).map_err(|e| e.to_string())?)
            .map_err(|e| format!("{}: {e}", shipped.display()))?;
    hook["hook"]["path"] = sluice_bin().into();
    std::fs::write(dir.join("hooks/sluice.json"), hook.to_string()).map_err(|e| e.to_string())?;

    let conf = dir.join("containers.conf");
    std::fs::write(
        &conf,
        format!(
            "[containers]\n\
             default_ulimits = [\"nofile=20000:20000\", \"nproc=4096:4096\"]\n\
             netns = \"none\"\n\
             [engine]\n\
             runtime = \"runc\"\n\
             cgroup_manager = \"cgroupfs\"\n\
             hooks_dir = [\"{}\"]\n",
            dir.join("hooks").display()
        ),
    )
    .map_err(|e| e.to_string())?;

    let image = format!("localhost/sluice-test:{pid}");
    build_test_image(&image, &["nft"], Some(&conf))?;
    // SAFETY: registers a plain extern "C" function with no arguments.
    unsafe { libc::atexit(remove_env) };
    Ok(OciEnv { image, dir, conf })
}

/// At exit: the image and the temp dir go.
extern "C" fn remove_env() {
    if let Some(Ok(env)) = ENV.get() {
        let _ = Command::new("podman")
            .args(["rmi", "-f", &env.image])
            .env("CONTAINERS_CONF", &env.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&env.dir);
        // The wrappers' runtime directory, if the tests created it (only
        // removed when empty: a daemon's socket there is not ours).
        let _ = std::fs::remove_dir("/run/sluice");
    }
}

/// Images and dirs of test binaries that were killed before they cleaned up.
fn sweep_stale() {
    let alive = |pid: &str| Path::new("/proc").join(pid).exists();
    if let Ok(out) = Command::new("podman")
        .args([
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            "--filter",
            "reference=localhost/sluice-test",
        ])
        .output()
    {
        for tag in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(pid) = tag.strip_prefix("localhost/sluice-test:") {
                if !alive(pid) {
                    let _ = Command::new("podman").args(["rmi", "-f", tag]).output();
                }
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("sluice-oci-test.") {
                if !alive(pid) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
    }
}

fn podman(env: &OciEnv) -> Command {
    let mut cmd = Command::new("podman");
    cmd.env("CONTAINERS_CONF", &env.conf);
    cmd
}

/// `program` in the test's outer namespace, in the test's mount namespace.
fn in_outer(w: &World, env: &OciEnv, program: &str) -> Command {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net={}", w.outer.path().display()))
        .arg(program)
        .env("CONTAINERS_CONF", &env.conf);
    cmd
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn unique(w: &World, what: &str) -> PathBuf {
    w.dir
        .path()
        .join(format!("{what}.{}", NEXT.fetch_add(1, Ordering::Relaxed)))
}

// ---------------------------------------------------------------------------
// The daemon, for the hook.

struct Daemon {
    child: Child,
    socket: PathBuf,
    audit: PathBuf,
    log: PathBuf,
    config: PathBuf,
    /// Its state dir, audit checkpoint key included: apart from the temp
    /// dir, which containers bind.
    state: PathBuf,
}

impl Daemon {
    /// A daemon with its own socket, audit log and state dir (bundle
    /// revisions and restart records stay in the test's temp dir).
    fn start(w: &World, env: &OciEnv) -> Daemon {
        Daemon::start_with(w, env, "")
    }

    /// [`start`](Self::start) with more lines of config.
    fn start_with(w: &World, env: &OciEnv, more: &str) -> Daemon {
        let socket = unique(w, "daemon.sock");
        let audit = unique(w, "daemon-audit.jsonl");
        let log = unique(w, "daemon.log");
        let config = unique(w, "daemon.yaml");
        let state = w.state.path().join(format!(
            "daemon-state.{}",
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(
            &config,
            format!(
                "socket: {}\naudit: {}\n{more}defaults:\n  state_dir: {}\n",
                socket.display(),
                audit.display(),
                state.display()
            ),
        )
        .unwrap();
        let daemon = Daemon {
            child: Daemon::spawn(w, env, &config, &log),
            socket,
            audit,
            log,
            config,
            state,
        };
        daemon.wait_for_socket();
        daemon
    }

    fn spawn(w: &World, env: &OciEnv, config: &Path, log: &Path) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        in_outer(w, env, sluice_bin())
            .args(["-v", "daemon", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the daemon")
    }

    fn wait_for_socket(&self) {
        assert!(
            eventually(Duration::from_secs(10), || {
                std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
            }),
            "the daemon did not open its socket:\n{}",
            self.log()
        );
    }

    /// SIGKILL the daemon, as a crash would.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Start a new daemon on the same config (socket, audit, state).
    fn restart(&mut self, w: &World, env: &OciEnv) {
        self.child = Daemon::spawn(w, env, &self.config, &self.log);
        self.wait_for_socket();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn status(&self) -> Vec<serde_json::Value> {
        let out = Command::new(sluice_bin())
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Descriptors held at rest: the fewest seen over 200 ms (a control
    /// connection that is just closing is not held).
    fn settled_fds(&self) -> usize {
        (0..10)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(20));
                self.open_fds()
            })
            .min()
            .unwrap_or(0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// Running a container one way or the other.

#[derive(Clone, Copy)]
enum Via<'d> {
    Wrapper,
    Hook(&'d Daemon),
}

/// What a container run left: its output, its id, and the pid of the
/// process started (sluice for the wrapper, podman for the hook).
struct Ran {
    out: Output,
    id: String,
    pid: u32,
}

impl Ran {
    fn stdout(&self) -> String {
        stdout(&self.out)
    }
    fn stderr(&self) -> String {
        stderr(&self.out)
    }
}

/// `podman run --rm [extra] IMAGE sh -c script` through `via`, bounded.
fn run_container(
    w: &World,
    env: &OciEnv,
    via: Via,
    policy: &Path,
    extra: &[&str],
    script: &str,
) -> Ran {
    run_container_trusting(w, env, via, policy, None, extra, script)
}

/// [`run_container`], the wrapper trusting `upstream_ca` for origins.
fn run_container_trusting(
    w: &World,
    env: &OciEnv,
    via: Via,
    policy: &Path,
    upstream_ca: Option<&Path>,
    extra: &[&str],
    script: &str,
) -> Ran {
    let cidfile = unique(w, "cid");
    let mut cmd =
        container_command_trusting(w, env, via, policy, upstream_ca, &cidfile, extra, script);
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let out = wait_bounded(child, Duration::from_secs(90));
    let id = std::fs::read_to_string(&cidfile).unwrap_or_default();
    Ran {
        out,
        id: id.trim().to_string(),
        pid,
    }
}

fn container_command(
    w: &World,
    env: &OciEnv,
    via: Via,
    policy: &Path,
    cidfile: &Path,
    extra: &[&str],
    script: &str,
) -> Command {
    container_command_trusting(w, env, via, policy, None, cidfile, extra, script)
}

/// [`container_command`], the wrapper trusting `upstream_ca` for origins
/// (the daemon's is its config's `upstream_ca`).
#[allow(clippy::too_many_arguments)]
fn container_command_trusting(
    w: &World,
    env: &OciEnv,
    via: Via,
    policy: &Path,
    upstream_ca: Option<&Path>,
    cidfile: &Path,
    extra: &[&str],
    script: &str,
) -> Command {
    let mut cmd = match via {
        Via::Wrapper => {
            let mut cmd = in_outer(w, env, sluice_bin());
            cmd.args(["-v", "oci", "--policy"])
                .arg(policy)
                .arg("--audit")
                .arg(w.audit_path())
                .arg("--state-dir")
                .arg(w.state_dir());
            if let Some(ca) = upstream_ca {
                cmd.arg("--upstream-ca").arg(ca);
            }
            cmd.args(["--", "podman", "run"]);
            cmd
        }
        Via::Hook(daemon) => {
            let mut cmd = podman(env);
            cmd.args(["run", "--network", "none", "--annotation"])
                .arg(format!("io.sluice.policy={}", policy.display()))
                .arg("--annotation")
                .arg(format!("io.sluice.socket={}", daemon.socket.display()));
            cmd
        }
    };
    cmd.args(["--rm", "--cidfile"])
        .arg(cidfile)
        .args(extra)
        .arg(&env.image)
        .args(["sh", "-c", script]);
    cmd
}

/// A container running `script` through `via`, with the test's temp dir at
/// /shared, returned once the script has touched /shared/ready.
struct Started {
    child: Child,
    id: String,
}

fn start_until_ready(w: &World, env: &OciEnv, via: Via, script: &str) -> Started {
    let cidfile = unique(w, "cid");
    let volume = format!("{}:/shared", w.dir.path().display());
    let child = container_command(
        w,
        env,
        via,
        &w.policy(POLICY),
        &cidfile,
        &["-v", &volume],
        script,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    assert!(
        eventually(Duration::from_secs(30), || w
            .dir
            .path()
            .join("ready")
            .exists()),
        "{}: the container never got ready{}",
        which(via),
        match via {
            Via::Hook(d) => format!("; the daemon said:\n{}", d.log()),
            Via::Wrapper => String::new(),
        }
    );
    let id = container_id(&cidfile);
    Started { child, id }
}

/// The container id podman writes to `cidfile`, once it is there: podman
/// creates the file before it writes the id.
fn container_id(cidfile: &Path) -> String {
    let read = || {
        std::fs::read_to_string(cidfile)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert!(
        eventually(Duration::from_secs(30), || !read().is_empty()),
        "no container id in {}",
        cidfile.display()
    );
    read()
}

fn audit_of(w: &World, via: Via) -> Vec<serde_json::Value> {
    let path = match via {
        Via::Wrapper => w.audit_path(),
        Via::Hook(d) => d.audit.clone(),
    };
    audit_records(&path)
}

/// Run `f` once through the wrapper and once through a fresh daemon + hook.
fn both_ways(f: impl Fn(&World, &OciEnv, Via)) {
    {
        let Some((w, env)) = setup() else { return };
        f(&w, env, Via::Wrapper);
    }
    let Some((w, env)) = setup() else { return };
    let daemon = Daemon::start(&w, env);
    f(&w, env, Via::Hook(&daemon));
}

fn which(via: Via) -> &'static str {
    match via {
        Via::Wrapper => "wrapper",
        Via::Hook(_) => "hook",
    }
}

/// Nothing refers to the namespace any more (no process, no descriptor, no
/// bind mount), so the kernel has freed it with its table and listeners.
fn netns_unreferenced(inode: u64) -> bool {
    let needle = format!("net:[{inode}]");
    if !processes_in_netns(inode).is_empty() {
        return false;
    }
    if std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| m.contains(&needle)) {
        return false;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    for p in procs.flatten() {
        if !p
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == needle.as_str()) {
                return false;
            }
        }
    }
    true
}

fn container_gone(env: &OciEnv, id: &str) -> bool {
    let out = podman(env)
        .args(["ps", "-a", "-q", "--no-trunc", "--filter"])
        .arg(format!("id={id}"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().is_empty()
}

/// Removes a container however the test ends.
struct RemoveOnDrop<'e>(&'e OciEnv, String);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        if !self.1.is_empty() {
            let _ = podman(self.0)
                .args(["rm", "-f", "-t", "0", &self.1])
                .output();
        }
    }
}

// ---------------------------------------------------------------------------
// Behaviour, both ways.

fn allowed_fetch_returns_the_body_intact(w: &World, env: &OciEnv, via: Via) {
    w.http_origin("198.18.0.1:8080");
    let ran = run_container(
        w,
        env,
        via,
        &w.policy(POLICY),
        &[],
        "sluice probe http http://198.18.0.1:8080/bytes/1048576",
    );
    let expected = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(pattern(1 << 20)))
    };
    let text = ran.stdout();
    assert!(
        ran.out.status.success(),
        "{}: {text}\n{}",
        which(via),
        ran.stderr()
    );
    assert!(text.contains("HTTP 200 1048576 bytes"), "{text}");
    assert!(text.contains(&format!("sha256={expected}")), "{text}");
}

#[test]
fn wrapper_container_keeps_the_callers_priority_while_sluice_serves_ahead() {
    let Some((w, env)) = setup() else { return };
    let caller = own_nice();
    let ran = run_container(
        &w,
        env,
        Via::Wrapper,
        &w.policy(POLICY),
        &[],
        "cat /proc/self/stat",
    );
    assert!(ran.out.status.success(), "{}", ran.stderr());
    assert_eq!(
        nice_in_stat(&ran.stdout()),
        caller,
        "podman starts before sluice takes its lead"
    );
}

#[test]
fn wrapper_allowed_http_fetch_returns_the_body_intact() {
    let Some((w, env)) = setup() else { return };
    allowed_fetch_returns_the_body_intact(&w, env, Via::Wrapper);
}

#[test]
fn hook_allowed_http_fetch_returns_the_body_intact() {
    let Some((w, env)) = setup() else { return };
    let daemon = Daemon::start(&w, env);
    allowed_fetch_returns_the_body_intact(&w, env, Via::Hook(&daemon));
}

fn denied_port_and_address_fail_and_are_audited_with_the_container_id(
    w: &World,
    env: &OciEnv,
    via: Via,
) {
    let port_hits = w.http_origin("198.18.0.1:8082");
    w.echo_origin("198.18.0.2:7000");
    let ran = run_container(
        w,
        env,
        via,
        &w.policy(POLICY),
        &[],
        "sluice probe http --body http://198.18.0.1:8082/; echo port=$?; \
         sluice probe tcp 198.18.0.2:7000 --send hi; echo addr=$?",
    );
    let text = ran.stdout();
    assert!(
        text.contains("HTTP 403") && text.contains("port=1"),
        "{}: {text}",
        which(via)
    );
    assert!(text.contains("addr=1") && !text.contains("echo:"), "{text}");
    assert_eq!(port_hits.load(Ordering::Relaxed), 0);
    assert_eq!(ran.id.len(), 64, "container id: {:?}", ran.id);
    let audit = audit_of(w, via);
    let denies: Vec<_> = audit.iter().filter(|r| r["verdict"] == "deny").collect();
    assert_eq!(denies.len(), 2, "{audit:?}");
    for record in &denies {
        assert_eq!(record["sandbox"], ran.id.as_str(), "{record}");
        assert_eq!(record["path"], "oci", "{record}");
        assert_eq!(record["reason"], "no-rule", "{record}");
    }
    assert_eq!(denies[0]["dst"], "198.18.0.1:8082");
    assert_eq!(denies[1]["dst"], "198.18.0.2:7000");
}

#[test]
fn wrapper_denied_port_and_address_fail_and_are_audited_with_the_container_id() {
    let Some((w, env)) = setup() else { return };
    denied_port_and_address_fail_and_are_audited_with_the_container_id(&w, env, Via::Wrapper);
}

#[test]
fn hook_denied_port_and_address_fail_and_are_audited_with_the_container_id() {
    let Some((w, env)) = setup() else { return };
    let daemon = Daemon::start(&w, env);
    denied_port_and_address_fail_and_are_audited_with_the_container_id(&w, env, Via::Hook(&daemon));
}

#[test]
fn dns_answers_an_allowed_name_and_refuses_a_denied_one() {
    both_ways(|w, env, via| {
        let ran = run_container(
            w,
            env,
            via,
            &w.policy(POLICY),
            &[],
            "sluice probe dns origin.test; echo allowed=$?; sluice probe dns example.com; echo denied=$?",
        );
        let text = ran.stdout();
        assert!(
            text.contains("198.18.0.1") && text.contains("allowed=0"),
            "{}: {text}\n{}",
            which(via),
            ran.stderr()
        );
        assert!(
            text.contains("Refused") && text.contains("denied=1"),
            "{text}"
        );
        let audit = audit_of(w, via);
        assert!(
            audit.iter().any(|r| r["proto"] == "dns"
                && r["host"] == "example.com"
                && r["sandbox"] == ran.id.as_str()),
            "{audit:?}"
        );
    });
}

#[test]
fn udp_and_icmp_never_reach_the_origin() {
    both_ways(|w, env, via| {
        let hits = w.udp_sink("198.18.0.1:5353");
        // NET_RAW so that the raw socket opens and the send is what fails.
        let ran = run_container(
            w,
            env,
            via,
            &w.policy(POLICY),
            &["--cap-add", "NET_RAW"],
            "sluice probe udp 198.18.0.1:5353; sluice probe icmp 198.18.0.1; sluice probe icmp 2001:db8::1",
        );
        let text = ran.stdout();
        assert!(
            text.contains("FAIL UDP send to 198.18.0.1:5353: EPERM")
                || text.contains("FAIL UDP send to 198.18.0.1:5353: Operation not permitted"),
            "{}: {text}\n{}",
            which(via),
            ran.stderr()
        );
        assert_eq!(text.matches("FAIL ICMP send to").count(), 2, "{text}");
        // Only the canary sent from outside after the container arrives.
        w.udp_canary("198.18.0.1:5353");
        assert_eq!(wait_for_count(&hits, 1), 1);
    });
}

#[test]
fn a_root_container_with_net_admin_that_flushes_the_ruleset_still_reaches_nothing() {
    both_ways(|w, env, via| {
        let http_hits = w.http_origin("198.18.0.1:8080");
        let udp_hits = w.udp_sink("198.18.0.1:5353");
        // Host pids to name: this test's (the host's namespace) and one in
        // the outer namespace sluice runs in; 1 is the container's own.
        let outer = OuterProcess::start(w);
        let targets = [1, std::process::id(), outer.pid()];
        // After the flush nothing redirects to sluice any more, the
        // namespace has no link that leads anywhere, and the link cannot
        // be moved: a host pid is not one the container can name.
        let script = format!(
            "sluice probe http http://198.18.0.1:8080/; echo before=$?; \
             nft flush ruleset && echo flushed; \
             echo own $(readlink /proc/self/ns/net); \
             for pid in {}; do \
               ip link set sbx0 netns $pid 2>&1; echo moved-to-$pid=$?; \
               [ -e /proc/$pid/ns/net ] && echo sees-$pid $(readlink /proc/$pid/ns/net); \
               ip link show sbx0 >/dev/null 2>&1 && echo still-$pid; \
             done; \
             sluice probe http http://198.18.0.1:8080/; echo after=$?; \
             sluice probe udp 198.18.0.1:5353",
            targets.map(|p| p.to_string()).join(" ")
        );
        let ran = run_container(
            w,
            env,
            via,
            &w.policy(POLICY),
            &[
                "--user",
                "0",
                "--cap-add",
                "NET_ADMIN",
                "--annotation",
                "io.sluice.allow-net-admin=true",
            ],
            &script,
        );
        let text = ran.stdout();
        assert!(
            text.contains("before=0"),
            "{}: {text}\n{}",
            which(via),
            ran.stderr()
        );
        assert!(text.contains("flushed"), "{text}\n{}", ran.stderr());
        let own = text
            .lines()
            .find_map(|l| l.strip_prefix("own "))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(own.starts_with("net:["), "{text}");
        // Its own PID 1 is in its own namespace: that move changes nothing.
        assert!(text.contains(&format!("sees-1 {own}")), "{text}");
        for pid in targets {
            assert!(text.contains(&format!("still-{pid}\n")), "{pid}: {text}");
        }
        assert_eq!(text.matches("No such process").count(), 2, "{text}");
        for pid in &targets[1..] {
            assert!(!text.contains(&format!("sees-{pid} ")), "{pid}: {text}");
            assert!(
                !text.contains(&format!("moved-to-{pid}=0")),
                "{pid}: {text}"
            );
        }
        assert!(text.contains("after=1"), "{text}");
        // Only the one request made while sluice was in the path arrived,
        // and the canaries sent from outside after the container.
        w.udp_canary("198.18.0.1:5353");
        assert_eq!(wait_for_count(&udp_hits, 1), 1);
        assert!(w.http_get_outer("198.18.0.1:8080", "/").is_some());
        assert_eq!(wait_for_count(&http_hits, 2), 2);
    });
}

#[test]
fn nothing_is_left_after_the_container_stops() {
    both_ways(|w, env, via| {
        let fds_before = match via {
            Via::Hook(d) => d.settled_fds(),
            Via::Wrapper => 0,
        };
        let ran = run_container(
            w,
            env,
            via,
            &w.policy(POLICY),
            &[],
            "readlink /proc/self/ns/net",
        );
        assert!(ran.out.status.success(), "{}: {}", which(via), ran.stderr());
        let inode: u64 = ran
            .stdout()
            .trim()
            .trim_start_matches("net:[")
            .trim_end_matches(']')
            .parse()
            .unwrap_or_else(|_| panic!("no inode in {:?}", ran.stdout()));
        assert!(
            eventually(Duration::from_secs(10), || netns_unreferenced(inode)),
            "{}: namespace net:[{inode}] is still referenced",
            which(via)
        );
        assert!(container_gone(env, &ran.id));
        match via {
            Via::Wrapper => {
                // The wrapper's private directory (for podman's cidfile).
                let prefix = format!("oci-{}.", ran.pid);
                let leftovers: Vec<_> = std::fs::read_dir("/run/sluice")
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .collect();
                assert!(leftovers.is_empty(), "{leftovers:?}");
            }
            Via::Hook(d) => {
                assert!(
                    eventually(Duration::from_secs(10), || d.status().is_empty()),
                    "{:?}",
                    d.status()
                );
                assert!(
                    eventually(Duration::from_secs(10), || d.settled_fds() == fds_before),
                    "the daemon holds {} descriptors, {fds_before} before the container",
                    d.open_fds()
                );
                assert!(d.log().contains("sandbox released"), "{}", d.log());
            }
        }
    });
}

#[test]
fn once_sluice_is_killed_the_container_reaches_nothing() {
    both_ways(|w, env, via| {
        let hits = w.http_origin("198.18.0.1:8080");
        let script = "sluice probe http http://198.18.0.1:8080/ && touch /shared/ready; \
             i=0; while [ ! -e /shared/go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; \
             sluice probe http http://198.18.0.1:8080/ > /shared/result.tmp 2>&1; mv /shared/result.tmp /shared/result";
        let Started { child, id } = start_until_ready(w, env, via, script);
        let _guard = RemoveOnDrop(env, id);
        // SIGKILL the sluice serving the container: the wrapper itself, or the daemon.
        let sluice = match via {
            Via::Wrapper => child.id(),
            Via::Hook(d) => d.child.id(),
        };
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(sluice as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        wait_until_exited(sluice);
        std::fs::write(w.go_path(), b"").unwrap();
        let result = w.dir.path().join("result");
        assert!(eventually(Duration::from_secs(30), || result.exists()));
        let text = std::fs::read_to_string(&result).unwrap();
        assert!(
            text.starts_with("FAIL"),
            "{}: reached the origin after sluice died: {text}",
            which(via)
        );
        assert_eq!(hits.load(Ordering::Relaxed), 1);
        let _ = wait_bounded(child, Duration::from_secs(30));
    });
}

#[test]
fn the_container_exit_status_is_relayed() {
    both_ways(|w, env, via| {
        let ran = run_container(w, env, via, &w.policy(POLICY), &[], "exit 7");
        assert_eq!(
            ran.out.status.code(),
            Some(7),
            "{}: {}",
            which(via),
            ran.stderr()
        );
    });
}

// ---------------------------------------------------------------------------
// The wrapper.

/// `sluice oci -- podman run --rm OPTIONS IMAGE true`, which must be
/// refused (exit 2) before any container is created; returns what it said.
fn wrapper_refusal(w: &World, env: &OciEnv, options: &[&str]) -> String {
    let cidfile = unique(w, "cid");
    let out = in_outer(w, env, sluice_bin())
        .args(["oci", "--policy"])
        .arg(w.policy(POLICY))
        .args(["--", "podman", "run", "--rm", "--cidfile"])
        .arg(&cidfile)
        .args(options)
        .args([env.image.as_str(), "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{options:?}: {}", stderr(&out));
    assert!(!cidfile.exists(), "{options:?}: a container was created");
    stderr(&out)
}

#[test]
fn the_wrapper_refuses_network_host_and_says_why() {
    let Some((w, env)) = setup() else { return };
    for network in [["--network", "host"], ["--net", "host"], ["--pod", "p1"]] {
        let err = wrapper_refusal(&w, env, &network);
        assert!(
            err.contains(&format!("`{}` would put the container in", network[0])),
            "{err}"
        );
        assert!(err.contains("leave"), "{err}");
    }
}

#[test]
fn the_wrapper_stays_for_a_detached_container_until_podman_stop() {
    let Some((w, env)) = setup() else { return };
    w.http_origin("198.18.0.1:8080");
    let cidfile = unique(&w, "cid");
    let mut sluice = container_command(
        &w,
        env,
        Via::Wrapper,
        &w.policy(POLICY),
        &cidfile,
        &["-d"],
        "trap 'exit 0' TERM; sleep 60 & wait",
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let id = container_id(&cidfile);
    let _guard = RemoveOnDrop(env, id.clone());
    // The container runs detached; sluice stays to serve it.
    let exec = |url: &str| {
        podman(env)
            .args(["exec", &id, "sluice", "probe", "http", url])
            .output()
            .unwrap()
    };
    // The container may still be starting when its id is known.
    let mut allowed = exec("http://198.18.0.1:8080/");
    for _ in 0..40 {
        if allowed.status.success() {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
        allowed = exec("http://198.18.0.1:8080/");
    }
    assert!(
        allowed.status.success(),
        "{}{}",
        stdout(&allowed),
        stderr(&allowed)
    );
    assert!(stdout(&exec("http://198.18.0.1:8082/")).contains("HTTP 403"));
    assert!(sluice.try_wait().unwrap().is_none(), "sluice left early");
    let inode = std::fs::read_link(format!(
        "/proc/{}/ns/net",
        stdout(
            &podman(env)
                .args(["inspect", "--format", "{{.State.Pid}}", &id])
                .output()
                .unwrap()
        )
        .trim()
    ))
    .unwrap();

    let stop = podman(env).args(["stop", "-t", "5", &id]).output().unwrap();
    assert!(stop.status.success(), "{}", stderr(&stop));
    let out = wait_bounded(sluice, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains(&id), "podman -d prints the id");
    let inode: u64 = inode
        .to_string_lossy()
        .trim_start_matches("net:[")
        .trim_end_matches(']')
        .parse()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || netns_unreferenced(
        inode
    )));
    assert!(container_gone(env, &id));
}

#[test]
fn ctrl_c_at_a_terminal_stops_a_detached_container_and_its_wrapper() {
    use std::io::Write;
    let Some((w, env)) = setup() else { return };
    let cidfile = unique(&w, "cid");
    let mut cmd = container_command(
        &w,
        env,
        Via::Wrapper,
        &w.policy(POLICY),
        &cidfile,
        &["-d"],
        "trap 'exit 0' TERM; sleep 60 & wait",
    );
    let mut terminal = in_terminal(&mut cmd);
    let sluice = cmd.spawn().unwrap();
    drop(cmd);
    // Read what the terminal shows, so that no writer ever blocks on it.
    let mut shown = terminal.try_clone().unwrap();
    std::thread::spawn(move || std::io::copy(&mut shown, &mut std::io::sink()));
    let id = container_id(&cidfile);
    let _guard = RemoveOnDrop(env, id.clone());
    // Once sluice waits for the detached container (`podman wait ID`).
    let waiting = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|p| {
            std::fs::read(p.path().join("cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("wait\0--interval") && c.contains(&id)
            })
        })
    };
    assert!(
        eventually(Duration::from_secs(30), waiting),
        "no podman wait"
    );
    terminal.write_all(b"\x03").unwrap();
    let out = wait_bounded(sluice, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0));
    assert!(
        eventually(Duration::from_secs(10), || container_gone(env, &id)),
        "the container outlived its wrapper"
    );
}

#[test]
fn a_wrapped_container_cannot_be_started_again_once_sluice_is_gone() {
    let Some((w, env)) = setup() else { return };
    let cidfile = unique(&w, "cid");
    let out = in_outer(&w, env, sluice_bin())
        .args(["oci", "--policy"])
        .arg(w.policy(POLICY))
        .args(["--", "podman", "run", "--cidfile"])
        .arg(&cidfile)
        .args([env.image.as_str(), "echo", "first-run"])
        .output()
        .unwrap();
    let id = container_id(&cidfile);
    let _guard = RemoveOnDrop(env, id.clone());
    assert!(stdout(&out).contains("first-run"), "{}", stderr(&out));
    let again = podman(env).args(["start", "-a", &id]).output().unwrap();
    assert!(!again.status.success(), "{}", stdout(&again));
    assert!(!stdout(&again).contains("first-run"));
}

// ---------------------------------------------------------------------------
// The daemon and its hook.

#[test]
fn a_restarted_daemon_adopts_its_running_containers_again() {
    let Some((w, env)) = setup() else { return };
    let mut daemon = Daemon::start(&w, env);
    let hits = w.http_origin("198.18.0.1:8080");
    let shared = w.dir.path();
    // Fetch, then on each go-ahead fetch again and report.
    let script = "sluice probe http http://198.18.0.1:8080/ && touch /shared/ready; \
         for step in down up; do \
           i=0; while [ ! -e /shared/go-$step ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; \
           sluice probe http http://198.18.0.1:8080/ > /shared/$step.tmp 2>&1; mv /shared/$step.tmp /shared/$step; \
         done";
    let Started { child, id } = start_until_ready(&w, env, Via::Hook(&daemon), script);
    let _guard = RemoveOnDrop(env, id.clone());
    let report = |step: &str| {
        let path = shared.join(step);
        assert!(eventually(Duration::from_secs(30), || path.exists()));
        std::fs::read_to_string(&path).unwrap()
    };

    // While no daemon runs, the container reaches nothing.
    daemon.kill();
    std::fs::write(shared.join("go-down"), b"").unwrap();
    let down = report("down");
    assert!(
        down.starts_with("FAIL"),
        "reached the origin with no daemon: {down}"
    );
    assert_eq!(hits.load(Ordering::Relaxed), 1);

    // A new daemon adopts it again, with its policy and id.
    daemon.restart(&w, env);
    let listed = daemon.status();
    assert_eq!(listed.len(), 1, "{listed:?}\n{}", daemon.log());
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["policy"], "oci-e2e");
    std::fs::write(shared.join("go-up"), b"").unwrap();
    let up = report("up");
    assert!(up.contains("HTTP 200"), "{up}\n{}", daemon.log());
    assert_eq!(hits.load(Ordering::Relaxed), 2);

    // Once the container ends, the sandbox and its record are gone.
    let out = wait_bounded(child, Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        eventually(Duration::from_secs(10), || daemon.status().is_empty()),
        "{}",
        daemon.log()
    );
    daemon.kill();
    daemon.restart(&w, env);
    assert!(daemon.status().is_empty(), "{}", daemon.log());
}

#[test]
fn a_hook_whose_daemon_is_down_aborts_the_start() {
    let Some((w, env)) = setup() else { return };
    let cidfile = unique(&w, "cid");
    let out = podman(env)
        .args(["run", "--rm", "--network", "none", "--cidfile"])
        .arg(&cidfile)
        .arg("--annotation")
        .arg(format!("io.sluice.policy={}", w.policy(POLICY).display()))
        .arg("--annotation")
        .arg(format!(
            "io.sluice.socket={}",
            w.dir.path().join("no-daemon.sock").display()
        ))
        .args([env.image.as_str(), "echo", "container-ran"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!stdout(&out).contains("container-ran"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("cannot reach the sluice daemon"),
        "{}",
        stderr(&out)
    );
    if let Ok(id) = std::fs::read_to_string(&cidfile) {
        let _guard = RemoveOnDrop(env, id.trim().to_string());
    }
}

#[test]
fn a_hook_with_a_bad_policy_aborts_the_start() {
    let Some((w, env)) = setup() else { return };
    let daemon = Daemon::start(&w, env);
    let bad = w.dir.path().join("bad.yaml");
    std::fs::write(&bad, "version: 1\nname: bad\nrules:\n  - name: x\n    action: allow\n    cidrs: [\"300.1.1.1/8\"]\n").unwrap();
    let ran = run_container(&w, env, Via::Hook(&daemon), &bad, &[], "echo container-ran");
    assert!(!ran.out.status.success());
    assert!(!ran.stdout().contains("container-ran"));
    assert!(ran.stderr().contains("bad.yaml:6:"), "{}", ran.stderr());
    assert!(daemon.status().is_empty());
}

/// The container was refused before its process ran: by the daemon's hook,
/// or by the hook the wrapper adds (which then exits 2 itself). Its error
/// says `why`.
fn assert_refused(ran: &Ran, via: Via, form: &[&str], why: &str) {
    let text = ran.stdout();
    assert!(
        !text.contains("container-ran"),
        "{}: {form:?} ran",
        which(via)
    );
    match via {
        Via::Wrapper => assert_eq!(ran.out.status.code(), Some(2), "{form:?}: {}", ran.stderr()),
        Via::Hook(_) => assert!(!ran.out.status.success(), "{form:?}"),
    }
    assert!(
        ran.stderr().contains(why),
        "{}: {form:?}: {}",
        which(via),
        ran.stderr()
    );
}

/// A plain container (no sluice) that sleeps, to share a namespace with.
struct Plain<'e> {
    env: &'e OciEnv,
    id: String,
}

impl<'e> Plain<'e> {
    fn start(env: &'e OciEnv) -> Plain<'e> {
        let out = podman(env)
            .args(["run", "-d", "--rm", "--network", "none"])
            .arg(&env.image)
            .args(["sleep", "120"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        Plain {
            env,
            id: stdout(&out).trim().to_string(),
        }
    }
}

impl Drop for Plain<'_> {
    fn drop(&mut self) {
        let _ = podman(self.env)
            .args(["rm", "-f", "-t", "0", &self.id])
            .output();
    }
}

#[test]
fn every_way_into_another_pid_namespace_is_refused_whichever_way_in() {
    both_ways(|w, env, via| {
        let other = Plain::start(env);
        let container = format!("container:{}", other.id);
        // The host's PID namespace, named through this test's own process.
        let host = format!("ns:/proc/{}/ns/pid", std::process::id());
        let inline = format!("--pid={host}");
        for form in [
            &["--pid", "host"][..],
            &["--pid", &host],
            &[&inline],
            &["--pid", &container],
        ] {
            let ran = run_container(w, env, via, &w.policy(POLICY), form, "echo container-ran");
            assert_refused(&ran, via, form, "PID namespace");
            assert_refused(&ran, via, form, "--pid");
        }
    });
}

#[test]
fn cap_sys_admin_is_refused_whichever_way_in() {
    both_ways(|w, env, via| {
        for form in [
            &["--cap-add", "SYS_ADMIN"][..],
            &["--cap-add=all"],
            &["--privileged"],
        ] {
            let ran = run_container(w, env, via, &w.policy(POLICY), form, "echo container-ran");
            assert_refused(&ran, via, form, "CAP_SYS_ADMIN");
        }
    });
}

#[test]
fn cap_net_admin_is_refused_unless_the_annotation_allows_it() {
    both_ways(|w, env, via| {
        let form = &["--cap-add", "NET_ADMIN"];
        let ran = run_container(w, env, via, &w.policy(POLICY), form, "echo container-ran");
        assert_refused(&ran, via, form, "io.sluice.allow-net-admin=true");
    });
}

#[test]
fn cap_net_admin_with_a_handle_on_another_namespace_is_refused_even_when_allowed() {
    both_ways(|w, env, via| {
        let namespace_file = format!("/proc/{}/ns/net:/host-net", std::process::id());
        for volume in ["/run/netns:/run/netns", "/proc:/host-proc", &namespace_file] {
            let form = &[
                "--cap-add",
                "NET_ADMIN",
                "--annotation",
                "io.sluice.allow-net-admin=true",
                "-v",
                volume,
            ];
            let ran = run_container(w, env, via, &w.policy(POLICY), form, "echo container-ran");
            assert_refused(&ran, via, form, "move the sandbox's link");
        }
    });
}

/// `echo container-ran` in a container that podman puts in the named
/// namespace `ns` (`--network ns:PATH`), attached through the hook to
/// `daemon`: the hook must refuse it, saying `why`.
/// `podman run --rm --network NETWORK IMAGE echo container-ran`, annotated
/// for `daemon`'s hook.
fn run_hooked_in(w: &World, env: &OciEnv, daemon: &Daemon, network: &str) -> Output {
    podman(env)
        .args(["run", "--rm", "--network", network])
        .arg("--annotation")
        .arg(format!("io.sluice.policy={}", w.policy(POLICY).display()))
        .arg("--annotation")
        .arg(format!("io.sluice.socket={}", daemon.socket.display()))
        .args([env.image.as_str(), "echo", "container-ran"])
        .output()
        .unwrap()
}

fn assert_the_hook_refuses_namespace(
    w: &World,
    env: &OciEnv,
    daemon: &Daemon,
    ns: &OuterNetns,
    why: &str,
) {
    let out = run_hooked_in(w, env, daemon, &format!("ns:{}", ns.path().display()));
    assert!(!out.status.success());
    assert!(!stdout(&out).contains("container-ran"));
    assert!(stderr(&out).contains(why), "{}", stderr(&out));
}

#[test]
fn the_hook_refuses_a_namespace_with_a_link_out() {
    let Some((w, env)) = setup() else { return };
    let daemon = Daemon::start(&w, env);
    // A namespace with an interface besides lo, as podman's bridge network
    // would give (here both veth ends stay inside it).
    let ns = OuterNetns::create("sluice-oci-link", &[]).unwrap();
    let out = Command::new("ip")
        .args(["-n", ns.name(), "link", "add", "eth0", "type", "veth"])
        .args(["peer", "name", "eth1"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_the_hook_refuses_namespace(&w, env, &daemon, &ns, "--network none");
}

#[test]
fn the_hook_refuses_a_link_out_named_like_sluices_own() {
    let Some((w, env)) = setup() else { return };
    let daemon = Daemon::start(&w, env);
    // sbx0 is the one link, as in a namespace sluice plumbed already, but
    // it is a veth whose peer sits in another namespace: a way out.
    let ns = OuterNetns::create("sluice-oci-sbx0", &[]).unwrap();
    let elsewhere = OuterNetns::create("sluice-oci-peer", &[]).unwrap();
    let out = Command::new("ip")
        .args(["-n", ns.name(), "link", "add", "sbx0", "type", "veth"])
        .args(["peer", "name", "out0", "netns", elsewhere.name()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_the_hook_refuses_namespace(&w, env, &daemon, &ns, "link out (sbx0)");
}

#[test]
fn a_second_container_in_a_served_namespace_is_refused_whichever_way_in() {
    both_ways(|w, env, via| {
        let own;
        let daemon = match via {
            Via::Hook(daemon) => daemon,
            Via::Wrapper => {
                own = Daemon::start(w, env);
                &own
            }
        };
        let script = "touch /shared/ready; \
             i=0; while [ ! -e /shared/go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done";
        let Started { child, id } = start_until_ready(w, env, via, script);
        let _guard = RemoveOnDrop(env, id.clone());
        // A second container, with a policy of its own, in the first one's
        // namespace: two policies behind one set of redirects.
        let out = run_hooked_in(w, env, daemon, &format!("container:{id}"));
        assert!(!out.status.success(), "{}: {}", which(via), stderr(&out));
        assert!(!stdout(&out).contains("container-ran"));
        // Known to this daemon, or found listening by the kernel.
        let by_whom = match via {
            Via::Hook(_) => format!("as sandbox {id}"),
            Via::Wrapper => "by another sluice (something listens on".to_string(),
        };
        let err = stderr(&out);
        assert!(
            err.contains("already served by sluice") && err.contains(&by_whom),
            "{}: {err}",
            which(via)
        );
        std::fs::write(w.go_path(), b"").unwrap();
        let _ = wait_bounded(child, Duration::from_secs(30));
    });
}

#[test]
fn the_hook_enforces_a_signed_bundle_and_refuses_an_untrusted_one() {
    let Some((w, env)) = setup() else { return };
    let daemon = Daemon::start(&w, env);
    w.http_origin("198.18.0.1:8080");
    let dir = w.dir.path();
    let (key, trust) = (dir.join("key"), dir.join("trust.yaml"));
    sluice::bundle::keygen(&key, &trust, "test").unwrap();
    let policy = w.policy(POLICY);
    let bundle = dir.join("bundle.tar.gz");
    let expires = time::OffsetDateTime::now_utc() + time::Duration::days(1);
    sluice::bundle::sign(&key, &policy, 3, expires, &bundle).unwrap();
    // Someone else's key: its trust file does not list ours.
    let (other_key, other_trust) = (dir.join("other.key"), dir.join("other-trust.yaml"));
    sluice::bundle::keygen(&other_key, &other_trust, "test").unwrap();

    let start = |trust: &Path, script: &str| {
        podman(env)
            .args(["run", "--rm", "--network", "none", "--annotation"])
            .arg(format!("io.sluice.bundle={}", bundle.display()))
            .arg("--annotation")
            .arg(format!("io.sluice.trust={}", trust.display()))
            .arg("--annotation")
            .arg(format!("io.sluice.socket={}", daemon.socket.display()))
            .args([env.image.as_str(), "sh", "-c", script])
            .output()
            .unwrap()
    };
    let out = start(
        &trust,
        "sluice probe http http://198.18.0.1:8080/ && sluice probe http http://198.18.0.1:8082/",
    );
    let text = stdout(&out);
    assert!(
        text.contains("HTTP 200") && text.contains("HTTP 403"),
        "{text}\n{}",
        stderr(&out)
    );
    let audit = audit_of(&w, Via::Hook(&daemon));
    let deny = audit
        .iter()
        .find(|r| r["verdict"] == "deny")
        .expect("a deny");
    assert_eq!(deny["bundle"], "oci-e2e@3");

    let out = start(&other_trust, "echo container-ran");
    assert!(!out.status.success());
    assert!(!stdout(&out).contains("container-ran"));
    assert!(stderr(&out).contains("bad signature"), "{}", stderr(&out));
}

#[test]
fn status_lists_an_attached_container_with_its_policy_and_counts() {
    let Some((w, env)) = setup() else { return };
    let daemon = Daemon::start(&w, env);
    w.http_origin("198.18.0.1:8080");
    let script = "sluice probe http http://198.18.0.1:8080/; sluice probe http http://198.18.0.1:8082/; \
         touch /shared/ready; i=0; while [ ! -e /shared/go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done";
    let Started { child, id } = start_until_ready(&w, env, Via::Hook(&daemon), script);
    let out = Command::new(sluice_bin())
        .args(["status", "--socket"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    // Both views while the container still runs: once it ends, the daemon
    // releases its sandbox.
    let json = daemon.status();
    std::fs::write(w.go_path(), b"").unwrap();
    let table = stdout(&out);
    let row = table
        .lines()
        .find(|l| l.contains(&id[..12]))
        .unwrap_or_else(|| panic!("no row for {id}:\n{table}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cols[..6],
        ["oci", &id[..12], "oci-e2e", "1", "1", "0"],
        "{table}"
    );
    assert_eq!(json.len(), 1);
    assert_eq!(json[0]["id"], id.as_str());
    let out = wait_bounded(child, Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn status_shows_the_head_of_the_daemons_audit_log() {
    let Some((w, env)) = setup() else { return };
    // No checkpoint by time: the head stays where the deny left it.
    let daemon = Daemon::start_with(&w, env, "audit_checkpoint_interval: 0s\n");
    let ran = run_container(
        &w,
        env,
        Via::Hook(&daemon),
        &w.policy(POLICY),
        &[],
        "sluice probe http http://198.18.0.1:8082/; echo container-ran",
    );
    assert!(ran.stdout().contains("HTTP 403"), "{}", ran.stderr());
    let last_line = || {
        std::fs::read_to_string(&daemon.audit)
            .unwrap_or_default()
            .lines()
            .last()
            .map(str::to_string)
    };
    let head = || {
        let out = Command::new(sluice_bin())
            .args(["status", "--audit", "--json", "--socket"])
            .arg(&daemon.socket)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("head JSON")
    };
    let mut shown = serde_json::Value::Null;
    let mut line = String::new();
    let agrees = eventually(Duration::from_secs(30), || {
        let Some(last) = last_line() else {
            return false;
        };
        line = last;
        shown = head();
        shown["head"]["hash"] == sluice::audit::line_hash(&line).as_str()
    });
    assert!(agrees, "status {shown} is not the log's last line {line}");
    let record: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(shown["head"]["seq"], record["seq"]);
    assert_eq!(shown["file"], daemon.audit.to_str().unwrap());
    assert!(
        shown["key"].as_str().unwrap().starts_with("audit-"),
        "{shown}"
    );
    // The table says the same on its first line.
    let out = Command::new(sluice_bin())
        .args(["status", "--socket"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let table = stdout(&out);
    let first = table.lines().next().unwrap_or_default();
    assert!(
        first.contains(&format!(
            "head seq {} {}",
            record["seq"],
            sluice::audit::line_hash(&line)
        )),
        "{table}"
    );
}

#[test]
fn a_bind_mount_that_reaches_the_audit_checkpoint_key_is_refused_whichever_way_in() {
    both_ways(|w, env, via| {
        let state = match via {
            Via::Wrapper => w.state.path().to_path_buf(),
            Via::Hook(daemon) => daemon.state.clone(),
        };
        let volume = format!("{}:/x", state.display());
        let form = &["-v", volume.as_str()];
        let ran = run_container(w, env, via, &w.policy(POLICY), form, "echo container-ran");
        assert_refused(&ran, via, form, "audit checkpoint signing key");
    });
}

// ---------------------------------------------------------------------------
// Requests (L7): the sandbox CA and the secrets' placeholders, delivered.

/// A world with an HTTPS origin for api.github.test (198.18.0.1:443, its
/// own test CA), the secret on the host, and a policy that admits `GET /`
/// there and injects the secret; for the hook, a daemon that trusts the
/// origin's CA.
struct Injecting {
    policy: PathBuf,
    origin_ca: PathBuf,
    seen: std::sync::Arc<common::l7::Requests>,
    secret_dir: PathBuf,
}

fn injecting(w: &World) -> Injecting {
    let (origin_ca, seen) = common::l7::keepalive_origin(w, "198.18.0.1:443", &["api.github.test"]);
    let secret_dir = w.dir.path().join("secrets");
    std::fs::create_dir(&secret_dir).unwrap();
    let secret_file = secret_dir.join("gh-token");
    std::fs::write(&secret_file, format!("{}\n", common::l7::SECRET)).unwrap();
    let policy = w.policy(&common::l7::injecting_policy(&secret_file, &["/"]));
    Injecting {
        policy,
        origin_ca,
        seen,
        secret_dir,
    }
}

/// Run `f` through the wrapper and through a daemon (and hook), each
/// trusting the world's origin.
fn both_ways_injecting(f: impl Fn(&World, &OciEnv, Via, &Injecting)) {
    {
        let Some((w, env)) = setup() else { return };
        let s = injecting(&w);
        f(&w, env, Via::Wrapper, &s);
    }
    let Some((w, env)) = setup() else { return };
    let s = injecting(&w);
    let daemon = Daemon::start_with(
        &w,
        env,
        &format!("upstream_ca: [{}]\n", s.origin_ca.display()),
    );
    f(&w, env, Via::Hook(&daemon), &s);
}

const CA_VARIABLES: [&str; 5] = [
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];

#[test]
fn a_container_trusts_the_sandbox_ca_with_no_flags_and_its_request_carries_the_credential_it_never_held(
) {
    both_ways_injecting(|w, env, via, s| {
        // The container's view: its environment, the bundle's mount, and a
        // TLS client with no --ca.
        let script = "env | grep -E '^(SLUICE_SECRET_|SSL_CERT_FILE|CURL_CA_BUNDLE|REQUESTS_CA_BUNDLE|NODE_EXTRA_CA_CERTS|GIT_SSL_CAINFO)' ; \
             if echo x >> /etc/ssl/certs/ca-certificates.crt; then echo bundle-writable; fi; \
             sluice probe tls api.github.test:443";
        let ran = run_container_trusting(w, env, via, &s.policy, Some(&s.origin_ca), &[], script);
        let _guard = RemoveOnDrop(env, ran.id.clone());
        let daemon_log = match via {
            Via::Hook(d) => d.log(),
            Via::Wrapper => String::new(),
        };
        assert!(
            ran.out.status.success(),
            "{}: {}\n{}\n{daemon_log}",
            which(via),
            ran.stdout(),
            ran.stderr()
        );
        let out = ran.stdout();
        assert!(
            out.contains("TLS api.github.test HTTP/1.1 200 OK"),
            "{}: {out}",
            which(via)
        );
        assert!(!out.contains("bundle-writable"), "{}: {out}", which(via));
        assert!(!out.contains(common::l7::SECRET), "{}: {out}", which(via));
        let requests = s.seen.all();
        assert_eq!(requests.len(), 1, "{}: {requests:?}", which(via));
        assert_eq!(requests[0].target(), "/");
        assert_eq!(
            requests[0].header("authorization").as_deref(),
            Some(format!("Bearer {}", common::l7::SECRET).as_str()),
            "{}",
            which(via)
        );
        if let Via::Wrapper = via {
            // The hook cannot set a container's environment (docs/oci.md).
            assert!(
                out.lines()
                    .any(|l| l.starts_with("SLUICE_SECRET_GH=sluice-placeholder-gh-")),
                "{out}"
            );
            for var in CA_VARIABLES {
                assert!(
                    out.lines()
                        .any(|l| l == format!("{var}=/etc/ssl/certs/ca-certificates.crt")),
                    "{var}: {out}"
                );
            }
        }
    });
}

#[test]
fn a_bind_mount_that_reaches_a_policy_secret_file_is_refused_whichever_way_in() {
    both_ways_injecting(|w, env, via, s| {
        let volume = format!("{}:/x", s.secret_dir.display());
        let form = &["-v", volume.as_str()];
        let ran = run_container_trusting(
            w,
            env,
            via,
            &s.policy,
            Some(&s.origin_ca),
            form,
            "echo container-ran",
        );
        let _guard = RemoveOnDrop(env, ran.id.clone());
        assert_refused(&ran, via, form, "a secret file of the policy");
        assert!(s.seen.all().is_empty());
    });
}

#[test]
fn ten_containers_at_once_through_one_daemon_get_their_own_policy_and_sandbox_id() {
    let Some((w, env)) = setup() else { return };
    let daemon = Daemon::start(&w, env);
    const N: usize = 10;
    for i in 0..N {
        w.http_origin(&format!("198.18.0.1:{}", 8100 + i));
    }
    let shared = w.dir.path().to_str().unwrap().to_string();
    let volume = format!("{shared}:/shared");
    let mut children = Vec::new();
    for i in 0..N {
        let policy = w.dir.path().join(format!("p{i}.yaml"));
        std::fs::write(
            &policy,
            format!(
                "version: 1\nname: p{i}\nrules:\n  - name: own-port\n    action: allow\n    \
                 cidrs: [\"198.18.0.1/32\"]\n    ports: [{}]\n",
                8100 + i
            ),
        )
        .unwrap();
        let script = format!(
            "sluice probe http http://198.18.0.1:{own}/; echo own=$?; \
             sluice probe http http://198.18.0.1:{next}/; echo next=$?; \
             touch /shared/ready.{i}; i=0; while [ ! -e /shared/go ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done",
            own = 8100 + i,
            next = 8100 + (i + 1) % N,
        );
        let cidfile = unique(&w, "cid");
        let child = container_command(
            &w,
            env,
            Via::Hook(&daemon),
            &policy,
            &cidfile,
            &["-v", &volume],
            &script,
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        children.push((i, cidfile, child));
    }
    let all_ready = eventually(Duration::from_secs(60), || {
        (0..N).all(|i| w.dir.path().join(format!("ready.{i}")).exists())
    });
    let status = daemon.status();
    std::fs::write(w.go_path(), b"").unwrap();
    assert!(all_ready, "not all containers got ready:\n{}", daemon.log());
    assert_eq!(status.len(), N, "{status:?}");

    let audit = audit_of(&w, Via::Hook(&daemon));
    for (i, cidfile, child) in children {
        let out = wait_bounded(child, Duration::from_secs(60));
        let text = stdout(&out);
        assert!(
            text.contains("own=0") && text.contains("next=1"),
            "container {i}: {text}\n{}",
            stderr(&out)
        );
        let id = container_id(&cidfile);
        let entry = status
            .iter()
            .find(|s| s["id"] == id.as_str())
            .expect("in status");
        assert_eq!(entry["policy"], format!("p{i}"));
        let denies: Vec<_> = audit
            .iter()
            .filter(|r| r["sandbox"] == id.as_str() && r["verdict"] == "deny")
            .collect();
        assert_eq!(denies.len(), 1, "container {i}: {denies:?}");
        assert_eq!(
            denies[0]["dst"],
            format!("198.18.0.1:{}", 8100 + (i + 1) % N)
        );
        assert_eq!(denies[0]["bundle"], format!("p{i}"));
        assert_eq!(denies[0]["path"], "oci");
    }
    assert!(eventually(Duration::from_secs(15), || daemon
        .status()
        .is_empty()));
}

// ---------------------------------------------------------------------------
// Start time: every start must succeed; the times are reported, not asserted.
// For the 20-start measurement:
//   SLUICE_START_RUNS=20 cargo test --release --test oci -- --nocapture start_time

#[test]
fn start_time_of_plain_podman_wrapper_and_hook() {
    let Some((w, env)) = setup() else { return };
    let daemon = Daemon::start(&w, env);
    let policy = w.policy(POLICY);
    let runs: usize = std::env::var("SLUICE_START_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(2);
    let time = |mut cmd: Command| {
        let start = Instant::now();
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        start.elapsed()
    };
    let plain = || {
        let mut cmd = podman(env);
        cmd.args([
            "run",
            "--rm",
            "--network",
            "none",
            env.image.as_str(),
            "true",
        ]);
        cmd
    };
    let wrapper = || {
        let mut cmd = in_outer(&w, env, sluice_bin());
        cmd.args(["oci", "--policy"]).arg(&policy).args([
            "--",
            "podman",
            "run",
            "--rm",
            env.image.as_str(),
            "true",
        ]);
        cmd
    };
    let hook = || {
        let mut cmd = podman(env);
        cmd.args(["run", "--rm", "--network", "none", "--annotation"])
            .arg(format!("io.sluice.policy={}", policy.display()))
            .arg("--annotation")
            .arg(format!("io.sluice.socket={}", daemon.socket.display()))
            .args([env.image.as_str(), "true"]);
        cmd
    };
    // Warm up each path once, then interleave so drift hits all alike.
    time(plain());
    time(wrapper());
    time(hook());
    let (mut p, mut wr, mut h) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        p.push(time(plain()));
        wr.push(time(wrapper()));
        h.push(time(hook()));
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        let n = v.len();
        if n % 2 == 0 {
            (v[n / 2 - 1] + v[n / 2]) / 2
        } else {
            v[n / 2]
        }
    };
    let (p, wr, h) = (median(&mut p), median(&mut wr), median(&mut h));
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "container start, median of {runs} (podman run --rm IMAGE true):\n  \
         plain podman --network none: {:.1} ms\n  \
         sluice oci wrapper:          {:.1} ms (+{:.1} ms)\n  \
         daemon + OCI hook:           {:.1} ms (+{:.1} ms)",
        ms(p),
        ms(wr),
        ms(wr) - ms(p),
        ms(h),
        ms(h) - ms(p)
    );
}

#[test]
fn a_rule_for_everywhere_never_reaches_sluices_loopback_whichever_way_in() {
    both_ways(|w, env, via| {
        let served = w.http_origin("127.0.0.1:7000");
        let policy = w.policy(
            "version: 1\nname: everywhere\nrules:\n  - name: anywhere\n    action: allow\n    cidrs: [\"0.0.0.0/0\", \"::/0\", \"64:ff9b::/96\"]\n    ports: [7000]\n",
        );
        // Plain 127.0.0.1 is the container's own loopback; these spellings
        // leave it by its default route and reach sluice.
        let spellings = [
            "[64:ff9b::7f00:1]:7000",
            "[::7f00:1]:7000",
            "[2002:7f00:1::1]:7000",
        ];
        let script: Vec<String> = spellings
            .iter()
            .map(|dst| format!("sluice probe tcp '{dst}' --send x; echo rc=$?"))
            .collect();
        let ran = run_container(w, env, via, &policy, &[], &script.join("; "));
        assert_eq!(ran.stdout().matches("rc=1").count(), 3, "{}", ran.stdout());
        assert_eq!(served.load(Ordering::Relaxed), 0, "{}", which(via));
        let audit = audit_of(w, via);
        for dst in spellings {
            let record = audit
                .iter()
                .find(|r| r["dst"] == dst)
                .unwrap_or_else(|| panic!("{}: no record for {dst}: {audit:?}", which(via)));
            assert_eq!(record["reason"], "loopback-address", "{record}");
            assert_eq!(record["verdict"], "deny", "{record}");
        }
    });
}
