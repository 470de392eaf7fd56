//! Validation of `secrets`, `http` and `inject`: each violation at its
//! `FILE:LINE:COL`, saying what to write instead.

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

/// Lines 1-5: one secret `gh`; the rules start at line 6.
const HEAD: &str = "version: 1\nname: t\nsecrets:\n  - {name: gh, env: GH_TOKEN}\nrules:\n";

/// A rule `a` (lines 6-8: allow, hosts) followed by `extra` at 4 spaces.
fn with_rule(extra: &str) -> String {
    format!("{HEAD}  - name: a\n    action: allow\n    hosts: [\"a.test\"]\n{extra}")
}

#[test]
fn a_valid_l7_policy_is_accepted() {
    policy(&with_rule(
        "    http:\n      - methods: [GET]\n        paths: [\"/user\"]\n    inject:\n      - header: Authorization\n        value: \"Bearer {{gh}}\"\n",
    ));
}

#[test]
fn the_secrets_key_is_known_at_the_top() {
    let e = rejected("version: 1\nname: t\nsecret: []\n");
    has(
        &e,
        "3:1",
        &["unknown key `secret`", "did you mean `secrets`"],
    );
}

#[test]
fn http_on_a_deny_rule_is_refused_at_the_block() {
    let e = rejected(&format!(
        "{HEAD}  - name: d\n    action: deny\n    hosts: [\"a.test\"]\n    http:\n      - {{methods: [GET], paths: [\"/\"]}}\n"
    ));
    has(
        &e,
        "10:7",
        &[
            "rule `d` cannot have `http`",
            "deny rule",
            "`action: allow`",
        ],
    );
}

#[test]
fn inject_on_a_rule_with_cidrs_is_refused() {
    let e = rejected(&format!(
        "{HEAD}  - name: c\n    action: allow\n    hosts: [\"a.test\"]\n    cidrs: [\"198.18.0.0/24\"]\n    inject:\n      - {{header: X-Key, value: \"{{{{gh}}}}\"}}\n"
    ));
    has(
        &e,
        "11:7",
        &[
            "rule `c` cannot have `inject`",
            "has `cidrs`",
            "verify the origin's certificate",
        ],
    );
}

#[test]
fn http_on_a_rule_without_hosts_is_refused() {
    let e = rejected(&format!(
        "{HEAD}  - name: c\n    action: allow\n    cidrs: [\"198.18.0.0/24\"]\n    http:\n      - {{methods: [GET], paths: [\"/\"]}}\n"
    ));
    has(&e, "10:7", &["cannot have `http`"]);
}

#[test]
fn an_empty_http_list_is_refused() {
    let e = rejected(&with_rule("    http: []\n"));
    has(&e, "9:11", &["empty `http` list", "remove `http`"]);
}

#[test]
fn an_empty_inject_list_is_refused() {
    let e = rejected(&with_rule("    inject: []\n"));
    has(&e, "9:13", &["empty `inject` list"]);
}

#[test]
fn an_http_entry_without_methods_or_paths_is_refused() {
    let e = rejected(&with_rule(
        "    http:\n      - paths: [\"/\"]\n      - methods: [GET]\n",
    ));
    has(&e, "10:9", &["has no `methods`", "[GET, HEAD]"]);
    has(&e, "11:9", &["has no `paths`", "\"/**\""]);
}

#[test]
fn empty_methods_or_paths_are_refused() {
    let e = rejected(&with_rule(
        "    http:\n      - methods: []\n        paths: []\n",
    ));
    has(&e, "10:18", &["`methods` is empty"]);
    has(&e, "11:16", &["`paths` is empty"]);
}

#[test]
fn a_method_that_is_not_a_token_is_refused() {
    let e = rejected(&with_rule(
        "    http:\n      - methods: [GET, \"GE T\", 7]\n        paths: [\"/\"]\n",
    ));
    has(&e, "10:24", &["`GE T` is not an HTTP method"]);
    has(&e, "10:32", &["a method must be a string"]);
}

#[test]
fn a_bad_path_pattern_is_refused_at_the_pattern() {
    let e = rejected(&with_rule(
        "    http:\n      - methods: [GET]\n        paths: [\"/ok\", \"nope\", \"/a/**x\", \"/q?x\", 5]\n",
    ));
    has(&e, "11:24", &["`nope` does not start with `/`"]);
    has(&e, "11:32", &["must stand alone"]);
    has(&e, "11:42", &["contains `?`", "query is ignored"]);
    has(&e, "11:50", &["a path pattern must be a string"]);
}

#[test]
fn an_unknown_key_in_an_http_entry_is_refused() {
    let e = rejected(&with_rule(
        "    http:\n      - methods: [GET]\n        path: [\"/\"]\n",
    ));
    has(&e, "11:9", &["unknown key `path`", "did you mean `paths`"]);
}

#[test]
fn an_unknown_secret_in_a_template_is_refused_with_the_declared_names() {
    let e = rejected(&with_rule(
        "    inject:\n      - header: Authorization\n        value: \"Bearer {{npm}}\"\n",
    ));
    has(&e, "11:16", &["`{{npm}}`", "does not declare", "`gh`"]);
}

#[test]
fn an_unknown_secret_without_any_secrets_says_to_add_one() {
    let e = rejected(
        "version: 1\nname: t\nrules:\n  - name: a\n    action: allow\n    hosts: [a.test]\n    inject:\n      - {header: X-Key, value: \"{{k}}\"}\n",
    );
    has(&e, "8:32", &["`{{k}}`", "no `secrets`", "add `secrets:"]);
}

#[test]
fn secrets_declared_after_the_rules_are_known_to_them() {
    policy(
        "version: 1\nname: t\nrules:\n  - name: a\n    action: allow\n    hosts: [a.test]\n    inject:\n      - {header: X-Key, value: \"{{k}}\"}\nsecrets:\n  - {name: k, env: K}\n",
    );
}

#[test]
fn a_template_without_a_reference_is_refused_at_the_value() {
    let e = rejected(&with_rule(
        "    inject:\n      - header: X-Key\n        value: fixed\n",
    ));
    has(&e, "11:16", &["references no secret"]);
}

#[test]
fn a_template_with_a_line_break_is_refused() {
    let e = rejected(&with_rule(
        "    inject:\n      - header: X-Key\n        value: \"{{gh}}\\r\\nX-Evil: 1\"\n",
    ));
    has(&e, "11:16", &["control character"]);
}

#[test]
fn a_reserved_header_cannot_be_injected() {
    for header in [
        "Host",
        "content-length",
        "Transfer-Encoding",
        "Connection",
        "Upgrade",
        "TE",
        "Trailer",
    ] {
        let e = rejected(&with_rule(&format!(
            "    inject:\n      - header: {header}\n        value: \"{{{{gh}}}}\"\n"
        )));
        has(&e, "10:17", &[&format!("cannot inject `{header}`")]);
    }
}

#[test]
fn a_header_name_that_is_not_a_token_is_refused() {
    let e = rejected(&with_rule(
        "    inject:\n      - header: \"X Key:\"\n        value: \"{{gh}}\"\n",
    ));
    has(&e, "10:17", &["is not a header name"]);
}

#[test]
fn a_header_injected_twice_is_refused_at_the_second() {
    let e = rejected(&with_rule(
        "    inject:\n      - {header: X-Key, value: \"{{gh}}\"}\n      - {header: x-key, value: \"{{gh}}\"}\n",
    ));
    has(&e, "11:18", &["injects `x-key` twice", "first at line 10"]);
}

#[test]
fn an_inject_entry_without_header_or_value_is_refused() {
    let e = rejected(&with_rule(
        "    inject:\n      - value: \"{{gh}}\"\n      - header: X\n",
    ));
    has(&e, "10:9", &["has no `header`"]);
    has(&e, "11:9", &["has no `value`"]);
}

const TOP: &str = "version: 1\nname: t\nsecrets:\n";

#[test]
fn a_duplicate_secret_name_points_at_the_second() {
    let e = rejected(&format!(
        "{TOP}  - {{name: gh, env: A}}\n  - {{name: gh, env: B}}\n"
    ));
    has(
        &e,
        "5:12",
        &["duplicate secret name `gh`", "first used at line 4"],
    );
}

#[test]
fn a_secret_without_a_source_is_refused() {
    let e = rejected(&format!("{TOP}  - name: gh\n"));
    has(
        &e,
        "4:5",
        &[
            "secret `gh` has no source",
            "`file: /path`",
            "`env: NAME`",
            "`command:",
        ],
    );
}

#[test]
fn a_secret_with_two_sources_is_refused() {
    let e = rejected(&format!("{TOP}  - name: gh\n    env: GH\n    file: /x\n"));
    has(
        &e,
        "6:11",
        &["has both `env` and `file`", "exactly one source"],
    );
}

#[test]
fn a_ttl_without_a_command_is_refused() {
    let e = rejected(&format!("{TOP}  - name: gh\n    env: GH\n    ttl: 10m\n"));
    has(
        &e,
        "6:10",
        &["has a `ttl` but no `command`", "remove `ttl`"],
    );
}

#[test]
fn a_ttl_out_of_range_or_unreadable_is_refused() {
    let e = rejected(&format!(
        "{TOP}  - {{name: a, command: [x], ttl: 500ms}}\n  - {{name: b, command: [x], ttl: 2d}}\n  - {{name: c, command: [x], ttl: soon}}\n  - {{name: d, command: [x], ttl: 600}}\n"
    ));
    has(&e, "4:34", &["from 1s to 24h"]);
    has(&e, "5:34", &["from 1s to 24h"]);
    has(&e, "6:34", &["not a duration", "\"10m\""]);
    has(&e, "7:34", &["the number 600", "with its unit"]);
}

#[test]
fn a_bad_secret_name_is_refused() {
    let e = rejected(&format!(
        "{TOP}  - {{name: GH, env: A}}\n  - {{name: \"\", env: B}}\n"
    ));
    has(&e, "4:12", &["`name`", "lowercase letters"]);
    has(&e, "5:12", &["lowercase letters"]);
}

#[test]
fn a_secret_without_a_name_is_refused() {
    let e = rejected(&format!("{TOP}  - env: A\n"));
    has(&e, "4:5", &["secret #1 has no `name`"]);
}

#[test]
fn a_relative_secret_file_is_refused() {
    let e = rejected(&format!("{TOP}  - {{name: gh, file: secrets/gh}}\n"));
    has(&e, "4:22", &["relative path", "absolute path"]);
}

#[test]
fn a_bad_env_name_or_command_is_refused() {
    let e = rejected(&format!(
        "{TOP}  - {{name: a, env: \"1X\"}}\n  - {{name: b, command: []}}\n  - {{name: c, command: [gh, 7]}}\n  - {{name: d, command: gh}}\n"
    ));
    has(&e, "4:20", &["not an environment variable name"]);
    has(&e, "5:24", &["`command` is empty"]);
    has(&e, "6:29", &["must be a string", "put it in quotes"]);
    has(
        &e,
        "7:24",
        &["`command` must be a list", "[gh, auth, token]"],
    );
}

#[test]
fn an_unknown_secret_key_is_refused() {
    let e = rejected(&format!("{TOP}  - {{name: gh, env: A, tll: 1m}}\n"));
    has(&e, "4:24", &["unknown key `tll`", "did you mean `ttl`"]);
}

#[test]
fn a_secret_with_problems_still_declares_its_name() {
    // Only the bad source is reported, not every rule that uses the name.
    let e = rejected(
        "version: 1\nname: t\nsecrets:\n  - {name: k, file: rel}\nrules:\n  - name: a\n    action: allow\n    hosts: [a.test]\n    inject:\n      - {header: X-Key, value: \"{{k}}\"}\n",
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    has(&e, "4:21", &["relative path"]);
}
