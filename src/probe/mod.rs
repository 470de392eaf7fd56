//! `sluice probe`: a deliberately small network client that the demo and the
//! tests run inside a sandbox, so neither depends on curl, dig or ping being
//! installed. Each probe returns one line saying what happened, as `Ok` on
//! success and `Err` on failure; the command prints it. It is the
//! attacker's side of the tests: it must never be part of enforcement, and
//! nothing outside `cli` and the tests calls it.

#[allow(unsafe_code)]
pub mod frame;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};

use crate::testbed::load::{self, connect, TIMEOUT};

/// A probe's one line: `Ok` on success, `Err` (starting with FAIL or naming
/// what went wrong) otherwise.
pub(crate) type Outcome = Result<String, String>;

pub(crate) fn http(url: &str, print_body: bool) -> Outcome {
    let fetched = load::fetch(url)?;
    let (status, body) = (fetched.status, fetched.body.as_slice());
    if print_body {
        let _ = std::io::stdout().write_all(body);
    }
    let line = format!(
        "HTTP {status} {} bytes sha256={} {}",
        body.len(),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body)),
        String::from_utf8_lossy(&body[..body.len().min(120)]).trim()
    );
    if (200..300).contains(&status) {
        Ok(line)
    } else {
        Err(line)
    }
}

/// `count` fresh-connection GETs, `concurrency` at a time: latency summary.
pub(crate) fn http_many(
    url: &str,
    count: usize,
    concurrency: usize,
    timings: Option<&std::path::Path>,
    label: &str,
) -> Outcome {
    let concurrency = concurrency.clamp(1, count);
    let batch = load::fetch_many(url, count, concurrency)?;
    if let Some(path) = timings {
        load::write_timings(path, &batch.records(label))
            .map_err(|e| format!("FAIL write {}: {e}", path.display()))?;
    }
    let times = batch.totals_ms();
    let pick = |q: f64| {
        times
            .get(((times.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let failures = batch.failures;
    let line = format!(
        "HTTP x{count} ({concurrency} at a time): median {:.3} ms, p95 {:.3} ms, min {:.3} ms, failures {failures}",
        pick(0.5),
        pick(0.95),
        pick(0.0)
    );
    if failures == 0 {
        Ok(line)
    } else {
        Err(format!("FAIL {line}"))
    }
}

/// The CA file a TLS client trusts when not told: `$SSL_CERT_FILE`, else
/// the distribution's bundle (where sluice puts its sandbox CA for
/// containers and host commands alike).
pub(crate) fn default_ca_file() -> std::path::PathBuf {
    std::env::var_os("SSL_CERT_FILE")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| crate::intercept::roots::SYSTEM_BUNDLE.into())
}

pub(crate) fn tls(target: &str, sni: Option<&str>, ca: &std::path::Path) -> Outcome {
    use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    let name = sni.map(str::to_string).unwrap_or_else(|| {
        target
            .rsplit_once(':')
            .map(|(h, _)| h)
            .unwrap_or(target)
            .to_string()
    });
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca)
        .map_err(|e| format!("FAIL read CA {}: {e}", ca.display()))?;
    let certs = certs
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("FAIL parse CA {}: {e}", ca.display()))?;
    // A system bundle may hold a certificate rustls cannot use; the others
    // still count, as they would for any client.
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(format!("FAIL CA {}: no usable certificate", ca.display()));
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("FAIL tls config: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server_name =
        ServerName::try_from(name.clone()).map_err(|e| format!("FAIL name {name}: {e}"))?;
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), server_name)
        .map_err(|e| format!("FAIL tls: {e}"))?;
    let stream = connect(target)?;
    let mut tls = rustls::StreamOwned::new(conn, stream);
    let request = format!("GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .map_err(|e| format!("FAIL tls handshake/send: {e}"))?;
    let mut response = Vec::new();
    match tls.read_to_end(&mut response) {
        Ok(_) => {}
        // Servers that close without close_notify still gave us the answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
        Err(e) => return Err(format!("FAIL tls read: {e}")),
    }
    let first = String::from_utf8_lossy(&response);
    let status_line = first.lines().next().unwrap_or("").to_string();
    if status_line.contains(" 200 ") {
        Ok(format!("TLS {name} {status_line}"))
    } else {
        Err(format!("FAIL TLS {name}: {status_line}"))
    }
}

pub(crate) fn tcp(target: &str, send: &str, server_first: bool) -> Outcome {
    let mut stream = connect(target)?;
    if !send.is_empty() {
        stream
            .write_all(send.as_bytes())
            .map_err(|e| format!("FAIL send: {e}"))?;
    }
    if !server_first {
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
    let mut back = Vec::new();
    match stream.read_to_end(&mut back) {
        Ok(_) => Ok(format!(
            "TCP {target} ok: {}",
            String::from_utf8_lossy(&back).trim()
        )),
        Err(e) => Err(format!("FAIL read {target}: {e}")),
    }
}

pub(crate) fn serve(addr: SocketAddr) -> Outcome {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|e| format!("FAIL bind {addr}: {e}"))?;
    eprintln!("serving HTTP on {addr}");
    crate::testbed::origin::serve_http_forever(listener);
    Ok(format!("stopped serving {addr}"))
}

pub(crate) fn udp(target: SocketAddr) -> Outcome {
    let bind: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let socket = UdpSocket::bind(bind).map_err(|e| format!("FAIL bind: {e}"))?;
    match socket.send_to(b"sluice-probe", target) {
        Ok(n) => Ok(format!("UDP sent {n} bytes to {target}")),
        Err(e) => Err(format!("FAIL UDP send to {target}: {e}")),
    }
}

pub(crate) fn icmp(target: IpAddr) -> Outcome {
    use nix::sys::socket::{
        sendto, socket, AddressFamily, SockFlag, SockProtocol, SockType, SockaddrIn, SockaddrIn6,
    };
    let (family, proto, kind) = match target {
        IpAddr::V4(_) => (AddressFamily::Inet, SockProtocol::Icmp, 8u8),
        IpAddr::V6(_) => (AddressFamily::Inet6, SockProtocol::IcmpV6, 128u8),
    };
    let fd = socket(family, SockType::Raw, SockFlag::empty(), proto)
        .map_err(|e| format!("FAIL raw socket: {e}"))?;
    // Echo request: type, code, checksum, id, seq, payload.
    let mut packet = [kind, 0, 0, 0, 0x51, 0x1c, 0, 1, b's', b'l', b'u', b'i'];
    if target.is_ipv4() {
        let sum = checksum(&packet);
        packet[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    let sent = match target {
        IpAddr::V4(ip) => sendto(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &packet,
            &SockaddrIn::from(std::net::SocketAddrV4::new(ip, 0)),
            nix::sys::socket::MsgFlags::empty(),
        ),
        IpAddr::V6(ip) => sendto(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &packet,
            &SockaddrIn6::from(std::net::SocketAddrV6::new(ip, 0, 0, 0)),
            nix::sys::socket::MsgFlags::empty(),
        ),
    };
    match sent {
        Ok(n) => Ok(format!("ICMP echo sent {n} bytes to {target}")),
        Err(e) => Err(format!("FAIL ICMP send to {target}: {e}")),
    }
}

fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in data.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

pub(crate) fn dns(name: &str, v6: bool, use_tcp: bool) -> Outcome {
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RecordType};
    let server = system_nameserver();
    let qname = Name::from_ascii(name).map_err(|e| format!("FAIL name {name}: {e}"))?;
    let rtype = if v6 { RecordType::AAAA } else { RecordType::A };
    let mut msg = Message::new(0x5151, MessageType::Query, OpCode::Query);
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(qname, rtype));
    let bytes = msg.to_vec().map_err(|e| format!("FAIL encode: {e}"))?;
    let reply = if use_tcp {
        let mut s = connect(&server.to_string())?;
        let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&bytes);
        s.write_all(&framed)
            .map_err(|e| format!("FAIL send: {e}"))?;
        let mut len = [0u8; 2];
        s.read_exact(&mut len)
            .map_err(|e| format!("FAIL read: {e}"))?;
        let mut body = vec![0u8; u16::from_be_bytes(len) as usize];
        s.read_exact(&mut body)
            .map_err(|e| format!("FAIL read: {e}"))?;
        body
    } else {
        let bind = if server.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        };
        let socket = UdpSocket::bind(bind).map_err(|e| format!("FAIL bind: {e}"))?;
        let _ = socket.set_read_timeout(Some(TIMEOUT));
        socket
            .send_to(&bytes, server)
            .map_err(|e| format!("FAIL send to {server}: {e}"))?;
        let mut buf = vec![0u8; 4096];
        let (n, _) = socket
            .recv_from(&mut buf)
            .map_err(|e| format!("FAIL no answer from {server}: {e}"))?;
        buf.truncate(n);
        buf
    };
    let answer = Message::from_vec(&reply).map_err(|e| format!("FAIL bad answer: {e}"))?;
    let code = answer.metadata.response_code;
    let addrs: Vec<String> = answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            hickory_proto::rr::RData::A(a) => Some(a.to_string()),
            hickory_proto::rr::RData::AAAA(a) => Some(a.to_string()),
            _ => None,
        })
        .collect();
    let line = format!("DNS {name} {rtype} {code} {}", addrs.join(","));
    if addrs.is_empty() {
        Err(format!("FAIL {line}"))
    } else {
        Ok(line)
    }
}

fn system_nameserver() -> SocketAddr {
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|ip| ip.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .next()
        .unwrap_or_else(|| SocketAddr::from(([198, 18, 0, 53], 53)))
}
