//! Ed25519 keys: the private signing key file, and the trust file of public
//! keys by id that verification checks against.
//!
//! Key file (YAML, mode 0600): `id: NAME` and `ed25519_pkcs8: HEX` (the
//! PKCS#8 v2 document ring generates). Trust file (YAML):
//! `keys: [{id: NAME, ed25519: HEX}]`, the 32-byte public key in hex.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::Serialize;

use super::error::{BundleError, KEY_HINT, TRUST_HINT};
use crate::policy::yaml::{self, Pos, Problem, Record};

/// Largest key or trust file read.
const MAX_KEY_FILE: u64 = 256 * 1024;

/// The key file as sluice writes it (read back by [`SigningKey::from_yaml`]).
#[derive(Serialize)]
struct KeyFile {
    id: String,
    ed25519_pkcs8: String,
}

const KEY_FILE_KEYS: &[&str] = &["id", "ed25519_pkcs8"];

/// The trust file as sluice writes it (read back by [`read_trust`]).
#[derive(Serialize, Default)]
struct TrustFile {
    keys: Vec<TrustEntry>,
}

const TRUST_FILE_KEYS: &[&str] = &["keys"];

#[derive(Serialize, Clone)]
struct TrustEntry {
    id: String,
    ed25519: String,
}

const TRUST_ENTRY_KEYS: &[&str] = &["id", "ed25519"];

fn at(pos: Pos) -> Option<(usize, usize)> {
    Some((pos.line, pos.column))
}

/// A private signing key and the id the manifest names it by.
pub(crate) struct SigningKey {
    pub(crate) id: String,
    pub(crate) pair: Ed25519KeyPair,
}

impl SigningKey {
    pub(crate) fn load(path: &Path) -> Result<SigningKey, BundleError> {
        let text = read_small(path, "signing key", KEY_HINT)?;
        SigningKey::from_yaml(&text, path)
    }

    fn from_yaml(text: &str, path: &Path) -> Result<SigningKey, BundleError> {
        let bad = |p: Problem| BundleError::Key {
            path: path.to_path_buf(),
            at: at(p.at),
            msg: p.message,
        };
        let root = yaml::parse(text).map_err(bad)?;
        let r = Record::open(&root, "the signing key file", KEY_FILE_KEYS).map_err(bad)?;
        let id_node = r.required("id", KEY_HINT).map_err(bad)?;
        let id = id_node.text("the signing key's `id`").map_err(bad)?;
        check_id(id).map_err(|msg| bad(Problem::new(id_node.pos, msg)))?;
        let der_node = r.required("ed25519_pkcs8", KEY_HINT).map_err(bad)?;
        let der = der_node
            .text("the signing key's `ed25519_pkcs8`")
            .map_err(bad)?;
        let der = hex::decode(der.trim()).map_err(|_| {
            bad(Problem::new(
                der_node.pos,
                format!("`ed25519_pkcs8` is not hex; {KEY_HINT}"),
            ))
        })?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| {
            bad(Problem::new(
                der_node.pos,
                format!("`ed25519_pkcs8` is not an Ed25519 PKCS#8 key ({e}); {KEY_HINT}"),
            ))
        })?;
        Ok(SigningKey {
            id: id.to_string(),
            pair,
        })
    }

    /// A fresh key, written to `path` (mode 0600, never overwriting an
    /// existing file) under a first line `# {comment}`; `name` gives its id
    /// from its raw public key.
    pub(crate) fn create(
        path: &Path,
        comment: &str,
        name: impl FnOnce(&[u8]) -> String,
    ) -> Result<SigningKey, BundleError> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| BundleError::Key {
            path: path.to_path_buf(),
            at: None,
            msg: "the system random source failed".into(),
        })?;
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("ring reads back its own key");
        let id = name(pair.public_key().as_ref());
        check_id(&id).map_err(|msg| BundleError::Key {
            path: path.to_path_buf(),
            at: None,
            msg,
        })?;
        let body = format!(
            "# {comment}\n{}",
            serde_norway::to_string(&KeyFile {
                id: id.clone(),
                ed25519_pkcs8: hex::encode(pkcs8.as_ref()),
            })
            .expect("key file serializes")
        );
        write_new_private(path, body.as_bytes())?;
        Ok(SigningKey { id, pair })
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The raw 32-byte public key.
    pub(crate) fn public_key(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    /// The public key, hex, as the trust file holds it.
    pub(crate) fn public_hex(&self) -> String {
        hex::encode(self.public_key())
    }

    /// The Ed25519 signature of `message`.
    pub(crate) fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }
}

/// Whether `signature` is `public`'s Ed25519 signature of `message`.
pub(crate) fn verify_signature(public: &[u8], message: &[u8], signature: &[u8]) -> bool {
    UnparsedPublicKey::new(&ED25519, public)
        .verify(message, signature)
        .is_ok()
}

/// A trust file's text listing `keys` (id, raw public key), headed by
/// `# {comment}`: what [`TrustStore::load`] reads.
pub(crate) fn trust_file_text(comment: &str, keys: &[(&str, &[u8])]) -> String {
    let file = TrustFile {
        keys: keys
            .iter()
            .map(|(id, key)| TrustEntry {
                id: id.to_string(),
                ed25519: hex::encode(key),
            })
            .collect(),
    };
    format!(
        "# {comment}\n{}",
        serde_norway::to_string(&file).expect("trust file serializes")
    )
}

/// The public keys a host trusts, by id. Several keys may be trusted at once
/// (rotation: add the new key, sign with it, then drop the old one).
#[derive(Debug, Clone, Default)]
pub struct TrustStore {
    keys: BTreeMap<String, Vec<u8>>,
}

impl TrustStore {
    pub fn load(path: &Path) -> Result<TrustStore, BundleError> {
        let text = read_small(path, "trust file", TRUST_HINT)?;
        TrustStore::from_yaml(&text, path)
    }

    pub fn from_yaml(text: &str, path: &Path) -> Result<TrustStore, BundleError> {
        let mut keys = BTreeMap::new();
        for (entry, _) in read_trust(text, path)? {
            let key = decode_public(&entry.ed25519).expect("read_trust checked the key");
            keys.insert(entry.id, key);
        }
        Ok(TrustStore { keys })
    }

    /// A store of one key (a public key given on its own).
    pub(crate) fn single(id: &str, key: &[u8]) -> TrustStore {
        TrustStore {
            keys: BTreeMap::from([(id.to_string(), key.to_vec())]),
        }
    }

    /// A raw 32-byte public key written as 64 hex digits, if `text` is one.
    pub(crate) fn decode_public(text: &str) -> Option<Vec<u8>> {
        decode_public(text)
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

/// The trust file's entries in file order (with where each is), every id
/// and key checked and no id listed twice.
fn read_trust(text: &str, path: &Path) -> Result<Vec<(TrustEntry, Pos)>, BundleError> {
    let bad = |p: Problem| BundleError::Trust {
        path: path.to_path_buf(),
        at: at(p.at),
        msg: p.message,
    };
    let root = yaml::parse(text).map_err(bad)?;
    let r = Record::open(&root, "the file", TRUST_FILE_KEYS).map_err(bad)?;
    let list = r
        .required(
            "keys",
            "list the trusted public keys as `keys: [{id: NAME, ed25519: HEX}]`",
        )
        .map_err(bad)?;
    let items = list
        .seq("`keys`", "`keys: [{id: NAME, ed25519: HEX}]`")
        .map_err(bad)?;
    let mut out: Vec<(TrustEntry, Pos)> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let what = format!("key #{}", i + 1);
        let e = Record::open(item, &what, TRUST_ENTRY_KEYS).map_err(bad)?;
        let hint = "give it as `{id: NAME, ed25519: HEX}`";
        let id_node = e.required("id", hint).map_err(bad)?;
        let id = id_node.text(&format!("the `id` of {what}")).map_err(bad)?;
        check_id(id).map_err(|msg| bad(Problem::new(id_node.pos, msg)))?;
        let key_node = e.required("ed25519", hint).map_err(bad)?;
        let key = key_node
            .text(&format!("the `ed25519` of key {id:?}"))
            .map_err(bad)?;
        if decode_public(key).is_none() {
            return Err(bad(Problem::new(
                key_node.pos,
                format!("key {id:?}: ed25519 must be a 32-byte public key in hex (64 characters)"),
            )));
        }
        if let Some((_, first)) = out.iter().find(|(k, _)| k.id == id) {
            return Err(bad(Problem::new(
                id_node.pos,
                format!(
                    "key id {id:?} is listed twice (first at line {}); keep one entry per id",
                    first.line
                ),
            )));
        }
        out.push((
            TrustEntry {
                id: id.to_string(),
                ed25519: key.to_string(),
            },
            id_node.pos,
        ));
    }
    Ok(out)
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
        at: None,
        msg,
    })?;
    let mut trust = match std::fs::metadata(trust_path) {
        Ok(_) => {
            let text = read_small(trust_path, "trust file", TRUST_HINT)?;
            let keys = read_trust(&text, trust_path)?;
            if let Some((_, pos)) = keys.iter().find(|(k, _)| k.id == id) {
                return Err(BundleError::Trust {
                    path: trust_path.to_path_buf(),
                    at: at(*pos),
                    msg: format!("key id {id:?} is already trusted; choose another --id"),
                });
            }
            TrustFile {
                keys: keys.into_iter().map(|(k, _)| k).collect(),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => TrustFile::default(),
        Err(e) => return Err(BundleError::io(trust_path, e)),
    };
    let pair = SigningKey::create(
        key_path,
        "sluice bundle signing key (Ed25519, PKCS#8 v2, hex). Keep it secret.",
        |_| id.to_string(),
    )?;
    trust.keys.push(TrustEntry {
        id: id.to_string(),
        ed25519: pair.public_hex(),
    });
    let text = format!(
        "# Public keys trusted to sign sluice policy bundles (id -> Ed25519, hex).\n{}",
        serde_norway::to_string(&trust).expect("trust file serializes")
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

/// Reads a key or trust file; `role` and `hint` name it if it cannot be read.
fn read_small(path: &Path, role: &'static str, hint: &'static str) -> Result<String, BundleError> {
    use std::io::Read;
    let unreadable = |source| BundleError::Read {
        role,
        path: path.to_path_buf(),
        source,
        hint,
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut text = String::new();
    file.take(MAX_KEY_FILE + 1)
        .read_to_string(&mut text)
        .map_err(unreadable)?;
    if text.len() as u64 > MAX_KEY_FILE {
        return Err(BundleError::Oversized {
            path: PathBuf::from(path),
            what: "the file".into(),
            limit: MAX_KEY_FILE,
        });
    }
    Ok(text)
}
