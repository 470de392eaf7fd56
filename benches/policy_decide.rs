//! How long `Policy::decide` takes with a 10,000-rule policy: allowed by
//! CIDR, denied with no rule, allowed by a wildcard host, IPv6, and IPv6
//! addresses that embed IPv4 (checked against the IPv4 deny rules too).

use criterion::{criterion_group, criterion_main, Criterion};
use sluice::policy::{AnyResolution, Policy, Reason, Verdict};
use std::fmt::Write;
use std::hint::black_box;
use std::net::SocketAddr;

/// 10,000 rules: v4 and v6 networks, port lists and ranges, exact and
/// wildcard hosts, every tenth rule a deny.
fn big_policy() -> Policy {
    let mut doc = String::from("version: 1\nname: bench\nrules:\n");
    for i in 0..10_000u32 {
        let action = if i % 10 == 9 { "deny" } else { "allow" };
        let (a, b) = (i / 256, i % 256);
        let _ = write!(doc, "  - {{name: r{i}, action: {action}, ");
        match i % 4 {
            0 => {
                let _ = write!(
                    doc,
                    "cidrs: [\"10.{a}.{b}.0/24\"], ports: [443, \"8000-8100\"]"
                );
            }
            1 => {
                let _ = write!(doc, "cidrs: [\"2001:db8:{a:x}:{b:x}::/64\"], ports: [443]");
            }
            2 => {
                let _ = write!(
                    doc,
                    "hosts: [\"*.svc{i}.example.com\", \"api{i}.example.org\"], ports: [443]"
                );
            }
            _ => {
                let _ = write!(
                    doc,
                    "cidrs: [\"172.{}.{b}.0/24\"], hosts: [\"h{i}.example.net\"]",
                    16 + a % 16
                );
            }
        }
        doc.push_str("}\n");
    }
    Policy::from_yaml(&doc, "bench.yaml").expect("bench policy is valid")
}

fn bench(c: &mut Criterion) {
    let p = big_policy();
    let cases: [(&str, &str, Option<&str>, Verdict, Reason); 6] = [
        (
            "allow_by_cidr",
            "10.20.16.7:443",
            None,
            Verdict::Allow,
            Reason::AllowRule,
        ),
        (
            "deny_no_rule",
            "203.0.113.9:443",
            None,
            Verdict::Deny,
            Reason::NoRule,
        ),
        (
            "allow_by_wildcard_host",
            "198.18.0.1:443",
            Some("a.b.svc5002.example.com"),
            Verdict::Allow,
            Reason::AllowRule,
        ),
        (
            "allow_v6",
            "[2001:db8:14:11::5]:443",
            None,
            Verdict::Allow,
            Reason::AllowRule,
        ),
        (
            // NAT64 of 172.16.19.5, which deny rule r19 names.
            "deny_nat64_by_ipv4_rule",
            "[64:ff9b::ac10:1305]:443",
            None,
            Verdict::Deny,
            Reason::DenyRule,
        ),
        (
            // 6to4 of 203.0.113.9: no rule, after the IPv4 deny lookup.
            "deny_6to4_no_rule",
            "[2002:cb00:7109::1]:443",
            None,
            Verdict::Deny,
            Reason::NoRule,
        ),
    ];
    for (name, dst, host, verdict, reason) in cases {
        let dst: SocketAddr = dst.parse().expect("address");
        let d = p.decide(dst, host, &AnyResolution);
        assert_eq!((d.verdict, d.reason), (verdict, reason), "{name}: {d:?}");
        c.bench_function(&format!("decide/{name}"), |b| {
            b.iter(|| p.decide(black_box(dst), black_box(host), &AnyResolution))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
