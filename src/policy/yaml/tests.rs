//! The tree and its positions, and what the parser refuses.

use super::*;

fn at(line: usize, column: usize) -> Pos {
    Pos { line, column }
}

fn map(node: &Node) -> &[(Node, Node)] {
    match &node.value {
        Value::Map(entries) => entries,
        other => panic!("not a mapping: {other:?}"),
    }
}

fn seq(node: &Node) -> &[Node] {
    match &node.value {
        Value::Seq(items) => items,
        other => panic!("not a list: {other:?}"),
    }
}

fn refused(text: &str) -> Problem {
    parse(text).expect_err("parsed")
}

const DOC: &str = "# comment\na: 1\nb:\n  - x\n  - {k: v, l: [1, 2]}\nc: {}\nd: []\n";

#[test]
fn every_node_carries_its_line_and_column() {
    let root = parse(DOC).unwrap();
    assert_eq!(root.pos, at(2, 1), "a mapping is where its first key is");
    let top = map(&root);
    assert_eq!((top[0].0.pos, top[0].1.pos), (at(2, 1), at(2, 4)));
    let b = seq(&top[1].1);
    assert_eq!(top[1].1.pos, at(4, 3), "a block list is at its first `-`");
    assert_eq!(b[0].pos, at(4, 5));
    assert_eq!(b[1].pos, at(5, 6), "a flow mapping is at its first key");
    let inner = map(&b[1]);
    assert_eq!(inner[1].0.pos, at(5, 12));
    assert_eq!(seq(&inner[1].1)[1].pos, at(5, 19));
    assert_eq!(top[2].1.pos, at(6, 4), "an empty mapping is at its `{{`");
    assert_eq!(top[3].1.pos, at(7, 4), "an empty list is at its `[`");
}

#[test]
fn repeated_keys_stay_in_file_order() {
    let root = parse("a: 1\na: 2\n").unwrap();
    let entries = map(&root);
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[1].0.pos, at(2, 1));
}

#[test]
fn plain_scalars_are_typed_by_the_core_schema_and_quoted_ones_are_strings() {
    let root =
        parse("- 443\n- '443'\n- 1.5\n- true\n- ~\n-\n- 18446744073709551615\n- 0x1bb\n- yes\n")
            .unwrap();
    let values: Vec<&Value> = seq(&root).iter().map(|n| &n.value).collect();
    assert_eq!(
        values,
        [
            &Value::Int(443),
            &Value::Str("443".into()),
            &Value::Float(1.5),
            &Value::Bool(true),
            &Value::Null,
            &Value::Null,
            &Value::Int(u64::MAX.into()),
            &Value::Int(443),
            &Value::Str("yes".into()),
        ]
    );
}

#[test]
fn an_empty_document_is_a_null_root() {
    let root = parse("# nothing here\n").unwrap();
    assert_eq!(root.value, Value::Null);
    assert_eq!(root.pos, Pos::START);
}

#[test]
fn anchors_are_refused_at_the_anchor() {
    let p = refused("a: &x [1]\nb: 2\n");
    assert_eq!(p.at, at(1, 4));
    assert!(
        p.message.contains("anchors (`&name`) are not supported"),
        "{p:?}"
    );
}

#[test]
fn aliases_are_refused_at_the_alias() {
    // The anchor is refused first; an alias alone names an unknown anchor,
    // which the parser itself refuses at the alias.
    let p = refused("a: b\nc: *x\n");
    assert_eq!(p.at, at(2, 4));
}

#[test]
fn tags_are_refused_at_the_tag() {
    let p = refused("a: !foo t\n");
    assert_eq!(p.at, at(1, 4));
    assert!(p.message.contains("tags"), "{p:?}");
}

#[test]
fn a_second_document_is_refused_at_its_start() {
    let p = refused("a: 1\n---\nb: 2\n");
    assert_eq!(p.at, at(2, 1));
    assert!(p.message.contains("more than one document"), "{p:?}");
}

#[test]
fn a_syntax_error_says_its_position_once() {
    let p = refused("a:\n  - x\n y: 1\n");
    assert_eq!(p.at.line, 3);
    assert!(!p.message.contains("line"), "{p:?}");
    assert!(p.message.ends_with("; fix the YAML there"), "{p:?}");
}

#[test]
fn nesting_deeper_than_the_limit_is_refused_where_it_goes_too_deep() {
    let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
    assert!(parse(&ok).is_ok());
    let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
    let p = refused(&deep);
    assert_eq!(p.at, at(1, MAX_DEPTH + 1));
    assert!(p.message.contains("nested more than 128 levels"), "{p:?}");
}

#[test]
fn more_nodes_than_the_budget_are_refused_at_the_first_one_over() {
    // The list is a node too: 1 + 100 values fit a budget of 101.
    let wide = format!("[{}]", vec!["1"; 100].join(","));
    assert!(parse_within(&wide, 101).is_ok());
    let p = parse_within(&wide, 100).expect_err("parsed");
    assert_eq!(p.at, at(1, 200));
    assert!(p.message.contains("more than 100 YAML values"), "{p:?}");
}

#[test]
fn the_scanners_own_nesting_limit_reads_like_ours() {
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let p = refused(&deep);
    assert_eq!(p.at.line, 1);
    assert!(p.message.contains("nested more than 128 levels"), "{p:?}");
}
