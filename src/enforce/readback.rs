//! The read-back compare: what a listing of the namespace's ruleset holds
//! against the batch sluice applied. Pure (JSON in, verdict out), so every
//! way a table can differ is unit-tested without a namespace.
//!
//! Compared: chains with their type, hook, priority and policy; every rule's
//! expressions, in order; named objects (the drop counter). Ignored: handles
//! and counter values. Anything else in the table (a set, a quota, a chain or
//! rule sluice did not add) is a difference. This module must never
//! tolerate a difference: it only says which one it found first.

use serde_json::Value;

use super::ruleset::TABLE;
use super::EnforceError;

/// What a listing holds: the `inet sluice` table (if any) and every other
/// table, as `family name`.
#[derive(Debug, Default)]
pub(super) struct Listing {
    pub sluice: Option<Table>,
    pub foreign: Vec<String>,
}

/// The comparable content of the table: chains with their properties,
/// each chain's rules (expressions only), in order, and named counters.
#[derive(Debug, Default)]
pub(super) struct Table {
    chains: Vec<(String, Value)>,
    rules: Vec<(String, Value)>,
    counters: Vec<String>,
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

/// Whether `body` (a table, or an object inside one) belongs to `inet sluice`.
fn in_sluice(kind: &str, body: &Value) -> bool {
    let name = if kind == "table" {
        &body["name"]
    } else {
        &body["table"]
    };
    body["family"] == "inet" && name == TABLE
}

impl Listing {
    /// From a JSON listing (`list ruleset`, `list table inet sluice`).
    pub(super) fn parse(listing: &Value) -> Result<Listing, EnforceError> {
        let mut out = Listing::default();
        for obj in objects(listing)? {
            let (kind, body) = kind_of(obj);
            if kind == "metainfo" {
                continue;
            }
            if !in_sluice(kind, body) {
                if kind == "table" {
                    out.foreign.push(format!(
                        "{} {}",
                        body["family"].as_str().unwrap_or_default(),
                        body["name"].as_str().unwrap_or_default()
                    ));
                }
                continue;
            }
            let table = out.sluice.get_or_insert_with(Table::default);
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
    /// and counters.
    pub(super) fn from_batch(batch: &Value) -> Result<Table, EnforceError> {
        let mut t = Table::default();
        for obj in objects(batch)? {
            if let Some(added) = obj.get("add") {
                t.push(added);
            }
        }
        Ok(t)
    }

    fn push(&mut self, obj: &Value) {
        if let Some(chain) = obj.get("chain") {
            let mut chain = chain.clone();
            if let Some(m) = chain.as_object_mut() {
                m.remove("handle");
            }
            let name = chain["name"].as_str().unwrap_or_default().to_string();
            self.chains.push((name, chain));
        } else if let Some(rule) = obj.get("rule") {
            let name = rule["chain"].as_str().unwrap_or_default().to_string();
            let mut expr = rule.get("expr").cloned().unwrap_or(Value::Null);
            normalize_counters(&mut expr);
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
        Ok(())
    }
}

/// Packets counted so far by the `inet sluice` counters in `listing` whose
/// name starts with `prefix`, summed.
pub(super) fn counted(listing: &Value, prefix: &str) -> Result<u64, EnforceError> {
    let mut total = 0u64;
    for obj in objects(listing)? {
        let (kind, body) = kind_of(obj);
        if kind == "counter"
            && in_sluice(kind, body)
            && body["name"].as_str().is_some_and(|n| n.starts_with(prefix))
        {
            let packets = body["packets"].as_u64().ok_or_else(|| {
                EnforceError::Parse(format!("counter without a packet count: {obj}"))
            })?;
            total = total.saturating_add(packets);
        }
    }
    Ok(total)
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

#[cfg(test)]
mod tests {
    use super::super::ruleset::{ruleset, DROP_COUNTER};
    use super::super::SandboxSpec;
    use super::*;
    use serde_json::json;

    /// Simulates libnftables' listing of the applied batch: handles added,
    /// counter values filled in.
    fn listing_for(spec: &SandboxSpec) -> Value {
        let batch = serde_json::to_value(ruleset(spec)).unwrap();
        let mut objs = vec![json!({"metainfo": {"version": "1.0.6"}})];
        // Skip the leading add + delete of the table.
        for (handle, obj) in (1..).zip(batch["nftables"].as_array().unwrap().iter().skip(2)) {
            let mut o = obj["add"].clone();
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

    fn compare(spec: &SandboxSpec, listing: &Value) -> Result<(), String> {
        let want = Table::from_batch(&serde_json::to_value(ruleset(spec)).unwrap()).unwrap();
        let got = Listing::parse(listing).map_err(|e| e.to_string())?;
        want.compare(&got.sluice.expect("the listing has the table"))
    }

    fn push(listing: &mut Value, obj: Value) {
        listing["nftables"].as_array_mut().unwrap().push(obj);
    }

    #[test]
    fn readback_with_handles_and_counts_matches() {
        for spec in [
            SandboxSpec::host(15001, 15053),
            SandboxSpec::tap(1, 2, "tap0"),
        ] {
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
        let err = Listing::parse(&l).unwrap_err().to_string();
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
        let listing = Listing::parse(&l).unwrap();
        assert_eq!(listing.foreign, ["ip intruder", "ip6 sluice"]);
        compare(&spec, &l).unwrap();
    }

    #[test]
    fn a_listing_without_the_table_has_none() {
        let l = json!({"nftables": [{"metainfo": {}}, {"table": {"family": "ip", "name": "x"}}]});
        assert!(Listing::parse(&l).unwrap().sluice.is_none());
    }

    #[test]
    fn drop_counters_are_summed_by_name() {
        let l = json!({"nftables": [
            {"metainfo": {}},
            {"counter": {"family": "inet", "table": "sluice", "name": "dropped", "packets": 3, "bytes": 9}},
            {"counter": {"family": "inet", "table": "sluice", "name": "dropped_arp", "packets": 4, "bytes": 9}},
            {"counter": {"family": "inet", "table": "sluice", "name": "seen", "packets": 100, "bytes": 9}},
            {"counter": {"family": "ip", "table": "other", "name": "dropped", "packets": 100, "bytes": 9}},
        ]});
        assert_eq!(counted(&l, DROP_COUNTER).unwrap(), 7);
    }
}
