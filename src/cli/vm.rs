//! `sluice vm -- VMM ...`, `sluice vm attach` and `sluice vm detach`: a
//! microVM whose only network path is sluice, fenced on the host side of
//! its tap.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use ipnet::{Ipv4Net, Ipv6Net};

use super::args::{policy_source, PolicySourceArgs, RecordArgs};
use super::BadInput;
use crate::attach::vm::{
    VmAddressing, VmNet, DEFAULT_GUEST_IP, DEFAULT_GUEST_IP6, DEFAULT_GUEST_MAC, DEFAULT_TAP,
};
use crate::mac::MacAddr;
use crate::netns::SandboxNetns;
use crate::sandbox_id::SandboxId;
use crate::workload::WorkloadPath;

pub(crate) const AFTER_HELP: &str = "Examples:\n  \
sluice vm --policy policies/dev.yaml -- sh -c 'exec qemu-system-x86_64 -M microvm ... \\\n      \
-netdev tap,id=n0,ifname=$SLUICE_TAP,script=no,downscript=no \\\n      \
-device virtio-net-device,netdev=n0,mac=$SLUICE_GUEST_MAC -append \"... $SLUICE_KERNEL_IP_ARG\"'\n  \
sluice vm attach --policy P --tap tap0 --netns vm1 --guest-mac 52:54:00:12:34:56 --guest-ip 10.0.0.2/30\n  \
sluice vm detach --tap tap0 --netns vm1\n\n\
`sluice vm` creates a network namespace with the tap in it (owned by --user, so the VMM opens it \
without CAP_NET_ADMIN), fences the tap (one nftables transaction, read back), answers DHCP with \
the one lease below and router solicitations with a router advertisement (the guest's IPv6 /64 \
for SLAAC, sluice at fe80::1 as its router), then runs the VMM confined in that namespace (as `sluice run` runs a \
command) with SLUICE_TAP, SLUICE_GUEST_MAC, SLUICE_GUEST_IP, SLUICE_GATEWAY, SLUICE_GUEST_IP6, \
SLUICE_GATEWAY6 and SLUICE_KERNEL_IP_ARG (a kernel `ip=` argument) in its environment, and, \
when a rule terminates TLS (an `http` or `inject` block), SLUICE_CA_FILE: a file holding the \
system roots plus the sandbox CA, read-only, for the guest builder to put in the guest (e.g. as \
/etc/ssl/certs/ca-certificates.crt; docs/vm.md). It exits with the VMM's status and leaves \
nothing behind. The guest's gateway is sluice: its DNS server \
and its only way out; TCP is proxied under the policy, DNS answered under it, everything else \
dropped and counted (sluice_dropped_packets_total{reason}).\n\n\
Addresses: the defaults (guest 198.19.254.2/30 behind 198.19.254.1, 2001:db8:5c:fffe::2/64 \
behind ::1) are private to the VMM's namespace and collide with nothing outside it; choose others \
only if the guest must have a given address, inside a prefix of /30 (IPv6 /64 to /126) or wider, \
and never one of the destinations its policy allows. The gateway is the first free address of \
the guest's prefix. Records carry path \"vm\" and --id as sandbox. Needs root; see docs/vm.md.";

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct VmArgs {
    #[command(subcommand)]
    pub(crate) action: Option<VmAction>,
    #[command(flatten)]
    pub(crate) wrap: Box<WrapArgs>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum VmAction {
    /// Fence an existing tap in another namespace and serve it until SIGINT or SIGTERM.
    #[command(after_help = ATTACH_AFTER_HELP)]
    Attach(Box<AttachArgs>),
    /// Remove the fence `sluice vm attach` left on a tap, or (--daemon) release a VM and remove its fence.
    #[command(after_help = DETACH_AFTER_HELP)]
    Detach(DetachArgs),
}

const ATTACH_AFTER_HELP: &str = "The tap must exist (e.g. `ip tuntap add tap0 mode tap`, in the \
VMM's namespace). sluice adds the gateway address to it when missing (and removes only what it \
added when it stops), hardens its sysctls, installs the fence for this guest, and serves it. \
Stopping sluice (SIGINT, SIGTERM) never opens the tap: the fence stays, and the guest reaches \
nothing, until the tap goes or `sluice vm detach` removes the fence. SIGHUP reloads the policy. \
If the tap itself is removed while sluice serves it, sluice removes the tap's fence too and exits \
1, saying so on stderr (0 after SIGINT or SIGTERM). With --guest-ip6 the guest's IPv6 neighbour \
entries are pinned on the tap and sluice answers its router solicitations (SLAAC in a /64). \
--ca-file PATH writes the system roots plus the sandbox CA there before the fence goes up, for \
the guest's trust store when a rule terminates TLS; it is removed when sluice stops.";

/// The VM's addresses, common to the wrapper and attach.
#[derive(Debug, Args)]
pub(crate) struct GuestArgs {
    /// The guest's NIC's MAC address: the only source MAC the tap accepts.
    #[arg(long, value_name = "MAC")]
    pub(crate) guest_mac: Option<MacAddr>,
    /// The guest's IPv4 address with its prefix (its only IPv4 source).
    #[arg(long, value_name = "CIDR")]
    pub(crate) guest_ip: Option<Ipv4Net>,
    /// sluice's IPv4 address on the tap (default: the first free address of the guest's prefix).
    #[arg(long, value_name = "IP")]
    pub(crate) gateway: Option<std::net::Ipv4Addr>,
    /// The guest's IPv6 address with its prefix.
    #[arg(long, value_name = "CIDR", conflicts_with = "no_ipv6")]
    pub(crate) guest_ip6: Option<Ipv6Net>,
    /// sluice's IPv6 address on the tap (default: the first free address of the guest's prefix).
    #[arg(long, value_name = "IP")]
    pub(crate) gateway6: Option<std::net::Ipv6Addr>,
    /// Give the guest no IPv6 (the fence then drops all of it).
    #[arg(long)]
    pub(crate) no_ipv6: bool,
    /// The `sandbox` field of the VM's records and its name in metrics
    /// (1-128 of [A-Za-z0-9._-]; default vm-<sluice's pid>).
    #[arg(long, value_name = "ID")]
    pub(crate) id: Option<SandboxId>,
}

/// Where an existing tap is.
#[derive(Debug, Args)]
#[group(required = true, multiple = false, id = "namespace")]
pub(crate) struct NamespaceArgs {
    /// The namespace, by name (/run/netns/NAME) or path.
    #[arg(long, value_name = "NAME|PATH", group = "namespace")]
    pub(crate) netns: Option<String>,
    /// The namespace of this process (the VMM's).
    #[arg(long, value_name = "VMM_PID", group = "namespace")]
    pub(crate) pid: Option<u32>,
}

impl NamespaceArgs {
    fn path(&self) -> PathBuf {
        match (&self.netns, self.pid) {
            (Some(name), _) if !name.contains('/') => PathBuf::from("/run/netns").join(name),
            (Some(path), _) => PathBuf::from(path),
            (None, Some(pid)) => PathBuf::from(format!("/proc/{pid}/ns/net")),
            (None, None) => unreachable!("clap requires one of --netns and --pid"),
        }
    }

    fn open(&self) -> anyhow::Result<SandboxNetns> {
        let path = self.path();
        SandboxNetns::from_path(&path).map_err(|e| {
            BadInput(anyhow::Error::from(e).context(format!(
                "cannot open the network namespace {} (name it with --netns NAME|PATH or --pid VMM_PID)",
                path.display()
            )))
            .into()
        })
    }
}

/// `sluice vm [OPTIONS] -- VMM ARGS...`.
#[derive(Debug, Args)]
pub(crate) struct WrapArgs {
    #[command(flatten)]
    pub(crate) source: PolicySourceArgs,
    #[command(flatten)]
    pub(crate) records: RecordArgs,
    /// The tap's name (in the VMM's namespace, so any name is free).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_TAP)]
    pub(crate) tap: String,
    #[command(flatten)]
    pub(crate) guest: GuestArgs,
    /// Run the VMM as USER (name or uid) instead of root; the tap is theirs.
    #[arg(long, value_name = "USER")]
    pub(crate) user: Option<String>,
    /// The VMM's command, after `--` (QEMU, Firecracker, a script).
    #[arg(last = true, required = true, value_name = "VMM")]
    pub(crate) command: Vec<OsString>,
}

/// `sluice vm attach`.
#[derive(Debug, Args)]
pub(crate) struct AttachArgs {
    #[command(flatten)]
    pub(crate) source: PolicySourceArgs,
    #[command(flatten)]
    pub(crate) records: RecordArgs,
    /// The tap to fence.
    #[arg(long, value_name = "NAME")]
    pub(crate) tap: String,
    #[command(flatten)]
    pub(crate) namespace: NamespaceArgs,
    #[command(flatten)]
    pub(crate) guest: GuestArgs,
    /// Ask the running `sluice daemon` to fence and serve the tap, and return
    /// at once (the daemon's audit log and metrics apply; it releases the VM
    /// when the VMM (--pid), or every process of the namespace, is gone, the
    /// fence staying; `sluice vm detach --daemon --id ID` removes it too).
    #[arg(long)]
    pub(crate) daemon: bool,
    /// With --daemon: its control socket (default: $SLUICE_DAEMON_SOCKET, else /run/sluice/daemon.sock).
    #[arg(long, value_name = "PATH", requires = "daemon")]
    pub(crate) socket: Option<PathBuf>,
    /// Write the CA bundle the guest should trust (system roots plus the
    /// sandbox CA) to PATH, replacing a file there; removed when sluice stops.
    #[arg(long, value_name = "PATH", conflicts_with = "daemon")]
    pub(crate) ca_file: Option<PathBuf>,
}

/// `sluice vm detach`.
#[derive(Debug, Args)]
pub(crate) struct DetachArgs {
    /// The fenced tap.
    #[arg(long, value_name = "NAME", required_unless_present = "daemon")]
    pub(crate) tap: Option<String>,
    /// The namespace, by name (/run/netns/NAME) or path.
    #[arg(long, value_name = "NAME|PATH", conflicts_with = "pid", required_unless_present_any = ["pid", "daemon"])]
    pub(crate) netns: Option<String>,
    /// The namespace of this process (the VMM's).
    #[arg(long, value_name = "VMM_PID", required_unless_present_any = ["netns", "daemon"])]
    pub(crate) pid: Option<u32>,
    /// Ask the running `sluice daemon` to release VM --id (stop serving it,
    /// remove the gateway addresses its attach added) and remove its tap's
    /// fence; prints the daemon's view of the VM as it was.
    #[arg(long, requires = "id", conflicts_with_all = ["tap", "netns", "pid"])]
    pub(crate) daemon: bool,
    /// With --daemon: the VM's id, as `sluice vm attach --daemon --id` gave it
    /// (`sluice status` lists them).
    #[arg(long, value_name = "ID", requires = "daemon", conflicts_with_all = ["tap", "netns", "pid"])]
    pub(crate) id: Option<SandboxId>,
    /// With --daemon: its control socket (default: $SLUICE_DAEMON_SOCKET, else /run/sluice/daemon.sock).
    #[arg(long, value_name = "PATH", requires = "daemon", conflicts_with_all = ["tap", "netns", "pid"])]
    pub(crate) socket: Option<PathBuf>,
}

const DETACH_AFTER_HELP: &str = "Without --daemon: removes the two tables `sluice-TAP` that a \
stopped `sluice vm attach` left in the namespace (the tap and its addresses are left alone).\n\n\
With --daemon --id ID: the daemon releases the VM and removes its fence in one request \
(`DELETE /v1/sandboxes/ID?fence=remove`); the tap is then open, as before the attach. (A plain \
release, when the VMM exits or the daemon stops, keeps the fence.)\n\n\
Exit status: 0 done; 2 bad arguments, or the daemon serves no VM of that id (see `sluice \
status`); 3 the fence could not be removed; 4 no daemon answers at the socket.";

pub(crate) fn execute(args: VmArgs) -> anyhow::Result<i32> {
    match args.action {
        None => wrap(*args.wrap),
        Some(VmAction::Attach(args)) => attach(*args),
        Some(VmAction::Detach(args)) => detach(args),
    }
}

fn wrap(args: WrapArgs) -> anyhow::Result<i32> {
    let net = vm_net(&args.tap, &args.guest, true)?;
    let id = sandbox_id(&args.guest);
    let policy = policy_source(&args.source, WorkloadPath::Vm)?;
    crate::confine::require_root("sluice vm")?;
    // First, while sluice is small (see PreparedInit).
    let init = crate::confine::PreparedInit::fork()?;
    let files = super::run::sluice_files(&args.source, &args.records);
    let (started, workers) = crate::serve::runtime::one_sandbox()?;
    let opts = crate::app::vm::VmOptions {
        policy,
        services: args
            .records
            .services(&args.source.bundle_opts.state_dir, workers),
        net,
        id,
        user: args.user,
        command: args.command,
        files,
        init,
    };
    started.block_on(crate::app::vm::run(opts))
}

fn attach(args: AttachArgs) -> anyhow::Result<i32> {
    if args.guest.guest_mac.is_none() || args.guest.guest_ip.is_none() {
        return Err(BadInput(anyhow::anyhow!(
            "sluice vm attach needs --guest-mac and --guest-ip: the fence admits only that guest"
        ))
        .into());
    }
    let net = vm_net(&args.tap, &args.guest, false)?;
    let id = sandbox_id(&args.guest);
    let policy = policy_source(&args.source, WorkloadPath::Vm)?;
    if args.daemon {
        return attach_through_daemon(&args, id);
    }
    crate::confine::require_root("sluice vm attach")?;
    let netns = args.namespace.open()?;
    let (started, workers) = crate::serve::runtime::one_sandbox()?;
    let opts = crate::app::vm::AttachOptions {
        policy,
        services: args
            .records
            .services(&args.source.bundle_opts.state_dir, workers),
        netns,
        net,
        id,
        ca_file: args.ca_file,
    };
    started.block_on(crate::app::vm::attach(opts))
}

/// `sluice vm attach --daemon`: the daemon fences the tap in the namespace
/// this process opens and sends along; prints the daemon's view of the VM.
fn attach_through_daemon(args: &AttachArgs, id: SandboxId) -> anyhow::Result<i32> {
    use std::os::fd::AsFd;
    let absolute = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let path = args.namespace.path();
    let netns = std::fs::File::open(&path).map_err(|e| {
        BadInput(anyhow::Error::from(e).context(format!(
            "cannot open the network namespace {}",
            path.display()
        )))
    })?;
    let guest = &args.guest;
    let request = crate::daemon::api::AttachRequest {
        id,
        pid: args.namespace.pid.map(|p| p as i32),
        policy: args.source.policy.as_deref().map(absolute),
        bundle: args.source.bundle.clone(),
        trust: args.source.bundle_opts.trust.as_deref().map(absolute),
        binds: Vec::new(),
        vm: Some(guest.addressing(&args.tap, false)),
    };
    let socket = crate::daemon::socket_path(args.socket.as_deref());
    let info = crate::daemon::Client::new(socket)
        .attach(&request, netns.as_fd())
        .context("the daemon did not attach the VM")?;
    println!("{}", serde_json::to_string(&info).expect("serializable"));
    Ok(0)
}

fn detach(args: DetachArgs) -> anyhow::Result<i32> {
    if args.daemon {
        return detach_through_daemon(&args);
    }
    crate::confine::require_root("sluice vm detach")?;
    let tap = args
        .tap
        .as_deref()
        .expect("clap requires --tap without --daemon");
    let namespace = NamespaceArgs {
        netns: args.netns.clone(),
        pid: args.pid,
    };
    let netns = namespace.open()?;
    crate::attach::vm::remove_fence(&netns, tap)
        .with_context(|| format!("cannot remove the fence of tap {tap}"))?;
    eprintln!("sluice: removed the fence of tap {tap}");
    Ok(0)
}

/// `sluice vm detach --daemon --id ID`: the daemon releases the VM and
/// removes its fence; prints the daemon's view of the VM.
fn detach_through_daemon(args: &DetachArgs) -> anyhow::Result<i32> {
    use crate::daemon::ClientError;
    let id = args.id.as_ref().expect("clap requires --id with --daemon");
    let socket = crate::daemon::socket_path(args.socket.as_deref());
    let status_hint = format!("`sluice status --socket {}`", socket.display());
    match crate::daemon::Client::new(socket.clone()).detach_removing_fence(id) {
        Ok(Some(info)) => {
            let line = serde_json::to_string(&info)
                .context("cannot print the daemon's view of the VM")?;
            println!("{line}");
            let tap = info.vm.as_ref().map_or("?", |vm| vm.tap.as_str());
            eprintln!("sluice: released VM {id} and removed the fence of tap {tap}");
            Ok(0)
        }
        Ok(None) => Err(BadInput(anyhow::anyhow!(
            "the sluice daemon at {} serves no sandbox {id}: {status_hint} lists the ones it serves",
            socket.display()
        ))
        .into()),
        // As `sluice status` (exit 4): no daemon to ask.
        Err(ClientError::Connect { cause, .. }) => {
            Err(super::status::NoDaemon::new(socket.clone(), cause).into())
        }
        Err(err @ ClientError::Refused { status: 400..=499, .. }) => Err(BadInput(
            anyhow::Error::from(err).context(format!("the daemon did not detach {id}")),
        )
        .into()),
        Err(err) => Err(anyhow::Error::from(err).context(format!("the daemon did not detach {id}"))),
    }
}

impl GuestArgs {
    /// The guest's addressing; the wrapper fills in its defaults, attach
    /// has only what it is told (no IPv6 unless given).
    fn addressing(&self, tap: &str, defaults: bool) -> VmAddressing {
        let ip6 = match self.guest_ip6 {
            Some(ip6) => Some(ip6),
            None if defaults && !self.no_ipv6 => {
                Some(DEFAULT_GUEST_IP6.parse().expect("a valid default"))
            }
            None => None,
        };
        VmAddressing {
            tap: tap.to_string(),
            guest_mac: self.guest_mac.unwrap_or(DEFAULT_GUEST_MAC),
            guest_ip: self
                .guest_ip
                .unwrap_or_else(|| DEFAULT_GUEST_IP.parse().expect("a valid default")),
            gateway: self.gateway,
            guest_ip6: ip6,
            gateway6: self.gateway6,
        }
    }
}

fn vm_net(tap: &str, guest: &GuestArgs, defaults: bool) -> anyhow::Result<VmNet> {
    guest
        .addressing(tap, defaults)
        .net()
        .map_err(|e| BadInput(anyhow::Error::from(e).context("bad VM addressing")).into())
}

/// --id (checked as clap parsed it), else `vm-<sluice's pid>`.
fn sandbox_id(guest: &GuestArgs) -> SandboxId {
    guest
        .id
        .clone()
        .unwrap_or_else(|| SandboxId::numbered("vm", std::process::id()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn detach_args(args: &[&str]) -> Result<DetachArgs, clap::Error> {
        let argv = ["sluice", "vm", "detach"].iter().chain(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Vm(VmArgs {
                action: Some(VmAction::Detach(args)),
                ..
            }) => Ok(args),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn detach_through_the_daemon_takes_an_id_and_a_socket() {
        let args = detach_args(&["--daemon", "--id", "vm-a", "--socket", "/s"]).unwrap();
        assert!(args.daemon);
        assert_eq!(args.id.as_ref().map(SandboxId::as_str), Some("vm-a"));
        assert_eq!(args.socket, Some(PathBuf::from("/s")));
        assert!(args.tap.is_none() && args.netns.is_none() && args.pid.is_none());
    }

    #[test]
    fn detach_through_the_daemon_needs_an_id() {
        assert!(detach_args(&["--daemon"]).is_err());
    }

    #[test]
    fn detach_through_the_daemon_refuses_a_tap_or_a_namespace() {
        for extra in [["--tap", "tap0"], ["--netns", "vm1"], ["--pid", "1"]] {
            let mut args = vec!["--daemon", "--id", "vm-a"];
            args.extend(extra);
            let err = detach_args(&args).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{extra:?}"
            );
        }
    }

    #[test]
    fn detach_of_a_tap_needs_the_tap_and_one_namespace() {
        let args = detach_args(&["--tap", "tap0", "--netns", "vm1"]).unwrap();
        assert_eq!(args.tap.as_deref(), Some("tap0"));
        assert!(!args.daemon);
        assert!(detach_args(&["--tap", "tap0", "--pid", "7"]).is_ok());
        assert!(detach_args(&["--tap", "tap0"]).is_err());
        assert!(detach_args(&["--netns", "vm1"]).is_err());
        assert!(detach_args(&["--tap", "tap0", "--netns", "vm1", "--pid", "7"]).is_err());
    }

    #[test]
    fn attach_takes_a_ca_file_but_not_through_the_daemon() {
        let attach = |extra: &[&str]| {
            let mut argv = vec![
                "sluice", "vm", "attach", "--policy", "p.yaml", "--tap", "tap0", "--netns", "vm1",
            ];
            argv.extend(extra);
            Cli::try_parse_from(argv).map(|cli| cli.command)
        };
        match attach(&["--ca-file", "/run/guest-ca.pem"]).unwrap() {
            Command::Vm(VmArgs {
                action: Some(VmAction::Attach(args)),
                ..
            }) => assert_eq!(args.ca_file, Some(PathBuf::from("/run/guest-ca.pem"))),
            other => panic!("parsed as {other:?}"),
        }
        let err = attach(&["--ca-file", "/run/guest-ca.pem", "--daemon"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    #[test]
    fn an_id_or_a_socket_without_the_daemon_is_refused() {
        assert!(detach_args(&["--tap", "tap0", "--netns", "vm1", "--id", "x"]).is_err());
        assert!(detach_args(&["--tap", "tap0", "--netns", "vm1", "--socket", "/s"]).is_err());
    }
}
