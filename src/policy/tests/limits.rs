//! Hostile input ends in an error, quickly, without panicking.

use super::*;

#[test]
fn deep_nesting_is_refused_where_it_goes_too_deep() {
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let e = rejected(&deep);
    assert!(e.starts_with("test.yaml:1:"), "{e}");
    assert!(e.contains("nested more than 128 levels deep"), "{e}");
    let deep_map = format!(
        "version: 1\nname: t\ndns: {}1{}\n",
        "{a: ".repeat(10_000),
        "}".repeat(10_000)
    );
    let e = rejected(&deep_map);
    assert!(e.starts_with("test.yaml:3:"), "{e}");
    assert!(e.contains("nested more than 128 levels"), "{e}");
}

#[test]
fn an_alias_bomb_is_refused_at_its_first_anchor() {
    let bomb = r#"
version: 1
name: t
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"#;
    let e = rejected(bomb);
    assert_eq!(
        e,
        "test.yaml:4:4: YAML anchors (`&name`) are not supported; write the value out in full"
    );
}

#[test]
fn oversized_input_is_refused_before_parsing() {
    let big = format!("version: 1\nname: t\n#{}\n", "x".repeat(5 << 20));
    let e = rejected(&big);
    assert!(e.starts_with("test.yaml:1:1: the policy is"), "{e}");
    assert!(e.contains("4 MiB"), "{e}");
}

#[test]
fn many_violations_are_capped() {
    let mut doc = String::from("version: 1\nname: t\nrules:\n");
    for i in 0..500 {
        doc.push_str(&format!(
            "  - {{name: r{i}, action: allow, cidrs: [\"10.0.0.1/8\"]}}\n"
        ));
    }
    let e = Policy::from_yaml(&doc, "test.yaml").unwrap_err();
    assert_eq!(e.violations().len(), 101);
    assert!(e.to_string().contains("400 more problems not shown"));
}

#[test]
fn ten_thousand_rules_load() {
    let mut doc = String::from("version: 1\nname: big\nrules:\n");
    for i in 0..10_000u32 {
        doc.push_str(&format!(
            "  - {{name: r{i}, action: allow, cidrs: [\"10.{}.{}.0/24\"], ports: [443]}}\n",
            i / 256,
            i % 256
        ));
    }
    let p = policy(&doc);
    assert_eq!(p.rules().len(), 10_000);
}
