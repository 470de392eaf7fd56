//! Why a bundle, key or trust file was refused. Each variant's Display is the
//! one line the command line prints; [`BundleError::code`] is the short
//! reason an audit record and the reload metric carry.

use std::path::PathBuf;

use crate::policy::PolicyError;

/// Every way loading, signing or checking a bundle can fail.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{path}: {source}; check the path and its permissions")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file given by its role (the signing key, the trust file, the
    /// bundle) could not be read; `hint` says which file to give.
    #[error("cannot read the {role} {path}: {source}; {hint}")]
    Read {
        role: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("{path}: the archive is truncated or unreadable: {reason}; fetch or copy it again")]
    Unreadable { path: PathBuf, reason: String },
    #[error("{path}: {what} is larger than the {limit}-byte limit; a bundle holds one policy and its manifest")]
    Oversized {
        path: PathBuf,
        what: String,
        limit: u64,
    },
    #[error("{path}: unexpected entry {entry:?} ({why}); a bundle holds only manifest.yaml, manifest.sig and the files the manifest lists")]
    UnexpectedEntry {
        path: PathBuf,
        entry: String,
        why: &'static str,
    },
    #[error(
        "{path}: missing signature (no manifest.sig); sign the bundle with `sluice bundle sign`"
    )]
    MissingSignature { path: PathBuf },
    #[error("{path}: missing {file}; a bundle needs manifest.yaml, manifest.sig and policy.yaml")]
    MissingFile { path: PathBuf, file: String },
    #[error("{path}: malformed manifest at manifest.yaml:{line}:{col}: {msg}")]
    MalformedManifest {
        path: PathBuf,
        line: usize,
        col: usize,
        msg: String,
    },
    #[error("{path}: unknown key id {id:?}; add its public key to the trust file or sign with a trusted key")]
    UnknownKey { path: PathBuf, id: String },
    #[error("{path}: bad signature: manifest.sig does not verify with key {id:?}; the manifest was changed or signed with another key")]
    BadSignature { path: PathBuf, id: String },
    #[error("{path}: digest mismatch for {file}: it is not the file that was signed; re-sign the bundle")]
    DigestMismatch { path: PathBuf, file: String },
    #[error("{path}: expired at {at}; sign a new revision with a later --expires")]
    Expired { path: PathBuf, at: String },
    /// The policy inside is invalid (or, when signing, the policy file
    /// is): the same `FILE:LINE:COL` lines `sluice check` prints.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("rollback: bundle {name:?} revision {revision} is older than revision {highest} already accepted; pass --allow-rollback to accept it on purpose")]
    Rollback {
        name: String,
        revision: u64,
        highest: u64,
    },
    /// The signing key file is unusable; `at` is the `(line, column)`
    /// the message is about, if it is about one place.
    #[error("{}: {msg}", place(path, *at))]
    Key {
        path: PathBuf,
        at: Option<(usize, usize)>,
        msg: String,
    },
    #[error("{}: invalid trust file: {msg}", place(path, *at))]
    Trust {
        path: PathBuf,
        at: Option<(usize, usize)>,
        msg: String,
    },
    #[error("{}: {msg}", place(path, *at))]
    State {
        path: PathBuf,
        at: Option<(usize, usize)>,
        msg: String,
    },
    #[error(
        "{path}: already exists; refusing to overwrite a key (remove it first if you mean to)"
    )]
    Exists { path: PathBuf },
    #[error("{url}: fetch failed: {msg}")]
    Fetch { url: String, msg: String },
}

impl BundleError {
    /// A short, stable reason code (audit `reason`, metric label values).
    pub fn code(&self) -> &'static str {
        match self {
            BundleError::Io { .. } => "unreadable",
            BundleError::Read { .. } => "unreadable",
            BundleError::Unreadable { .. } => "unreadable",
            BundleError::Oversized { .. } => "oversized",
            BundleError::UnexpectedEntry { .. } => "unexpected-entry",
            BundleError::MissingSignature { .. } => "missing-signature",
            BundleError::MissingFile { .. } => "missing-file",
            BundleError::MalformedManifest { .. } => "malformed-manifest",
            BundleError::UnknownKey { .. } => "unknown-key",
            BundleError::BadSignature { .. } => "bad-signature",
            BundleError::DigestMismatch { .. } => "digest-mismatch",
            BundleError::Expired { .. } => "expired",
            BundleError::Policy { .. } => "invalid-policy",
            BundleError::Rollback { .. } => "rollback",
            BundleError::Key { .. } => "bad-key",
            BundleError::Trust { .. } => "bad-trust",
            BundleError::State { .. } => "bad-state",
            BundleError::Exists { .. } => "exists",
            BundleError::Fetch { .. } => "fetch-failed",
        }
    }

    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> BundleError {
        BundleError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl BundleError {
    /// The bundle at `path` could not be read.
    pub(crate) fn bundle_unreadable(path: &std::path::Path, source: std::io::Error) -> BundleError {
        BundleError::Read {
            role: "bundle",
            path: path.to_path_buf(),
            source,
            hint: BUNDLE_HINT,
        }
    }
}

/// `PATH` or `PATH:LINE:COL`.
fn place(path: &std::path::Path, at: Option<(usize, usize)>) -> String {
    match at {
        Some((line, col)) => format!("{}:{line}:{col}", path.display()),
        None => path.display().to_string(),
    }
}

/// What to give instead of a signing key that cannot be read.
pub(crate) const KEY_HINT: &str = "give the file `sluice bundle keygen --key` wrote";
/// What to give instead of a trust file that cannot be read.
pub(crate) const TRUST_HINT: &str =
    "give the file `sluice bundle keygen --trust` wrote (it lists the public keys you trust)";
/// What to give instead of a bundle that cannot be read.
pub(crate) const BUNDLE_HINT: &str =
    "give a bundle directory or .tar.gz that `sluice bundle sign` wrote";

impl crate::exit_class::Classified for BundleError {
    /// A bundle or trust file that does not verify or load.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::BadInput
    }
}
