//! Addresses that embed IPv4 (NAT64, 6to4, Teredo, IPv4-compatible) are
//! judged by the IPv4 inside: `private-address` for hosts rules, and IPv4
//! deny rules; an IPv4 allow rule does not admit them.

use super::*;
use crate::policy::AnyResolution;

/// A hosts rule on 443; every IPv6 address allowed on 8443 except what the
/// IPv4 deny rule names.
const EMBEDDED: &str = r#"
version: 1
name: embedded
rules:
  - name: web
    action: allow
    hosts: ["origin.test"]
    ports: [443]
  - name: any-v6
    action: allow
    cidrs: ["::/0"]
    ports: [8443]
  - name: no-internal
    action: deny
    cidrs: ["10.0.0.0/8"]
    ports: [8443]
"#;

/// The decision for `ip` on 443 by name, and on 8443 by address.
fn judged(ip: &str) -> (String, String) {
    let p = policy(EMBEDDED);
    let by_name = p.decide(
        sa(&format!("[{ip}]:443")),
        Some("origin.test"),
        &AnyResolution,
    );
    let by_address = p.decide(sa(&format!("[{ip}]:8443")), None, &AnyResolution);
    (show(by_name), show(by_address))
}

fn judged_as_ten_0_0_1(ip: &str) {
    assert_eq!(
        judged(ip),
        (
            "deny/private-address/web".to_string(),
            "deny/deny-rule/no-internal".to_string()
        ),
        "{ip}"
    );
}

#[test]
fn nat64_well_known_prefix_is_judged_by_its_ipv4() {
    // 64:ff9b::/96, RFC 6052: the last 32 bits.
    judged_as_ten_0_0_1("64:ff9b::a00:1");
    judged_as_ten_0_0_1("64:ff9b::10.0.0.1");
}

#[test]
fn nat64_local_use_prefix_is_judged_by_its_ipv4() {
    // 64:ff9b:1::/48, RFC 8215 with the RFC 6052 layout for a /48: bits
    // 48-63 and 72-87 (bits 64-71 are the reserved octet).
    judged_as_ten_0_0_1("64:ff9b:1:a00:0:100::");
}

#[test]
fn six_to_four_is_judged_by_its_ipv4() {
    // 2002::/16, RFC 3056: bits 16-47.
    judged_as_ten_0_0_1("2002:a00:1::1");
}

#[test]
fn teredo_client_is_judged_by_its_ipv4() {
    // 2001::/32, RFC 4380: the client is the last 32 bits inverted
    // (10.0.0.1 -> f5ff:fffe); the server here is 198.51.100.1.
    judged_as_ten_0_0_1("2001:0:c633:6401::f5ff:fffe");
}

#[test]
fn teredo_server_is_judged_by_its_ipv4() {
    // Bits 32-63 are the Teredo server's IPv4; the client is 198.18.0.1.
    judged_as_ten_0_0_1("2001:0:a00:1::39ed:fffe");
}

#[test]
fn ipv4_compatible_is_judged_by_its_ipv4() {
    judged_as_ten_0_0_1("::a00:1");
}

#[test]
fn embedded_public_ipv4_is_not_private() {
    // NAT64 of the benchmark origin 198.18.0.1: a hosts rule admits it.
    let p = policy(EMBEDDED);
    let d = p.decide(
        sa("[64:ff9b::c612:1]:443"),
        Some("origin.test"),
        &AnyResolution,
    );
    assert_eq!(show(d), "allow/allow-rule/web");
}

#[test]
fn an_ipv4_allow_rule_does_not_admit_embedded_forms() {
    let p = policy(
        "version: 1\nname: t\nrules:\n  - {name: inside, action: allow, cidrs: [\"198.18.0.0/15\"]}\n",
    );
    for ip in ["64:ff9b::c612:1", "2002:c612:1::1", "::c612:1"] {
        let d = p.decide(sa(&format!("[{ip}]:80")), None, &AnyResolution);
        assert_eq!(show(d), "deny/no-rule/-", "{ip}");
    }
}

#[test]
fn an_ipv6_rule_admits_its_embedded_forms() {
    let p = policy(
        "version: 1\nname: t\nrules:\n  - {name: nat64, action: allow, cidrs: [\"64:ff9b::/96\"]}\n",
    );
    let d = p.decide(sa("[64:ff9b::c612:1]:80"), None, &AnyResolution);
    assert_eq!(show(d), "allow/allow-rule/nat64");
}

#[test]
fn the_first_deny_rule_in_file_order_wins_across_the_address_and_its_ipv4() {
    let p = policy(
        r#"
version: 1
name: t
rules:
  - {name: v4-first, action: deny, cidrs: ["10.0.0.0/8"]}
  - {name: v6-second, action: deny, cidrs: ["2002::/16"]}
  - {name: v6-first, action: deny, cidrs: ["64:ff9b::/96"]}
  - {name: v4-second, action: deny, cidrs: ["10.0.0.0/24"]}
"#,
    );
    let d = p.decide(sa("[2002:a00:1::1]:80"), None, &AnyResolution);
    assert_eq!(show(d), "deny/deny-rule/v4-first");
    let p = policy(
        r#"
version: 1
name: t
rules:
  - {name: v6-first, action: deny, cidrs: ["64:ff9b::/96"]}
  - {name: v4-second, action: deny, cidrs: ["10.0.0.0/8"]}
"#,
    );
    let d = p.decide(sa("[64:ff9b::a00:1]:80"), None, &AnyResolution);
    assert_eq!(show(d), "deny/deny-rule/v6-first");
}

#[test]
fn loopback_and_unspecified_ipv6_are_not_read_as_ipv4_compatible() {
    // ::1 and :: are IPv6's own; an IPv4 deny for 0.0.0.0/8 does not name them.
    let p = policy(
        "version: 1\nname: t\nrules:\n  - {name: all, action: allow, cidrs: [\"::/0\"]}\n  - {name: zero, action: deny, cidrs: [\"0.0.0.0/8\"]}\n",
    );
    // (::/0 does not admit them either: they are the local host.)
    for ip in ["::1", "::"] {
        let d = p.decide(sa(&format!("[{ip}]:80")), None, &AnyResolution);
        assert_eq!(show(d), "deny/loopback-address/all", "{ip}");
    }
}
