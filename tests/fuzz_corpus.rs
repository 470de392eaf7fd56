//! Every committed fuzz corpus file, replayed through the very harness the
//! AFL++ targets run (fuzz/src/lib.rs, compiled in here), so that a
//! regression input added to fuzz/corpus/TARGET/ is checked by `cargo test`
//! on every machine, without AFL.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

#[path = "common/fuzz.rs"]
mod fuzz_common;

use fuzz_common::corpus;

/// Runs `target`'s harness on each of its corpus files; the names of those
/// that broke an invariant, with the panic message.
fn replay(target: &str) {
    let run = harness::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, run)| *run)
        .expect("a harness for the target");
    let files = corpus(target);
    assert!(!files.is_empty(), "fuzz/corpus/{target}/ holds no seed");
    let mut failures = Vec::new();
    for (path, bytes) in &files {
        if let Err(panic) = std::panic::catch_unwind(|| run(bytes)) {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {why}", path.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn peek_corpus_passes_its_harness() {
    replay("peek");
}

#[test]
fn dns_corpus_passes_its_harness() {
    replay("dns");
}

#[test]
fn dns_upstream_corpus_passes_its_harness() {
    replay("dns_upstream");
}

#[test]
fn policy_corpus_passes_its_harness() {
    replay("policy");
}

#[test]
fn manifest_corpus_passes_its_harness() {
    replay("manifest");
}

#[test]
fn bundle_corpus_passes_its_harness() {
    replay("bundle");
}

#[test]
fn every_target_has_a_corpus_a_binary_and_a_replay() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let this = std::fs::read_to_string(root.join("tests/fuzz_corpus.rs")).unwrap();
    let script = std::fs::read_to_string(root.join("scripts/fuzz")).unwrap();
    for (target, _) in harness::TARGETS {
        assert!(
            root.join("fuzz/corpus").join(target).is_dir(),
            "{target}: no corpus"
        );
        let bin = root.join("fuzz/src/bin").join(format!("{target}.rs"));
        assert!(bin.is_file(), "{target}: no AFL++ target {}", bin.display());
        assert!(
            this.contains(&format!("replay(\"{target}\")")),
            "{target}: not replayed"
        );
        assert!(
            script.contains(target),
            "{target}: scripts/fuzz does not know it"
        );
    }
    let dirs = std::fs::read_dir(root.join("fuzz/corpus")).unwrap().count();
    assert_eq!(
        dirs,
        harness::TARGETS.len(),
        "a corpus directory without a target"
    );
}
