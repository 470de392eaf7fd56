//! The pure builder of the `inet sluice` table: a [`SandboxSpec`] in, one
//! nftables JSON batch out. No I/O here, so golden tests can pin the output.

use std::borrow::Cow;

use nftables::expr::{Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, CT};
use nftables::schema::{self, Chain, NfCmd, NfListObject, NfObject, Nftables, Rule, Table};
use nftables::stmt::{Counter, Match, Operator, Statement, NAT};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use super::SandboxSpec;

/// The table's family and name.
pub const TABLE: &str = "sluice";
/// Host mode: NAT chain on locally generated packets.
pub const OUTPUT_NAT: &str = "output_nat";
/// Host mode: filter chain on locally generated packets (policy drop).
pub const OUTPUT_FILTER: &str = "output_filter";
/// Tap mode: NAT chain on packets arriving from the tap.
pub const PREROUTING_NAT: &str = "prerouting_nat";
/// Tap mode: filter chain on packets from the tap to this namespace.
pub const INPUT_FILTER: &str = "input_filter";
/// Tap mode: filter chain on packets from the tap to anywhere else.
pub const FORWARD_FILTER: &str = "forward_filter";
/// The named counter every drop rule of the table counts into: reading this
/// one object is all a drop-count scrape needs.
pub const DROP_COUNTER: &str = "dropped";

const NAT_PRIORITY: i32 = -100;
const FILTER_PRIORITY: i32 = 0;

/// Builds the whole batch: create-then-delete the table (so re-applying
/// replaces it instead of appending, in the same transaction), then the table,
/// its drop counter, chains and rules.
///
/// Host mode (`spec.tap == None`), applied inside the sandbox namespace:
///
/// ```text
/// chain output_nat    { type nat hook output priority -100; policy accept;
///     udp dport 53 redirect to :DNS
///     tcp dport 53 redirect to :DNS
///     oif "lo" accept                     # loopback services keep working
///     meta l4proto tcp redirect to :PROXY }
/// chain output_filter { type filter hook output priority 0; policy drop;
///     oif "lo" accept
///     ct status dnat accept
///     counter name "dropped" drop }
/// ```
///
/// Tap mode (`spec.tap == Some(TAP)`), applied in the namespace where the
/// VMM and its tap live (possibly a shared one, so every rule is scoped to
/// `iifname TAP` and the chains themselves accept):
///
/// ```text
/// chain prerouting_nat { type nat hook prerouting priority -100; policy accept;
///     iifname TAP udp dport 53 redirect to :DNS
///     iifname TAP tcp dport 53 redirect to :DNS
///     iifname TAP meta l4proto tcp redirect to :PROXY }
/// chain input_filter   { type filter hook input priority 0; policy accept;
///     iifname TAP tcp dport PROXY accept
///     iifname TAP tcp dport DNS accept
///     iifname TAP udp dport DNS accept
///     iifname TAP icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept
///     iifname TAP counter name "dropped" drop }
/// chain forward_filter { type filter hook forward priority 0; policy accept;
///     iifname TAP counter name "dropped" drop }
/// ```
pub fn ruleset(spec: &SandboxSpec) -> Nftables<'static> {
    let mut objects = vec![
        add(NfListObject::Table(table())),
        NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(table()))),
        add(NfListObject::Table(table())),
        add(NfListObject::Counter(schema::Counter {
            family: NfFamily::INet,
            table: TABLE.into(),
            name: DROP_COUNTER.into(),
            handle: None,
            packets: None,
            bytes: None,
        })),
    ];
    match &spec.tap {
        None => host_chains(spec, &mut objects),
        Some(tap) => tap_chains(spec, tap, &mut objects),
    }
    Nftables {
        objects: Cow::Owned(objects),
    }
}

/// [`ruleset`] for a namespace that has no `inet sluice` table yet: the same
/// counter, chains and rules, but the table is `create`d (which fails, and
/// applies nothing, if one exists) instead of added, deleted and added again.
/// Deleting a table, even one created in the same batch, makes the kernel
/// wait for an RCU grace period when the netlink socket closes (about 10 ms
/// here), so a fresh sandbox does not pay for replacing what is not there.
pub(super) fn first_ruleset(spec: &SandboxSpec) -> Nftables<'static> {
    let mut objects = ruleset(spec).objects.into_owned();
    objects.splice(
        ..3,
        [NfObject::CmdObject(NfCmd::Create(NfListObject::Table(
            table(),
        )))],
    );
    Nftables {
        objects: Cow::Owned(objects),
    }
}

fn host_chains(spec: &SandboxSpec, out: &mut Vec<NfObject<'static>>) {
    out.push(add(base_chain(
        OUTPUT_NAT,
        NfChainType::NAT,
        NfHook::Output,
        NAT_PRIORITY,
        NfChainPolicy::Accept,
    )));
    out.push(add(base_chain(
        OUTPUT_FILTER,
        NfChainType::Filter,
        NfHook::Output,
        FILTER_PRIORITY,
        NfChainPolicy::Drop,
    )));

    for stmts in [
        vec![dport("udp", 53), redirect(spec.dns_port)],
        vec![dport("tcp", 53), redirect(spec.dns_port)],
        vec![meta_eq(MetaKey::Oif, "lo"), accept()],
        vec![meta_eq(MetaKey::L4proto, "tcp"), redirect(spec.proxy_port)],
    ] {
        out.push(rule(OUTPUT_NAT, stmts));
    }
    for stmts in [
        vec![meta_eq(MetaKey::Oif, "lo"), accept()],
        vec![ct_status_dnat(), accept()],
        vec![counter(), drop()],
    ] {
        out.push(rule(OUTPUT_FILTER, stmts));
    }
}

fn tap_chains(spec: &SandboxSpec, tap: &str, out: &mut Vec<NfObject<'static>>) {
    out.push(add(base_chain(
        PREROUTING_NAT,
        NfChainType::NAT,
        NfHook::Prerouting,
        NAT_PRIORITY,
        NfChainPolicy::Accept,
    )));
    out.push(add(base_chain(
        INPUT_FILTER,
        NfChainType::Filter,
        NfHook::Input,
        FILTER_PRIORITY,
        NfChainPolicy::Accept,
    )));
    out.push(add(base_chain(
        FORWARD_FILTER,
        NfChainType::Filter,
        NfHook::Forward,
        FILTER_PRIORITY,
        NfChainPolicy::Accept,
    )));

    let from_tap = || meta_eq(MetaKey::Iifname, tap);
    for stmts in [
        vec![from_tap(), dport("udp", 53), redirect(spec.dns_port)],
        vec![from_tap(), dport("tcp", 53), redirect(spec.dns_port)],
        vec![
            from_tap(),
            meta_eq(MetaKey::L4proto, "tcp"),
            redirect(spec.proxy_port),
        ],
    ] {
        out.push(rule(PREROUTING_NAT, stmts));
    }
    for stmts in [
        vec![from_tap(), dport("tcp", spec.proxy_port), accept()],
        vec![from_tap(), dport("tcp", spec.dns_port), accept()],
        vec![from_tap(), dport("udp", spec.dns_port), accept()],
        vec![from_tap(), neighbor_discovery(), accept()],
        vec![from_tap(), counter(), drop()],
    ] {
        out.push(rule(INPUT_FILTER, stmts));
    }
    out.push(rule(FORWARD_FILTER, vec![from_tap(), counter(), drop()]));
}

fn add(obj: NfListObject<'static>) -> NfObject<'static> {
    NfObject::CmdObject(NfCmd::Add(obj))
}

fn table() -> Table<'static> {
    Table {
        family: NfFamily::INet,
        name: TABLE.into(),
        handle: None,
    }
}

fn base_chain(
    name: &'static str,
    kind: NfChainType,
    hook: NfHook,
    prio: i32,
    policy: NfChainPolicy,
) -> NfListObject<'static> {
    NfListObject::Chain(Chain {
        family: NfFamily::INet,
        table: TABLE.into(),
        name: name.into(),
        _type: Some(kind),
        hook: Some(hook),
        prio: Some(prio),
        policy: Some(policy),
        ..Chain::default()
    })
}

fn rule(chain: &'static str, stmts: Vec<Statement<'static>>) -> NfObject<'static> {
    add(NfListObject::Rule(Rule {
        family: NfFamily::INet,
        table: TABLE.into(),
        chain: chain.into(),
        expr: Cow::Owned(stmts),
        ..Rule::default()
    }))
}

fn matches(
    left: Expression<'static>,
    op: Operator,
    right: Expression<'static>,
) -> Statement<'static> {
    Statement::Match(Match { left, right, op })
}

fn dport(protocol: &'static str, port: u16) -> Statement<'static> {
    matches(
        Expression::Named(NamedExpression::Payload(Payload::PayloadField(
            PayloadField {
                protocol: protocol.into(),
                field: "dport".into(),
            },
        ))),
        Operator::EQ,
        Expression::Number(u32::from(port)),
    )
}

fn meta_eq(key: MetaKey, value: &str) -> Statement<'static> {
    matches(
        Expression::Named(NamedExpression::Meta(Meta { key })),
        Operator::EQ,
        Expression::String(value.to_owned().into()),
    )
}

fn ct_status_dnat() -> Statement<'static> {
    matches(
        Expression::Named(NamedExpression::CT(CT {
            key: "status".into(),
            family: None,
            dir: None,
        })),
        Operator::IN,
        Expression::String("dnat".into()),
    )
}

fn neighbor_discovery() -> Statement<'static> {
    matches(
        Expression::Named(NamedExpression::Payload(Payload::PayloadField(
            PayloadField {
                protocol: "icmpv6".into(),
                field: "type".into(),
            },
        ))),
        Operator::EQ,
        Expression::Named(NamedExpression::Set(vec![
            nftables::expr::SetItem::Element(Expression::String("nd-neighbor-solicit".into())),
            nftables::expr::SetItem::Element(Expression::String("nd-neighbor-advert".into())),
        ])),
    )
}

fn redirect(port: u16) -> Statement<'static> {
    Statement::Redirect(Some(NAT {
        addr: None,
        family: None,
        port: Some(Expression::Number(u32::from(port))),
        flags: None,
    }))
}

fn accept() -> Statement<'static> {
    Statement::Accept(None)
}

fn drop() -> Statement<'static> {
    Statement::Drop(None)
}

fn counter() -> Statement<'static> {
    Statement::Counter(Counter::Named(DROP_COUNTER.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn golden(name: &str, spec: &SandboxSpec) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("src/enforce/testdata")
            .join(name);
        let got = serde_json::to_string_pretty(&ruleset(spec)).unwrap() + "\n";
        if std::env::var_os("SLUICE_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(&path, &got).unwrap();
            return;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "reading {}: {e} (run with SLUICE_BLESS=1 to create it)",
                path.display()
            )
        });
        assert!(
            got == want,
            "ruleset JSON differs from {} (if the change is intended, rerun with SLUICE_BLESS=1 and review the diff)\n--- got ---\n{got}",
            path.display()
        );
    }

    #[test]
    fn host_ruleset_matches_golden_file() {
        golden(
            "host.json",
            &SandboxSpec {
                proxy_port: 15001,
                dns_port: 15053,
                tap: None,
            },
        );
    }

    #[test]
    fn tap_ruleset_matches_golden_file() {
        golden(
            "tap.json",
            &SandboxSpec {
                proxy_port: 15001,
                dns_port: 15053,
                tap: Some("sluicetap0".into()),
            },
        );
    }

    #[test]
    fn host_ruleset_ends_output_filter_with_counted_drop() {
        let rs = ruleset(&SandboxSpec::host(1, 2));
        let last = rs
            .objects
            .iter()
            .rev()
            .find_map(|o| match o {
                NfObject::CmdObject(NfCmd::Add(NfListObject::Rule(r)))
                    if r.chain == OUTPUT_FILTER =>
                {
                    Some(r.expr.to_vec())
                }
                _ => None,
            })
            .unwrap();
        assert_eq!(last, vec![counter(), drop()]);
    }

    #[test]
    fn batch_replaces_an_existing_table() {
        let json = serde_json::to_value(ruleset(&SandboxSpec::host(1, 2))).unwrap();
        let cmds: Vec<String> = json["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .take(3)
            .map(|o| o.as_object().unwrap().keys().next().unwrap().clone())
            .collect();
        assert_eq!(cmds, ["add", "delete", "add"]);
    }

    #[test]
    fn first_ruleset_creates_the_table_and_adds_the_same_objects() {
        for spec in [SandboxSpec::host(1, 2), SandboxSpec::tap(1, 2, "tap0")] {
            let full = serde_json::to_value(ruleset(&spec)).unwrap();
            let first = serde_json::to_value(first_ruleset(&spec)).unwrap();
            let (full, first) = (
                full["nftables"].as_array().unwrap(),
                first["nftables"].as_array().unwrap(),
            );
            assert_eq!(first[0]["create"]["table"], full[2]["add"]["table"]);
            assert_eq!(first[1..], full[3..]);
            assert!(!first.iter().any(|o| o.get("delete").is_some()));
        }
    }

    #[test]
    fn every_drop_rule_counts_into_the_named_counter() {
        for spec in [SandboxSpec::host(1, 2), SandboxSpec::tap(1, 2, "tap0")] {
            let json = serde_json::to_value(ruleset(&spec)).unwrap();
            let objects = json["nftables"].as_array().unwrap();
            assert!(objects
                .iter()
                .any(|o| o["add"]["counter"]["name"] == DROP_COUNTER));
            let drops: Vec<_> = objects
                .iter()
                .filter_map(|o| o["add"]["rule"]["expr"].as_array())
                .filter(|e| e.iter().any(|s| s.get("drop").is_some()))
                .collect();
            assert!(!drops.is_empty());
            for expr in drops {
                assert!(
                    expr.iter().any(|s| s["counter"] == DROP_COUNTER),
                    "{expr:?}"
                );
            }
        }
    }
}
