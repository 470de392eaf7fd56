//! Unit tests for the pieces tests/bundle.rs does not reach directly:
//! manifest field checks and their positions, and the archive reader's caps.

use std::path::Path;

use super::archive::BundleFiles;
use super::manifest::{parse_time, Manifest};

const MANIFEST: &str = "name: dev
revision: 1
created: 2030-01-01T00:00:00Z
expires: 2031-01-01T00:00:00Z
key_id: dev
files:
  policy.yaml: 4effd99c98585e7bd53e2aad488b75a19cc07336634cd9ebf93041023d3e6ee2
";

#[test]
fn manifest_round_trips_byte_for_byte() {
    let m = Manifest::parse(MANIFEST).unwrap();
    assert_eq!(m.label(), "dev@1");
    assert_eq!(m.to_yaml(), MANIFEST);
}

#[test]
fn manifest_field_errors_point_at_the_field() {
    let bad_digest = MANIFEST.replace("4effd99c", "zzzz");
    let (line, _, msg) = Manifest::parse(&bad_digest).unwrap_err();
    assert_eq!(line, 7, "{msg}");
    assert!(msg.contains("64 hex"), "{msg}");

    let traversal = MANIFEST.replace("policy.yaml:", "../policy.yaml:");
    let (_, _, msg) = Manifest::parse(&traversal).unwrap_err();
    assert!(msg.contains("plain name"), "{msg}");

    let bad_time = MANIFEST.replace("2031-01-01T00:00:00Z", "next year");
    let (line, _, msg) = Manifest::parse(&bad_time).unwrap_err();
    assert_eq!(line, 4, "{msg}");
    assert!(msg.contains("RFC 3339"), "{msg}");

    let bad_name = MANIFEST.replace("name: dev", "name: ../dev");
    assert_eq!(Manifest::parse(&bad_name).unwrap_err().0, 1);

    let missing = MANIFEST.replace("key_id: dev\n", "");
    let (_, _, msg) = Manifest::parse(&missing).unwrap_err();
    assert!(msg.contains("key_id"), "{msg}");
}

#[test]
fn oversized_manifest_is_refused_before_parsing() {
    let big = format!("{MANIFEST}# {}\n", "x".repeat(super::MAX_MANIFEST_BYTES));
    assert!(Manifest::parse(&big).unwrap_err().2.contains("bytes"));
}

#[test]
fn times_are_utc_rfc3339() {
    assert!(parse_time("2030-01-01T00:00:00Z").is_ok());
    assert!(parse_time("30 days").is_err());
}

#[test]
fn archive_that_is_not_gzip_is_unreadable() {
    let err = BundleFiles::from_tar_gz(b"plain text", Path::new("x")).unwrap_err();
    assert_eq!(err.code(), "unreadable");
}

#[test]
fn archive_round_trips() {
    let mut files = BundleFiles::default();
    files.files.insert("policy.yaml".into(), b"a".to_vec());
    files.files.insert("manifest.yaml".into(), b"b".to_vec());
    let back = BundleFiles::from_tar_gz(&files.to_tar_gz(0), Path::new("x")).unwrap();
    assert_eq!(back.files, files.files);
}

/// Words of serde's own that must never reach a user.
fn no_serde_wording(msg: &str) {
    for word in [
        "expected struct",
        "unknown field",
        "missing field",
        "invalid type",
    ] {
        assert!(!msg.contains(word), "serde wording {word:?} in: {msg}");
    }
}

#[test]
fn an_unknown_manifest_key_is_named_with_the_keys_allowed() {
    let (line, col, msg) = Manifest::parse(&format!("{MANIFEST}version: 1\n")).unwrap_err();
    assert_eq!((line, col), (8, 1), "{msg}");
    assert_eq!(
        msg,
        "unknown key `version` in the manifest; remove it; the allowed keys are `name`, `revision`, `created`, `expires`, `key_id`, `files`"
    );
}

#[test]
fn a_manifest_that_is_not_a_mapping_says_what_it_must_be() {
    let (line, col, msg) = Manifest::parse("- a\n").unwrap_err();
    assert_eq!((line, col), (1, 1));
    assert!(
        msg.starts_with("the manifest must be a mapping with the keys `name`"),
        "{msg}"
    );
    assert!(msg.ends_with("but it is a list"), "{msg}");
    no_serde_wording(&msg);
}

#[test]
fn a_missing_or_mistyped_manifest_field_is_named_at_its_place() {
    let (line, _, msg) = Manifest::parse(&MANIFEST.replace("key_id: dev\n", "")).unwrap_err();
    assert_eq!(line, 1);
    assert_eq!(
        msg,
        "the manifest has no `key_id`; sign the bundle again with `sluice bundle sign`"
    );
    let (line, col, msg) =
        Manifest::parse(&MANIFEST.replace("revision: 1", "revision: one")).unwrap_err();
    assert_eq!((line, col), (2, 11));
    assert_eq!(
        msg,
        "the manifest's `revision` must be a whole number, but it is the string \"one\""
    );
}

#[test]
fn manifest_anchors_are_refused_at_the_anchor() {
    let (line, col, msg) =
        Manifest::parse(&MANIFEST.replace("key_id: dev", "key_id: &k dev")).unwrap_err();
    assert_eq!((line, col), (5, 9));
    assert!(msg.contains("anchors"), "{msg}");
}

#[test]
fn a_file_listed_twice_in_the_manifest_is_refused() {
    let twice = format!(
        "{MANIFEST}  policy.yaml: 4effd99c98585e7bd53e2aad488b75a19cc07336634cd9ebf93041023d3e6ee2\n"
    );
    let (line, _, msg) = Manifest::parse(&twice).unwrap_err();
    assert_eq!(line, 8);
    assert!(msg.contains("lists \"policy.yaml\" twice"), "{msg}");
}

#[test]
fn every_name_and_key_id_sluice_writes_reads_back() {
    // Names that look like numbers, booleans or null are quoted by the
    // writer and read back as the same text.
    let m = Manifest::parse(MANIFEST).unwrap();
    for text in [
        "0123", "1e3", "0x10", "0o17", "0b1", "123", "1.5", "1.", "-1", "true", "True", "null",
        "NULL", "yes", "no", "1_000", "nan", "inf", "a.b",
    ] {
        let mut m = m.clone();
        m.name = super::BundleName::new(text).unwrap_or_else(|| panic!("{text}"));
        m.key_id = text.to_string();
        let back = Manifest::parse(&m.to_yaml()).unwrap_or_else(|e| panic!("{text}: {e:?}"));
        assert_eq!(back, m, "{text}:\n{}", m.to_yaml());
    }
}

mod files {
    //! Key, trust and state files: errors name the file by its role.

    use super::no_serde_wording;
    use crate::bundle::{BundleError, RevisionState, SigningKey, TrustStore};
    use std::path::Path;

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_missing_signing_key_is_named_by_its_role_with_what_to_give() {
        let err = SigningKey::load(Path::new("/nonexistent/signing.key"))
            .err()
            .unwrap();
        let msg = err.to_string();
        assert!(
            msg.starts_with("cannot read the signing key /nonexistent/signing.key: "),
            "{msg}"
        );
        assert!(
            msg.ends_with("; give the file `sluice bundle keygen --key` wrote"),
            "{msg}"
        );
        assert_eq!(err.code(), "unreadable");
    }

    #[test]
    fn a_missing_trust_file_is_named_by_its_role_with_what_to_give() {
        let msg = TrustStore::load(Path::new("/nonexistent/trust.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("cannot read the trust file /nonexistent/trust.yaml: "),
            "{msg}"
        );
        assert!(msg.contains("`sluice bundle keygen --trust`"), "{msg}");
    }

    #[test]
    fn a_missing_bundle_is_named_by_its_role_with_what_to_give() {
        let msg = crate::bundle::Bundle::load(
            Path::new("/nonexistent/bundle.tar.gz"),
            &TrustStore::default(),
            time::OffsetDateTime::now_utc(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            msg.starts_with("cannot read the bundle /nonexistent/bundle.tar.gz: "),
            "{msg}"
        );
        assert!(msg.contains("`sluice bundle sign`"), "{msg}");
    }

    #[test]
    fn a_key_file_without_its_key_says_which_key_and_what_to_give() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "k", "id: ops\n");
        let msg = SigningKey::load(&path).err().unwrap().to_string();
        assert_eq!(
            msg,
            format!(
                "{}:1:1: the signing key file has no `ed25519_pkcs8`; give the file `sluice bundle keygen --key` wrote",
                path.display()
            )
        );
    }

    #[test]
    fn an_unknown_trust_file_key_is_named_with_the_keys_allowed() {
        let msg = TrustStore::from_yaml("keys: []\nversion: 1\n", Path::new("t.yaml"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "t.yaml:2:1: invalid trust file: unknown key `version` in the file; remove it; the allowed keys are `keys`"
        );
    }

    #[test]
    fn trust_file_entries_are_checked_at_their_place() {
        let bad_key = "keys:\n  - id: ops\n    ed25519: abcd\n";
        let msg = TrustStore::from_yaml(bad_key, Path::new("t.yaml"))
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("t.yaml:3:14: invalid trust file: key \"ops\": ed25519 must be a 32-byte public key"), "{msg}");
        let key = "ab".repeat(32);
        let twice =
            format!("keys:\n  - {{id: ops, ed25519: {key}}}\n  - {{id: ops, ed25519: {key}}}\n");
        let msg = TrustStore::from_yaml(&twice, Path::new("t.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with(
                "t.yaml:3:10: invalid trust file: key id \"ops\" is listed twice (first at line 2)"
            ),
            "{msg}"
        );
        let typo = format!("keys:\n  - {{id: ops, ed2551: {key}}}\n");
        let msg = TrustStore::from_yaml(&typo, Path::new("t.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("unknown key `ed2551` in key #1; did you mean `ed25519`?"),
            "{msg}"
        );
        no_serde_wording(&msg);
    }

    #[test]
    fn an_unreadable_revision_state_says_where_and_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "revisions.yaml", "dev: 3\nprod: [1]\n");
        let err = RevisionState::open(dir.path()).unwrap_err();
        assert!(matches!(err, BundleError::State { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("revisions.yaml:2:7: unreadable revision state (the revision of \"prod\" must be a whole number, but it is a list); remove the file to start over"), "{msg}");
    }
}
