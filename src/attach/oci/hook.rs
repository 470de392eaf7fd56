//! The OCI createRuntime hook (`sluice oci-hook`): what it makes of the
//! state a runtime hands it on stdin. A container that could leave its
//! network namespace is refused, whatever started it; one started by
//! `sluice oci` must start in that wrapper's namespace; any other is to be
//! attached to the daemon with the policy its annotations name, through the
//! namespace opened here. The hook's command sends the result to the daemon;
//! this module never talks to the daemon, never decides policy and never
//! touches nftables.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::attach::oci_check::Guarded;

use super::{
    check_bundle_confinement, OciError, ANNOTATION_BUNDLE, ANNOTATION_NETNS, ANNOTATION_POLICY,
    ANNOTATION_SOCKET, ANNOTATION_TRUST,
};

/// Largest state document read from stdin.
const MAX_STATE_BYTES: u64 = 1 << 20;

/// The OCI state a runtime passes a hook on stdin (runtime-spec "State").
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct OciState {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) status: String,
    #[serde(default)]
    pub(crate) pid: Option<i32>,
    #[serde(default)]
    pub(crate) bundle: Option<PathBuf>,
    #[serde(default)]
    pub(crate) annotations: BTreeMap<String, String>,
}

impl OciState {
    pub(crate) fn parse(bytes: &[u8]) -> Result<OciState, OciError> {
        serde_json::from_slice(bytes).map_err(|e| OciError::State(e.to_string()))
    }

    /// Read (at most 1 MiB) and parse the state from `input` (the hook's stdin).
    pub(crate) fn read(input: impl Read) -> Result<OciState, OciError> {
        let mut bytes = Vec::new();
        input
            .take(MAX_STATE_BYTES)
            .read_to_end(&mut bytes)
            .map_err(|e| OciError::State(e.to_string()))?;
        OciState::parse(&bytes)
    }

    /// The hook runs at poststop too (as a hint to release early).
    pub(crate) fn is_stopped(&self) -> bool {
        self.status == "stopped"
    }

    /// The daemon socket the container's annotation names, if any.
    pub(crate) fn socket(&self) -> Option<&Path> {
        self.annotations.get(ANNOTATION_SOCKET).map(Path::new)
    }
}

/// What the hook asks the daemon for, from the container's annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HookPlan {
    /// Attach the container's namespace under this policy.
    Attach {
        policy: Option<PathBuf>,
        bundle: Option<String>,
        trust: Option<PathBuf>,
    },
    /// A `sluice oci` container: check it starts in the wrapper's namespace.
    CheckWrapped { inode: String },
}

impl HookPlan {
    /// The wrapper's mark wins: that container is already enforced by the
    /// `sluice oci` that started it (a second enforcement would collide
    /// with its listeners).
    pub(crate) fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<HookPlan, OciError> {
        let get = |k: &str| annotations.get(k).filter(|v| !v.trim().is_empty());
        if let Some(inode) = get(ANNOTATION_NETNS) {
            return Ok(HookPlan::CheckWrapped {
                inode: inode.clone(),
            });
        }
        let policy = get(ANNOTATION_POLICY).map(PathBuf::from);
        let bundle = get(ANNOTATION_BUNDLE).cloned();
        match (&policy, &bundle) {
            (None, None) => Err(OciError::NoPolicy),
            (Some(_), Some(_)) => Err(OciError::TwoPolicies),
            _ => Ok(HookPlan::Attach {
                policy,
                bundle,
                trust: get(ANNOTATION_TRUST).map(PathBuf::from),
            }),
        }
    }
}

/// What is left for the hook to do once the state is checked.
#[derive(Debug)]
pub(crate) enum HookStep {
    /// poststop: a hint that the daemon may release `id` now (it notices
    /// the container's end by itself anyway).
    Release { id: String },
    /// A `sluice oci` container starting in its wrapper's namespace: that
    /// wrapper enforces it, nothing to ask.
    Wrapped,
    /// Ask the daemon to enforce this container's namespace.
    Attach(ContainerAttach),
}

/// A starting container to attach: who it is, its policy, and its network
/// namespace, opened here so the daemon acts on this very namespace.
#[derive(Debug)]
pub(crate) struct ContainerAttach {
    pub(crate) id: String,
    pub(crate) pid: i32,
    pub(crate) policy: Option<PathBuf>,
    pub(crate) bundle: Option<String>,
    pub(crate) trust: Option<PathBuf>,
    /// The sources of its bind mounts, for the daemon to check against its
    /// own secrets and the policy's.
    pub(crate) binds: Vec<PathBuf>,
    /// Its root filesystem on the host, where the sandbox CA is put when the
    /// daemon hands one back.
    pub(crate) rootfs: Option<PathBuf>,
    pub(crate) netns: File,
}

/// Check the container described by `state` and say what to ask the
/// daemon. A container that could leave its namespace, or whose bind mounts
/// reach one of `secrets`, is refused, whatever started it.
pub(crate) fn plan(state: &OciState, secrets: &[Guarded]) -> Result<HookStep, OciError> {
    if state.is_stopped() {
        return Ok(HookStep::Release {
            id: state.id.clone(),
        });
    }
    let pid = state.pid.filter(|p| *p > 0).ok_or(OciError::NoPid)?;
    let bundle = state.bundle.as_deref().ok_or(OciError::NoBundle)?;
    let checked = check_bundle_confinement(bundle, secrets)?;
    match HookPlan::from_annotations(&state.annotations)? {
        HookPlan::CheckWrapped { inode } => {
            check_wrapped(pid, &inode)?;
            Ok(HookStep::Wrapped)
        }
        HookPlan::Attach {
            policy,
            bundle,
            trust,
        } => {
            for (what, path) in [(ANNOTATION_POLICY, &policy), (ANNOTATION_TRUST, &trust)] {
                if let Some(path) = path.as_ref().filter(|p| !p.is_absolute()) {
                    return Err(OciError::RelativePath {
                        what,
                        path: path.clone(),
                    });
                }
            }
            let path = container_netns_path(pid);
            let netns = File::open(&path).map_err(|cause| OciError::Netns { path, cause })?;
            Ok(HookStep::Attach(ContainerAttach {
                id: state.id.clone(),
                pid,
                policy,
                bundle,
                trust,
                binds: checked
                    .binds
                    .into_iter()
                    .map(|(source, _)| source)
                    .collect(),
                rootfs: checked.rootfs,
                netns,
            }))
        }
    }
}

/// `/proc/PID/ns/net` of the container's process.
pub(crate) fn container_netns_path(pid: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/ns/net"))
}

/// The wrapper's check: the container starts in namespace `expected`.
pub(crate) fn check_wrapped(pid: i32, expected: &str) -> Result<(), OciError> {
    let path = container_netns_path(pid);
    let actual = std::fs::read_link(&path)
        .map_err(|source| OciError::Netns {
            path: path.clone(),
            cause: source,
        })?
        .to_string_lossy()
        .into_owned();
    if actual == format!("net:[{expected}]") {
        Ok(())
    } else {
        Err(OciError::StaleWrapper {
            expected: expected.to_string(),
            actual,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_plan_comes_from_annotations() {
        let mut a = BTreeMap::new();
        assert!(matches!(
            HookPlan::from_annotations(&a),
            Err(OciError::NoPolicy)
        ));
        a.insert(ANNOTATION_POLICY.to_string(), "/p.yaml".to_string());
        assert!(matches!(
            HookPlan::from_annotations(&a).unwrap(),
            HookPlan::Attach {
                policy: Some(_),
                bundle: None,
                ..
            }
        ));
        a.insert(ANNOTATION_BUNDLE.to_string(), "/b".to_string());
        assert!(matches!(
            HookPlan::from_annotations(&a),
            Err(OciError::TwoPolicies)
        ));
        a.insert(ANNOTATION_NETNS.to_string(), "123".to_string());
        assert_eq!(
            HookPlan::from_annotations(&a).unwrap(),
            HookPlan::CheckWrapped {
                inode: "123".into()
            }
        );
    }

    #[test]
    fn oci_state_parses() {
        let state = OciState::parse(
            br#"{"ociVersion":"1.0.2","id":"abc","status":"creating","pid":42,"bundle":"/b","annotations":{"io.sluice.policy":"/p"}}"#,
        )
        .unwrap();
        assert_eq!(state.pid, Some(42));
        assert!(!state.is_stopped());
        assert!(OciState::parse(b"{").is_err());
    }
}
