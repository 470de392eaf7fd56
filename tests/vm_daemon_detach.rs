//! Detaching a VM through `sluice daemon`: a release (a plain
//! `DELETE /v1/sandboxes/ID`) keeps the tap's fence, `sluice vm detach
//! --daemon --id ID` releases the VM and removes its fence, and what the
//! command says when the id or the daemon is not there. A real daemon and a
//! real namespace with a tap made by the test; no guest boots (a process
//! stands in for the VMM). Needs root; skips loudly without it, fails under
//! SLUICE_REQUIRE_PRIVILEGED=1.

mod common;

use std::path::Path;

use common::daemon::{fence_tables, nft_tables, Daemon, StandInVmm};
use common::vm::add_tap;
use common::*;

const TAP: &str = "tap0";
const MAC: &str = "52:54:00:5c:fe:02";
const GUEST: &str = "198.19.254.2/30";

const POLICY: &str = "version: 1\nname: detach\nrules:\n  - name: origin\n    action: allow\n    cidrs: [\"198.18.0.1/32\"]\n    ports: [8080]\n";

/// A VMM's namespace with a bare tap in it and a process standing in for
/// the VMM.
struct VmmNetns {
    ns: OuterNetns,
    vmm: StandInVmm,
}

impl VmmNetns {
    fn create() -> VmmNetns {
        let ns = OuterNetns::create("sluice-detach", &[]).expect("VMM namespace");
        add_tap(ns.name(), TAP, &[]).expect("tap");
        let vmm = StandInVmm::start(&ns);
        VmmNetns { ns, vmm }
    }

    fn tables(&self) -> Vec<String> {
        nft_tables(&self.ns.path())
    }
}

/// `sluice vm attach --daemon` of the namespace's tap as VM `id`.
fn attach(w: &World, daemon: &Daemon, vmm: &VmmNetns, id: &str) {
    let policy = w.policy(POLICY);
    let pid = vmm.vmm.pid().to_string();
    let out = daemon.client(
        w,
        &[
            "vm",
            "attach",
            "--daemon",
            "--policy",
            policy.to_str().unwrap(),
            "--tap",
            TAP,
            "--pid",
            &pid,
            "--guest-mac",
            MAC,
            "--guest-ip",
            GUEST,
            "--id",
            id,
        ],
    );
    assert!(
        out.status.success(),
        "attach {id}: {}\ndaemon: {}",
        stderr(&out),
        daemon.log_text()
    );
    assert!(daemon.lists(w, id), "{id} not listed after its attach");
    let tables = vmm.tables();
    for table in fence_tables(TAP) {
        assert!(
            tables.contains(&table),
            "no {table} after the attach: {tables:?}"
        );
    }
}

fn vm_detach(w: &World, daemon: &Daemon, id: &str) -> std::process::Output {
    daemon.client(w, &["vm", "detach", "--daemon", "--id", id])
}

#[test]
fn a_release_through_the_daemon_keeps_the_vms_fence() {
    let Some(w) = World::new() else {
        return;
    };
    let daemon = Daemon::start(&w);
    let vmm = VmmNetns::create();
    attach(&w, &daemon, &vmm, "vm-kept");

    let released = sluice::daemon::Client::new(&daemon.socket)
        .detach(&"vm-kept".parse().unwrap())
        .expect("DELETE /v1/sandboxes/vm-kept")
        .expect("vm-kept was attached");
    assert_eq!(released.path, "vm");
    assert!(!daemon.lists(&w, "vm-kept"), "vm-kept still listed");
    let tables = vmm.tables();
    for table in fence_tables(TAP) {
        assert!(
            tables.contains(&table),
            "{table} gone after a release: {tables:?}"
        );
    }
}

#[test]
fn sluice_vm_detach_through_the_daemon_releases_the_vm_and_removes_its_fence() {
    let Some(w) = World::new() else {
        return;
    };
    let daemon = Daemon::start(&w);
    let vmm = VmmNetns::create();
    attach(&w, &daemon, &vmm, "vm-gone");

    let out = vm_detach(&w, &daemon, "vm-gone");
    assert!(
        out.status.success(),
        "{}\ndaemon: {}",
        stderr(&out),
        daemon.log_text()
    );
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the VM as JSON");
    assert_eq!(info["id"], "vm-gone");
    assert_eq!(info["vm"]["tap"], TAP);
    assert!(
        stderr(&out).contains("removed the fence of tap tap0"),
        "{}",
        stderr(&out)
    );
    assert!(!daemon.lists(&w, "vm-gone"), "vm-gone still listed");
    let tables = vmm.tables();
    for table in fence_tables(TAP) {
        assert!(
            !tables.contains(&table),
            "{table} left after the detach: {tables:?}"
        );
    }
    assert!(
        tap_exists(&vmm.ns.path()),
        "the detach removed the tap itself"
    );
}

#[test]
fn sluice_vm_detach_through_the_daemon_of_an_unknown_id_exits_2_naming_it_and_sluice_status() {
    let Some(w) = World::new() else {
        return;
    };
    let daemon = Daemon::start(&w);
    let out = vm_detach(&w, &daemon, "vm-nobody");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("serves no sandbox vm-nobody"), "{text}");
    assert!(text.contains("sluice status"), "{text}");
}

#[test]
fn sluice_vm_detach_through_the_daemon_of_a_container_exits_2_and_leaves_it_attached() {
    use std::os::fd::AsFd;
    let Some(w) = World::new() else {
        return;
    };
    let daemon = Daemon::start(&w);
    // A container's namespace as the OCI hook sends it: no link out.
    let ns = OuterNetns::create("sluice-detach-ctr", &[]).expect("container namespace");
    let process = StandInVmm::start(&ns);
    let netns = std::fs::File::open(ns.path()).unwrap();
    let request = sluice::daemon::api::AttachRequest {
        id: "ctr-1".parse().unwrap(),
        pid: Some(process.pid() as i32),
        policy: Some(w.policy(POLICY)),
        bundle: None,
        trust: None,
        binds: Vec::new(),
        vm: None,
    };
    let attached = sluice::daemon::Client::new(&daemon.socket)
        .attach(&request, netns.as_fd())
        .unwrap_or_else(|e| panic!("attach: {e}\ndaemon: {}", daemon.log_text()));
    assert_eq!(attached.path, "oci");

    let out = vm_detach(&w, &daemon, "ctr-1");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("ctr-1 is not a VM"), "{text}");
    assert!(
        daemon.lists(&w, "ctr-1"),
        "the refused detach released ctr-1"
    );
}

#[test]
fn sluice_vm_detach_through_the_daemon_without_a_daemon_exits_4_saying_to_start_one() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("no-daemon.sock");
    let out = std::process::Command::new(sluice_bin())
        .args(["vm", "detach", "--daemon", "--id", "vm-a", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("no sluice daemon answers"), "{text}");
    assert!(text.contains("sluice daemon --config FILE"), "{text}");
}

fn tap_exists(netns: &Path) -> bool {
    std::process::Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(["ip", "link", "show", TAP])
        .output()
        .unwrap()
        .status
        .success()
}
