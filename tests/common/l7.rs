//! An HTTPS origin for the request tests: keeps connections alive, reads
//! every request whole (Content-Length or chunked) and keeps what it saw,
//! answers `200 ok <path>`, and switches to an echo after a WebSocket
//! upgrade.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use super::{test_pki, World};

/// The credential [`injecting_policy`] injects: on the host only, never the
/// workload's.
pub const SECRET: &str = "s3cret-value-0451";

/// A policy whose one rule admits `GET` of `paths` on api.github.test:443
/// (198.18.0.1, answered by sluice's DNS) and injects secret `gh`, read
/// from `secret_file`, as `Authorization: Bearer <secret>`.
pub fn injecting_policy(secret_file: &std::path::Path, paths: &[&str]) -> String {
    format!(
        r#"
version: 1
name: l7-inject
secrets:
  - name: gh
    file: {}
rules:
  - name: code-host
    action: allow
    hosts: ["api.github.test"]
    ports: [443]
    http:
      - methods: [GET]
        paths: {paths:?}
    inject:
      - header: Authorization
        value: "Bearer {{{{gh}}}}"
dns:
  upstream: []
  hosts:
    api.github.test: ["198.18.0.1"]
"#,
        secret_file.display()
    )
}

/// One request as the origin read it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub head: String,
    pub body: Vec<u8>,
}

impl Seen {
    /// The request line's target.
    pub fn target(&self) -> &str {
        self.head.split(' ').nth(1).unwrap_or("")
    }

    /// The value of header `name` (case-insensitive), if sent once or more.
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

/// What the origin has seen, shared with the test.
#[derive(Default)]
pub struct Requests(Mutex<Vec<Seen>>);

impl Requests {
    pub fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    /// The request targets, in the order they came.
    pub fn targets(&self) -> Vec<String> {
        self.all().iter().map(|r| r.target().to_string()).collect()
    }
}

/// An HTTPS origin on `addr` in the world's outer namespace for `names`,
/// with a certificate from a fresh test CA; returns the CA file and the
/// requests it reads.
pub fn keepalive_origin(
    w: &World,
    addr: &str,
    names: &[&str],
) -> (std::path::PathBuf, Arc<Requests>) {
    let pki = test_pki(names);
    let ca_path = w.dir.path().join(format!(
        "origin-ca-{}.pem",
        addr.replace([':', '[', ']'], "_")
    ));
    std::fs::write(&ca_path, &pki.ca_pem).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![pki.cert], pki.key)
            .unwrap(),
    );
    let addr: SocketAddr = addr.parse().unwrap();
    let listener = w
        .outer
        .run_in(move || TcpListener::bind(addr))
        .unwrap()
        .unwrap();
    let requests = Arc::new(Requests::default());
    let seen = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            let (config, seen) = (config.clone(), seen.clone());
            std::thread::spawn(move || {
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let tls = rustls::StreamOwned::new(conn, stream);
                let _ = serve(tls, &seen);
            });
        }
    });
    (ca_path, requests)
}

fn serve<S: Read + Write>(stream: S, seen: &Requests) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let request = Seen {
            head: head.clone(),
            body: Vec::new(),
        };
        let mut body = Vec::new();
        if request
            .header("transfer-encoding")
            .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
        {
            loop {
                let mut size = String::new();
                reader.read_line(&mut size)?;
                let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                let mut chunk = vec![0u8; n + 2];
                reader.read_exact(&mut chunk)?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else if let Some(n) = request
            .header("content-length")
            .and_then(|n| n.parse().ok())
        {
            body = vec![0u8; n];
            reader.read_exact(&mut body)?;
        }
        let upgrade = request.header("upgrade").is_some();
        let target = request.target().to_string();
        seen.0.lock().unwrap().push(Seen { head, body });
        let stream = reader.get_mut();
        if upgrade {
            stream.write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            )?;
            stream.flush()?;
            // Echo what follows, raw.
            let mut buf = [0u8; 4096];
            loop {
                let n = reader.read(&mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                reader.get_mut().write_all(&buf[..n])?;
                reader.get_mut().flush()?;
            }
        }
        let body = format!("ok {target}\n");
        write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        stream.flush()?;
    }
}
