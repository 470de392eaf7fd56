//! How the workload's process is confined beyond its network namespace, and
//! what sluice's own process needs for that: root, and the descriptor
//! limits of both.
//!
//! A workload (a command under `sluice run`; the VMM under `sluice vm`)
//! is started by [`spawn`] as the child of a small init ([`init`], forked
//! from sluice before it starts any thread: [`PreparedInit`]) that is PID 1
//! of a fresh PID namespace, so it can
//! neither see, signal, trace nor borrow descriptors from any process
//! outside, sluice included. The init gives it a mount namespace
//! ([`mounts`]) where sluice's own files are read-only or absent and the
//! kernel's knobs are read-only, a seccomp filter ([`seccomp`]) and a
//! reduced capability set ([`caps`]). An interactive workload cannot hand
//! the terminal back to sluice from inside its PID namespace; [`terminal`]
//! takes it back. docs/enforcement.md says what each part stops and what
//! stays open.
//!
//! A leaf module: it imports nothing of sluice's, so every command and
//! attach path can use it. It must never start a workload it could not
//! confine: every failure is an error, and nothing runs.

pub(crate) mod caps;
#[allow(unsafe_code)]
pub(crate) mod child;
#[forbid(unsafe_code)]
pub(crate) mod fds;
#[forbid(unsafe_code)]
pub(crate) mod init;
pub(crate) mod mounts;
#[forbid(unsafe_code)]
pub(crate) mod scm;
pub(crate) mod seccomp;
#[forbid(unsafe_code)]
mod spawn;
pub(crate) mod terminal;

use std::path::{Path, PathBuf};

pub use init::{run as run_init, NAME as INIT_NAME};
pub(crate) use mounts::FilePlan;
pub(crate) use spawn::Workload;
pub use spawn::{start, PreparedInit};

/// Who the workload runs as (`--user`); root when absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

/// sluice's own files, which the workload must not change.
#[derive(Debug, Clone, Default)]
pub struct SluiceFiles {
    /// Read by sluice (the policy file, a bundle, the trust file, a CA
    /// file, the rollback state directory): read-only for the workload.
    pub(crate) read_only: Vec<PathBuf>,
    /// Appended to by sluice (the audit log, timing records): the file and
    /// any rotated FILE.n beside it are read-only; when `rotates`, its whole
    /// directory is, so that no file a rotation creates is ever writable.
    pub(crate) records: Vec<RecordFile>,
    /// Files the workload must not open (a secret, a checkpoint key),
    /// sockets it must not reach (the daemon's control socket), and
    /// directories whose files it must not see ([`SluiceFiles::hide`]).
    pub(crate) hidden: Vec<PathBuf>,
}

/// One file sluice appends records to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordFile {
    pub(crate) path: PathBuf,
    /// Rotated by size while the workload runs (`--audit-max-bytes`).
    pub(crate) rotates: bool,
}

/// Errors from confining a workload.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("cannot start the workload `{program}`: {source}; check that it exists in PATH and is executable")]
    Exec {
        program: String,
        source: std::io::Error,
    },
    #[error("{} rotates in {}, which holds the command's working directory: the directory of a rotating log is read-only for the workload (a rotation creates files there it could rewrite); put the log in a directory of its own (e.g. /var/log/sluice/) or run the command elsewhere", file.display(), dir.display())]
    RotatingRecordsBesideWorkload { file: PathBuf, dir: PathBuf },
    #[error("cannot confine the workload ({0}); nothing was started")]
    Setup(String),
    #[error("cannot show {} at {} for the workload: {why}; nothing was started", shown.display(), target.display())]
    Replacement {
        /// The file sluice wrote.
        shown: PathBuf,
        target: PathBuf,
        why: String,
    },
    #[error("cannot start the workload's init: {0}")]
    Init(std::io::Error),
}

impl ConfineError {
    /// An error in what the user asked for (exit 2), not in the host.
    pub(crate) fn is_bad_input(&self) -> bool {
        matches!(self, ConfineError::RotatingRecordsBesideWorkload { .. })
    }
}

impl SluiceFiles {
    /// Hide `path` from the workload, root included: a file (a secret) or
    /// socket cannot be opened or connected to (EACCES, ECONNREFUSED), a
    /// directory looks empty. Only what exists when the init is told its
    /// plan is hidden; another path to the same file (a hard link, another
    /// mount of its filesystem) is not.
    pub fn hide(&mut self, path: impl Into<PathBuf>) -> &mut Self {
        self.hidden.push(path.into());
        self
    }

    /// What the init protects, for a workload started in `cwd`. Paths that
    /// do not exist are left out (sluice created every file it writes
    /// before this, and read every file it reads).
    pub(crate) fn plan(&self, cwd: &Path) -> Result<FilePlan, ConfineError> {
        let mut read_only: Vec<PathBuf> = self
            .read_only
            .iter()
            .filter(|p| p.exists())
            .cloned()
            .collect();
        for record in &self.records {
            let path = absolute(cwd, &record.path);
            if record.rotates {
                let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
                let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
                let cwd = std::fs::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf());
                if cwd.starts_with(&dir) {
                    return Err(ConfineError::RotatingRecordsBesideWorkload {
                        file: record.path.clone(),
                        dir,
                    });
                }
                read_only.push(dir);
            }
            read_only.extend(rotated_set(&path));
        }
        Ok(FilePlan {
            read_only,
            replaced: Vec::new(),
            hidden: self.hidden.iter().filter(|p| p.exists()).cloned().collect(),
        })
    }
}

/// Add `replacements` ((source, target) pairs, see
/// [`PreparedInit::replace`]) to `plan`: each whose target exists (one that
/// does not is left out), with its source read-only, so that the workload
/// cannot change what it sees at the target through the source's own path.
/// A source that does not exist, or is a directory where the target is not
/// (or the other way round), is an error: the workload would not see what
/// sluice means it to.
pub(crate) fn plan_replacements(
    replacements: &[(PathBuf, PathBuf)],
    plan: &mut FilePlan,
) -> Result<(), ConfineError> {
    for (source, target) in replacements {
        let refused = |why: String| ConfineError::Replacement {
            shown: source.clone(),
            target: target.clone(),
            why,
        };
        let Ok(target_meta) = std::fs::metadata(target) else {
            tracing::debug!(
                source = %source.display(),
                target = %target.display(),
                "not shown to the workload: the target does not exist"
            );
            continue;
        };
        let source_meta = std::fs::metadata(source)
            .map_err(|e| refused(format!("cannot read {}: {e}", source.display())))?;
        if source_meta.is_dir() != target_meta.is_dir() {
            let (dir, other) = if target_meta.is_dir() {
                (target, source)
            } else {
                (source, target)
            };
            return Err(refused(format!(
                "{} is a directory and {} is not; replace a file with a file, a directory with a directory",
                dir.display(),
                other.display()
            )));
        }
        plan.replaced.push((source.clone(), target.clone()));
        if !plan.read_only.contains(source) {
            plan.read_only.push(source.clone());
        }
    }
    Ok(())
}

fn absolute(cwd: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    }
}

/// FILE and the FILE.1, FILE.2, ... that exist beside it.
fn rotated_set(path: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = Vec::new();
    if path.exists() {
        files.push(path.to_path_buf());
    }
    for n in 1.. {
        let mut name = path.as_os_str().to_os_string();
        name.push(format!(".{n}"));
        let rotated = PathBuf::from(name);
        if !rotated.exists() {
            break;
        }
        files.push(rotated);
    }
    files
}

/// Fail early, with what to do, instead of a confusing EPERM later.
pub(crate) fn require_root(what: &'static str) -> Result<(), NotRoot> {
    if !nix::unistd::geteuid().is_root() {
        return Err(NotRoot(what));
    }
    Ok(())
}

/// A command that needs root was started without it (exit 3: this process
/// cannot enforce).
#[derive(Debug, thiserror::Error)]
#[error("{0} needs root (it creates a network namespace and nftables rules): run it with sudo or as root")]
pub(crate) struct NotRoot(&'static str);

impl crate::exit_class::Classified for NotRoot {
    /// Without root nothing can be enforced.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::CannotEnforce
    }
}

impl crate::exit_class::Classified for ConfineError {
    /// A command that cannot start: 127 or 126; records beside the workload: bad input; the rest: the host.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        match self {
            ConfineError::Exec { source, .. } => crate::exit_class::ExitClass::of_spawn(source),
            e if e.is_bad_input() => crate::exit_class::ExitClass::BadInput,
            _ => crate::exit_class::ExitClass::CannotEnforce,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_file_and_its_rotations_are_read_only_and_a_rotating_one_its_directory_too() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.jsonl");
        for name in ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let files = |rotates| SluiceFiles {
            records: vec![RecordFile {
                path: log.clone(),
                rotates,
            }],
            ..Default::default()
        };
        let plan = files(false).plan(Path::new("/")).unwrap();
        assert_eq!(plan.read_only.len(), 3, "{plan:?}");
        let plan = files(true).plan(Path::new("/")).unwrap();
        let dir = std::fs::canonicalize(dir.path()).unwrap();
        assert!(plan.read_only.contains(&dir), "{plan:?}");
    }

    #[test]
    fn a_rotating_log_beside_the_working_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let files = SluiceFiles {
            records: vec![RecordFile {
                path: dir.path().join("audit.jsonl"),
                rotates: true,
            }],
            ..Default::default()
        };
        let err = files.plan(&work).unwrap_err();
        assert!(err.is_bad_input());
        assert!(
            err.to_string()
                .contains("holds the command's working directory"),
            "{err}"
        );
    }

    #[test]
    fn a_replacement_shows_its_source_read_only_and_one_without_a_target_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let (source, target) = (dir.path().join("bundle.pem"), dir.path().join("ca.crt"));
        std::fs::write(&source, "sandbox CA").unwrap();
        std::fs::write(&target, "distribution roots").unwrap();
        let mut plan = FilePlan::default();
        let pairs = [
            (source.clone(), target.clone()),
            (source.clone(), dir.path().join("absent.crt")),
        ];
        plan_replacements(&pairs, &mut plan).unwrap();
        assert_eq!(plan.replaced, vec![(source.clone(), target)]);
        assert_eq!(plan.read_only, vec![source]);
    }

    #[test]
    fn a_replacement_without_its_source_or_of_a_file_by_a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("ca.crt");
        std::fs::write(&target, "distribution roots").unwrap();
        let missing = [(dir.path().join("never-written.pem"), target.clone())];
        let err = plan_replacements(&missing, &mut FilePlan::default()).unwrap_err();
        assert!(err.to_string().contains("never-written.pem"), "{err}");
        assert!(err.to_string().contains("nothing was started"), "{err}");
        let by_dir = [(dir.path().to_path_buf(), target)];
        let err = plan_replacements(&by_dir, &mut FilePlan::default()).unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
    }

    #[test]
    fn hidden_files_are_planned_when_they_exist() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("gh");
        std::fs::write(&secret, "token").unwrap();
        let mut files = SluiceFiles::default();
        files.hide(&secret).hide(dir.path().join("absent"));
        assert_eq!(files.plan(Path::new("/")).unwrap().hidden, vec![secret]);
    }

    #[test]
    fn missing_files_are_left_out() {
        let files = SluiceFiles {
            read_only: vec!["/nonexistent/policy.yaml".into()],
            hidden: vec!["/nonexistent/daemon.sock".into()],
            ..Default::default()
        };
        assert_eq!(files.plan(Path::new("/")).unwrap(), FilePlan::default());
    }
}
