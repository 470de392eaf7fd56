//! What survives a daemon restart: one small JSON file per attached
//! sandbox under `<state_dir>/sandboxes/`, holding its attach request, the
//! container process's start time and its namespace's inode. A restarted
//! daemon re-opens each namespace through `/proc/<pid>/ns/net` and attaches
//! it again, so an upgrade or a crash of the daemon cuts its containers off
//! only while it is down (fail closed: the tables stay, the listeners are
//! gone) instead of until they restart.
//!
//! A record is trusted only as far as the kernel confirms it: the process
//! must still be the one that was attached (same pid and start time, seen
//! through a pidfd) and still live in the same namespace (same inode).
//! Anything else is a container that ended meanwhile, and its record goes.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::api::AttachRequest;

/// One attached sandbox, as remembered on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SandboxRecord {
    pub(crate) request: AttachRequest,
    /// The container process's start time (clock ticks since boot, field 22
    /// of /proc/PID/stat): with the pid, it names one process for good.
    pub(crate) start_ticks: u64,
    pub(crate) netns_inode: u64,
}

/// Why a record cannot be adopted again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StaleRecord {
    #[error("it has no container process to find its namespace by")]
    NoPid,
    #[error("its process {0} is gone")]
    ProcessGone(i32),
    #[error("process {0} is another process now (pid reused)")]
    PidReused(i32),
    #[error("process {pid} is in namespace net:[{now}] now, not net:[{was}]")]
    OtherNamespace { pid: i32, now: u64, was: u64 },
}

/// The records of one daemon's sandboxes.
#[derive(Debug, Clone)]
pub(crate) struct Records {
    dir: PathBuf,
}

impl Records {
    pub(crate) fn new(state_dir: &Path) -> Records {
        Records {
            dir: state_dir.join("sandboxes"),
        }
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Remember `request` (attached with a pid) so a restarted daemon can
    /// adopt its namespace again. Written whole, then renamed into place.
    pub(crate) fn save(&self, request: &AttachRequest, netns_inode: u64) -> std::io::Result<()> {
        let pid = request.pid.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no container pid")
        })?;
        let record = SandboxRecord {
            request: request.clone(),
            start_ticks: start_ticks(pid)?,
            netns_inode,
        };
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{}.tmp", request.id));
        std::fs::write(&tmp, serde_json::to_vec_pretty(&record)?)?;
        std::fs::rename(&tmp, self.path(request.id.as_str()))
    }

    /// Forget `id` (its container ended, or it was detached on request).
    pub(crate) fn remove(&self, id: &str) {
        match std::fs::remove_file(self.path(id)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "cannot remove the sandbox's restart record")
            }
        }
    }

    /// Every record on disk; unreadable ones are reported and removed.
    pub(crate) fn load_all(&self) -> Vec<SandboxRecord> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let parsed = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| {
                    serde_json::from_slice::<SandboxRecord>(&bytes).map_err(|e| e.to_string())
                });
            match parsed {
                Ok(record) => records.push(record),
                Err(err) => {
                    tracing::warn!(path = %path.display(), %err, "unreadable sandbox restart record: removing it");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        records.sort_by(|a, b| a.request.id.cmp(&b.request.id));
        records
    }
}

/// Open the namespace `record` names, if its container still runs in it.
pub(crate) fn reopen(record: &SandboxRecord) -> Result<OwnedFd, StaleRecord> {
    let pid = record.request.pid.ok_or(StaleRecord::NoPid)?;
    let pidfd = pidfd_open(pid).map_err(|_| StaleRecord::ProcessGone(pid))?;
    if start_ticks(pid).ok() != Some(record.start_ticks) {
        return Err(StaleRecord::PidReused(pid));
    }
    let netns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|_| StaleRecord::ProcessGone(pid))?;
    // Checked after both reads: if the pidfd's process is still alive, the
    // /proc entries read above were that process's.
    if exited(&pidfd) {
        return Err(StaleRecord::ProcessGone(pid));
    }
    let now = std::os::unix::fs::MetadataExt::ino(
        &netns
            .metadata()
            .map_err(|_| StaleRecord::ProcessGone(pid))?,
    );
    if now != record.netns_inode {
        return Err(StaleRecord::OtherNamespace {
            pid,
            now,
            was: record.netns_inode,
        });
    }
    Ok(OwnedFd::from(netns))
}

/// Field 22 of /proc/PID/stat, counted after the command name, which may
/// itself hold spaces and parentheses.
fn start_ticks(pid: i32) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_start_ticks(&stat).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unexpected /proc/{pid}/stat"),
        )
    })
}

fn parse_start_ticks(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the name; the start time is field 22.
    after_comm.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// A pidfd for `pid`: readable once that process exits, and immune to the
/// pid being reused.
pub(super) fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)
        .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// Whether the process behind `pidfd` has exited.
pub(super) fn exited(pidfd: &OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str, pid: i32) -> AttachRequest {
        AttachRequest {
            id: id.parse().expect("a sandbox id"),
            pid: Some(pid),
            policy: Some(PathBuf::from("/etc/sluice/p.yaml")),
            bundle: None,
            trust: None,
            binds: Vec::new(),
            vm: None,
        }
    }

    #[test]
    fn start_time_is_field_22_even_when_the_name_has_spaces_and_parens() {
        let stat = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_ticks(stat), Some(987654));
        assert_eq!(parse_start_ticks("garbage"), None);
    }

    #[test]
    fn a_saved_record_of_this_process_reopens_its_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::new(dir.path());
        let me = std::process::id() as i32;
        let inode = std::fs::metadata("/proc/self/ns/net")
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap();
        records.save(&request("c1", me), inode).unwrap();
        let all = records.load_all();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].request, request("c1", me));
        assert!(reopen(&all[0]).is_ok());
        records.remove("c1");
        assert!(records.load_all().is_empty());
    }

    #[test]
    fn a_record_whose_process_changed_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::new(dir.path());
        let me = std::process::id() as i32;
        records.save(&request("c2", me), 1).unwrap();
        let mut record = records.load_all().remove(0);
        assert!(matches!(
            reopen(&record),
            Err(StaleRecord::OtherNamespace { .. })
        ));
        record.start_ticks += 1;
        assert!(matches!(reopen(&record), Err(StaleRecord::PidReused(_))));
        record.request.pid = Some(i32::MAX);
        assert!(matches!(reopen(&record), Err(StaleRecord::ProcessGone(_))));
    }

    #[test]
    fn an_unreadable_record_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::new(dir.path());
        std::fs::create_dir_all(dir.path().join("sandboxes")).unwrap();
        std::fs::write(dir.path().join("sandboxes/bad.json"), b"{not json").unwrap();
        assert!(records.load_all().is_empty());
        assert!(!dir.path().join("sandboxes/bad.json").exists());
    }
}
