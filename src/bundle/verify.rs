//! Signing a policy into a bundle, and verifying a bundle into a policy.
//!
//! Verification order: files read under caps; manifest.sig present;
//! manifest parsed (bounded, located errors); key known; signature over the
//! exact manifest bytes; every listed file present with its digest and no
//! unlisted file; not expired; the policy valid. Rollback is the caller's
//! check against [`super::RevisionState`], which holds the state.

use std::path::Path;

use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::archive::{write_atomic, BundleFiles};
use super::error::BundleError;
use super::keys::{SigningKey, TrustStore};
use super::manifest::{BundleName, Files, Manifest, Timestamp};
use crate::policy::Policy;

pub const MANIFEST: &str = "manifest.yaml";
pub const SIGNATURE: &str = "manifest.sig";
pub(crate) const POLICY: &str = "policy.yaml";

/// Entry point for loading bundles.
pub struct Bundle;

/// A bundle whose signature, digests and expiry checked out, with its
/// compiled policy.
#[derive(Debug)]
pub struct VerifiedBundle {
    pub manifest: Manifest,
    pub policy: Policy,
    /// SHA-256 of the exact manifest bytes: equal digests, same bundle.
    pub digest: [u8; 32],
}

impl VerifiedBundle {
    /// `name@revision`.
    pub fn label(&self) -> String {
        self.manifest.label()
    }
}

impl Bundle {
    /// Reads and verifies the bundle at `path` (directory or .tar.gz).
    pub fn load(
        path: &Path,
        trust: &TrustStore,
        now: OffsetDateTime,
    ) -> Result<VerifiedBundle, BundleError> {
        verify(BundleFiles::read(path)?, path, trust, now)
    }

    /// Verifies a .tar.gz held in memory (a fetched bundle); `shown` names it.
    pub fn from_tar_gz(
        bytes: &[u8],
        shown: &Path,
        trust: &TrustStore,
        now: OffsetDateTime,
    ) -> Result<VerifiedBundle, BundleError> {
        verify(BundleFiles::from_tar_gz(bytes, shown)?, shown, trust, now)
    }
}

fn verify(
    files: BundleFiles,
    path: &Path,
    trust: &TrustStore,
    now: OffsetDateTime,
) -> Result<VerifiedBundle, BundleError> {
    let (manifest, manifest_bytes, signature) = parse_manifest(&files, path)?;
    let key = trust
        .key(&manifest.key_id)
        .ok_or_else(|| BundleError::UnknownKey {
            path: path.to_path_buf(),
            id: manifest.key_id.clone(),
        })?;
    let bad_signature = || BundleError::BadSignature {
        path: path.to_path_buf(),
        id: manifest.key_id.clone(),
    };
    let sig = std::str::from_utf8(signature)
        .ok()
        .and_then(|t| hex::decode(t.trim()).ok())
        .filter(|s| s.len() == 64)
        .ok_or_else(bad_signature)?;
    if !super::keys::verify_signature(key, manifest_bytes, &sig) {
        return Err(bad_signature());
    }

    for name in files.files.keys() {
        if name != MANIFEST && name != SIGNATURE && !manifest.files.0.contains_key(name) {
            return Err(BundleError::UnexpectedEntry {
                path: path.to_path_buf(),
                entry: name.clone(),
                why: "not listed in the manifest",
            });
        }
    }
    for (name, want) in &manifest.files.0 {
        let data = files
            .files
            .get(name)
            .ok_or_else(|| BundleError::MissingFile {
                path: path.to_path_buf(),
                file: name.clone(),
            })?;
        if !hex::encode(Sha256::digest(data)).eq_ignore_ascii_case(want) {
            return Err(BundleError::DigestMismatch {
                path: path.to_path_buf(),
                file: name.clone(),
            });
        }
    }
    if now >= manifest.expires.0 {
        return Err(BundleError::Expired {
            path: path.to_path_buf(),
            at: manifest.expires.to_string(),
        });
    }
    let policy_bytes = files
        .files
        .get(POLICY)
        .ok_or_else(|| BundleError::MissingFile {
            path: path.to_path_buf(),
            file: POLICY.into(),
        })?;
    let origin = path.join(POLICY).display().to_string();
    let text = String::from_utf8_lossy(policy_bytes);
    let policy = Policy::from_yaml(&text, &origin)?;
    Ok(VerifiedBundle {
        digest: Sha256::digest(manifest_bytes).into(),
        manifest,
        policy,
    })
}

/// The manifest (parsed), its exact bytes, and the signature file's bytes.
fn parse_manifest<'f>(
    files: &'f BundleFiles,
    path: &Path,
) -> Result<(Manifest, &'f [u8], &'f [u8]), BundleError> {
    let (manifest, manifest_bytes) = read_manifest(files, path)?;
    let signature = files
        .files
        .get(SIGNATURE)
        .ok_or_else(|| BundleError::MissingSignature {
            path: path.to_path_buf(),
        })?;
    Ok((manifest, manifest_bytes, signature))
}

/// The manifest (parsed) and its exact bytes; `inspect` uses this too.
pub(super) fn read_manifest<'f>(
    files: &'f BundleFiles,
    path: &Path,
) -> Result<(Manifest, &'f [u8]), BundleError> {
    let manifest_bytes = files
        .files
        .get(MANIFEST)
        .ok_or_else(|| BundleError::MissingFile {
            path: path.to_path_buf(),
            file: MANIFEST.into(),
        })?;
    let malformed = |line, col, msg| BundleError::MalformedManifest {
        path: path.to_path_buf(),
        line,
        col,
        msg,
    };
    let text = std::str::from_utf8(manifest_bytes)
        .map_err(|_| malformed(1, 1, "not UTF-8 text".to_string()))?;
    let manifest = Manifest::parse(text).map_err(|(l, c, m)| malformed(l, c, m))?;
    Ok((manifest, manifest_bytes))
}

/// Validates the policy at `policy_path` (its errors come back unchanged),
/// then writes a bundle signed with the key at `key_path` to `out`: a
/// `.tar.gz` archive if `out` ends so, else a directory.
pub fn sign(
    key_path: &Path,
    policy_path: &Path,
    revision: u64,
    expires: OffsetDateTime,
    out: &Path,
) -> Result<(), BundleError> {
    let policy = Policy::load(policy_path)?;
    let key = SigningKey::load(key_path)?;
    let policy_bytes = std::fs::read(policy_path).map_err(|e| BundleError::io(policy_path, e))?;
    let name = BundleName::new(policy.name()).ok_or_else(|| BundleError::MalformedManifest {
        path: policy_path.to_path_buf(),
        line: 1,
        col: 1,
        msg: format!(
            "the policy name {:?} cannot name a bundle: use letters, digits, '-', '_', '.'",
            policy.name()
        ),
    })?;
    let now = OffsetDateTime::now_utc();
    let files = sign_files(&key, name, revision, now, expires, policy_bytes);
    write_bundle(&files, out, now.unix_timestamp().max(0) as u64)
}

/// The three files of a bundle signed by `key` (no I/O).
pub(crate) fn sign_files(
    key: &SigningKey,
    name: BundleName,
    revision: u64,
    created: OffsetDateTime,
    expires: OffsetDateTime,
    policy: Vec<u8>,
) -> BundleFiles {
    let mut listed = Files::default();
    listed
        .0
        .insert(POLICY.to_string(), hex::encode(Sha256::digest(&policy)));
    let manifest = Manifest {
        name,
        revision,
        created: Timestamp::new(created),
        expires: Timestamp::new(expires),
        key_id: key.id.clone(),
        files: listed,
    };
    let text = manifest.to_yaml();
    let sig = key.pair.sign(text.as_bytes());
    let mut files = BundleFiles::default();
    files.files.insert(POLICY.into(), policy);
    files.files.insert(MANIFEST.into(), text.into_bytes());
    files.files.insert(
        SIGNATURE.into(),
        format!("{}\n", hex::encode(sig.as_ref())).into_bytes(),
    );
    files
}

/// Writes `files` to `out` (archive or directory), each file atomically; in
/// a directory the signature goes last.
pub(crate) fn write_bundle(files: &BundleFiles, out: &Path, mtime: u64) -> Result<(), BundleError> {
    if out.to_string_lossy().ends_with(".tar.gz") {
        return write_atomic(out, &files.to_tar_gz(mtime));
    }
    std::fs::create_dir_all(out).map_err(|e| BundleError::io(out, e))?;
    for entry in std::fs::read_dir(out).map_err(|e| BundleError::io(out, e))? {
        let entry = entry.map_err(|e| BundleError::io(out, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && !files.files.contains_key(&name) {
            return Err(BundleError::UnexpectedEntry {
                path: out.to_path_buf(),
                entry: name,
                why: "the output directory holds other files; sign into an empty directory",
            });
        }
    }
    for (name, data) in &files.files {
        if name != SIGNATURE {
            write_atomic(&out.join(name), data)?;
        }
    }
    if let Some(sig) = files.files.get(SIGNATURE) {
        write_atomic(&out.join(SIGNATURE), sig)?;
    }
    Ok(())
}
