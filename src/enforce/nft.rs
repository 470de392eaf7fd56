//! Talking to `nft`: apply one batch, read the table back, compare, count.
//! Everything runs in the calling thread's network namespace (a child
//! process inherits the namespace of the thread that spawns it).

use std::io::{self, Write};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

use super::ruleset::{ruleset, TABLE};
use super::{EnforceError, SandboxSpec};

/// Applies [`ruleset`] as one `nft -j -f -` transaction (whole or nothing),
/// replacing any previous `inet sluice` table in this thread's namespace.
pub fn apply(spec: &SandboxSpec) -> Result<(), EnforceError> {
    validate(spec)?;
    let batch = serde_json::to_vec(&ruleset(spec))
        .map_err(|e| EnforceError::Parse(format!("serializing the ruleset: {e}")))?;
    let out = nft(&["-j", "-f", "-"], Some(&batch))?;
    if !out.status.success() {
        let stderr = stderr_of(&out);
        return Err(if is_permission(&stderr) {
            EnforceError::Permission { stderr }
        } else {
            EnforceError::Apply { stderr }
        });
    }
    Ok(())
}

/// Reads `inet sluice` back and compares chains (type, hook, priority,
/// policy) and every rule's expressions, in order, with what [`ruleset`]
/// builds for `spec`. Handles and counter values are ignored.
///
/// In host mode the namespace belongs to the sandbox alone, so any other
/// table in it is a mismatch too: a foreign chain could, for instance, DNAT
/// traffic past `ct status dnat accept`. (Tap mode may share its namespace
/// with the host's own firewall, so there only `inet sluice` is checked.)
pub fn verify(spec: &SandboxSpec) -> Result<(), EnforceError> {
    let want = Table::from_batch(&serde_json::to_value(ruleset(spec)).map_err(parse_err)?)?;
    let got = Table::from_listing(&list_table()?)?;
    want.compare(&got).map_err(EnforceError::Mismatch)?;
    if spec.tap.is_none() {
        if let Some(other) = foreign_tables()?.into_iter().next() {
            return Err(EnforceError::Mismatch(format!(
                "unexpected table {other} in the sandbox namespace"
            )));
        }
    }
    Ok(())
}

/// `family name` of every table in this namespace except `inet sluice`.
fn foreign_tables() -> Result<Vec<String>, EnforceError> {
    let out = nft(&["-j", "list", "tables"], None)?;
    if !out.status.success() {
        return Err(EnforceError::List {
            stderr: stderr_of(&out),
        });
    }
    let doc: Value = serde_json::from_slice(&out.stdout).map_err(parse_err)?;
    Ok(objects(&doc)?
        .iter()
        .filter_map(|o| o.get("table"))
        .map(|t| {
            (
                t["family"].as_str().unwrap_or_default(),
                t["name"].as_str().unwrap_or_default(),
            )
        })
        .filter(|&(family, name)| !(family == "inet" && name == TABLE))
        .map(|(family, name)| format!("{family} {name}"))
        .collect())
}

/// Packets dropped so far by the table's counted drop rules in this thread's
/// namespace (sum over all chains).
pub fn dropped_packets() -> Result<u64, EnforceError> {
    let listing = list_table()?;
    let mut total = 0;
    for obj in objects(&listing)? {
        let Some(expr) = obj
            .get("rule")
            .and_then(|r| r.get("expr"))
            .and_then(Value::as_array)
        else {
            continue;
        };
        if !expr.iter().any(|s| s.get("drop").is_some()) {
            continue;
        }
        for stmt in expr {
            if let Some(p) = stmt
                .get("counter")
                .and_then(|c| c.get("packets"))
                .and_then(Value::as_u64)
            {
                total += p;
            }
        }
    }
    Ok(total)
}

fn validate(spec: &SandboxSpec) -> Result<(), EnforceError> {
    if spec.proxy_port == 0 || spec.dns_port == 0 {
        return Err(EnforceError::InvalidSpec(format!(
            "proxy port {} and dns port {} must both be non-zero",
            spec.proxy_port, spec.dns_port
        )));
    }
    if let Some(tap) = &spec.tap {
        let ok = !tap.is_empty()
            && tap.len() < libc::IFNAMSIZ
            && tap
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !ok {
            return Err(EnforceError::InvalidSpec(format!(
                "tap name {tap:?} is not a valid interface name (1-15 characters of [A-Za-z0-9._-])"
            )));
        }
    }
    Ok(())
}

fn nft(args: &[&str], stdin: Option<&[u8]>) -> Result<Output, EnforceError> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => EnforceError::NftNotFound,
            _ => EnforceError::Spawn(e),
        })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A write error means nft exited early; its status and stderr say why.
        let _ = pipe.write_all(input);
    }
    child.wait_with_output().map_err(EnforceError::Spawn)
}

fn list_table() -> Result<Value, EnforceError> {
    let out = nft(&["-j", "list", "table", "inet", TABLE], None)?;
    if !out.status.success() {
        let stderr = stderr_of(&out);
        return Err(if stderr.contains("No such file or directory") {
            EnforceError::TableMissing
        } else if is_permission(&stderr) {
            EnforceError::Permission { stderr }
        } else {
            EnforceError::List { stderr }
        });
    }
    serde_json::from_slice(&out.stdout).map_err(parse_err)
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

fn is_permission(stderr: &str) -> bool {
    stderr.contains("Operation not permitted")
}

fn parse_err(e: impl std::fmt::Display) -> EnforceError {
    EnforceError::Parse(e.to_string())
}

fn objects(doc: &Value) -> Result<&Vec<Value>, EnforceError> {
    doc.get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| EnforceError::Parse("no top-level \"nftables\" array".into()))
}

/// The comparable content of the table: chains with their properties and
/// each chain's rules (expressions only), in order.
#[derive(Debug, Default)]
struct Table {
    chains: Vec<(String, Value)>,
    rules: Vec<(String, Value)>,
}

impl Table {
    /// From the batch sluice applies: the `add` commands for chains/rules.
    fn from_batch(batch: &Value) -> Result<Table, EnforceError> {
        let mut t = Table::default();
        for obj in objects(batch)? {
            if let Some(added) = obj.get("add") {
                t.push(added);
            }
        }
        Ok(t)
    }

    /// From `nft -j list table`: anything but metainfo, the table, chains
    /// and rules (a set, a counter object, ...) is a difference too.
    fn from_listing(listing: &Value) -> Result<Table, EnforceError> {
        let mut t = Table::default();
        for obj in objects(listing)? {
            let kind = obj
                .as_object()
                .and_then(|o| o.keys().next())
                .map(String::as_str)
                .unwrap_or("");
            match kind {
                "metainfo" | "table" => {}
                "chain" | "rule" => t.push(obj),
                other => {
                    return Err(EnforceError::Mismatch(format!(
                        "unexpected {other} object in the table: {obj}"
                    )))
                }
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
    fn compare(&self, got: &Table) -> Result<(), String> {
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
        Ok(())
    }
}

/// Counter values change as packets flow: compare only that a counter is
/// there (`{"counter": null}` as sluice submits it).
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
    use super::*;
    use serde_json::json;

    fn listing_for(spec: &SandboxSpec) -> Value {
        // Simulates nft's read-back: handles added, counters filled in.
        let batch = serde_json::to_value(ruleset(spec)).unwrap();
        let mut objs = vec![json!({"metainfo": {"version": "1.0.6"}})];
        for (handle, obj) in (1..).zip(batch["nftables"].as_array().unwrap().iter().skip(2)) {
            let mut o = obj["add"].clone();
            let inner = o.as_object_mut().unwrap().values_mut().next().unwrap();
            inner["handle"] = json!(handle);
            if let Some(expr) = inner.get_mut("expr").and_then(Value::as_array_mut) {
                for s in expr {
                    if s.get("counter").is_some() {
                        s["counter"] = json!({"packets": 7, "bytes": 420});
                    }
                }
            }
            objs.push(o);
        }
        json!({ "nftables": objs })
    }

    fn compare(spec: &SandboxSpec, listing: &Value) -> Result<(), String> {
        let want = Table::from_batch(&serde_json::to_value(ruleset(spec)).unwrap()).unwrap();
        let got = Table::from_listing(listing).map_err(|e| e.to_string())?;
        want.compare(&got)
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
        l["nftables"].as_array_mut().unwrap().push(json!({"chain": {
            "family": "inet", "table": "sluice", "name": "sneaky", "handle": 99}}));
        assert!(compare(&spec, &l)
            .unwrap_err()
            .contains("unexpected chain sneaky"));
    }

    #[test]
    fn invalid_tap_name_is_refused() {
        assert!(validate(&SandboxSpec::tap(1, 2, "tap\"0")).is_err());
        assert!(validate(&SandboxSpec::tap(1, 2, "a-very-long-tap-name")).is_err());
        assert!(validate(&SandboxSpec::tap(1, 2, "tap0")).is_ok());
        assert!(validate(&SandboxSpec::host(0, 2)).is_err());
    }
}
