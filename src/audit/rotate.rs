//! Rotation by size. When the log reaches its size limit, FILE becomes
//! FILE.1 (FILE.1 becomes FILE.2, ..., the oldest beyond `keep` is removed)
//! and a new FILE starts. The chain does not restart: the new file's first
//! line carries the hash of FILE.1's last line as `prev` and the next `seq`,
//! so the files read oldest to newest (FILE.keep .. FILE.1, FILE) form one
//! chain. A rotated-away file's genesis is therefore not 64 zeros; see
//! `verify::Genesis` for how a verifier is told what to expect.

use std::io;
use std::path::{Path, PathBuf};

/// Rotation settings of a writer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rotation {
    pub(crate) max_bytes: u64,
    pub(crate) keep: usize,
}

/// FILE.n (n >= 1); FILE itself for n = 0.
pub fn rotated_path(path: &Path, n: usize) -> PathBuf {
    if n == 0 {
        return path.to_path_buf();
    }
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// The files of one rotated log that exist, oldest first, ending with FILE
/// itself (if it exists). Stops at the first missing FILE.n.
pub fn rotated_set(path: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut n = 1;
    loop {
        let p = rotated_path(path, n);
        if !p.exists() {
            break;
        }
        files.push(p);
        n += 1;
    }
    files.reverse();
    if path.exists() {
        files.push(path.to_path_buf());
    }
    files
}

/// Shift FILE.n to FILE.n+1 (dropping FILE.keep), then FILE to FILE.1.
pub(crate) fn rotate_files(path: &Path, keep: usize) -> io::Result<()> {
    let keep = keep.max(1);
    match std::fs::remove_file(rotated_path(path, keep)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    for n in (1..keep).rev() {
        let from = rotated_path(path, n);
        if from.exists() {
            std::fs::rename(&from, rotated_path(path, n + 1))?;
        }
    }
    std::fs::rename(path, rotated_path(path, 1))
}
