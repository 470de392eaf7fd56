//! `sluice daemon` for the end-to-end tests, and what its clients and the
//! namespaces it fences show: a daemon in the world's outer namespace with
//! its own socket, audit log, state dir and log file; a stand-in VMM (a
//! process that lives in a namespace, so a VM attached with `--pid` stays
//! attached until it ends); the nftables tables of a namespace.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{eventually, sluice_bin, OuterNetns, World};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A running `sluice -v daemon`; killed when dropped.
pub struct Daemon {
    child: Child,
    pub socket: PathBuf,
    pub audit: PathBuf,
    /// Its stderr.
    pub log: PathBuf,
    config: PathBuf,
}

impl Daemon {
    /// Start a daemon in `w`'s outer namespace and wait until its control
    /// socket accepts connections.
    pub fn start(w: &World) -> Daemon {
        Daemon::start_with(w, "")
    }

    /// [`Daemon::start`], serving /metrics on `addr` (in the outer
    /// namespace: scrape it with `World::http_get_outer`).
    pub fn start_with_metrics(w: &World, addr: &str) -> Daemon {
        Daemon::start_with(w, &format!("metrics: {addr}\n"))
    }

    /// [`Daemon::start`] with `extra` lines of top-level config.
    fn start_with(w: &World, extra: &str) -> Daemon {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let file = |what: &str| w.dir.path().join(format!("daemon-{n}.{what}"));
        let (socket, audit, log, config) =
            (file("sock"), file("audit.jsonl"), file("log"), file("yaml"));
        std::fs::write(
            &config,
            format!(
                "{extra}socket: {}\naudit: {}\ndefaults:\n  state_dir: {}\n",
                socket.display(),
                audit.display(),
                w.state.path().join(format!("daemon-state-{n}")).display()
            ),
        )
        .unwrap();
        let mut daemon = Daemon {
            child: Command::new("true").spawn().expect("run true"),
            socket,
            audit,
            log,
            config,
        };
        daemon.restart(w);
        daemon
    }

    /// Stop it (SIGTERM) if it runs, and start it again on the same config
    /// and files; returns once its control socket accepts connections.
    pub fn restart(&mut self, w: &World) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = w
            .outer
            .command(sluice_bin())
            .args(["-v", "daemon", "--config"])
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start the daemon");
        let socket = self.socket.clone();
        assert!(
            eventually(Duration::from_secs(20), || {
                std::os::unix::net::UnixStream::connect(&socket).is_ok()
            }),
            "the daemon did not open its socket: {}",
            self.log_text()
        );
    }

    /// What the daemon logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `sluice ARGS... --socket SOCKET` (a client of this daemon), in the
    /// world's outer namespace.
    pub fn client(&self, w: &World, args: &[&str]) -> Output {
        w.outer
            .command(sluice_bin())
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .expect("run sluice")
    }

    /// `sluice status --json`: every sandbox the daemon serves.
    pub fn status(&self, w: &World) -> Vec<serde_json::Value> {
        let out = self.client(w, &["status", "--json"]);
        assert!(
            out.status.success(),
            "sluice status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    /// Attach the namespace at `netns` as container sandbox `id`, tied to
    /// process `pid` there, under `policy` (a file) or `bundle` and `trust`:
    /// what the OCI hook asks. Panics with the daemon's log if refused.
    pub fn attach_container(
        &self,
        id: &str,
        netns: &Path,
        pid: u32,
        policy: Option<PathBuf>,
        bundle: Option<(PathBuf, PathBuf)>,
    ) -> sluice::daemon::api::SandboxInfo {
        use std::os::fd::AsFd;
        let fd = std::fs::File::open(netns).expect("open the namespace");
        let (bundle, trust) = match bundle {
            Some((b, t)) => (Some(b.display().to_string()), Some(t)),
            None => (None, None),
        };
        let request = sluice::daemon::api::AttachRequest {
            id: id.parse().expect("a sandbox id"),
            pid: Some(pid as i32),
            policy,
            bundle,
            trust,
            binds: Vec::new(),
            vm: None,
        };
        sluice::daemon::Client::new(&self.socket)
            .attach(&request, fd.as_fd())
            .unwrap_or_else(|e| panic!("attach {id}: {e}\ndaemon: {}", self.log_text()))
    }

    /// One raw request to the control socket, without a descriptor (first
    /// byte 'N'): its status code and body.
    pub fn raw_request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&self.socket).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "N{method} {path} HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read the answer");
        let status = out
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {out}"));
        let body = out
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string();
        (status, body)
    }

    /// Whether `sluice status` lists sandbox `id`.
    pub fn lists(&self, w: &World, id: &str) -> bool {
        self.status(w).iter().any(|s| s["id"] == id)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process living in a namespace in place of a VMM (no guest boots);
/// killed when dropped.
pub struct StandInVmm {
    child: Child,
}

impl StandInVmm {
    /// Start it in `ns` and wait until it runs there.
    pub fn start(ns: &OuterNetns) -> StandInVmm {
        let mut child = ns
            .command("sh")
            .args(["-c", "echo ready; exec sleep infinity"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the stand-in VMM");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read the stand-in's first line");
        assert_eq!(line.trim(), "ready", "the stand-in VMM did not start");
        StandInVmm { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for StandInVmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `nft list tables` in the namespace at `netns`: one `table FAMILY NAME`
/// per line.
pub fn nft_tables(netns: &Path) -> Vec<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["nft", "list", "tables"])
        .output()
        .expect("run nsenter nft");
    assert!(
        out.status.success(),
        "nft list tables: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The two tables of `tap`'s fence, as `nft list tables` names them.
pub fn fence_tables(tap: &str) -> [String; 2] {
    [
        format!("table inet sluice-{tap}"),
        format!("table netdev sluice-{tap}"),
    ]
}
