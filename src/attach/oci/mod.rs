//! OCI containers: the podman wrapper (`sluice oci -- podman run ...`) and
//! the OCI createRuntime hook (`sluice oci-hook`, in `hook`).
//!
//! This module owns what is specific to containers: checking a `podman run`
//! command line for options that would take the container out of the
//! sandbox namespace, adding the options that put it in, waiting for and
//! stopping a detached container, and reading the state an OCI runtime hands
//! a hook on stdin. It never decides policy and never touches nftables:
//! enforcing the namespace is `attach::prepare`'s job, serving it `app`'s,
//! talking to the daemon `daemon::client`'s.
//!
//! How the wrapper hands its namespace to podman: the namespace is the
//! anonymous one `sluice run` uses, and podman is given
//! `--network ns:/proc/<sluice pid>/fd/<namespace fd>`. runc opens that path
//! while it creates the container, which yields the very namespace sluice
//! holds (a magic link, valid for any root process while sluice runs).
//! Nothing is created on disk, so nothing can be left behind: no bind mount
//! under /run that a SIGKILLed sluice would leave holding a namespace open,
//! and no extra thread parked in the namespace. Once sluice is gone the path
//! is dead, so the container cannot be started again in a namespace without
//! sluice's listener: a later `podman start` fails to open it, and where the
//! OCI hook is installed the `io.sluice.netns` annotation added here lets the
//! hook refuse a start in any namespace but the one sluice enforced.

#[forbid(unsafe_code)]
pub(crate) mod ca_mount;
#[forbid(unsafe_code)]
pub(crate) mod hook;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::{Child, Command};

use super::Attachment;
use crate::workload::WorkloadPath;

/// Annotation the hook reads: a plain policy file.
pub(crate) const ANNOTATION_POLICY: &str = "io.sluice.policy";
/// Annotation the hook reads: a signed bundle (directory, .tar.gz or URL).
pub(crate) const ANNOTATION_BUNDLE: &str = "io.sluice.bundle";
/// Annotation the hook reads: the trust file for `io.sluice.bundle`.
pub(crate) const ANNOTATION_TRUST: &str = "io.sluice.trust";
/// Annotation the hook reads: the daemon's control socket.
pub(crate) const ANNOTATION_SOCKET: &str = "io.sluice.socket";
/// Annotation the wrapper adds: the inode of the namespace it enforces.
pub(crate) const ANNOTATION_NETNS: &str = "io.sluice.netns";

/// Errors of the podman wrapper and the hook's input.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OciError {
    #[error("sluice oci wraps `podman run ...` (got `{0}`): write `sluice oci [OPTIONS] -- podman run [PODMAN OPTIONS] IMAGE [COMMAND]`")]
    NotPodmanRun(String),
    #[error("`{option}` would {why}; sluice oci puts the container in its own sandbox namespace (--network ns:...), so leave `{option}` out")]
    Bypass { option: String, why: &'static str },
    #[error("cannot start `{program}`: {cause}; install podman (apt-get install --no-install-recommends podman runc) or give its path")]
    Spawn {
        program: String,
        cause: std::io::Error,
    },
    #[error("cannot read the container state on stdin: {0}; sluice oci-hook is an OCI createRuntime hook and expects the runtime's state JSON")]
    State(String),
    #[error(transparent)]
    Unconfined(#[from] super::oci_check::Refusal),
    #[error("{0}")]
    RefusedByHook(String),
    #[error("cannot read the container's runtime config {}: {cause}", path.display())]
    RuntimeConfig { path: PathBuf, cause: String },
    #[error("the container state has no pid: sluice oci-hook must run at the createRuntime stage (see containers/hooks.d/sluice.json)")]
    NoPid,
    #[error("the container has neither an io.sluice.policy nor an io.sluice.bundle annotation: add one (e.g. --annotation io.sluice.policy=/etc/sluice/policy.yaml), or do not install the hook for it")]
    NoPolicy,
    #[error("the container has both io.sluice.policy and io.sluice.bundle annotations: give one")]
    TwoPolicies,
    #[error("the container was created by `sluice oci` for namespace net:[{expected}], but it is starting in {actual}: that sluice is gone, so the container is not started; run it through `sluice oci` again")]
    StaleWrapper { expected: String, actual: String },
    #[error("cannot open the container's network namespace {}: {cause}", path.display())]
    Netns {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("the container state names no bundle: cannot check how the container is confined")]
    NoBundle,
    #[error("{what}={}: give an absolute path (the daemon reads it on the host)", path.display())]
    RelativePath { what: &'static str, path: PathBuf },
}

impl OciError {
    /// Whether the user's input is at fault (a command line, a container's
    /// configuration or annotations: exit status 2), rather than the
    /// environment (podman missing, a namespace gone).
    pub(crate) fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            OciError::Spawn { .. }
                | OciError::NoPid
                | OciError::StaleWrapper { .. }
                | OciError::Netns { .. }
        )
    }
}

/// A container's attachment: its network namespace is its own (the
/// wrapper's fresh one, or one the daemon checked has no link out), path
/// `oci`.
pub(crate) fn attachment() -> Attachment {
    Attachment::dedicated_namespace(WorkloadPath::Oci)
}

/// What a podman option does to the sandbox, if it is refused. These
/// options would replace the network namespace the wrapper gives the
/// container; how the container is confined otherwise (capabilities, PID
/// namespace, mounts) is checked on its final config by the hook the
/// wrapper adds (`oci_check`), not by spotting flags here.
fn refused(long: &str) -> Option<&'static str> {
    Some(match long {
        "network" | "net" => "put the container in another network namespace, around sluice",
        "pod" | "pod-id-file" => "put the container in a pod's network namespace, around sluice",
        _ => return None,
    })
}

/// Refuse a container that could leave the network namespace sluice
/// enforces, whatever started it: `config` is its OCI runtime config
/// (config.json in the bundle directory the runtime names in its state).
/// See `oci_check` for what is refused.
#[cfg(test)]
pub(crate) fn check_confinement(config: &serde_json::Value) -> Result<(), OciError> {
    super::oci_check::check(config, &[]).map_err(OciError::from)
}

/// Read the runtime config of the container whose OCI bundle is `bundle`
/// and check it as `check_confinement` does (the hook's check, for the
/// daemon's containers and the wrapper's alike); no bind may reach
/// `secrets`. Returns the container's bind mounts and its rootfs.
pub(crate) fn check_bundle_confinement(
    bundle: &Path,
    secrets: &[super::oci_check::Guarded],
) -> Result<super::oci_check::CheckedBundle, OciError> {
    super::oci_check::check_bundle(bundle, secrets)
}

/// `podman run` options that take no value (podman 4). Every other option
/// is assumed to take one: misjudging a flag as taking a value only ends the
/// option scan late (a needless refusal), never early (a missed `--network`).
const RUN_FLAGS: &[&str] = &[
    "detach",
    "disable-content-trust",
    "env-host",
    "help",
    "http-proxy",
    "init",
    "interactive",
    "no-healthcheck",
    "no-hosts",
    "oom-kill-disable",
    "passwd",
    "privileged",
    "publish-all",
    "quiet",
    "read-only",
    "read-only-tmpfs",
    "replace",
    "rm",
    "rmi",
    "rootfs",
    "sig-proxy",
    "tls-verify",
    "tty",
    "unsetenv-all",
];
/// Short `podman run` flags without a value: -d -i -t -P -q.
const RUN_SHORT_FLAGS: &[char] = &['d', 'i', 't', 'P', 'q'];
/// Global podman options (before `run`) that take no value.
const GLOBAL_FLAGS: &[&str] = &["help", "noout", "syslog", "version"];

/// A checked `podman [GLOBAL] run [OPTIONS] IMAGE [COMMAND]` command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodmanRun {
    argv: Vec<OsString>,
    /// Index in `argv` right after `run`, where sluice's options go.
    insert_at: usize,
    /// `-d` / `--detach`: podman returns once the container started.
    pub(crate) detach: bool,
    /// The user's own `--cidfile`, if any.
    pub(crate) cidfile: Option<PathBuf>,
}

impl PodmanRun {
    /// Check `argv` (`podman ... run ...`): refuse options that would take the
    /// container out of sluice's namespace.
    pub(crate) fn parse(argv: &[OsString]) -> Result<PodmanRun, OciError> {
        let shown = || {
            argv.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let Some(program) = argv.first() else {
            return Err(OciError::NotPodmanRun(String::new()));
        };
        let is_podman = Path::new(program)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("podman"));
        if !is_podman {
            return Err(OciError::NotPodmanRun(shown()));
        }
        // Global options, then `run` or `container run`.
        let mut i = 1;
        let run_at = loop {
            let Some(arg) = argv.get(i).map(|a| a.to_string_lossy()) else {
                return Err(OciError::NotPodmanRun(shown()));
            };
            if let Some(long) = arg.strip_prefix("--") {
                let takes_value = !long.contains('=') && !GLOBAL_FLAGS.contains(&long);
                i += if takes_value { 2 } else { 1 };
                continue;
            }
            if arg.starts_with('-') {
                i += 1;
                continue;
            }
            match arg.as_ref() {
                "run" => break i,
                "container" if argv.get(i + 1).is_some_and(|a| a == "run") => break i + 1,
                _ => return Err(OciError::NotPodmanRun(shown())),
            }
        };
        let mut run = PodmanRun {
            argv: argv.to_vec(),
            insert_at: run_at + 1,
            detach: false,
            cidfile: None,
        };
        run.scan_options()?;
        Ok(run)
    }

    /// Walk `run`'s options up to the image (podman stops parsing options at
    /// the first positional argument; what follows is the container's).
    fn scan_options(&mut self) -> Result<(), OciError> {
        let mut i = self.insert_at;
        while let Some(arg) = self.argv.get(i).map(|a| a.to_string_lossy().into_owned()) {
            if arg == "--" || !arg.starts_with('-') || arg == "-" {
                break;
            }
            if let Some(long) = arg.strip_prefix("--") {
                let (name, inline) = match long.split_once('=') {
                    Some((name, value)) => (name, Some(value.to_string())),
                    None => (long, None),
                };
                let flag = RUN_FLAGS.contains(&name);
                let value = match (&inline, flag) {
                    (Some(v), _) => Some(v.clone()),
                    (None, true) => None,
                    (None, false) => {
                        i += 1;
                        self.argv.get(i).map(|a| a.to_string_lossy().into_owned())
                    }
                };
                self.long_option(name, flag, value.as_deref())?;
            } else {
                // A cluster of short options: flags, possibly ending in one
                // that takes a value (attached or the next argument).
                let chars: Vec<char> = arg[1..].chars().collect();
                for (k, c) in chars.iter().enumerate() {
                    if RUN_SHORT_FLAGS.contains(c) {
                        if *c == 'd' {
                            self.detach = true;
                        }
                        continue;
                    }
                    if k + 1 == chars.len() {
                        i += 1;
                    }
                    break;
                }
            }
            i += 1;
        }
        Ok(())
    }

    fn long_option(&mut self, name: &str, flag: bool, value: Option<&str>) -> Result<(), OciError> {
        if let Some(why) = refused(name) {
            let off = flag && value.is_some_and(|v| v.eq_ignore_ascii_case("false"));
            if !off {
                return Err(OciError::Bypass {
                    option: format!("--{name}"),
                    why,
                });
            }
        }
        match name {
            "detach" => self.detach = value.is_none_or(|v| !v.eq_ignore_ascii_case("false")),
            "cidfile" => self.cidfile = value.map(PathBuf::from),
            _ => {}
        }
        Ok(())
    }

    /// The command line podman is run with: the user's, plus
    /// `--network ns:NETNS`, the annotation naming the namespace's inode,
    /// `--cidfile CIDFILE` unless the user gave one, and `extra` (more
    /// `run` options: the CA bundle's volume, environment), all among
    /// `run`'s options, before the user's own and the image.
    pub(crate) fn command_line(
        &self,
        netns: &Path,
        inode: u64,
        cidfile: &Path,
        extra: &[OsString],
    ) -> Vec<OsString> {
        let mut argv = self.argv[..self.insert_at].to_vec();
        let mut network = OsString::from("ns:");
        network.push(netns.as_os_str());
        argv.push("--network".into());
        argv.push(network);
        argv.push("--annotation".into());
        argv.push(format!("{ANNOTATION_NETNS}={inode}").into());
        if self.cidfile.is_none() {
            argv.push("--cidfile".into());
            argv.push(cidfile.into());
        }
        argv.extend_from_slice(extra);
        argv.extend_from_slice(&self.argv[self.insert_at..]);
        argv
    }

    /// Where podman will write the container id.
    pub(crate) fn cidfile_or<'a>(&'a self, ours: &'a Path) -> &'a Path {
        self.cidfile.as_deref().unwrap_or(ours)
    }

    /// The podman program (for `podman wait` / `podman stop`), with the
    /// user's global options (e.g. --root) so that those talk to the same
    /// storage.
    pub(crate) fn podman(&self) -> Vec<OsString> {
        let run_word = self.insert_at - 1;
        let mut base: Vec<OsString> = self.argv[..run_word].to_vec();
        if base.last().is_some_and(|a| a == "container") {
            base.pop();
        }
        base
    }
}

/// Start `argv` (podman) in sluice's own namespace, without the variables
/// `unset` (secrets sluice read from its environment: podman's `-e VAR` or
/// `--env-host` would hand them to the container). Like `sluice run`'s
/// workload, it is SIGTERMed if the thread that started it (the runtime's
/// main thread) dies; the container itself then keeps a namespace whose only
/// way out, sluice's listener, is gone.
pub(crate) fn spawn_podman(argv: &[OsString], unset: &[String]) -> Result<Child, OciError> {
    use crate::confine::child::{self, ChildSetup, Parent};
    let program = argv[0].to_string_lossy().into_owned();
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    for var in unset {
        cmd.env_remove(var);
    }
    child::prepare(
        &mut cmd,
        ChildSetup {
            restore_fd_limit: true,
            parent_death: Some(nix::sys::signal::Signal::SIGTERM),
            parent_alive: Some(Parent::Pid(nix::unistd::getpid())),
            ..ChildSetup::default()
        },
    );
    Command::from(cmd)
        .spawn()
        .map_err(|source| OciError::Spawn {
            program,
            cause: source,
        })
}

/// The container id in `cidfile`, once podman has written it whole.
pub(crate) fn read_cidfile(cidfile: &Path) -> Option<crate::sandbox_id::SandboxId> {
    let text = std::fs::read_to_string(cidfile).ok()?;
    let id = text.trim();
    if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        id.parse().ok()
    } else {
        None
    }
}

/// `podman wait ID`: started once a detached container runs; its stdout is
/// the container's exit status.
pub(crate) fn spawn_wait(podman: &[OsString], id: &str) -> Result<Child, OciError> {
    let mut cmd = Command::new(&podman[0]);
    cmd.args(&podman[1..])
        .args(["wait", "--interval", "100ms", id])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // Its own process group: a Ctrl-C at the terminal is sluice's to
        // answer (with `podman stop`), not a reason for it to end.
        .process_group(0)
        .kill_on_drop(true);
    cmd.spawn().map_err(|source| OciError::Spawn {
        program: podman[0].to_string_lossy().into_owned(),
        cause: source,
    })
}

/// What `podman wait`'s output says about the container's exit status.
pub(crate) fn wait_result(stdout: &[u8], stderr: &[u8]) -> Result<i32, String> {
    let text = String::from_utf8_lossy(stdout);
    match text.lines().last().map(str::trim).map(str::parse::<i32>) {
        Some(Ok(code)) => Ok(code),
        _ => Err(String::from_utf8_lossy(stderr).trim().to_string()),
    }
}

/// `podman stop --time GRACE ID`, asynchronously: the container's end shows
/// up in `podman wait`.
pub(crate) fn spawn_stop(
    podman: &[OsString],
    id: &str,
    grace: Duration,
) -> Result<Child, OciError> {
    let mut cmd = Command::new(&podman[0]);
    cmd.args(&podman[1..])
        .arg("stop")
        .arg("--time")
        .arg(grace.as_secs().to_string())
        .arg(id)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    cmd.spawn().map_err(|source| OciError::Spawn {
        program: podman[0].to_string_lossy().into_owned(),
        cause: source,
    })
}

/// For messages: an argv as one line.
pub(crate) fn shown(argv: &[impl AsRef<OsStr>]) -> String {
    argv.iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

impl crate::exit_class::Classified for OciError {
    /// As [`OciError::is_bad_input`] says.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        if self.is_bad_input() {
            crate::exit_class::ExitClass::BadInput
        } else {
            crate::exit_class::ExitClass::CannotEnforce
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    fn parse(s: &str) -> Result<PodmanRun, OciError> {
        PodmanRun::parse(&argv(s))
    }

    #[test]
    fn a_plain_run_is_accepted_and_gets_the_namespace_after_run() {
        let run = parse("podman --log-level warn run --rm -it img sh -c x").unwrap();
        assert!(!run.detach);
        let line = run.command_line(Path::new("/proc/1/fd/5"), 42, Path::new("/tmp/c"), &[]);
        assert_eq!(
            shown(&line),
            "podman --log-level warn run --network ns:/proc/1/fd/5 --annotation io.sluice.netns=42 --cidfile /tmp/c --rm -it img sh -c x"
        );
        assert_eq!(shown(&run.podman()), "podman --log-level warn");
    }

    #[test]
    fn extra_options_go_among_runs_options_before_the_image_and_its_command() {
        let extra = argv("--volume /b.pem:/etc/ssl/certs/ca-certificates.crt:ro --env A=1");
        for (given, expected) in [
            (
                "podman --root /r container run -e X=1 -v /a:/a img -e no --volume no",
                "podman --root /r container run --network ns:/n --annotation io.sluice.netns=1 --cidfile /c --volume /b.pem:/etc/ssl/certs/ca-certificates.crt:ro --env A=1 -e X=1 -v /a:/a img -e no --volume no",
            ),
            (
                "podman run img",
                "podman run --network ns:/n --annotation io.sluice.netns=1 --cidfile /c --volume /b.pem:/etc/ssl/certs/ca-certificates.crt:ro --env A=1 img",
            ),
        ] {
            let line = parse(given)
                .unwrap()
                .command_line(Path::new("/n"), 1, Path::new("/c"), &extra);
            assert_eq!(shown(&line), expected);
        }
    }

    #[test]
    fn container_run_is_accepted() {
        let run = parse("/usr/bin/podman container run img").unwrap();
        assert_eq!(shown(&run.podman()), "/usr/bin/podman");
    }

    #[test]
    fn network_options_are_refused_in_every_spelling() {
        for bad in [
            "podman run --network host img",
            "podman run --network=host img",
            "podman run --net host img",
            "podman run --net=none img",
            "podman run --rm -e A=1 --pod p img",
            "podman run --pod-id-file f img",
            "podman run -it --network=bridge img sh",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(matches!(err, OciError::Bypass { .. }), "{bad}: {err}");
        }
        let err = parse("podman run --network host img")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`--network` would put the container in another network namespace"),
            "{err}"
        );
    }

    #[test]
    fn options_of_the_container_command_are_not_podmans() {
        let run = parse("podman run --rm img ip --net host").unwrap();
        assert!(!run.detach);
        let run = parse("podman run -e X=1 -v /a:/b img --network host").unwrap();
        assert!(!run.detach);
    }

    #[test]
    fn an_unknown_option_is_assumed_to_take_a_value() {
        // `--future-flag` then `img`: treated as its value, so the scan goes
        // on into the command and finds --network there: refused, safely.
        assert!(parse("podman run --future-flag img --network host").is_err());
    }

    #[test]
    fn detach_and_cidfile_are_recognised() {
        assert!(parse("podman run -d img").unwrap().detach);
        assert!(parse("podman run -dit img").unwrap().detach);
        assert!(parse("podman run --detach img").unwrap().detach);
        assert!(!parse("podman run --detach=false img").unwrap().detach);
        let run = parse("podman run --cidfile /x/c -d img").unwrap();
        assert_eq!(run.cidfile.as_deref(), Some(Path::new("/x/c")));
        let line = run.command_line(Path::new("/n"), 1, Path::new("/ours"), &[]);
        assert!(!shown(&line).contains("/ours"));
    }

    #[test]
    fn a_short_option_with_a_value_consumes_the_next_argument() {
        // -e takes a value: "--network" here is the value of -e, "img" the image.
        let run = parse("podman run -e --network img").unwrap();
        assert!(!run.detach);
        assert!(parse("podman run -itw /w img").is_ok());
    }

    #[test]
    fn confinement_options_are_left_to_the_check_on_the_final_config() {
        for left in [
            "podman run --cap-add SYS_ADMIN img",
            "podman run --privileged img",
            "podman run --pid host img",
            "podman run --pid=ns:/proc/1/ns/pid img",
        ] {
            assert!(PodmanRun::parse(&argv(left)).is_ok(), "{left}");
        }
    }

    #[test]
    fn the_hook_refuses_a_container_that_could_leave_its_namespace() {
        let config = |caps: &[&str], pid: Option<&str>| {
            let mut namespaces =
                vec![serde_json::json!({"type": "network", "path": "/proc/1/ns/net"})];
            if let Some(path) = pid {
                namespaces.push(serde_json::json!({"type": "pid", "path": path}));
            }
            serde_json::json!({
                "process": {"capabilities": {"bounding": caps, "effective": caps}},
                "linux": {"namespaces": namespaces}
            })
        };
        assert!(check_confinement(&config(&["CAP_CHOWN"], Some(""))).is_ok());
        for bad in [
            config(&["CAP_CHOWN", "CAP_SYS_ADMIN"], Some("")),
            config(&["CAP_CHOWN"], None),
            config(&["CAP_CHOWN"], Some("/proc/42/ns/pid")),
            config(&["CAP_NET_ADMIN"], Some("")),
        ] {
            assert!(matches!(
                check_confinement(&bad),
                Err(OciError::Unconfined(_))
            ));
        }
    }

    #[test]
    fn other_commands_are_refused() {
        for bad in [
            "podman exec c sh",
            "docker run img",
            "podman",
            "podman --root /r",
        ] {
            assert!(
                matches!(parse(bad), Err(OciError::NotPodmanRun(_))),
                "{bad}"
            );
        }
    }
}
