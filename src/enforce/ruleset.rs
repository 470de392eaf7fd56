//! The pure builder of a sandbox's tables: a [`SandboxSpec`] in, one
//! nftables JSON batch out. Host mode's `inet sluice` is built here; a
//! microVM tap's fence (`netdev` and `inet sluice-TAP`) in `fence`. No I/O
//! here, so golden tests can pin the output.

use std::borrow::Cow;

use nftables::expr::{Expression, Meta, MetaKey, NamedExpression, Payload, PayloadField, CT};
use nftables::schema::{self, Chain, NfCmd, NfListObject, NfObject, Nftables, Rule, Table};
use nftables::stmt::{Counter, Match, Operator, Statement, NAT};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};

use super::SandboxSpec;

/// The table's family and name.
pub(crate) const TABLE: &str = "sluice";
/// Host mode: NAT chain on locally generated packets.
pub(crate) const OUTPUT_NAT: &str = "output_nat";
/// Host mode: filter chain on locally generated packets (policy drop).
pub(crate) const OUTPUT_FILTER: &str = "output_filter";
/// Tap mode: NAT chain on packets arriving from the tap.
pub(crate) const PREROUTING_NAT: &str = "prerouting_nat";
/// Tap mode: filter chain on packets from the tap to this namespace.
pub(crate) const INPUT_FILTER: &str = "input_filter";
/// Tap mode: filter chain on packets from the tap to anywhere else.
pub(crate) const FORWARD_FILTER: &str = "forward_filter";
/// The named counter every drop rule of the table counts into: reading this
/// one object is all a drop-count scrape needs.
pub(crate) const DROP_COUNTER: &str = "dropped";

pub(super) const NAT_PRIORITY: i32 = -100;
pub(super) const FILTER_PRIORITY: i32 = 0;

/// Builds the whole batch: create-then-delete each table (so re-applying
/// replaces it instead of appending, in the same transaction), then the
/// tables, their drop counters, chains and rules.
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
/// Tap mode (`spec.tap == Some(fence)`): the fence's two tables, see
/// [`super::fence`].
pub(crate) fn ruleset(spec: &SandboxSpec) -> Nftables<'static> {
    batch(spec, true)
}

fn batch(spec: &SandboxSpec, replace: bool) -> Nftables<'static> {
    let mut objects = Vec::new();
    match &spec.tap {
        None => {
            if replace {
                objects.push(add(NfListObject::Table(table())));
                objects.push(NfObject::CmdObject(NfCmd::Delete(NfListObject::Table(
                    table(),
                ))));
                objects.push(add(NfListObject::Table(table())));
            } else {
                objects.push(NfObject::CmdObject(NfCmd::Create(NfListObject::Table(
                    table(),
                ))));
            }
            objects.push(add(NfListObject::Counter(schema::Counter {
                family: NfFamily::INet,
                table: TABLE.into(),
                name: DROP_COUNTER.into(),
                handle: None,
                packets: None,
                bytes: None,
            })));
            host_chains(spec, &mut objects);
        }
        Some(fence) => fence.objects(spec.proxy_port, spec.dns_port, replace, &mut objects),
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
    batch(spec, false)
}

/// A batch that removes the spec's tables (and nothing else) if they are
/// there: each is added (a no-op when it exists) and deleted, in one
/// transaction.
pub(super) fn removal(spec: &SandboxSpec) -> Nftables<'static> {
    let mut objects = Vec::new();
    for (family, name) in spec.tables() {
        let family = if family == "netdev" {
            NfFamily::NetDev
        } else {
            NfFamily::INet
        };
        let t = || {
            NfListObject::Table(Table {
                family,
                name: name.clone().into(),
                handle: None,
            })
        };
        objects.push(add(t()));
        objects.push(NfObject::CmdObject(NfCmd::Delete(t())));
    }
    Nftables {
        objects: Cow::Owned(objects),
    }
}

fn host_chains(spec: &SandboxSpec, out: &mut Vec<NfObject<'static>>) {
    out.push(add(base_chain(
        NfFamily::INet,
        TABLE,
        OUTPUT_NAT,
        NfChainType::NAT,
        NfHook::Output,
        NAT_PRIORITY,
        NfChainPolicy::Accept,
    )));
    out.push(add(base_chain(
        NfFamily::INet,
        TABLE,
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
        vec![meta_l4proto(TCP), redirect(spec.proxy_port)],
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

pub(super) fn add(obj: NfListObject<'static>) -> NfObject<'static> {
    NfObject::CmdObject(NfCmd::Add(obj))
}

fn table() -> Table<'static> {
    Table {
        family: NfFamily::INet,
        name: TABLE.into(),
        handle: None,
    }
}

pub(super) fn base_chain(
    family: NfFamily,
    table: &str,
    name: &'static str,
    kind: NfChainType,
    hook: NfHook,
    prio: i32,
    policy: NfChainPolicy,
) -> NfListObject<'static> {
    NfListObject::Chain(Chain {
        family,
        table: table.to_owned().into(),
        name: name.into(),
        _type: Some(kind),
        hook: Some(hook),
        prio: Some(prio),
        policy: Some(policy),
        ..Chain::default()
    })
}

fn rule(chain: &'static str, stmts: Vec<Statement<'static>>) -> NfObject<'static> {
    rule_in(NfFamily::INet, TABLE, chain, stmts)
}

pub(super) fn rule_in(
    family: NfFamily,
    table: &str,
    chain: &'static str,
    stmts: Vec<Statement<'static>>,
) -> NfObject<'static> {
    add(NfListObject::Rule(Rule {
        family,
        table: table.to_owned().into(),
        chain: chain.into(),
        expr: Cow::Owned(stmts),
        ..Rule::default()
    }))
}

pub(super) fn matches(
    left: Expression<'static>,
    op: Operator,
    right: Expression<'static>,
) -> Statement<'static> {
    Statement::Match(Match { left, right, op })
}

pub(super) fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: protocol.into(),
            field: field.into(),
        },
    )))
}

pub(super) fn dport(protocol: &'static str, port: u16) -> Statement<'static> {
    matches(
        payload(protocol, "dport"),
        Operator::EQ,
        Expression::Number(u32::from(port)),
    )
}

/// `meta l4proto N`, with the protocol's number: libnftables lists it so
/// (see `libnft::NFT_CTX_OUTPUT_NUMERIC_PROTO`), and the read-back compares
/// what it lists with what was added.
pub(super) fn meta_l4proto(number: u8) -> Statement<'static> {
    matches(
        Expression::Named(NamedExpression::Meta(Meta {
            key: MetaKey::L4proto,
        })),
        Operator::EQ,
        Expression::Number(u32::from(number)),
    )
}

/// IANA's number for TCP.
pub(super) const TCP: u8 = 6;

pub(super) fn meta_eq(key: MetaKey, value: &str) -> Statement<'static> {
    matches(
        Expression::Named(NamedExpression::Meta(Meta { key })),
        Operator::EQ,
        Expression::String(value.to_owned().into()),
    )
}

pub(super) fn ct_status_dnat() -> Statement<'static> {
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

pub(super) fn redirect(port: u16) -> Statement<'static> {
    Statement::Redirect(Some(NAT {
        addr: None,
        family: None,
        port: Some(Expression::Number(u32::from(port))),
        flags: None,
    }))
}

pub(super) fn accept() -> Statement<'static> {
    Statement::Accept(None)
}

pub(super) fn drop() -> Statement<'static> {
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
    fn vm_ruleset_matches_golden_file() {
        let spec = SandboxSpec::vm(15001, 15053, super::super::example_fence("tap0"));
        golden("vm.json", &spec);
    }

    #[test]
    fn attached_vm_ruleset_matches_golden_file() {
        let mut fence = super::super::example_fence("vmtap7");
        fence.dedicated = false;
        fence.ipv6 = None;
        golden("vm-attach.json", &SandboxSpec::vm(15001, 15053, fence));
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

    fn vm_spec() -> SandboxSpec {
        SandboxSpec::vm(1, 2, super::super::example_fence("tap0"))
    }

    #[test]
    fn first_ruleset_creates_the_tables_and_adds_the_same_objects() {
        for (spec, tables) in [(SandboxSpec::host(1, 2), 1), (vm_spec(), 2)] {
            let full = serde_json::to_value(ruleset(&spec)).unwrap();
            let first = serde_json::to_value(first_ruleset(&spec)).unwrap();
            let (full, first) = (
                full["nftables"].as_array().unwrap(),
                first["nftables"].as_array().unwrap(),
            );
            for t in 0..tables {
                assert_eq!(first[t]["create"]["table"], full[3 * t + 2]["add"]["table"]);
            }
            assert_eq!(first[tables..], full[3 * tables..]);
            assert!(!first.iter().any(|o| o.get("delete").is_some()));
        }
    }

    #[test]
    fn removal_deletes_exactly_the_specs_tables() {
        let json = serde_json::to_value(removal(&vm_spec())).unwrap();
        let objects = json["nftables"].as_array().unwrap();
        let deleted: Vec<String> = objects
            .iter()
            .filter_map(|o| o.get("delete"))
            .map(|d| format!("{} {}", d["table"]["family"], d["table"]["name"]))
            .collect();
        assert_eq!(
            deleted,
            [r#""inet" "sluice-tap0""#, r#""netdev" "sluice-tap0""#]
        );
    }

    #[test]
    fn every_drop_rule_counts_into_a_named_counter_of_its_table() {
        for spec in [SandboxSpec::host(1, 2), vm_spec()] {
            let json = serde_json::to_value(ruleset(&spec)).unwrap();
            let objects = json["nftables"].as_array().unwrap();
            let counters: Vec<(String, String)> = objects
                .iter()
                .filter_map(|o| o["add"]["counter"].as_object())
                .map(|c| {
                    (
                        c["table"].to_string() + &c["family"].to_string(),
                        c["name"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            let drops: Vec<_> = objects
                .iter()
                .filter_map(|o| o["add"]["rule"].as_object())
                .filter(|r| {
                    r["expr"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|s| s.get("drop").is_some())
                })
                .collect();
            assert!(!drops.is_empty());
            for r in drops {
                let name = r["expr"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find_map(|s| s["counter"].as_str())
                    .unwrap_or_else(|| panic!("a drop without a named counter: {r:?}"));
                let table = r["table"].to_string() + &r["family"].to_string();
                assert!(
                    counters.contains(&(table, name.to_string())),
                    "{name} is not a counter of its table"
                );
            }
        }
    }

    #[test]
    fn the_vm_fence_drops_by_default_on_layer_two_and_in_the_vmms_output() {
        let json = serde_json::to_value(ruleset(&vm_spec())).unwrap();
        let chains: Vec<&serde_json::Value> = json["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o["add"].get("chain"))
            .collect();
        let policy = |name: &str| {
            chains
                .iter()
                .find(|c| c["name"] == name)
                .map(|c| c["policy"].as_str().unwrap().to_string())
        };
        assert_eq!(policy(super::super::INGRESS).as_deref(), Some("drop"));
        assert_eq!(policy(OUTPUT_FILTER).as_deref(), Some("drop"));
        let ingress = chains.iter().find(|c| c["name"] == "ingress").unwrap();
        assert_eq!(ingress["dev"], "tap0");
        assert_eq!(ingress["family"], "netdev");
    }
}
