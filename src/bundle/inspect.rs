//! `sluice bundle inspect`: what a bundle says about itself, without trust.
//! Nothing here vouches for the bundle; `verify` does that.

use std::fmt::Write;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::archive::BundleFiles;
use super::error::BundleError;
use super::verify::{read_manifest, POLICY, SIGNATURE};
use crate::policy::Policy;

/// A human-readable summary: name, revision, key id, created, expires,
/// digests (checked against the files), and the rules in a short table.
pub fn inspect(path: &Path) -> Result<String, BundleError> {
    let files = BundleFiles::read(path)?;
    let (m, _) = read_manifest(&files, path)?;
    let mut out = String::new();
    let _ = writeln!(out, "bundle:    {}", path.display());
    let _ = writeln!(out, "name:      {}", m.name);
    let _ = writeln!(out, "revision:  {}", m.revision);
    let _ = writeln!(out, "key id:    {}", m.key_id);
    let _ = writeln!(out, "created:   {}", m.created);
    let _ = writeln!(out, "expires:   {}", m.expires);
    let signed = if files.files.contains_key(SIGNATURE) {
        "present (not checked; use `sluice bundle verify --trust FILE`)"
    } else {
        "MISSING"
    };
    let _ = writeln!(out, "signature: {signed}");
    let _ = writeln!(out, "files:");
    for (name, want) in &m.files.0 {
        let state = match files.files.get(name) {
            None => "MISSING",
            Some(data) if hex::encode(Sha256::digest(data)).eq_ignore_ascii_case(want) => "ok",
            Some(_) => "MISMATCH",
        };
        let _ = writeln!(out, "  {name}  sha256:{want}  {state}");
    }
    let Some(policy) = files.files.get(POLICY) else {
        return Ok(out);
    };
    match Policy::from_yaml(&String::from_utf8_lossy(policy), POLICY) {
        Err(e) => {
            let _ = writeln!(out, "policy:    invalid\n{e}");
        }
        Ok(policy) => {
            let _ = writeln!(
                out,
                "policy:    {} (mode {}, {} rules)",
                policy.name(),
                policy.mode(),
                policy.rules().len()
            );
            out.push_str(&rules_table(&policy));
        }
    }
    Ok(out)
}

/// `NAME ACTION PORTS MATCHES` rows, columns padded to the widest cell.
fn rules_table(policy: &Policy) -> String {
    let mut rows = vec![[
        "RULE".to_string(),
        "ACTION".to_string(),
        "PORTS".to_string(),
        "MATCHES".to_string(),
    ]];
    for rule in policy.rules() {
        let ports = if rule.ports.is_empty() {
            "any".to_string()
        } else {
            join(rule.ports.iter())
        };
        let matches = join(
            rule.cidrs
                .iter()
                .map(ToString::to_string)
                .chain(rule.hosts.iter().cloned()),
        );
        rows.push([
            rule.name.to_string(),
            rule.action.to_string(),
            ports,
            matches,
        ]);
    }
    let mut width = [0usize; 3];
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let _ = writeln!(
            out,
            "  {:w0$}  {:w1$}  {:w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2]
        );
    }
    out
}

fn join<T: ToString>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}
