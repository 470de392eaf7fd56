//! Ed25519 keys: the private signing key file, and the trust file of public
//! keys by id that verification checks against.
//!
//! Key file (YAML, mode 0600): `id: NAME` and `ed25519_pkcs8: HEX` (the
//! PKCS#8 v2 document ring generates). Trust file (YAML):
//! `keys: [{id: NAME, ed25519: HEX}]`, the 32-byte public key in hex.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ring::signature::{Ed25519KeyPair, KeyPair};
use serde::{Deserialize, Serialize};

use super::error::BundleError;

/// Largest key or trust file read.
const MAX_KEY_FILE: u64 = 256 * 1024;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    id: String,
    ed25519_pkcs8: String,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TrustFile {
    keys: Vec<TrustEntry>,
}

#[derive(Serialize, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct TrustEntry {
    id: String,
    ed25519: String,
}

/// A private signing key and the id the manifest names it by.
pub struct SigningKey {
    pub(crate) id: String,
    pub(crate) pair: Ed25519KeyPair,
}

impl SigningKey {
    pub fn load(path: &Path) -> Result<SigningKey, BundleError> {
        let text = read_small(path)?;
        let bad = |msg: String| BundleError::Key {
            path: path.to_path_buf(),
            msg,
        };
        let file: KeyFile =
            serde_yaml::from_str(&text).map_err(|e| bad(format!("not a sluice key file: {e}")))?;
        let der = hex::decode(file.ed25519_pkcs8.trim())
            .map_err(|_| bad("ed25519_pkcs8 is not hex".into()))?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
            .map_err(|e| bad(format!("not an Ed25519 PKCS#8 key: {e}")))?;
        check_id(&file.id).map_err(bad)?;
        Ok(SigningKey { id: file.id, pair })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The public key, hex, as the trust file holds it.
    pub fn public_hex(&self) -> String {
        hex::encode(self.pair.public_key().as_ref())
    }
}

/// The public keys a host trusts, by id. Several keys may be trusted at once
/// (rotation: add the new key, sign with it, then drop the old one).
#[derive(Debug, Clone, Default)]
pub struct TrustStore {
    keys: BTreeMap<String, Vec<u8>>,
}

impl TrustStore {
    pub fn load(path: &Path) -> Result<TrustStore, BundleError> {
        let text = read_small(path)?;
        TrustStore::from_yaml(&text, path)
    }

    pub fn from_yaml(text: &str, path: &Path) -> Result<TrustStore, BundleError> {
        let bad = |msg: String| BundleError::Trust {
            path: path.to_path_buf(),
            msg,
        };
        let file: TrustFile = serde_yaml::from_str(text).map_err(|e| bad(e.to_string()))?;
        let mut keys = BTreeMap::new();
        for entry in file.keys {
            check_id(&entry.id).map_err(bad)?;
            let key = decode_public(&entry.ed25519).ok_or_else(|| {
                bad(format!(
                    "key {:?}: ed25519 must be a 32-byte public key in hex (64 characters)",
                    entry.id
                ))
            })?;
            if keys.insert(entry.id.clone(), key).is_some() {
                return Err(bad(format!("key id {:?} is listed twice", entry.id)));
            }
        }
        Ok(TrustStore { keys })
    }

    /// The raw 32-byte public key for `id`.
    pub fn key(&self, id: &str) -> Option<&[u8]> {
        self.keys.get(id).map(Vec::as_slice)
    }

    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

fn decode_public(text: &str) -> Option<Vec<u8>> {
    let bytes = hex::decode(text.trim()).ok()?;
    (bytes.len() == 32).then_some(bytes)
}

/// Key ids are short names: they appear in manifests, messages and files.
fn check_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "key id {id:?} must be 1-64 characters of letters, digits, '-', '_', '.', '@'"
        ))
    }
}

/// Writes a new Ed25519 key to `key_path` (mode 0600, never overwriting) and
/// adds its public half as `id` to `trust_path` (created if missing).
pub fn keygen(key_path: &Path, trust_path: &Path, id: &str) -> Result<(), BundleError> {
    check_id(id).map_err(|msg| BundleError::Key {
        path: key_path.to_path_buf(),
        msg,
    })?;
    let mut trust = match std::fs::metadata(trust_path) {
        Ok(_) => {
            let text = read_small(trust_path)?;
            TrustStore::from_yaml(&text, trust_path)?;
            serde_yaml::from_str::<TrustFile>(&text).map_err(|e| BundleError::Trust {
                path: trust_path.to_path_buf(),
                msg: e.to_string(),
            })?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => TrustFile::default(),
        Err(e) => return Err(BundleError::io(trust_path, e)),
    };
    if trust.keys.iter().any(|k| k.id == id) {
        return Err(BundleError::Trust {
            path: trust_path.to_path_buf(),
            msg: format!("key id {id:?} is already trusted; choose another --id"),
        });
    }
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| BundleError::Key {
        path: key_path.to_path_buf(),
        msg: "the system random source failed".into(),
    })?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("ring reads back its own key");
    let body = format!(
        "# sluice bundle signing key (Ed25519, PKCS#8 v2, hex). Keep it secret.\n{}",
        serde_yaml::to_string(&KeyFile {
            id: id.to_string(),
            ed25519_pkcs8: hex::encode(pkcs8.as_ref()),
        })
        .expect("key file serializes")
    );
    write_new_private(key_path, body.as_bytes())?;
    trust.keys.push(TrustEntry {
        id: id.to_string(),
        ed25519: hex::encode(pair.public_key().as_ref()),
    });
    let text = format!(
        "# Public keys trusted to sign sluice policy bundles (id -> Ed25519, hex).\n{}",
        serde_yaml::to_string(&trust).expect("trust file serializes")
    );
    super::archive::write_atomic(trust_path, text.as_bytes())
}

fn write_new_private(path: &Path, bytes: &[u8]) -> Result<(), BundleError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => BundleError::Exists {
                path: path.to_path_buf(),
            },
            _ => BundleError::io(path, e),
        })?;
    file.write_all(bytes)
        .and_then(|_| file.sync_all())
        .map_err(|e| BundleError::io(path, e))
}

fn read_small(path: &Path) -> Result<String, BundleError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| BundleError::io(path, e))?;
    let mut text = String::new();
    file.take(MAX_KEY_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| BundleError::io(path, e))?;
    if text.len() as u64 > MAX_KEY_FILE {
        return Err(BundleError::Oversized {
            path: PathBuf::from(path),
            what: "the file".into(),
            limit: MAX_KEY_FILE,
        });
    }
    Ok(text)
}
