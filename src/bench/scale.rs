//! `sluice bench-scale`: one `sluice daemon` serving many sandboxes and
//! many concurrent connections. It builds an outer namespace holding an
//! echo origin (198.18.0.1:8080), starts the daemon there with its own
//! socket, audit log and state in a temp dir, makes `--sandboxes` plain
//! namespaces (each with one holder process, the "container" the daemon
//! watches), attaches them one by one through the control API (timing
//! each), then opens `--conns` connections spread over them, each one
//! round-tripping a token through the proxy and held open, and samples the
//! daemon's VmRSS/VmHWM at 0, 1/4, 1/2, 3/4 and all of them. Then it closes
//! everything, waits until the daemon reports no active connection, samples
//! again, detaches every sandbox and checks the daemon lists none.
//!
//! What it must never do: touch anything outside its namespaces and temp
//! dir (all removed at the end, on failure too), or report a number from a
//! run in which a connection did not round-trip: that ends it with an error.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::daemon::api::AttachRequest;
use crate::daemon::Client;
use crate::sandbox_id::SandboxId;
use crate::testbed::topology::OuterNetns;

/// The echo origin the connections reach.
const ORIGIN: &str = "198.18.0.1:8080";
/// Connections opened at once while a step is being reached.
const OPENING_AT_ONCE: usize = 256;
/// How long one connection may take to open and round-trip.
const ROUND_TRIP_BOUND: Duration = Duration::from_secs(60);
/// The token each connection sends and expects back, padded to this size.
const TOKEN_LEN: usize = 32;

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct ScalePlan {
    pub(crate) sandboxes: usize,
    pub(crate) conns: usize,
    pub(crate) out: PathBuf,
}

/// One RSS sample of a process (the daemon; `sluice run` in `scale_run`).
#[derive(Debug, Clone)]
pub(super) struct Sample {
    pub(crate) label: String,
    pub(crate) connections: usize,
    pub(crate) rss_kib: u64,
    pub(crate) hwm_kib: u64,
    /// RssAnon: the heap and stacks, without the binary's file pages.
    pub(crate) anon_kib: u64,
    pub(crate) fds: usize,
    pub(crate) threads: u64,
}

/// Removes what the bench made, whatever happens.
struct Scratch {
    dir: PathBuf,
    daemon: Option<Child>,
    holders: Vec<Child>,
    sandboxes: Vec<OuterNetns>,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for holder in &mut self.holders {
            let _ = holder.kill();
            let _ = holder.wait();
        }
        if let Some(daemon) = &mut self.daemon {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        self.sandboxes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Descriptors the bench and its daemon each need: the daemon holds two
/// per relayed connection (its two sockets), the bench two (its client end and the origin's), and
/// each some thousands besides (the sandboxes' namespaces and listeners).
pub(crate) fn descriptors_needed(conns: usize) -> u64 {
    (conns as u64) * 2 + 4096
}

/// Raise this process's RLIMIT_NOFILE (soft and hard) to `want`, so that
/// the daemon it starts inherits it; root only past the hard limit.
fn raise_nofile(want: u64) -> Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= want && hard >= want {
        return Ok(());
    }
    let new = want.max(hard);
    setrlimit(Resource::RLIMIT_NOFILE, new, new).with_context(|| {
        format!(
            "cannot raise the descriptor limit to {new} (the bench and its daemon need {want}): \
             raising the hard limit ({hard}) needs CAP_SYS_RESOURCE and stops at \
             /proc/sys/fs/nr_open; or run with --conns {} or fewer",
            hard.saturating_sub(4096) / 2
        )
    })
}

pub(crate) fn run(plan: &ScalePlan) -> Result<String> {
    raise_nofile(descriptors_needed(plan.conns))?;
    let tty = std::io::stderr().is_terminal();
    let outer = OuterNetns::create("sluice-scale", &["198.18.0.1".parse()?])?;
    let dir = std::env::temp_dir().join(outer.name());
    std::fs::create_dir_all(&dir)?;
    let mut scratch = Scratch {
        dir: dir.clone(),
        daemon: None,
        holders: Vec::new(),
        sandboxes: Vec::new(),
    };
    let (policy, socket, config) = write_daemon_files(&dir)?;
    let origin = outer.run_in(|| std::net::TcpListener::bind(ORIGIN))??;
    origin.set_nonblocking(true)?;
    let daemon_pid = start_daemon(&outer, &dir, &config, &mut scratch)?;
    wait_for_socket(&socket, &mut scratch)?;
    let client = Client::new(&socket);
    let (attach_ms, namespaces) = attach_all(plan, &client, &policy, &mut scratch, tty)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut samples = vec![sample("attached", 0, daemon_pid)?];
    let origin_task = runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(origin)?;
        Ok::<_, std::io::Error>(tokio::spawn(echo_forever(listener)))
    })?;
    let held = hold_connections(plan, &runtime, &namespaces, daemon_pid, &mut samples, tty)?;
    let relayed = held.len();
    drop(held);
    wait_for_no_active(&client)?;
    samples.push(sample("all closed", 0, daemon_pid)?);
    origin_task.abort();
    drop(runtime);

    detach_all(plan, &client)?;
    samples.push(sample("all detached", 0, daemon_pid)?);
    drop(namespaces);
    let audit_log = std::fs::read_to_string(dir.join("audit.jsonl")).unwrap_or_default();
    drop(scratch);

    write_outputs(plan, &attach_ms, &samples, relayed)?;
    let _ = audit_log;
    Ok(summary(plan, &attach_ms, &samples, relayed))
}

/// Progress on stderr: on a terminal, one line redrawn in place.
fn say(tty: bool, line: String) {
    if tty {
        eprint!("\r\x1b[2K{line}");
    } else {
        eprintln!("{line}");
    }
}

/// The policy every sandbox gets and the daemon's configuration, written
/// into `dir`. Returns the policy's, the daemon socket's and the
/// configuration's paths.
fn write_daemon_files(dir: &Path) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let policy = dir.join("policy.yaml");
    std::fs::write(&policy, super::PLAIN_POLICY)?;
    let socket = dir.join("daemon.sock");
    let config = dir.join("daemon.yaml");
    std::fs::write(
        &config,
        format!(
            "socket: {}\naudit: {}\ndefaults:\n  state_dir: {}\n",
            socket.display(),
            dir.join("audit.jsonl").display(),
            dir.join("state").display()
        ),
    )?;
    Ok((policy, socket, config))
}

/// Start `sluice daemon` in `outer` with `config`, its log in `dir`, owned
/// by `scratch`. Returns its pid.
fn start_daemon(
    outer: &OuterNetns,
    dir: &Path,
    config: &Path,
    scratch: &mut Scratch,
) -> Result<u32> {
    let exe = std::env::current_exe().context("cannot find this sluice binary")?;
    let daemon = outer
        .command(&exe)
        .args(["daemon", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("daemon.log"))?)
        .spawn()
        .context("cannot start `sluice daemon`")?;
    let daemon_pid = daemon.id();
    scratch.daemon = Some(daemon);
    Ok(daemon_pid)
}

/// Make and attach every sandbox, one by one, each timed from request to
/// answer. Returns the times (ms) and the sandboxes' namespaces.
fn attach_all(
    plan: &ScalePlan,
    client: &Client,
    policy: &Path,
    scratch: &mut Scratch,
    tty: bool,
) -> Result<(Vec<f64>, Vec<std::fs::File>)> {
    let mut attach_ms = Vec::with_capacity(plan.sandboxes);
    let mut namespaces = Vec::with_capacity(plan.sandboxes);
    for i in 0..plan.sandboxes {
        let (ms, fd) = attach_one(plan, i, client, policy, scratch)?;
        attach_ms.push(ms);
        namespaces.push(fd);
        say(tty, format!("attached {}/{}", i + 1, plan.sandboxes));
    }
    if tty {
        eprintln!();
    }
    Ok((attach_ms, namespaces))
}

/// Make sandbox `i` (a namespace and its holder process, both owned by
/// `scratch`) and attach it. Returns the attach's time (ms) and the
/// namespace.
fn attach_one(
    plan: &ScalePlan,
    i: usize,
    client: &Client,
    policy: &Path,
    scratch: &mut Scratch,
) -> Result<(f64, std::fs::File)> {
    let ns = OuterNetns::create("sluice-scale-sbx", &[])?;
    let holder = ns
        .command("sleep")
        .arg("infinity")
        .stdin(Stdio::null())
        .spawn()
        .context("cannot start a sandbox's holder process (`sleep infinity`)")?;
    let pid = holder.id() as i32;
    scratch.holders.push(holder);
    let fd = std::fs::File::open(ns.path())?;
    wait_until_inside(pid, &fd)?;
    let request = AttachRequest {
        id: SandboxId::numbered("scale", i as u32),
        pid: Some(pid),
        policy: Some(policy.to_path_buf()),
        bundle: None,
        trust: None,
        binds: Vec::new(),
        vm: None,
    };
    let started = Instant::now();
    if let Err(e) = client.attach(&request, fd.as_fd()) {
        // The daemon's log goes with the scratch directory: say what it
        // printed last, so a failure here can be diagnosed.
        let log = std::fs::read_to_string(scratch.dir.join("daemon.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(anyhow::Error::new(e).context(format!(
            "attaching sandbox {} of {}; the daemon's last log lines:\n{}",
            i + 1,
            plan.sandboxes,
            tail.join("\n")
        )));
    }
    let ms = started.elapsed().as_secs_f64() * 1e3;
    scratch.sandboxes.push(ns);
    Ok((ms, fd))
}

/// Open the plan's connections a quarter at a time, spread over the
/// sandboxes' `namespaces`, each round-tripped; the daemon is sampled at
/// every quarter. Returns them, held open.
fn hold_connections(
    plan: &ScalePlan,
    runtime: &tokio::runtime::Runtime,
    namespaces: &[std::fs::File],
    daemon_pid: u32,
    samples: &mut Vec<Sample>,
    tty: bool,
) -> Result<Vec<tokio::net::TcpStream>> {
    let steps: Vec<usize> = (1..=4).map(|q| plan.conns * q / 4).collect();
    let mut held = Vec::with_capacity(plan.conns);
    for &step in &steps {
        let from = held.len();
        // Sockets made on a thread inside the sandbox belong to it.
        let mut sockets = Vec::with_capacity(step - from);
        for n in from..step {
            let ns = namespaces[n % namespaces.len()].try_clone()?;
            sockets.push(socket_in(ns)?);
        }
        let opened = runtime.block_on(open_all(sockets, from))?;
        held.extend(opened);
        samples.push(sample(&format!("{step} connections"), step, daemon_pid)?);
        say(
            tty,
            format!("{step}/{} connections held, each round-tripped", plan.conns),
        );
    }
    if tty {
        eprintln!();
    }
    Ok(held)
}

/// Detach every sandbox, and check that the daemon lists none after.
fn detach_all(plan: &ScalePlan, client: &Client) -> Result<()> {
    for i in 0..plan.sandboxes {
        if client
            .detach(&SandboxId::numbered("scale", i as u32))?
            .is_none()
        {
            bail!("sandbox scale-{i} was not attached any more at the end");
        }
    }
    let left = client.list()?;
    if !left.is_empty() {
        bail!("{} sandboxes still listed after detaching all", left.len());
    }
    Ok(())
}

fn wait_for_socket(socket: &Path, scratch: &mut Scratch) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        if let Some(daemon) = &mut scratch.daemon {
            if let Some(status) = daemon.try_wait()? {
                let log =
                    std::fs::read_to_string(scratch.dir.join("daemon.log")).unwrap_or_default();
                bail!("`sluice daemon` exited ({status}) before opening its socket:\n{log}");
            }
        }
        if Instant::now() > deadline {
            bail!("`sluice daemon` did not open its socket within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ip netns exec` enters the namespace before it execs `sleep`: wait for it.
fn wait_until_inside(pid: i32, ns: &std::fs::File) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let want = ns.metadata()?.ino();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let inode = std::fs::metadata(format!("/proc/{pid}/ns/net")).map(|m| m.ino());
        if comm.trim() == "sleep" && matches!(inode, Ok(i) if i == want) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the holder process {pid} did not enter its namespace within 10 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A TCP socket created inside the namespace `ns`.
fn socket_in(ns: std::fs::File) -> Result<tokio::net::TcpSocket> {
    std::thread::spawn(move || -> Result<tokio::net::TcpSocket> {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .context("setns into a sandbox")?;
        Ok(tokio::net::TcpSocket::new_v4()?)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the socket thread panicked"))?
}

/// Connect every socket to the origin, round-trip a token on each, and
/// return them open.
async fn open_all(
    sockets: Vec<tokio::net::TcpSocket>,
    first: usize,
) -> Result<Vec<tokio::net::TcpStream>> {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(OPENING_AT_ONCE));
    let mut tasks = tokio::task::JoinSet::new();
    for (k, socket) in sockets.into_iter().enumerate() {
        let slots = slots.clone();
        let n = first + k;
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await;
            let trip = tokio::time::timeout(ROUND_TRIP_BOUND, round_trip(socket, n)).await;
            match trip {
                Ok(Ok(stream)) => Ok((n, stream)),
                Ok(Err(err)) => Err(anyhow::anyhow!("connection {n} failed: {err}")),
                Err(_) => Err(anyhow::anyhow!(
                    "connection {n} did not round-trip within {ROUND_TRIP_BOUND:?}"
                )),
            }
        });
    }
    let mut opened = Vec::new();
    while let Some(done) = tasks.join_next().await {
        opened.push(done??);
    }
    opened.sort_by_key(|(n, _)| *n);
    Ok(opened.into_iter().map(|(_, s)| s).collect())
}

async fn round_trip(
    socket: tokio::net::TcpSocket,
    n: usize,
) -> std::io::Result<tokio::net::TcpStream> {
    let addr: SocketAddr = ORIGIN.parse().expect("valid origin address");
    let mut stream = socket.connect(addr).await?;
    let mut token = format!("sluice-scale {n}").into_bytes();
    token.resize(TOKEN_LEN, b'.');
    stream.write_all(&token).await?;
    let mut back = [0u8; TOKEN_LEN];
    stream.read_exact(&mut back).await?;
    if back[..] != token[..] {
        return Err(std::io::Error::other("the echo differs from what was sent"));
    }
    Ok(stream)
}

/// The origin: echo every connection until it closes.
async fn echo_forever(listener: tokio::net::TcpListener) {
    while let Ok((mut stream, _)) = listener.accept().await {
        tokio::spawn(async move {
            let mut buf = [0u8; 256];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
    }
}

/// Wait until the daemon counts no active connection in any sandbox.
fn wait_for_no_active(client: &Client) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let active: i64 = client.list()?.iter().map(|s| s.connections.active).sum();
        if active == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the daemon still counts {active} active connections 60 s after the bench closed them all");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sample the memory, descriptors and threads of `pid` from /proc.
pub(super) fn sample(label: &str, connections: usize, pid: u32) -> Result<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    Ok(Sample {
        label: label.to_string(),
        connections,
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
        anon_kib: field("RssAnon:"),
        fds,
        threads: field("Threads:"),
    })
}

/// The attach times' first and last deciles' medians and the least-squares
/// slope (ms per sandbox already attached).
fn attach_trend(ms: &[f64]) -> (f64, f64, f64) {
    let decile = (ms.len() / 10).max(1);
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let first = median(&ms[..decile]);
    let last = median(&ms[ms.len() - decile..]);
    let n = ms.len() as f64;
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = ms.iter().sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (i, y) in ms.iter().enumerate() {
        num += (i as f64 - mean_x) * (y - mean_y);
        den += (i as f64 - mean_x).powi(2);
    }
    let slope = if den > 0.0 { num / den } else { 0.0 };
    (first, last, slope)
}

fn write_outputs(
    plan: &ScalePlan,
    attach_ms: &[f64],
    samples: &[Sample],
    relayed: usize,
) -> Result<()> {
    std::fs::create_dir_all(&plan.out)
        .with_context(|| format!("cannot create {}", plan.out.display()))?;
    let mut attach = String::from("sandbox,attach_ms\n");
    for (i, ms) in attach_ms.iter().enumerate() {
        let _ = writeln!(attach, "{},{ms:.3}", i + 1);
    }
    let mut rss = String::from("step,connections,vmrss_kib,vmhwm_kib,fds,threads\n");
    for s in samples {
        let _ = writeln!(
            rss,
            "{},{},{},{},{},{}",
            s.label, s.connections, s.rss_kib, s.hwm_kib, s.fds, s.threads
        );
    }
    let report = summary(plan, attach_ms, samples, relayed);
    for (name, text) in [
        ("attach.csv", attach),
        ("rss.csv", rss),
        ("report.md", report),
    ] {
        let path = plan.out.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn summary(plan: &ScalePlan, attach_ms: &[f64], samples: &[Sample], relayed: usize) -> String {
    let (first, last, slope) = attach_trend(attach_ms);
    let mut out = String::new();
    let _ = writeln!(out, "# sluice bench-scale\n");
    let _ = writeln!(
        out,
        "One `sluice daemon`, {} sandboxes attached through its API, {} of {} connections \
         round-tripped through it and held open at once.\n",
        plan.sandboxes, relayed, plan.conns
    );
    let _ = writeln!(
        out,
        "Attach (request to answer): first decile median {first:.2} ms, last decile median \
         {last:.2} ms, slope {slope:+.4} ms per sandbox (attach.csv).\n"
    );
    let _ = writeln!(
        out,
        "| step | connections | VmRSS MiB | VmHWM MiB | fds | threads |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    for s in samples {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {} | {} |",
            s.label,
            s.connections,
            s.rss_kib as f64 / 1024.0,
            s.hwm_kib as f64 / 1024.0,
            s.fds,
            s.threads
        );
    }
    let base = samples.first().map_or(0, |s| s.rss_kib);
    if let Some(full) = samples
        .iter()
        .find(|s| s.connections == plan.conns && plan.conns > 0)
    {
        let per = (full.rss_kib.saturating_sub(base) as f64 * 1024.0) / plan.conns as f64;
        let _ = writeln!(
            out,
            "\nPer connection: {:.1} KiB of RSS over the attached baseline.",
            per / 1024.0
        );
    }
    let _ = writeln!(
        out,
        "\nLoad average at the end: {}",
        super::report::load_average()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_attach_series_has_no_slope() {
        let (first, last, slope) = attach_trend(&[2.0; 20]);
        assert_eq!((first, last), (2.0, 2.0));
        assert!(slope.abs() < 1e-12);
    }

    #[test]
    fn a_growing_attach_series_has_its_slope() {
        let ms: Vec<f64> = (0..10).map(|i| 1.0 + 0.5 * i as f64).collect();
        let (first, last, slope) = attach_trend(&ms);
        assert_eq!((first, last), (1.0, 5.5));
        assert!((slope - 0.5).abs() < 1e-9);
    }
}
