//! `sluice bench-scale --run`: the memory of one `sluice run` holding many
//! connections, plain and checked, measured one after the other in one
//! invocation. It builds an outer namespace holding a keep-alive HTTP
//! origin (198.18.0.1:8080, in the bench's own process), then for each mode
//! starts a fresh `sluice run` whose workload is `sluice bench-hold` (a
//! process of its own, so that the client's, the origin's and sluice's
//! descriptors each count against their own limit) and has it open
//! `--conns` connections in four steps. Each connection sends one request,
//! reads the origin's whole answer and is held idle in keep-alive: plain,
//! under a `cidrs` rule (the plain relay), or checked, under a `hosts` rule
//! with `dns.hosts` pinning origin.test (every request decided on its own
//! Host: `proxy::session`). The VmRSS of the `sluice run` process is read
//! from /proc before the first connection and at each step. A second
//! request for another name on a held connection then shows which path
//! the connections took: the origin's 200 when plain, sluice's 403 when
//! checked.
//!
//! What it must never do: touch anything outside its namespaces and temp
//! dir (all removed at the end, on failure too), or report a number from a
//! run in which a connection did not round-trip or the mode check failed:
//! that ends it with an error.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::scale::{sample, Sample};
use crate::testbed::topology::OuterNetns;

/// The origin the connections reach.
const ORIGIN: &str = "198.18.0.1:8080";
/// The request every held connection sends first.
const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: origin.test:8080\r\n\r\n";
/// The origin's answer to every request.
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
/// The mode check's second request: a name no rule admits.
const OTHER_NAME: &[u8] = b"GET / HTTP/1.1\r\nHost: elsewhere.test:8080\r\n\r\n";
/// Connections the client opens at once while a step is being reached.
const OPENING_AT_ONCE: usize = 256;
/// How long one connection may take to open and round-trip.
const ROUND_TRIP_BOUND: Duration = Duration::from_secs(60);
/// How long the client may take to answer one line.
const STEP_BOUND: Duration = Duration::from_secs(300);
/// How long `sluice run` may take to start and to exit.
const START_BOUND: Duration = Duration::from_secs(60);
/// A pause before each sample, for the freed memory of a step to settle.
const SETTLE: Duration = Duration::from_millis(200);

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct RunPlan {
    pub(crate) conns: usize,
    pub(crate) out: PathBuf,
}

/// How the held connections are admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// By a cidrs rule: the plain relay.
    Plain,
    /// By a hosts rule: a checked session, each request decided on its Host.
    Checked,
}

impl Mode {
    pub(crate) const ALL: [Mode; 2] = [Mode::Plain, Mode::Checked];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Checked => "checked",
        }
    }

    fn policy(self) -> &'static str {
        match self {
            Mode::Plain => {
                "version: 1\nname: scale-plain\nrules:\n  - name: origin\n    action: allow\n    \
                 cidrs: [\"198.18.0.1/32\"]\n    ports: [8080]\ndns:\n  upstream: []\n"
            }
            Mode::Checked => {
                "version: 1\nname: scale-checked\nrules:\n  - name: origin\n    action: allow\n    \
                 hosts: [\"origin.test\"]\n    ports: [8080]\ndns:\n  upstream: []\n  hosts:\n    \
                 origin.test: [\"198.18.0.1\"]\n"
            }
        }
    }

    /// The status the mode check's request for another name gets.
    fn other_name_status(self) -> u16 {
        match self {
            Mode::Plain => 200,
            Mode::Checked => 403,
        }
    }
}

/// One mode's samples.
#[derive(Debug, Clone)]
pub(super) struct ModeRun {
    pub(super) mode: Mode,
    pub(super) samples: Vec<Sample>,
}

impl ModeRun {
    /// RSS at all connections less RSS before the first, per connection,
    /// in KiB.
    pub(crate) fn per_connection_kib(&self) -> f64 {
        let (Some(first), Some(last)) = (self.samples.first(), self.samples.last()) else {
            return 0.0;
        };
        if last.connections == 0 {
            return 0.0;
        }
        (last.rss_kib as f64 - first.rss_kib as f64) / last.connections as f64
    }

    /// The least-squares slope of RSS over the held connections, KiB per
    /// connection.
    pub(crate) fn slope_kib(&self) -> f64 {
        let points: Vec<(f64, f64)> = self
            .samples
            .iter()
            .map(|s| (s.connections as f64, s.rss_kib as f64))
            .collect();
        least_squares(&points)
    }
}

fn least_squares(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in points {
        num += (x - mean_x) * (y - mean_y);
        den += (x - mean_x).powi(2);
    }
    if den > 0.0 {
        num / den
    } else {
        0.0
    }
}

/// The most connections one `sluice run` relays at once under the hard
/// descriptor limit `hard` (it caps itself there: src/confine/fds.rs).
pub(crate) fn most_connections(hard: u64) -> usize {
    crate::confine::fds::connections_within(hard)
}

/// Removes what the bench made, whatever happens.
struct Scratch {
    dir: PathBuf,
    sluice: Option<Child>,
    _outer: OuterNetns,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(child) = &mut self.sluice {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) fn run(plan: &RunPlan) -> Result<String> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let most = most_connections(hard);
    if plan.conns > most {
        bail!(
            "`sluice run` relays at most {most} connections at once under this hard descriptor \
             limit ({hard}; it budgets {} descriptors a connection, src/confine/fds.rs): run \
             with --conns {most} or fewer, or raise `ulimit -Hn`",
            crate::confine::fds::PER_CONNECTION
        );
    }
    // The client (the workload) gets the soft limit `sluice run` was
    // started with: it must hold --conns sockets.
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    let outer = OuterNetns::create("sluice-scale-run", &["198.18.0.1".parse()?])?;
    let dir = std::env::temp_dir().join(outer.name());
    std::fs::create_dir_all(&dir)?;
    let mut scratch = Scratch {
        dir: dir.clone(),
        sluice: None,
        _outer: outer,
    };
    let origin = scratch
        ._outer
        .run_in(|| std::net::TcpListener::bind(ORIGIN))??;
    origin.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let origin_task = runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(origin)?;
        Ok::<_, std::io::Error>(tokio::spawn(answer_forever(listener)))
    })?;
    let mut runs = Vec::new();
    for mode in Mode::ALL {
        runs.push(run_mode(plan, mode, &mut scratch)?);
    }
    origin_task.abort();
    drop(runtime);
    drop(scratch);
    write_outputs(plan, &runs)?;
    Ok(summary(plan, &runs))
}

/// One mode: a fresh `sluice run`, its samples, its exit.
fn run_mode(plan: &RunPlan, mode: Mode, scratch: &mut Scratch) -> Result<ModeRun> {
    let dir = scratch.dir.clone();
    let policy = dir.join(format!("policy-{}.yaml", mode.name()));
    std::fs::write(&policy, mode.policy())?;
    let log = dir.join(format!("sluice-{}.log", mode.name()));
    let exe = std::env::current_exe().context("cannot find this sluice binary")?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("run")
        .arg("--policy")
        .arg(&policy)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--")
        .arg(&exe)
        .arg("bench-hold")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?);
    let mut child =
        super::session::spawn_in(&scratch._outer, cmd).context("cannot start `sluice run`")?;
    let pid = child.id();
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    scratch.sluice = Some(child);
    let mut client = HoldClient::new(stdin, stdout);
    let failed = |what: String| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        anyhow::anyhow!(
            "{} mode: {what}; `sluice run`'s last log lines:\n{}",
            mode.name(),
            tail.join("\n")
        )
    };
    match client.line(START_BOUND) {
        Ok(line) if line == "ready" => {}
        Ok(line) => return Err(failed(format!("the client's first line was {line:?}"))),
        Err(e) => return Err(failed(format!("{e:#}"))),
    }
    std::thread::sleep(SETTLE);
    let mut samples = vec![sample("before", 0, pid)?];
    for q in 1..=4 {
        let step = plan.conns * q / 4;
        if step == samples.last().map_or(0, |s| s.connections) {
            continue;
        }
        let answer = client
            .ask(&format!("open {step}"), STEP_BOUND)
            .map_err(|e| failed(format!("{e:#}")))?;
        if answer != format!("held {step}") {
            return Err(failed(format!(
                "asked to hold {step}, the client said {answer:?}"
            )));
        }
        std::thread::sleep(SETTLE);
        samples.push(sample(&format!("{step} connections"), step, pid)?);
        eprintln!(
            "{}: {step}/{} connections held, each answered",
            mode.name(),
            plan.conns
        );
    }
    let answer = client
        .ask("other-name", STEP_BOUND)
        .map_err(|e| failed(format!("{e:#}")))?;
    let want = format!("status {}", mode.other_name_status());
    if answer != want {
        return Err(failed(format!(
            "a request for another name on a held connection got {answer:?}, not {want:?}: \
             the connections did not take the {} path",
            mode.name()
        )));
    }
    client.quit();
    let child = scratch.sluice.take().expect("started above");
    match super::session::wait_bounded(child, START_BOUND) {
        Some((status, _)) if status.success() => {}
        Some((status, _)) => return Err(failed(format!("`sluice run` exited with {status}"))),
        None => {
            return Err(failed(format!(
                "`sluice run` did not exit within {START_BOUND:?}"
            )))
        }
    }
    Ok(ModeRun { mode, samples })
}

/// The bench's end of `sluice bench-hold`'s line protocol.
struct HoldClient {
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl HoldClient {
    fn new(stdin: ChildStdin, stdout: std::process::ChildStdout) -> HoldClient {
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        HoldClient {
            stdin: Some(stdin),
            lines,
        }
    }

    fn line(&self, bound: Duration) -> Result<String> {
        match self.lines.recv_timeout(bound) {
            Ok(line) => Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) => bail!("the client said nothing for {bound:?}"),
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the client's output ended"),
        }
    }

    fn ask(&mut self, command: &str, bound: Duration) -> Result<String> {
        let stdin = self
            .stdin
            .as_mut()
            .context("the client's input is closed")?;
        writeln!(stdin, "{command}")
            .and_then(|()| stdin.flush())
            .context("the client stopped reading")?;
        self.line(bound)
    }

    /// Close the client's input: it closes its connections and exits.
    fn quit(&mut self) {
        self.stdin = None;
    }
}

/// The origin: answer every request head on every connection, keep it
/// open until the client closes.
async fn answer_forever(listener: tokio::net::TcpListener) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(answer(stream));
    }
}

async fn answer(mut stream: tokio::net::TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        let Ok(n @ 1..) = stream.read(&mut buf).await else {
            return;
        };
        head.extend_from_slice(&buf[..n]);
        while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.drain(..end + 4);
            if stream.write_all(RESPONSE).await.is_err() {
                return;
            }
        }
        if head.len() > 64 * 1024 {
            return;
        }
    }
}

/// `sluice bench-hold` (hidden): the workload of `sluice bench-scale
/// --run`. It prints `ready`, then answers each line on stdin: `open N`
/// (connect to the origin until N connections are held, each having sent
/// one request and read the whole answer: `held N`, or `failed: why`),
/// `other-name` (one more request, for a name no rule admits, on the first
/// held connection: `status CODE`, 0 if no status line came). At the end
/// of its input it closes everything and exits 0.
pub(crate) fn hold_main() -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(_) => return 1,
    };
    let mut held: Vec<tokio::net::TcpStream> = Vec::new();
    let mut out = std::io::stdout().lock();
    if writeln!(out, "ready").and_then(|()| out.flush()).is_err() {
        return 1;
    }
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { return 1 };
        let answer = if let Some(n) = line.strip_prefix("open ") {
            match n.trim().parse::<usize>() {
                Ok(n) => match runtime.block_on(open_until(&mut held, n)) {
                    Ok(()) => format!("held {}", held.len()),
                    Err(e) => format!("failed: {e}"),
                },
                Err(_) => format!("failed: bad count {n:?}"),
            }
        } else if line == "other-name" {
            match held.first_mut() {
                Some(stream) => format!("status {}", runtime.block_on(other_name(stream))),
                None => "failed: no connection held".to_string(),
            }
        } else {
            format!("failed: unknown command {line:?}")
        };
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
        {
            return 1;
        }
    }
    drop(held);
    0
}

async fn open_until(held: &mut Vec<tokio::net::TcpStream>, n: usize) -> std::io::Result<()> {
    let addr: SocketAddr = ORIGIN.parse().expect("valid origin address");
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(OPENING_AT_ONCE));
    let mut tasks = tokio::task::JoinSet::new();
    for k in held.len()..n {
        let slots = slots.clone();
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await;
            match tokio::time::timeout(ROUND_TRIP_BOUND, round_trip(addr)).await {
                Ok(Ok(stream)) => Ok(stream),
                Ok(Err(e)) => Err(std::io::Error::other(format!("connection {k}: {e}"))),
                Err(_) => Err(std::io::Error::other(format!(
                    "connection {k} was not answered within {ROUND_TRIP_BOUND:?}"
                ))),
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        held.push(done.map_err(std::io::Error::other)??);
    }
    Ok(())
}

async fn round_trip(addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(REQUEST).await?;
    let mut back = [0u8; RESPONSE.len()];
    stream.read_exact(&mut back).await?;
    if back[..] != RESPONSE[..] {
        return Err(std::io::Error::other(
            "the answer differs from the origin's",
        ));
    }
    Ok(stream)
}

/// The status of the answer to a request for a name no rule admits.
async fn other_name(stream: &mut tokio::net::TcpStream) -> u16 {
    let asked = async {
        stream.write_all(OTHER_NAME).await?;
        let mut line = Vec::new();
        let mut buf = [0u8; 256];
        while !line.contains(&b'\n') && line.len() < 4096 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            line.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(line)
    };
    let Ok(Ok(line)) = tokio::time::timeout(ROUND_TRIP_BOUND, asked).await else {
        return 0;
    };
    status_of(&line)
}

/// The status code of an HTTP/1.x status line at the start of `bytes`.
fn status_of(bytes: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(bytes);
    text.strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

fn write_outputs(plan: &RunPlan, runs: &[ModeRun]) -> Result<()> {
    std::fs::create_dir_all(&plan.out)
        .with_context(|| format!("cannot create {}", plan.out.display()))?;
    let mut rss =
        String::from("mode,step,connections,vmrss_kib,vmhwm_kib,rssanon_kib,fds,threads\n");
    for run in runs {
        for s in &run.samples {
            let _ = writeln!(
                rss,
                "{},{},{},{},{},{},{},{}",
                run.mode.name(),
                s.label,
                s.connections,
                s.rss_kib,
                s.hwm_kib,
                s.anon_kib,
                s.fds,
                s.threads
            );
        }
    }
    for (name, text) in [("rss.csv", rss), ("report.md", summary(plan, runs))] {
        let path = plan.out.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn summary(plan: &RunPlan, runs: &[ModeRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# sluice bench-scale --run\n");
    let _ = writeln!(
        out,
        "One `sluice run` per mode, {} connections held through it, each having sent one \
         request and read its answer, idle in keep-alive; plain: a cidrs rule (the plain \
         relay); checked: a hosts rule (every request decided on its Host).\n",
        plan.conns
    );
    let _ = writeln!(
        out,
        "| mode | VmRSS before MiB | VmRSS at {} MiB | per connection KiB | slope KiB | RssAnon per connection KiB |",
        plan.conns
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    for run in runs {
        let (Some(first), Some(last)) = (run.samples.first(), run.samples.last()) else {
            continue;
        };
        let anon = if last.connections > 0 {
            (last.anon_kib as f64 - first.anon_kib as f64) / last.connections as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.1} | {:.2} | {:.2} | {anon:.2} |",
            run.mode.name(),
            first.rss_kib as f64 / 1024.0,
            last.rss_kib as f64 / 1024.0,
            run.per_connection_kib(),
            run.slope_kib(),
        );
    }
    let _ = writeln!(
        out,
        "\n| mode | step | connections | VmRSS MiB | VmHWM MiB | RssAnon MiB | fds | threads |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|");
    for run in runs {
        for s in &run.samples {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} |",
                run.mode.name(),
                s.label,
                s.connections,
                s.rss_kib as f64 / 1024.0,
                s.hwm_kib as f64 / 1024.0,
                s.anon_kib as f64 / 1024.0,
                s.fds,
                s.threads
            );
        }
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
    fn a_status_line_gives_its_code() {
        assert_eq!(status_of(b"HTTP/1.1 403 Forbidden\r\n"), 403);
        assert_eq!(status_of(b"HTTP/1.0 200 OK\r\n"), 200);
        assert_eq!(status_of(b""), 0);
        assert_eq!(status_of(b"garbage"), 0);
    }

    #[test]
    fn the_slope_of_a_line_is_its_gradient() {
        let points: Vec<(f64, f64)> = (0..5)
            .map(|i| (i as f64 * 100.0, 10.0 + 4.0 * i as f64 * 100.0))
            .collect();
        assert!((least_squares(&points) - 4.0).abs() < 1e-9);
        assert_eq!(least_squares(&[(1.0, 1.0)]), 0.0);
    }

    #[test]
    fn the_checked_policy_decides_each_request_and_the_plain_one_does_not() {
        let dst: SocketAddr = ORIGIN.parse().unwrap();
        for mode in Mode::ALL {
            let policy = crate::policy::Policy::from_yaml(mode.policy(), "scale.yaml")
                .unwrap_or_else(|e| panic!("{}: {e}", mode.name()));
            assert_eq!(
                policy.host_decides_each_request(dst),
                mode == Mode::Checked,
                "{}",
                mode.name()
            );
        }
    }
}
