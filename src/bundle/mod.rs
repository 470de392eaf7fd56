//! Signed policy bundles (DESIGN.md, "Signed bundles"): the format, Ed25519
//! keys and trust files, signing, verification (signature, digests, expiry,
//! hard size caps), rollback memory, and the swappable [`PolicyHandle`]
//! that connections read the policy in force from.
//!
//! This module is pure: files in, typed results out. It imports no tokio,
//! hyper, notify or nftables, and it never swaps a policy itself; the
//! `reload` module decides when to load and swap. Every refusal is a
//! [`BundleError`] whose Display is the one line the command line prints and
//! whose [`BundleError::code`] is the reason audit records carry.
//!
//! Format (see docs/bundles.md): a directory or `.tar.gz` holding
//! `manifest.yaml`, `policy.yaml` and `manifest.sig` (hex of the Ed25519
//! signature over the exact manifest bytes).

mod archive;
mod error;
mod handle;
mod inspect;
mod keys;
mod manifest;
mod state;
mod verify;

#[cfg(test)]
mod tests;

pub(crate) use archive::write_atomic;
pub use archive::{BundleFiles, MAX_ARCHIVE_BYTES, MAX_ENTRIES, MAX_FILE_BYTES};
pub use error::BundleError;
pub(crate) use handle::ActivePolicy;
pub use handle::PolicyHandle;
pub use inspect::inspect;
pub use keys::{keygen, TrustStore};
pub(crate) use keys::{trust_file_text, verify_signature, SigningKey};
pub use manifest::Manifest;
#[cfg(test)]
pub(crate) use manifest::MAX_MANIFEST_BYTES;
pub(crate) use manifest::{parse_time, BundleName};
pub use state::RevisionState;
pub(crate) use state::DEFAULT_STATE_DIR;
pub use verify::{sign, Bundle, VerifiedBundle, MANIFEST, SIGNATURE};

/// Writes a bundle signed with the key at `key_path` from policy text held in
/// memory (tests, benches and example generation); `sign` is the file form.
pub fn sign_bytes(
    key_path: &std::path::Path,
    policy_yaml: &str,
    revision: u64,
    created: time::OffsetDateTime,
    expires: time::OffsetDateTime,
    out: &std::path::Path,
) -> Result<(), BundleError> {
    let policy = crate::policy::Policy::from_yaml(policy_yaml, "policy.yaml")?;
    let key = SigningKey::load(key_path)?;
    let name = BundleName::new(policy.name()).ok_or_else(|| BundleError::MalformedManifest {
        path: out.to_path_buf(),
        line: 1,
        col: 1,
        msg: format!("the policy name {:?} cannot name a bundle", policy.name()),
    })?;
    let files = verify::sign_files(
        &key,
        name,
        revision,
        created,
        expires,
        policy_yaml.as_bytes().to_vec(),
    );
    verify::write_bundle(&files, out, created.unix_timestamp().max(0) as u64)
}
