//! What the audit log's tamper evidence costs: sealing one record line
//! (serialize, SHA-256, append the hash; what every record pays, on the
//! writer's task) beside what a line cost before (serialize, SHA-256),
//! signing one checkpoint (once per 1000 records or 10 s by default) and
//! verifying one checkpoint's signature (`sluice audit verify --key`).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use sluice::audit::{seal, AuditEvent, AuditKey, AuditRecord, CheckpointKeys, Proto, GENESIS};

fn event() -> AuditEvent {
    AuditEvent {
        sandbox: "host-4242".into(),
        path: sluice::workload::WorkloadPath::Host,
        verdict: "deny",
        rule: Some("no-metadata".into()),
        reason: "no-rule",
        proto: Proto::Tcp,
        src: Some("10.0.0.2:41234".parse().unwrap()),
        dst: Some("198.18.0.1:9090".parse().unwrap()),
        host: Some("origin.test".into()),
        bundle: "agent-default@3".into(),
        request: None,
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = AuditKey::create(dir.path()).expect("key");
    let keys = CheckpointKeys::parse(&key.public_hex()).expect("public key");
    let ts = "2025-01-01T12:00:00.123456Z".to_string();

    // What every record paid before lines carried their own hash: the same
    // serialization and one SHA-256 of the line.
    c.bench_function("audit/serialize and hash a record line (before)", |b| {
        b.iter(|| {
            let record = AuditRecord::new(event(), ts.clone(), 42, GENESIS.to_string());
            let line = serde_json::to_string(&record).unwrap();
            black_box(sluice::audit::line_hash(&line))
        })
    });
    c.bench_function("audit/seal a record line", |b| {
        b.iter(|| {
            let record = AuditRecord::new(event(), ts.clone(), 42, GENESIS.to_string());
            let body = serde_json::to_string(&record).unwrap();
            black_box(seal(&body))
        })
    });
    c.bench_function("audit/sign a checkpoint", |b| {
        b.iter(|| {
            let checkpoint = key.checkpoint(ts.clone(), 1000, GENESIS.to_string());
            black_box(seal(&serde_json::to_string(&checkpoint).unwrap()))
        })
    });
    let checkpoint = key.checkpoint(ts.clone(), 1000, GENESIS.to_string());
    c.bench_function("audit/verify a checkpoint", |b| {
        b.iter(|| black_box(keys.check(black_box(&checkpoint)).is_ok()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
