//! The DNS responder through its public API, as the integrator wires it:
//! sockets handed in, a policy handle, a shared cache the proxy reads.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use sluice::audit::AuditWriter;
use sluice::bundle::PolicyHandle;
use sluice::dns::{serve_udp, DnsCache, DnsContext};
use sluice::policy::{Policy, ResolvedNames};
use tokio::net::UdpSocket;

const POLICY: &str = r#"
version: 1
name: responder
mode: enforce
rules:
  - name: origin
    action: allow
    cidrs: ["198.18.0.1/32"]
  - name: web
    action: allow
    hosts: ["*.origin.test"]
    ports: [443]
dns:
  upstream: []
  hosts:
    origin.test: ["198.18.0.1"]
    www.origin.test: ["198.18.0.2"]
"#;

async fn ask(client: &UdpSocket, id: u16, name: &str) -> Message {
    let mut query = Message::new(id, MessageType::Query, OpCode::Query);
    query.metadata.recursion_desired = true;
    query.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    client.send(&query.to_vec().unwrap()).await.unwrap();
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), client.recv(&mut buf))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    let answer = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(answer.metadata.id, id);
    answer
}

#[tokio::test]
async fn sandbox_resolves_allowed_names_and_the_proxy_sees_them() {
    let policy = Policy::from_yaml(POLICY, "responder.yaml").unwrap();
    let (audit, writer) = AuditWriter::new(None);
    let writer = tokio::spawn(writer.run());
    let cache = Arc::new(DnsCache::new());
    let ctx = Arc::new(DnsContext {
        policy: PolicyHandle::new(policy, "responder".to_string()),
        cache: cache.clone(),
        audit,
        sandbox: "it".to_string(),
        path: sluice::workload::WorkloadPath::Host,
        default_upstream: Vec::new(),
        metrics: None,
        budget: Default::default(),
        lookups: Default::default(),
    });
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let server = socket.local_addr().unwrap();
    let task = tokio::spawn(serve_udp(
        socket,
        ctx.clone(),
        sluice::drain::Watch::never(),
    ));
    let client = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    client.connect(server).await.unwrap();

    let www = ask(&client, 1, "WWW.origin.test.").await;
    assert_eq!(www.metadata.response_code, ResponseCode::NoError);
    let ips: Vec<IpAddr> = www
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            _ => None,
        })
        .collect();
    assert_eq!(ips, vec![IpAddr::from([198, 18, 0, 2])]);
    assert!(cache.resolved("www.origin.test", IpAddr::from([198, 18, 0, 2])));
    assert_eq!(
        cache.name_for(IpAddr::from([198, 18, 0, 2])).as_deref(),
        Some("www.origin.test")
    );

    let static_only = ask(&client, 2, "origin.test.").await;
    assert_eq!(static_only.answers.len(), 1);

    let other = ask(&client, 3, "elsewhere.test.").await;
    assert_eq!(other.metadata.response_code, ResponseCode::Refused);

    task.abort();
    let _ = task.await;
    drop(ctx);
    assert_eq!(writer.await.unwrap().unwrap(), 1, "one audited refusal");
}
