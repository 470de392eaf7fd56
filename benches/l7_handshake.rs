//! The TLS work behind one `l7` connection, in memory (no sockets, no
//! processes): the second instrument beside `sluice bench`'s `l7`
//! workload. A relayed TLS connection costs sluice no cryptography; a
//! terminated one costs it a server handshake with the sandbox CA's cached
//! leaf and a client handshake to the origin (verifying its chain), which
//! together are the operations of one whole direct handshake (client and
//! server side). So `tls_handshake_direct` predicts the extra proxy CPU per
//! connection that the bench's `l7` column shows over its `tls` column,
//! and `tls_handshake_terminated` is the two handshakes as sluice makes
//! them (its leaf resolver, its upstream configuration).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use rustls::pki_types::ServerName;
use sluice::intercept::ca::SandboxCa;
use sluice::testbed::tls::{client_config, TestPki};

const NAME: &str = "l7.bench.test";

/// Drive one handshake between fresh connections to its end, moving the
/// records through memory.
fn handshake(client: &Arc<rustls::ClientConfig>, server: &Arc<rustls::ServerConfig>) {
    let name = ServerName::try_from(NAME).unwrap();
    let mut c = rustls::ClientConnection::new(client.clone(), name).unwrap();
    let mut s = rustls::ServerConnection::new(server.clone()).unwrap();
    let mut buf = Vec::with_capacity(8192);
    while c.is_handshaking() || s.is_handshaking() {
        buf.clear();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        let mut read = &buf[..];
        while !read.is_empty() {
            s.read_tls(&mut read).unwrap();
            s.process_new_packets().unwrap();
        }
        buf.clear();
        while s.wants_write() {
            s.write_tls(&mut buf).unwrap();
        }
        let mut read = &buf[..];
        while !read.is_empty() {
            c.read_tls(&mut read).unwrap();
            c.process_new_packets().unwrap();
        }
    }
}

fn bench(c: &mut Criterion) {
    let origin = TestPki::issue(&[NAME]).unwrap();
    let origin_server = origin.server_config().unwrap();
    let trusts_origin = client_config(&origin.ca_pem, None).unwrap();
    let ca = Arc::new(SandboxCa::mint("bench").unwrap());
    // The leaf is minted on the first connection and cached after.
    ca.leaf(NAME).unwrap();
    let sluice_server = ca.server_config(NAME);
    let trusts_sandbox = client_config(ca.cert_pem(), None).unwrap();

    c.bench_function("tls_handshake_direct", |b| {
        b.iter(|| handshake(&trusts_origin, &origin_server))
    });
    c.bench_function("tls_handshake_terminated", |b| {
        b.iter(|| {
            // The workload to sluice, then sluice to the origin.
            handshake(&trusts_sandbox, &sluice_server);
            handshake(&trusts_origin, &origin_server);
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
