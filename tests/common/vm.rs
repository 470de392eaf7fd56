//! microVM harness for the end-to-end tests: finds (or builds, with
//! containers/vm/build-guest.sh) the guest kit, boots it under
//! `qemu-system-x86_64 -M microvm -accel tcg` on a tap in a given network
//! namespace, waits for the guest's ready line, and runs commands in the
//! guest through a virtio-serial control port: one boot, many checks.
//!
//! QEMU gets `</dev/null`, runs under `timeout -s KILL` (a hard limit even if
//! this process dies) in its own process group, and is killed when the
//! [`Vm`] is dropped; the drop returns once every process of that group has
//! exited. Every wait is for an event (QEMU connecting,
//! a line from the guest, QEMU exiting) with a deadline, never a sleep.
//! Without root, qemu or the kit, [`Kit::get`] skips loudly, or panics when
//! SLUICE_REQUIRE_PRIVILEGED=1 (as in CI). At most two VMs should run at
//! once on these 2-vCPU machines: share a boot across checks.

#![allow(dead_code)]

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use sluice::testbed::guest::{self, Control};
pub use sluice::testbed::guest::{GuestNet, Ran, FAILED, READY};

/// How long a boot may take before the harness gives up (TCG on a loaded
/// 2-vCPU machine: usually 2-6 s, up to 15 s when builds run beside it).
pub const BOOT_DEADLINE: Duration = Duration::from_secs(90);
/// A command's limit unless the caller gives one.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// Console output kept for error messages (the tail).
const MAX_CONSOLE: usize = 256 << 10;

/// The guest kernel and initramfs.
#[derive(Debug, Clone)]
pub struct Kit {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl Kit {
    /// The same kit as the library knows it.
    pub fn guest(&self) -> guest::Kit {
        guest::Kit {
            kernel: self.kernel.clone(),
            initrd: self.initrd.clone(),
        }
    }

    /// The directory the kit is in (what SLUICE_VM_KIT names).
    pub fn dir(&self) -> PathBuf {
        self.initrd
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// The kit, built or brought up to date once per test binary; None
    /// (after saying why) when this test must skip.
    pub fn get() -> Option<Kit> {
        static KIT: OnceLock<std::result::Result<Kit, String>> = OnceLock::new();
        let found = KIT.get_or_init(|| {
            prerequisites()?;
            build_kit().map_err(|e| format!("{e:#}"))
        });
        match found {
            Ok(kit) => Some(kit.clone()),
            Err(why) if std::env::var("SLUICE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") => {
                panic!("microVM test cannot run: {why} (SLUICE_REQUIRE_PRIVILEGED=1)")
            }
            Err(why) => {
                eprintln!("SKIPPED: microVM test: {why}");
                None
            }
        }
    }
}

fn prerequisites() -> std::result::Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("not root".into());
    }
    for (tool, package) in [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("ip", "iproute2"),
        ("nsenter", "util-linux"),
        ("timeout", "coreutils"),
    ] {
        if !on_path(tool) {
            return Err(format!(
                "{tool} not installed (apt-get install --no-install-recommends {package})"
            ));
        }
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join(tool).is_file()))
}

/// Run the kit script (quick when nothing changed) and read where it put
/// the kernel and the initramfs.
fn build_kit() -> Result<Kit> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("containers/vm/build-guest.sh");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): the guest kit is missing",
            script.display(),
            out.status
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(PathBuf::from)
            .ok_or_else(|| anyhow!("{} printed no {key}", script.display()))
    };
    Ok(Kit {
        kernel: field("kernel=")?,
        initrd: field("initrd=")?,
    })
}

/// One guest to boot.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// The network namespace QEMU runs in (where the tap is), e.g.
    /// /run/netns/NAME; None: the caller's own.
    pub netns: Option<PathBuf>,
    pub tap: String,
    pub mac: String,
    pub net: GuestNet,
    /// Hard limit on QEMU's life.
    pub lifetime: Duration,
    /// A command QEMU runs under, e.g. `sluice vm --policy P --tap tap0
    /// --guest-mac M --`: it goes between `timeout` and QEMU, so the hard
    /// limit covers both. `tap` and `mac` must then be what it is told.
    pub wrapper: Vec<OsString>,
}

impl VmSpec {
    pub fn new(netns: Option<PathBuf>, tap: &str, mac: &str, net: GuestNet) -> VmSpec {
        VmSpec {
            netns,
            tap: tap.into(),
            mac: mac.into(),
            net,
            lifetime: Duration::from_secs(600),
            wrapper: Vec::new(),
        }
    }
}

/// QEMU's arguments (after the program name) for `spec`, with the control
/// port connecting to `control` (a listening Unix socket).
pub fn qemu_args(kit: &Kit, spec: &VmSpec, control: &Path) -> Vec<OsString> {
    guest::qemu_args(&kit.guest(), &spec.tap, &spec.mac, &spec.net, control)
}

/// A booted guest. Dropping it kills QEMU.
pub struct Vm {
    qemu: Child,
    control: Control,
    console: Arc<Mutex<Vec<u8>>>,
    _dir: tempfile::TempDir,
    reaped: bool,
    /// The guest's ready line, e.g. "net=static dev=eth0 addr=198.18.0.2/30".
    pub ready: String,
    /// From starting QEMU to the ready line.
    pub boot_time: Duration,
}

impl Vm {
    /// Boot a guest and wait for its ready line.
    pub fn boot(kit: &Kit, spec: &VmSpec) -> Result<Vm> {
        let dir = tempfile::tempdir().context("tempdir for the control socket")?;
        let socket = dir.path().join("control.sock");
        // QEMU connects to us: listening first means no wait for a path.
        let listener = UnixListener::bind(&socket).context("bind the control socket")?;
        let mut cmd = match &spec.netns {
            Some(netns) => {
                let mut c = Command::new("nsenter");
                let mut net = OsString::from("--net=");
                net.push(netns);
                c.arg(net).arg("--").arg("timeout");
                c
            }
            None => Command::new("timeout"),
        };
        cmd.args(["-s", "KILL", &spec.lifetime.as_secs().max(1).to_string()])
            .args(&spec.wrapper)
            .arg("qemu-system-x86_64")
            .args(qemu_args(kit, spec, &socket))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let started = Instant::now();
        let mut qemu = cmd.spawn().context("cannot start qemu-system-x86_64")?;
        let console = Arc::new(Mutex::new(Vec::new()));
        // Every wait below is for one of these events.
        let (events, event) = std::sync::mpsc::channel();
        for out in [
            qemu.stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            qemu.stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let (console, events) = (console.clone(), events.clone());
            std::thread::spawn(move || {
                drain_console(out, &console);
                let _ = events.send(Boot::QemuExited);
            });
        }
        std::thread::spawn(move || {
            let _ = events.send(match listener.accept() {
                Ok((stream, _)) => Boot::Connected(stream),
                Err(e) => Boot::AcceptFailed(e),
            });
        });
        let deadline = started + BOOT_DEADLINE;
        let waited = match event.recv_timeout(BOOT_DEADLINE) {
            Ok(Boot::Connected(stream)) => Ok(stream),
            Ok(Boot::QemuExited) => Err(anyhow!("QEMU exited before connecting its control port")),
            Ok(Boot::AcceptFailed(e)) => Err(anyhow!("accept on the control socket: {e}")),
            Err(_) => Err(anyhow!(
                "QEMU did not connect its control port within {BOOT_DEADLINE:?}"
            )),
        };
        let stream = match waited {
            Ok(stream) => stream,
            Err(e) => {
                // Unblock the accepting thread, then kill QEMU.
                let _ = UnixStream::connect(&socket);
                let mut vm = Vm::partial(qemu, console, dir);
                return Err(e.context(vm.console_tail_after_exit()));
            }
        };
        let mut vm = Vm {
            qemu,
            control: Control::new(stream),
            console,
            _dir: dir,
            reaped: false,
            ready: String::new(),
            boot_time: Duration::ZERO,
        };
        let line = match vm.read_line(deadline) {
            Ok(line) => line,
            Err(e) => return Err(e.context(vm.console_tail_after_exit())),
        };
        vm.boot_time = started.elapsed();
        if let Some(state) = line.strip_prefix(READY) {
            vm.ready = state.trim().to_string();
            Ok(vm)
        } else if let Some(why) = line.strip_prefix(FAILED) {
            Err(anyhow!("the guest failed: {}", why.trim()).context(vm.console_tail()))
        } else {
            Err(anyhow!("the guest said {line:?} instead of {READY}").context(vm.console_tail()))
        }
    }

    /// A Vm that only exists to be dropped (kill and reap QEMU).
    fn partial(qemu: Child, console: Arc<Mutex<Vec<u8>>>, dir: tempfile::TempDir) -> Vm {
        let (a, _b) = UnixStream::pair().expect("socketpair");
        Vm {
            qemu,
            control: Control::new(a),
            console,
            _dir: dir,
            reaped: false,
            ready: String::new(),
            boot_time: Duration::ZERO,
        }
    }

    /// Run `command` (one line of sh) in the guest as root.
    pub fn run(&mut self, command: &str) -> Result<Ran> {
        self.run_for(command, COMMAND_TIMEOUT)
    }

    /// Run `command`, killed in the guest after `limit`.
    pub fn run_for(&mut self, command: &str, limit: Duration) -> Result<Ran> {
        match self.control.run_for(command, limit) {
            Ok(ran) => Ok(ran),
            Err(e) => {
                Err(anyhow!(e).context(format!("no end of `{command}`: {}", self.console_tail())))
            }
        }
    }

    /// Run `command` and fail unless it exits 0; its output.
    pub fn check(&mut self, command: &str) -> Result<String> {
        let ran = self.run(command)?;
        if !ran.ok() {
            bail!("`{command}` exited {}: {}", ran.status, ran.output.trim());
        }
        Ok(ran.output)
    }

    /// Wait (bounded by `limit`) for QEMU, or the wrapper it runs under, to
    /// exit by itself; its exit status.
    pub fn wait_exit(&mut self, limit: Duration) -> Result<std::process::ExitStatus> {
        let (done, wait) = std::sync::mpsc::channel();
        let pid = nix::unistd::Pid::from_raw(self.qemu.id() as i32);
        // waitpid on a thread, so that the wait has a deadline.
        std::thread::spawn(move || {
            let _ = done.send(nix::sys::wait::waitpid(pid, None));
        });
        match wait.recv_timeout(limit) {
            Ok(Ok(nix::sys::wait::WaitStatus::Exited(_, code))) => {
                self.reaped = true;
                Ok(std::os::unix::process::ExitStatusExt::from_raw(code << 8))
            }
            Ok(Ok(other)) => {
                self.reaped = true;
                bail!("qemu ended with {other:?}")
            }
            Ok(Err(e)) => bail!("waitpid: {e}"),
            Err(_) => bail!(
                "qemu did not exit within {limit:?}: {}",
                self.console_tail()
            ),
        }
    }

    /// What QEMU and the guest's console printed so far.
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&self.console.lock().unwrap()).into_owned()
    }

    /// QEMU's process id (its process group too).
    pub fn pid(&self) -> u32 {
        self.qemu.id()
    }

    fn console_tail(&self) -> String {
        let text = self.console();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("guest console (last lines):\n{}", tail.join("\n"))
    }

    /// After a failure: kill QEMU, then report what it printed.
    fn console_tail_after_exit(&mut self) -> String {
        let status = self.kill();
        format!("qemu {status}; {}", self.console_tail())
    }

    fn kill(&mut self) -> String {
        if self.reaped {
            return "already reaped".into();
        }
        self.reaped = true;
        let group = self.qemu.id() as i32;
        // Our child is `timeout` (or nsenter exec'd into it); QEMU is its
        // child. Reaping `timeout` leaves a killed QEMU to be reaped by init,
        // and until it has exited it still counts as a process in the
        // namespace. A pidfd for each member of the group turns readable
        // only once that process has fully exited, so wait on those.
        let members: Vec<OwnedFd> = group_members(group)
            .into_iter()
            .filter_map(rustix::process::Pid::from_raw)
            .filter_map(|pid| {
                rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
            })
            .collect();
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(group),
            nix::sys::signal::Signal::SIGKILL,
        );
        let status = match self.qemu.wait() {
            Ok(status) => status.to_string(),
            Err(e) => format!("wait failed: {e}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        for pidfd in &members {
            if !wait_readable(pidfd, deadline) {
                return format!("{status}; a process of its group outlived SIGKILL by 30 s");
            }
        }
        status
    }

    fn read_line(&mut self, deadline: Instant) -> Result<String> {
        Ok(self.control.read_line(deadline)?)
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The processes whose process group is `group` (from /proc/PID/stat).
fn group_members(group: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                // "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces
                // and parentheses, so count fields after the last ')'.
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(2)?.parse::<i32>().ok()
                })
                == Some(group)
        })
        .collect()
}

/// Whether `fd` became readable before `deadline`.
fn wait_readable(fd: &OwnedFd, deadline: Instant) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) if n > 0 => return true,
            Ok(_) if left.is_zero() => return false,
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
}

fn drain_console(mut from: Box<dyn Read + Send>, console: &Mutex<Vec<u8>>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        let mut text = console.lock().unwrap();
        text.extend_from_slice(&buf[..n]);
        if text.len() > MAX_CONSOLE {
            let cut = text.len() - MAX_CONSOLE;
            text.drain(..cut);
        }
    }
}

/// What the boot waits for.
enum Boot {
    Connected(UnixStream),
    AcceptFailed(std::io::Error),
    QemuExited,
}

/// A tap in the named namespace `netns` with `addrs` (CIDRs) on it, up. It
/// goes away with the namespace.
pub fn add_tap(netns: &str, tap: &str, addrs: &[&str]) -> Result<()> {
    let ip = |args: &[&str]| -> Result<()> {
        let out = Command::new("ip")
            .arg("-n")
            .arg(netns)
            .args(args)
            .output()
            .context("cannot run ip (apt-get install iproute2)")?;
        if !out.status.success() {
            bail!(
                "ip -n {netns} {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    };
    ip(&["tuntap", "add", "dev", tap, "mode", "tap"])?;
    for addr in addrs {
        if addr.contains(':') {
            ip(&["-6", "addr", "add", addr, "dev", tap, "nodad"])?;
        } else {
            ip(&["addr", "add", addr, "dev", tap])?;
        }
    }
    ip(&["link", "set", tap, "up"])
}

/// Frames arriving on one interface, read through a packet socket made in
/// that interface's namespace (open it before the guest sends).
pub struct FrameCapture {
    socket: OwnedFd,
    ifindex: usize,
}

impl FrameCapture {
    /// Must run on a thread inside the namespace of `device`.
    pub fn open_here(device: &str) -> Result<FrameCapture> {
        use nix::sys::socket::{socket, AddressFamily, SockFlag, SockProtocol, SockType};
        let ifindex = nix::net::if_::if_nametoindex(device)
            .with_context(|| format!("no interface {device}"))? as usize;
        let socket = socket(
            AddressFamily::Packet,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::EthAll,
        )
        .context("packet socket")?;
        Ok(FrameCapture { socket, ifindex })
    }

    /// The first frame received on the device that `wanted` accepts, or an
    /// error at `deadline`.
    pub fn wait_for(&self, deadline: Instant, wanted: impl Fn(&[u8]) -> bool) -> Result<Vec<u8>> {
        use nix::sys::socket::{recvfrom, setsockopt, sockopt, LinkAddr};
        let mut buf = vec![0u8; 65536];
        loop {
            let left = deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| anyhow!("no matching frame arrived"))?;
            let tv = nix::sys::time::TimeVal::new(
                left.as_secs() as i64,
                left.subsec_micros().max(1) as i64,
            );
            setsockopt(&self.socket, sockopt::ReceiveTimeout, &tv).context("SO_RCVTIMEO")?;
            match recvfrom::<LinkAddr>(self.socket.as_raw_fd(), &mut buf) {
                Ok((n, Some(from))) if from.ifindex() == self.ifindex => {
                    if wanted(&buf[..n]) {
                        return Ok(buf[..n].to_vec());
                    }
                }
                Ok(_) => {}
                Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e).context("recvfrom on the packet socket"),
            }
        }
    }
}
