//! Decisions: which rule wins and why.

use super::*;
use crate::policy::{AnyResolution, Mode, Reason, Verdict};

const BASIC: &str = r#"
version: 1
name: basic
rules:
  - name: origin
    action: allow
    cidrs: ["198.18.0.0/24", "2001:db8::/64"]
    ports: [8080, "9000-9100"]
  - name: pypi
    action: allow
    hosts: ["pypi.org", "*.pythonhosted.org"]
    ports: [443]
  - name: no-admin
    action: deny
    cidrs: ["198.18.0.1/32"]
    ports: [9050]
  - name: no-metadata
    action: deny
    cidrs: ["169.254.169.254/32"]
"#;

fn basic(dst: &str, host: Option<&str>) -> String {
    show(policy(BASIC).decide(sa(dst), host, &AnyResolution))
}

#[test]
fn cidr_rule_allows_listed_port() {
    assert_eq!(basic("198.18.0.7:8080", None), "allow/allow-rule/origin");
    assert_eq!(basic("198.18.0.7:9100", None), "allow/allow-rule/origin");
}

#[test]
fn cidr_rule_refuses_other_ports() {
    assert_eq!(basic("198.18.0.7:22", None), "deny/no-rule/-");
    assert_eq!(basic("198.18.0.7:9101", None), "deny/no-rule/-");
}

#[test]
fn default_is_deny_with_no_rule() {
    let p = policy(BASIC);
    let d = p.decide(sa("203.0.113.9:443"), None, &AnyResolution);
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.reason, Reason::NoRule);
    assert_eq!(d.rule, None);
}

#[test]
fn deny_beats_allow() {
    assert_eq!(basic("198.18.0.1:9050", None), "deny/deny-rule/no-admin");
}

#[test]
fn deny_beats_allow_even_when_listed_after_and_matched_by_name() {
    let p = policy(
        r#"
version: 1
name: t
rules:
  - {name: all, action: allow, cidrs: ["0.0.0.0/0"]}
  - {name: first-deny, action: deny, hosts: ["evil.test"]}
  - {name: second-deny, action: deny, cidrs: ["198.18.0.0/15"]}
"#,
    );
    let d = p.decide(sa("198.18.0.1:443"), Some("evil.test"), &AnyResolution);
    assert_eq!(show(d), "deny/deny-rule/first-deny");
}

#[test]
fn first_matching_deny_rule_in_file_order_is_reported() {
    let p = policy(
        r#"
version: 1
name: t
rules:
  - {name: wide, action: deny, cidrs: ["198.18.0.0/15"], ports: [80]}
  - {name: narrow, action: deny, cidrs: ["198.18.0.1/32"]}
  - {name: wide-any, action: deny, cidrs: ["198.0.0.0/8"]}
"#,
    );
    assert_eq!(
        show(p.decide(sa("198.18.0.1:80"), None, &AnyResolution)),
        "deny/deny-rule/wide"
    );
    assert_eq!(
        show(p.decide(sa("198.18.0.1:81"), None, &AnyResolution)),
        "deny/deny-rule/narrow"
    );
    assert_eq!(
        show(p.decide(sa("198.18.0.2:81"), None, &AnyResolution)),
        "deny/deny-rule/wide-any"
    );
}

#[test]
fn first_matching_allow_rule_in_file_order_is_reported() {
    let p = policy(
        r#"
version: 1
name: t
rules:
  - {name: inner, action: allow, cidrs: ["198.18.0.1/32"], ports: [1]}
  - {name: outer, action: allow, cidrs: ["198.18.0.0/16"]}
  - {name: inner-any, action: allow, cidrs: ["198.18.0.1/32"]}
"#,
    );
    assert_eq!(
        show(p.decide(sa("198.18.0.1:1"), None, &AnyResolution)),
        "allow/allow-rule/inner"
    );
    assert_eq!(
        show(p.decide(sa("198.18.0.1:2"), None, &AnyResolution)),
        "allow/allow-rule/outer"
    );
}

#[test]
fn metadata_deny_applies_on_every_port() {
    assert_eq!(
        basic("169.254.169.254:80", None),
        "deny/deny-rule/no-metadata"
    );
    assert_eq!(
        basic("169.254.169.254:65535", None),
        "deny/deny-rule/no-metadata"
    );
}

#[test]
fn ipv6_cidr_matches() {
    assert_eq!(
        basic("[2001:db8::42]:8080", None),
        "allow/allow-rule/origin"
    );
    assert_eq!(basic("[2001:db8:0:1::42]:8080", None), "deny/no-rule/-");
}

#[test]
fn ipv4_mapped_destination_matches_as_ipv4() {
    assert_eq!(
        basic("[::ffff:198.18.0.7]:8080", None),
        "allow/allow-rule/origin"
    );
    assert_eq!(
        basic("[::ffff:198.18.0.1]:9050", None),
        "deny/deny-rule/no-admin"
    );
}

#[test]
fn ipv4_mapped_cidr_in_policy_matches_ipv4_destination() {
    let p = policy(
        "version: 1\nname: t\nrules: [{name: m, action: allow, cidrs: [\"::ffff:198.18.0.0/120\"]}]\n",
    );
    assert_eq!(p.rules()[0].cidrs[0].to_string(), "198.18.0.0/24");
    assert_eq!(
        show(p.decide(sa("198.18.0.9:1"), None, &AnyResolution)),
        "allow/allow-rule/m"
    );
}

#[test]
fn exact_host_matches_case_insensitively_and_ignores_trailing_dot() {
    assert_eq!(
        basic("203.0.113.5:443", Some("PyPI.ORG.")),
        "allow/allow-rule/pypi"
    );
}

#[test]
fn wildcard_matches_one_or_more_labels() {
    assert_eq!(
        basic("203.0.113.5:443", Some("files.pythonhosted.org")),
        "allow/allow-rule/pypi"
    );
    assert_eq!(
        basic("203.0.113.5:443", Some("a.b.pythonhosted.org")),
        "allow/allow-rule/pypi"
    );
}

#[test]
fn wildcard_does_not_match_apex() {
    assert_eq!(
        basic("203.0.113.5:443", Some("pythonhosted.org")),
        "deny/no-rule/-"
    );
}

#[test]
fn exact_host_does_not_match_subdomains_or_lookalikes() {
    assert_eq!(
        basic("203.0.113.5:443", Some("www.pypi.org")),
        "deny/no-rule/-"
    );
    assert_eq!(
        basic("203.0.113.5:443", Some("evilpypi.org")),
        "deny/no-rule/-"
    );
    assert_eq!(
        basic("203.0.113.5:443", Some("evilpythonhosted.org")),
        "deny/no-rule/-"
    );
}

#[test]
fn host_rule_respects_ports() {
    assert_eq!(basic("203.0.113.5:80", Some("pypi.org")), "deny/no-rule/-");
}

#[test]
fn host_rule_refuses_unresolved_address() {
    let p = policy(BASIC);
    let d = p.decide(sa("203.0.113.5:443"), Some("pypi.org"), &NothingResolved);
    assert_eq!(show(d), "deny/host-address-mismatch/pypi");
}

#[test]
fn host_rule_allows_resolved_address_only() {
    let p = policy(BASIC);
    let dns = Resolved(vec![("pypi.org", "203.0.113.5".parse().unwrap())]);
    assert_eq!(
        show(p.decide(sa("203.0.113.5:443"), Some("PYPI.org"), &dns)),
        "allow/allow-rule/pypi"
    );
    assert_eq!(
        show(p.decide(sa("203.0.113.6:443"), Some("pypi.org"), &dns)),
        "deny/host-address-mismatch/pypi"
    );
}

#[test]
fn host_rule_refuses_private_address() {
    let p = policy(BASIC);
    for dst in [
        "127.0.0.1:443",
        "10.0.0.1:443",
        "[::1]:443",
        "[::ffff:192.168.1.1]:443",
        "[fd00::1]:443",
    ] {
        let d = p.decide(sa(dst), Some("pypi.org"), &AnyResolution);
        assert_eq!(show(d), "deny/private-address/pypi", "{dst}");
    }
}

#[test]
fn cidr_allow_admits_private_address_even_with_host() {
    let p = policy(
        r#"
version: 1
name: t
rules:
  - {name: by-name, action: allow, hosts: ["db.internal"]}
  - {name: lan, action: allow, cidrs: ["10.0.0.0/8"], ports: [5432]}
"#,
    );
    assert_eq!(
        show(p.decide(sa("10.1.2.3:5432"), Some("db.internal"), &NothingResolved)),
        "allow/allow-rule/lan"
    );
    assert_eq!(
        show(p.decide(sa("10.1.2.3:5433"), Some("db.internal"), &AnyResolution)),
        "deny/private-address/by-name"
    );
}

#[test]
fn deny_host_rule_denies_regardless_of_resolution() {
    let p = policy(
        r#"
version: 1
name: t
rules:
  - {name: all, action: allow, cidrs: ["0.0.0.0/0", "::/0"]}
  - {name: no-evil, action: deny, hosts: ["*.evil.test"]}
"#,
    );
    let d = p.decide(sa("203.0.113.1:443"), Some("x.EVIL.test"), &NothingResolved);
    assert_eq!(show(d), "deny/deny-rule/no-evil");
    let d = p.decide(sa("203.0.113.1:443"), Some("good.test"), &NothingResolved);
    assert_eq!(show(d), "allow/allow-rule/all");
}

#[test]
fn rule_with_cidrs_and_hosts_matches_either() {
    let p = policy(
        r#"
version: 1
name: t
rules:
  - {name: both, action: allow, cidrs: ["198.18.0.1/32"], hosts: ["origin.test"]}
"#,
    );
    assert_eq!(
        show(p.decide(sa("198.18.0.1:1"), None, &NothingResolved)),
        "allow/allow-rule/both"
    );
    assert_eq!(
        show(p.decide(sa("198.18.0.2:1"), Some("origin.test"), &AnyResolution)),
        "allow/allow-rule/both"
    );
}

#[test]
fn invalid_hostname_from_the_wire_matches_no_host_rule() {
    assert_eq!(
        basic("203.0.113.5:443", Some("*.pythonhosted.org")),
        "deny/no-rule/-"
    );
    assert_eq!(
        basic("203.0.113.5:443", Some(".pythonhosted.org")),
        "deny/no-rule/-"
    );
    assert_eq!(basic("203.0.113.5:443", Some("")), "deny/no-rule/-");
}

#[test]
fn whole_address_space_rules_match_extremes() {
    let p = policy(
        "version: 1\nname: t\nrules: [{name: all, action: allow, cidrs: [\"0.0.0.0/0\", \"::/0\"]}]\n",
    );
    for dst in [
        "255.255.255.255:1",
        "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:1",
    ] {
        assert_eq!(
            show(p.decide(sa(dst), None, &AnyResolution)),
            "allow/allow-rule/all",
            "{dst}"
        );
    }
    // The unspecified addresses reach the local host: not through this rule.
    for dst in ["0.0.0.0:1", "[::]:1"] {
        assert_eq!(
            show(p.decide(sa(dst), None, &AnyResolution)),
            "deny/loopback-address/all",
            "{dst}"
        );
    }
}

const EVERYWHERE: &str =
    "version: 1\nname: t\nrules: [{name: all, action: allow, cidrs: [\"0.0.0.0/0\", \"::/0\", \"64:ff9b::/96\"]}]\n";

#[test]
fn a_rule_for_everywhere_never_admits_loopback_in_any_spelling() {
    let p = policy(EVERYWHERE);
    for dst in [
        "127.0.0.1:11434",
        "127.1.2.3:11434",
        "[::1]:11434",
        "[::ffff:127.0.0.1]:11434",
        "[64:ff9b::7f00:1]:11434",
        "[2002:7f00:1::1]:11434",
        "[::127.0.0.1]:11434",
        "[2001:0:7f00:1::]:11434",
        "0.0.0.0:11434",
        "[::]:11434",
        "[::ffff:0.0.0.0]:11434",
    ] {
        assert_eq!(
            show(p.decide(sa(dst), None, &AnyResolution)),
            "deny/loopback-address/all",
            "{dst}"
        );
    }
}

#[test]
fn a_rule_naming_loopback_admits_it_and_only_there() {
    let p = policy(
        "version: 1\nname: t\nrules:\n  - {name: all, action: allow, cidrs: [\"0.0.0.0/0\", \"::/0\"]}\n  - {name: ollama, action: allow, cidrs: [\"127.0.0.1/32\", \"::1/128\"], ports: [11434]}\n",
    );
    for dst in ["127.0.0.1:11434", "[::ffff:127.0.0.1]:11434", "[::1]:11434"] {
        assert_eq!(
            show(p.decide(sa(dst), None, &AnyResolution)),
            "allow/allow-rule/ollama",
            "{dst}"
        );
    }
    for dst in [
        "127.0.0.1:22",
        "127.0.0.2:11434",
        "[64:ff9b::7f00:1]:11434",
        "0.0.0.0:11434",
    ] {
        assert_eq!(
            show(p.decide(sa(dst), None, &AnyResolution)),
            "deny/loopback-address/all",
            "{dst}"
        );
    }
}

#[test]
fn audit_mode_is_reported_and_decides_the_same() {
    let p = policy(&BASIC.replace("name: basic", "name: basic\nmode: audit"));
    assert_eq!(p.mode(), Mode::Audit);
    assert_eq!(policy(BASIC).mode(), Mode::Enforce);
    assert_eq!(
        show(p.decide(sa("198.18.0.1:9050"), None, &AnyResolution)),
        "deny/deny-rule/no-admin"
    );
}

#[test]
fn host_can_matter_only_on_ports_of_host_rules() {
    let p = policy(BASIC);
    assert!(p.host_can_matter(443));
    assert!(!p.host_can_matter(8080));
    let any =
        policy("version: 1\nname: t\nrules: [{name: d, action: deny, hosts: [\"x.test\"]}]\n");
    assert!(any.host_can_matter(1) && any.host_can_matter(65535));
    let none = policy(
        "version: 1\nname: t\nrules: [{name: c, action: allow, cidrs: [\"198.18.0.0/15\"]}]\n",
    );
    assert!(!none.host_can_matter(443));
}

#[test]
fn only_connections_a_hostname_could_still_change_have_each_request_decided() {
    let p = policy(
        r#"
version: 1
name: t
rules:
  - {name: lan, action: allow, cidrs: ["198.18.0.0/24"], ports: [8080, 8081]}
  - {name: api, action: allow, hosts: ["api.test"], ports: [8080]}
  - {name: bank, action: deny, hosts: ["bank.test"], ports: [8081]}
"#,
    );
    // Admitted by address, and no hosts rule could deny on the port: the
    // connection is relayed unread (the plain relay).
    let p2 = policy(
        "version: 1\nname: t\nrules: [{name: c, action: allow, cidrs: [\"198.18.0.0/24\"], ports: [8080]}]\n",
    );
    assert!(!p2.host_decides_each_request(sa("198.18.0.1:8080")));
    // Admitted by address alone, an allow hosts rule on the port cannot
    // take it away: still unread.
    assert!(!p.host_decides_each_request(sa("198.18.0.1:8080")));
    // A deny hosts rule covers the port: every request is decided.
    assert!(p.host_decides_each_request(sa("198.18.0.1:8081")));
    // Admitted only by a hosts rule: every request is decided.
    assert!(p.host_decides_each_request(sa("198.18.1.1:8080")));
}

#[test]
fn admits_names_of_allow_host_rules_only() {
    let p = policy(
        r#"
version: 1
name: t
rules:
  - {name: pypi, action: allow, hosts: ["pypi.org", "*.pythonhosted.org", "bad.pypi.org"], ports: [443]}
  - {name: no-bad, action: deny, hosts: ["bad.pypi.org"]}
  - {name: no-web, action: deny, hosts: ["web.pythonhosted.org"], ports: [80]}
dns:
  hosts: {"static.test": ["198.18.0.1"]}
"#,
    );
    assert!(p.admits_name("PyPI.org."));
    assert!(p.admits_name("files.pythonhosted.org"));
    assert!(
        p.admits_name("web.pythonhosted.org"),
        "deny on one port only"
    );
    assert!(!p.admits_name("bad.pypi.org"), "denied on every port");
    assert!(!p.admits_name("pythonhosted.org"));
    assert!(
        !p.admits_name("static.test"),
        "dns.hosts alone does not admit"
    );
    assert!(!p.admits_name("example.com"));
}

#[test]
fn accessors_expose_name_rules_and_dns() {
    let p = policy(
        r#"
version: 1
name: acc
rules:
  - {name: r, action: allow, cidrs: ["198.18.0.1"], hosts: ["A.test."], ports: ["9000-9100", 80, 81, 9050]}
dns:
  upstream: ["198.18.0.53:53", "[2001:db8::53]:5353", "198.18.0.54"]
  hosts: {"Origin.Test": ["198.18.0.1", "2001:db8::1"]}
"#,
    );
    assert_eq!(p.name(), "acc");
    let r = &p.rules()[0];
    assert_eq!(r.cidrs[0].to_string(), "198.18.0.1/32");
    assert_eq!(r.hosts, ["a.test"]);
    let ports: Vec<String> = r.ports.iter().map(|p| p.to_string()).collect();
    assert_eq!(ports, ["80-81", "9000-9100"]);
    let ups: Vec<String> = p
        .dns()
        .upstream
        .as_ref()
        .unwrap()
        .iter()
        .map(|a| a.to_string())
        .collect();
    assert_eq!(
        ups,
        ["198.18.0.53:53", "[2001:db8::53]:5353", "198.18.0.54:53"]
    );
    assert_eq!(p.dns().hosts["origin.test"].len(), 2);
}

#[test]
fn dns_upstream_absent_is_none_and_empty_is_some() {
    let p = policy("version: 1\nname: t\n");
    assert_eq!(p.dns().upstream, None);
    let p = policy("version: 1\nname: t\ndns: {upstream: []}\n");
    assert_eq!(p.dns().upstream, Some(vec![]));
}

#[test]
fn policy_without_rules_denies_everything() {
    let p = policy("version: 1\nname: closed\nrules: []\n");
    assert_eq!(
        show(p.decide(sa("198.18.0.1:80"), Some("a.test"), &AnyResolution)),
        "deny/no-rule/-"
    );
}

#[test]
fn policy_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<crate::policy::Policy>();
}
