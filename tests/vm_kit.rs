//! The microVM guest kit and its harness on a plain tap (no sluice in the
//! path yet): a guest boots in a throwaway namespace, and one boot runs many
//! checks through the control port. The DHCP responder answering the guest
//! is sluice's own (`sluice::dhcp`). Needs root and qemu; skips loudly
//! without them, fails under SLUICE_REQUIRE_PRIVILEGED=1.

#[path = "common/vm.rs"]
mod vm;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use sha2::Digest;
use sluice::dhcp::GuestLease;
use sluice::mac::MacAddr;
use sluice::testbed::{pattern, OuterNetns};
use vm::{add_tap, FrameCapture, GuestNet, Kit, Vm, VmSpec};

const TAP: &str = "tap0";
const GUEST_MAC: &str = "52:54:00:5c:00:02";
const GATEWAY: &str = "198.18.0.1";
const GUEST: &str = "198.18.0.2/30";
const GATEWAY6: &str = "2001:db8::1";
const GUEST6: &str = "2001:db8::2/64";
const ETH_P_ARP: u16 = 0x0806;

/// A throwaway namespace with a tap (198.18.0.1/30, 2001:db8::1/64) and an
/// HTTP origin on the tap's addresses, port 8080.
fn tap_world() -> Option<(Kit, OuterNetns)> {
    let kit = Kit::get()?;
    let ns = OuterNetns::create("sluice-vmkit", &[]).expect("test namespace");
    add_tap(ns.name(), TAP, &["198.18.0.1/30", "2001:db8::1/64"]).expect("tap");
    ns.http_origin(format!("{GATEWAY}:8080").parse().unwrap())
        .expect("origin v4");
    ns.http_origin(format!("[{GATEWAY6}]:8080").parse().unwrap())
        .expect("origin v6");
    Some((kit, ns))
}

/// sluice's DHCP responder on the tap, for as long as the runtime lives.
fn dhcp_responder(ns: &OuterNetns) -> tokio::runtime::Runtime {
    let socket = ns
        .run_in(|| sluice::dhcp::bind_on_device(TAP))
        .expect("enter namespace")
        .expect("DHCP socket on the tap");
    let lease = GuestLease::new(
        MacAddr::parse_guest(GUEST_MAC).unwrap(),
        GUEST.parse().unwrap(),
        GATEWAY.parse().unwrap(),
        3600,
    )
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.spawn(async move {
        let socket = tokio::net::UdpSocket::from_std(socket).expect("tokio socket");
        sluice::dhcp::serve(socket, lease).await
    });
    runtime
}

fn static_spec(ns: &OuterNetns) -> VmSpec {
    VmSpec::new(
        Some(ns.path()),
        TAP,
        GUEST_MAC,
        GuestNet::Static {
            ip: GUEST.into(),
            gateway: GATEWAY.into(),
            ip6: Some(GUEST6.into()),
            gateway6: Some(GATEWAY6.into()),
        },
    )
}

/// A packet socket on the tap, opened just before a check so that its
/// buffer holds only what follows (a full one drops new frames).
fn tap_capture(ns: &OuterNetns) -> FrameCapture {
    ns.run_in(|| FrameCapture::open_here(TAP))
        .unwrap()
        .expect("packet socket on the tap")
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// An ARP frame from `mac` whose sender protocol address is `ip`.
fn is_arp_from(frame: &[u8], mac: [u8; 6], ip: Ipv4Addr) -> bool {
    frame.len() >= 42
        && frame[6..12] == mac
        && u16::from_be_bytes([frame[12], frame[13]]) == ETH_P_ARP
        && frame[22..28] == mac
        && frame[28..32] == ip.octets()
}

#[test]
fn one_boot_fetches_leases_and_sends_raw_frames_on_a_plain_tap() {
    let Some((kit, ns)) = tap_world() else { return };
    let _dhcp = dhcp_responder(&ns);
    let mut vm = Vm::boot(&kit, &static_spec(&ns)).expect("boot");
    assert!(vm.ready.contains("addr=198.18.0.2/30"), "{}", vm.ready);

    // 1 MiB from the host side of the tap, hashed in the guest.
    let body = pattern(1 << 20);
    let out = vm
        .check("sluice probe http http://198.18.0.1:8080/bytes/1048576")
        .unwrap();
    assert!(
        out.contains(&format!(
            "HTTP 200 1048576 bytes sha256={}",
            sha256_hex(&body)
        )),
        "{out}"
    );

    // IPv6 the same way, on the static address and route.
    let out = vm
        .check("sluice probe http http://[2001:db8::1]:8080/bytes/4096")
        .unwrap();
    assert!(
        out.contains(&format!(
            "HTTP 200 4096 bytes sha256={}",
            sha256_hex(&pattern(4096))
        )),
        "{out}"
    );

    // A lease from sluice's responder, applied by the guest's udhcpc hook.
    let out = vm
        .check("udhcpc -i eth0 -f -q -n -t 5 -T 1 -s /etc/udhcpc.script")
        .unwrap();
    assert!(
        out.contains(
            "DHCP-LEASE 198.18.0.2/30 router 198.18.0.1 dns 198.18.0.1 lease 3600 server 198.18.0.1"
        ),
        "{out}"
    );
    let out = vm.check("cat /etc/resolv.conf; ip route").unwrap();
    assert!(out.contains("nameserver 198.18.0.1"), "{out}");
    assert!(out.contains("default via 198.18.0.1"), "{out}");
    let out = vm
        .check("sluice probe http http://198.18.0.1:8080/")
        .unwrap();
    assert!(out.contains("HTTP 200"), "{out}");

    // Root in the guest sends what an attacker would: a gratuitous ARP
    // claiming the gateway's address, seen on the host side of the tap.
    let guest_mac = MacAddr::parse_guest(GUEST_MAC).unwrap().octets();
    let capture = tap_capture(&ns);
    vm.check(
        "ip addr add 198.18.0.1/32 dev eth0 && arping -U -c 1 -I eth0 -s 198.18.0.1 198.18.0.1; \
         st=$?; ip addr del 198.18.0.1/32 dev eth0; exit $st",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    capture
        .wait_for(deadline, |f| {
            is_arp_from(f, guest_mac, GATEWAY.parse().unwrap())
        })
        .expect("the gratuitous ARP reached the tap");

    // ... and a frame from a MAC that is not its own.
    let spoofed = [0x02, 0, 0, 0, 0, 0x66];
    let capture = tap_capture(&ns);
    vm.check(
        "ip link set eth0 address 02:00:00:00:00:66 && arping -c 1 -w 1 -I eth0 198.18.0.1; \
         ip link set eth0 address 52:54:00:5c:00:02",
    )
    .unwrap();
    capture
        .wait_for(Instant::now() + Duration::from_secs(10), |f| {
            is_arp_from(f, spoofed, "198.18.0.2".parse().unwrap())
        })
        .expect("the spoofed-MAC frame reached the tap");

    // The exit status comes back as it was.
    let ran = vm.run("exit 7").unwrap();
    assert_eq!(ran.status, 7);

    // Dropping the Vm kills and reaps QEMU: nothing is left in the namespace.
    drop(vm);
    let pids = std::process::Command::new("ip")
        .args(["netns", "pids", ns.name()])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&pids.stdout).trim(), "");
}

#[test]
fn a_guest_booted_for_dhcp_gets_its_address_from_sluices_responder() {
    let Some((kit, ns)) = tap_world() else { return };
    let _dhcp = dhcp_responder(&ns);
    let spec = VmSpec::new(Some(ns.path()), TAP, GUEST_MAC, GuestNet::Dhcp);
    let mut vm = Vm::boot(&kit, &spec).expect("boot");
    assert!(vm.ready.contains("net=dhcp"), "{}", vm.ready);
    assert!(vm.ready.contains("addr=198.18.0.2/30"), "{}", vm.ready);
    let out = vm
        .check("sluice probe http http://198.18.0.1:8080/")
        .unwrap();
    assert!(out.contains("HTTP 200"), "{out}");
}

/// Every fresh boot answers its first request; the times are reported, not
/// asserted. One boot in the suite; for the 10-boot measurement:
///   SLUICE_BOOT_RUNS=10 cargo test --test vm_kit -- --nocapture boot_to_first_reply
/// prints the time from starting QEMU to the guest's ready line and to its
/// first HTTP reply from the host side of the tap.
#[test]
fn boot_to_first_reply_of_each_fresh_boot() {
    let Some((kit, ns)) = tap_world() else { return };
    let runs: usize = std::env::var("SLUICE_BOOT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let mut ready = Vec::new();
    let mut first_reply = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let mut vm = Vm::boot(&kit, &static_spec(&ns)).expect("boot");
        let out = vm
            .check("sluice probe http http://198.18.0.1:8080/")
            .unwrap();
        assert!(out.contains("HTTP 200"), "{out}");
        first_reply.push(started.elapsed());
        ready.push(vm.boot_time);
    }
    let summary = |v: &mut Vec<Duration>| {
        v.sort();
        let n = v.len();
        let median = if n % 2 == 0 {
            v[n / 2 - 1].saturating_add(v[n / 2]) / 2
        } else {
            v[n / 2]
        };
        format!("median {median:?} (min {:?}, max {:?})", v[0], v[n - 1])
    };
    println!(
        "boots: {runs}; to ready: {}; to first HTTP reply: {}",
        summary(&mut ready),
        summary(&mut first_reply)
    );
}

/// A CA and a server certificate for `name`, signed by it: (CA PEM, rustls
/// server config).
fn tls_server_config(name: &str) -> (String, std::sync::Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sluice vm test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    (ca_cert.pem(), std::sync::Arc::new(config))
}

/// HTTPS on `listener`: every request gets "200 OK" and "hello over tls".
fn serve_tls(listener: std::net::TcpListener, config: std::sync::Arc<rustls::ServerConfig>) {
    use std::io::{Read, Write};
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let config = config.clone();
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(conn, stream);
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = "hello over tls\n";
                let _ = write!(
                    tls,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
}

/// A DNS server that answers every A query with 198.18.0.1.
fn serve_dns(socket: std::net::UdpSocket) {
    use hickory_proto::op::{Message, MessageType};
    use hickory_proto::rr::{rdata::A, RData, Record};
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut answer = query.clone();
            answer.metadata.message_type = MessageType::Response;
            for q in &query.queries {
                answer.answers.push(Record::from_rdata(
                    q.name().clone(),
                    60,
                    RData::A(A(Ipv4Addr::new(198, 18, 0, 1))),
                ));
            }
            if let Ok(bytes) = answer.to_vec() {
                let _ = socket.send_to(&bytes, from);
            }
        }
    });
}

/// An ICMP echo request from `mac` to `to`.
fn is_echo_request(frame: &[u8], mac: [u8; 6], to: Ipv4Addr) -> bool {
    frame.len() >= 42
        && frame[6..12] == mac
        && frame[12..14] == [0x08, 0x00]
        && frame[23] == 1 // ICMP
        && frame[30..34] == to.octets()
        && frame[34] == 8 // echo request
}

#[test]
fn the_static_probe_speaks_tls_tcp_udp_icmp_and_dns_from_the_guest() {
    use std::io::{Read, Write};
    let Some((kit, ns)) = tap_world() else { return };
    let (ca_pem, tls) = tls_server_config("origin.test");
    serve_tls(
        ns.run_in(|| std::net::TcpListener::bind("198.18.0.1:8443"))
            .unwrap()
            .unwrap(),
        tls,
    );
    let echo = ns
        .run_in(|| std::net::TcpListener::bind("198.18.0.1:7000"))
        .unwrap()
        .unwrap();
    std::thread::spawn(move || {
        for mut stream in echo.incoming().flatten() {
            let mut got = Vec::new();
            let _ = stream.read_to_end(&mut got);
            let _ = stream.write_all(b"echo:");
            let _ = stream.write_all(&got);
        }
    });
    serve_dns(
        ns.run_in(|| std::net::UdpSocket::bind("198.18.0.1:53"))
            .unwrap()
            .unwrap(),
    );
    let udp = ns
        .run_in(|| std::net::UdpSocket::bind("198.18.0.1:9999"))
        .unwrap()
        .unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut vm = Vm::boot(&kit, &static_spec(&ns)).expect("boot");

    // The CA goes in line by line (a guest command is one line).
    let lines: Vec<String> = ca_pem.lines().map(|l| format!("'{l}'")).collect();
    vm.check(&format!("printf '%s\\n' {} > /tmp/ca.pem", lines.join(" ")))
        .unwrap();
    let out = vm
        .check("sluice probe tls 198.18.0.1:8443 --sni origin.test --ca /tmp/ca.pem")
        .unwrap();
    assert!(out.contains("TLS origin.test HTTP/1.1 200 OK"), "{out}");

    let out = vm
        .check("sluice probe tcp 198.18.0.1:7000 --send ping")
        .unwrap();
    assert!(out.contains("echo:ping"), "{out}");

    let out = vm.check("sluice probe dns origin.test").unwrap();
    assert!(
        out.starts_with("DNS origin.test A ") && out.trim_end().ends_with(" 198.18.0.1"),
        "{out}"
    );

    vm.check("sluice probe udp 198.18.0.1:9999").unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = udp.recv_from(&mut buf).expect("the datagram arrived");
    assert_eq!(&buf[..n], b"sluice-probe");
    assert_eq!(from.ip().to_string(), "198.18.0.2");

    let capture = tap_capture(&ns);
    vm.check("sluice probe icmp 198.18.0.1").unwrap();
    let guest_mac = MacAddr::parse_guest(GUEST_MAC).unwrap().octets();
    capture
        .wait_for(Instant::now() + Duration::from_secs(10), |f| {
            is_echo_request(f, guest_mac, GATEWAY.parse().unwrap())
        })
        .expect("the echo request reached the tap");
}
