//! The test guest's side of the testbed (containers/vm): where its kit is,
//! the QEMU arguments that boot it (`-M microvm -accel tcg`, a tap, the
//! virtio-serial control port), and the host's end of that control port's
//! line protocol: the guest says it is ready, the host sends `MARKER SECS
//! COMMAND`, the guest runs the command as root (killed after SECS) and
//! answers with its output, then `\nMARKER STATUS\n`. `sluice bench`'s vm
//! conditions and the end-to-end tests (tests/common/vm.rs) share it.
//!
//! It never starts QEMU itself (its callers do, each in the namespace and
//! under the wrapper it needs), and every read has a deadline: a dead guest
//! is an error, never a hang. Output is bounded ([`MAX_OUTPUT`]).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the guest writes on its control port once it is configured.
pub const READY: &str = "SLUICE-GUEST-READY";
/// ... or instead, when its network could not be configured.
pub const FAILED: &str = "SLUICE-GUEST-FAILED";
/// The name of the control port (the guest's `sluice.ctl=` default).
pub(crate) const CONTROL_PORT: &str = "sluice.ctl";
/// Most of a command's output kept.
pub(crate) const MAX_OUTPUT: usize = 16 << 20;

/// Why talking to the guest failed.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    #[error("timed out waiting for the guest")]
    Timeout,
    #[error("the guest closed its control port (QEMU exited?)")]
    Closed,
    #[error("the guest closed its control port mid-line")]
    ClosedMidLine,
    #[error("a guest command is one line: {0:?}")]
    MultiLine(String),
    #[error("`{0}` wrote more than {MAX_OUTPUT} bytes")]
    TooMuchOutput(String),
    #[error("the guest ended `{command}` with a bad status line {line:?}")]
    BadStatus { command: String, line: String },
    #[error("the guest's control port: {0}")]
    Io(#[from] std::io::Error),
}

/// The guest kernel and initramfs.
#[derive(Debug, Clone)]
pub struct Kit {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl Kit {
    /// Where the guest kit is: $SLUICE_VM_KIT, else `target/vm-kit` beside
    /// the `target/<profile>/sluice` that runs as `exe` (where
    /// build-guest.sh puts it).
    pub(crate) fn default_dir(exe: &Path) -> PathBuf {
        match std::env::var_os("SLUICE_VM_KIT") {
            Some(dir) => PathBuf::from(dir),
            None => exe
                .parent()
                .and_then(Path::parent)
                .map(|target| target.join("vm-kit"))
                .unwrap_or_else(|| PathBuf::from("target/vm-kit")),
        }
    }

    /// The kit containers/vm/build-guest.sh left in `dir` (`vmlinuz`,
    /// `initrd.gz`), or why there is none.
    pub(crate) fn in_dir(dir: &Path) -> Result<Kit, String> {
        let kit = Kit {
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initrd.gz"),
        };
        for file in [&kit.kernel, &kit.initrd] {
            if !file.is_file() {
                return Err(format!("no guest kit: {} is missing", file.display()));
            }
        }
        Ok(kit)
    }
}

/// How the guest configures eth0 (see containers/vm/init).
#[derive(Debug, Clone)]
pub enum GuestNet {
    /// Addresses with prefix, e.g. "198.18.0.2/30"; DNS = the IPv4 gateway.
    Static {
        ip: String,
        gateway: String,
        ip6: Option<String>,
        gateway6: Option<String>,
    },
    /// busybox udhcpc at boot.
    Dhcp,
    None,
}

impl GuestNet {
    /// A static IPv4 address and gateway, no IPv6.
    pub fn ipv4(ip: &str, gateway: &str) -> GuestNet {
        GuestNet::Static {
            ip: ip.into(),
            gateway: gateway.into(),
            ip6: None,
            gateway6: None,
        }
    }

    pub(crate) fn kernel_args(&self) -> Vec<String> {
        match self {
            GuestNet::Static {
                ip,
                gateway,
                ip6,
                gateway6,
            } => {
                let mut args = vec![format!("sluice.ip={ip}"), format!("sluice.gw={gateway}")];
                args.extend(ip6.iter().map(|a| format!("sluice.ip6={a}")));
                args.extend(gateway6.iter().map(|a| format!("sluice.gw6={a}")));
                args
            }
            GuestNet::Dhcp => vec!["sluice.net=dhcp".into()],
            GuestNet::None => vec!["sluice.net=none".into()],
        }
    }
}

/// The kernel's `tsc_early_khz`: microvm has no HPET or PM timer, and
/// without it the guest's TSC calibration can lose a race on a loaded host
/// and hang for good.
pub(crate) fn tsc_khz() -> u64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|mhz| mhz.trim().parse::<f64>().ok())
        })
        .map(|mhz| (mhz * 1000.0) as u64)
        .unwrap_or(2_000_000)
}

/// QEMU's arguments (after the program name): the kit on tap `tap` with
/// the guest's MAC `mac`, configured as `net`, its control port connecting
/// to `control` (a Unix socket the caller listens on).
pub fn qemu_args(kit: &Kit, tap: &str, mac: &str, net: &GuestNet, control: &Path) -> Vec<OsString> {
    let mut append = vec![
        "console=ttyS0".to_string(),
        "quiet".into(),
        "panic=-1".into(),
        // Reboot by triple fault: QEMU (-no-reboot) exits at once. The
        // kernel's default order tries ACPI and the keyboard controller
        // first, and under load a microvm guest could spin in those for
        // more than a minute before QEMU saw the reset.
        "reboot=t".into(),
        // Without these the kernel distrusts TCG's TSC and falls back to
        // jiffies: the guest's clock would tick in 4 ms steps, too coarse
        // for the bench client's request times. With them it reads the
        // TSC (at tsc_early_khz, the host's rate).
        "clocksource=tsc".into(),
        "tsc=reliable".into(),
        format!("tsc_early_khz={}", tsc_khz()),
        format!("sluice.ctl={CONTROL_PORT}"),
    ];
    append.extend(net.kernel_args());
    let mut args: Vec<OsString> = [
        "-M",
        "microvm",
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-m",
        "256",
        "-smp",
        "1",
        "-nodefaults",
        "-no-user-config",
        "-nographic",
        "-no-reboot",
        "-serial",
        "stdio",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    args.push("-kernel".into());
    args.push(kit.kernel.clone().into());
    args.push("-initrd".into());
    args.push(kit.initrd.clone().into());
    args.push("-append".into());
    args.push(append.join(" ").into());
    for arg in [
        "-netdev".to_string(),
        format!("tap,id=n0,ifname={tap},script=no,downscript=no"),
        "-device".into(),
        format!("virtio-net-device,netdev=n0,mac={mac}"),
        "-device".into(),
        "virtio-serial-device".into(),
        "-chardev".into(),
    ] {
        args.push(arg.into());
    }
    let mut chardev = OsString::from("socket,id=ctl,path=");
    chardev.push(control);
    args.push(chardev);
    args.push("-device".into());
    args.push(format!("virtserialport,chardev=ctl,name={CONTROL_PORT}").into());
    args
}

/// What a command in the guest did.
#[derive(Debug, Clone)]
pub struct Ran {
    pub status: i32,
    /// stdout and stderr, interleaved as written.
    pub output: String,
}

impl Ran {
    pub fn ok(&self) -> bool {
        self.status == 0
    }
}

/// The host's end of a guest's control port (QEMU connected to it).
/// Dropping it closes the port, and the guest powers off.
pub struct Control {
    stream: BufReader<UnixStream>,
    next: u64,
}

impl Control {
    pub fn new(stream: UnixStream) -> Control {
        Control {
            stream: BufReader::new(stream),
            next: 0,
        }
    }

    /// The next line from the guest (without its newline), by `deadline`.
    pub fn read_line(&mut self, deadline: Instant) -> Result<String, GuestError> {
        let mut line = Vec::new();
        self.read_until_newline(&mut line, deadline)?;
        Ok(String::from_utf8_lossy(&line).trim_end().to_string())
    }

    /// Run `command` (one line of sh) in the guest as root, killed there
    /// after `limit`; a guest that does not answer by `limit` and a grace
    /// of 15 s is an error.
    pub fn run_for(&mut self, command: &str, limit: Duration) -> Result<Ran, GuestError> {
        if command.contains('\n') {
            return Err(GuestError::MultiLine(command.to_string()));
        }
        self.next += 1;
        let marker = format!(
            "SLUICE-END-{}-{}-{:016x}",
            std::process::id(),
            self.next,
            rand::random::<u64>()
        );
        let secs = limit.as_secs().max(1);
        self.stream
            .get_mut()
            .write_all(format!("{marker} {secs} {command}\n").as_bytes())?;
        let deadline = Instant::now() + limit + Duration::from_secs(15);
        let end = format!("\n{marker} ");
        let mut got: Vec<u8> = Vec::new();
        loop {
            self.read_until_newline(&mut got, deadline)?;
            if got.len() > MAX_OUTPUT {
                return Err(GuestError::TooMuchOutput(command.to_string()));
            }
            // The marker is random: the command cannot end itself early.
            if let Some(at) = find(&got, end.as_bytes()) {
                let line = String::from_utf8_lossy(&got[at + end.len()..]).to_string();
                let status = line.trim().parse().map_err(|_| GuestError::BadStatus {
                    command: command.to_string(),
                    line: line.clone(),
                })?;
                got.truncate(at);
                return Ok(Ran {
                    status,
                    output: String::from_utf8_lossy(&got).into_owned(),
                });
            }
        }
    }

    /// Append bytes up to and including the next newline to `buf`.
    fn read_until_newline(
        &mut self,
        buf: &mut Vec<u8>,
        deadline: Instant,
    ) -> Result<(), GuestError> {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(GuestError::Timeout)?;
        self.stream.get_ref().set_read_timeout(Some(left))?;
        // Bounded: a line longer than the output limit is cut there.
        let limit = (MAX_OUTPUT + 1 - buf.len().min(MAX_OUTPUT)) as u64;
        match (&mut self.stream).take(limit).read_until(b'\n', buf) {
            Ok(0) => Err(GuestError::Closed),
            Ok(_) if buf.ends_with(b"\n") => Ok(()),
            Ok(_) if buf.len() > MAX_OUTPUT => Ok(()),
            Ok(_) => Err(GuestError::ClosedMidLine),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(GuestError::Timeout)
            }
            Err(e) => Err(e.into()),
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `text` as one sh word (single-quoted).
#[cfg(any(test, feature = "bench"))]
pub(crate) fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_word_keeps_its_quotes() {
        assert_eq!(sh_quote("a'b c"), r"'a'\''b c'");
    }

    #[test]
    fn a_missing_kit_says_which_file() {
        let err = Kit::in_dir(Path::new("/nonexistent/kit")).unwrap_err();
        assert!(err.contains("/nonexistent/kit/vmlinuz"), "{err}");
    }
}
