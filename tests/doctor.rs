//! `sluice doctor` on this machine, and in environments where one part is
//! missing: a program not on PATH, a descriptor limit too low, no root,
//! libnftables hidden in a private mount namespace, the OCI hook absent or
//! installed in the hooks directory containers.conf names. Each asserts
//! what a user sees: the check's status and fix, and the exit status.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use serde_json::Value;

/// The exit status of a doctor that found something missing.
const NOT_READY: i32 = 3;

/// `sluice doctor ARGS --json` as `cmd` runs it (a wrapper's arguments
/// before the binary, if any): its exit status and its document.
fn doctor_json(mut cmd: Command, args: &[&str]) -> (i32, Value) {
    let out = cmd
        .args(args)
        .arg("--json")
        .output()
        .expect("run sluice doctor");
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}):\n{}\nstderr:\n{}",
            stdout(&out),
            stderr(&out)
        )
    });
    (out.status.code().expect("exited"), doc)
}

fn sluice() -> Command {
    Command::new(sluice_bin())
}

/// The check named `name` in a document.
fn check<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {doc:#}"))
}

fn fix(check: &Value) -> &str {
    check["fix"]
        .as_str()
        .unwrap_or_else(|| panic!("no fix in {check:#}"))
}

/// A containers.conf in `dir` whose hooks directory is `dir/hooks.d`.
fn containers_conf(dir: &Path) -> std::path::PathBuf {
    let hooks = dir.join("hooks.d");
    std::fs::create_dir_all(&hooks).unwrap();
    let conf = dir.join("containers.conf");
    std::fs::write(
        &conf,
        format!("[engine]\nhooks_dir = [\"{}\"]\n", hooks.display()),
    )
    .unwrap();
    conf
}

#[test]
fn on_this_machine_the_host_kind_is_ready_and_doctor_exits_0() {
    if !privileged() {
        return;
    }
    let out: Output = sluice()
        .args(["doctor", "--kind", "host"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("host: ready"), "{}", stdout(&out));
}

#[test]
fn the_json_report_says_host_is_ready_with_every_check_ok_or_a_warning() {
    if !privileged() {
        return;
    }
    let (code, doc) = doctor_json(sluice(), &["doctor", "--kind", "host"]);
    assert_eq!(code, 0, "{doc:#}");
    assert_eq!(doc["ok"], true, "{doc:#}");
    assert_eq!(doc["ready"]["host"], true, "{doc:#}");
    for name in ["root", "capabilities", "netns", "nftables", "seccomp"] {
        assert_eq!(check(&doc, name)["status"], "ok", "{doc:#}");
    }
    for c in doc["checks"].as_array().unwrap() {
        assert!(c["status"] == "ok" || c["status"] == "warn", "{c:#}");
        assert_eq!(c["kinds"], serde_json::json!(["host"]), "{c:#}");
        assert!(c["detail"].as_str().is_some_and(|d| !d.is_empty()), "{c:#}");
    }
}

#[test]
fn a_program_missing_from_path_is_missing_with_its_install_command() {
    let mut cmd = sluice();
    cmd.env("PATH", "/nonexistent");
    let (code, doc) = doctor_json(cmd, &["doctor", "--kind", "oci"]);
    assert_eq!(code, NOT_READY, "{doc:#}");
    assert_eq!(doc["ready"]["oci"], false);
    let podman = check(&doc, "podman");
    assert_eq!(podman["status"], "missing", "{podman:#}");
    assert!(podman["detail"].as_str().unwrap().contains("not on PATH"));
    assert!(fix(podman).contains("apt-get install"), "{podman:#}");
    assert!(fix(podman).contains("podman"), "{podman:#}");
    assert_eq!(check(&doc, "runc")["status"], "missing");
}

#[test]
fn a_descriptor_limit_below_max_connections_is_missing_with_the_limit_that_fixes_it() {
    let Some(prlimit) = tool_path("prlimit") else {
        eprintln!("SKIPPED: prlimit not installed (apt-get install util-linux)");
        return;
    };
    // 1,024 descriptors hold 128 connections at 6 each (256 kept aside).
    let mut cmd = Command::new(prlimit);
    cmd.args(["--nofile=1024:1024", sluice_bin()]);
    let (code, doc) = doctor_json(
        cmd,
        &["doctor", "--kind", "host", "--max-connections", "129"],
    );
    assert_eq!(code, NOT_READY, "{doc:#}");
    let descriptors = check(&doc, "descriptors");
    assert_eq!(descriptors["status"], "missing", "{descriptors:#}");
    assert!(
        descriptors["detail"]
            .as_str()
            .unwrap()
            .contains("holds 128 connections"),
        "{descriptors:#}"
    );
    // 256 + 6 x 129.
    assert!(
        fix(descriptors).contains("LimitNOFILE=1030"),
        "{descriptors:#}"
    );
}

#[test]
fn the_same_limit_is_enough_for_the_connections_it_holds() {
    let Some(prlimit) = tool_path("prlimit") else {
        eprintln!("SKIPPED: prlimit not installed (apt-get install util-linux)");
        return;
    };
    let mut cmd = Command::new(prlimit);
    cmd.args(["--nofile=1024:1024", sluice_bin()]);
    let (_, doc) = doctor_json(
        cmd,
        &["doctor", "--kind", "host", "--max-connections", "128"],
    );
    assert_eq!(check(&doc, "descriptors")["status"], "ok", "{doc:#}");
}

#[test]
fn without_root_root_is_missing_and_doctor_exits_3() {
    let cmd = if nix::unistd::geteuid().is_root() {
        let Some(setpriv) = tool_path("setpriv") else {
            eprintln!("SKIPPED: setpriv not installed (apt-get install util-linux)");
            return;
        };
        let mut cmd = Command::new(setpriv);
        cmd.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            sluice_bin(),
        ]);
        cmd
    } else {
        sluice()
    };
    let (code, doc) = doctor_json(cmd, &["doctor"]);
    assert_eq!(code, NOT_READY, "{doc:#}");
    assert_eq!(doc["ready"]["host"], false);
    let root = check(&doc, "root");
    assert_eq!(root["status"], "missing", "{root:#}");
    assert!(fix(root).contains("as root"), "{root:#}");
    assert_eq!(check(&doc, "netns")["status"], "missing", "{doc:#}");
}

#[test]
fn with_libnftables_hidden_in_a_mount_namespace_vm_lacks_it_and_host_is_still_ready() {
    if !privileged() {
        return;
    }
    let Some(library) = libnftables_path() else {
        panic!("libnftables.so.1 is not installed, yet this machine passed the privileged check");
    };
    // A private mount namespace of the doctor's own, where the library
    // reads as empty; it ends with the doctor.
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind /dev/null "$1" && shift && exec "$@""#)
        .args(["sh", library.to_str().unwrap(), sluice_bin()]);
    let (code, doc) = doctor_json(cmd, &["doctor", "--kind", "host,vm"]);
    assert_eq!(code, NOT_READY, "{doc:#}");
    assert_eq!(doc["ready"]["host"], true, "{doc:#}");
    assert_eq!(doc["ready"]["vm"], false, "{doc:#}");
    let lib = check(&doc, "libnftables");
    assert_eq!(lib["status"], "missing", "{lib:#}");
    assert_eq!(lib["required_by"], serde_json::json!(["vm"]), "{lib:#}");
    assert!(fix(lib).contains("apt-get install nftables"), "{lib:#}");
    assert_eq!(check(&doc, "tap-fence")["status"], "missing", "{doc:#}");
    assert_eq!(check(&doc, "nftables")["status"], "ok", "{doc:#}");
}

/// The file libnftables.so.1 is (the target of its symlink), as the
/// dynamic linker's cache names it.
fn libnftables_path() -> Option<std::path::PathBuf> {
    let out = Command::new("ldconfig").arg("-p").output().ok()?;
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = listing
        .lines()
        .find(|l| l.trim_start().starts_with("libnftables.so.1 "))?;
    let path = line.rsplit("=> ").next()?.trim();
    std::fs::canonicalize(path).ok()
}

#[test]
fn without_the_hook_the_daemon_kind_misses_it_and_says_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = sluice();
    cmd.env("CONTAINERS_CONF", containers_conf(dir.path()));
    let (code, doc) = doctor_json(cmd, &["doctor", "--kind", "daemon"]);
    assert_eq!(code, NOT_READY, "{doc:#}");
    let hook = check(&doc, "oci-hook");
    assert_eq!(hook["status"], "missing", "{hook:#}");
    assert!(
        hook["detail"].as_str().unwrap().contains("hooks.d"),
        "{hook:#}"
    );
    assert!(
        fix(hook).contains("containers/hooks.d/sluice.json"),
        "{hook:#}"
    );
}

#[test]
fn the_hook_in_the_hooks_directory_containers_conf_names_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let conf = containers_conf(dir.path());
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("containers/hooks.d/sluice.json"),
    )
    .unwrap();
    let mut hook: Value = serde_json::from_str(&shipped).unwrap();
    hook["hook"]["path"] = sluice_bin().into();
    let file = dir.path().join("hooks.d/sluice.json");
    std::fs::write(&file, hook.to_string()).unwrap();
    let mut cmd = sluice();
    cmd.env("CONTAINERS_CONF", &conf);
    let (_, doc) = doctor_json(cmd, &["doctor", "--kind", "daemon"]);
    let found = check(&doc, "oci-hook");
    assert_eq!(found["status"], "ok", "{found:#}");
    assert!(
        found["detail"]
            .as_str()
            .unwrap()
            .contains(file.to_str().unwrap()),
        "{found:#}"
    );
}
