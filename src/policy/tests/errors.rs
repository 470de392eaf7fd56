//! Validation: every violation is reported at once, each at its
//! `FILE:LINE:COL` with what to do.

use super::*;

/// Asserts that the error text has a line starting with `at` (e.g.
/// "test.yaml:3:5: ") that contains every one of `words`.
fn has(errors: &str, at: &str, words: &[&str]) {
    let prefix = format!("test.yaml:{at}: ");
    assert!(
        errors
            .lines()
            .any(|l| l.starts_with(&prefix) && words.iter().all(|w| l.contains(w))),
        "no violation at {at} with {words:?} in:\n{errors}"
    );
}

const HEAD: &str = "version: 1\nname: t\nrules:\n";

#[test]
fn unknown_top_level_key_is_named_with_the_allowed_keys() {
    let e = rejected("version: 1\nname: t\nrulez: []\n");
    has(
        &e,
        "3:1",
        &[
            "unknown key `rulez`",
            "did you mean `rules`",
            "`version`, `name`, `mode`, `rules`, `dns`",
        ],
    );
}

#[test]
fn unknown_rule_key_is_reported_at_the_key() {
    let e = rejected(&format!(
        "{HEAD}  - name: a\n    action: allow\n    cidr: [\"198.18.0.1/32\"]\n"
    ));
    has(
        &e,
        "6:5",
        &["unknown key `cidr`", "rule `a`", "did you mean `cidrs`"],
    );
    // The rule then has no cidrs or hosts: reported at the rule.
    has(&e, "4:5", &["neither `cidrs` nor `hosts`"]);
}

#[test]
fn unknown_dns_key_is_reported() {
    let e = rejected("version: 1\nname: t\ndns:\n  upstreams: []\n");
    has(
        &e,
        "4:3",
        &["unknown key `upstreams`", "`upstream`, `hosts`"],
    );
}

#[test]
fn bad_cidr_is_reported_at_the_value() {
    let e = rejected(&format!(
        "{HEAD}  - name: a\n    action: allow\n    cidrs: [\"198.18.0.1/32\", \"300.1.1.1/8\"]\n"
    ));
    has(
        &e,
        "6:30",
        &["`300.1.1.1/8` is not a CIDR", "198.18.0.0/15"],
    );
}

#[test]
fn cidr_with_host_bits_suggests_the_network() {
    let e = rejected(&format!(
        "{HEAD}  - name: a\n    action: allow\n    cidrs:\n      - 10.0.0.1/8\n"
    ));
    has(
        &e,
        "7:9",
        &["host bits set", "\"10.0.0.0/8\"", "\"10.0.0.1/32\""],
    );
}

#[test]
fn bad_port_is_reported() {
    let e = rejected(&format!("{HEAD}  - name: a\n    action: allow\n    cidrs: [\"198.18.0.1/32\"]\n    ports: [80, 0, 70000, http]\n"));
    has(&e, "7:17", &["port 0 is out of range", "1-65535"]);
    has(&e, "7:20", &["port 70000 is out of range"]);
    has(&e, "7:27", &["`http` is not a port"]);
}

#[test]
fn backwards_port_range_is_reported() {
    let e = rejected(&format!("{HEAD}  - name: a\n    action: allow\n    cidrs: [\"198.18.0.1/32\"]\n    ports: [\"9100-9000\"]\n"));
    has(&e, "7:13", &["runs backwards", "\"9000-9100\""]);
}

#[test]
fn malformed_port_range_is_reported() {
    let e = rejected(&format!("{HEAD}  - name: a\n    action: allow\n    cidrs: [\"198.18.0.1/32\"]\n    ports: [\"80-\", 1.5]\n"));
    has(&e, "7:13", &["`80-` is not a port"]);
    has(&e, "7:20", &["a port must be a number"]);
}

#[test]
fn empty_rule_is_reported_at_the_rule() {
    let e = rejected(&format!("{HEAD}  - name: empty\n    action: deny\n"));
    has(
        &e,
        "4:5",
        &["rule `empty` has neither `cidrs` nor `hosts`", "0.0.0.0/0"],
    );
}

#[test]
fn duplicate_rule_name_points_at_the_second_and_mentions_the_first() {
    let e = rejected(&format!(
        "{HEAD}  - name: web\n    action: allow\n    cidrs: [\"198.18.0.1/32\"]\n  - action: deny\n    name: web\n    cidrs: [\"198.18.0.2/32\"]\n"
    ));
    has(
        &e,
        "8:11",
        &["duplicate rule name `web`", "first used at line 4"],
    );
}

#[test]
fn misplaced_wildcards_are_reported() {
    let e = rejected(&format!(
        "{HEAD}  - name: a\n    action: allow\n    hosts: [\"foo.*.com\", \"*foo.com\", \"*\", \"*.\", \"*.ok.com\"]\n"
    ));
    has(&e, "6:13", &["wildcard in `foo.*.com`", "`*.example.com`"]);
    has(&e, "6:26", &["wildcard in `*foo.com`"]);
    has(&e, "6:38", &["would match every name"]);
    has(&e, "6:43", &["would match every name"]);
    assert_eq!(e.lines().count(), 4, "{e}");
}

#[test]
fn bad_hostname_characters_are_reported() {
    let e = rejected(&format!("{HEAD}  - name: a\n    action: allow\n    hosts:\n      - \"exa mple.com\"\n      - https://x.com/\n"));
    has(&e, "7:9", &["contains ' '", "letters, digits"]);
    has(&e, "8:9", &["without scheme"]);
}

#[test]
fn missing_rule_name_and_bad_action_are_reported() {
    let e = rejected(&format!(
        "{HEAD}  - action: permit\n    cidrs: [\"198.18.0.1/32\"]\n"
    ));
    has(&e, "4:5", &["rule #1 has no `name`"]);
    has(
        &e,
        "4:13",
        &[
            "`action` is the string \"permit\"",
            "`action: allow` or `action: deny`",
        ],
    );
}

#[test]
fn missing_action_is_reported_at_the_rule() {
    let e = rejected(&format!(
        "{HEAD}  - name: a\n    cidrs: [\"198.18.0.1/32\"]\n"
    ));
    has(&e, "4:5", &["rule `a` has no `action`"]);
}

#[test]
fn unsupported_version_is_reported_at_the_value() {
    let e = rejected("version: 2\nname: t\n");
    has(
        &e,
        "1:10",
        &["unsupported policy version 2", "`version: 1`"],
    );
}

#[test]
fn missing_version_and_name_are_reported_at_the_top() {
    let e = rejected("mode: enforce\n");
    has(&e, "1:1", &["missing `version`"]);
    has(&e, "1:1", &["missing `name`"]);
}

#[test]
fn empty_name_and_bad_mode_are_reported() {
    let e = rejected("version: 1\nname: \"\"\nmode: block\n");
    has(&e, "2:7", &["`name` is empty"]);
    has(&e, "3:7", &["`mode: enforce`", "`mode: audit`"]);
}

#[test]
fn bad_dns_upstream_is_reported() {
    let e = rejected(
        "version: 1\nname: t\ndns:\n  upstream: [\"dns.google:53\", \"198.18.0.53:0\", 53]\n",
    );
    has(
        &e,
        "4:14",
        &[
            "`dns.google:53` is not a DNS server address",
            "[2001:db8::53]:53",
        ],
    );
    has(&e, "4:31", &["port 0"]);
    has(&e, "4:48", &["must be a string"]);
}

#[test]
fn bad_dns_hosts_entries_are_reported() {
    let e = rejected(
        "version: 1\nname: t\ndns:\n  hosts:\n    \"*.x.test\": [\"198.18.0.1\"]\n    ok.test: [\"198.18.0.300\"]\n    none.test: []\n    OK.test.: [\"198.18.0.2\"]\n",
    );
    has(&e, "5:5", &["exact names only"]);
    has(&e, "6:15", &["`198.18.0.300` is not an IP address"]);
    has(&e, "7:16", &["empty"]);
    has(&e, "8:5", &["lists `ok.test` twice", "first at line 6"]);
}

#[test]
fn duplicate_key_is_reported() {
    let e = rejected("version: 1\nname: a\nname: b\n");
    // The YAML layer keeps both keys; validation refuses the second.
    has(&e, "3:1", &["key `name` appears twice", "first at line 2"]);
}

#[test]
fn wrong_shapes_are_reported() {
    let e = rejected("version: 1\nname: t\nrules:\n  - name: a\n    action: allow\n    cidrs: \"198.18.0.1/32\"\n    ports: 443\n  - just-a-string\n");
    has(
        &e,
        "6:12",
        &["`cidrs` must be a list", "[\"198.18.0.0/15\"]"],
    );
    has(&e, "7:12", &["`ports` must be a list"]);
    has(&e, "8:5", &["rule #2 must be a mapping"]);
}

#[test]
fn all_violations_are_reported_at_once_in_file_order() {
    let e = rejected(
        "version: 3\nname: t\nextra: 1\nrules:\n  - name: a\n    action: allow\n    cidrs: [\"10.0.0.1/8\"]\n    ports: [0]\n  - name: a\n    action: deny\n    hosts: [\"*\"]\n",
    );
    let at: Vec<String> = e
        .lines()
        .map(|l| l.splitn(4, ':').take(3).collect::<Vec<_>>().join(":"))
        .collect();
    assert_eq!(
        at,
        [
            "test.yaml:1:10",
            "test.yaml:3:1",
            "test.yaml:7:13",
            "test.yaml:8:13",
            "test.yaml:9:11",
            "test.yaml:11:13"
        ],
        "{e}"
    );
}

#[test]
fn flow_style_positions_are_exact() {
    let e = rejected(
        "version: 1\nname: t\nrules: [{name: a, action: allow, cidrs: [\"1.2.3.4/33\"]}]\n",
    );
    has(&e, "3:42", &["`1.2.3.4/33` is not a CIDR"]);
}

#[test]
fn yaml_syntax_error_says_its_position_once() {
    let e = rejected("version: 1\nname: t\nrules:\n  - name: a\n   action: allow\n");
    assert_eq!(
        e,
        "test.yaml:5:4: while parsing a block collection, did not find expected '-' indicator; fix the YAML there"
    );
}

#[test]
fn yaml_tags_are_refused() {
    let e = rejected("version: 1\nname: !foo t\n");
    assert!(e.starts_with("test.yaml:2:"), "{e}");
    assert!(e.contains("tags"), "{e}");
}

#[test]
fn empty_document_is_refused_with_a_hint() {
    let e = rejected("");
    has(&e, "1:1", &["the policy is empty", "version: 1"]);
    let e = rejected("- a\n- b\n");
    has(&e, "1:1", &["must be a mapping"]);
}

#[test]
fn several_documents_are_refused() {
    let e = rejected("version: 1\nname: a\n---\nversion: 1\nname: b\n");
    assert!(e.contains("test.yaml:"), "{e}");
    assert!(e.contains("more than one document"), "{e}");
}

#[test]
fn errors_list_each_violation_once_per_line() {
    let e = Policy::from_yaml("version: 2\nname: \"\"\n", "p.yaml").unwrap_err();
    assert_eq!(e.violations().len(), 2);
    assert_eq!(e.to_string().lines().count(), 2);
    assert!(e.to_string().lines().all(|l| l.starts_with("p.yaml:")));
}

#[test]
fn load_error_names_the_path() {
    let e = Policy::load(std::path::Path::new("/nonexistent/sluice-policy.yaml")).unwrap_err();
    let s = e.to_string();
    assert!(
        s.starts_with("/nonexistent/sluice-policy.yaml: cannot read"),
        "{s}"
    );
}

#[test]
fn load_refuses_non_utf8_with_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, b"version: 1\nname: \xff\n").unwrap();
    let e = Policy::load(&path).unwrap_err().to_string();
    assert!(
        e.ends_with("bad.yaml:2:7: the file is not UTF-8 text; save it as UTF-8"),
        "{e}"
    );
}
