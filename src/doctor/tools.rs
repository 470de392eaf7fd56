//! The checks of what is installed: podman, runc and the OCI hook for
//! containers; QEMU, /dev/kvm and the guest kit for microVMs. A program is
//! found on PATH and asked only `--version`, killed if it has not answered
//! within [`LIMIT`]; files are only read. Nothing here ever installs,
//! edits or starts anything else.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{Found, LIMIT};

/// `podman`: what `sluice oci` wraps and what starts the daemon's containers.
pub(super) fn podman() -> Found {
    version("podman", "apt-get install --no-install-recommends podman")
}

/// `runc`: the one OCI runtime podman works with on these machines.
pub(super) fn runc() -> Found {
    version("runc", "apt-get install --no-install-recommends runc")
}

/// `qemu`: the VMM sluice's microVM tests and bench run (`sluice vm`
/// runs any VMM, but this is the one tested).
pub(super) fn qemu() -> Found {
    version(
        "qemu-system-x86_64",
        "apt-get install --no-install-recommends qemu-system-x86",
    )
}

/// `program --version`'s first line, found on PATH.
fn version(program: &str, install: &str) -> Found {
    let Some(path) = on_path(program) else {
        return Found::lack(format!("{program} is not on PATH"), install);
    };
    match first_line_of_version(&path) {
        Ok(line) => Found::Have(format!("{} ({line})", path.display())),
        Err(why) => Found::lack(format!("{}: {why}", path.display()), install),
    }
}

use crate::program::{is_executable, on_path};

/// Run `path --version` (no input; killed if it has not answered within
/// [`LIMIT`]) and return the first line it printed.
fn first_line_of_version(path: &Path) -> Result<String, String> {
    let child = Command::new(path)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run it: {e}"))?;
    // A pidfd names this child and no other, even once it has been reaped.
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_child(&child),
        rustix::process::PidfdFlags::empty(),
    );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("sluice-doctor-wait".into())
        .spawn(move || {
            let _ = tx.send(child.wait_with_output());
        })
        .map_err(|e| format!("cannot start a thread to wait for it: {e}"))?;
    let output = match rx.recv_timeout(LIMIT) {
        Ok(output) => output.map_err(|e| format!("cannot read its output: {e}"))?,
        Err(_) => {
            if let Ok(pidfd) = &pidfd {
                let _ = rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
            }
            return Err(format!(
                "`--version` did not answer within {} s (killed)",
                LIMIT.as_secs()
            ));
        }
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().next().unwrap_or("").trim();
    if !output.status.success() || line.is_empty() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "`--version` failed ({}): {}",
            output.status,
            stderr.trim()
        ));
    }
    Ok(line.to_string())
}

/// What the hook file's arguments hold for sluice's hook.
const HOOK_COMMAND: &str = "oci-hook";
/// The hook file sluice ships, and where it goes.
const HOOK_FIX: &str = "install -D -m 0644 containers/hooks.d/sluice.json /etc/containers/oci/hooks.d/sluice.json (its hook.path is /usr/local/bin/sluice: install sluice there, or edit the path)";

/// `oci-hook`: a hook file in one of the hooks directories podman reads
/// (containers.conf's `hooks_dir`, else podman's defaults) that runs
/// `sluice oci-hook` at the createRuntime stage, from a program that
/// exists.
pub(super) fn oci_hook() -> Found {
    let dirs = crate::attach::oci_check::configured_hooks_dirs();
    let mut wrong = None;
    for dir in &dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        for file in files {
            match sluice_hook(&file) {
                None => {}
                Some(Ok(program)) => {
                    return Found::Have(format!(
                        "{} runs {} {HOOK_COMMAND}",
                        file.display(),
                        program.display()
                    ))
                }
                Some(Err(why)) => {
                    wrong.get_or_insert((file, why));
                }
            }
        }
    }
    match wrong {
        Some((file, why)) => Found::lack(
            format!("{}: {why}", file.display()),
            format!(
                "edit {}: hook.path must be the installed sluice (e.g. $(command -v sluice)) and stages must hold createRuntime",
                file.display()
            ),
        ),
        None => Found::lack(
            format!(
                "no hook running `sluice {HOOK_COMMAND}` in {}",
                dirs.join(", ")
            ),
            HOOK_FIX,
        ),
    }
}

/// Whether `file` is sluice's hook (its arguments hold `oci-hook`), and if
/// so the program it runs, or why it would not run.
fn sluice_hook(file: &Path) -> Option<Result<PathBuf, String>> {
    let text = std::fs::read_to_string(file).ok()?;
    let hook: serde_json::Value = serde_json::from_str(&text).ok()?;
    let args = hook.pointer("/hook/args")?.as_array()?;
    if !args.iter().any(|a| a.as_str() == Some(HOOK_COMMAND)) {
        return None;
    }
    let Some(program) = hook.pointer("/hook/path").and_then(|p| p.as_str()) else {
        return Some(Err("it names no hook.path".into()));
    };
    let program = PathBuf::from(program);
    if !is_executable(&program) {
        return Some(Err(format!(
            "its hook.path {} is not an executable file",
            program.display()
        )));
    }
    let stages = hook.pointer("/stages").and_then(|s| s.as_array());
    if !stages.is_some_and(|s| s.iter().any(|s| s.as_str() == Some("createRuntime"))) {
        return Some(Err("its stages do not hold createRuntime".into()));
    }
    Some(Ok(program))
}

/// The KVM device.
const KVM: &str = "/dev/kvm";

/// `kvm`: whether /dev/kvm opens; without it QEMU runs guests under TCG
/// emulation (`-accel tcg`), as sluice's tests do anyway.
pub(super) fn kvm() -> Found {
    match std::fs::OpenOptions::new().read(true).write(true).open(KVM) {
        Ok(_) => Found::Have(format!(
            "{KVM} opens (whether it runs guests is not checked; -accel tcg works without it)"
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Found::lack(
            format!("{KVM} does not exist: guests run under TCG emulation (-accel tcg), slower"),
            "modprobe kvm_intel (or kvm_amd) on a machine with hardware virtualisation, or run guests with -accel tcg",
        ),
        Err(e) => Found::lack(
            format!("cannot open {KVM}: {e}: guests run under TCG emulation (-accel tcg), slower"),
            "run the VMM as root or in group kvm, or run guests with -accel tcg",
        ),
    }
}

/// `guest-kit`: the kernel and initramfs of containers/vm/build-guest.sh,
/// where sluice's microVM tests and `sluice bench`'s vm conditions look
/// (`sluice vm` itself boots whatever its VMM is given).
pub(super) fn guest_kit() -> Found {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("sluice"));
    let dir = crate::testbed::guest::Kit::default_dir(&exe);
    match crate::testbed::guest::Kit::in_dir(&dir) {
        Ok(kit) => Found::Have(format!(
            "{} and {}",
            kit.kernel.display(),
            kit.initrd.display()
        )),
        Err(why) => Found::lack(
            format!("{why} (only sluice's microVM tests and `sluice bench` need it)"),
            "containers/vm/build-guest.sh (it prints kit=DIR), then export SLUICE_VM_KIT=DIR",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook_file(dir: &Path, path: &str, stages: &str) -> PathBuf {
        let file = dir.join("sluice.json");
        std::fs::write(
            &file,
            format!(
                r#"{{"version":"1.0.0","hook":{{"path":"{path}","args":["sluice","oci-hook"]}},"stages":[{stages}]}}"#
            ),
        )
        .unwrap();
        file
    }

    #[test]
    fn a_hook_file_is_sluices_when_it_runs_oci_hook_from_a_program_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        let file = hook_file(dir.path(), "/bin/sh", r#""createRuntime","poststop""#);
        assert_eq!(sluice_hook(&file), Some(Ok(PathBuf::from("/bin/sh"))));
        let file = hook_file(dir.path(), "/nonexistent/sluice", r#""createRuntime""#);
        let why = sluice_hook(&file).unwrap().unwrap_err();
        assert!(why.contains("/nonexistent/sluice"), "{why}");
        let file = hook_file(dir.path(), "/bin/sh", r#""poststop""#);
        assert!(sluice_hook(&file).unwrap().is_err());
        let other = dir.path().join("other.json");
        std::fs::write(&other, r#"{"hook":{"path":"/bin/sh","args":["x"]}}"#).unwrap();
        assert_eq!(sluice_hook(&other), None);
    }

    #[test]
    fn the_shipped_hook_file_is_recognised_as_sluices() {
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("containers/hooks.d/sluice.json");
        assert!(sluice_hook(&shipped).is_some());
    }

    #[test]
    fn a_program_not_on_path_is_a_lack_with_its_install_command() {
        let Found::Lack { detail, fix } = version("sluice-no-such-program", "apt-get install x")
        else {
            panic!("found a program that does not exist");
        };
        assert!(detail.contains("not on PATH"), "{detail}");
        assert_eq!(fix, "apt-get install x");
    }

    #[test]
    fn a_version_is_the_first_line_a_program_prints_and_a_failure_says_its_status() {
        let line = first_line_of_version(Path::new("/bin/echo")).unwrap();
        assert!(line.starts_with("echo (GNU coreutils)"), "{line}");
        // GNU false fails even when asked its version.
        let why = first_line_of_version(Path::new("/bin/false")).unwrap_err();
        assert!(why.contains("failed"), "{why}");
    }
}
