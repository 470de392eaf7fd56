//! Finding a program the way the shell would: the first executable file
//! of that name on PATH. A leaf any module may use (the demo, the bench,
//! doctor); it only reads the file system and never runs what it finds.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Where `program` is on PATH: the first file of that name with an
/// execute bit, or `None`.
pub(crate) fn on_path(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|path| is_executable(path))
}

/// A regular file with an execute bit.
pub(crate) fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_on_path_is_found_and_a_missing_one_is_not() {
        assert!(on_path("sh").is_some_and(|p| is_executable(&p)));
        assert_eq!(on_path("no-such-program-sluice-test"), None);
    }
}
