//! Reading a bundle's files from a directory or a .tar.gz with hard caps
//! enforced while reading (so a gzip bomb or a huge file stops at the cap,
//! not at the end of memory), and writing both forms.
//!
//! Tar entries must be regular files with plain names (an optional `./`
//! prefix and a `./` directory entry are tolerated); links, devices, nested
//! paths, absolute paths and `..` are refused.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::error::BundleError;
use super::manifest::plain_name;

/// Largest single file in a bundle.
pub const MAX_FILE_BYTES: u64 = 4 << 20;
/// Largest archive, compressed or uncompressed (tar headers included).
pub const MAX_ARCHIVE_BYTES: u64 = 16 << 20;
/// Most entries in a bundle.
pub const MAX_ENTRIES: usize = 32;

/// The files of a bundle, by plain name.
#[derive(Debug, Default)]
pub struct BundleFiles {
    pub files: BTreeMap<String, Vec<u8>>,
}

impl BundleFiles {
    /// Reads `path`: a directory, else a gzip-compressed tar archive.
    pub fn read(path: &Path) -> Result<BundleFiles, BundleError> {
        let meta = std::fs::metadata(path).map_err(|e| BundleError::bundle_unreadable(path, e))?;
        if meta.is_dir() {
            read_dir(path)
        } else {
            if meta.len() > MAX_ARCHIVE_BYTES {
                return Err(oversized(path, "the archive", MAX_ARCHIVE_BYTES));
            }
            let file =
                std::fs::File::open(path).map_err(|e| BundleError::bundle_unreadable(path, e))?;
            let mut bytes = Vec::new();
            file.take(MAX_ARCHIVE_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| BundleError::bundle_unreadable(path, e))?;
            BundleFiles::from_tar_gz(&bytes, path)
        }
    }

    /// Unpacks a .tar.gz held in memory; `shown` names it in errors.
    pub fn from_tar_gz(bytes: &[u8], shown: &Path) -> Result<BundleFiles, BundleError> {
        if bytes.len() as u64 > MAX_ARCHIVE_BYTES {
            return Err(oversized(shown, "the archive", MAX_ARCHIVE_BYTES));
        }
        if !bytes.starts_with(&[0x1f, 0x8b]) {
            return Err(unreadable(
                shown,
                "not a directory and not a gzip-compressed tar archive".into(),
            ));
        }
        let capped = Capped {
            inner: flate2::read::GzDecoder::new(bytes),
            left: MAX_ARCHIVE_BYTES,
        };
        let mut archive = tar::Archive::new(capped);
        let mut out = BundleFiles::default();
        let entries = archive
            .entries()
            .map_err(|e| archive_error(shown, "the archive", e))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| archive_error(shown, "the archive", e))?;
            let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let kind = entry.header().entry_type();
            let name = raw.strip_prefix("./").unwrap_or(&raw).to_string();
            if kind.is_dir() && (name.is_empty() || name == ".") {
                continue;
            }
            if !kind.is_file() {
                return Err(unexpected(shown, &raw, "not a regular file"));
            }
            if !plain_name(&name) {
                return Err(unexpected(shown, &raw, "not a plain file name"));
            }
            let size = entry.size();
            if size > MAX_FILE_BYTES {
                return Err(oversized(shown, &name, MAX_FILE_BYTES));
            }
            let mut data = Vec::with_capacity(size as usize);
            (&mut entry)
                .take(MAX_FILE_BYTES + 1)
                .read_to_end(&mut data)
                .map_err(|e| archive_error(shown, &name, e))?;
            if data.len() as u64 != size {
                return Err(unreadable(shown, format!("{name} is truncated")));
            }
            out.insert(shown, name, data)?;
        }
        // Read to the gzip trailer so that its CRC and length are checked.
        let mut rest = archive.into_inner();
        io::copy(&mut rest, &mut io::sink()).map_err(|e| archive_error(shown, "the archive", e))?;
        Ok(out)
    }

    fn insert(&mut self, shown: &Path, name: String, data: Vec<u8>) -> Result<(), BundleError> {
        if self.files.len() >= MAX_ENTRIES {
            return Err(unexpected(shown, &name, "too many entries"));
        }
        if self.files.contains_key(&name) {
            return Err(unexpected(shown, &name, "appears twice"));
        }
        self.files.insert(name, data);
        Ok(())
    }

    /// Writes these files as a .tar.gz (deterministic: sorted names, mode
    /// 0644, mtime `mtime`).
    pub fn to_tar_gz(&self, mtime: u64) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        for (name, data) in &self.files {
            let mut header = tar::Header::new_ustar();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_mtime(mtime);
            header.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut header, name, data.as_slice())
                .expect("writing to memory");
        }
        let gz = tar.into_inner().expect("writing to memory");
        gz.finish().expect("writing to memory")
    }
}

fn read_dir(dir: &Path) -> Result<BundleFiles, BundleError> {
    let mut out = BundleFiles::default();
    let mut total = 0u64;
    for entry in std::fs::read_dir(dir).map_err(|e| BundleError::bundle_unreadable(dir, e))? {
        let entry = entry.map_err(|e| BundleError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Editors' and our own temp files (written then renamed in place).
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| BundleError::io(&path, e))?;
        if !kind.is_file() {
            return Err(unexpected(dir, &name, "not a regular file"));
        }
        let file = std::fs::File::open(&path).map_err(|e| BundleError::io(&path, e))?;
        let mut data = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut data)
            .map_err(|e| BundleError::io(&path, e))?;
        if data.len() as u64 > MAX_FILE_BYTES {
            return Err(oversized(dir, &name, MAX_FILE_BYTES));
        }
        total += data.len() as u64;
        if total > MAX_ARCHIVE_BYTES {
            return Err(oversized(dir, "the bundle", MAX_ARCHIVE_BYTES));
        }
        out.insert(dir, name, data)?;
    }
    Ok(out)
}

/// A reader that fails once more than `left` bytes came out of it.
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(io::Error::other(CapExceeded));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[derive(Debug)]
struct CapExceeded;

impl std::fmt::Display for CapExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("uncompressed size over the cap")
    }
}

impl std::error::Error for CapExceeded {}

fn archive_error(shown: &Path, what: &str, e: io::Error) -> BundleError {
    let capped = e.get_ref().is_some_and(|inner| inner.is::<CapExceeded>())
        || e.to_string().contains("uncompressed size over the cap");
    if capped {
        oversized(shown, "the uncompressed archive", MAX_ARCHIVE_BYTES)
    } else {
        unreadable(shown, format!("{what}: {e}"))
    }
}

fn oversized(path: &Path, what: &str, limit: u64) -> BundleError {
    BundleError::Oversized {
        path: path.to_path_buf(),
        what: what.to_string(),
        limit,
    }
}

fn unreadable(path: &Path, reason: String) -> BundleError {
    BundleError::Unreadable {
        path: PathBuf::from(path),
        reason,
    }
}

fn unexpected(path: &Path, entry: &str, why: &'static str) -> BundleError {
    BundleError::UnexpectedEntry {
        path: path.to_path_buf(),
        entry: entry.to_string(),
        why,
    }
}

/// Writes `bytes` to `path` via a temp file in the same directory and a
/// rename, so readers see the old file or the new one, never a mix.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), BundleError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        BundleError::io(path, e)
    })
}
