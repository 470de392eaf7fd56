//! The tap fence on a real tap, without a VM: a fresh namespace, a tap made
//! by `sluice::netns`, the fence applied and read back through libnftables,
//! and frames written into the tap's queue as a guest's NIC would write
//! them. Each refused frame must show in the counter of its reason, and a
//! tampered fence must fail the read-back. Needs root and nftables; skips
//! loudly without them (fails under SLUICE_REQUIRE_PRIVILEGED=1).

mod common;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use sluice::enforce::{self, DropReason, EnforceError, SandboxSpec, TapFence};
use sluice::mac::MacAddr;
use sluice::netns::{tap, SandboxNetns, TapOwner};
use sluice::probe::frame;

const TAP: &str = "fence0";

fn fence() -> TapFence {
    enforce::example_fence(TAP)
}

fn spec() -> SandboxSpec {
    SandboxSpec::vm(15001, 15053, fence())
}

/// A namespace with the tap (gateway addresses on it) and the fence applied
/// and verified; None when the test must skip.
fn fenced() -> Option<SandboxNetns> {
    if !common::privileged() {
        return None;
    }
    let ns = SandboxNetns::create().expect("namespace");
    let f = fence();
    let v6 = f.ipv6.unwrap();
    ns.create_tap(
        TAP,
        TapOwner { uid: 0, gid: 0 },
        &[(f.gateway.into(), 30), (v6.gateway.into(), 64)],
    )
    .expect("tap");
    ns.run_in(|| {
        enforce::apply(&spec())?;
        enforce::verify(&spec())
    })
    .unwrap()
    .expect("fence applied and read back");
    Some(ns)
}

fn counts(ns: &SandboxNetns) -> Vec<(DropReason, u64)> {
    ns.run_in(|| enforce::drop_counts(&spec()))
        .unwrap()
        .expect("drop counters")
}

fn count(ns: &SandboxNetns, reason: DropReason) -> u64 {
    counts(ns)
        .into_iter()
        .find(|(r, _)| *r == reason)
        .map_or(0, |(_, n)| n)
}

/// Writes `frames` into the tap as its guest would (the queue is a VMM's
/// end of the tap); the kernel has run them through the ingress hook when
/// each write returns.
fn as_guest(ns: &SandboxNetns, frames: Vec<Vec<u8>>) {
    ns.run_in(move || -> std::io::Result<()> {
        let mut queue = tap::open_queue(TAP)?;
        for f in frames {
            queue.write_all(&f)?;
        }
        Ok(())
    })
    .unwrap()
    .expect("write frames into the tap");
}

/// Writes `frames` into the tap as its guest would, then reads what the
/// kernel sends back out of the tap until a frame satisfies `wanted` or
/// `deadline` passes; returns whether one did.
fn as_guest_until(
    ns: &SandboxNetns,
    frames: Vec<Vec<u8>>,
    wanted: fn(&[u8]) -> bool,
    deadline: std::time::Duration,
) -> bool {
    ns.run_in(move || -> std::io::Result<bool> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::io::Read;
        use std::os::fd::AsFd;
        let mut queue = tap::open_queue(TAP)?;
        // The kernel can send on the tap once it has seen the carrier that
        // opening the queue brings (until then its answers are discarded).
        let up = common::eventually(deadline, || {
            Command::new("ip")
                .args(["-o", "link", "show", TAP])
                .output()
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("state UP"))
        });
        assert!(up, "{TAP} never came up");
        for f in frames {
            queue.write_all(&f)?;
        }
        let end = std::time::Instant::now() + deadline;
        let mut buf = vec![0u8; 65536];
        loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(queue.as_fd(), PollFlags::POLLIN)];
            if poll(&mut fds, PollTimeout::from(ms))? == 0 {
                continue;
            }
            let n = queue.read(&mut buf)?;
            if wanted(&buf[..n]) {
                return Ok(true);
            }
        }
    })
    .unwrap()
    .expect("write frames into the tap and read its answers")
}

/// Whether `frame` is the gateway's ARP reply to the guest.
fn arp_reply_from_the_gateway(frame: &[u8]) -> bool {
    let f = fence();
    frame.len() >= 42
        && frame[12..14] == frame::ETH_P_ARP.to_be_bytes()
        && frame[20..22] == 2u16.to_be_bytes()
        && frame[28..32] == f.gateway.octets()
        && frame[38..42] == f.guest.octets()
}

fn nft_in(ns: &SandboxNetns, args: &'static [&'static str]) {
    let ok = ns
        .run_in(move || Command::new("nft").args(args).status())
        .unwrap()
        .unwrap()
        .success();
    assert!(ok, "nft {args:?} failed");
}

fn guest_mac() -> MacAddr {
    fence().guest_mac
}

fn udp_from(mac: MacAddr, src: Ipv4Addr) -> Vec<u8> {
    let dst = fence().gateway;
    let datagram = frame::udp(src.into(), dst.into(), 40000, 9, b"x");
    frame::ethernet(
        MacAddr::BROADCAST,
        mac,
        frame::ETH_P_IP,
        &frame::ipv4(src, dst, 17, &datagram),
    )
}

#[test]
fn a_frame_from_another_mac_is_dropped_and_counted_as_mac() {
    let Some(ns) = fenced() else { return };
    let before = count(&ns, DropReason::Mac);
    as_guest(
        &ns,
        vec![udp_from(MacAddr([2, 0, 0, 0, 0, 0x66]), fence().guest)],
    );
    assert_eq!(count(&ns, DropReason::Mac), before + 1);
}

#[test]
fn ipv4_from_a_spoofed_source_is_counted_as_ipv4_source() {
    let Some(ns) = fenced() else { return };
    as_guest(
        &ns,
        vec![udp_from(guest_mac(), Ipv4Addr::new(198, 18, 0, 2))],
    );
    assert_eq!(count(&ns, DropReason::Ipv4Source), 1);
}

#[test]
fn a_gratuitous_arp_for_the_gateway_is_counted_as_arp_and_one_for_it_is_not() {
    let Some(ns) = fenced() else { return };
    let f = fence();
    let unknown = MacAddr([0; 6]);
    as_guest(
        &ns,
        vec![
            frame::arp(
                f.guest_mac,
                1,
                (f.guest_mac, f.gateway),
                (unknown, f.gateway),
            ),
            frame::arp(f.guest_mac, 1, (f.guest_mac, f.guest), (unknown, f.gateway)),
        ],
    );
    assert_eq!(count(&ns, DropReason::Arp), 1);
}

#[test]
fn an_arp_request_for_an_address_other_than_the_gateway_is_counted_as_arp() {
    let Some(ns) = fenced() else { return };
    let f = fence();
    let unknown = MacAddr([0; 6]);
    let elsewhere = Ipv4Addr::new(198, 19, 254, 3);
    let before = count(&ns, DropReason::Arp);
    // The canary after it, an ARP request for the gateway, gets through:
    // the gateway answers it.
    let answered = as_guest_until(
        &ns,
        vec![
            frame::arp(f.guest_mac, 1, (f.guest_mac, f.guest), (unknown, elsewhere)),
            frame::arp(f.guest_mac, 1, (f.guest_mac, f.guest), (unknown, f.gateway)),
        ],
        arp_reply_from_the_gateway,
        std::time::Duration::from_secs(10),
    );
    assert!(
        answered,
        "the gateway never answered the ARP request for it"
    );
    assert_eq!(count(&ns, DropReason::Arp), before + 1);
}

#[test]
fn router_messages_from_the_guest_are_counted_as_ipv6_router() {
    let Some(ns) = fenced() else { return };
    let f = fence();
    let ll = f.guest_link_local();
    let gw6 = f.ipv6.unwrap().gateway;
    as_guest(
        &ns,
        vec![
            frame::router_advertisement(f.guest_mac, ll),
            frame::redirect(f.guest_mac, MacAddr::BROADCAST, ll, gw6, ll, gw6),
            frame::dhcpv6_advertise(f.guest_mac, ll),
        ],
    );
    assert_eq!(count(&ns, DropReason::Ipv6Router), 3);
}

#[test]
fn vlan_tags_and_other_ethertypes_are_counted_apart() {
    let Some(ns) = fenced() else { return };
    let tagged = frame::vlan_tagged(&udp_from(guest_mac(), fence().guest), 7);
    let other = frame::ethernet(
        MacAddr::BROADCAST,
        guest_mac(),
        frame::ETH_P_EXPERIMENTAL,
        b"x",
    );
    as_guest(&ns, vec![tagged, other]);
    assert_eq!(count(&ns, DropReason::Vlan), 1);
    assert_eq!(count(&ns, DropReason::Ethertype), 1);
}

#[test]
fn ipv6_from_a_spoofed_source_is_counted_as_ipv6_source() {
    let Some(ns) = fenced() else { return };
    let src = "2001:db8::66".parse().unwrap();
    let dst = fence().ipv6.unwrap().gateway;
    let datagram = frame::udp(IpAddr::V6(src), IpAddr::V6(dst), 40000, 9, b"x");
    as_guest(
        &ns,
        vec![frame::ethernet(
            MacAddr::BROADCAST,
            guest_mac(),
            frame::ETH_P_IPV6,
            &frame::ipv6(src, dst, 17, 64, &datagram),
        )],
    );
    assert_eq!(count(&ns, DropReason::Ipv6Source), 1);
}

#[test]
fn the_guests_own_udp_past_layer_two_is_counted_as_not_redirected() {
    let Some(ns) = fenced() else { return };
    as_guest(&ns, vec![udp_from(guest_mac(), fence().guest)]);
    assert_eq!(count(&ns, DropReason::NotRedirected), 1);
    assert_eq!(count(&ns, DropReason::Ipv4Source), 0);
}

#[test]
fn a_fence_whose_ingress_policy_was_changed_fails_the_read_back() {
    let Some(ns) = fenced() else { return };
    nft_in(
        &ns,
        &[
            "chain",
            "netdev",
            "sluice-fence0",
            "ingress",
            "{ policy accept; }",
        ],
    );
    let err = ns.run_in(|| enforce::verify(&spec())).unwrap().unwrap_err();
    assert!(matches!(err, EnforceError::Mismatch(_)), "{err}");
    assert!(err.to_string().contains("chain ingress"), "{err}");
}

#[test]
fn a_rule_added_to_the_fence_fails_the_read_back() {
    let Some(ns) = fenced() else { return };
    nft_in(
        &ns,
        &[
            "insert",
            "rule",
            "inet",
            "sluice-fence0",
            "prerouting_filter",
            "accept",
        ],
    );
    let err = ns.run_in(|| enforce::verify(&spec())).unwrap().unwrap_err();
    assert!(err.to_string().contains("prerouting_filter"), "{err}");
}

#[test]
fn a_foreign_table_in_the_vmms_own_namespace_fails_the_read_back() {
    let Some(ns) = fenced() else { return };
    nft_in(&ns, &["add", "table", "ip", "intruder"]);
    let err = ns.run_in(|| enforce::verify(&spec())).unwrap().unwrap_err();
    assert!(err.to_string().contains("ip intruder"), "{err}");
}

#[test]
fn a_fence_rebound_to_another_device_fails_the_read_back() {
    let Some(ns) = fenced() else { return };
    ns.run_in(|| {
        let out = Command::new("ip")
            .args(["tuntap", "add", "dev", "other0", "mode", "tap"])
            .status()
            .unwrap();
        assert!(out.success());
    })
    .unwrap();
    // The same table and chain, bound to other0: what a tamperer recreating
    // it would leave.
    let mut moved = fence();
    moved.name = "other0".into();
    let table = fence().table();
    let text = format!(
        "delete chain netdev {table} ingress\nadd chain netdev {table} ingress {{ type filter hook ingress device \"other0\" priority -500; policy drop; }}\n"
    );
    let ok = ns
        .run_in(move || {
            let mut child = Command::new("nft")
                .args(["-f", "-"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            child.wait().unwrap().success()
        })
        .unwrap();
    assert!(ok);
    let err = ns.run_in(|| enforce::verify(&spec())).unwrap().unwrap_err();
    assert!(err.to_string().contains("ingress"), "{err}");
}

#[test]
fn an_attached_fence_ignores_the_namespaces_other_tables_and_removal_takes_only_its_own() {
    let Some(ns) = fenced() else { return };
    let mut shared = fence();
    shared.dedicated = false;
    let spec = SandboxSpec::vm(15001, 15053, shared);
    let s = spec.clone();
    ns.run_in(move || enforce::apply(&s)).unwrap().unwrap();
    nft_in(&ns, &["add", "table", "ip", "hosts-own"]);
    let s = spec.clone();
    ns.run_in(move || enforce::verify(&s)).unwrap().unwrap();
    let s = spec.clone();
    ns.run_in(move || enforce::remove(&s)).unwrap().unwrap();
    let listed = ns
        .run_in(|| {
            Command::new("nft")
                .args(["list", "tables"])
                .output()
                .unwrap()
        })
        .unwrap();
    let tables = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(tables.contains("ip hosts-own"), "{tables}");
    assert!(!tables.contains("sluice-fence0"), "{tables}");
    // Removing what is not there is no error.
    ns.run_in(move || enforce::remove(&spec)).unwrap().unwrap();
}

#[test]
fn the_tap_is_owned_by_the_vmms_user_and_hardened() {
    if !common::privileged() {
        return;
    }
    let ns = SandboxNetns::create().expect("namespace");
    ns.create_tap(
        TAP,
        TapOwner {
            uid: 65534,
            gid: 65534,
        },
        &[(Ipv4Addr::new(198, 19, 254, 1).into(), 30)],
    )
    .expect("tap");
    let read = |path: &'static str| {
        ns.run_in(move || std::fs::read_to_string(path).unwrap().trim().to_string())
            .unwrap()
    };
    // /sys shows the namespace it was mounted in, so ask the kernel instead.
    let details = ns
        .run_in(|| {
            let out = Command::new("ip")
                .args(["-d", "link", "show", TAP])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .unwrap();
    assert!(details.contains("type tap"), "{details}");
    assert!(details.contains("persist on"), "{details}");
    assert!(details.contains("user nobody group nogroup"), "{details}");
    assert!(details.contains("addrgenmode none"), "{details}");
    assert_eq!(read("/proc/sys/net/ipv4/conf/fence0/forwarding"), "0");
    assert_eq!(read("/proc/sys/net/ipv4/conf/fence0/rp_filter"), "1");
    assert_eq!(read("/proc/sys/net/ipv6/conf/fence0/accept_ra"), "0");
    assert_eq!(read("/proc/sys/net/ipv6/conf/fence0/forwarding"), "0");
}

#[test]
fn adopting_a_tap_adds_only_the_missing_gateway_and_removes_only_that() {
    if !common::privileged() {
        return;
    }
    let ns = SandboxNetns::create().expect("namespace");
    ns.run_in(|| {
        let ok = Command::new("sh")
            .args([
                "-c",
                // The tap as its maker left it, open in every way sluice
                // closes.
                "ip tuntap add dev fence0 mode tap && ip addr add 198.19.254.1/30 dev fence0 \\
                 && for k in ipv4/conf/fence0/forwarding ipv4/conf/fence0/accept_redirects \\
                    ipv6/conf/fence0/forwarding ipv6/conf/fence0/accept_ra \\
                    ipv6/conf/fence0/accept_redirects; do echo 1 > /proc/sys/net/$k; done \\
                 && echo 0 > /proc/sys/net/ipv4/conf/fence0/rp_filter",
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    })
    .unwrap();
    let gw6: IpAddr = "2001:db8:5c:fffe::1".parse().unwrap();
    let added = ns
        .adopt_tap(
            TAP,
            &[(Ipv4Addr::new(198, 19, 254, 1).into(), 30), (gw6, 64)],
        )
        .expect("adopt");
    assert_eq!(added, vec![(gw6, 64)]);
    let read = |path: &'static str| {
        ns.run_in(move || std::fs::read_to_string(path).unwrap().trim().to_string())
            .unwrap()
    };
    // Hardened as a tap sluice makes (src/netns/tap.rs harden_sysctls).
    for (path, want) in [
        ("/proc/sys/net/ipv4/conf/fence0/forwarding", "0"),
        ("/proc/sys/net/ipv4/conf/fence0/rp_filter", "1"),
        ("/proc/sys/net/ipv4/conf/fence0/accept_redirects", "0"),
        ("/proc/sys/net/ipv6/conf/fence0/forwarding", "0"),
        ("/proc/sys/net/ipv6/conf/fence0/accept_ra", "0"),
        ("/proc/sys/net/ipv6/conf/fence0/accept_redirects", "0"),
    ] {
        assert_eq!(read(path), want, "{path}");
    }
    ns.remove_tap_addresses(TAP, &added).unwrap();
    let addrs = ns
        .run_in(|| {
            let out = Command::new("ip")
                .args(["-br", "addr", "show", "fence0"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .unwrap();
    assert!(addrs.contains("198.19.254.1/30"), "{addrs}");
    assert!(!addrs.contains("2001:db8:5c:fffe::1"), "{addrs}");
    assert!(matches!(
        ns.adopt_tap("nosuch0", &[]),
        Err(sluice::netns::NetnsError::NoSuchTap { .. })
    ));
    assert!(matches!(
        ns.adopt_tap("sbx0", &[]),
        Err(sluice::netns::NetnsError::NotATap { .. })
    ));
}
