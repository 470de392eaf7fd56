//! What a host remembers between runs, under its state directory:
//! `revisions.yaml` (the highest revision accepted per bundle name, for
//! rollback protection) and `last-good/` (the bytes of the last fetched
//! bundle that verified, so a restart works while the server is down).
//! Every write is a temp file plus rename.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::archive::{write_atomic, MAX_ARCHIVE_BYTES};
use super::error::BundleError;
use crate::policy::yaml::{self, Problem, Value};

/// The state directory unless one is given (`--state-dir`,
/// `defaults.state_dir`).
pub(crate) const DEFAULT_STATE_DIR: &str = "/var/lib/sluice";

const REVISIONS: &str = "revisions.yaml";
const LAST_GOOD: &str = "last-good";

/// The revision memory of one state directory.
#[derive(Debug, Clone)]
pub struct RevisionState {
    dir: PathBuf,
    highest: BTreeMap<String, u64>,
}

impl RevisionState {
    /// Opens (creating, mode 0700) `dir` and reads what it remembers.
    pub fn open(dir: &Path) -> Result<RevisionState, BundleError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| BundleError::io(dir, e))?;
        let file = dir.join(REVISIONS);
        let highest = match std::fs::File::open(&file) {
            Ok(f) => {
                let mut text = String::new();
                f.take(1 << 20)
                    .read_to_string(&mut text)
                    .map_err(|e| BundleError::io(&file, e))?;
                read_revisions(&text).map_err(|p| BundleError::State {
                    path: file.clone(),
                    at: Some((p.at.line, p.at.column)),
                    msg: format!(
                        "unreadable revision state ({}); remove the file to start over",
                        p.message
                    ),
                })?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(BundleError::io(&file, e)),
        };
        Ok(RevisionState {
            dir: dir.to_path_buf(),
            highest,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The highest revision accepted for `name`, if any.
    pub fn highest(&self, name: &str) -> Option<u64> {
        self.highest.get(name).copied()
    }

    /// Refuses `revision` if it is lower than one accepted for `name`
    /// (unless `allow_rollback`). An equal revision is accepted.
    pub fn check(
        &self,
        name: &str,
        revision: u64,
        allow_rollback: bool,
    ) -> Result<(), BundleError> {
        match self.highest(name) {
            Some(highest) if revision < highest && !allow_rollback => Err(BundleError::Rollback {
                name: name.to_string(),
                revision,
                highest,
            }),
            _ => Ok(()),
        }
    }

    /// Remembers `revision` as accepted for `name` (raising the mark, or
    /// setting it to `revision` after an allowed rollback).
    pub fn accept(&mut self, name: &str, revision: u64) -> Result<(), BundleError> {
        if self.highest(name) == Some(revision) {
            return Ok(());
        }
        self.highest.insert(name.to_string(), revision);
        let text = serde_norway::to_string(&self.highest).expect("map serializes");
        write_atomic(&self.dir.join(REVISIONS), text.as_bytes())
    }

    /// Keeps the bytes of a verified bundle fetched from `source`.
    pub(crate) fn store_last_good(&self, source: &str, bytes: &[u8]) -> Result<(), BundleError> {
        let dir = self.dir.join(LAST_GOOD);
        std::fs::create_dir_all(&dir).map_err(|e| BundleError::io(&dir, e))?;
        write_atomic(&self.last_good_path(source), bytes)
    }

    /// The last good bundle fetched from `source`, if one was kept. It is
    /// verified again before use.
    pub(crate) fn last_good(&self, source: &str) -> Option<Vec<u8>> {
        let file = std::fs::File::open(self.last_good_path(source)).ok()?;
        let mut bytes = Vec::new();
        file.take(MAX_ARCHIVE_BYTES + 1)
            .read_to_end(&mut bytes)
            .ok()?;
        Some(bytes)
    }

    /// `last-good/<sha256(source) prefix>.tar.gz`: sources are URLs, not
    /// file names.
    pub(crate) fn last_good_path(&self, source: &str) -> PathBuf {
        let digest = hex::encode(Sha256::digest(source.as_bytes()));
        self.dir
            .join(LAST_GOOD)
            .join(format!("{}.tar.gz", &digest[..32]))
    }
}

/// `revisions.yaml`: bundle name -> highest revision accepted (empty: none).
fn read_revisions(text: &str) -> Result<BTreeMap<String, u64>, Problem> {
    let root = yaml::parse(text)?;
    let entries = match &root.value {
        Value::Null => return Ok(BTreeMap::new()),
        Value::Map(entries) => entries,
        _ => {
            return Err(Problem::new(
                root.pos,
                format!(
                    "it must map bundle names to revisions, but it is {}",
                    root.kind()
                ),
            ))
        }
    };
    let mut highest = BTreeMap::new();
    for (key, value) in entries {
        let name = key.text("a bundle name")?;
        let revision = value.unsigned(&format!("the revision of {name:?}"))?;
        if highest.insert(name.to_string(), revision).is_some() {
            return Err(Problem::new(key.pos, format!("{name:?} is listed twice")));
        }
    }
    Ok(highest)
}
