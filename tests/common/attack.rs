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

/// argv: NEEDLE_HEX... (the bytes to look for, hex-encoded so that they
/// are in no command line or environment); sluice's pid (in the host's PID
/// namespace) comes on stdin once it has printed `ready`. A root workload hunting for secrets in memory:
/// walks /proc/[0-9]*, reads each process's cmdline, environ and, through
/// its maps, its mem; then tries sluice's pid directly (its /proc files,
/// kill 0, pidfd_open, PTRACE_ATTACH, process_vm_readv) and PTRACE_ATTACH
/// on its own PID 1. Prints one line per step, never the bytes it read:
/// `pids P...`, `self P`, `proc P NAME`, `read P WHAT BYTES`, `FOUND P WHAT`
/// (a needle in what it read of another process), `marker P mem` (it found
/// the marker it keeps in its own memory: the reading works), `refused P
/// WHAT ERRNO`, and `opened`/`signalled`/`pidfd`/`attached`/`copied P ...`
/// for what succeeded.
pub const READ_MEMORY: &str = r#"
import ctypes, os, sys
def out(*a): print(*a, flush=True)
needles = [bytes.fromhex(h) for h in sys.argv[1:]]
out("ready")
sluice = int(sys.stdin.readline())
me = os.getpid()
marker = os.urandom(16).hex().encode()
CHUNK = 8 << 20
def scan(pid, what, data):
    if pid == me:
        # Our memory holds the needles we decoded: look only for the marker.
        return marker in data
    for n in needles:
        if n in data:
            out("FOUND", pid, what)
    return False
def read(pid, name):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError as e:
        out("refused", pid, name, e.errno)
        return None
def memory(pid):
    maps = read(pid, "maps")
    if maps is None:
        return
    try:
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError as e:
        out("refused", pid, "mem", e.errno)
        return
    total, marked, keep = 0, False, max(len(n) for n in needles)
    for line in maps.decode(errors="replace").splitlines():
        f = line.split()
        if not f[1].startswith("r") or (len(f) > 5 and f[5] in ("[vvar]", "[vvar_vclock]", "[vsyscall]")):
            continue
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        tail = b""
        for at in range(lo, hi, CHUNK):
            try:
                data = os.pread(mem, min(CHUNK, hi - at), at)
            except OSError:
                break
            total += len(data)
            marked |= scan(pid, "mem", tail + data)
            tail = data[-keep:]
    os.close(mem)
    out("read", pid, "mem", total)
    if marked:
        out("marker", pid, "mem")
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out("pids", *pids)
out("self", me)
for pid in pids:
    status = read(pid, "status")
    if status is not None:
        name = status.split(b"\n", 1)[0].split(b"\t", 1)[-1].decode(errors="replace")
        out("proc", pid, name)
    for what in ("cmdline", "environ"):
        data = read(pid, what)
        if data is not None:
            out("read", pid, what, len(data))
            scan(pid, what, data)
    memory(pid)
for what in ("status", "cmdline", "environ", "maps", "mem"):
    try:
        open(f"/proc/{sluice}/{what}", "rb").close()
        out("opened", sluice, what)
    except OSError as e:
        out("refused", sluice, what, e.errno)
try:
    os.kill(sluice, 0)
    out("signalled", sluice)
except OSError as e:
    out("refused", sluice, "kill", e.errno)
try:
    os.pidfd_open(sluice)
    out("pidfd", sluice)
except OSError as e:
    out("refused", sluice, "pidfd_open", e.errno)
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
for pid in (sluice, 1):
    if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
        out("attached", pid)
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    else:
        out("refused", pid, "ptrace", ctypes.get_errno())
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(4096)
local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 4096)
remote = IoVec(0x400000, 4096)
libc.syscall.restype = ctypes.c_long
got = libc.syscall(310, ctypes.c_long(sluice), ctypes.byref(local), ctypes.c_ulong(1),
                   ctypes.byref(remote), ctypes.c_ulong(1), ctypes.c_ulong(0))  # process_vm_readv
if got >= 0:
    out("copied", sluice, got)
else:
    out("refused", sluice, "process_vm_readv", ctypes.get_errno())
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
    let line = read_line(child.stdout.as_mut().unwrap());
    Started { child, line }
}

/// One line from `from`, read a byte at a time (nothing after it is
/// consumed), trimmed.
pub fn read_line(from: &mut impl Read) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") {
        let n = from.read(&mut byte).unwrap();
        assert!(n > 0, "ended before printing a line");
        line.push(byte[0]);
    }
    String::from_utf8_lossy(&line).trim().to_string()
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
