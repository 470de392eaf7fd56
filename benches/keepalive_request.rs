//! What sluice's side costs per extra request on a kept-alive plain-HTTP
//! connection whose requests are each decided (one a hosts rule admitted):
//! the head read for its Host (`peek::inspect`), framed
//! (`http1::request`) and decided (`Policy::decide`). The bytes themselves
//! are copied through user space, as on every path; that is the rest of
//! its cost and scales with the body, not with the request count.

use criterion::{criterion_group, criterion_main, Criterion};
use sluice::policy::{AnyResolution, Policy, Verdict};
use sluice::proxy::http1;
use sluice::proxy::peek::{inspect, Peeked};
use std::hint::black_box;
use std::net::SocketAddr;

const HEAD: &[u8] = b"GET /simple/requests/ HTTP/1.1\r\nHost: pypi.org\r\nUser-Agent: pip/24.0\r\nAccept: text/html\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n\r\n";

fn bench(c: &mut Criterion) {
    let policy = Policy::from_yaml(
        "version: 1\nname: bench\nrules:\n  - {name: pypi, action: allow, hosts: [\"pypi.org\", \"*.pythonhosted.org\"], ports: [80]}\n  - {name: no-bank, action: deny, hosts: [\"bank.test\"]}\n",
        "bench.yaml",
    )
    .unwrap();
    let dst: SocketAddr = "198.18.0.7:80".parse().unwrap();
    c.bench_function("keepalive_request_checked", |b| {
        b.iter(|| {
            let head = black_box(HEAD);
            let Peeked::Http { host } = inspect(head) else {
                panic!("a request head");
            };
            let request = http1::request(head).unwrap();
            let d = policy.decide(dst, host, &AnyResolution);
            assert_eq!(d.verdict, Verdict::Allow);
            black_box(request.head_len)
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
