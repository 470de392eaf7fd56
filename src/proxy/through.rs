//! Connections through the proxy's decision and relay with a destination
//! given by the test (no namespace, no redirect): what reaches an origin and
//! what the audit log says.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{connection, InternalAddrs, Limits, ProxyContext, Resolver};
use crate::audit::{AuditRecord, AuditWriter};
use crate::bundle::PolicyHandle;
use crate::policy::{Policy, ResolvedNames};

/// A sandbox that resolved nothing through sluice.
struct NoHistory;

impl ResolvedNames for NoHistory {
    fn resolved(&self, _: &str, _: std::net::IpAddr) -> bool {
        false
    }
}

impl Resolver for NoHistory {
    fn name_for(&self, _: std::net::IpAddr) -> Option<String> {
        None
    }
}

/// Everything is allowed by address.
const OPEN: &str = r#"
version: 1
name: open
rules:
  - name: anywhere
    action: allow
    cidrs: ["0.0.0.0/0", "::/0"]
"#;

struct Proxy {
    ctx: Arc<ProxyContext>,
    writer: tokio::task::JoinHandle<Result<u64, crate::audit::AuditError>>,
    _dir: tempfile::TempDir,
    audit_path: std::path::PathBuf,
}

impl Proxy {
    fn new(yaml: &str, internal: InternalAddrs) -> Proxy {
        let policy = Policy::from_yaml(yaml, "through.yaml").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let audit_path = dir.path().join("audit.jsonl");
        let (audit, writer) = AuditWriter::new(Some(&audit_path));
        let mut ctx = ProxyContext::new(
            PolicyHandle::new(policy, "through@1".to_string()),
            Arc::new(NoHistory),
            audit,
            "sb-through".to_string(),
            crate::workload::WorkloadPath::Host,
            Limits::default(),
        );
        ctx.internal = internal;
        Proxy {
            ctx: Arc::new(ctx),
            writer: tokio::spawn(writer.run()),
            _dir: dir,
            audit_path,
        }
    }

    /// One client connection, decided as if it had been going to `dst`:
    /// what the client read before the end.
    async fn connect(&self, dst: SocketAddr, send: &[u8]) -> Vec<u8> {
        let front = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let mut client = TcpStream::connect(front.local_addr().unwrap())
            .await
            .unwrap();
        let (server_side, peer) = front.accept().await.unwrap();
        let ctx = self.ctx.clone();
        let served =
            tokio::spawn(async move { connection::serve(server_side, peer, dst, &ctx).await });
        client.write_all(send).await.unwrap();
        let mut got = Vec::new();
        let _ = client.read_to_end(&mut got).await;
        served.await.unwrap();
        got
    }

    async fn audit(self) -> Vec<AuditRecord> {
        let Proxy {
            ctx,
            writer,
            audit_path,
            ..
        } = self;
        drop(Arc::try_unwrap(ctx).ok().expect("no other holder"));
        writer.await.unwrap().unwrap();
        std::fs::read_to_string(&audit_path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The first bytes the first connection accepted on `listener` sends.
async fn first_arrival(listener: TcpListener) -> Vec<u8> {
    let (mut stream, _) = listener.accept().await.unwrap();
    let mut got = Vec::new();
    let _ = stream.read_to_end(&mut got).await;
    got
}

#[tokio::test]
async fn an_internal_endpoint_spelled_as_ipv4_mapped_ipv6_is_refused() {
    let endpoint = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = endpoint.local_addr().unwrap().port();
    let arrivals = tokio::spawn(first_arrival(endpoint));
    let proxy = Proxy::new(
        OPEN,
        InternalAddrs {
            ips: Vec::new(),
            endpoints: vec![SocketAddr::from((Ipv4Addr::LOCALHOST, port))],
        },
    );
    let mapped: SocketAddr = format!("[::ffff:127.0.0.1]:{port}").parse().unwrap();
    let got = proxy.connect(mapped, b"GET /metrics HTTP/1.1\r\n\r\n").await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 403 "), "{got}");
    assert!(got.contains("sluice-internal"), "{got}");
    // The canary: if the proxy had connected, its connection came first.
    let mut canary = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await.unwrap();
    canary.write_all(b"canary").await.unwrap();
    drop(canary);
    assert_eq!(arrivals.await.unwrap(), b"canary");
    let records = proxy.audit().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].reason, "sluice-internal");
    assert_eq!(records[0].dst.as_deref(), Some(mapped.to_string().as_str()));
}
