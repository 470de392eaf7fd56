//! An attacker's tools for the escape tests: small python3 programs that
//! try to reach around the sandbox (borrow a socket, trace a process, type
//! into the terminal), and helpers that start sluice and other processes
//! for them in a test's outer namespace.
//!
//! Include it next to `mod common;` with
//! `#[path = "common/attack.rs"] mod attack;`.

#![allow(dead_code)]

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::common::*;

/// The system's python3 (readable by every user, unlike a pyenv shim).
pub fn python() -> PathBuf {
    let system = PathBuf::from("/usr/bin/python3");
    if system.exists() {
        return system;
    }
    tool_path("python3").expect("python3 is needed for the escape tests")
}

/// argv: PID FD HOST PORT. Borrows descriptor FD of process PID with
/// pidfd_getfd, connects it to HOST:PORT and sends a request. Prints
/// `borrowed-and-sent` or `refused: <step>: <error>`.
pub const BORROW_SOCKET: &str = r#"
import ctypes, os, socket, sys
pid, fd, host, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
libc = ctypes.CDLL(None, use_errno=True)
try:
    pidfd = os.pidfd_open(pid)
except OSError as e:
    print("refused: pidfd_open:", e.strerror, flush=True); sys.exit(0)
got = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd (438 on x86_64 and aarch64)
if got < 0:
    print("refused: pidfd_getfd:", os.strerror(ctypes.get_errno()), flush=True); sys.exit(0)
s = socket.socket(fileno=got)
try:
    s.settimeout(5)
    s.connect((host, port))
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    print("borrowed-and-sent", s.recv(64), flush=True)
except OSError as e:
    print("refused: connect:", e, flush=True)
"#;

/// Holds an unconnected TCP socket; prints `ready FD` and waits for stdin
/// to close.
pub const HOLD_SOCKET: &str = r#"
import socket, sys
s = socket.socket()
print("ready", s.fileno(), flush=True)
sys.stdin.read()
"#;

/// argv: PID. PTRACE_ATTACH to PID; prints `attached` or `refused: <error>`.
pub const PTRACE_ATTACH: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
if libc.ptrace(16, int(sys.argv[1]), None, None) == 0:  # PTRACE_ATTACH
    print("attached", flush=True)
else:
    print("refused:", os.strerror(ctypes.get_errno()), flush=True)
"#;

/// A process started for a test, with what it printed first.
pub struct Started {
    pub child: Child,
    /// The first line it printed ("ready 3").
    pub line: String,
}

impl Started {
    /// The number after "ready" in its first line.
    pub fn fd(&self) -> i32 {
        self.line
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `cmd` with piped stdin and stdout and wait for its first line.
pub fn start_and_read_line(mut cmd: Command) -> Started {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    let mut stdout = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") {
        let n = stdout.read(&mut byte).unwrap();
        assert!(n > 0, "ended before printing a line");
        line.push(byte[0]);
    }
    Started {
        child,
        line: String::from_utf8_lossy(&line).trim().to_string(),
    }
}

/// A process outside any sandbox, in the test's outer namespace, running
/// `python3 -c SCRIPT` as nobody.
pub fn outside_as_nobody(w: &World, script: &str) -> Started {
    let mut cmd = w.outer.command("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(python())
        .args(["-c", script]);
    start_and_read_line(cmd)
}

/// `sluice -v run EXTRA --policy POLICY -- ARGV` in the outer namespace.
pub fn sluice_run(w: &World, policy: &std::path::Path, extra: &[&str], argv: &[&str]) -> Command {
    let mut cmd = w.outer.command(sluice_bin());
    cmd.args(["-v", "run"])
        .args(extra)
        .arg("--policy")
        .arg(policy)
        .arg("--")
        .args(argv);
    cmd
}

/// Run to completion (bounded) with output captured.
pub fn finish(mut cmd: Command) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    wait_bounded(child, Duration::from_secs(60))
}

/// Host pids of the processes whose name starts with `comm_prefix` and
/// whose command line holds `token`.
pub fn pids_of(comm_prefix: &str, token: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            comm.trim().starts_with(comm_prefix)
                && String::from_utf8_lossy(&cmdline).contains(token)
        })
        .collect()
}

/// The Cap* lines of /proc/PID/status as (name, mask).
pub fn capability_sets(status: &str) -> Vec<(String, u64)> {
    status
        .lines()
        .filter(|l| l.starts_with("Cap"))
        .filter_map(|l| {
            let (name, hex) = l.split_once(':')?;
            Some((name.to_string(), u64::from_str_radix(hex.trim(), 16).ok()?))
        })
        .collect()
}
