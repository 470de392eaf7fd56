//! Hostile input ends in an error, quickly, without panicking.

use super::*;
use std::time::{Duration, Instant};

fn quick<T>(f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    out
}

#[test]
fn deep_nesting_is_refused() {
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let e = quick(|| rejected(&deep));
    assert!(e.contains("recursion limit"), "{e}");
    let deep_map = format!(
        "version: 1\nname: t\ndns: {}1{}\n",
        "{a: ".repeat(10_000),
        "}".repeat(10_000)
    );
    let e = quick(|| rejected(&deep_map));
    assert!(e.starts_with("test.yaml:"), "{e}");
}

#[test]
fn alias_bomb_is_refused() {
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
    let e = quick(|| rejected(bomb));
    assert!(
        e.contains("repetition limit") || e.contains("more than"),
        "{e}"
    );
}

#[test]
fn wide_alias_fanout_is_bounded_by_the_node_budget() {
    // Few events, but every alias expands 10k nodes: 200 of them is 2M.
    let mut doc = format!(
        "version: 1\nname: t\nx: &x [{}]\ny: [",
        vec!["1"; 10_000].join(",")
    );
    doc.push_str(&vec!["*x"; 200].join(","));
    doc.push_str("]\n");
    let e = quick(|| rejected(&doc));
    assert!(e.contains("more than 1000000 YAML values"), "{e}");
}

#[test]
fn oversized_input_is_refused_before_parsing() {
    let big = format!("version: 1\nname: t\n#{}\n", "x".repeat(5 << 20));
    let e = quick(|| rejected(&big));
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
    let e = quick(|| Policy::from_yaml(&doc, "test.yaml").unwrap_err());
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
    let p = quick(|| policy(&doc));
    assert_eq!(p.rules().len(), 10_000);
}
