//! Requests on terminated connections: which rules terminate, which
//! methods and paths a rule admits, templates and secret sources.

use super::*;
use crate::policy::{
    PathPattern, RequestReason, Rule, SecretRef, SecretSource, Template, DEFAULT_SECRET_TTL,
};
use std::time::Duration;

const L7: &str = r#"
version: 1
name: l7
secrets:
  - name: gh
    file: /etc/sluice/secrets/gh
  - name: npm
    env: NPM_TOKEN
  - name: vault
    command: [vault, read, "-field=token", secret/ci]
    ttl: 90s
  - name: op
    command: [op, read]
rules:
  - name: code-host-read
    action: allow
    hosts: ["api.github.test"]
    ports: [443]
    http:
      - methods: [get, HEAD]
        paths: ["/repos/*/*/contents/**", "/user"]
      - methods: [POST]
        paths: ["/graphql"]
    inject:
      - header: Authorization
        value: "Bearer {{gh}}"
  - name: registry
    action: allow
    hosts: ["registry.npm.test"]
    inject:
      - header: Authorization
        value: "Bearer {{ npm }}"
  - name: anything
    action: allow
    hosts: ["any.test"]
    http:
      - methods: ["*"]
        paths: ["/**"]
  - name: plain
    action: allow
    hosts: ["plain.test"]
"#;

fn rule(name: &str) -> Rule {
    policy(L7).rule_named(name).unwrap().clone()
}

fn code_host(method: &str, path: &str) -> Result<(), RequestReason> {
    rule("code-host-read").admits_request(method, path)
}

fn pattern(text: &str) -> PathPattern {
    PathPattern::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

#[test]
fn a_rule_with_http_or_inject_terminates_and_a_plain_rule_does_not() {
    assert!(rule("code-host-read").terminates());
    assert!(rule("registry").terminates());
    assert!(rule("anything").terminates());
    assert!(!rule("plain").terminates());
}

#[test]
fn a_policy_without_l7_keys_has_no_secrets_and_no_terminating_rule() {
    let p = policy(
        "version: 1\nname: t\nrules:\n  - {name: a, action: allow, hosts: [a.test]}\n  - {name: b, action: allow, cidrs: [\"198.18.0.0/24\"]}\n",
    );
    assert!(p.secrets().is_empty());
    assert!(p.rules().iter().all(|r| !r.terminates()));
    assert!(p
        .rules()
        .iter()
        .all(|r| r.http.is_empty() && r.inject.is_empty()));
}

#[test]
fn rule_named_finds_a_rule_by_its_name_and_nothing_else() {
    let p = policy(L7);
    assert_eq!(&*p.rule_named("registry").unwrap().name, "registry");
    assert!(p.rule_named("no-such-rule").is_none());
}

#[test]
fn an_inject_only_rule_admits_every_request() {
    let r = rule("registry");
    assert_eq!(r.admits_request("DELETE", "/anything/at/all"), Ok(()));
    assert_eq!(r.admits_request("GET", "/a/../b"), Ok(()));
}

#[test]
fn a_listed_method_with_a_matching_path_is_admitted() {
    assert_eq!(code_host("GET", "/user"), Ok(()));
    assert_eq!(code_host("HEAD", "/repos/o/r/contents/src/main.rs"), Ok(()));
    assert_eq!(code_host("POST", "/graphql"), Ok(()));
}

#[test]
fn methods_are_uppercased_in_the_policy_and_compared_without_case() {
    assert_eq!(rule("code-host-read").http[0].methods, ["GET", "HEAD"]);
    assert_eq!(code_host("get", "/user"), Ok(()));
}

#[test]
fn a_method_no_entry_lists_is_refused_as_method() {
    assert_eq!(code_host("DELETE", "/user"), Err(RequestReason::Method));
    assert_eq!(code_host("DELETE", "/a/../b"), Err(RequestReason::Method));
}

#[test]
fn a_listed_method_on_another_entrys_path_is_refused_as_path() {
    // POST is listed, but only for /graphql.
    assert_eq!(code_host("POST", "/user"), Err(RequestReason::Path));
    assert_eq!(code_host("GET", "/graphql"), Err(RequestReason::Path));
}

#[test]
fn star_method_admits_any_method() {
    let r = rule("anything");
    assert_eq!(r.admits_request("PROPFIND", "/x"), Ok(()));
    assert_eq!(r.admits_request("GET", "/"), Ok(()));
}

#[test]
fn request_reasons_read_as_the_audit_names_them() {
    assert_eq!(RequestReason::Method.as_str(), "http-method");
    assert_eq!(RequestReason::Path.to_string(), "http-path");
}

#[test]
fn one_star_matches_exactly_one_non_empty_segment() {
    let p = pattern("/repos/*/issues");
    assert!(p.matches("/repos/sluice/issues"));
    assert!(!p.matches("/repos/issues"));
    assert!(!p.matches("/repos/a/b/issues"));
    assert!(!pattern("/repos/*").matches("/repos/"));
}

#[test]
fn double_star_matches_zero_or_more_segments() {
    let p = pattern("/repos/**");
    assert!(p.matches("/repos"));
    assert!(p.matches("/repos/a"));
    assert!(p.matches("/repos/a/b/c"));
    assert!(p.matches("/repos/a/"));
    assert!(!p.matches("/reposx"));
    assert!(pattern("/**").matches("/"));
}

#[test]
fn double_star_in_the_middle_backtracks() {
    let p = pattern("/a/**/b/*/c");
    assert!(p.matches("/a/b/x/c"));
    assert!(p.matches("/a/1/2/b/x/c"));
    assert!(p.matches("/a/b/b/x/c"));
    assert!(!p.matches("/a/1/b/c"));
}

#[test]
fn literal_segments_are_case_sensitive() {
    assert!(pattern("/User").matches("/User"));
    assert!(!pattern("/User").matches("/user"));
}

#[test]
fn a_trailing_slash_is_a_segment_of_its_own() {
    assert!(!pattern("/user").matches("/user/"));
    assert!(!pattern("/user/").matches("/user"));
    assert!(pattern("/simple/*/").matches("/simple/requests/"));
    assert!(pattern("/").matches("/"));
}

#[test]
fn literal_segments_compare_after_percent_decoding() {
    // An origin decodes %75 to `u`: the same resource, so the same answer.
    assert!(pattern("/user").matches("/%75ser"));
    assert!(pattern("/files/my%20doc").matches("/files/my%20doc"));
    assert!(pattern("/a%2Cb").matches("/a,b"));
}

#[test]
fn the_pattern_as_written_is_kept() {
    assert_eq!(pattern("/repos/*/**").as_str(), "/repos/*/**");
}

/// Paths an origin might normalise into another path: none matches even
/// the pattern that admits every path.
#[test]
fn paths_an_origin_might_normalise_match_no_pattern() {
    let any = pattern("/**");
    for path in [
        "/a/../b",
        "/a/./b",
        "/..",
        "/a/..",
        "/a/%2e%2e/b",
        "/a/%2E%2e/b",
        "/a/.%2E/b",
        "/a/%2e/b",
        "/a/..;x/b",
        "/a/..%3b/b",
        "/a//b",
        "//a",
        "/a\\b",
        "/a%2fb",
        "/a%2Fb",
        "/a%5cb",
        "/a%5Cb",
        "/a\0b",
        "/a\tb",
        "/a%00b",
        "/a%0ab",
        "/a%c0%aeb",
        "/a%zz",
        "/a%2",
        "/a#b",
        "/a?b=1",
        "relative",
        "*",
        "",
    ] {
        assert!(!any.matches(path), "{path:?} matched");
        assert!(crate::policy::refused_path(path), "{path:?} not refused");
    }
}

#[test]
fn a_normalisable_path_is_refused_as_path_when_the_method_is_listed() {
    assert_eq!(
        code_host("GET", "/repos/o/r/contents/../../../admin"),
        Err(RequestReason::Path)
    );
    assert_eq!(
        rule("anything").admits_request("GET", "/a//b"),
        Err(RequestReason::Path)
    );
}

#[test]
fn ordinary_paths_are_not_refused() {
    for path in [
        "/",
        "/a/b/",
        "/a.b/c..d/.e",
        "/~u/%E2%9C%93",
        "/a;v=1/b",
        "/a%20b",
    ] {
        assert!(pattern("/**").matches(path), "{path:?}");
    }
}

#[test]
fn a_pattern_must_start_with_a_slash() {
    assert!(PathPattern::parse("repos/*")
        .unwrap_err()
        .contains("start with `/`"));
}

#[test]
fn a_double_star_inside_a_segment_is_refused() {
    assert!(PathPattern::parse("/a/b**")
        .unwrap_err()
        .contains("must stand alone"));
    assert!(PathPattern::parse("/a/***").is_err());
}

#[test]
fn a_star_inside_a_segment_is_refused() {
    // `*.json` would otherwise match only a file literally named so.
    assert!(PathPattern::parse("/v1/*.json")
        .unwrap_err()
        .contains("must stand alone"));
}

#[test]
fn a_query_or_fragment_in_a_pattern_is_refused() {
    assert!(PathPattern::parse("/search?q=1")
        .unwrap_err()
        .contains("`?`"));
    assert!(PathPattern::parse("/page#top").unwrap_err().contains("`#`"));
}

#[test]
fn a_pattern_no_request_could_match_is_refused() {
    for text in ["/a//b", "/a/../b", "/a/%2e", "/a%2fb", "/a%zz", "/a\\b"] {
        assert!(PathPattern::parse(text).is_err(), "{text}");
    }
}

#[test]
fn a_template_lists_its_secrets_in_order() {
    let t = Template::parse("{{a}}:{{ b }}-{{a}}").unwrap();
    assert_eq!(t.secrets().collect::<Vec<_>>(), ["a", "b", "a"]);
    assert_eq!(t.as_str(), "{{a}}:{{ b }}-{{a}}");
}

#[test]
fn a_template_renders_its_text_around_the_values() {
    let t = Template::parse("Bearer {{gh}}").unwrap();
    let value = |name: &str| (name == "gh").then(|| "t0ken".to_string());
    assert_eq!(t.render(&value).as_deref(), Some("Bearer t0ken"));
}

#[test]
fn a_template_with_a_missing_value_renders_nothing() {
    let t = Template::parse("{{a}} {{b}}").unwrap();
    let value = |name: &str| (name == "a").then(|| "x".to_string());
    assert_eq!(t.render(&value), None);
}

#[test]
fn a_value_with_a_line_break_renders_nothing() {
    // A secret must never end the header and start one of its own.
    let t = Template::parse("Bearer {{gh}}").unwrap();
    for bad in ["a\r\nX-Evil: 1", "a\nb", "a\0"] {
        assert_eq!(t.render(&|_: &str| Some(bad.to_string())), None, "{bad:?}");
    }
}

#[test]
fn a_template_without_a_reference_is_refused() {
    assert!(Template::parse("Bearer fixed")
        .unwrap_err()
        .contains("references no secret"));
}

#[test]
fn a_template_with_a_line_break_or_nul_is_refused() {
    for text in ["{{a}}\r\nX: y", "{{a}}\n", "\0{{a}}"] {
        assert!(
            Template::parse(text)
                .unwrap_err()
                .contains("control character"),
            "{text:?}"
        );
    }
}

#[test]
fn an_unclosed_or_malformed_reference_is_refused() {
    assert!(Template::parse("Bearer {{gh")
        .unwrap_err()
        .contains("without closing"));
    assert!(Template::parse("{{GH}}")
        .unwrap_err()
        .contains("not a secret reference"));
    assert!(Template::parse("{{}}").is_err());
}

#[test]
fn secrets_keep_their_sources_in_file_order() {
    let p = policy(L7);
    assert_eq!(
        p.secrets(),
        [
            SecretRef {
                name: "gh".into(),
                source: SecretSource::File("/etc/sluice/secrets/gh".into()),
            },
            SecretRef {
                name: "npm".into(),
                source: SecretSource::Env("NPM_TOKEN".into()),
            },
            SecretRef {
                name: "vault".into(),
                source: SecretSource::Command {
                    argv: vec![
                        "vault".into(),
                        "read".into(),
                        "-field=token".into(),
                        "secret/ci".into()
                    ],
                    ttl: Duration::from_secs(90),
                },
            },
            SecretRef {
                name: "op".into(),
                source: SecretSource::Command {
                    argv: vec!["op".into(), "read".into()],
                    ttl: DEFAULT_SECRET_TTL,
                },
            },
        ]
    );
}

#[test]
fn a_command_secret_defaults_to_ten_minutes() {
    assert_eq!(DEFAULT_SECRET_TTL, Duration::from_secs(600));
}

#[test]
fn injects_keep_the_header_as_written() {
    let r = rule("code-host-read");
    assert_eq!(r.inject.len(), 1);
    assert_eq!(r.inject[0].header, "Authorization");
    assert_eq!(r.inject[0].value.secrets().collect::<Vec<_>>(), ["gh"]);
}

#[test]
fn a_terminating_rule_decides_connections_like_any_other() {
    let p = policy(L7);
    let d = p.decide(
        sa("203.0.113.7:443"),
        Some("api.github.test"),
        &crate::policy::AnyResolution,
    );
    assert_eq!(show(d), "allow/allow-rule/code-host-read");
}
