//! What a connection pays when its SNI/Host names a host the sandbox never
//! resolved through sluice (a cache miss): sluice's own lookup through a
//! local upstream that answers at once, the answer parsed and cached, and
//! the address compared. Against a real resolver add its round trip. The
//! hit (the name is cached) is `Policy::decide` alone: see policy_decide.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use hickory_proto::op::{Message, MessageType, OpCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record};
use sluice::audit::AuditWriter;
use sluice::bundle::PolicyHandle;
use sluice::dns::{DnsCache, DnsContext};
use sluice::policy::Policy;

/// A resolver on loopback answering every query with 198.18.0.7, on its own
/// thread.
fn upstream() -> SocketAddr {
    let socket = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = socket.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                return;
            };
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut r = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
            r.metadata.recursion_desired = true;
            r.metadata.recursion_available = true;
            r.queries = q.queries.clone();
            let owner = q.queries[0].name().clone();
            r.add_answer(Record::from_rdata(
                owner,
                60,
                RData::A(A(Ipv4Addr::new(198, 18, 0, 7))),
            ));
            let _ = socket.send_to(&r.to_vec().unwrap(), from);
        }
    });
    addr
}

fn bench(c: &mut Criterion) {
    let upstream = upstream();
    let yaml = format!(
        "version: 1\nname: bench\nrules:\n  - {{name: api, action: allow, hosts: [\"*.example\"], ports: [443]}}\ndns:\n  upstream: [\"{upstream}\"]\n  limits: {{queries_per_minute: 1000000, names_per_minute: 10000}}\n"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (audit, _writer) = runtime.block_on(async { AuditWriter::new(None) });
    let dst: IpAddr = "198.18.0.7".parse().unwrap();
    c.bench_function("hostname_verify_cache_miss", |b| {
        b.iter_batched(
            || {
                DnsContext::new(
                    PolicyHandle::new(
                        Policy::from_yaml(&yaml, "bench.yaml").unwrap(),
                        "bench@1".to_string(),
                    ),
                    Arc::new(DnsCache::new()),
                    audit.clone(),
                    "sb-bench".to_string(),
                    sluice::workload::WorkloadPath::Host,
                )
            },
            |ctx| {
                let confirmed = runtime.block_on(ctx.verify("api.example", dst));
                assert!(confirmed);
                ctx
            },
            criterion::BatchSize::SmallInput,
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
