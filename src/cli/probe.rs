//! `sluice probe`: the small network client the demo and the tests run in a
//! sandbox. Each probe prints one line and exits 0 on success, 1 on failure.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Subcommand;

use crate::probe;

#[derive(Debug, Subcommand)]
pub(crate) enum ProbeCommand {
    /// HTTP GET a URL (http:// only); prints status and body length; exit 0 on a 2xx.
    Http {
        url: String,
        /// Print the body to stdout.
        #[arg(long)]
        body: bool,
        /// Make N requests, each on a fresh connection, and print latency
        /// statistics instead of one result.
        #[arg(long, default_value_t = 1, value_name = "N")]
        count: usize,
        /// With --count: requests in flight at once.
        #[arg(long, default_value_t = 1, value_name = "N")]
        concurrency: usize,
        /// With --count: write the client-side timing of each request to FILE
        /// (.csv or JSONL, the record format of `sluice run --timings`).
        #[arg(long, value_name = "FILE")]
        timings: Option<PathBuf>,
        /// The `path` field of those records (e.g. direct, host).
        #[arg(long, default_value = "client", value_name = "NAME")]
        label: String,
    },
    /// TLS handshake with HOST:PORT (or ADDR:PORT with --sni), then HTTP GET /.
    Tls {
        /// Where to connect (host:port or addr:port).
        target: String,
        /// Server name to send (default: the host part of TARGET).
        #[arg(long)]
        sni: Option<String>,
        /// PEM file of the CAs to trust (default: $SSL_CERT_FILE, else
        /// /etc/ssl/certs/ca-certificates.crt, as curl and openssl do; inside
        /// a sandbox whose policy terminates TLS that holds sluice's CA).
        #[arg(long, value_name = "FILE")]
        ca: Option<PathBuf>,
    },
    /// Open a TCP connection, send LINE, print what comes back.
    Tcp {
        target: String,
        /// What to send before half-closing the connection.
        #[arg(long, default_value = "", conflicts_with = "server_first")]
        send: String,
        /// Send nothing and keep the write side open, reading until the
        /// server closes: a server-first protocol such as SSH or SMTP.
        #[arg(long)]
        server_first: bool,
    },
    /// Serve HTTP on ADDR (`/` says hello, `/bytes/N` sends N bytes) until killed:
    /// the origin side for trying sluice out and for timing comparisons.
    Serve { addr: SocketAddr },
    /// Send one UDP datagram.
    Udp { target: SocketAddr },
    /// Send one ICMP echo request over a raw socket.
    Icmp { target: std::net::IpAddr },
    /// Send one raw Ethernet frame on a packet socket (needs root): what a
    /// hostile microVM guest would send, to test sluice's tap fence.
    Frame {
        /// What to send.
        #[arg(value_enum)]
        kind: FrameKindArg,
        /// The interface to send on.
        #[arg(long, default_value = "eth0")]
        dev: String,
        /// Source MAC (default: the interface's own).
        #[arg(long, value_name = "MAC")]
        src_mac: Option<crate::mac::MacAddr>,
        /// Destination MAC (default: broadcast).
        #[arg(long, value_name = "MAC")]
        dst_mac: Option<crate::mac::MacAddr>,
        /// Source address (udp, ip, arp, tcp).
        #[arg(long, value_name = "IP")]
        src: Option<std::net::IpAddr>,
        /// Destination address (udp, ip, arp, redirect, tcp).
        #[arg(long, value_name = "IP")]
        dst: Option<std::net::IpAddr>,
        /// udp, tcp: the destination port.
        #[arg(long, default_value_t = 9)]
        port: u16,
        /// ip: the protocol number.
        #[arg(long, default_value_t = crate::probe::frame::EXPERIMENTAL_PROTOCOL)]
        protocol: u8,
        /// Tag the frame with this 802.1Q VLAN id.
        #[arg(long, value_name = "ID")]
        vlan: Option<u16>,
    },
    /// Resolve NAME through the system's configured DNS server.
    Dns {
        name: String,
        /// AAAA instead of A.
        #[arg(long)]
        v6: bool,
        /// Use TCP instead of UDP.
        #[arg(long)]
        tcp: bool,
    },
}

/// `sluice probe frame`'s kinds.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum FrameKindArg {
    Udp,
    Ip,
    Arp,
    Ra,
    Redirect,
    Dhcpv6,
    Ethertype,
    Tcp,
}

/// Run one probe; its line goes to stdout, its status is the exit status.
pub(crate) fn execute(cmd: ProbeCommand) -> i32 {
    let result = match cmd {
        ProbeCommand::Http {
            url,
            body,
            count,
            concurrency,
            timings,
            label,
        } => {
            if count > 1 {
                probe::http_many(&url, count, concurrency, timings.as_deref(), &label)
            } else {
                probe::http(&url, body)
            }
        }
        ProbeCommand::Tls { target, sni, ca } => {
            let ca = ca.unwrap_or_else(probe::default_ca_file);
            probe::tls(&target, sni.as_deref(), &ca)
        }
        ProbeCommand::Tcp {
            target,
            send,
            server_first,
        } => probe::tcp(&target, &send, server_first),
        ProbeCommand::Serve { addr } => probe::serve(addr),
        ProbeCommand::Udp { target } => probe::udp(target),
        ProbeCommand::Icmp { target } => probe::icmp(target),
        ProbeCommand::Dns { name, v6, tcp } => probe::dns(&name, v6, tcp),
        ProbeCommand::Frame {
            kind,
            dev,
            src_mac,
            dst_mac,
            src,
            dst,
            port,
            protocol,
            vlan,
        } => {
            use crate::probe::frame::FrameKind;
            let kind = match kind {
                FrameKindArg::Udp => FrameKind::Udp,
                FrameKindArg::Ip => FrameKind::Ip,
                FrameKindArg::Arp => FrameKind::Arp,
                FrameKindArg::Ra => FrameKind::Ra,
                FrameKindArg::Redirect => FrameKind::Redirect,
                FrameKindArg::Dhcpv6 => FrameKind::Dhcpv6,
                FrameKindArg::Ethertype => FrameKind::Ethertype,
                FrameKindArg::Tcp => FrameKind::Tcp,
            };
            crate::probe::frame::probe(&crate::probe::frame::FrameProbe {
                dev,
                kind,
                src_mac,
                dst_mac,
                src,
                dst,
                port,
                protocol,
                vlan,
            })
        }
    };
    match result {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(line) => {
            println!("{line}");
            1
        }
    }
}
