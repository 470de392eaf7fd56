//! The bench's microVM conditions: `vm` (the test guest under `sluice vm`
//! in the outer namespace, where the origin is) and `vm-direct` (the same
//! guest on a plain tap in a namespace of its own that holds a second
//! origin, no sluice), so that `vm - vm-direct` is sluice's cost and not
//! virtualisation's. One boot per session: QEMU starts with the session and
//! powers off when it ends, so the boot is in the start time.
//!
//! The client runs in the guest as the kit's static `sluice bench-client`,
//! one process per command, through the guest's control port
//! ([`guest_relay`]); request times are taken by that client on the
//! guest's clock. This module never starts a VM outside the bench's own
//! namespaces, and never runs without the kit (it skips instead).

use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc::{Receiver, Sender};
use std::time::Instant;

use super::condition::{Condition, ConditionKind, Skip};
use super::session::{Proxy, Session, COMMAND_TIMEOUT, READY_TIMEOUT};
use super::{BenchError, Testbed, ORIGIN};
use crate::testbed::guest::{self, sh_quote, Control, GuestNet, Kit};
use crate::testbed::OuterNetns;

/// The tap, the guest's MAC and addresses: `sluice vm`'s defaults, and the
/// same on the plain tap.
const TAP: &str = "tap0";
const GUEST_MAC: &str = "52:54:00:5c:fe:02";
const GUEST_IP: &str = "198.19.254.2/30";
const GATEWAY: &str = "198.19.254.1";
const GATEWAY_CIDR: &str = "198.19.254.1/30";
/// The VMM.
const QEMU: &str = "qemu-system-x86_64";

/// Make `kind` (vm or vm-direct) ready, or say why it cannot run here.
pub(crate) fn prepare(
    kind: ConditionKind,
    bed: &Testbed,
    build: bool,
) -> Result<Result<Box<dyn Condition>, Skip>, BenchError> {
    if crate::program::on_path(QEMU).is_none() {
        return Ok(Err(format!(
            "{QEMU} is not installed (apt-get install --no-install-recommends qemu-system-x86)"
        )));
    }
    let dir = Kit::default_dir(&bed.exe);
    let kit = match Kit::in_dir(&dir) {
        Ok(kit) => kit,
        Err(why) if build => match super::provision::build_kit(&dir)
            .and_then(|()| Kit::in_dir(&dir))
        {
            Ok(kit) => kit,
            Err(failed) => return Ok(Err(format!("{why}; building it: {failed}"))),
        },
        Err(why) => {
            return Ok(Err(format!(
                "{why}: build the guest kit with containers/vm/build-guest.sh (it prints kit=DIR) and set SLUICE_VM_KIT=DIR, or leave out --no-build"
            )))
        }
    };
    let tap_world = match kind {
        ConditionKind::VmDirect => Some(plain_tap_world(bed).map_err(|e| BenchError::Setup {
            what: "building vm-direct's namespace (a plain tap and an origin)".into(),
            cause: format!("{e:#}"),
        })?),
        _ => None,
    };
    Ok(Ok(Box::new(Guest {
        kind,
        kit,
        audit: bed.dir.join(format!("audit-{kind}.jsonl")),
        tap_world,
    })))
}

/// vm-direct's namespace: the origin (plain and TLS) on its loopback, the
/// tap with the guest's gateway address on it, up.
fn plain_tap_world(bed: &Testbed) -> anyhow::Result<OuterNetns> {
    use anyhow::{bail, Context};
    let origin: SocketAddr = ORIGIN.parse().expect("literal");
    let world = OuterNetns::create("sluice-bench-tap", &[origin.ip()])?;
    for args in [
        &["tuntap", "add", "dev", TAP, "mode", "tap"][..],
        &["addr", "add", GATEWAY_CIDR, "dev", TAP],
        &["link", "set", TAP, "up"],
    ] {
        let out = Command::new("ip")
            .arg("-n")
            .arg(world.name())
            .args(args)
            .output()
            .context("cannot run `ip`: install iproute2")?;
        if !out.status.success() {
            bail!(
                "ip -n {} {} failed: {}",
                world.name(),
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    world.http_origin(origin)?;
    bed.tls_origin(&world, std::sync::Arc::new(|_: &str| {}))?;
    Ok(world)
}

/// vm or vm-direct, ready to boot.
struct Guest {
    kind: ConditionKind,
    kit: Kit,
    audit: PathBuf,
    /// vm-direct's own namespace (removed when the condition goes).
    tap_world: Option<OuterNetns>,
}

impl Condition for Guest {
    fn kind(&self) -> ConditionKind {
        self.kind
    }

    fn audit_log(&self) -> Option<PathBuf> {
        self.tap_world.is_none().then(|| self.audit.clone())
    }

    fn start(&self, bed: &Testbed, round: usize) -> Result<Session, BenchError> {
        let socket = bed.dir.join(format!("{}-{round}.sock", self.kind));
        let _ = std::fs::remove_file(&socket);
        let control = UnixListener::bind(&socket).map_err(|e| BenchError::Output {
            path: socket.clone(),
            cause: e,
        })?;
        let net = GuestNet::ipv4(GUEST_IP, GATEWAY);
        let qemu = guest::qemu_args(&self.kit, TAP, GUEST_MAC, &net, &socket);
        let (cmd, netns, proxy) = match &self.tap_world {
            Some(world) => {
                let mut cmd = Command::new(QEMU);
                cmd.args(qemu);
                (cmd, world, Proxy::None)
            }
            None => {
                let mut cmd =
                    super::condition::sluice_command(bed, "vm", &self.audit, self.kind, round);
                cmd.args([
                    "--id",
                    "bench-vm",
                    "--tap",
                    TAP,
                    "--guest-mac",
                    GUEST_MAC,
                    "--",
                ])
                .arg(QEMU)
                .args(qemu);
                (cmd, &bed.outer, Proxy::Itself)
            }
        };
        Session::start_guest(self.kind.name(), cmd, netns, proxy, control, socket)
    }
}

/// The guest's side of a session: wait for QEMU to connect the control
/// port and the guest to say it is ready, run one client (its ready line
/// is the session's), then one `sluice bench-client` per command from
/// `inbox` (the command on its stdin), each JSON line it prints handed to
/// `lines` stamped with the host's clock. Returns when `inbox` closes
/// (the session finished: dropping the port powers the guest off) or with
/// what went wrong.
pub(crate) fn guest_relay(
    listener: UnixListener,
    lines: &Sender<(Instant, String)>,
    inbox: &Receiver<String>,
) -> Result<(), String> {
    let (stream, _) = listener
        .accept()
        .map_err(|e| format!("accept on the control socket: {e}"))?;
    let mut control = Control::new(stream);
    let line = control
        .read_line(Instant::now() + READY_TIMEOUT)
        .map_err(|e| format!("waiting for the guest to boot: {e}"))?;
    if !line.starts_with(guest::READY) {
        return Err(format!(
            "the guest said {line:?} instead of {}",
            guest::READY
        ));
    }
    let first = in_guest(&mut control, "sluice bench-client </dev/null")?;
    if !forward(&first, lines, false) {
        return Ok(());
    }
    for command in inbox.iter() {
        let shell = format!(
            "printf '%s\\n' {} | sluice bench-client",
            sh_quote(&command)
        );
        let ran = in_guest(&mut control, &shell)?;
        if !forward(&ran, lines, true) {
            break;
        }
    }
    Ok(())
}

fn in_guest(control: &mut Control, command: &str) -> Result<String, String> {
    let ran = control
        .run_for(command, COMMAND_TIMEOUT)
        .map_err(|e| format!("the client in the guest: {e}"))?;
    if !ran.ok() {
        let tail: String = ran
            .output
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(format!(
            "`sluice bench-client` in the guest exited {}: {}",
            ran.status,
            tail.trim()
        ));
    }
    Ok(ran.output)
}

/// Hand the client's JSON lines over (without its ready line when
/// `skip_ready`); false once the session stopped listening.
fn forward(output: &str, lines: &Sender<(Instant, String)>, skip_ready: bool) -> bool {
    let at = Instant::now();
    output
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter(|l| !(skip_ready && serde_json::from_str::<super::client::Ready>(l).is_ok()))
        .all(|l| lines.send((at, l.to_string())).is_ok())
}

/// A VMM's console: when it ends (the VMM exited or was killed), one
/// connection to the control socket wakes a relay still waiting in
/// `accept` (it then reads nothing and gives up).
pub(crate) struct UnblockOnEof<R> {
    pub(crate) inner: R,
    pub(crate) control: PathBuf,
}

impl<R: Read> Read for UnblockOnEof<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf);
        if matches!(read, Ok(0) | Err(_)) {
            let _ = UnixStream::connect(&self.control);
        }
        read
    }
}
