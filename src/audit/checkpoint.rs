//! Signed checkpoints: the audit log's signing key (`audit.key` in the
//! state directory, created on first use, never readable by a workload),
//! the exact bytes a checkpoint signs, and the public keys a verifier
//! checks checkpoints against.
//!
//! A checkpoint is a line of the chain like any other (it has `seq`, `prev`
//! and `hash`); its signature says that the line before it, seq `seq - 1`,
//! has hash `prev`, and so, through the chain, anchors every line before
//! it. Key handling (files, Ed25519) is the bundle module's; this module
//! only names the files and defines the message. It never writes a log.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::record::{CheckpointRecord, CHECKPOINT_KIND};
use crate::bundle::{SigningKey, TrustStore};

/// The private signing key's file name in the state directory.
pub(crate) const KEY_FILE: &str = "audit.key";
/// Its public half, as a trust file (what `sluice audit verify --key` reads).
pub(crate) const PUBLIC_FILE: &str = "audit.pub";

/// The first line of every signed message: a checkpoint's signature can
/// never be taken for a bundle manifest's, or the other way round.
const DOMAIN: &str = "sluice audit checkpoint v1";

/// Why the audit key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot use the state directory {}: {source}; give --state-dir (or the daemon's defaults.state_dir) a directory root can write", path.display())]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the audit signing key {}: {msg}", path.display())]
    Unusable { path: PathBuf, msg: String },
    #[error("{}: already exists; the audit log's signing key is never replaced by keygen (remove it first if you mean to, and keep the old audit.pub to verify older checkpoints)", path.display())]
    Exists { path: PathBuf },
}

/// `<state_dir>/audit.key`.
pub(crate) fn key_path(state_dir: &Path) -> PathBuf {
    state_dir.join(KEY_FILE)
}

/// The checkpoint keys no workload may read: `state_dir`'s and the
/// default state directory's (the daemon's, unless told otherwise).
pub(crate) fn key_paths(state_dir: &Path) -> Vec<PathBuf> {
    let mut keys = vec![
        key_path(state_dir),
        key_path(Path::new(crate::bundle::DEFAULT_STATE_DIR)),
    ];
    keys.dedup();
    keys
}

/// `<state_dir>/audit.pub`.
pub(crate) fn public_path(state_dir: &Path) -> PathBuf {
    state_dir.join(PUBLIC_FILE)
}

/// A checkpoint key's id: `audit-` and the first 16 hex digits of the
/// SHA-256 of its raw public key, so that a verifier given the wrong key
/// can say so rather than only "bad signature".
pub(crate) fn key_id(public: &[u8]) -> String {
    let digest = hex::encode(Sha256::digest(public));
    format!("audit-{}", &digest[..16])
}

/// The bytes a checkpoint's signature is over, each part ended by `\n`:
/// `sluice audit checkpoint v1`, the key id, the checkpoint's `ts`, its
/// `seq` (decimal) and its `prev` (the hash of line `seq - 1`).
pub(crate) fn message(key: &str, ts: &str, seq: u64, prev: &str) -> Vec<u8> {
    format!("{DOMAIN}\n{key}\n{ts}\n{seq}\n{prev}\n").into_bytes()
}

/// The key checkpoints are signed with.
pub struct AuditKey {
    key: SigningKey,
    path: PathBuf,
}

impl std::fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditKey")
            .field("id", &self.key.id())
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl AuditKey {
    /// The key of `state_dir`, created there (with the directory, mode
    /// 0700, and `audit.pub`) on first use.
    pub fn open_or_create(state_dir: &Path) -> Result<AuditKey, KeyError> {
        make_dir(state_dir)?;
        let path = key_path(state_dir);
        let key = match load(&path) {
            Err(KeyError::Dir { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                match create_new(&path) {
                    Err(KeyError::Exists { .. }) => load(&path)?,
                    created => {
                        let key = created?;
                        tracing::info!(
                            key = %path.display(),
                            id = key.key.id(),
                            public = %public_path(state_dir).display(),
                            "created the audit log's checkpoint signing key"
                        );
                        key
                    }
                }
            }
            loaded => loaded?,
        };
        key.write_public(state_dir)?;
        Ok(key)
    }

    /// `sluice audit keygen`: a new key in `state_dir`; refuses to replace
    /// one.
    pub fn create(state_dir: &Path) -> Result<AuditKey, KeyError> {
        make_dir(state_dir)?;
        let key = create_new(&key_path(state_dir))?;
        key.write_public(state_dir)?;
        Ok(key)
    }

    pub fn id(&self) -> &str {
        self.key.id()
    }

    pub fn public_hex(&self) -> String {
        self.key.public_hex()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The checkpoint line at `seq` whose `prev` is `prev` (no hash yet).
    pub fn checkpoint(&self, ts: String, seq: u64, prev: String) -> CheckpointRecord {
        let sig = self.key.sign(&message(self.id(), &ts, seq, &prev));
        CheckpointRecord {
            ts,
            seq,
            kind: CHECKPOINT_KIND.to_string(),
            key: self.id().to_string(),
            sig: hex::encode(sig),
            prev,
            hash: None,
        }
    }

    /// Write `audit.pub` unless it already says what it should.
    fn write_public(&self, state_dir: &Path) -> Result<(), KeyError> {
        let path = public_path(state_dir);
        let text = crate::bundle::trust_file_text(
            "Public key of this host's audit checkpoints: sluice audit verify --key this-file FILE",
            &[(self.id(), self.key.public_key())],
        );
        if std::fs::read_to_string(&path).is_ok_and(|t| t == text) {
            return Ok(());
        }
        crate::bundle::write_atomic(&path, text.as_bytes()).map_err(|e| KeyError::Unusable {
            path: path.clone(),
            msg: format!("cannot write its public key: {e}"),
        })
    }
}

fn make_dir(dir: &Path) -> Result<(), KeyError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| KeyError::Dir {
            path: dir.to_path_buf(),
            source,
        })
}

/// Load an existing key; a missing file is `KeyError::Dir` with NotFound.
fn load(path: &Path) -> Result<AuditKey, KeyError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|source| KeyError::Dir {
        path: path.to_path_buf(),
        source,
    })?;
    let unusable = |msg: String| KeyError::Unusable {
        path: path.to_path_buf(),
        msg,
    };
    // Whoever else can read it can forge checkpoints; whoever else owns it
    // could have swapped it.
    if meta.mode() & 0o077 != 0 {
        return Err(unusable(format!(
            "its mode is {:o}, readable by others than its owner: chmod 600 it, and replace it (sluice audit keygen) if anyone may have copied it",
            meta.mode() & 0o777
        )));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(unusable(format!(
            "it is owned by uid {}, not by uid {euid} that runs sluice: chown it, or replace it",
            meta.uid()
        )));
    }
    let key = SigningKey::load(path).map_err(|e| {
        unusable(format!(
            "unreadable ({e}); remove it to have a new one created, or run `sluice audit keygen`"
        ))
    })?;
    Ok(AuditKey {
        key,
        path: path.to_path_buf(),
    })
}

/// Create `path` without ever replacing it, and so that nobody reads a half
/// written key: written to a temporary name, then hard-linked into place
/// (link(2) fails if the name exists), whoever links first wins.
fn create_new(path: &Path) -> Result<AuditKey, KeyError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let key = SigningKey::create(
        &tmp,
        "sluice audit checkpoint signing key (Ed25519, PKCS#8 v2, hex). Keep it secret: whoever reads it can forge checkpoints.",
        key_id,
    )
    .map_err(|e| KeyError::Unusable {
        path: path.to_path_buf(),
        msg: format!("cannot create it: {e}"),
    });
    let linked = key.and_then(|key| match std::fs::hard_link(&tmp, path) {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(KeyError::Exists {
            path: path.to_path_buf(),
        }),
        Err(source) => Err(KeyError::Dir {
            path: path.to_path_buf(),
            source,
        }),
    });
    let _ = std::fs::remove_file(&tmp);
    Ok(AuditKey {
        key: linked?,
        path: path.to_path_buf(),
    })
}

/// Largest public key file read: a trust file lists a few keys.
const MAX_PUBLIC_FILE: u64 = 256 * 1024;

/// Read a public key file, refusing one that is not small (a device, a log
/// given by mistake) rather than reading it all.
fn read_small(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_PUBLIC_FILE + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_PUBLIC_FILE {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_PUBLIC_FILE} bytes, so not a public key file"
        )));
    }
    Ok(text)
}

/// The public keys `sluice audit verify --key` checks checkpoints against.
#[derive(Debug, Clone)]
pub struct CheckpointKeys {
    keys: TrustStore,
    /// Where they came from, for messages.
    pub source: String,
}

impl CheckpointKeys {
    /// `--key`: 64 hex digits, or a file holding them, or a trust file
    /// (`audit.pub`, or any `keys: [{id, ed25519}]` list).
    pub fn parse(arg: &str) -> Result<CheckpointKeys, String> {
        if let Some(key) = TrustStore::decode_public(arg) {
            return Ok(CheckpointKeys {
                keys: TrustStore::single(&key_id(&key), &key),
                source: format!("the key {}", &arg.trim()[..16]),
            });
        }
        let path = Path::new(arg);
        let text = read_small(path).map_err(|e| {
            format!(
                "--key {arg}: {e}; give the state directory's audit.pub (or its public key, 64 hex digits)"
            )
        })?;
        let keys = match TrustStore::decode_public(&text) {
            Some(key) => TrustStore::single(&key_id(&key), &key),
            None => TrustStore::from_yaml(&text, path).map_err(|e| e.to_string())?,
        };
        if keys.is_empty() {
            return Err(format!("--key {arg}: the file lists no public key"));
        }
        Ok(CheckpointKeys {
            keys,
            source: path.display().to_string(),
        })
    }

    /// The ids of the keys given.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.ids().collect()
    }

    /// Whether `checkpoint` is signed by one of these keys; why not if not.
    pub fn check(&self, checkpoint: &CheckpointRecord) -> Result<(), String> {
        let Some(public) = self.keys.key(&checkpoint.key) else {
            return Err(format!(
                "the checkpoint names key {:?}, not the key given ({}): it was signed with another key (another host's, or an older one), or forged",
                checkpoint.key,
                self.ids().join(", ")
            ));
        };
        let sig = hex::decode(&checkpoint.sig)
            .ok()
            .filter(|s| s.len() == 64)
            .ok_or_else(|| {
                "the checkpoint's sig is not an Ed25519 signature (128 hex digits): it was edited or forged".to_string()
            })?;
        let message = message(
            &checkpoint.key,
            &checkpoint.ts,
            checkpoint.seq,
            &checkpoint.prev,
        );
        if crate::bundle::verify_signature(public, &message, &sig) {
            Ok(())
        } else {
            Err(format!(
                "bad signature: the checkpoint does not verify with key {:?}; it was forged, or its ts, seq or prev were edited",
                checkpoint.key
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_created_on_first_use_with_mode_0600_and_reused_after() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let first = AuditKey::open_or_create(&state).unwrap();
        let mode = std::fs::metadata(key_path(&state))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = AuditKey::open_or_create(&state).unwrap();
        assert_eq!(first.public_hex(), again.public_hex());
        assert_eq!(
            first.id(),
            key_id(&hex::decode(first.public_hex()).unwrap())
        );
        let keys = CheckpointKeys::parse(public_path(&state).to_str().unwrap()).unwrap();
        assert_eq!(keys.ids(), [first.id()]);
    }

    #[test]
    fn keygen_never_replaces_a_key() {
        let dir = tempfile::tempdir().unwrap();
        AuditKey::create(dir.path()).unwrap();
        let err = AuditKey::create(dir.path()).unwrap_err();
        assert!(matches!(err, KeyError::Exists { .. }), "{err}");
    }

    #[test]
    fn a_key_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        AuditKey::create(dir.path()).unwrap();
        let path = key_path(dir.path());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = AuditKey::open_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn a_checkpoint_verifies_with_its_key_and_not_with_another_or_edited() {
        let dir = tempfile::tempdir().unwrap();
        let key = AuditKey::create(&dir.path().join("a")).unwrap();
        let other = AuditKey::create(&dir.path().join("b")).unwrap();
        let c = key.checkpoint("2025-01-01T00:00:00Z".into(), 5, "ab".repeat(32));
        let mine = CheckpointKeys::parse(&key.public_hex()).unwrap();
        let theirs = CheckpointKeys::parse(&other.public_hex()).unwrap();
        mine.check(&c).unwrap();
        assert!(theirs.check(&c).unwrap_err().contains("not the key given"));
        let mut edited = c.clone();
        edited.seq = 6;
        assert!(mine
            .check(&edited)
            .unwrap_err()
            .starts_with("bad signature"));
        // Another key claiming this key's id does not verify either.
        let mut forged = other.checkpoint(c.ts.clone(), 5, c.prev.clone());
        forged.key = key.id().to_string();
        assert!(mine
            .check(&forged)
            .unwrap_err()
            .starts_with("bad signature"));
    }

    #[test]
    fn the_message_is_the_documented_bytes() {
        assert_eq!(
            message("audit-0123456789abcdef", "2025-01-01T00:00:00Z", 7, "ff"),
            b"sluice audit checkpoint v1\naudit-0123456789abcdef\n2025-01-01T00:00:00Z\n7\nff\n"
        );
    }
}
