//! `dns.hosts` pins its names and `dns.limits` is read like every other
//! key: defaults when absent, each violation at its `FILE:LINE:COL`.

use super::*;
use crate::policy::DnsLimits;

const PINNED: &str = r#"
version: 1
name: t
rules:
  - name: origin
    action: allow
    hosts: ["origin.test"]
    ports: [8443]
dns:
  upstream: []
  hosts:
    origin.test: ["198.18.0.1"]
"#;

#[test]
fn a_pinned_name_is_admitted_at_its_pin_without_any_lookup() {
    // `curl --resolve origin.test:8443:198.18.0.1`: the sandbox never asked
    // sluice's DNS, and the policy itself says where origin.test is.
    let p = policy(PINNED);
    let d = p.decide(sa("198.18.0.1:8443"), Some("origin.test"), &NothingResolved);
    assert_eq!(show(d), "allow/allow-rule/origin");
}

#[test]
fn a_pinned_name_is_refused_elsewhere_whatever_a_resolver_remembers() {
    let p = policy(PINNED);
    let resolver = Resolved(vec![("origin.test", "198.18.0.2".parse().unwrap())]);
    let d = p.decide(sa("198.18.0.2:8443"), Some("origin.test"), &resolver);
    assert_eq!(show(d), "deny/host-address-mismatch/origin");
    assert!(p.pins("Origin.Test."));
    assert!(!p.pins("other.test"));
}

#[test]
fn dns_limits_default_to_what_ordinary_clients_need() {
    let p = policy("version: 1\nname: t\n");
    let l = &p.dns().limits;
    assert_eq!(*l, DnsLimits::default());
    for (t, code) in [
        ("A", 1),
        ("CNAME", 5),
        ("AAAA", 28),
        ("SVCB", 64),
        ("HTTPS", 65),
    ] {
        assert!(l.forwards_type(code), "{t}");
    }
    assert!(!l.forwards_type(16), "TXT");
    assert!(!l.forwards_type(255), "ANY");
    assert_eq!(l.max_name_length, 128);
    assert_eq!(l.queries_per_minute, 6_000);
    assert_eq!(l.names_per_minute, 120);
}

#[test]
fn dns_limits_are_read_from_the_policy() {
    let p = policy(
        "version: 1\nname: t\ndns:\n  limits:\n    query_types: [a, TXT, TYPE99]\n    max_name_length: 60\n    queries_per_minute: 10\n    names_per_minute: 3\n",
    );
    let l = &p.dns().limits;
    assert_eq!(l.query_types, vec![1, 16, 99]);
    assert_eq!(l.max_name_length, 60);
    assert_eq!(l.queries_per_minute, 10);
    assert_eq!(l.names_per_minute, 3);
}

#[test]
fn bad_dns_limits_are_each_reported_at_their_node() {
    let e = rejected(
        "version: 1\nname: t\ndns:\n  limits:\n    query_types: [A, BOGUS]\n    max_name_length: 300\n    queries_per_minute: zero\n    names_per_minute: 0\n    burst: 5\n",
    );
    let at = |pos: &str, word: &str| {
        assert!(
            e.lines()
                .any(|l| l.starts_with(&format!("test.yaml:{pos}: ")) && l.contains(word)),
            "no violation at {pos} with {word:?} in:\n{e}"
        );
    };
    at("5:22", "`BOGUS` is not a DNS query type");
    at("6:22", "from 1 to 253");
    at("7:25", "must be a whole number");
    at("8:23", "from 1 to 10000");
    at("9:5", "burst");
}

#[test]
fn a_dns_section_or_limits_that_is_not_a_mapping_is_reported_at_its_node() {
    let e = rejected("version: 1\nname: t\ndns: 5\n");
    assert!(
        e.contains("test.yaml:3:6: `dns` must be a mapping with the keys"),
        "{e}"
    );
    let e = rejected("version: 1\nname: t\ndns:\n  limits: [1]\n");
    assert!(
        e.contains("test.yaml:4:11: `dns.limits` must be a mapping with the keys"),
        "{e}"
    );
}

#[test]
fn an_empty_dns_section_or_limits_means_the_defaults() {
    let p = Policy::from_yaml("version: 1\nname: t\nrules: []\ndns:\n", "test.yaml");
    assert!(p.is_ok(), "{:?}", p.err());
    let p = Policy::from_yaml(
        "version: 1\nname: t\nrules: []\ndns:\n  limits:\n",
        "test.yaml",
    );
    assert!(p.is_ok(), "{:?}", p.err());
}
