//! The read-back compare: what a listing of the namespace's ruleset holds
//! against the batch sluice applied. Pure (JSON in, verdict out), so every
//! way a table can differ is unit-tested without a namespace.
//!
//! Compared, per table sluice applied: chains with their type, hook,
//! priority, policy and device; every rule's expressions, in order (the
//! elements of an anonymous set in any order); named objects (the drop
//! counters). Ignored: handles and counter values. Anything else in one of
//! sluice's tables (a set, a quota, a chain or rule sluice did not add) is a
//! difference. This module must never tolerate a difference: it only says
//! which one it found first.

use std::collections::BTreeMap;

use serde_json::Value;

use super::EnforceError;

/// What a listing holds: the tables sluice asked about (if there), keyed
/// `family name`, and every other table, as `family name`.
#[derive(Debug, Default)]
pub(super) struct Listing {
    pub(crate) tables: BTreeMap<String, Table>,
    pub(crate) foreign: Vec<String>,
}

/// The comparable content of one table: chains with their properties,
/// each chain's rules (expressions only), in order, named counters, and
/// the devices netdev chains are bound to.
#[derive(Debug, Default)]
pub(super) struct Table {
    chains: Vec<(String, Value)>,
    rules: Vec<(String, Value)>,
    counters: Vec<String>,
    /// `(chain, device)` of chains bound to a device, where the JSON says.
    pub(crate) devices: Vec<(String, String)>,
}

pub(super) fn objects(doc: &Value) -> Result<&Vec<Value>, EnforceError> {
    doc.get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| EnforceError::Parse("no top-level \"nftables\" array".into()))
}

/// `(kind, body)` of a listing object such as `{"chain": {...}}`.
fn kind_of(obj: &Value) -> (&str, &Value) {
    obj.as_object()
        .and_then(|o| o.iter().next())
        .map(|(k, v)| (k.as_str(), v))
        .unwrap_or(("", &Value::Null))
}

/// `family name` of the table that `body` (a table, or an object inside
/// one) belongs to.
pub(super) fn table_key(kind: &str, body: &Value) -> String {
    let name = if kind == "table" {
        &body["name"]
    } else {
        &body["table"]
    };
    format!(
        "{} {}",
        body["family"].as_str().unwrap_or_default(),
        name.as_str().unwrap_or_default()
    )
}

impl Listing {
    /// From a JSON listing (`list ruleset`, `list table ...`), keeping the
    /// content of the tables named in `ours` (`family name`).
    pub(super) fn parse(listing: &Value, ours: &[String]) -> Result<Listing, EnforceError> {
        let mut out = Listing::default();
        for obj in objects(listing)? {
            let (kind, body) = kind_of(obj);
            if kind == "metainfo" {
                continue;
            }
            let key = table_key(kind, body);
            if !ours.contains(&key) {
                if kind == "table" {
                    out.foreign.push(key);
                }
                continue;
            }
            // nft lists a table's flags only when it has some; a dormant
            // table (the only one nft sets) hooks none of its chains.
            if kind == "table" && body.get("flags").is_some() {
                return Err(EnforceError::Mismatch(format!(
                    "table {key} has flags (dormant: no chain hooked), expected none"
                )));
            }
            let table = out.tables.entry(key).or_default();
            match kind {
                "table" => {}
                "chain" | "rule" | "counter" => table.push(obj),
                other => {
                    return Err(EnforceError::Mismatch(format!(
                        "unexpected {other} object in the table: {obj}"
                    )))
                }
            }
        }
        Ok(out)
    }
}

impl Table {
    /// From the batch sluice applies: the `add` commands for chains, rules
    /// and counters, per table (`family name`).
    pub(super) fn from_batch(batch: &Value) -> Result<BTreeMap<String, Table>, EnforceError> {
        let mut tables: BTreeMap<String, Table> = BTreeMap::new();
        for obj in objects(batch)? {
            let Some(added) = obj.get("add") else {
                continue;
            };
            let (kind, body) = kind_of(added);
            let table = tables.entry(table_key(kind, body)).or_default();
            if kind != "table" {
                table.push(added);
            }
        }
        Ok(tables)
    }

    fn push(&mut self, obj: &Value) {
        if let Some(chain) = obj.get("chain") {
            let mut chain = chain.clone();
            let name = chain["name"].as_str().unwrap_or_default().to_string();
            if let Some(m) = chain.as_object_mut() {
                m.remove("handle");
                // Compared on its own: nft 1.0.6 leaves it out of JSON listings.
                if let Some(Value::String(dev)) = m.remove("dev") {
                    self.devices.push((name.clone(), dev));
                }
            }
            self.chains.push((name, chain));
        } else if let Some(rule) = obj.get("rule") {
            let name = rule["chain"].as_str().unwrap_or_default().to_string();
            let mut expr = rule.get("expr").cloned().unwrap_or(Value::Null);
            normalize_counters(&mut expr);
            sort_sets(&mut expr);
            let mut body = serde_json::json!({ "expr": expr });
            if let Some(c) = rule.get("comment") {
                body["comment"] = c.clone();
            }
            self.rules.push((name, body));
        } else if let Some(counter) = obj.get("counter") {
            let name = counter["name"].as_str().unwrap_or_default().to_string();
            self.counters.push(name);
        }
    }

    fn rules_of(&self, chain: &str) -> Vec<&Value> {
        self.rules
            .iter()
            .filter(|(c, _)| c == chain)
            .map(|(_, r)| r)
            .collect()
    }

    /// `Err` names the first difference found.
    pub(super) fn compare(&self, got: &Table) -> Result<(), String> {
        for (name, want) in &self.chains {
            match got.chains.iter().find(|(n, _)| n == name) {
                None => return Err(format!("chain {name} is missing")),
                Some((_, have)) if have != want => {
                    return Err(format!("chain {name} is {have}, expected {want}"))
                }
                Some(_) => {}
            }
            let (want_rules, have_rules) = (self.rules_of(name), got.rules_of(name));
            for (i, (w, h)) in want_rules.iter().zip(&have_rules).enumerate() {
                if w != h {
                    return Err(format!(
                        "chain {name} rule {} is {}, expected {}",
                        i + 1,
                        h["expr"],
                        w["expr"]
                    ));
                }
            }
            if want_rules.len() != have_rules.len() {
                return Err(format!(
                    "chain {name} has {} rules, expected {}",
                    have_rules.len(),
                    want_rules.len()
                ));
            }
        }
        if let Some((name, _)) = got
            .chains
            .iter()
            .find(|(n, _)| !self.chains.iter().any(|(w, _)| w == n))
        {
            return Err(format!("unexpected chain {name}"));
        }
        if let Some((name, _)) = got
            .rules
            .iter()
            .find(|(n, _)| !self.chains.iter().any(|(w, _)| w == n))
        {
            return Err(format!("rule in unexpected chain {name}"));
        }
        if let Some(name) = self.counters.iter().find(|c| !got.counters.contains(c)) {
            return Err(format!("counter {name} is missing"));
        }
        if let Some(name) = got.counters.iter().find(|c| !self.counters.contains(c)) {
            return Err(format!("unexpected counter {name}"));
        }
        for (chain, dev) in &got.devices {
            if !self.devices.contains(&(chain.clone(), dev.clone())) {
                return Err(format!("chain {chain} is bound to device {dev}"));
            }
        }
        Ok(())
    }
}

/// Compares every table `want` holds (from [`Table::from_batch`]) with the
/// listing; the first difference, or a missing table, is the error.
pub(super) fn compare_all(
    want: &BTreeMap<String, Table>,
    got: &Listing,
) -> Result<(), EnforceError> {
    for (key, table) in want {
        let have = got
            .tables
            .get(key)
            .ok_or_else(|| EnforceError::TableMissing(key.clone()))?;
        table
            .compare(have)
            .map_err(|e| EnforceError::Mismatch(format!("table {key}: {e}")))?;
    }
    Ok(())
}

/// The named counters of the tables in `listing`: `(table, name, packets)`.
pub(super) fn counters(listing: &Value) -> Result<Vec<(String, String, u64)>, EnforceError> {
    let mut out = Vec::new();
    for obj in objects(listing)? {
        let (kind, body) = kind_of(obj);
        if kind != "counter" {
            continue;
        }
        let packets = body["packets"]
            .as_u64()
            .ok_or_else(|| EnforceError::Parse(format!("counter without a packet count: {obj}")))?;
        let name = body["name"].as_str().unwrap_or_default().to_string();
        out.push((table_key(kind, body), name, packets));
    }
    Ok(out)
}

/// Counter values change as packets flow: compare only that a counter is
/// there (`{"counter": null}` as sluice submits an anonymous one; a named
/// one, `{"counter": "dropped"}`, is compared by name).
fn normalize_counters(expr: &mut Value) {
    if let Some(stmts) = expr.as_array_mut() {
        for stmt in stmts {
            if let Some(c) = stmt.get_mut("counter") {
                if c.get("packets").is_some() || c.get("bytes").is_some() {
                    *c = Value::Null;
                }
            }
        }
    }
}

/// An anonymous set matches the same whatever the order of its elements,
/// and nft lists them in its own order: compare them sorted.
fn sort_sets(value: &mut Value) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(sort_sets),
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                if key == "set" {
                    if let Value::Array(elements) = inner {
                        elements.sort_by_key(|e| e.to_string());
                    }
                }
                sort_sets(inner);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::ruleset::{ruleset, DROP_COUNTER};
    use super::super::SandboxSpec;
    use super::*;
    use serde_json::json;

    #[test]
    fn a_table_with_flags_is_refused() {
        let listing = json!({"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"table": {"family": "inet", "name": "sluice", "handle": 1, "flags": "dormant"}},
        ]});
        let err = Listing::parse(&listing, &["inet sluice".to_string()]).unwrap_err();
        assert!(err.to_string().contains("dormant"), "{err}");
    }

    /// Simulates libnftables' listing of the applied batch: handles added,
    /// counter values filled in, netdev chains without their device (as
    /// nft 1.0.6 lists them).
    fn listing_for(spec: &SandboxSpec) -> Value {
        let batch = serde_json::to_value(ruleset(spec)).unwrap();
        let mut objs = vec![json!({"metainfo": {"version": "1.0.6"}})];
        let mut tables = Vec::new();
        let added = batch["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o.get("add"))
            .filter(|o| match o.get("table") {
                Some(t) if tables.contains(t) => false,
                Some(t) => {
                    tables.push(t.clone());
                    true
                }
                None => true,
            })
            .cloned()
            .collect::<Vec<_>>();
        for (handle, obj) in (1..).zip(added) {
            let mut o = obj;
            if let Some(chain) = o.get_mut("chain").and_then(Value::as_object_mut) {
                chain.remove("dev");
            }
            let (kind, inner) = o
                .as_object_mut()
                .unwrap()
                .iter_mut()
                .next()
                .map(|(k, v)| (k.clone(), v))
                .unwrap();
            inner["handle"] = json!(handle);
            if kind == "counter" {
                inner["packets"] = json!(7);
                inner["bytes"] = json!(420);
            }
            objs.push(o);
        }
        json!({ "nftables": objs })
    }

    fn ours(spec: &SandboxSpec) -> Vec<String> {
        spec.tables()
            .into_iter()
            .map(|(f, n)| format!("{f} {n}"))
            .collect()
    }

    fn compare(spec: &SandboxSpec, listing: &Value) -> Result<(), String> {
        let want = Table::from_batch(&serde_json::to_value(ruleset(spec)).unwrap()).unwrap();
        let got = Listing::parse(listing, &ours(spec)).map_err(|e| e.to_string())?;
        compare_all(&want, &got).map_err(|e| e.to_string())
    }

    fn vm_spec() -> SandboxSpec {
        SandboxSpec::vm(15001, 15053, crate::enforce::example_fence("tap0"))
    }

    fn push(listing: &mut Value, obj: Value) {
        listing["nftables"].as_array_mut().unwrap().push(obj);
    }

    #[test]
    fn readback_with_handles_and_counts_matches() {
        for spec in [SandboxSpec::host(15001, 15053), vm_spec()] {
            compare(&spec, &listing_for(&spec)).unwrap();
        }
    }

    #[test]
    fn changed_policy_is_a_mismatch() {
        let spec = SandboxSpec::host(15001, 15053);
        let mut l = listing_for(&spec);
        for o in l["nftables"].as_array_mut().unwrap() {
            if o["chain"]["name"] == "output_filter" {
                o["chain"]["policy"] = json!("accept");
            }
        }
        let err = compare(&spec, &l).unwrap_err();
        assert!(err.contains("chain output_filter"), "{err}");
    }

    #[test]
    fn missing_rule_is_a_mismatch() {
        let spec = SandboxSpec::host(15001, 15053);
        let mut l = listing_for(&spec);
        let objs = l["nftables"].as_array_mut().unwrap();
        let last = objs.iter().rposition(|o| o.get("rule").is_some()).unwrap();
        objs.remove(last);
        let err = compare(&spec, &l).unwrap_err();
        assert!(
            err.contains("output_filter has 2 rules, expected 3"),
            "{err}"
        );
    }

    #[test]
    fn different_port_is_a_mismatch() {
        let err = compare(
            &SandboxSpec::host(15001, 15053),
            &listing_for(&SandboxSpec::host(15002, 15053)),
        )
        .unwrap_err();
        assert!(err.contains("output_nat rule 4"), "{err}");
    }

    #[test]
    fn extra_chain_is_a_mismatch() {
        let spec = SandboxSpec::host(15001, 15053);
        let mut l = listing_for(&spec);
        push(
            &mut l,
            json!({"chain": {"family": "inet", "table": "sluice", "name": "sneaky", "handle": 99}}),
        );
        assert!(compare(&spec, &l)
            .unwrap_err()
            .contains("unexpected chain sneaky"));
    }

    #[test]
    fn drop_rule_counting_elsewhere_is_a_mismatch() {
        let spec = SandboxSpec::host(15001, 15053);
        let mut l = listing_for(&spec);
        for o in l["nftables"].as_array_mut().unwrap() {
            if let Some(expr) = o["rule"]["expr"].as_array_mut() {
                for s in expr {
                    if s["counter"] == DROP_COUNTER {
                        s["counter"] = json!({"packets": 0, "bytes": 0});
                    }
                }
            }
        }
        let err = compare(&spec, &l).unwrap_err();
        assert!(err.contains("chain output_filter rule 3"), "{err}");
    }

    #[test]
    fn missing_or_extra_counter_is_a_mismatch() {
        let spec = SandboxSpec::host(15001, 15053);
        let mut l = listing_for(&spec);
        l["nftables"]
            .as_array_mut()
            .unwrap()
            .retain(|o| o.get("counter").is_none());
        let err = compare(&spec, &l).unwrap_err();
        assert!(err.contains("counter dropped is missing"), "{err}");

        let mut l = listing_for(&spec);
        push(
            &mut l,
            json!({"counter": {"family": "inet", "table": "sluice", "name": "other", "packets": 0, "bytes": 0}}),
        );
        let err = compare(&spec, &l).unwrap_err();
        assert!(err.contains("unexpected counter other"), "{err}");
    }

    #[test]
    fn a_set_in_the_table_is_a_mismatch() {
        let spec = SandboxSpec::host(15001, 15053);
        let mut l = listing_for(&spec);
        push(
            &mut l,
            json!({"set": {"family": "inet", "table": "sluice", "name": "s", "type": "ipv4_addr"}}),
        );
        let err = Listing::parse(&l, &ours(&spec)).unwrap_err().to_string();
        assert!(err.contains("unexpected set object"), "{err}");
    }

    #[test]
    fn other_tables_are_listed_apart_and_their_objects_ignored() {
        let spec = SandboxSpec::host(15001, 15053);
        let mut l = listing_for(&spec);
        push(
            &mut l,
            json!({"table": {"family": "ip", "name": "intruder", "handle": 9}}),
        );
        push(
            &mut l,
            json!({"chain": {"family": "ip", "table": "intruder", "name": "c", "handle": 1}}),
        );
        // The same name in another family is another table.
        push(
            &mut l,
            json!({"table": {"family": "ip6", "name": "sluice", "handle": 10}}),
        );
        let listing = Listing::parse(&l, &ours(&spec)).unwrap();
        assert_eq!(listing.foreign, ["ip intruder", "ip6 sluice"]);
        compare(&spec, &l).unwrap();
    }

    #[test]
    fn a_listing_without_the_table_has_none() {
        let l = json!({"nftables": [{"metainfo": {}}, {"table": {"family": "ip", "name": "x"}}]});
        let ours = ours(&SandboxSpec::host(1, 2));
        assert!(Listing::parse(&l, &ours).unwrap().tables.is_empty());
    }

    #[test]
    fn counters_are_read_per_table() {
        let l = json!({"nftables": [
            {"metainfo": {}},
            {"counter": {"family": "inet", "table": "sluice", "name": "dropped", "packets": 3, "bytes": 9}},
            {"counter": {"family": "netdev", "table": "sluice-tap0", "name": "dropped-arp", "packets": 4, "bytes": 9}},
        ]});
        assert_eq!(
            counters(&l).unwrap(),
            [
                ("inet sluice".to_string(), "dropped".to_string(), 3),
                (
                    "netdev sluice-tap0".to_string(),
                    "dropped-arp".to_string(),
                    4
                )
            ]
        );
    }

    #[test]
    fn set_elements_in_another_order_match() {
        let spec = vm_spec();
        let mut l = listing_for(&spec);
        let mut reversed = false;
        for o in l["nftables"].as_array_mut().unwrap() {
            let expr = o
                .get_mut("rule")
                .and_then(|r| r.get_mut("expr"))
                .and_then(Value::as_array_mut);
            if let Some(expr) = expr {
                for s in expr {
                    let set = s
                        .get_mut("match")
                        .and_then(|m| m.get_mut("right"))
                        .and_then(|r| r.get_mut("set"))
                        .and_then(Value::as_array_mut);
                    if let Some(set) = set {
                        set.reverse();
                        reversed = true;
                    }
                }
            }
        }
        assert!(reversed);
        compare(&spec, &l).unwrap();
    }

    #[test]
    fn a_missing_fence_table_is_named() {
        let spec = vm_spec();
        let mut l = listing_for(&spec);
        l["nftables"].as_array_mut().unwrap().retain(|o| {
            let (kind, body) = kind_of(o);
            kind == "metainfo" || !table_key(kind, body).starts_with("netdev")
        });
        let err = compare(&spec, &l).unwrap_err();
        assert!(err.contains("netdev sluice-tap0"), "{err}");
    }

    #[test]
    fn a_fence_that_admits_another_mac_or_drops_nothing_is_a_mismatch() {
        let spec = vm_spec();
        let mut l = listing_for(&spec);
        for o in l["nftables"].as_array_mut().unwrap() {
            if o["chain"]["name"] == "ingress" {
                o["chain"]["policy"] = json!("accept");
            }
        }
        let err = compare(&spec, &l).unwrap_err();
        assert!(err.contains("chain ingress"), "{err}");

        let mut l = listing_for(&spec);
        let text = serde_json::to_string(&l)
            .unwrap()
            .replace("52:54:00:5c:00:02", "52:54:00:5c:00:66");
        l = serde_json::from_str(&text).unwrap();
        let err = compare(&spec, &l).unwrap_err();
        assert!(
            err.contains("table netdev sluice-tap0: chain ingress rule 1"),
            "{err}"
        );
    }

    #[test]
    fn a_netdev_chain_listed_on_another_device_is_a_mismatch() {
        let spec = vm_spec();
        let mut l = listing_for(&spec);
        for o in l["nftables"].as_array_mut().unwrap() {
            if o["chain"]["name"] == "ingress" {
                o["chain"]["dev"] = json!("eth0");
            }
        }
        let err = compare(&spec, &l).unwrap_err();
        assert!(err.contains("bound to device eth0"), "{err}");
    }
}
