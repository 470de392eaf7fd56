//! The one confinement check for containers, on the final OCI runtime
//! config (config.json in the container's bundle), whichever way the
//! container was started: the daemon's hook runs it, and so does the hook
//! `sluice oci` adds for its own container (podman `--hooks-dir`), so that
//! neither relies on spotting podman's flags. A container is refused if it
//! could reach around the network namespace sluice enforces: CAP_SYS_ADMIN,
//! a PID or mount namespace that is not its own, or CAP_NET_ADMIN, unless
//! the user opts in with the `io.sluice.allow-net-admin=true` annotation,
//! and even then never together with a way to name another network
//! namespace (a bind of /proc, of /run/netns, of a namespace file). A bind
//! mount that reaches one of sluice's secrets is refused too: the audit
//! log's checkpoint signing key (whoever reads it can forge checkpoints)
//! and the policy's secret files (which sluice injects so that the
//! container never holds them).
//! Every reason is reported at once, each naming the podman option that
//! causes it.
//!
//! This module never starts or changes a container: it reads its config and
//! says yes or no.

#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Annotation that allows CAP_NET_ADMIN (never with a way to reach another
/// namespace).
pub(crate) const ANNOTATION_ALLOW_NET_ADMIN: &str = "io.sluice.allow-net-admin";

/// Set in the environment of the hook `sluice oci` adds: where the hook
/// writes why it refused the container, for the wrapper to say it.
pub(crate) const REPORT_ENV: &str = "SLUICE_OCI_REPORT";
/// That file's name in the wrapper's private directory.
pub(crate) const REPORT_FILE: &str = "refused";

/// Paths whose bind gives a container a handle on other namespaces.
const NAMESPACE_HANDLES: [&str; 3] = ["/proc", "/run/netns", "/var/run/netns"];

/// nsfs's magic number (a bind-mounted namespace file).
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Why a container is refused: every reason found, each naming the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the container would leave the sandbox: {}", reasons.join("; "))]
pub(crate) struct Refusal {
    pub(crate) reasons: Vec<String>,
}

/// Check the final OCI runtime config of a container; `secrets` are files
/// no bind mount may reach (those that do not exist are not checked).
pub(crate) fn check(config: &Value, secrets: &[Guarded]) -> Result<(), Refusal> {
    let mut reasons = Vec::new();
    let caps = &config["process"]["capabilities"];
    let has = |cap: &str| {
        [
            "bounding",
            "effective",
            "permitted",
            "ambient",
            "inheritable",
        ]
        .iter()
        .filter_map(|set| caps[set].as_array())
        .flatten()
        .any(|c| c.as_str() == Some(cap))
    };
    if has("CAP_SYS_ADMIN") {
        reasons.push(
            "it has CAP_SYS_ADMIN (podman --privileged, or --cap-add SYS_ADMIN or ALL), with which it could enter another network namespace (setns) around sluice: start it without".to_string(),
        );
    }
    let namespaces = config["linux"]["namespaces"].as_array();
    let namespace = |kind: &str| namespaces.and_then(|ns| ns.iter().find(|n| n["type"] == kind));
    let joined = |n: &Value| {
        n["path"]
            .as_str()
            .filter(|p| !p.is_empty())
            .map(str::to_string)
    };
    match namespace("pid") {
        None => reasons.push(
            "it shares the host's PID namespace (podman --pid host), whose processes' sockets and namespaces lead around sluice: leave out --pid".to_string(),
        ),
        Some(n) => {
            if let Some(path) = joined(n) {
                reasons.push(format!(
                    "it joins the PID namespace {path} (podman --pid ns:PATH or --pid container:ID), whose processes' sockets and namespaces lead around sluice: leave out --pid"
                ));
            }
        }
    }
    if let Some(path) = namespace("mount").and_then(joined) {
        reasons.push(format!(
            "it joins the mount namespace {path}, whose /proc leads to other processes' namespaces: give it its own"
        ));
    }
    if has("CAP_NET_ADMIN") {
        let allowed = config["annotations"][ANNOTATION_ALLOW_NET_ADMIN]
            .as_str()
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if !allowed {
            reasons.push(format!(
                "it has CAP_NET_ADMIN (podman --cap-add NET_ADMIN or ALL), with which it can change its namespace's rules and links: leave it out, or if the container needs it, opt in with --annotation {ANNOTATION_ALLOW_NET_ADMIN}=true (it then may not reach another namespace)"
            ));
        }
        for (source, destination) in namespace_binds(config) {
            reasons.push(format!(
                "it has CAP_NET_ADMIN and the bind mount of {} at {destination} (podman -v or --mount), through which it can name another network namespace and move the sandbox's link there: drop the mount or CAP_NET_ADMIN",
                source.display()
            ));
        }
    }
    reasons.extend(secret_binds(&bind_sources(config), secrets));
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(Refusal { reasons })
    }
}

/// A file of sluice's that no bind mount of a container may reach, and
/// what it is (for the reason given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Guarded {
    pub(crate) path: PathBuf,
    pub(crate) kind: GuardedKind,
}

/// What a [`Guarded`] file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GuardedKind {
    /// An audit checkpoint signing key: whoever reads it can forge the
    /// audit log's checkpoints.
    CheckpointKey,
    /// A `file:` secret of the policy: sluice injects it into requests so
    /// that the container never holds it.
    PolicySecret,
}

impl Guarded {
    /// Audit checkpoint keys.
    pub(crate) fn keys(paths: impl IntoIterator<Item = PathBuf>) -> Vec<Guarded> {
        Guarded::all(paths, GuardedKind::CheckpointKey)
    }

    /// The policy's secret files.
    pub(crate) fn policy_secrets(paths: impl IntoIterator<Item = PathBuf>) -> Vec<Guarded> {
        Guarded::all(paths, GuardedKind::PolicySecret)
    }

    fn all(paths: impl IntoIterator<Item = PathBuf>, kind: GuardedKind) -> Vec<Guarded> {
        paths
            .into_iter()
            .map(|path| Guarded { path, kind })
            .collect()
    }

    /// The files of a policy's `file:` secrets.
    pub(crate) fn of_policy(policy: &crate::policy::Policy) -> Vec<Guarded> {
        Guarded::policy_secrets(policy.secrets().iter().filter_map(|s| match &s.source {
            crate::policy::SecretSource::File(path) => Some(path.clone()),
            _ => None,
        }))
    }
}

/// Why each bind of `sources` (source, destination if known) that is,
/// holds or lies in one of `guarded` (that exists) is refused: one reason
/// per bind.
pub(crate) fn secret_binds(sources: &[(PathBuf, String)], guarded: &[Guarded]) -> Vec<String> {
    let guarded: Vec<(PathBuf, GuardedKind)> = guarded
        .iter()
        .filter_map(|g| Some((std::fs::canonicalize(&g.path).ok()?, g.kind)))
        .collect();
    let mut reasons = Vec::new();
    for (source, destination) in sources {
        let resolved = std::fs::canonicalize(source).unwrap_or_else(|_| source.clone());
        let reached = guarded.iter().find(|(secret, _)| {
            [source, &resolved]
                .iter()
                .any(|p| secret.starts_with(p) || p.starts_with(secret))
        });
        if let Some((secret, kind)) = reached {
            let at = if destination.is_empty() {
                String::new()
            } else {
                format!(" at {destination}")
            };
            let what = match kind {
                GuardedKind::CheckpointKey => {
                    "sluice's audit checkpoint signing key, with which it could forge the audit log's checkpoints"
                }
                GuardedKind::PolicySecret => {
                    "a secret file of the policy, which sluice injects into requests so that the container never holds it"
                }
            };
            reasons.push(format!(
                "its bind mount of {}{at} (podman -v or --mount) holds {}, {what}: mount a directory that does not hold it",
                source.display(),
                secret.display()
            ));
        }
    }
    reasons
}

/// The bind mounts of a config: (source, destination).
pub(crate) fn bind_sources(config: &Value) -> Vec<(PathBuf, String)> {
    let Some(mounts) = config["mounts"].as_array() else {
        return Vec::new();
    };
    mounts
        .iter()
        .filter(|m| {
            m["type"] == "bind"
                || m["options"]
                    .as_array()
                    .is_some_and(|o| o.iter().any(|o| o == "bind" || o == "rbind"))
        })
        .filter_map(|m| {
            let source = PathBuf::from(m["source"].as_str()?);
            let destination = m["destination"].as_str().unwrap_or("?").to_string();
            Some((source, destination))
        })
        .collect()
}

/// Bind mounts of the config that are, hold, or lie in a path with handles
/// on other namespaces, or are a namespace file themselves: (source,
/// destination).
fn namespace_binds(config: &Value) -> Vec<(PathBuf, String)> {
    bind_sources(config)
        .into_iter()
        .filter(|(source, _)| reaches_namespaces(source))
        .collect()
}

fn reaches_namespaces(source: &Path) -> bool {
    let resolved = std::fs::canonicalize(source).unwrap_or_else(|_| source.to_path_buf());
    let near = |p: &Path| {
        NAMESPACE_HANDLES
            .iter()
            .map(Path::new)
            .any(|h| p.starts_with(h) || h.starts_with(p))
    };
    // f_type's integer type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    let nsfs = nix::sys::statfs::statfs(&resolved)
        .is_ok_and(|s| s.filesystem_type().0 as i64 == NSFS_MAGIC);
    near(source) || near(&resolved) || nsfs
}

/// What the hook needs of a container's runtime config once it passed
/// [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckedBundle {
    /// Its bind mounts (source, destination), for the daemon to check
    /// against its own secrets.
    pub(crate) binds: Vec<(PathBuf, String)>,
    /// Its root filesystem on the host (`root.path`, made absolute against
    /// the bundle directory).
    pub(crate) rootfs: Option<PathBuf>,
}

/// Read the runtime config of the container whose OCI bundle is `bundle`
/// and [`check`] it. When the hook runs for `sluice oci` ([`REPORT_ENV`]
/// set), a refusal is also written where the wrapper reads it.
pub(crate) fn check_bundle(
    bundle: &Path,
    secrets: &[Guarded],
) -> Result<CheckedBundle, super::oci::OciError> {
    let path = bundle.join("config.json");
    let config: Value = std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|bytes| serde_json::from_slice(&bytes).map_err(|e| e.to_string()))
        .map_err(|cause| super::oci::OciError::RuntimeConfig { path, cause })?;
    check(&config, secrets).map_err(|refusal| {
        if let Some(report) = std::env::var_os(REPORT_ENV) {
            let _ = std::fs::write(report, refusal.to_string());
        }
        super::oci::OciError::from(refusal)
    })?;
    let rootfs = config["root"]["path"]
        .as_str()
        .filter(|p| !p.is_empty())
        .map(|p| bundle.join(p));
    Ok(CheckedBundle {
        binds: bind_sources(&config),
        rootfs,
    })
}

/// The hook `sluice oci` adds to podman for its own container: a hooks
/// directory of its own in the wrapper's private directory, holding one
/// createRuntime hook that runs `sluice oci-hook` for the container carrying
/// this wrapper's namespace annotation.
pub(crate) struct WrapperHook {
    dir: PathBuf,
}

/// The wrapper's hook file: named to sort (and so run) before other hooks,
/// so that its refusal is the one written down.
const HOOK_FILE: &str = "00-sluice-oci-wrapper.json";

/// Where podman looks for hooks when not told (its built-in default):
/// passing `--hooks-dir` replaces that list, so it is passed on too.
const PODMAN_HOOKS_DIRS: [&str; 2] = [
    "/usr/share/containers/oci/hooks.d",
    "/etc/containers/oci/hooks.d",
];

impl WrapperHook {
    /// Write the hook file into `private` (a directory only root may
    /// enter), for the container annotated with namespace `inode`; no bind
    /// mount of that container may reach `secrets`.
    pub(crate) fn install(
        private: &Path,
        inode: u64,
        secrets: &[Guarded],
    ) -> std::io::Result<WrapperHook> {
        let dir = private.join("hooks.d");
        std::fs::create_dir_all(&dir)?;
        let report = private.join(REPORT_FILE);
        let sluice = std::env::current_exe()?;
        let mut args = vec!["sluice".to_string(), "oci-hook".to_string()];
        for secret in secrets {
            let option = match secret.kind {
                GuardedKind::CheckpointKey => "--secret",
                GuardedKind::PolicySecret => "--policy-secret",
            };
            args.push(option.to_string());
            args.push(secret.path.display().to_string());
        }
        let hook = serde_json::json!({
            "version": "1.0.0",
            "hook": {
                "path": sluice,
                "args": args,
                "env": [format!("{REPORT_ENV}={}", report.display())],
                "timeout": 30
            },
            "when": {
                "annotations": {
                    format!("^{}$", regex_escape(super::oci::ANNOTATION_NETNS)): format!("^{inode}$")
                }
            },
            "stages": ["createRuntime"]
        });
        std::fs::write(dir.join(HOOK_FILE), hook.to_string())?;
        Ok(WrapperHook { dir })
    }

    /// `argv` (a `podman ... run ...` command line) with `--hooks-dir` for
    /// this hook, after the hooks podman would have used anyway: the user's
    /// own `--hooks-dir`s if given, else the directories containers.conf
    /// names, else podman's defaults.
    pub(crate) fn command_line(&self, argv: Vec<OsString>, globals: &[OsString]) -> Vec<OsString> {
        let user_gave = globals
            .iter()
            .any(|a| a == "--hooks-dir" || a.to_string_lossy().starts_with("--hooks-dir="));
        let mut dirs: Vec<OsString> = Vec::new();
        if !user_gave {
            dirs.extend(configured_hooks_dirs().into_iter().map(OsString::from));
        }
        dirs.push(self.dir.clone().into_os_string());
        let mut out = Vec::with_capacity(argv.len() + 2 * dirs.len());
        let mut rest = argv.into_iter();
        out.extend(rest.next());
        for dir in dirs {
            out.push("--hooks-dir".into());
            out.push(dir);
        }
        out.extend(rest);
        out
    }
}

/// The `hooks_dir` list podman's containers.conf gives ($CONTAINERS_CONF,
/// else the system files), or podman's default list (where `sluice doctor`
/// looks for the hook, too).
pub(crate) fn configured_hooks_dirs() -> Vec<String> {
    let files: Vec<PathBuf> = match std::env::var_os("CONTAINERS_CONF") {
        Some(conf) => vec![PathBuf::from(conf)],
        None => vec![
            PathBuf::from("/etc/containers/containers.conf"),
            PathBuf::from("/usr/share/containers/containers.conf"),
        ],
    };
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let Ok(conf) = text.parse::<toml::Table>() else {
            continue;
        };
        if let Some(dirs) = conf
            .get("engine")
            .and_then(|e| e.get("hooks_dir"))
            .and_then(|d| d.as_array())
        {
            return dirs
                .iter()
                .filter_map(|d| d.as_str().map(str::to_string))
                .collect();
        }
    }
    PODMAN_HOOKS_DIRS.iter().map(|d| d.to_string()).collect()
}

fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

impl crate::exit_class::Classified for Refusal {
    /// A container whose config could leave its namespace: the user's to change.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::BadInput
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(caps: &[&str], pid: Option<&str>, mounts: Value, annotations: Value) -> Value {
        let mut namespaces = vec![json!({"type": "network", "path": "/proc/1/fd/5"})];
        if let Some(path) = pid {
            namespaces.push(json!({"type": "pid", "path": path}));
        }
        json!({
            "process": {"capabilities": {"bounding": caps, "effective": caps}},
            "linux": {"namespaces": namespaces},
            "mounts": mounts,
            "annotations": annotations,
        })
    }

    fn reasons(c: &Value) -> Vec<String> {
        check(c, &[]).err().map(|r| r.reasons).unwrap_or_default()
    }

    #[test]
    fn a_plain_container_passes() {
        let c = config(&["CAP_CHOWN"], Some(""), json!([]), json!({}));
        assert_eq!(check(&c, &[]), Ok(()));
    }

    #[test]
    fn every_way_to_another_pid_namespace_is_refused_and_named() {
        let host = reasons(&config(&[], None, json!([]), json!({})));
        assert!(host[0].contains("--pid host"), "{host:?}");
        let joined = reasons(&config(&[], Some("/proc/42/ns/pid"), json!([]), json!({})));
        assert!(joined[0].contains("/proc/42/ns/pid"), "{joined:?}");
        assert!(joined[0].contains("--pid ns:PATH or --pid container:ID"));
    }

    #[test]
    fn sys_admin_is_refused_and_names_the_option() {
        let r = reasons(&config(&["CAP_SYS_ADMIN"], Some(""), json!([]), json!({})));
        assert_eq!(r.len(), 1);
        assert!(r[0].contains("--privileged"), "{r:?}");
    }

    #[test]
    fn joining_a_mount_namespace_by_path_is_refused_and_its_own_is_not() {
        let mut joined = config(&[], Some(""), json!([]), json!({}));
        joined["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "mount", "path": "/proc/1/ns/mnt"}));
        let r = reasons(&joined);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].contains("joins the mount namespace /proc/1/ns/mnt"),
            "{r:?}"
        );
        for ns in [
            json!({"type": "mount"}),
            json!({"type": "mount", "path": ""}),
        ] {
            let mut own = config(&[], Some(""), json!([]), json!({}));
            own["linux"]["namespaces"].as_array_mut().unwrap().push(ns);
            assert_eq!(check(&own, &[]), Ok(()), "{own}");
        }
    }

    #[test]
    fn net_admin_needs_the_annotation() {
        let r = reasons(&config(&["CAP_NET_ADMIN"], Some(""), json!([]), json!({})));
        assert!(r[0].contains(ANNOTATION_ALLOW_NET_ADMIN), "{r:?}");
        let opted = config(
            &["CAP_NET_ADMIN"],
            Some(""),
            json!([{"destination": "/data", "type": "bind", "source": "/srv/data", "options": ["rbind"]}]),
            json!({ANNOTATION_ALLOW_NET_ADMIN: "true"}),
        );
        assert_eq!(check(&opted, &[]), Ok(()));
    }

    #[test]
    fn net_admin_with_a_handle_on_another_namespace_is_refused_even_when_allowed() {
        for source in [
            "/run/netns",
            "/proc",
            "/proc/1/ns",
            "/",
            "/run",
            "/var/run/netns/x",
        ] {
            let c = config(
                &["CAP_NET_ADMIN"],
                Some(""),
                json!([{"destination": "/x", "type": "bind", "source": source, "options": ["rbind", "rw"]}]),
                json!({ANNOTATION_ALLOW_NET_ADMIN: "true"}),
            );
            let r = reasons(&c);
            assert_eq!(r.len(), 1, "{source}: {r:?}");
            assert!(r[0].contains("move the sandbox's link"), "{source}: {r:?}");
        }
    }

    #[test]
    fn every_reason_is_reported_at_once() {
        let r = reasons(&config(
            &["CAP_SYS_ADMIN", "CAP_NET_ADMIN"],
            None,
            json!([]),
            json!({}),
        ));
        assert_eq!(r.len(), 3, "{r:?}");
    }

    #[test]
    fn a_bind_that_reaches_the_audit_key_is_refused_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let key = state.join("audit.key");
        std::fs::write(&key, "secret").unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let bind = |source: &Path| {
            config(
                &[],
                Some(""),
                json!([{"destination": "/x", "type": "bind", "source": source, "options": ["rbind"]}]),
                json!({}),
            )
        };
        let secrets = Guarded::keys([key.clone()]);
        for reaching in [dir.path(), &state, &key] {
            let r = check(&bind(reaching), &secrets)
                .err()
                .map(|r| r.reasons)
                .unwrap_or_default();
            assert_eq!(r.len(), 1, "{reaching:?}: {r:?}");
            assert!(r[0].contains("audit checkpoint signing key"), "{r:?}");
        }
        assert_eq!(check(&bind(&dir.path().join("data")), &secrets), Ok(()));
        // A key that does not exist (yet) refuses nothing.
        assert_eq!(
            check(&bind(&state), &Guarded::keys([state.join("none")])),
            Ok(())
        );
    }

    #[test]
    fn a_bind_that_reaches_a_policy_secret_file_is_refused_and_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("gh-token");
        std::fs::write(&secret, "s3cret").unwrap();
        let c = config(
            &[],
            Some(""),
            json!([{"destination": "/x", "type": "bind", "source": dir.path(), "options": ["rbind"]}]),
            json!({}),
        );
        let r = check(&c, &Guarded::policy_secrets([secret.clone()]))
            .err()
            .map(|r| r.reasons)
            .unwrap_or_default();
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].contains("a secret file of the policy"), "{r:?}");
        assert!(r[0].contains("gh-token"), "{r:?}");
    }

    #[test]
    fn the_wrapper_hook_passes_policy_secrets_apart_from_keys() {
        let dir = tempfile::tempdir().unwrap();
        let mut guarded = Guarded::keys([PathBuf::from("/k")]);
        guarded.extend(Guarded::policy_secrets([PathBuf::from("/s")]));
        WrapperHook::install(dir.path(), 7, &guarded).unwrap();
        let file: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("hooks.d/00-sluice-oci-wrapper.json"))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            file["hook"]["args"],
            json!([
                "sluice",
                "oci-hook",
                "--secret",
                "/k",
                "--policy-secret",
                "/s"
            ])
        );
    }

    #[test]
    fn the_wrapper_hook_goes_before_run_after_the_hooks_podman_would_use() {
        let dir = tempfile::tempdir().unwrap();
        let hook = WrapperHook::install(dir.path(), 42, &[]).unwrap();
        let argv: Vec<OsString> = ["podman", "--root", "/r", "run", "img"]
            .iter()
            .map(OsString::from)
            .collect();
        let globals: Vec<OsString> = ["podman", "--hooks-dir", "/mine"]
            .iter()
            .map(OsString::from)
            .collect();
        let line = hook.command_line(argv.clone(), &globals);
        let shown: Vec<String> = line.iter().map(|a| a.to_string_lossy().into()).collect();
        assert_eq!(shown[0], "podman");
        assert_eq!(shown[1], "--hooks-dir");
        assert!(shown[2].ends_with("hooks.d"), "{shown:?}");
        assert_eq!(&shown[3..], ["--root", "/r", "run", "img"]);
        let file =
            std::fs::read_to_string(dir.path().join("hooks.d/00-sluice-oci-wrapper.json")).unwrap();
        assert!(file.contains(r#""^io\\.sluice\\.netns$":"^42$""#), "{file}");
    }
}
