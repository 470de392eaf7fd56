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

/// Everything is allowed by address (the origins here listen on
/// loopback, which only a rule naming it admits).
const OPEN: &str = r#"
version: 1
name: open
rules:
  - name: anywhere
    action: allow
    cidrs: ["0.0.0.0/0", "::/0"]
  - name: loopback-origins
    action: allow
    cidrs: ["127.0.0.0/8", "::1/128"]
"#;

struct Proxy {
    ctx: Arc<ProxyContext>,
    writer: tokio::task::JoinHandle<Result<u64, crate::audit::AuditError>>,
    _dir: tempfile::TempDir,
    audit_path: std::path::PathBuf,
}

impl Proxy {
    fn new(yaml: &str, internal: InternalAddrs) -> Proxy {
        Proxy::with_resolver(yaml, internal, Arc::new(NoHistory))
    }

    fn with_resolver(yaml: &str, internal: InternalAddrs, resolver: Arc<dyn Resolver>) -> Proxy {
        let policy = Policy::from_yaml(yaml, "through.yaml").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let audit_path = dir.path().join("audit.jsonl");
        let (audit, writer) = AuditWriter::new(Some(&audit_path));
        let mut ctx = ProxyContext::new(
            PolicyHandle::new(policy, "through@1".to_string()),
            resolver,
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
        // Half-closed, so that a relayed connection ends too (with the
        // origin's answer, not a hang) if the proxy wrongly connected.
        let _ = client.shutdown().await;
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
    let got = proxy
        .connect(mapped, b"GET /metrics HTTP/1.1\r\n\r\n")
        .await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 403 "), "{got}");
    assert!(got.contains("internal-address"), "{got}");
    // The canary: if the proxy had connected, its connection came first.
    let mut canary = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .await
        .unwrap();
    canary.write_all(b"canary").await.unwrap();
    drop(canary);
    assert_eq!(arrivals.await.unwrap(), b"canary");
    let records = proxy.audit().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].reason, "internal-address");
    assert_eq!(records[0].dst.as_deref(), Some(mapped.to_string().as_str()));
}

/// A resolver that remembers nothing, and whose own lookup of `.0` answers
/// `.1` alone.
struct LooksUp(&'static str, std::net::IpAddr);

impl ResolvedNames for LooksUp {
    fn resolved(&self, _: &str, _: std::net::IpAddr) -> bool {
        false
    }
}

impl Resolver for LooksUp {
    fn name_for(&self, _: std::net::IpAddr) -> Option<String> {
        None
    }

    fn verify<'a>(&'a self, name: &'a str, ip: std::net::IpAddr) -> super::Verifying<'a> {
        let confirmed = name == self.0 && ip == self.1;
        Box::pin(std::future::ready(confirmed))
    }
}

const API: &str = r#"
version: 1
name: api
rules:
  - name: api
    action: allow
    hosts: ["api.example"]
    ports: [443]
"#;

async fn decided(proxy: &Proxy, dst: &str, host: &str) -> String {
    let policy = proxy.ctx.policy.current();
    let d = super::decide::decide(&proxy.ctx, &policy, dst.parse().unwrap(), Some(host)).await;
    format!("{}/{}", d.verdict.as_str(), d.reason.as_str())
}

#[tokio::test]
async fn a_hostname_the_sandbox_never_resolved_is_admitted_once_sluice_confirms_it() {
    // `curl --resolve api.example:443:198.18.0.7`: no DNS history at all.
    let proxy = Proxy::with_resolver(
        API,
        InternalAddrs::default(),
        Arc::new(LooksUp("api.example", "198.18.0.7".parse().unwrap())),
    );
    assert_eq!(
        decided(&proxy, "198.18.0.7:443", "api.example").await,
        "allow/allow-rule"
    );
}

#[tokio::test]
async fn a_hostname_sent_to_an_address_sluice_does_not_confirm_is_still_a_mismatch() {
    let proxy = Proxy::with_resolver(
        API,
        InternalAddrs::default(),
        Arc::new(LooksUp("api.example", "198.18.0.7".parse().unwrap())),
    );
    assert_eq!(
        decided(&proxy, "198.18.0.8:443", "api.example").await,
        "deny/host-address-mismatch"
    );
    // Confirming one name says nothing about another the rule does not name.
    assert_eq!(
        decided(&proxy, "198.18.0.7:443", "other.example").await,
        "deny/no-rule"
    );
}

/// Loopback is allowed by address; b.test is denied by name on every port,
/// so every request on a plain-HTTP connection is decided on its Host.
const DENY_B: &str = r#"
version: 1
name: deny-b
rules:
  - name: no-b
    action: deny
    hosts: ["b.test"]
  - name: loopback
    action: allow
    cidrs: ["127.0.0.1/32"]
"#;

/// An HTTP/1.1 origin with keep-alive: each response says which Host and
/// which body it got and ends in `<END>`; `hosts` lists the Hosts it saw.
struct Origin {
    addr: SocketAddr,
    hosts: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Origin {
    async fn start() -> Origin {
        use http_body_util::{BodyExt, Full};
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hosts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = hosts.clone();
        // One connection is all a test makes: the task ends with it.
        let task = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let host = req
                            .headers()
                            .get("host")
                            .and_then(|h| h.to_str().ok())
                            .unwrap_or("-")
                            .to_string();
                        seen.lock().unwrap().push(host.clone());
                        let body = req.into_body().collect().await?.to_bytes();
                        let text =
                            format!("host={host} body={}<END>", String::from_utf8_lossy(&body));
                        Ok::<_, hyper::Error>(hyper::Response::new(Full::new(
                            hyper::body::Bytes::from(text),
                        )))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
        Origin { addr, hosts, task }
    }

    /// The Hosts it saw, once its connection has ended.
    async fn hosts(self) -> Vec<String> {
        self.task.await.unwrap();
        self.hosts.lock().unwrap().clone()
    }
}

/// A client connection through the proxy to `dst`.
struct Client {
    stream: TcpStream,
    served: tokio::task::JoinHandle<()>,
    got: Vec<u8>,
}

impl Client {
    async fn open(proxy: &Proxy, dst: SocketAddr) -> Client {
        let front = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let stream = TcpStream::connect(front.local_addr().unwrap())
            .await
            .unwrap();
        let (server_side, peer) = front.accept().await.unwrap();
        let ctx = proxy.ctx.clone();
        let served =
            tokio::spawn(async move { connection::serve(server_side, peer, dst, &ctx).await });
        Client {
            stream,
            served,
            got: Vec::new(),
        }
    }

    /// Send `bytes`, then read until `n` responses in all have ended.
    async fn exchange(&mut self, bytes: &[u8], n: usize) {
        self.stream.write_all(bytes).await.unwrap();
        let mut buf = [0u8; 4096];
        while count(&self.got, b"<END>") < n {
            let read = self.stream.read(&mut buf).await.unwrap();
            assert!(
                read > 0,
                "closed early: {}",
                String::from_utf8_lossy(&self.got)
            );
            self.got.extend_from_slice(&buf[..read]);
        }
    }

    /// Send `bytes`, close the sending side and read to the end: all the
    /// client got.
    async fn finish(mut self, bytes: &[u8]) -> String {
        self.stream.write_all(bytes).await.unwrap();
        let _ = self.stream.shutdown().await;
        let _ = self.stream.read_to_end(&mut self.got).await;
        self.served.await.unwrap();
        String::from_utf8_lossy(&self.got).into_owned()
    }
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

fn get(host: &str) -> String {
    format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n")
}

#[tokio::test]
async fn two_requests_on_one_kept_alive_connection_are_both_relayed() {
    let origin = Origin::start().await;
    let proxy = Proxy::new(DENY_B, InternalAddrs::default());
    let mut client = Client::open(&proxy, origin.addr).await;
    client.exchange(get("a.test").as_bytes(), 1).await;
    client.exchange(get("c.test").as_bytes(), 2).await;
    let got = client.finish(b"").await;
    assert!(got.contains("host=a.test"), "{got}");
    assert!(got.contains("host=c.test"), "{got}");
    assert_eq!(origin.hosts().await, ["a.test", "c.test"]);
}

#[tokio::test]
async fn three_requests_with_bodies_pass_through_intact() {
    let origin = Origin::start().await;
    let proxy = Proxy::new(DENY_B, InternalAddrs::default());
    let mut client = Client::open(&proxy, origin.addr).await;
    // A Content-Length body that looks like a denied request head is body,
    // not a request.
    let smuggled = get("b.test");
    let first = format!(
        "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: {}\r\n\r\n{smuggled}",
        smuggled.len()
    );
    client.exchange(first.as_bytes(), 1).await;
    let chunked = "POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6; ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
    client.exchange(chunked.as_bytes(), 2).await;
    client.exchange(get("a.test").as_bytes(), 3).await;
    let got = client.finish(b"").await;
    assert!(
        got.contains(&format!("host=a.test body={smuggled}<END>")),
        "{got}"
    );
    assert!(got.contains("host=a.test body=hello world<END>"), "{got}");
    assert_eq!(count(got.as_bytes(), b"HTTP/1.1 200"), 3, "{got}");
    assert_eq!(origin.hosts().await, ["a.test", "a.test", "a.test"]);
}

#[tokio::test]
async fn pipelined_requests_are_each_decided_and_relayed() {
    let origin = Origin::start().await;
    let proxy = Proxy::new(DENY_B, InternalAddrs::default());
    let client = Client::open(&proxy, origin.addr).await;
    let pipelined = format!(
        "{}POST / HTTP/1.1\r\nHost: c.test\r\nContent-Length: 3\r\n\r\nabc{}",
        get("a.test"),
        get("d.test")
    );
    let got = client.finish(pipelined.as_bytes()).await;
    assert_eq!(count(got.as_bytes(), b"HTTP/1.1 200"), 3, "{got}");
    assert!(got.contains("host=c.test body=abc<END>"), "{got}");
    assert_eq!(origin.hosts().await, ["a.test", "c.test", "d.test"]);
}

#[tokio::test]
async fn a_later_request_for_a_denied_host_gets_403_and_the_connection_closes() {
    let origin = Origin::start().await;
    let proxy = Proxy::new(DENY_B, InternalAddrs::default());
    let mut client = Client::open(&proxy, origin.addr).await;
    client.exchange(get("a.test").as_bytes(), 1).await;
    // Pipelined after the denied one: never relayed either.
    let denied = format!("{}{}", get("b.test"), get("a.test"));
    let got = client.finish(denied.as_bytes()).await;
    let (_, after_first) = got.split_once("<END>").unwrap();
    assert!(after_first.starts_with("HTTP/1.1 403 "), "{got}");
    assert!(after_first.contains("no-b"), "{got}");
    assert_eq!(origin.hosts().await, ["a.test"]);
    let records = proxy.audit().await;
    let last = records.last().unwrap();
    assert_eq!(
        (
            last.verdict.as_str(),
            last.rule.as_deref(),
            last.reason.as_str(),
            last.host.as_deref()
        ),
        ("deny", Some("no-b"), "deny-rule", Some("b.test"))
    );
}

#[tokio::test]
async fn a_connection_admitted_by_address_alone_is_relayed_unread() {
    // No rule names a host: nothing a request says can change the verdict,
    // so the plain relay carries it, whatever its Hosts.
    let origin = Origin::start().await;
    let proxy = Proxy::new(OPEN, InternalAddrs::default());
    let client = Client::open(&proxy, origin.addr).await;
    let got = client
        .finish(format!("{}{}", get("a.test"), get("b.test")).as_bytes())
        .await;
    assert_eq!(count(got.as_bytes(), b"HTTP/1.1 200"), 2, "{got}");
    assert_eq!(origin.hosts().await, ["a.test", "b.test"]);
}

/// An origin that echoes every connection; `ended` hears of each one the
/// proxy side closed.
async fn echo_origin() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<()>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ended, heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let ended = ended.clone();
            tokio::spawn(async move {
                let (mut from, mut to) = stream.split();
                let _ = tokio::io::copy(&mut from, &mut to).await;
                let _ = ended.send(());
            });
        }
    });
    (addr, heard)
}

/// What came back for `bytes` on `stream`.
async fn echoed(stream: &mut TcpStream, bytes: &[u8]) -> Vec<u8> {
    stream.write_all(bytes).await.unwrap();
    let mut got = vec![0; bytes.len()];
    stream.read_exact(&mut got).await.unwrap();
    got
}

#[tokio::test]
async fn a_drain_accepts_no_new_connection_relays_a_held_one_until_overdue_then_closes_it() {
    let (dst, mut origin_closed) = echo_origin().await;
    let proxy = Proxy::new(OPEN, InternalAddrs::default());
    let front = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let front_addr = front.local_addr().unwrap();
    let (trigger, watch) = crate::drain::trigger();
    let served = tokio::spawn(super::accept_until_drained(
        front,
        proxy.ctx.clone(),
        watch,
        move |stream, peer, ctx| async move { connection::serve(stream, peer, dst, &ctx).await },
    ));
    let mut held = TcpStream::connect(front_addr).await.unwrap();
    assert_eq!(
        echoed(&mut held, b"before the drain").await,
        b"before the drain"
    );

    trigger.drain();
    // Refused once the listener is gone, or reset with it from its backlog
    // (while connecting or after): either way never accepted, never relayed.
    match TcpStream::connect(front_addr).await {
        Err(err) => assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
            ),
            "{err}"
        ),
        Ok(mut late) => {
            let _ = late.write_all(b"too late").await;
            let mut got = Vec::new();
            let read = late.read_to_end(&mut got).await;
            assert!(got.is_empty(), "relayed after the drain: {got:?}");
            assert_eq!(
                read.unwrap_err().kind(),
                std::io::ErrorKind::ConnectionReset
            );
        }
    }
    assert_eq!(
        proxy
            .ctx
            .accepted
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // The grace: the held connection is still relayed both ways.
    assert_eq!(
        echoed(&mut held, b"during the grace").await,
        b"during the grace"
    );
    assert!(
        !served.is_finished(),
        "serve returned with a connection open"
    );

    trigger.overdue();
    let mut after = Vec::new();
    let _ = held.read_to_end(&mut after).await;
    assert!(after.is_empty(), "{after:?}");
    served.await.unwrap();
    // The upstream side was closed too.
    origin_closed.recv().await.unwrap();
}

/// Everything is allowed by address, loopback named by no rule.
const EVERYWHERE: &str = r#"
version: 1
name: everywhere
rules:
  - name: anywhere
    action: allow
    cidrs: ["0.0.0.0/0", "::/0", "64:ff9b::/96"]
"#;

#[tokio::test]
async fn a_rule_for_everywhere_never_reaches_a_loopback_listener_in_any_spelling() {
    // What listens on sluice's own loopback (a model server, a database)
    // is no destination of a workload's, whatever the spelling.
    let v4 = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = v4.local_addr().unwrap().port();
    let arrivals = tokio::spawn(first_arrival(v4));
    let proxy = Proxy::new(EVERYWHERE, InternalAddrs::default());
    let spellings = [
        format!("127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("[::1]:{port}"),
        format!("0.0.0.0:{port}"),
        format!("[::]:{port}"),
        format!("[::ffff:0.0.0.0]:{port}"),
        format!("[64:ff9b::7f00:1]:{port}"),
        format!("[::127.0.0.1]:{port}"),
    ];
    for dst in &spellings {
        let got = proxy
            .connect(dst.parse().unwrap(), get("a.test").as_bytes())
            .await;
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 403 "), "{dst}: {got}");
        assert!(got.contains("loopback-address"), "{dst}: {got}");
    }
    // The canary: had the proxy connected, its connection came first.
    let mut canary = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .await
        .unwrap();
    canary.write_all(b"canary").await.unwrap();
    drop(canary);
    assert_eq!(arrivals.await.unwrap(), b"canary");
    let records = proxy.audit().await;
    assert_eq!(records.len(), spellings.len(), "{records:?}");
    for (record, dst) in records.iter().zip(&spellings) {
        assert_eq!(
            (
                record.verdict.as_str(),
                record.rule.as_deref(),
                record.reason.as_str()
            ),
            ("deny", Some("anywhere"), "loopback-address"),
            "{dst}"
        );
    }
}

#[tokio::test]
async fn a_rule_naming_loopback_reaches_a_loopback_listener() {
    let origin = Origin::start().await;
    let policy = format!(
        "{EVERYWHERE}  - name: local-model\n    action: allow\n    cidrs: [\"127.0.0.1/32\"]\n    ports: [{}]\n",
        origin.addr.port()
    );
    let proxy = Proxy::new(&policy, InternalAddrs::default());
    let got = Client::open(&proxy, origin.addr)
        .await
        .finish(get("a.test").as_bytes())
        .await;
    assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
    assert_eq!(origin.hosts().await, ["a.test"]);
}

/// DENY_B with a request head deadline of one second.
fn deny_b_with_head_deadline() -> String {
    format!("{DENY_B}limits:\n  request_head_seconds: 1\n")
}

#[tokio::test]
async fn a_head_sent_too_slowly_gets_408_and_a_record_while_another_client_is_served() {
    let slow_origin = Origin::start().await;
    let proxy = Proxy::new(&deny_b_with_head_deadline(), InternalAddrs::default());
    let mut slow = Client::open(&proxy, slow_origin.addr).await;
    // A head begun, never finished: the peek sees a request starting.
    slow.stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a.te")
        .await
        .unwrap();
    // Meanwhile another client of the same sandbox is served.
    let origin = Origin::start().await;
    let other = Client::open(&proxy, origin.addr)
        .await
        .finish(get("a.test").as_bytes())
        .await;
    assert!(other.starts_with("HTTP/1.1 200 "), "{other}");
    // The slow one is answered when its deadline passes, and never relayed.
    let mut got = Vec::new();
    let _ = slow.stream.read_to_end(&mut got).await;
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 408 "), "{got}");
    assert!(got.contains("http-head-timeout"), "{got}");
    slow.served.await.unwrap();
    drop(slow_origin);
    let records = proxy.audit().await;
    let timeouts: Vec<_> = records
        .iter()
        .filter(|r| r.reason == "http-head-timeout")
        .collect();
    assert_eq!(timeouts.len(), 1, "{records:?}");
    assert_eq!(timeouts[0].verdict, "deny");
}

#[tokio::test]
async fn a_later_head_sent_too_slowly_gets_408_after_the_first_was_relayed() {
    let origin = Origin::start().await;
    let proxy = Proxy::new(&deny_b_with_head_deadline(), InternalAddrs::default());
    let mut client = Client::open(&proxy, origin.addr).await;
    client.exchange(get("a.test").as_bytes(), 1).await;
    // The second head's first byte starts its deadline.
    client.stream.write_all(b"GET /").await.unwrap();
    let mut rest = Vec::new();
    let _ = client.stream.read_to_end(&mut rest).await;
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.starts_with("HTTP/1.1 408 "), "{rest}");
    assert_eq!(origin.hosts().await, ["a.test"]);
}

#[tokio::test]
async fn a_head_larger_than_the_limit_gets_431_and_a_record() {
    let origin = Origin::start().await;
    let proxy = Proxy::new(DENY_B, InternalAddrs::default());
    let mut client = Client::open(&proxy, origin.addr).await;
    client.exchange(get("a.test").as_bytes(), 1).await;
    let padding = "x".repeat(proxy.ctx.limits.peek_bytes);
    let huge = format!("GET / HTTP/1.1\r\nHost: a.test\r\nX-Pad: {padding}\r\n\r\n");
    let got = client.finish(huge.as_bytes()).await;
    let (_, after_first) = got.split_once("<END>").unwrap();
    assert!(after_first.starts_with("HTTP/1.1 431 "), "{got}");
    assert!(after_first.contains("http-head-too-large"), "{got}");
    assert_eq!(origin.hosts().await, ["a.test"]);
    let records = proxy.audit().await;
    let last = records.last().unwrap();
    assert_eq!(
        (last.verdict.as_str(), last.reason.as_str()),
        ("deny", "http-head-too-large")
    );
}

#[tokio::test]
async fn an_allowed_connection_whose_origin_refuses_is_audited_with_the_cause() {
    // A port just released: nothing listens there.
    let dst = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap();
    let mut proxy = Proxy::new(OPEN, InternalAddrs::default());
    Arc::get_mut(&mut proxy.ctx).unwrap().audit_allows = true;
    let got = proxy.connect(dst, b"hello").await;
    assert!(got.is_empty(), "{got:?}");
    let records = proxy.audit().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        (
            records[0].verdict.as_str(),
            records[0].rule.as_deref(),
            records[0].reason.as_str()
        ),
        ("allow", Some("loopback-origins"), "upstream-refused")
    );
}

#[tokio::test]
async fn an_urgent_byte_from_the_origin_reaches_the_client_in_the_stream() {
    use nix::sys::socket::{send, MsgFlags};
    use std::os::fd::AsRawFd;
    let origin = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let dst = origin.local_addr().unwrap();
    let sent = std::thread::spawn(move || {
        let (stream, _) = origin.accept().unwrap();
        let fd = stream.as_raw_fd();
        for (bytes, flags) in [
            (&b"ab"[..], MsgFlags::empty()),
            (b"c", MsgFlags::MSG_OOB),
            (b"de", MsgFlags::empty()),
        ] {
            send(fd, bytes, flags).unwrap();
        }
    });
    let proxy = Proxy::new(OPEN, InternalAddrs::default());
    let got = proxy.connect(dst, b"").await;
    sent.join().unwrap();
    // Without SO_OOBINLINE upstream the urgent byte waited out of band,
    // where no read of the stream sees it: the client got "abde".
    assert_eq!(String::from_utf8_lossy(&got), "abcde");
}

/// A rule that decides requests, the origin's name pinned to an address
/// nothing listens on (a refused connection never connects).
const NEEDS_REQUESTS: &str = r#"
version: 1
name: needs-requests
rules:
  - name: api-read
    action: allow
    hosts: ["api.test"]
    ports: [80]
    http:
      - methods: [GET]
        paths: ["/**"]
dns:
  hosts:
    api.test: ["198.18.0.9"]
"#;

#[tokio::test]
async fn a_rule_that_decides_requests_in_a_sandbox_without_a_ca_is_refused_never_relayed() {
    // A sandbox whose starting policy terminated nothing has no CA (a rule
    // a reload added): the connection is refused and audited, not relayed
    // undecided.
    let proxy = Proxy::new(NEEDS_REQUESTS, InternalAddrs::default());
    assert!(proxy.ctx.interception.is_none());
    let got = proxy
        .connect(
            "198.18.0.9:80".parse().unwrap(),
            b"GET /x HTTP/1.1\r\nHost: api.test\r\n\r\n",
        )
        .await;
    let got = String::from_utf8_lossy(&got);
    assert!(!got.contains("200 OK"), "{got}");
    let records = proxy.audit().await;
    assert!(
        records
            .iter()
            .any(|r| r.verdict == "deny" && r.reason == "no-interception"),
        "{records:?}"
    );
}
