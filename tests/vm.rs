//! `sluice vm` and `sluice vm attach` end to end, with real QEMU microVMs
//! and a root guest (tests/common/vm.rs): what the policy allows works,
//! everything else reaches nothing, a hostile guest's frames are dropped and
//! counted, and nothing is left behind. One boot serves many checks; the
//! boots of this file take turns (at most one VM of this file at a time).
//! Needs root and qemu; skips loudly without them, fails under
//! SLUICE_REQUIRE_PRIVILEGED=1.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::daemon::Daemon;
use common::vm::{add_tap, GuestNet, Kit, Vm, VmSpec};
use common::*;
use sha2::Digest;

/// sluice vm's defaults, which the guest is configured for.
const TAP: &str = "tap0";
const MAC: &str = "52:54:00:5c:fe:02";
const GUEST: &str = "198.19.254.2/30";
const GATEWAY: &str = "198.19.254.1";
const GUEST6: &str = "2001:db8:5c:fffe::2/64";
const GATEWAY6: &str = "2001:db8:5c:fffe::1";
const METRICS: &str = "127.0.0.1:9464";

const POLICY: &str = r#"
version: 1
name: vm-e2e
rules:
  - name: origin
    action: allow
    cidrs: ["198.18.0.1/32", "2001:db8::1/128"]
    ports: [8080]
  - name: names
    action: allow
    hosts: ["origin.test", "api.tls.test"]
    ports: [8080, 8443]
dns:
  upstream: []
  hosts:
    origin.test: ["198.18.0.1"]
    api.tls.test: ["198.18.0.1"]
"#;

/// The boots of this file take turns.
static ONE_VM: Mutex<()> = Mutex::new(());

fn one_vm() -> std::sync::MutexGuard<'static, ()> {
    ONE_VM.lock().unwrap_or_else(|e| e.into_inner())
}

fn static_net() -> GuestNet {
    GuestNet::Static {
        ip: GUEST.into(),
        gateway: GATEWAY.into(),
        ip6: Some(GUEST6.into()),
        gateway6: Some(GATEWAY6.into()),
    }
}

/// A VM booted under `sluice vm` in the world's outer namespace, as
/// sandbox `id`, with metrics on [`METRICS`] there.
fn wrapped_spec(w: &World, policy: &Path, id: &str, net: GuestNet) -> VmSpec {
    let mut spec = VmSpec::new(Some(w.outer.path()), TAP, MAC, net);
    spec.lifetime = Duration::from_secs(300);
    spec.wrapper = [
        sluice_bin().into(),
        "-v".into(),
        "vm".into(),
        "--policy".into(),
        policy.as_os_str().to_owned(),
        "--audit".into(),
        w.audit_path().into_os_string(),
        "--state-dir".into(),
        w.state_dir().into_os_string(),
        "--timings".into(),
        timings_path(w).into_os_string(),
        "--metrics".into(),
        METRICS.into(),
        "--id".into(),
        id.into(),
        "--".into(),
    ]
    .to_vec();
    spec
}

/// Where [`wrapped_spec`]'s sluice writes its timing records.
fn timings_path(w: &World) -> PathBuf {
    w.dir.path().join("timings.jsonl")
}

fn world_and_kit() -> Option<(World, Kit)> {
    let w = World::new()?;
    let kit = Kit::get()?;
    Some((w, kit))
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// Write a file into the guest (one command line per file line).
fn put_file(vm: &mut Vm, path: &str, text: &str) {
    let lines: Vec<String> = text.lines().map(|l| format!("'{l}'")).collect();
    vm.check(&format!("printf '%s\\n' {} > {path}", lines.join(" ")))
        .unwrap();
}

/// `sluice_dropped_packets_total{sandbox=id,reason}` as last exported.
fn dropped(w: &World, id: &str, reason: &str) -> f64 {
    w.http_get_outer(METRICS, "/metrics")
        .and_then(|text| {
            metric_value(
                &text,
                "sluice_dropped_packets_total",
                &[
                    &format!("sandbox=\"{id}\""),
                    &format!("reason=\"{reason}\""),
                ],
            )
        })
        .unwrap_or(0.0)
}

/// Waits until the exported count of `reason` exceeds `before`.
fn wait_counted(w: &World, id: &str, reason: &str, before: f64) -> f64 {
    let mut now = before;
    let counted = eventually(Duration::from_secs(20), || {
        now = dropped(w, id, reason);
        now > before
    });
    assert!(counted, "no drop counted as {reason} (still {now})");
    now
}

/// Every origin the guest checks below talk to, served in the world's
/// namespace.
struct Origins {
    /// Requests 198.18.0.1:8082 (a denied port) got.
    denied_port: Arc<AtomicU64>,
    /// Datagrams 198.18.0.1:9999 (a UDP sink) got.
    udp: Arc<AtomicU64>,
    /// The CA of the TLS origin api.tls.test at 198.18.0.1:8443.
    ca: PathBuf,
}

fn origins(w: &World) -> Origins {
    w.http_origin("198.18.0.1:8080");
    w.http_origin("[2001:db8::1]:8080");
    w.echo_origin("198.18.0.2:7000");
    Origins {
        denied_port: w.http_origin("198.18.0.1:8082"),
        udp: w.udp_sink("198.18.0.1:9999"),
        ca: w.tls_origin("198.18.0.1:8443", &["api.tls.test"]),
    }
}

#[test]
fn a_guest_under_sluice_vm_fetches_what_the_policy_allows_by_address_name_tls_and_ipv6() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    let o = origins(&w);
    let policy = w.policy(POLICY);
    let mut vm =
        Vm::boot(&kit, &wrapped_spec(&w, &policy, "vm-allow", static_net())).expect("boot");
    fetches_what_the_policy_allows(&o, &mut vm);
}

/// A 1 MiB fetch by address (SHA-256 checked), a name resolved through
/// sluice, an SNI-allowed TLS connection, a fetch over IPv6.
fn fetches_what_the_policy_allows(o: &Origins, vm: &mut Vm) {
    let out = vm
        .check("sluice probe http http://198.18.0.1:8080/bytes/1048576")
        .unwrap();
    let want = format!(
        "HTTP 200 1048576 bytes sha256={}",
        sha256_hex(&pattern(1 << 20))
    );
    assert!(out.contains(&want), "{out}");

    // The guest's resolver is the gateway: sluice answers.
    let out = vm.check("cat /etc/resolv.conf").unwrap();
    assert!(out.contains(&format!("nameserver {GATEWAY}")), "{out}");
    let out = vm.check("sluice probe dns origin.test").unwrap();
    assert!(out.contains("198.18.0.1"), "{out}");
    let out = vm
        .check("sluice probe http http://origin.test:8080/")
        .unwrap();
    assert!(out.contains("HTTP 200"), "{out}");

    put_file(vm, "/tmp/ca.pem", &std::fs::read_to_string(&o.ca).unwrap());
    let out = vm
        .check("sluice probe tls api.tls.test:8443 --ca /tmp/ca.pem")
        .unwrap();
    assert!(out.contains("TLS api.tls.test HTTP/1.1 200 OK"), "{out}");

    let out = vm
        .check("sluice probe http http://[2001:db8::1]:8080/bytes/4096")
        .unwrap();
    let want = format!("HTTP 200 4096 bytes sha256={}", sha256_hex(&pattern(4096)));
    assert!(out.contains(&want), "{out}");
}

#[test]
fn a_guest_under_sluice_vm_reaches_no_denied_port_address_gateway_port_or_metadata_address() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    let o = origins(&w);
    let policy = w.policy(POLICY);
    let mut vm = Vm::boot(&kit, &wrapped_spec(&w, &policy, "vm-deny", static_net())).expect("boot");
    reaches_no_denied_port_address_gateway_port_or_metadata_address(&w, &o, &mut vm, "vm-deny");
}

/// A denied port (403, the origin untouched), a denied address, the
/// gateway's other ports and 169.254.169.254 refused, a denied name
/// REFUSED; each refusal audited, timed and counted as VM `id`'s.
fn reaches_no_denied_port_address_gateway_port_or_metadata_address(
    w: &World,
    o: &Origins,
    vm: &mut Vm,
    id: &str,
) {
    let ran = vm
        .run("sluice probe http --body http://198.18.0.1:8082/")
        .unwrap();
    assert_eq!(ran.status, 1, "{}", ran.output);
    assert!(ran.output.contains("HTTP 403"), "{}", ran.output);
    assert_eq!(o.denied_port.load(Ordering::Relaxed), 0);

    for target in [
        "198.18.0.2:7000",
        "[2001:db8::2]:7000",
        &format!("{GATEWAY}:22"),
        &format!("{GATEWAY}:15001"),
        &format!("[{GATEWAY6}]:22"),
        "169.254.169.254:80",
    ] {
        let ran = vm
            .run(&format!("sluice probe tcp {target} --send hi"))
            .unwrap();
        assert_eq!(ran.status, 1, "{target}: {}", ran.output);
        assert!(!ran.output.contains("echo:"), "{target}: {}", ran.output);
    }

    let ran = vm.run("sluice probe dns example.com").unwrap();
    assert_eq!(ran.status, 1, "{}", ran.output);
    assert!(ran.output.contains("Refused"), "{}", ran.output);

    // Every refusal is audited as this VM's: path vm, its id.
    let audit = w.audit();
    let denies: Vec<_> = audit.iter().filter(|r| r["verdict"] == "deny").collect();
    assert!(denies.len() >= 3, "{audit:?}");
    for record in &denies {
        assert_eq!(record["path"], "vm", "{record}");
        assert_eq!(record["sandbox"], id, "{record}");
    }
    for dst in ["198.18.0.1:8082", "198.18.0.2:7000", "169.254.169.254:80"] {
        assert!(denies.iter().any(|r| r["dst"] == dst), "{dst}: {audit:?}");
    }

    // So is each connection's timing record, and the metrics count them
    // under path vm.
    let mut timings = Vec::new();
    let written = eventually(Duration::from_secs(20), || {
        timings = sluice::timing::read_file(&timings_path(w)).unwrap_or_default();
        timings.len() >= 3
    });
    assert!(written, "{timings:?}");
    for record in &timings {
        assert_eq!(record.path, "vm", "{record:?}");
        assert_eq!(record.sandbox, id, "{record:?}");
    }
    let metrics = w.http_get_outer(METRICS, "/metrics").expect("/metrics");
    let denied = metric_value(
        &metrics,
        "sluice_connections_total",
        &["path=\"vm\"", "verdict=\"deny\""],
    );
    assert!(denied.is_some_and(|n| n >= 3.0), "{metrics}");
}

#[test]
fn udp_icmp_and_raw_ip_from_a_guest_under_sluice_vm_are_dropped_and_counted() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    let o = origins(&w);
    let policy = w.policy(POLICY);
    let id = "vm-proto";
    let mut vm = Vm::boot(&kit, &wrapped_spec(&w, &policy, id, static_net())).expect("boot");
    drops_and_counts_udp_icmp_and_raw_ip(&w, &o, &mut vm, id);
}

/// UDP, ICMP and raw IP (v4 and v6) counted as not redirected, and the UDP
/// sink got only the canary sent after them.
fn drops_and_counts_udp_icmp_and_raw_ip(w: &World, o: &Origins, vm: &mut Vm, id: &str) {
    let mut seen = dropped(w, id, "not-redirected");
    for probe in [
        "sluice probe udp 198.18.0.1:9999",
        "sluice probe udp [2001:db8::1]:9999",
        "sluice probe icmp 198.18.0.1",
        "sluice probe icmp 2001:db8::1",
        "sluice probe frame ip --src 198.19.254.2 --dst 198.18.0.1",
    ] {
        // The send itself succeeds in the guest: the fence drops it.
        let _ = vm.run(probe).unwrap();
        seen = wait_counted(w, id, "not-redirected", seen);
    }
    // The sink got nothing before the canary sent after the probes.
    w.udp_canary("198.18.0.1:9999");
    assert_eq!(wait_for_count(&o.udp, 1), 1);
}

#[test]
fn spoofed_addresses_macs_arp_and_router_advertisements_from_a_guest_are_dropped_and_counted() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    origins(&w);
    let policy = w.policy(POLICY);
    let id = "vm-spoof";
    let mut vm = Vm::boot(&kit, &wrapped_spec(&w, &policy, id, static_net())).expect("boot");
    drops_and_counts_spoofed_frames(&w, &mut vm, id);
}

/// Spoofed IPv4 and IPv6 sources, a spoofed MAC, a gratuitous ARP for the
/// gateway, an ARP for another address, a router advertisement and a VLAN
/// tag, each counted under its reason; the guest itself still gets through.
fn drops_and_counts_spoofed_frames(w: &World, vm: &mut Vm, id: &str) {
    for (frame, reason) in [
        ("udp --src 198.18.0.9 --dst 198.18.0.1", "ipv4-source"),
        (
            "udp --src-mac 02:00:00:00:00:66 --src 198.19.254.2 --dst 198.18.0.1",
            "mac",
        ),
        ("arp --src 198.19.254.1 --dst 198.19.254.1", "arp"),
        ("arp --src 198.19.254.2 --dst 198.19.254.3", "arp"),
        ("ra", "ipv6-router"),
        ("udp --src 2001:db8::66 --dst 2001:db8::1", "ipv6-source"),
        ("udp --vlan 7 --src 198.19.254.2 --dst 198.18.0.1", "vlan"),
    ] {
        let before = dropped(w, id, reason);
        vm.check(&format!("sluice probe frame {frame}")).unwrap();
        wait_counted(w, id, reason, before);
    }
    // The guest itself still gets through.
    let out = vm
        .check("sluice probe http http://198.18.0.1:8080/")
        .unwrap();
    assert!(out.contains("HTTP 200"), "{out}");
}

#[test]
fn a_guest_booted_for_dhcp_under_sluice_vm_gets_its_lease_and_its_ipv6_prefix_from_sluice_and_fetches(
) {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    w.http_origin("198.18.0.1:8080");
    w.http_origin("[2001:db8::1]:8080");
    let policy = w.policy(POLICY);
    let id = "vm-dhcp";
    let mut vm = Vm::boot(&kit, &wrapped_spec(&w, &policy, id, GuestNet::Dhcp)).expect("boot");
    assert!(vm.ready.contains(&format!("addr={GUEST}")), "{}", vm.ready);
    let out = vm.check("cat /etc/resolv.conf; ip route").unwrap();
    assert!(out.contains(&format!("nameserver {GATEWAY}")), "{out}");
    assert!(out.contains(&format!("default via {GATEWAY}")), "{out}");
    let out = vm
        .check("sluice probe http http://origin.test:8080/")
        .unwrap();
    assert!(out.contains("HTTP 200"), "{out}");
    gets_its_ipv6_prefix_and_router_from_sluice_and_fetches(&mut vm);
    // The guest's own router advertisements are still dropped.
    let before = dropped(&w, id, "ipv6-router");
    vm.check("sluice probe frame ra").unwrap();
    wait_counted(&w, id, "ipv6-router", before);
}

/// The SLAAC address the kit's guest (MAC [`MAC`]) forms in [`GUEST6`]'s /64.
const GUEST6_SLAAC: &str = "2001:db8:5c:fffe:5054:ff:fe5c:fe02";

/// Waits in the guest (at most 30 s) until the shell condition `cond` holds.
fn wait_in_guest(vm: &mut Vm, cond: &str) -> String {
    let ran = vm
        .run_for(
            &format!("i=0; until {cond}; do i=$((i+1)); [ $i -lt 300 ] || exit 1; sleep 0.1; done"),
            Duration::from_secs(40),
        )
        .unwrap();
    assert!(ran.ok(), "never: {cond}: {}", ran.output);
    ran.output
}

/// A guest told nothing about IPv6 (no address, route or kernel argument
/// for it) gets its address by SLAAC from sluice's router advertisement,
/// sluice's link-local address as its default router, and fetches from the
/// allowed IPv6 origin.
fn gets_its_ipv6_prefix_and_router_from_sluice_and_fetches(vm: &mut Vm) {
    let cmdline = vm.check("cat /proc/cmdline").unwrap();
    assert!(!cmdline.contains("ip6"), "{cmdline}");
    wait_in_guest(
        vm,
        &format!("ip -6 addr show dev eth0 | grep -q '{GUEST6_SLAAC}/64'"),
    );
    wait_in_guest(vm, "ip -6 route | grep -q 'default via fe80::1 dev eth0'");
    let out = vm
        .check("sluice probe http http://[2001:db8::1]:8080/bytes/4096")
        .unwrap();
    let want = format!("HTTP 200 4096 bytes sha256={}", sha256_hex(&pattern(4096)));
    assert!(out.contains(&want), "{out}");
}

/// The namespace sluice logged for its sandbox, once the log is complete.
fn sandbox_inode(console: &str) -> u64 {
    logged_netns_inode(console).expect("sluice logged its namespace")
}

#[test]
fn when_the_vmm_exits_sluice_vm_exits_with_its_status_and_leaves_nothing() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    let policy = w.policy(POLICY);
    let mut vm = Vm::boot(&kit, &wrapped_spec(&w, &policy, "vm-exit", static_net())).expect("boot");
    let inode = sandbox_inode(&vm.console());
    // The guest reboots: QEMU exits 0 (-no-reboot), and so does sluice.
    let _ = vm.run_for("reboot -f", Duration::from_secs(5));
    let status = vm.wait_exit(Duration::from_secs(60)).unwrap();
    assert_eq!(status.code(), Some(0), "{}", vm.console());
    assert!(processes_in_netns(inode).is_empty());
}

#[test]
fn sigkill_of_sluice_vm_takes_the_vmm_and_its_namespace_with_it() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    let policy = w.policy(POLICY);
    let mut vm = Vm::boot(&kit, &wrapped_spec(&w, &policy, "vm-kill", static_net())).expect("boot");
    let inode = sandbox_inode(&vm.console());
    // timeout (vm.pid()) runs sluice as its only child.
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", vm.pid())).unwrap();
    let sluice: i32 = children.split_whitespace().next().unwrap().parse().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sluice),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The guest's control port closes: QEMU died with sluice.
    assert!(vm.run("true").is_err());
    let _ = vm.wait_exit(Duration::from_secs(60));
    assert!(eventually(Duration::from_secs(20), || processes_in_netns(
        inode
    )
    .is_empty()));
}

#[test]
fn the_vmm_is_told_its_tap_and_guest_and_its_exit_status_passes_through() {
    let Some(w) = World::new() else { return };
    let policy = w.policy(POLICY);
    let out = w
        .outer
        .command(sluice_bin())
        .args(["vm", "--policy"])
        .arg(&policy)
        .args(["--state-dir"])
        .arg(w.state_dir())
        .args(["--tap", "vmtap", "--user", "65534", "--"])
        .args([
            "sh",
            "-c",
            "env | grep ^SLUICE_ | sort; ip link show \"$SLUICE_TAP\" && exit 7",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(|child| wait_bounded(child, Duration::from_secs(60)))
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(7), "{text}\n{}", stderr(&out));
    for line in [
        "SLUICE_TAP=vmtap",
        "SLUICE_GUEST_MAC=52:54:00:5c:fe:02",
        "SLUICE_GUEST_IP=198.19.254.2/30",
        "SLUICE_GATEWAY=198.19.254.1",
        "SLUICE_GUEST_IP6=2001:db8:5c:fffe::2/64",
        "SLUICE_GATEWAY6=2001:db8:5c:fffe::1",
        "SLUICE_KERNEL_IP_ARG=ip=198.19.254.2::198.19.254.1:255.255.255.252::eth0:off:198.19.254.1",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line}: {text}");
    }
}

/// `sluice vm` in the world's namespace with `options`, then `-- VMM...`;
/// waits (bounded) for it.
fn sluice_vm(w: &World, options: &[&std::ffi::OsStr], vmm: &[&str]) -> std::process::Output {
    w.outer
        .command(sluice_bin())
        .arg("vm")
        .args(options)
        .arg("--state-dir")
        .arg(w.state_dir())
        .arg("--")
        .args(vmm)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(|child| wait_bounded(child, Duration::from_secs(60)))
        .unwrap()
}

#[test]
fn the_vmm_is_confined_like_a_sluice_run_workload_and_its_own_egress_goes_through_sluice() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    w.echo_origin("198.18.0.2:7000");
    let policy = w.policy(POLICY);
    let script = format!(
        "echo pidns=$(readlink /proc/self/ns/pid); \
         grep -E '^(Seccomp|CapBnd):' /proc/self/status; \
         nft flush ruleset && echo FLUSHED; \
         {bin} probe tcp 198.18.0.2:7000 --send hi; \
         {bin} probe http http://198.18.0.1:8080/",
        bin = sluice_bin()
    );
    let out = sluice_vm(
        &w,
        &["--policy".as_ref(), policy.as_ref()],
        &["sh", "-c", &script],
    );
    let text = stdout(&out);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .to_string()
    };
    let ours = std::fs::read_link("/proc/self/ns/pid").unwrap();
    assert_ne!(field("pidns="), ours.to_string_lossy(), "{text}");
    assert_eq!(field("Seccomp:"), "2", "{text}");
    let bounding = u64::from_str_radix(&field("CapBnd:"), 16).unwrap();
    // NET_ADMIN, NET_RAW, SYS_MODULE, SYS_PTRACE, SYS_ADMIN.
    for cap in [12, 13, 16, 19, 21] {
        assert_eq!(bounding & (1 << cap), 0, "capability {cap} kept: {text}");
    }
    assert!(!text.contains("FLUSHED"), "{text}");
    assert!(!text.contains("echo:"), "{text}");
    // The last command's status is sluice vm's: the allowed fetch worked.
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("HTTP 200"), "{text}");
}

#[test]
fn sluice_vm_runs_the_vmm_on_a_verified_bundle_and_refuses_a_bundle_without_trust() {
    let Some(w) = World::new() else { return };
    let (bundle, trust) = signed_bundle(w.dir.path(), POLICY, 1);
    let out = sluice_vm(
        &w,
        &[
            "--bundle".as_ref(),
            bundle.as_ref(),
            "--trust".as_ref(),
            trust.as_ref(),
        ],
        &["sh", "-c", "exit 7"],
    );
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));

    let marker = w.dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let out = sluice_vm(
        &w,
        &["--bundle".as_ref(), bundle.as_ref()],
        &["sh", "-c", &touch],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--trust"), "{}", stderr(&out));
    assert!(!marker.exists());
}

/// The secret the TLS tests' policy injects; no guest or VMM ever holds it.
const SECRET: &str = "vm-s3cret-value-0451";
/// The injecting origin (a real rustls server, tests/common/l7.rs).
const L7_ORIGIN: &str = "198.18.0.1:443";

/// The TLS tests' world: the injecting origin up (its CA returned), the
/// secret written, the policy.
fn l7_setup(w: &World) -> (PathBuf, std::sync::Arc<common::l7::Requests>, PathBuf) {
    let (origin_ca, seen) = common::l7::keepalive_origin(w, L7_ORIGIN, &["api.github.test"]);
    let secret_file = w.dir.path().join("gh-token");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let policy = w.policy(&common::l7::injecting_policy(&secret_file, &["/"]));
    (origin_ca, seen, policy)
}

/// Certificates in a PEM text.
fn certificates(pem: &str) -> usize {
    pem.matches("-----BEGIN CERTIFICATE-----").count()
}

#[test]
fn the_vmm_of_a_policy_that_terminates_tls_gets_a_ca_bundle_it_can_read_but_not_write_removed_after(
) {
    let Some(w) = World::new() else { return };
    let (_, _, policy) = l7_setup(&w);
    // As nobody: the file's mode lets it read; and the bind keeps even a
    // root VMM from writing (checked apart below).
    let script = "echo file=$SLUICE_CA_FILE; echo certs=$(grep -c 'BEGIN CERTIFICATE' \"$SLUICE_CA_FILE\"); \
                  (echo junk >> \"$SLUICE_CA_FILE\") 2>/dev/null && echo WROTE-AS-USER; \
                  rm -f \"$SLUICE_CA_FILE\" 2>/dev/null; test -e \"$SLUICE_CA_FILE\" && echo STILL-THERE";
    let out = sluice_vm(
        &w,
        &[
            "--policy".as_ref(),
            policy.as_ref(),
            "--user".as_ref(),
            "65534".as_ref(),
        ],
        &["sh", "-c", script],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("file="))
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| panic!("no SLUICE_CA_FILE: {text}"));
    // The system roots and one more: the sandbox CA.
    let system = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    let want = format!("certs={}", certificates(&system) + 1);
    assert!(text.lines().any(|l| l == want), "{want}: {text}");
    assert!(!text.contains("WROTE-AS-USER"), "{text}");
    assert!(text.contains("STILL-THERE"), "{text}");
    assert!(
        !Path::new(path).exists(),
        "{path} left behind after sluice vm exited"
    );

    let script = "(echo junk >> \"$SLUICE_CA_FILE\") 2>/dev/null && echo WROTE-AS-ROOT; \
                  grep -c junk \"$SLUICE_CA_FILE\"";
    let out = sluice_vm(
        &w,
        &["--policy".as_ref(), policy.as_ref()],
        &["sh", "-c", script],
    );
    let text = stdout(&out);
    assert!(!text.contains("WROTE-AS-ROOT"), "{text}\n{}", stderr(&out));
    assert_eq!(text.trim(), "0", "{text}\n{}", stderr(&out));
}

#[test]
fn without_a_rule_that_terminates_tls_the_vmm_gets_no_sluice_ca_file() {
    let Some(w) = World::new() else { return };
    let policy = w.policy(POLICY);
    let out = sluice_vm(
        &w,
        &["--policy".as_ref(), policy.as_ref()],
        &["sh", "-c", "env | grep ^SLUICE_"],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    // The run is meaningful: the VMM got its other variables.
    assert!(text.contains("SLUICE_TAP="), "{text}");
    assert!(!text.contains("SLUICE_CA_FILE"), "{text}");
}

#[test]
fn the_vmm_can_read_neither_a_secrets_file_nor_a_secret_from_sluices_environment() {
    let Some(w) = World::new() else { return };
    let (_, _, policy) = l7_setup(&w);
    // And a secret sluice reads from its own environment.
    let yaml = std::fs::read_to_string(&policy).unwrap().replace(
        "secrets:\n",
        "secrets:\n  - name: from-env\n    env: SLUICE_TEST_VM_SECRET\n",
    );
    let policy = w.policy(&yaml);
    let secret_file = w.dir.path().join("gh-token");
    let script = format!(
        "cat {} 2>&1; echo env=$SLUICE_TEST_VM_SECRET; echo ran",
        secret_file.display()
    );
    let out = w
        .outer
        .command(sluice_bin())
        .env("SLUICE_TEST_VM_SECRET", "vm-env-secret-0452")
        .arg("vm")
        .arg("--policy")
        .arg(&policy)
        .arg("--state-dir")
        .arg(w.state_dir())
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(|child| wait_bounded(child, Duration::from_secs(60)))
        .unwrap();
    let text = stdout(&out);
    assert!(text.contains("ran"), "{text}\n{}", stderr(&out));
    assert!(!text.contains(SECRET), "{text}");
    assert!(text.lines().any(|l| l == "env="), "{text}");
    assert!(!text.contains("vm-env-secret-0452"), "{text}");
}

/// The guest builder's step, as a VMM script: the kit's initramfs plus a
/// second (gzipped) cpio archive with $SLUICE_CA_FILE as the guest's
/// trust store, then QEMU on that. Linux unpacks concatenated archives.
const CA_INTO_INITRD: &str = r#"set -e
kit=$1 initrd=$2 work=$3; shift 3
mkdir -p "$work/root/etc/ssl/certs"
cp "$SLUICE_CA_FILE" "$work/root/etc/ssl/certs/ca-certificates.crt"
(cd "$work/root" && find etc | busybox cpio -o -H newc 2>/dev/null) | gzip -c > "$work/ca.cpio.gz"
cat "$kit" "$work/ca.cpio.gz" > "$initrd"
exec "$@""#;

#[test]
fn a_guest_that_trusts_sluice_ca_file_gets_its_request_to_the_origin_with_a_credential_it_never_held(
) {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    let (origin_ca, seen, policy) = l7_setup(&w);
    let work = w.dir.path().join("guest-ca");
    std::fs::create_dir(&work).unwrap();
    // QEMU boots the initramfs the script makes.
    let with_ca = Kit {
        kernel: kit.kernel.clone(),
        initrd: work.join("initrd-with-ca.gz"),
    };
    let mut spec = wrapped_spec(&w, &policy, "vm-l7", static_net());
    let dashes = spec.wrapper.pop();
    assert_eq!(dashes.as_deref(), Some("--".as_ref()));
    spec.wrapper.extend([
        "--upstream-ca".into(),
        origin_ca.into_os_string(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        CA_INTO_INITRD.into(),
        "sh".into(),
        kit.initrd.clone().into_os_string(),
        with_ca.initrd.clone().into_os_string(),
        work.clone().into_os_string(),
    ]);
    let mut vm = Vm::boot(&with_ca, &spec).expect("boot");

    // The kit's own guest has no trust store: this one is the bundle, the
    // host's roots and the sandbox CA.
    let out = vm
        .check("grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt")
        .unwrap();
    let system = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    assert_eq!(out.trim(), (certificates(&system) + 1).to_string(), "{out}");
    let out = vm
        .check("sluice probe tls api.github.test:443 --ca /etc/ssl/certs/ca-certificates.crt")
        .unwrap();
    assert!(out.contains("TLS api.github.test HTTP/1.1 200 OK"), "{out}");

    let requests = seen.all();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(
        requests[0].header("authorization").as_deref(),
        Some(format!("Bearer {SECRET}").as_str()),
        "{requests:?}"
    );
    // Nothing in the guest holds the secret: not its files, not its
    // kernel command line, not its environment.
    let ran = vm
        .run(&format!(
            "grep -rl {SECRET} /etc /init /root /tmp /proc/cmdline /proc/1/environ 2>/dev/null; echo done"
        ))
        .unwrap();
    assert_eq!(ran.output.trim(), "done", "{}", ran.output);
}

#[test]
fn bad_vm_addressing_is_refused_with_exit_2_before_anything_runs() {
    let Some(w) = World::new() else { return };
    let policy = w.policy(POLICY);
    let marker = w.dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    for bad in [
        &["--guest-ip", "198.19.254.2/32"][..],
        &["--guest-ip", "198.19.254.2/30", "--gateway", "198.18.0.1"],
        &["--guest-mac", "01:00:5e:00:00:01"],
        &["--id", "no spaces"],
    ] {
        let out = w
            .outer
            .command(sluice_bin())
            .args(["vm", "--policy"])
            .arg(&policy)
            .args(bad)
            .args(["--", "sh", "-c", &touch])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        assert!(!marker.exists());
    }
}

/// `sluice vm attach` in the world's namespace for tap [`TAP`] in `netns`;
/// returns once it serves.
fn attach(w: &World, policy: &Path, netns: &Path, id: &str) -> Child {
    attach_with(w, policy, netns, id, &[])
}

/// [`attach`] with more `options` (before `--tap`).
fn attach_with(w: &World, policy: &Path, netns: &Path, id: &str, options: &[&str]) -> Child {
    attach_logged(w, policy, netns, id, options).0
}

/// [`attach_with`], and what it writes to stderr (all of it once it exited).
fn attach_logged(
    w: &World,
    policy: &Path,
    netns: &Path,
    id: &str,
    options: &[&str],
) -> (Child, Arc<Mutex<String>>) {
    let mut child = w
        .outer
        .command(sluice_bin())
        .args(["-v", "vm", "attach", "--policy"])
        .arg(policy)
        .arg("--audit")
        .arg(w.audit_path())
        .arg("--state-dir")
        .arg(w.state_dir())
        .args(options)
        .args(["--tap", TAP, "--netns"])
        .arg(netns)
        .args([
            "--guest-mac",
            MAC,
            "--guest-ip",
            GUEST,
            "--guest-ip6",
            GUEST6,
        ])
        .args(["--id", id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice vm attach");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let log = Arc::new(Mutex::new(String::new()));
    let written = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut log = written.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
            if line.contains("serving the tap") {
                let _ = tx.send(Ok(()));
            }
        }
        let _ = tx.send(Err(written.lock().unwrap().clone()));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(())) => (child, log),
        other => {
            let _ = child.kill();
            panic!("sluice vm attach did not start serving: {other:?}")
        }
    }
}

fn tables_in(netns: &Path) -> String {
    common::daemon::nft_tables(netns).join("\n")
}

/// `sluice vm detach` of TAP in `netns` succeeds and leaves neither table.
fn detach_removes_the_fence(w: &World, netns: &Path) {
    let out = w
        .outer
        .command(sluice_bin())
        .args(["vm", "detach", "--tap", TAP, "--netns"])
        .arg(netns)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let tables = tables_in(netns);
    assert!(!tables.contains("sluice-tap0"), "{tables}");
}

#[test]
fn an_attached_tap_serves_its_guest_and_stays_closed_after_sluice_stops_until_detach() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    w.http_origin("198.18.0.1:8080");
    let hits = w.http_origin("198.18.0.1:8082");
    let policy = w.policy(POLICY);
    // The VMM's namespace and its tap, made by someone else: no address.
    let vmm = OuterNetns::create("sluice-vmm", &[]).expect("VMM namespace");
    add_tap(vmm.name(), TAP, &[]).expect("tap");
    let vmm_path: PathBuf = vmm.path();
    let mut sluice = attach(&w, &policy, &vmm_path, "vm-attached");
    let mut vm = Vm::boot(
        &kit,
        &VmSpec::new(Some(vmm_path.clone()), TAP, MAC, static_net()),
    )
    .expect("boot");

    let out = vm
        .check("sluice probe http http://origin.test:8080/bytes/65536")
        .unwrap();
    let want = format!(
        "HTTP 200 65536 bytes sha256={}",
        sha256_hex(&pattern(65536))
    );
    assert!(out.contains(&want), "{out}");
    let ran = vm.run("sluice probe http http://198.18.0.1:8082/").unwrap();
    assert!(ran.output.contains("HTTP 403"), "{}", ran.output);
    let deny = w
        .audit()
        .into_iter()
        .find(|r| r["verdict"] == "deny")
        .expect("the deny is audited");
    assert_eq!(deny["path"], "vm");
    assert_eq!(deny["sandbox"], "vm-attached");

    // Stopped, sluice leaves the fence: the guest reaches nothing.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sluice.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = sluice.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let tables = tables_in(&vmm_path);
    assert!(tables.contains("netdev sluice-tap0"), "{tables}");
    assert!(tables.contains("inet sluice-tap0"), "{tables}");
    let ran = vm.run("sluice probe http http://198.18.0.1:8080/").unwrap();
    assert_eq!(ran.status, 1, "{}", ran.output);
    assert_eq!(hits.load(Ordering::Relaxed), 0);
    // The gateway address it added is gone again.
    let addrs = std::process::Command::new("ip")
        .args(["-n", vmm.name(), "addr", "show", TAP])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&addrs.stdout).contains(GATEWAY));

    detach_removes_the_fence(&w, &vmm_path);
}

#[test]
fn a_sigkilled_attach_leaves_the_tap_fenced_and_closed_until_detach() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    let hits = w.http_origin("198.18.0.1:8080");
    let policy = w.policy(POLICY);
    let vmm = OuterNetns::create("sluice-vmk", &[]).expect("VMM namespace");
    add_tap(vmm.name(), TAP, &[]).expect("tap");
    let vmm_path: PathBuf = vmm.path();
    let mut sluice = attach(&w, &policy, &vmm_path, "vm-killed");
    let mut vm = Vm::boot(
        &kit,
        &VmSpec::new(Some(vmm_path.clone()), TAP, MAC, static_net()),
    )
    .expect("boot");
    let out = vm
        .check("sluice probe http http://198.18.0.1:8080/")
        .unwrap();
    assert!(out.contains("HTTP 200"), "{out}");
    let served = hits.load(Ordering::Relaxed);

    // Killed, sluice cleans nothing up: the fence stays, both tables.
    sluice.kill().unwrap();
    let status = sluice.wait().unwrap();
    assert!(!status.success());
    let tables = tables_in(&vmm_path);
    assert!(tables.contains("netdev sluice-tap0"), "{tables}");
    assert!(tables.contains("inet sluice-tap0"), "{tables}");
    let ran = vm.run("sluice probe http http://198.18.0.1:8080/").unwrap();
    assert_eq!(ran.status, 1, "{}", ran.output);
    // The origin's next request is the canary sent after the guest's.
    assert!(w.http_get_outer("198.18.0.1:8080", "/").is_some());
    assert_eq!(wait_for_count(&hits, served + 1), served + 1);

    detach_removes_the_fence(&w, &vmm_path);
}

#[test]
fn a_guest_on_an_attached_tap_passes_the_wrappers_checks_with_metrics_timings_and_ipv6() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    let o = origins(&w);
    let policy = w.policy(POLICY);
    let vmm = OuterNetns::create("sluice-vmc", &[]).expect("VMM namespace");
    add_tap(vmm.name(), TAP, &[]).expect("tap");
    let vmm_path: PathBuf = vmm.path();
    let timings = timings_path(&w);
    let id = "vm-checked";
    let mut sluice = attach_with(
        &w,
        &policy,
        &vmm_path,
        id,
        &["--metrics", METRICS, "--timings", timings.to_str().unwrap()],
    );
    let mut vm = Vm::boot(
        &kit,
        &VmSpec::new(Some(vmm_path.clone()), TAP, MAC, static_net()),
    )
    .expect("boot");
    fetches_what_the_policy_allows(&o, &mut vm);
    reaches_no_denied_port_address_gateway_port_or_metadata_address(&w, &o, &mut vm, id);
    drops_and_counts_udp_icmp_and_raw_ip(&w, &o, &mut vm, id);
    drops_and_counts_spoofed_frames(&w, &mut vm, id);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sluice.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(sluice.wait().unwrap().code(), Some(0));
}

#[test]
fn a_guest_booted_for_dhcp_on_an_attached_tap_gets_its_lease_and_its_ipv6_prefix_from_sluice_and_fetches(
) {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    w.http_origin("198.18.0.1:8080");
    w.http_origin("[2001:db8::1]:8080");
    let policy = w.policy(POLICY);
    let vmm = OuterNetns::create("sluice-vmd", &[]).expect("VMM namespace");
    add_tap(vmm.name(), TAP, &[]).expect("tap");
    let vmm_path: PathBuf = vmm.path();
    let mut sluice = attach(&w, &policy, &vmm_path, "vm-attached-dhcp");
    let mut vm = Vm::boot(
        &kit,
        &VmSpec::new(Some(vmm_path.clone()), TAP, MAC, GuestNet::Dhcp),
    )
    .expect("boot");
    assert!(vm.ready.contains(&format!("addr={GUEST}")), "{}", vm.ready);
    let out = vm.check("cat /etc/resolv.conf; ip route").unwrap();
    assert!(out.contains(&format!("nameserver {GATEWAY}")), "{out}");
    assert!(out.contains(&format!("default via {GATEWAY}")), "{out}");
    let out = vm
        .check("sluice probe http http://origin.test:8080/")
        .unwrap();
    assert!(out.contains("HTTP 200"), "{out}");
    gets_its_ipv6_prefix_and_router_from_sluice_and_fetches(&mut vm);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sluice.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(sluice.wait().unwrap().code(), Some(0));
    // Stopped, it took back the link-local address it added.
    let addrs = ip(&["-n", vmm.name(), "-6", "addr", "show", TAP]);
    assert!(!addrs.contains("fe80::1/64"), "{addrs}");
}

/// `ip ARGS`' output; panics unless it succeeds.
fn ip(args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "ip {args:?}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_proxied_ipv6_response_reaches_the_guest_at_once_when_its_neighbour_entry_is_gone() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    w.http_origin("[2001:db8::1]:8080");
    let policy = w.policy(POLICY);
    let vmm = OuterNetns::create("sluice-vmn", &[]).expect("VMM namespace");
    add_tap(vmm.name(), TAP, &[]).expect("tap");
    let vmm_path: PathBuf = vmm.path();
    let mut sluice = attach(&w, &policy, &vmm_path, "vm-neighbour");
    let mut vm = Vm::boot(
        &kit,
        &VmSpec::new(Some(vmm_path.clone()), TAP, MAC, static_net()),
    )
    .expect("boot");
    // The guest's entry for its gateway stays reachable once confirmed: it
    // sends no neighbour solicitation of its own from here on.
    vm.check("echo 3600000 > /proc/sys/net/ipv6/neigh/eth0/base_reachable_time_ms")
        .unwrap();
    let fetch = "sluice probe http http://[2001:db8::1]:8080/bytes/4096";
    let out = vm.check(fetch).unwrap();
    assert!(out.contains("HTTP 200 4096 bytes"), "{out}");

    // sluice pinned the guest's addresses at its MAC on the tap.
    let pinned = ip(&["-n", vmm.name(), "-6", "neigh", "show", "dev", TAP]);
    for addr in [
        "2001:db8:5c:fffe::2",
        GUEST6_SLAAC,
        "fe80::5054:ff:fe5c:fe02",
    ] {
        assert!(
            pinned.contains(&format!("{addr} lladdr {MAC} PERMANENT")),
            "{addr}: {pinned}"
        );
    }
    // Every entry the host side learnt is gone (as when it expires), and,
    // as in the root guest's run where the host side sent none, no
    // neighbour solicitation can leave it for the guest.
    let rules = w.dir.path().join("no-solicitations.nft");
    std::fs::write(
        &rules,
        format!(
            "table inet test-no-solicitations {{\n  chain out {{\n    type filter hook output priority 10; policy accept;\n    oifname \"{TAP}\" icmpv6 type nd-neighbor-solicit counter drop\n  }}\n}}\n"
        ),
    )
    .unwrap();
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", vmm.name(), "nft", "-f"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(out.status.success(), "nft: {}", stderr(&out));
    ip(&["-n", vmm.name(), "-6", "neigh", "flush", "dev", TAP]);

    // The next proxied response reaches the guest at once.
    let ran = vm.run_for(fetch, Duration::from_secs(5)).unwrap();
    assert!(
        ran.ok() && ran.output.contains("HTTP 200 4096 bytes"),
        "{}",
        ran.output
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sluice.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(sluice.wait().unwrap().code(), Some(0));
}

#[test]
fn a_foreground_attach_whose_tap_is_removed_exits_1_and_leaves_no_rule_for_it() {
    let Some(w) = World::new() else {
        return;
    };
    let policy = w.policy(POLICY);
    let vmm = OuterNetns::create("sluice-vmr", &[]).expect("VMM namespace");
    add_tap(vmm.name(), TAP, &[]).expect("tap");
    let vmm_path: PathBuf = vmm.path();
    let (sluice, log) = attach_logged(&w, &policy, &vmm_path, "vm-tap-removed", &[]);
    let tables = tables_in(&vmm_path);
    assert!(tables.contains("netdev sluice-tap0"), "{tables}");
    assert!(tables.contains("inet sluice-tap0"), "{tables}");

    ip(&["-n", vmm.name(), "link", "del", TAP]);
    let out = wait_bounded(sluice, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1), "{}", log.lock().unwrap());
    // Its stderr is read to the end on a thread of its own.
    eventually(Duration::from_secs(10), || {
        log.lock().unwrap().contains("exiting 1")
    });
    let log = log.lock().unwrap().clone();
    assert!(
        log.contains("the tap tap0 was removed") && log.contains("its fence is removed too"),
        "{log}"
    );
    let tables = tables_in(&vmm_path);
    assert!(!tables.contains("sluice-tap0"), "{tables}");
}

#[test]
fn attach_with_a_ca_file_writes_the_bundle_while_it_serves_and_removes_it_when_it_stops() {
    let Some(w) = World::new() else {
        return;
    };
    let (_, _, policy) = l7_setup(&w);
    let vmm = OuterNetns::create("sluice-vmca", &[]).expect("VMM namespace");
    add_tap(vmm.name(), TAP, &[]).expect("tap");
    let ca_file = w.dir.path().join("guest-ca.pem");
    let (sluice, log) = attach_logged(
        &w,
        &policy,
        &vmm.path(),
        "vm-ca-file",
        &["--ca-file", ca_file.to_str().unwrap()],
    );
    let bundle = std::fs::read_to_string(&ca_file).unwrap();
    let system = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    assert_eq!(certificates(&bundle), certificates(&system) + 1);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&ca_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o444);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sluice.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = wait_bounded(sluice, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", log.lock().unwrap());
    assert!(!ca_file.exists(), "the bundle outlived the attach");
}

/// A rule as broad as a user might write: every address, one port.
const BROAD_POLICY: &str = r#"
version: 1
name: vm-broad
rules:
  - name: anywhere
    action: allow
    cidrs: ["0.0.0.0/0", "::/0"]
    ports: [8099]
dns:
  upstream: []
"#;

/// Issue 32, item 1, for the VM kind.
#[test]
fn a_broad_rule_never_lets_a_guest_reach_the_loopback_of_sluices_side() {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    // A service on the loopback of the namespace the VMM's host side (and
    // sluice, whose upstream sockets are made there) runs in.
    let local = w.recording_origin("127.0.0.1:8099");
    let policy = w.policy(BROAD_POLICY);
    let id = "vm-loopback";
    let mut vm = Vm::boot(&kit, &wrapped_spec(&w, &policy, id, static_net())).expect("boot");
    // The gateway's MAC, for frames the guest's kernel would not send: its
    // route to 127.0.0.1 is its own lo, and an IPv4-mapped destination is
    // IPv4 to it.
    let gateway_mac = vm
        .check(&format!(
            "ping -c 1 -W 1 {GATEWAY} >/dev/null 2>&1; ip neigh show {GATEWAY} | awk '/lladdr/ {{print $5}}'"
        ))
        .unwrap();
    let gateway_mac = gateway_mac.trim();
    assert_eq!(gateway_mac.len(), 17, "{gateway_mac:?}");
    for (src, dst) in [
        ("198.19.254.2", "127.0.0.1"),
        ("2001:db8:5c:fffe::2", "::ffff:127.0.0.1"),
    ] {
        if src.contains(':') {
            // The guest's kernel takes an IPv6 packet from ::ffff:127.0.0.1
            // to an address it holds and resets the handshake before the
            // probe's ACK; without the address the SYN-ACK is not its own.
            // The fence still lets the source through (it is the guest's),
            // and the guest keeps its SLAAC address for the probe below.
            vm.check(&format!("ip -6 addr del {GUEST6} dev eth0"))
                .unwrap();
        }
        let ran = vm
            .run(&format!(
                "sluice probe frame tcp --src {src} --dst {dst} --port 8099 --dst-mac {gateway_mac}"
            ))
            .unwrap();
        assert!(
            ran.output.contains("handshake done"),
            "{dst}: {}",
            ran.output
        );
        // Refused by sluice (a 403, a close or a reset), not held open by
        // the service, which answers nothing.
        assert!(!ran.output.contains("no reply"), "{dst}: {}", ran.output);
    }
    // NAT64's well-known prefix embedding 127.0.0.1 is an ordinary IPv6
    // destination to the guest.
    let ran = vm
        .run("sluice probe http http://[64:ff9b::7f00:1]:8099/")
        .unwrap();
    assert_eq!(ran.status, 1, "{}", ran.output);
    assert!(!ran.output.contains("HTTP 200"), "{}", ran.output);

    // The service's next connection is the canary made after the guest's.
    w.outer
        .run_in(|| std::net::TcpStream::connect("127.0.0.1:8099").map(drop))
        .unwrap()
        .expect("canary");
    assert!(eventually(Duration::from_secs(20), || local.accepted() >= 1));
    assert_eq!(
        local.accepted(),
        1,
        "a guest's connection reached 127.0.0.1:8099"
    );

    // Each of the three attempts is audited as denied for what it is
    // (however the proxy writes the address).
    let audit = w.audit();
    let denied = audit
        .iter()
        .filter(|r| {
            r["verdict"] == "deny"
                && r["sandbox"] == id
                && r["dst"].as_str().is_some_and(|d| d.ends_with(":8099"))
                && r["reason"] == "loopback-address"
        })
        .count();
    assert!(
        denied >= 3,
        "{denied} of 3 denied as loopback-address: {audit:?}"
    );
}

/// A VMM namespace with a bare tap and a guest booted on it.
fn vm_on_bare_tap(kit: &Kit, prefix: &str, ip: &str, gateway: &str) -> (OuterNetns, Vm) {
    let ns = OuterNetns::create(prefix, &[]).expect("VMM namespace");
    add_tap(ns.name(), TAP, &[]).expect("tap");
    let net = GuestNet::Static {
        ip: ip.into(),
        gateway: gateway.into(),
        ip6: None,
        gateway6: None,
    };
    let vm = Vm::boot(kit, &VmSpec::new(Some(ns.path()), TAP, MAC, net)).expect("boot");
    (ns, vm)
}

#[test]
fn two_vms_through_one_daemon_get_their_own_policy_and_id_cannot_reach_each_other_and_are_adopted_after_a_restart(
) {
    let Some((w, kit)) = world_and_kit() else {
        return;
    };
    let _turn = one_vm();
    w.http_origin("198.18.0.1:8080");
    w.http_origin("198.18.0.1:8081");
    let policy = |name: &str, port: u16| {
        let path = w.dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!("version: 1\nname: {name}\nrules:\n  - name: origin\n    action: allow\n    cidrs: [\"198.18.0.1/32\"]\n    ports: [{port}]\n"),
        )
        .unwrap();
        path
    };
    let mut daemon = Daemon::start(&w);
    let (_ns_a, mut a) = vm_on_bare_tap(&kit, "sluice-vma", "198.19.254.2/30", "198.19.254.1");
    let (_ns_b, mut b) = vm_on_bare_tap(&kit, "sluice-vmb", "198.19.253.2/30", "198.19.253.1");
    for (vm, id, guest, policy) in [
        (&a, "vm-a", "198.19.254.2/30", policy("policy-a", 8080)),
        (&b, "vm-b", "198.19.253.2/30", policy("policy-b", 8081)),
    ] {
        let out = w
            .outer
            .command(sluice_bin())
            .args(["vm", "attach", "--daemon", "--socket"])
            .arg(&daemon.socket)
            .arg("--policy")
            .arg(&policy)
            .args(["--tap", TAP, "--pid", &vm.pid().to_string()])
            .args(["--guest-mac", MAC, "--guest-ip", guest, "--id", id])
            .output()
            .unwrap();
        assert!(out.status.success(), "{id}: {}", stderr(&out));
        assert!(stdout(&out).contains("\"path\":\"vm\""), "{}", stdout(&out));
    }

    assert!(a
        .check("sluice probe http http://198.18.0.1:8080/")
        .unwrap()
        .contains("HTTP 200"));
    let ran = a.run("sluice probe http http://198.18.0.1:8081/").unwrap();
    assert!(ran.output.contains("HTTP 403"), "{}", ran.output);
    assert!(b
        .check("sluice probe http http://198.18.0.1:8081/")
        .unwrap()
        .contains("HTTP 200"));
    let ran = b.run("sluice probe http http://198.18.0.1:8080/").unwrap();
    assert!(ran.output.contains("HTTP 403"), "{}", ran.output);
    // Each other's addresses are denied like any other.
    let ran = a.run("sluice probe tcp 198.19.253.2:22 --send hi").unwrap();
    assert_eq!(ran.status, 1, "{}", ran.output);
    let ran = b.run("sluice probe tcp 198.19.254.2:22 --send hi").unwrap();
    assert_eq!(ran.status, 1, "{}", ran.output);

    let denies: Vec<_> = audit_records(&daemon.audit)
        .into_iter()
        .filter(|r| r["verdict"] == "deny")
        .collect();
    for (id, dst) in [
        ("vm-a", "198.18.0.1:8081"),
        ("vm-a", "198.19.253.2:22"),
        ("vm-b", "198.18.0.1:8080"),
        ("vm-b", "198.19.254.2:22"),
    ] {
        assert!(
            denies
                .iter()
                .any(|r| r["sandbox"] == id && r["dst"] == dst && r["path"] == "vm"),
            "{id} {dst}: {denies:?}"
        );
    }

    let out = w
        .outer
        .command(sluice_bin())
        .args(["status", "--json", "--socket"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    for (id, guest, policy) in [
        ("vm-a", "198.19.254.2/30", "policy-a"),
        ("vm-b", "198.19.253.2/30", "policy-b"),
    ] {
        let vm = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .unwrap_or_else(|| panic!("{id} not listed: {listed}"));
        assert_eq!(vm["path"], "vm");
        assert_eq!(vm["policy"], policy);
        assert_eq!(vm["vm"]["tap"], TAP);
        assert_eq!(vm["vm"]["guest"], guest);
        // Its own fetch, and its two denies (the other policy's port and
        // the other VM's address); the fence's drops are counted.
        let counted = |key: &str| vm["connections"][key].as_u64().unwrap_or(0);
        assert!(counted("allowed") >= 1, "{vm}");
        assert!(counted("denied") >= 2, "{vm}");
        assert!(vm["dropped_packets"].is_u64(), "{vm}");
    }

    // A restarted daemon adopts them again (their VMMs still run).
    daemon.restart(&w);
    assert!(eventually(Duration::from_secs(30), || {
        a.run("sluice probe http http://198.18.0.1:8080/")
            .is_ok_and(|r| r.output.contains("HTTP 200"))
    }));
    let ran = a.run("sluice probe http http://198.18.0.1:8081/").unwrap();
    assert!(ran.output.contains("HTTP 403"), "{}", ran.output);
}
