//! How long verify-then-swap takes for a signed 10,000-rule bundle: read the
//! .tar.gz, check digests and the Ed25519 signature, parse and compile the
//! policy, and swap it into the live handle.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use sluice::bundle::{keygen, sign, Bundle, PolicyHandle, TrustStore};
use sluice::policy::Policy;

fn ten_thousand_rules() -> String {
    let mut policy = String::from("version: 1\nname: big\nrules:\n");
    for i in 0..10_000u32 {
        policy.push_str(&format!(
            "  - name: r{i}\n    action: allow\n    cidrs: [\"10.{}.{}.0/24\"]\n    ports: [443, \"8000-8100\"]\n",
            i / 256,
            i % 256
        ));
    }
    policy
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = dir.path().join("key");
    let trust_path = dir.path().join("trust.yaml");
    keygen(&key, &trust_path, "bench").expect("keygen");
    let policy_path = dir.path().join("policy.yaml");
    std::fs::write(&policy_path, ten_thousand_rules()).expect("write policy");
    let bundle = dir.path().join("big.tar.gz");
    let expires = time::OffsetDateTime::now_utc() + time::Duration::days(1);
    sign(&key, &policy_path, 1, expires, &bundle).expect("sign");
    let trust = TrustStore::load(&trust_path).expect("trust");
    let small = "version: 1\nname: small\nrules:\n  - {name: a, action: allow, cidrs: [\"198.18.0.1/32\"]}\n";
    let handle = PolicyHandle::new(
        Policy::from_yaml(small, "small.yaml").expect("small policy"),
        "small".into(),
    );

    let mut group = c.benchmark_group("bundle");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("verify_then_swap_10000_rules", |b| {
        b.iter(|| {
            let verified =
                Bundle::load(black_box(&bundle), &trust, time::OffsetDateTime::now_utc())
                    .expect("bundle verifies");
            let label = verified.label();
            handle.swap(verified.policy, label);
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
