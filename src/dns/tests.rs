use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, CNAME};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

use super::message::plain_name;
use super::*;
use crate::audit::{AuditRecord, AuditWriter};
use crate::policy::{Policy, ResolvedNames};
use rand::{Rng, SeedableRng};

const CLIENT: &str = "127.0.0.1:40000";

fn policy_yaml(mode: &str, upstream: &str) -> String {
    format!(
        r#"
version: 1
name: dns-test
mode: {mode}
rules:
  - name: origin
    action: allow
    cidrs: ["198.18.0.1/32"]
  - name: packages
    action: allow
    hosts: ["pypi.org", "*.pythonhosted.org", "v6.test", "many.test"]
    ports: [443]
dns:
  upstream: {upstream}
  hosts:
    origin.test: ["198.18.0.1", "2001:db8::1"]
    v6.test: ["2001:db8::2"]
    many.test: [{many}]
"#,
        many = (0..40)
            .map(|i| format!("\"198.18.1.{i}\""))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

struct Harness {
    ctx: Arc<DnsContext>,
    writer: JoinHandle<Result<u64, crate::audit::AuditError>>,
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl Harness {
    fn new(mode: &str, upstream: &str) -> Harness {
        let policy = Policy::from_yaml(&policy_yaml(mode, upstream), "test.yaml").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let (audit, writer) = AuditWriter::new(Some(&path));
        let ctx = Arc::new(DnsContext {
            policy: PolicyHandle::new(policy, "dns-test@1".to_string()),
            cache: Arc::new(DnsCache::new()),
            audit,
            sandbox: "sb-test".to_string(),
            path: crate::workload::WorkloadPath::Host,
            default_upstream: Vec::new(),
            metrics: None,
            budget: Default::default(),
            lookups: Default::default(),
        });
        Harness {
            ctx,
            writer: tokio::spawn(writer.run()),
            _dir: dir,
            path,
        }
    }

    async fn ask(&self, name: &str, qtype: RecordType) -> Message {
        let bytes = answer(&query(name, qtype), &self.ctx, CLIENT.parse().unwrap())
            .await
            .expect("an answer");
        Message::from_vec(&bytes).unwrap()
    }

    /// Close the audit log and return what was written.
    async fn audit_records(self) -> Vec<AuditRecord> {
        let Harness {
            ctx, writer, path, ..
        } = self;
        drop(
            Arc::try_unwrap(ctx)
                .ok()
                .expect("no other holder of the context"),
        );
        writer.await.unwrap().unwrap();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn query_message(name: &str, qtype: RecordType) -> Message {
    let mut msg = Message::new(0x1234, MessageType::Query, OpCode::Query);
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    msg
}

fn query(name: &str, qtype: RecordType) -> Vec<u8> {
    query_message(name, qtype).to_vec().unwrap()
}

fn addrs(msg: &Message) -> Vec<IpAddr> {
    msg.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test]
async fn hosts_name_gets_a_answer_and_is_remembered() {
    let h = Harness::new("enforce", "[]");
    let msg = h.ask("origin.test.", RecordType::A).await;
    assert_eq!(msg.metadata.id, 0x1234);
    assert_eq!(msg.metadata.message_type, MessageType::Response);
    assert_eq!(msg.metadata.response_code, ResponseCode::NoError);
    assert!(msg.metadata.recursion_desired && msg.metadata.recursion_available);
    assert_eq!(msg.queries.len(), 1);
    assert_eq!(addrs(&msg), vec![ip("198.18.0.1")]);
    assert_eq!(msg.answers[0].ttl, HOSTS_TTL);
    assert!(h.ctx.cache.resolved("origin.test", ip("198.18.0.1")));
    assert_eq!(
        h.ctx.cache.name_for(ip("198.18.0.1")).as_deref(),
        Some("origin.test")
    );
    assert!(h.audit_records().await.is_empty());
}

#[tokio::test]
async fn hosts_name_gets_aaaa_answer_of_its_family_only() {
    let h = Harness::new("enforce", "[]");
    let msg = h.ask("Origin.Test.", RecordType::AAAA).await;
    assert_eq!(addrs(&msg), vec![ip("2001:db8::1")]);
    let msg = h.ask("v6.test.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NoError);
    assert!(msg.answers.is_empty());
    let msg = h.ask("v6.test.", RecordType::MX).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NoError);
    assert!(msg.answers.is_empty());
    assert!(h.ctx.cache.resolved("origin.test", ip("2001:db8::1")));
}

#[tokio::test]
async fn unknown_admitted_name_without_upstream_is_nxdomain() {
    let h = Harness::new("enforce", "[]");
    let msg = h.ask("files.pythonhosted.org.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NXDomain);
    assert!(msg.answers.is_empty());
    assert!(h.audit_records().await.is_empty());
}

#[tokio::test]
async fn not_admitted_name_is_refused_and_audited_once() {
    let h = Harness::new("enforce", "[]");
    let msg = h.ask("Evil.Example.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::Refused);
    assert!(msg.answers.is_empty());
    assert_eq!(msg.metadata.id, 0x1234);
    let records = h.audit_records().await;
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.verdict, "deny");
    assert_eq!(r.reason, "dns-refused");
    assert_eq!(r.rule, None);
    assert_eq!(r.proto, crate::audit::Proto::Dns);
    assert_eq!(r.src.as_deref(), Some(CLIENT));
    assert_eq!(r.dst, None);
    assert_eq!(r.host.as_deref(), Some("evil.example"));
    assert_eq!(r.sandbox, "sb-test");
    assert_eq!(r.path, "host");
    assert_eq!(r.bundle, "dns-test@1");
}

#[tokio::test]
async fn audit_mode_answers_but_records_would_deny() {
    let h = Harness::new("audit", "[]");
    let msg = h.ask("evil.example.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::NXDomain);
    let records = h.audit_records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].verdict, "would-deny");
}

#[tokio::test]
async fn odd_names_and_messages_are_refused_or_rejected() {
    let h = Harness::new("enforce", "[]");
    // A label with a dot inside it cannot match any rule.
    let mut msg = Message::new(7, MessageType::Query, OpCode::Query);
    let name = Name::from_labels(vec![&b"pypi.org"[..], &b"x"[..]]).unwrap();
    msg.add_query(Query::query(name, RecordType::A));
    let client = CLIENT.parse().unwrap();
    let bytes = answer(&msg.to_vec().unwrap(), &h.ctx, client)
        .await
        .unwrap();
    let got = Message::from_vec(&bytes).unwrap();
    assert_eq!(got.metadata.response_code, ResponseCode::Refused);

    // Two questions: FORMERR.
    let mut two = query_message("origin.test.", RecordType::A);
    two.add_query(Query::query(
        Name::from_ascii("pypi.org.").unwrap(),
        RecordType::A,
    ));
    let bytes = answer(&two.to_vec().unwrap(), &h.ctx, client)
        .await
        .unwrap();
    let got = Message::from_vec(&bytes).unwrap();
    assert_eq!(got.metadata.response_code, ResponseCode::FormErr);

    // Not a QUERY: NOTIMP.
    let mut update = query_message("origin.test.", RecordType::A);
    update.metadata.op_code = OpCode::Update;
    let bytes = answer(&update.to_vec().unwrap(), &h.ctx, client)
        .await
        .unwrap();
    let got = Message::from_vec(&bytes).unwrap();
    assert_eq!(got.metadata.response_code, ResponseCode::NotImp);

    // A response, or garbage: dropped.
    let mut response = query_message("origin.test.", RecordType::A);
    response.metadata.message_type = MessageType::Response;
    let bytes = response.to_vec().unwrap();
    assert!(answer(&bytes, &h.ctx, client).await.is_none());
    assert!(answer(b"", &h.ctx, client).await.is_none());
    assert!(answer(b"\x12\x34\x01", &h.ctx, client).await.is_none());
    assert!(answer(&[0xff; 600], &h.ctx, client).await.is_none());
}

#[tokio::test]
async fn edns_query_gets_edns_answer() {
    let h = Harness::new("enforce", "[]");
    let mut msg = query_message("origin.test.", RecordType::A);
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    msg.edns = Some(edns);
    let bytes = answer(&msg.to_vec().unwrap(), &h.ctx, CLIENT.parse().unwrap())
        .await
        .unwrap();
    let got = Message::from_vec(&bytes).unwrap();
    assert!(got.edns.is_some());
}

/// A fake upstream: answers every UDP query for `pypi.org` with a CNAME
/// chain plus an unsolicited record; with `truncate_udp`, UDP answers carry
/// TC and only the TCP listener on the same port gives the records.
async fn fake_upstream(truncate_udp: bool) -> (SocketAddr, JoinHandle<()>) {
    let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = udp.local_addr().unwrap();
    let tcp = TcpListener::bind(addr).await.unwrap();
    let task = tokio::spawn(async move {
        let udp_side = async {
            let mut buf = [0u8; 4096];
            loop {
                let (n, from) = udp.recv_from(&mut buf).await.unwrap();
                let resp = upstream_response(&buf[..n], truncate_udp);
                udp.send_to(&resp, from).await.unwrap();
            }
        };
        let tcp_side = async {
            loop {
                let (mut s, _) = tcp.accept().await.unwrap();
                let len = s.read_u16().await.unwrap();
                let mut q = vec![0; usize::from(len)];
                s.read_exact(&mut q).await.unwrap();
                let resp = upstream_response(&q, false);
                s.write_u16(resp.len() as u16).await.unwrap();
                s.write_all(&resp).await.unwrap();
            }
        };
        tokio::join!(udp_side, tcp_side);
    });
    (addr, task)
}

fn upstream_response(query: &[u8], truncated: bool) -> Vec<u8> {
    let q = Message::from_vec(query).unwrap();
    let mut r = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
    r.metadata.recursion_desired = q.metadata.recursion_desired;
    r.metadata.recursion_available = true;
    r.queries = q.queries.clone();
    if truncated {
        r.metadata.truncation = true;
        return r.to_vec().unwrap();
    }
    let asked = q.queries[0].name().clone();
    let cdn = Name::from_ascii("pypi.cdn.test.").unwrap();
    let a = |name: &Name, ip: [u8; 4]| {
        Record::from_rdata(name.clone(), 30, RData::A(A(Ipv4Addr::from(ip))))
    };
    r.add_answer(Record::from_rdata(
        asked,
        300,
        RData::CNAME(CNAME(cdn.clone())),
    ));
    r.add_answer(a(&cdn, [198, 18, 0, 9]));
    r.add_answer(a(&cdn, [198, 18, 0, 10]));
    let evil = Name::from_ascii("bank.test.").unwrap();
    r.add_answer(a(&evil, [198, 18, 0, 66]));
    r.to_vec().unwrap()
}

#[tokio::test]
async fn admitted_name_is_forwarded_and_its_chain_remembered() {
    let (upstream, task) = fake_upstream(false).await;
    let h = Harness::new("enforce", &format!("[\"{upstream}\"]"));
    let msg = h.ask("pypi.org.", RecordType::A).await;
    assert_eq!(msg.metadata.id, 0x1234);
    assert_eq!(msg.metadata.response_code, ResponseCode::NoError);
    assert_eq!(msg.answers.len(), 4); // relayed as the upstream sent it
    let cache = &h.ctx.cache;
    assert!(cache.resolved("pypi.org", ip("198.18.0.9")));
    assert!(cache.resolved("pypi.org", ip("198.18.0.10")));
    // The CNAME target is a name no rule admits: it inherits nothing.
    assert!(!cache.resolved("pypi.cdn.test", ip("198.18.0.9")));
    assert_eq!(
        cache.name_for(ip("198.18.0.9")).as_deref(),
        Some("pypi.org")
    );
    // The record off the chain is not believed.
    assert!(!cache.resolved("bank.test", ip("198.18.0.66")));
    assert!(!cache.resolved("pypi.org", ip("198.18.0.66")));
    assert_eq!(cache.name_for(ip("198.18.0.66")), None);
    task.abort();
}

#[tokio::test]
async fn truncated_upstream_answer_is_retried_over_tcp() {
    let (upstream, task) = fake_upstream(true).await;
    let h = Harness::new("enforce", &format!("[\"{upstream}\"]"));
    let msg = h.ask("pypi.org.", RecordType::A).await;
    assert!(!msg.metadata.truncation);
    assert_eq!(msg.answers.len(), 4);
    assert!(h.ctx.cache.resolved("pypi.org", ip("198.18.0.10")));
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn silent_upstream_gives_servfail_once_its_timeout_passes() {
    let silent = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let upstream = silent.local_addr().unwrap();
    let h = Harness::new("enforce", &format!("[\"{upstream}\"]"));
    // Paused time: the runtime jumps to each timer while nothing else can
    // happen, so this reads the resolver's own clock, not the machine's.
    let started = tokio::time::Instant::now();
    let msg = h.ask("pypi.org.", RecordType::A).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(started.elapsed(), UPSTREAM_TIMEOUT);
    drop(silent);
}

#[tokio::test]
async fn serve_udp_answers_and_truncates_large_answers() {
    let h = Harness::new("enforce", "[]");
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let server = socket.local_addr().unwrap();
    let task = tokio::spawn(serve_udp(
        socket,
        h.ctx.clone(),
        crate::drain::Watch::never(),
    ));

    let client = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    client.connect(server).await.unwrap();
    let mut buf = [0u8; 4096];
    // Garbage first: no answer, and the server carries on.
    client.send(b"\x00\x01garbage").await.unwrap();
    client
        .send(&query("origin.test.", RecordType::A))
        .await
        .unwrap();
    let n = client.recv(&mut buf).await.unwrap();
    let msg = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(addrs(&msg), vec![ip("198.18.0.1")]);

    // 40 addresses do not fit in 512 bytes: TC, no answers.
    client
        .send(&query("many.test.", RecordType::A))
        .await
        .unwrap();
    let n = client.recv(&mut buf).await.unwrap();
    let msg = Message::from_vec(&buf[..n]).unwrap();
    assert!(msg.metadata.truncation);
    assert!(msg.answers.is_empty());
    assert!(n <= 512);

    // With EDNS room they fit.
    let mut big = query_message("many.test.", RecordType::A);
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    big.edns = Some(edns);
    client.send(&big.to_vec().unwrap()).await.unwrap();
    let n = client.recv(&mut buf).await.unwrap();
    let msg = Message::from_vec(&buf[..n]).unwrap();
    assert!(!msg.metadata.truncation);
    assert_eq!(msg.answers.len(), 40);

    task.abort();
    let _ = task.await;
    let records = h.audit_records().await;
    assert!(records.is_empty());
}

async fn tcp_ask(stream: &mut TcpStream, q: &[u8]) -> Message {
    stream.write_u16(q.len() as u16).await.unwrap();
    stream.write_all(q).await.unwrap();
    let len = stream.read_u16().await.unwrap();
    let mut buf = vec![0; usize::from(len)];
    stream.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

#[tokio::test]
async fn serve_tcp_answers_several_queries_per_connection() {
    let h = Harness::new("enforce", "[]");
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let server = listener.local_addr().unwrap();
    let task = tokio::spawn(serve_tcp(
        listener,
        h.ctx.clone(),
        crate::drain::Watch::never(),
    ));

    let mut stream = TcpStream::connect(server).await.unwrap();
    let msg = tcp_ask(&mut stream, &query("origin.test.", RecordType::A)).await;
    assert_eq!(addrs(&msg), vec![ip("198.18.0.1")]);
    let msg = tcp_ask(&mut stream, &query("many.test.", RecordType::A)).await;
    assert_eq!(msg.answers.len(), 40);
    let msg = tcp_ask(&mut stream, &query("evil.example.", RecordType::A)).await;
    assert_eq!(msg.metadata.response_code, ResponseCode::Refused);

    // Garbage closes that connection; others still work.
    stream.write_all(b"\x00\x03abc").await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest));
    assert_eq!(read.await.unwrap().unwrap(), 0);
    let mut again = TcpStream::connect(server).await.unwrap();
    let msg = tcp_ask(&mut again, &query("v6.test.", RecordType::AAAA)).await;
    assert_eq!(addrs(&msg), vec![ip("2001:db8::2")]);

    task.abort();
    let _ = task.await;
    let records = h.audit_records().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].host.as_deref(), Some("evil.example"));
}

#[tokio::test]
async fn hostile_packets_never_panic() {
    let h = Harness::new("enforce", "[]");
    let client = CLIENT.parse().unwrap();
    let seeds = [
        query("origin.test.", RecordType::A),
        query("many.test.", RecordType::AAAA),
        upstream_response(&query("pypi.org.", RecordType::A), false),
    ];
    // Seeded, so a failure reproduces.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x2545_f491_4f6c_dd1d);
    for i in 0..3_000 {
        let mut packet = seeds[i % seeds.len()].clone();
        for _ in 0..=rng.random_range(0..6) {
            let at = rng.random_range(0..packet.len());
            packet[at] = rng.random();
        }
        if rng.random_ratio(1, 4) {
            packet.truncate(rng.random_range(0..packet.len()));
        }
        let _ = answer(&packet, &h.ctx, client).await;
    }
    // Mutated names may have been refused and audited; the log still closes.
    let _ = h.audit_records().await;
}

#[test]
fn header_claiming_more_than_its_bytes_hold_is_dropped_unread() {
    // 65535 questions claimed, one present: hickory would reserve room for
    // all of them before finding out.
    let mut huge = query("origin.test.", RecordType::A);
    huge[4..6].copy_from_slice(&[0xff, 0xff]);
    assert!(message::parse(&huge).is_none());
    let policy = Policy::from_yaml(&policy_yaml("enforce", "[]"), "t.yaml").unwrap();
    let plan = message::plan(&huge, &policy, &[]);
    assert!(matches!(plan.action, message::Action::Drop) && plan.asked.is_none());
    // Counts that fit are read as before.
    let mut two = query("origin.test.", RecordType::A);
    two[7] = 1; // one answer claimed, none present: hickory refuses it
    assert!(message::parse(&two).is_none());
    assert!(message::parse(&query("origin.test.", RecordType::A)).is_some());
}

#[test]
fn notimp_for_many_questions_echoes_none_and_fits_udp() {
    // An IQUERY with 256 root questions (a fuzzing find): the NOTIMP used
    // to echo all of them, 1.3 KB to a client that accepts 512 bytes.
    let mut query = vec![0x00, 0x26, 0x0b, 0x07, 0x01, 0x00, 0, 0, 0, 0, 0, 0];
    query.extend(std::iter::repeat_n(0u8, 256 * 5));
    let policy = Policy::from_yaml(&policy_yaml("enforce", "[]"), "t.yaml").unwrap();
    let message::Action::Reply(reply) = message::plan(&query, &policy, &[]).action else {
        panic!("no NOTIMP");
    };
    let parsed = Message::from_vec(&reply).unwrap();
    assert_eq!(parsed.metadata.response_code, ResponseCode::NotImp);
    assert!(parsed.queries.is_empty());
    assert_eq!(message::fit_udp(&query, reply.clone()), Some(reply));
}

#[test]
fn plain_name_normalizes_or_rejects() {
    let name = |s: &str| plain_name(&Name::from_ascii(s).unwrap());
    assert_eq!(name("PyPI.Org.").as_deref(), Some("pypi.org"));
    assert_eq!(name("_dmarc.example.").as_deref(), Some("_dmarc.example"));
    assert_eq!(name("."), None);
    let odd = Name::from_labels(vec![&b"a b"[..], &b"test"[..]]).unwrap();
    assert_eq!(plain_name(&odd), None);
}

#[tokio::test]
async fn a_draining_udp_server_answers_the_query_in_flight_then_stops() {
    // An upstream the test answers by hand, once the drain has begun.
    let upstream = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let h = Harness::new(
        "enforce",
        &format!("[\"{}\"]", upstream.local_addr().unwrap()),
    );
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let server_addr = socket.local_addr().unwrap();
    let (trigger, drain) = crate::drain::trigger();
    let server = tokio::spawn(serve_udp(socket, h.ctx.clone(), drain));

    let client = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    client.connect(server_addr).await.unwrap();
    client
        .send(&query("pypi.org.", RecordType::A))
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let (n, from) = upstream.recv_from(&mut buf).await.unwrap();
    // The query is in flight: drain now, then let the upstream answer.
    trigger.drain();
    upstream
        .send_to(&upstream_response(&buf[..n], false), from)
        .await
        .unwrap();
    let n = client.recv(&mut buf).await.unwrap();
    let msg = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(msg.metadata.response_code, ResponseCode::NoError);
    assert!(!msg.answers.is_empty());
    // With nothing left in flight the server returns by itself.
    server.await.unwrap();
}

#[tokio::test]
async fn a_draining_tcp_server_closes_idle_connections_and_stops() {
    let h = Harness::new("enforce", "[]");
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let server_addr = listener.local_addr().unwrap();
    let (trigger, drain) = crate::drain::trigger();
    let server = tokio::spawn(serve_tcp(listener, h.ctx.clone(), drain));
    let mut stream = TcpStream::connect(server_addr).await.unwrap();
    let msg = tcp_ask(&mut stream, &query("origin.test.", RecordType::A)).await;
    assert_eq!(addrs(&msg), vec![ip("198.18.0.1")]);
    // Idle now: the drain closes it (EOF) and the server returns.
    trigger.drain();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    server.await.unwrap();
}
