//! What `--metrics` costs one connection: the handles of a path opened at
//! accept, connect and first byte observed, the end counted (verdict, rule,
//! bytes) and the guard dropped, as `proxy::connection` does. Allowed by a
//! named rule, and denied with no rule (which also counts a deny reason).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use prometheus::Registry;
use sluice::metrics::Metrics;
use sluice::outcome::{Cause, Outcome, Verdict};
use sluice::policy::{Mode, Reason};
use sluice::workload::WorkloadPath;

fn connection_metrics(c: &mut Criterion) {
    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    let path = metrics.path(WorkloadPath::Host);
    let allowed = Outcome {
        verdict: Verdict::Allow,
        rule: Some(Arc::from("allow-origin")),
        cause: Cause::Allowed,
    };
    let denied = Outcome::refused(Reason::NoRule, Mode::Enforce);
    c.bench_function("metrics of one allowed connection", |b| {
        b.iter(|| {
            let m = path.opened();
            m.connected(Duration::from_micros(80));
            m.first_byte(Duration::from_micros(160));
            m.ended(black_box(&allowed), 1024, 1024);
        })
    });
    c.bench_function("metrics of one denied connection", |b| {
        b.iter(|| path.opened().ended(black_box(&denied), 0, 0))
    });
}

criterion_group!(benches, connection_metrics);
criterion_main!(benches);
