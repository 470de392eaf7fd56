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
