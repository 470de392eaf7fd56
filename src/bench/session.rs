//! One round's client session under one condition: the process the bench
//! starts (the client itself, or `sluice run` / `sluice oci` with the client
//! as its workload, or a VMM whose guest runs the client: `vm`), the line
//! protocol to the client on its stdin and stdout (for a guest, relayed
//! through its control port by `vm::guest_relay`), the CPU time of the process that proxies for it, and how long
//! the session took to start and to exit.
//!
//! Every wait is bounded and ends early on an interrupt: a reader thread
//! hands the client's lines over a channel (stamped when read), and the
//! process is waited for on a thread of its own. A session dropped before
//! it finished (an error, Ctrl-C) stops its process: SIGTERM (so `sluice
//! run` and `sluice oci` stop their workloads and clean up), then SIGKILL
//! if it does not go.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::client::{self, Reply};
use super::interrupt;
use super::vm::{guest_relay, UnblockOnEof};
use super::BenchError;
use crate::testbed::OuterNetns;

/// How long a session may take to say it is ready (a container's first
/// start on a loaded machine takes seconds).
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long one command may take (each request has its own 5 s bounds).
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a session may take to exit after `quit`, and after SIGTERM.
pub(crate) const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest line a client may send: a reply to the largest plan
/// (`MAX_CONNS` samples) fits many times over.
const MAX_LINE: u64 = 64 << 20;

/// The last bytes of a process's stderr that an error quotes.
const STDERR_TAIL: usize = 4096;

/// A running session whose client said it is ready.
pub(crate) struct Session {
    what: String,
    child: Option<Child>,
    input: Option<Input>,
    lines: Receiver<(Instant, String)>,
    stderr: Tail,
    /// A guest's console (QEMU's stdout), for error messages.
    console: Option<Tail>,
    /// What the guest relay saw go wrong, for error messages.
    notes: Arc<Mutex<String>>,
    /// The process that proxies the client's connections, if any.
    proxy: Option<u32>,
    /// From spawn to the client's ready line.
    pub(crate) start: Duration,
}

impl Session {
    /// Start `cmd` in the network namespace `netns` and wait for the
    /// client's ready line. `proxy` says whose CPU time is the proxy's.
    pub(crate) fn start(
        what: &str,
        mut cmd: Command,
        netns: &OuterNetns,
        proxy: Proxy,
    ) -> Result<Session, BenchError> {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let spawned = Instant::now();
        let mut child = spawn_session(what, cmd, netns)?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                // Bounded: a line longer than any reply ends the session.
                let mut line = String::new();
                match (&mut reader).take(MAX_LINE).read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if !line.ends_with('\n') => break,
                    Ok(_) => {}
                }
                line.pop();
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        let input = child.stdin.take().map(Input::Pipe);
        Session::ready(
            what,
            child,
            input,
            lines,
            None,
            Arc::default(),
            proxy,
            spawned,
        )
    }

    /// Start `cmd`, a VMM booting the guest kit whose control port
    /// connects to `control` (listening), in `netns`; the client runs in
    /// the guest, one `sluice bench-client` per command (`guest_relay`).
    /// Its ready line is that of a client run in the guest once it booted,
    /// so the start time includes the boot.
    pub(crate) fn start_guest(
        what: &str,
        mut cmd: Command,
        netns: &OuterNetns,
        proxy: Proxy,
        control: UnixListener,
        control_path: PathBuf,
    ) -> Result<Session, BenchError> {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped());
        let spawned = Instant::now();
        let mut child = spawn_session(what, cmd, netns)?;
        // When the VMM's console closes (it exited, or was killed), a
        // connection to the control socket unblocks a relay still waiting
        // for the guest to connect.
        let console = child.stdout.take().map(|out| {
            Tail::follow(UnblockOnEof {
                inner: out,
                control: control_path,
            })
        });
        let (tx, lines) = mpsc::channel();
        let (commands, inbox) = mpsc::channel();
        let notes: Arc<Mutex<String>> = Arc::default();
        let noted = notes.clone();
        std::thread::spawn(move || {
            if let Err(e) = guest_relay(control, &tx, &inbox) {
                if let Ok(mut n) = noted.lock() {
                    *n = e;
                }
            }
        });
        Session::ready(
            what,
            child,
            Some(Input::Guest(commands)),
            lines,
            console,
            notes,
            proxy,
            spawned,
        )
    }

    /// The session of a spawned `child`: wait for the client's ready line.
    #[allow(clippy::too_many_arguments)]
    fn ready(
        what: &str,
        mut child: Child,
        input: Option<Input>,
        lines: Receiver<(Instant, String)>,
        console: Option<Tail>,
        notes: Arc<Mutex<String>>,
        proxy: Proxy,
        spawned: Instant,
    ) -> Result<Session, BenchError> {
        let stderr = Tail::follow(child.stderr.take().expect("piped stderr"));
        let proxy = match proxy {
            Proxy::None => None,
            Proxy::Itself => Some(child.id()),
            Proxy::Other(pid) => Some(pid),
        };
        let mut session = Session {
            what: what.to_string(),
            input,
            child: Some(child),
            lines,
            stderr,
            console,
            notes,
            proxy,
            start: Duration::ZERO,
        };
        let (at, line) = session.next_line(READY_TIMEOUT, "start")?;
        match serde_json::from_str::<client::Ready>(&line) {
            Ok(client::Ready { ready: true }) => {}
            _ => return Err(session.failed(&format!("its first line was {line:?}, not ready"))),
        }
        session.start = at.saturating_duration_since(spawned);
        Ok(session)
    }

    /// Send `command` and wait for its reply.
    pub(crate) fn request(&mut self, command: &client::Command) -> Result<Reply, BenchError> {
        let line = serde_json::to_string(command).expect("commands serialize");
        let sent = match self.input.as_mut() {
            Some(Input::Pipe(stdin)) => writeln!(stdin, "{line}")
                .and_then(|()| stdin.flush())
                .is_ok(),
            Some(Input::Guest(commands)) => commands.send(line).is_ok(),
            None => false,
        };
        if !sent {
            return Err(self.failed("it stopped reading commands"));
        }
        let (_, reply) = self.next_line(COMMAND_TIMEOUT, "answer")?;
        serde_json::from_str(&reply)
            .map_err(|e| self.failed(&format!("it answered {reply:?} ({e})")))
    }

    /// The started process's pid.
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// CPU time (user + system, all threads) of the proxying process so far,
    /// in nanoseconds; None without a proxy or when it cannot be read.
    pub(crate) fn proxy_cpu_ns(&self) -> Option<u64> {
        self.proxy.and_then(cpu_ns)
    }

    /// Tell the client to quit and wait for the session to exit (status 0).
    /// Returns the time from `quit` to the exit.
    pub(crate) fn finish(mut self) -> Result<Duration, BenchError> {
        let asked = Instant::now();
        // A guest's relay closes the control port when its input goes,
        // and the guest powers off.
        if let Some(Input::Pipe(mut stdin)) = self.input.take() {
            let _ = stdin.write_all(b"{\"op\":\"quit\"}\n");
        }
        let child = self
            .child
            .take()
            .expect("a session has its child until finished");
        let pid = child.id();
        let (status, at) = wait_bounded(child, EXIT_TIMEOUT)
            .ok_or_else(|| self.failed(&format!("it did not exit {EXIT_TIMEOUT:?} after quit")))?;
        interrupt::unregister(pid);
        if !status.success() {
            return Err(self.failed(&format!("it exited with {status}")));
        }
        Ok(at.saturating_duration_since(asked))
    }

    fn next_line(&self, timeout: Duration, doing: &str) -> Result<(Instant, String), BenchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                // Only the client's JSON lines count; anything else a
                // wrapper may print on stdout is passed over.
                Ok((at, line)) if line.starts_with('{') => return Ok((at, line)),
                Ok(_) => continue,
                Err(_) if interrupt::raised() => return Err(BenchError::Interrupted),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.failed(&format!("it did not {doing} within {timeout:?}")))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.failed(&format!("it exited before it could {doing}")))
                }
            }
        }
    }

    /// The session failed: an error that says where, what, and quotes the
    /// end of its stderr.
    fn failed(&self, what: &str) -> BenchError {
        if interrupt::raised() {
            return BenchError::Interrupted;
        }
        let mut problem = what.to_string();
        if let Ok(note) = self.notes.lock() {
            if !note.is_empty() {
                problem = format!("{problem} ({note})");
            }
        }
        let mut stderr = self.stderr.text(Duration::from_secs(2));
        if let Some(console) = &self.console {
            let text = console.text(Duration::from_secs(2));
            if !text.is_empty() {
                stderr = format!("{stderr}\nthe guest's console ended with:\n{text}");
            }
        }
        BenchError::Session {
            what: self.what.clone(),
            problem,
            stderr,
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        drop(self.input.take());
        if let Some(child) = self.child.take() {
            let pid = child.id();
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            if wait_bounded(child, EXIT_TIMEOUT).is_none() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            interrupt::unregister(pid);
        }
    }
}

/// Where a session's commands go.
enum Input {
    /// The client's stdin.
    Pipe(ChildStdin),
    /// The relay to the guest (each command one JSON line).
    Guest(mpsc::Sender<String>),
}

/// Spawn a session's process (stdin and stdout as `cmd` says, stderr
/// piped) in `netns`, in a process group of its own, known to the
/// interrupt handler.
fn spawn_session(what: &str, mut cmd: Command, netns: &OuterNetns) -> Result<Child, BenchError> {
    use std::os::unix::process::CommandExt;
    cmd.stderr(Stdio::piped())
        // Out of the terminal's foreground group: a Ctrl-C reaches the
        // bench alone, which stops this session in order.
        .process_group(0);
    let program = cmd.get_program().to_string_lossy().into_owned();
    let child = spawn_in(netns, cmd).map_err(|cause| BenchError::Spawn {
        what: what.to_string(),
        program,
        cause,
    })?;
    interrupt::register(child.id());
    Ok(child)
}

/// Spawn `cmd` from a thread inside `netns`: the child starts in that
/// network namespace (and in the caller's mount namespace, where podman's
/// storage is), with no `ip netns exec` or `nsenter` in between.
pub(crate) fn spawn_in(netns: &OuterNetns, mut cmd: Command) -> std::io::Result<Child> {
    netns
        .run_in(move || cmd.spawn())
        .map_err(|e| std::io::Error::other(format!("{e:#}")))?
}

/// Whose CPU time is the proxy's.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Proxy {
    /// No proxy (the client goes straight to the origin).
    None,
    /// The process started (`sluice run`, `sluice oci`).
    Itself,
    /// A process started once for the whole run (a peer proxy).
    Other(u32),
}

/// Wait for `child` at most `timeout`; its status and when it exited.
/// On a timeout the child is SIGKILLed (and reaped by the waiting thread).
pub(crate) fn wait_bounded(mut child: Child, timeout: Duration) -> Option<(ExitStatus, Instant)> {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send(status.map(|s| (s, Instant::now())));
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(done)) => Some(done),
        Ok(Err(_)) => None,
        Err(_) => {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            None
        }
    }
}

/// The end of what a process says on a pipe (its stderr), kept by a
/// thread of its own for error messages.
pub(crate) struct Tail {
    buf: Arc<Mutex<Vec<u8>>>,
    closed: Mutex<Receiver<()>>,
}

impl Tail {
    /// Keep the last [`STDERR_TAIL`] bytes of `pipe` until it closes.
    pub(crate) fn follow(mut pipe: impl std::io::Read + Send + 'static) -> Tail {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let (done, closed) = mpsc::channel();
        let tail = buf.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                if let Ok(mut t) = tail.lock() {
                    t.extend_from_slice(&chunk[..n]);
                    let excess = t.len().saturating_sub(STDERR_TAIL);
                    t.drain(..excess);
                }
            }
            let _ = done.send(());
        });
        Tail {
            buf,
            closed: Mutex::new(closed),
        }
    }

    /// What was said, once the pipe closed (waiting at most `settle` for
    /// that: a process that failed usually just exited).
    pub(crate) fn text(&self, settle: Duration) -> String {
        if let Ok(closed) = self.closed.lock() {
            let _ = closed.recv_timeout(settle);
        }
        self.buf
            .lock()
            .map(|t| String::from_utf8_lossy(&t).trim().to_string())
            .unwrap_or_default()
    }
}

/// CPU time of every thread of `pid` so far, in nanoseconds: the sum of
/// each task's run time in /proc/PID/task/*/schedstat (nanosecond
/// resolution), or /proc/PID/stat's user and system ticks where schedstat
/// is missing. Threads that already exited are not in schedstat; the
/// proxies measured keep theirs for the whole run.
pub(crate) fn cpu_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        if let Some(ns) = text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
        {
            total += ns;
            any = true;
        }
    }
    if any {
        return Some(total);
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name: utime is the 12th and
    // stime the 13th of those (14 and 15 of the line).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    Some(ticks * 1_000_000_000 / hz.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time() {
        let spin: u64 = (0..200_000u64).map(|i| i * i % 7).sum();
        assert!(spin > 0);
        assert!(cpu_ns(std::process::id()).is_some_and(|ns| ns > 0));
    }
}
