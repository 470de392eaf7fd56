//! The ways around the sandbox that an attacker with code in it tried
//! (issue 9), each shut: other processes (sockets borrowed with
//! pidfd_getfd, ptrace, signals to sluice), the terminal (TIOCSTI),
//! sluice's own files, the kernel's knobs, packet and vsock sockets, the
//! capabilities sluice was started with; and the programs that use the
//! network normally, which keep working. Each test builds its own outer
//! namespace (tests/common) and removes it.

#[path = "common/attack.rs"]
mod attack;
mod common;

use std::io::{Read, Write};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use attack::*;
use common::*;

/// Allows the origin 198.18.0.1:8080 only.
const STRICT: &str = r#"
version: 1
name: strict
rules:
  - name: origin
    action: allow
    cidrs: ["198.18.0.1/32"]
    ports: [8080]
dns:
  upstream: []
  hosts:
    origin.test: ["198.18.0.1"]
"#;

/// Also allows 198.18.0.2:8080, which STRICT denies.
const LENIENT: &str = r#"
version: 1
name: lenient
rules:
  - name: both
    action: allow
    cidrs: ["198.18.0.1/32", "198.18.0.2/32"]
    ports: [8080]
dns:
  upstream: []
"#;

/// `python3 -c SCRIPT ARGS` inside `sh -c`, then a request that the
/// policy allows: the positive canary that shows the sandbox worked after
/// the attempt.
fn attempt_then_canary(script: &str, args: &[String]) -> Vec<String> {
    let mut argv = vec![
        "sh".to_string(),
        "-c".to_string(),
        format!(
            "\"$0\" -c \"$1\" {} ; {} probe http http://198.18.0.1:8080/ && echo canary-ok",
            args.join(" "),
            sluice_bin()
        ),
    ];
    argv.push(python().display().to_string());
    argv.push(script.to_string());
    argv
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_workload_cannot_borrow_a_socket_from_a_process_outside_any_sandbox() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    let denied = w.http_origin("198.18.0.2:8080");
    let holder = outside_as_nobody(&w, HOLD_SOCKET);
    let argv = attempt_then_canary(
        BORROW_SOCKET,
        &[
            holder.child.id().to_string(),
            holder.fd().to_string(),
            "198.18.0.2".into(),
            "8080".into(),
        ],
    );
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &["--user", "nobody"],
        &strs(&argv),
    ));
    let text = stdout(&out);
    assert!(text.contains("canary-ok"), "{text}\n{}", stderr(&out));
    assert!(text.contains("refused: pidfd_open"), "{text}");
    assert_eq!(denied.load(Ordering::Relaxed), 0, "{text}");
}

#[test]
fn a_workload_cannot_borrow_a_socket_from_another_sandbox() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    let denied = w.http_origin("198.18.0.2:8080");
    // Sandbox A, whose policy allows 198.18.0.2:8080, holds a socket.
    let token = "held-by-sandbox-a";
    let hold = format!("{HOLD_SOCKET}\n# {token}");
    let lenient = w.dir.path().join("lenient.yaml");
    std::fs::write(&lenient, LENIENT).unwrap();
    let a = start_and_read_line(sluice_run(
        &w,
        &lenient,
        &["--user", "nobody"],
        &[python().to_str().unwrap(), "-c", &hold],
    ));
    let pids = pids_of("python", token);
    assert_eq!(pids.len(), 1, "{pids:?}");
    // Sandbox B, whose policy denies it, tries to borrow that socket.
    let argv = attempt_then_canary(
        BORROW_SOCKET,
        &[
            pids[0].to_string(),
            a.fd().to_string(),
            "198.18.0.2".into(),
            "8080".into(),
        ],
    );
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &["--user", "nobody"],
        &strs(&argv),
    ));
    let text = stdout(&out);
    assert!(text.contains("canary-ok"), "{text}\n{}", stderr(&out));
    assert!(text.contains("refused: pidfd_open"), "{text}");
    assert_eq!(denied.load(Ordering::Relaxed), 0, "{text}");
}

#[test]
fn a_workload_cannot_ptrace_a_process_outside_the_sandbox() {
    let Some(w) = World::new() else { return };
    let outside = outside_as_nobody(&w, HOLD_SOCKET);
    let argv = [
        python().display().to_string(),
        "-c".into(),
        PTRACE_ATTACH.into(),
        outside.child.id().to_string(),
    ];
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &["--user", "nobody"],
        &strs(&argv),
    ));
    let text = stdout(&out);
    assert!(text.contains("refused:"), "{text}\n{}", stderr(&out));
}

#[test]
fn a_workload_cannot_ptrace_even_its_own_child() {
    let Some(w) = World::new() else { return };
    let script = "sleep 30 & child=$!; \"$0\" -c \"$1\" $child; kill $child";
    let argv = [
        "sh".to_string(),
        "-c".into(),
        script.into(),
        python().display().to_string(),
        PTRACE_ATTACH.into(),
    ];
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &["--user", "nobody"],
        &strs(&argv),
    ));
    let text = stdout(&out);
    assert!(
        text.contains("refused: Operation not permitted"),
        "{text}\n{}",
        stderr(&out)
    );
}

#[test]
fn a_workload_sees_only_its_own_processes() {
    let Some(w) = World::new() else { return };
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &[
            "sh",
            "-c",
            "echo self=$$; ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '",
        ],
    ));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    // The init is 1, the shell 2; ls and grep are the only others.
    assert!(text.contains("self=2"), "{text}");
    let pids: Vec<u32> = text
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(pids.iter().all(|&p| p < 10), "{text}");
}

#[test]
fn a_root_workload_cannot_signal_sluice() {
    let Some(w) = World::new() else { return };
    let pid_file = w.dir.path().join("sluice.pid");
    // STOP, HUP and KILL, to its parent (sluice, before PID namespaces) and
    // to sluice's pid as the host sees it.
    let script = format!(
        "i=0; while [ ! -s {pid} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; \
         host_pid=$(cat {pid}); \
         for sig in STOP HUP KILL; do kill -$sig $PPID $host_pid 2>/dev/null; done; \
         {bin} probe http http://198.18.0.1:8080/ && echo canary-ok",
        pid = pid_file.display(),
        bin = sluice_bin(),
    );
    w.http_origin("198.18.0.1:8080");
    let mut cmd = sluice_run(&w, &w.policy(STRICT), &[], &["sh", "-c", &script]);
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::fs::write(&pid_file, child.id().to_string()).unwrap();
    let out = wait_bounded(child, Duration::from_secs(60));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("canary-ok"), "{text}");
    assert!(
        !stderr(&out).contains("SIGHUP received"),
        "{}",
        stderr(&out)
    );
}

/// pidfd_getfd(2) (438; Python 3.11's os has none) of the init's
/// descriptor 0, quoted for sh: exits 0 only if it handed one over.
const PIDFD_GETFD_OF_INIT: &str = "'import ctypes, os, sys; \
    libc = ctypes.CDLL(None, use_errno=True); \
    sys.exit(0 if libc.syscall(438, os.pidfd_open(1), 0, 0) >= 0 else 1)'";

/// The init is a fork of sluice (its memory holds sluice's early state):
/// a root workload reads neither its memory nor its environment, nor
/// follows its descriptors, nor borrows one.
#[test]
fn a_root_workload_cannot_read_the_inits_memory_environment_or_descriptors() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    let script = format!(
        "{py} -c 'open(\"/proc/1/mem\", \"rb\")' 2>/dev/null && echo OPENED-MEM; \
         cat /proc/1/environ >/dev/null 2>&1 && echo READ-ENV; \
         for fd in /proc/1/fd/*; do readlink \"$fd\" >/dev/null 2>&1 && echo FOLLOWED-FD; \
           cat \"$fd\" </dev/null >/dev/null 2>&1 && echo OPENED-FD; done; \
         {py} -c {getfd} 2>/dev/null && echo BORROWED-FD; \
         {bin} probe http http://198.18.0.1:8080/ && echo canary-ok",
        py = python().display(),
        getfd = PIDFD_GETFD_OF_INIT,
        bin = sluice_bin(),
    );
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &["sh", "-c", &script],
    ));
    let text = stdout(&out);
    assert!(text.contains("canary-ok"), "{text}\n{}", stderr(&out));
    for what in [
        "OPENED-MEM",
        "READ-ENV",
        "FOLLOWED-FD",
        "OPENED-FD",
        "BORROWED-FD",
    ] {
        assert!(!text.contains(what), "{what}: {text}");
    }
}

#[test]
fn a_root_workload_cannot_rewrite_the_policy_file() {
    let Some(w) = World::new() else { return };
    let policy = w.policy(STRICT);
    let script = format!(
        "echo 'name: evil' >> {p} && echo WROTE; \
         {py} -c 'import sys; open(sys.argv[1], \"r+\").write(\"x\")' {p} && echo OPENED; \
         rm -f {p} && echo REMOVED; echo done",
        p = policy.display(),
        py = python().display(),
    );
    let out = finish(sluice_run(&w, &policy, &[], &["sh", "-c", &script]));
    let text = stdout(&out);
    assert!(text.contains("done"), "{text}\n{}", stderr(&out));
    for what in ["WROTE", "OPENED", "REMOVED"] {
        assert!(!text.contains(what), "{what}: {text}");
    }
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), STRICT);
}

#[test]
fn a_root_workload_cannot_move_the_directory_that_holds_the_policy_file() {
    let Some(w) = World::new() else { return };
    let policy = w.policy(STRICT);
    let dir = w.dir.path();
    let script = format!(
        "mv {d} {d}.moved && echo MOVED; echo done",
        d = dir.display()
    );
    let out = finish(sluice_run(&w, &policy, &[], &["sh", "-c", &script]));
    let moved = std::path::PathBuf::from(format!("{}.moved", dir.display()));
    if moved.exists() {
        // Put it back for the temp dir's own cleanup, then fail.
        std::fs::rename(&moved, dir).unwrap();
    }
    let text = stdout(&out);
    assert!(text.contains("done"), "{text}\n{}", stderr(&out));
    assert!(!text.contains("MOVED"), "{text}");
}

#[test]
fn a_root_workload_cannot_change_the_bundle_its_trust_file_or_the_rollback_state() {
    let Some(w) = World::new() else { return };
    let dir = w.dir.path();
    let (key, trust, bundle, state) = (
        dir.join("ops.key"),
        dir.join("trust.yaml"),
        dir.join("bundle.tar.gz"),
        dir.join("state"),
    );
    let sluice = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(sluice_bin())
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    };
    sluice(&[
        "bundle".as_ref(),
        "keygen".as_ref(),
        "--key".as_ref(),
        key.as_os_str(),
        "--trust".as_ref(),
        trust.as_os_str(),
        "--id".as_ref(),
        "test".as_ref(),
    ]);
    sluice(&[
        "bundle".as_ref(),
        "sign".as_ref(),
        "--key".as_ref(),
        key.as_os_str(),
        "--policy".as_ref(),
        w.policy(STRICT).as_os_str(),
        "--revision".as_ref(),
        "7".as_ref(),
        "--out".as_ref(),
        bundle.as_os_str(),
    ]);
    let trusted = std::fs::read(&trust).unwrap();
    let script = format!(
        "for f in {b} {t}; do ( : > $f ) 2>/dev/null && echo CHANGED $f; done; \
         for f in {s}/*; do ( : > $f ) 2>/dev/null && echo CHANGED $f; done; \
         touch {s}/new 2>/dev/null && echo CREATED; echo done",
        b = bundle.display(),
        t = trust.display(),
        s = state.display(),
    );
    let mut cmd = w.outer.command(sluice_bin());
    cmd.args(["run", "--bundle"])
        .arg(&bundle)
        .arg("--trust")
        .arg(&trust)
        .arg("--state-dir")
        .arg(&state)
        .args(["--", "sh", "-c", &script]);
    let out = finish(cmd);
    let text = stdout(&out);
    assert!(text.contains("done"), "{text}\n{}", stderr(&out));
    assert!(!text.contains("CHANGED"), "{text}");
    assert!(!text.contains("CREATED"), "{text}");
    assert_eq!(std::fs::read(&trust).unwrap(), trusted);
}

#[test]
fn a_root_workload_cannot_truncate_or_rewrite_the_audit_log() {
    let Some(w) = World::new() else { return };
    let audit = w.audit_path();
    // A deny first, so there is a record to lose.
    let script = format!(
        "{bin} probe tcp 198.18.0.2:7000 --send x; \
         ( : > {a} ) 2>/dev/null && echo TRUNCATED; \
         {py} -c 'import sys; open(sys.argv[1], \"r+\").write(\"{{}}\")' {a} && echo REWROTE; \
         echo done",
        bin = sluice_bin(),
        a = audit.display(),
        py = python().display(),
    );
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &[
            "--audit",
            audit.to_str().unwrap(),
            "--state-dir",
            w.state_dir().to_str().unwrap(),
        ],
        &["sh", "-c", &script],
    ));
    let text = stdout(&out);
    assert!(text.contains("done"), "{text}\n{}", stderr(&out));
    assert!(!text.contains("REWROTE"), "{text}");
    let verify = std::process::Command::new(sluice_bin())
        .args(["audit", "verify"])
        .arg(&audit)
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", stdout(&verify));
    assert_eq!(w.audit().len(), 1);
}

#[test]
fn a_root_workload_cannot_read_or_replace_the_audit_checkpoint_key() {
    let Some(w) = World::new() else { return };
    let audit = w.audit_path();
    let key = w.state_dir().join("audit.key");
    let script = format!(
        "{bin} probe tcp 198.18.0.2:7000 --send x; \
         grep -q ed25519_pkcs8 {k} 2>/dev/null && echo READ; \
         cp {k} {stolen} 2>/dev/null && grep -q ed25519_pkcs8 {stolen} && echo COPIED; \
         rm -f {k} 2>/dev/null && [ ! -e {k} ] && echo REMOVED; \
         mv {k} {k}.old 2>/dev/null && echo MOVED; \
         echo done",
        bin = sluice_bin(),
        k = key.display(),
        stolen = w.dir.path().join("stolen").display(),
    );
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &[
            "--audit",
            audit.to_str().unwrap(),
            "--state-dir",
            w.state_dir().to_str().unwrap(),
        ],
        &["sh", "-c", &script],
    ));
    let text = stdout(&out);
    assert!(text.contains("done"), "{text}\n{}", stderr(&out));
    for what in ["READ", "COPIED", "REMOVED", "MOVED"] {
        assert!(!text.contains(what), "{what}: {text}");
    }
    // The key on the host is the one that signed this run's checkpoint
    // (what the workload could open there was /dev/null, writes included).
    let checkpoints = audit_checkpoints(&audit);
    assert_eq!(checkpoints.len(), 1);
    let on_host = sluice::audit::AuditKey::open_or_create(&w.state_dir()).unwrap();
    assert_eq!(checkpoints[0]["key"], on_host.id());
    let verify = std::process::Command::new(sluice_bin())
        .args(["audit", "verify", "--key"])
        .arg(w.state_dir().join("audit.pub"))
        .arg(&audit)
        .output()
        .unwrap();
    assert!(verify.status.success(), "{}", stdout(&verify));
}

#[test]
fn a_root_workload_cannot_truncate_the_timing_records() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    let timings = w.dir.path().join("timings.jsonl");
    let script = format!(
        "{bin} probe http http://198.18.0.1:8080/ >/dev/null; \
         ( : > {t} ) 2>/dev/null && echo TRUNCATED; echo done",
        bin = sluice_bin(),
        t = timings.display(),
    );
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &["--timings", timings.to_str().unwrap()],
        &["sh", "-c", &script],
    ));
    let text = stdout(&out);
    assert!(text.contains("done"), "{text}\n{}", stderr(&out));
    let records = std::fs::read_to_string(&timings).unwrap();
    assert_eq!(records.lines().count(), 1, "{records}");
}

#[test]
fn a_root_workload_cannot_rewrite_a_rotated_audit_log() {
    let Some(w) = World::new() else { return };
    let audit = w.audit_path();
    let rotated = w.dir.path().join("audit.jsonl.1");
    // Each deny record is a few hundred bytes: the second one rotates.
    let script = format!(
        "for i in 1 2 3; do {bin} probe tcp 198.18.0.2:7000 --send x >/dev/null; done; \
         i=0; while [ ! -e {r} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; \
         [ -e {r} ] && echo ROTATED; \
         ( : > {r} ) 2>/dev/null && echo TRUNCATED-ROTATED; \
         ( : > {a} ) 2>/dev/null && echo TRUNCATED-LIVE; \
         touch {a}.9 2>/dev/null && echo CREATED; \
         echo done",
        bin = sluice_bin(),
        a = audit.display(),
        r = rotated.display(),
    );
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &[
            "--audit",
            audit.to_str().unwrap(),
            "--audit-max-bytes",
            "300",
            "--state-dir",
            w.state_dir().to_str().unwrap(),
        ],
        &["sh", "-c", &script],
    ));
    let text = stdout(&out);
    assert!(text.contains("ROTATED"), "{text}\n{}", stderr(&out));
    assert!(text.contains("done"), "{text}");
    for what in ["TRUNCATED-ROTATED", "TRUNCATED-LIVE", "CREATED"] {
        assert!(!text.contains(what), "{what}: {text}");
    }
    assert!(std::fs::metadata(&rotated).unwrap().len() > 0);
}

#[test]
fn a_rotating_audit_log_in_the_working_directory_is_refused_before_anything_runs() {
    let Some(w) = World::new() else { return };
    let marker = w.dir.path().join("ran");
    let mut cmd = sluice_run(
        &w,
        &w.policy(STRICT),
        &[
            "--audit",
            "audit.jsonl",
            "--audit-max-bytes",
            "1000",
            "--state-dir",
            w.state_dir().to_str().unwrap(),
        ],
        &["touch", marker.to_str().unwrap()],
    );
    cmd.current_dir(w.dir.path());
    let out = finish(cmd);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("holds the command's working directory"),
        "{}",
        stderr(&out)
    );
    assert!(!marker.exists());
}

#[test]
fn a_root_workload_cannot_write_kernel_or_network_tunables() {
    let Some(w) = World::new() else { return };
    // Each write puts back the value that is there: nothing changes even
    // where it succeeds (as it did before the fix). sysrq-trigger is only
    // opened.
    let script = "for f in /proc/sys/kernel/core_pattern /proc/sys/net/ipv4/ip_forward \
                  /proc/sys/net/ipv4/conf/all/forwarding; do \
                    v=$(cat $f); ( printf '%s\\n' \"$v\" > $f ) 2>/dev/null && echo WROTE $f; \
                  done; \
                  for f in /proc/sysrq-trigger /sys/kernel/mm/transparent_hugepage/enabled; do \
                    [ -e $f ] && ( : >> $f ) 2>/dev/null && echo OPENED $f; \
                  done; \
                  echo done";
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &["sh", "-c", script],
    ));
    let text = stdout(&out);
    assert!(text.contains("done"), "{text}\n{}", stderr(&out));
    assert!(!text.contains("WROTE"), "{text}");
    assert!(!text.contains("OPENED"), "{text}");
}

/// What src/confine/mounts.rs masks (runc's `maskedPaths`): each that
/// exists on the host is there, empty (a file is /dev/null, a directory an
/// empty read-only tmpfs).
const MASKED: [&str; 9] = [
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/acpi",
    "/proc/scsi",
    "/sys/firmware",
];

#[test]
fn masked_kernel_entries_read_empty_and_interrupts_buses_and_filesystems_are_read_only() {
    let Some(w) = World::new() else { return };
    let script = format!(
        "for p in {}; do \
           if [ -d $p ]; then echo entries $p $(ls -A $p | wc -l); \
             ( : > $p/x ) 2>/dev/null && echo CREATED $p; \
           elif [ -e $p ]; then echo bytes $p $(cat $p | wc -c); \
             ( echo x > $p ) 2>/dev/null; \
             echo after-write $p $(stat -c %t:%T $p) $(cat $p | wc -c); \
           else echo absent $p; fi; \
         done; \
         for p in /proc/irq /proc/bus /proc/fs; do \
           awk -v p=$p '$5 == p {{ o = $6 }} END {{ print \"mount\", p, o }}' /proc/self/mountinfo; \
         done; \
         v=$(cat /proc/irq/default_smp_affinity); \
         ( echo $v > /proc/irq/default_smp_affinity ) 2>&1 && echo WROTE; \
         echo done",
        MASKED.join(" ")
    );
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &["sh", "-c", &script],
    ));
    let text = stdout(&out);
    assert!(text.contains("done"), "{text}\n{}", stderr(&out));
    for path in MASKED {
        let host = std::path::Path::new(path);
        let want = if host.is_dir() {
            vec![format!("entries {path} 0\n")]
        } else if host.exists() {
            // /dev/null (char 1:3) bound over it: a write goes nowhere.
            vec![
                format!("bytes {path} 0\n"),
                format!("after-write {path} 1:3 0\n"),
            ]
        } else {
            vec![format!("absent {path}\n")]
        };
        for line in want {
            assert!(text.contains(&line), "{line}: {text}");
        }
    }
    // The host has some of them, with content: the check is not empty.
    assert!(
        std::fs::read_to_string("/proc/keys").is_ok_and(|k| !k.is_empty()),
        "the host shows no /proc/keys"
    );
    assert!(!text.contains("CREATED"), "{text}");
    for path in ["/proc/irq", "/proc/bus", "/proc/fs"] {
        let options = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("mount {path} ")))
            .unwrap_or_default();
        assert!(
            options.split(',').any(|o| o == "ro"),
            "{path} is not a read-only mount: {text}"
        );
    }
    assert!(text.contains("Read-only file system"), "{text}");
    assert!(!text.contains("WROTE"), "{text}");
}

#[test]
fn packet_and_vsock_sockets_are_refused_even_for_root() {
    let Some(w) = World::new() else { return };
    // Creating a socket sends nothing.
    let script = r#"
import socket
for name, family, kind in [("packet", socket.AF_PACKET, socket.SOCK_RAW), ("vsock", 40, socket.SOCK_STREAM)]:
    try:
        socket.socket(family, kind)
        print(name, "CREATED")
    except OSError as e:
        print(name, "refused:", e.strerror)
"#;
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &[python().to_str().unwrap(), "-c", script],
    ));
    let text = stdout(&out);
    assert!(
        text.contains("packet refused: Operation not permitted"),
        "{text}\n{}",
        stderr(&out)
    );
    assert!(
        text.contains("vsock refused: Operation not permitted"),
        "{text}"
    );
}

#[test]
fn capabilities_sluice_inherited_do_not_reach_a_root_workload() {
    let Some(w) = World::new() else { return };
    if tool_path("capsh").is_none() {
        panic!("capsh is needed (apt-get install libcap2-bin)");
    }
    // sluice starts with CAP_NET_ADMIN, CAP_NET_RAW and CAP_SYS_ADMIN in
    // its inheritable and ambient sets.
    let caps = "cap_net_admin,cap_net_raw,cap_sys_admin";
    let run = format!(
        "exec {} run --policy {} -- grep ^Cap /proc/self/status",
        sluice_bin(),
        w.policy(STRICT).display()
    );
    let mut cmd = w.outer.command("capsh");
    cmd.arg(format!("--inh={caps}"))
        .arg(format!("--addamb={caps}"))
        .args(["--", "-c", &run]);
    let out = finish(cmd);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    let sets = capability_sets(&text);
    assert_eq!(sets.len(), 5, "{text}");
    for (set, mask) in sets {
        for cap in [12, 13, 21] {
            assert_eq!(mask & (1 << cap), 0, "capability {cap} in {set}: {text}");
        }
    }
}

#[test]
fn tiocsti_cannot_type_into_the_terminal_however_the_request_is_spelled() {
    let Some(w) = World::new() else { return };
    // The request as the kernel takes it (32 bits), and with high bits set.
    let script = r##"
import ctypes, os, termios
libc = ctypes.CDLL(None, use_errno=True)
c = ctypes.c_char(b"#")
for name, request in [("plain", termios.TIOCSTI), ("high-bits", termios.TIOCSTI | (1 << 32))]:
    rc = libc.syscall(16 if os.uname().machine == "x86_64" else 29, 0, ctypes.c_ulong(request), ctypes.byref(c))
    print("tiocsti", name, "TYPED" if rc == 0 else "refused: " + os.strerror(ctypes.get_errno()), flush=True)
print("tiocsti-done", flush=True)
"##;
    let mut cmd = sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &[python().to_str().unwrap(), "-c", script],
    );
    let master = in_terminal(&mut cmd);
    let child = cmd.spawn().unwrap();
    drop(cmd);
    let seen = read_terminal(&master);
    let out = wait_bounded(child, Duration::from_secs(60));
    let text = seen.lock().unwrap().clone();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("tiocsti-done"), "{text}");
    assert!(!text.contains("TYPED"), "{text}");
    assert_eq!(
        text.matches("refused: Operation not permitted").count(),
        2,
        "{text}"
    );
}

#[test]
fn an_interactive_shell_suspends_a_job_and_brings_it_back() {
    let Some(w) = World::new() else { return };
    let bash = tool_path("bash").expect("bash");
    let mut cmd = sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &[bash.to_str().unwrap(), "--norc", "--noprofile", "-i"],
    );
    cmd.env("PS1", "prompt> ");
    let mut master = in_terminal(&mut cmd);
    let child = cmd.spawn().unwrap();
    drop(cmd);
    let seen = read_terminal(&master);
    let saw = |what: &str| {
        eventually(Duration::from_secs(20), || {
            seen.lock().unwrap().contains(what)
        })
    };
    assert!(saw("prompt> "), "{}", seen.lock().unwrap());
    // The markers are computed, so the terminal's echo of the typed line
    // does not contain them.
    master
        .write_all(b"sh -c 'echo started-$((40+2)); sleep 5; echo finished-$((40+2))'\n")
        .unwrap();
    assert!(saw("started-42"), "{}", seen.lock().unwrap());
    master.write_all(b"\x1a").unwrap();
    assert!(saw("Stopped"), "{}", seen.lock().unwrap());
    assert!(!seen.lock().unwrap().contains("finished-42"));
    master.write_all(b"fg\n").unwrap();
    assert!(saw("finished-42"), "{}", seen.lock().unwrap());
    master.write_all(b"exit\n").unwrap();
    let out = wait_bounded(child, Duration::from_secs(30));
    assert!(out.status.success(), "{}", seen.lock().unwrap());
}

#[test]
fn after_an_interactive_shell_exits_sluice_has_its_terminal_back() {
    let Some(w) = World::new() else { return };
    let bash = tool_path("bash").expect("bash");
    // The shell takes the terminal for itself and, from inside its PID
    // namespace, cannot name sluice's group to give it back. With tostop,
    // a background sluice that logs would be stopped (SIGTTOU) for good.
    let mut cmd = sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &[bash.to_str().unwrap(), "--norc", "--noprofile", "-i"],
    );
    cmd.env("PS1", "prompt> ");
    let mut master = in_terminal(&mut cmd);
    let child = cmd.spawn().unwrap();
    drop(cmd);
    let seen = read_terminal(&master);
    let saw = |what: &str| {
        eventually(Duration::from_secs(20), || {
            seen.lock().unwrap().contains(what)
        })
    };
    assert!(saw("prompt> "), "{}", seen.lock().unwrap());
    master
        .write_all(b"stty tostop; echo set-$((40+2))\n")
        .unwrap();
    assert!(saw("set-42"), "{}", seen.lock().unwrap());
    master.write_all(b"exit\n").unwrap();
    let out = wait_bounded(child, Duration::from_secs(30));
    let text = seen.lock().unwrap().clone();
    assert!(out.status.success(), "{:?}: {text}", out.status);
    // sluice's last log line, written after the shell ended.
    assert!(text.contains("own CPU time"), "{text}");
}

#[test]
fn a_root_workload_cannot_reach_the_daemon_socket() {
    let Some(w) = World::new() else { return };
    let socket = w.dir.path().join("daemon.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let script = "import socket, sys\n\
                  s = socket.socket(socket.AF_UNIX)\n\
                  try:\n    s.connect(sys.argv[1]); print('CONNECTED')\n\
                  except OSError as e:\n    print('refused:', e.strerror)\n";
    let mut cmd = sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &[
            python().to_str().unwrap(),
            "-c",
            script,
            socket.to_str().unwrap(),
        ],
    );
    // The daemon's socket, as `sluice status` and the hook find it.
    cmd.env("SLUICE_DAEMON_SOCKET", &socket);
    let out = finish(cmd);
    let text = stdout(&out);
    assert!(text.contains("refused:"), "{text}\n{}", stderr(&out));
}

#[test]
fn curl_and_wget_fetch_through_sluice() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    let script = "curl -sS http://origin.test:8080/ && wget -q -O - http://198.18.0.1:8080/";
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &["sh", "-c", script],
    ));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert_eq!(text.matches("hello from origin").count(), 2, "{text}");
}

#[test]
fn python_fetches_through_sluice_as_another_user() {
    let Some(w) = World::new() else { return };
    w.http_origin("198.18.0.1:8080");
    let script = "import urllib.request; print(urllib.request.urlopen('http://origin.test:8080/', timeout=10).read().decode())";
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &["--user", "nobody"],
        &[python().to_str().unwrap(), "-c", script],
    ));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("hello from origin"), "{text}");
}

#[test]
fn git_commits_and_clones_in_the_sandbox() {
    let Some(w) = World::new() else { return };
    let repo = w.dir.path().join("repo");
    let script = format!(
        "set -e; git init -q {r}; cd {r}; echo hi > f; git add f; \
         git -c user.name=t -c user.email=t@t commit -qm first; \
         git clone -q {r} {r}-clone; git -C {r}-clone log --format=%s",
        r = repo.display()
    );
    let out = finish(sluice_run(
        &w,
        &w.policy(STRICT),
        &[],
        &["sh", "-c", &script],
    ));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert_eq!(text.trim(), "first");
}

/// Collect what the terminal shows, on a thread, until its last user goes.
fn read_terminal(master: &std::fs::File) -> Arc<Mutex<String>> {
    let seen = Arc::new(Mutex::new(String::new()));
    let mut master = master.try_clone().unwrap();
    let into = seen.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1024];
        // EIO once the last slave descriptor is closed.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    seen
}

/// Lists the descriptors the shell holds: "NUMBER KIND" per line, where
/// KIND is what the link names up to its first ':' or '['.
const LIST_FDS: &str =
    r#"for f in /proc/$$/fd/*; do l=$(readlink "$f"); echo "${f##*/} ${l%%[:[]*}"; done"#;

#[test]
fn a_workload_inherits_no_descriptor_that_sluice_opened() {
    let Some(w) = World::new() else { return };
    // The same shell started the same way without sluice: what any
    // program run from this test inherits anyway.
    let direct = w
        .outer
        .command("sh")
        .args(["-c", LIST_FDS])
        .output()
        .expect("run sh");
    let sandboxed = w.run(&w.policy(STRICT), &["sh", "-c", LIST_FDS]);
    assert!(sandboxed.status.success(), "{}", stderr(&sandboxed));
    let lines = |out: &std::process::Output| {
        let mut v: Vec<String> = stdout(out).lines().map(str::to_string).collect();
        v.sort();
        v
    };
    // Standard input, output and error are the harness's to choose; every
    // descriptor above them must be one the caller passed down.
    let extra = |v: Vec<String>| -> Vec<String> {
        v.into_iter()
            .filter(|l| l.split(' ').next().and_then(|n| n.parse::<u32>().ok()) > Some(2))
            .collect()
    };
    assert_eq!(
        extra(lines(&sandboxed)),
        extra(lines(&direct)),
        "the workload holds descriptors a plain child of the caller does not"
    );
}

/// Python prelude for the seccomp tests: `call(NAME, NR, *ARGS)` makes raw
/// system call NR (x86_64 numbers) with ctypes and prints `NAME OK` or
/// `NAME ERRNO` (EPERM, ENOSYS, ...), one line each. A call that forks if
/// it is let through (`forks=True`) ends the child at once.
const SYSCALLS: &str = r#"
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def arg(a):
    if isinstance(a, bytes): return ctypes.c_char_p(a)
    if isinstance(a, int): return ctypes.c_long(a)
    return a
def call(name, nr, *args, forks=False):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])
    if r == 0 and forks:
        os._exit(0)
    if r < 0:
        e = ctypes.get_errno()
        print(name, errno.errorcode.get(e, e), flush=True)
    else:
        if forks: os.waitpid(r, 0)
        print(name, "OK", flush=True)
    return r
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(16)
iov = iovec(ctypes.cast(buf, ctypes.c_void_p), 16)
"#;

/// Outside the sandbox, run as root on this machine, the same calls give
/// OK (pidfd_getfd, process_vm_readv/writev, kcmp, keyctl, modify_ldt),
/// EINVAL (process_madvise, clone3, fsconfig), ENOTTY (TIOCLINUX on
/// /dev/null) or EFAULT (perf_event_open): the errnos below are the
/// filter's, not the kernel's own refusal. (x32 is ENOSYS either way on a
/// kernel without it.)
///
/// Runs `SYSCALLS` + `script` as root under `sluice run` (argv[1] is the
/// policy file's path) and returns each printed line's `NAME RESULT`.
fn syscall_results(script: &str) -> std::collections::BTreeMap<String, String> {
    let w = World::new().expect("privileged");
    let policy = w.policy(STRICT);
    let program = format!("{SYSCALLS}{script}\nprint('done', 'OK', flush=True)\n");
    let out = finish(sluice_run(
        &w,
        &policy,
        &[],
        &[
            python().to_str().unwrap(),
            "-c",
            &program,
            policy.to_str().unwrap(),
        ],
    ));
    let text = stdout(&out);
    assert!(
        out.status.success() && text.contains("done OK"),
        "{text}\n{}",
        stderr(&out)
    );
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(name, result)| (name.to_string(), result.to_string()))
        .collect()
}

fn assert_results(results: &std::collections::BTreeMap<String, String>, expected: &[(&str, &str)]) {
    for (name, want) in expected {
        assert_eq!(
            results.get(*name).map(String::as_str),
            Some(*want),
            "{name}: {results:?}"
        );
    }
}

#[test]
fn seccomp_refuses_reaching_into_the_workloads_own_child_with_eperm() {
    if !privileged() {
        return;
    }
    // The child is the workload's own (same user, a descendant): only the
    // filter stands between them. pidfd_open is allowed, so the refusal
    // is the borrowing step itself.
    let script = r#"
r, wfd = os.pipe()
child = os.fork()
if child == 0:
    os.close(wfd)
    os.read(r, 1)
    os._exit(0)
pidfd = call("pidfd_open", 434, child, 0)
call("pidfd_getfd", 438, pidfd, 0, 0)
call("process_vm_readv", 310, child, ctypes.byref(iov), 1, ctypes.byref(iov), 1, 0)
call("process_vm_writev", 311, child, ctypes.byref(iov), 1, ctypes.byref(iov), 1, 0)
call("kcmp", 312, os.getpid(), child, 0, 0, 0)
call("process_madvise", 440, pidfd, ctypes.byref(iov), 1, 20, 0)
os.close(wfd)
os.waitpid(child, 0)
"#;
    assert_results(
        &syscall_results(script),
        &[
            ("pidfd_open", "OK"),
            ("pidfd_getfd", "EPERM"),
            ("process_vm_readv", "EPERM"),
            ("process_vm_writev", "EPERM"),
            ("kcmp", "EPERM"),
            ("process_madvise", "EPERM"),
        ],
    );
}

#[test]
fn seccomp_refuses_namespace_and_mount_calls_with_eperm_and_clone3_with_enosys() {
    if !privileged() {
        return;
    }
    // unshare and clone are refused only with a namespace flag: without
    // one they work. The mount calls aim at the policy file's read-only
    // bind, which is still read-only afterwards.
    let script = r#"
policy = sys.argv[1].encode()
call("unshare-none", 272, 0)
call("unshare-newnet", 272, 0x40000000)
call("unshare-newuser", 272, 0x10000000)
call("unshare-newns", 272, 0x00020000)
call("unshare-newtime", 272, 0x80)
call("clone-plain", 56, 17, 0, 0, 0, 0, forks=True)
call("clone-newnet", 56, 0x40000000 | 17, 0, 0, 0, 0, forks=True)
call("clone-newuser", 56, 0x10000000 | 17, 0, 0, 0, 0, forks=True)
call("clone3", 435, 0, 0)
userns = os.open("/proc/self/ns/user", os.O_RDONLY)
call("setns-user", 308, userns, 0x10000000)
netns = os.open("/proc/self/ns/net", os.O_RDONLY)
call("setns-net", 308, netns, 0x40000000)
call("mount-remount-policy-rw", 165, 0, policy, 0, 0x20 | 0x1000, 0)
call("umount2-policy", 166, policy, 0)
call("umount2-policy-detach", 166, policy, 2)
call("pivot_root", 155, b"/", b"/")
call("fsopen", 430, b"tmpfs", 0)
call("fsconfig", 431, -1, 0, 0, 0, 0)
call("fspick", 433, -100, b"/", 0)
call("open_tree", 428, -100, policy, 0)
call("move_mount", 429, -1, b"", -100, b"/", 0)
call("mount_setattr", 442, -100, policy, 0, 0, 0)
try:
    open(policy, "ab")
    print("policy-append OK", flush=True)
except OSError as e:
    print("policy-append", errno.errorcode[e.errno], flush=True)
"#;
    assert_results(
        &syscall_results(script),
        &[
            ("unshare-none", "OK"),
            ("unshare-newnet", "EPERM"),
            ("unshare-newuser", "EPERM"),
            ("unshare-newns", "EPERM"),
            ("unshare-newtime", "EPERM"),
            ("clone-plain", "OK"),
            ("clone-newnet", "EPERM"),
            ("clone-newuser", "EPERM"),
            ("clone3", "ENOSYS"),
            ("setns-user", "EPERM"),
            ("setns-net", "EPERM"),
            ("mount-remount-policy-rw", "EPERM"),
            ("umount2-policy", "EPERM"),
            ("umount2-policy-detach", "EPERM"),
            ("pivot_root", "EPERM"),
            ("fsopen", "EPERM"),
            ("fsconfig", "EPERM"),
            ("fspick", "EPERM"),
            ("open_tree", "EPERM"),
            ("move_mount", "EPERM"),
            ("mount_setattr", "EPERM"),
            ("policy-append", "EROFS"),
        ],
    );
}

#[test]
fn seccomp_refuses_kernel_reaching_calls_with_eperm_and_x32_with_enosys() {
    if !privileged() {
        return;
    }
    // Arguments that would do nothing if a call got through (bad lengths,
    // NULL pointers, descriptor -1); the query forms of personality and
    // getpid show the filter lets ordinary calls by.
    let script = r#"
devnull = os.open("/dev/null", os.O_RDONLY)
sub = ctypes.c_char(12)
call("ioctl-tioclinux", 16, devnull, 0x541C, ctypes.byref(sub))
call("ioctl-tioclinux-high-bits", 16, devnull, (1 << 32) | 0x541C, ctypes.byref(sub))
call("kexec_load", 246, 0, 17, 0, 0)
call("kexec_file_load", 320, -1, -1, 0, b"", 0)
call("reboot", 169, 0, 0, 0, 0)
call("init_module", 175, 0, 0, b"")
call("finit_module", 313, -1, b"", 0)
call("delete_module", 176, b"sluice_no_such_module", 0x800)
call("bpf", 321, 0, 0, 0)
call("perf_event_open", 298, 0, 0, -1, -1, 0)
call("userfaultfd", 323, 1 | 0x80000)
call("io_uring_setup", 425, 1, 0)
call("io_uring_enter", 426, -1, 0, 0, 0, 0, 0)
call("io_uring_register", 427, -1, 0, 0, 0)
call("keyctl", 250, 0, -3, 0)
call("add_key", 248, 0, 0, 0, 0, 0)
call("request_key", 249, 0, 0, 0, 0)
call("open_by_handle_at", 304, -1, 0, 0)
call("acct", 163, 0)
call("swapon", 167, 0, 0)
call("swapoff", 168, 0)
call("syslog", 103, 10, 0, 0)
call("vhangup", 153)
call("personality-query", 135, 0xffffffff)
call("personality-addr-no-randomize", 135, 0x0040000)
call("personality-read-implies-exec", 135, 0x0400000)
call("iopl", 172, 4)
call("ioperm", 173, 0x10000, 1, 1)
call("modify_ldt", 154, 0, buf, 0)
call("uselib", 134, 0)
call("getpid", 39)
call("x32-getpid", 0x40000000 | 39)
"#;
    assert_results(
        &syscall_results(script),
        &[
            ("ioctl-tioclinux", "EPERM"),
            ("ioctl-tioclinux-high-bits", "EPERM"),
            ("kexec_load", "EPERM"),
            ("kexec_file_load", "EPERM"),
            ("reboot", "EPERM"),
            ("init_module", "EPERM"),
            ("finit_module", "EPERM"),
            ("delete_module", "EPERM"),
            ("bpf", "EPERM"),
            ("perf_event_open", "EPERM"),
            ("userfaultfd", "EPERM"),
            ("io_uring_setup", "EPERM"),
            ("io_uring_enter", "EPERM"),
            ("io_uring_register", "EPERM"),
            ("keyctl", "EPERM"),
            ("add_key", "EPERM"),
            ("request_key", "EPERM"),
            ("open_by_handle_at", "EPERM"),
            ("acct", "EPERM"),
            ("swapon", "EPERM"),
            ("swapoff", "EPERM"),
            ("syslog", "EPERM"),
            ("vhangup", "EPERM"),
            ("personality-query", "OK"),
            ("personality-addr-no-randomize", "EPERM"),
            ("personality-read-implies-exec", "EPERM"),
            ("iopl", "EPERM"),
            ("ioperm", "EPERM"),
            ("modify_ldt", "EPERM"),
            ("uselib", "EPERM"),
            ("getpid", "OK"),
            ("x32-getpid", "ENOSYS"),
        ],
    );
}

// Read-only /sys, every mount under it included (src/confine/mounts.rs
// makes the whole tree read-only in one mount_setattr(2) call). `ip netns
// exec` mounts a fresh sysfs with nothing under it, so these run sluice
// with `nsenter --net` instead: the workload's mounts start from the test's
// own, cgroup hierarchies and all.

/// `sluice run -- sh -c SCRIPT` in the test namespace's network but the
/// test's own mount namespace.
fn run_with_the_hosts_mounts(w: &World, script: &str) -> std::process::Output {
    let mut cmd = std::process::Command::new("nsenter");
    cmd.arg(format!("--net={}", w.outer.path().display()))
        .arg(sluice_bin())
        .args(["-v", "run", "--policy"])
        .arg(w.policy(STRICT))
        .args(["--", "sh", "-c", script]);
    finish(cmd)
}

/// (mount point, per-mount options) of each mount at or under /sys in a
/// mountinfo text.
fn sys_mounts(mountinfo: &str) -> Vec<(String, Vec<String>)> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let point = *f.get(4)?;
            let options = f.get(5)?.split(',').map(str::to_string).collect();
            (point == "/sys" || point.starts_with("/sys/")).then(|| (point.to_string(), options))
        })
        .collect()
}

#[test]
fn every_mount_under_sys_is_read_only_for_the_workload_and_keeps_its_other_flags() {
    let Some(w) = World::new() else { return };
    let host = sys_mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    assert!(
        host.len() > 1,
        "the test's /sys has no mount under it: the check would be empty: {host:?}"
    );
    let canary = w.dir.path().join("canary");
    let script = format!(
        "cat /proc/self/mountinfo; echo written > {} && echo canary-ok",
        canary.display()
    );
    let out = run_with_the_hosts_mounts(&w, &script);
    let text = stdout(&out);
    assert!(text.contains("canary-ok"), "{text}\n{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "written\n");
    let seen = sys_mounts(&text);
    // /sys/firmware is sluice's own empty tmpfs (masked), read-only too.
    for (point, options) in &seen {
        assert!(
            options.iter().any(|o| o == "ro"),
            "{point} is writable in the workload: {options:?}"
        );
    }
    let rest = |options: &[String]| -> Vec<String> {
        options
            .iter()
            .filter(|o| *o != "ro" && *o != "rw")
            .cloned()
            .collect()
    };
    for (point, options) in &host {
        let Some((_, theirs)) = seen.iter().find(|(p, _)| p == point) else {
            panic!("{point} is missing in the workload: {text}");
        };
        assert_eq!(rest(theirs), rest(options), "{point}'s flags changed");
    }
}

#[test]
fn a_root_workload_cannot_create_a_cgroup_in_any_hierarchy() {
    let Some(w) = World::new() else { return };
    let hierarchies: Vec<String> =
        sys_mounts(&std::fs::read_to_string("/proc/self/mountinfo").unwrap())
            .into_iter()
            .map(|(point, _)| point)
            .filter(|p| p.starts_with("/sys/fs/cgroup"))
            .collect();
    assert!(
        !hierarchies.is_empty(),
        "the test has no cgroup hierarchy: the check would be empty"
    );
    // A cgroup made by mistake is removed again at once.
    let script = format!(
        "for h in {}; do \
           d=$h/sluice-escape-$$; \
           if mkdir $d 2>/dev/null; then echo CREATED $d; rmdir $d; \
           else echo refused $h; fi; \
         done; \
         mkdir /tmp/sluice-escape-$$ && rmdir /tmp/sluice-escape-$$ && echo canary-ok",
        hierarchies.join(" ")
    );
    let out = run_with_the_hosts_mounts(&w, &script);
    let text = stdout(&out);
    assert!(text.contains("canary-ok"), "{text}\n{}", stderr(&out));
    assert!(!text.contains("CREATED"), "{text}");
    for h in &hierarchies {
        assert!(text.contains(&format!("refused {h}\n")), "{h}: {text}");
    }
}

#[test]
fn a_root_workload_cannot_change_the_dev_null_that_masks_a_kernel_file() {
    let Some(w) = World::new() else { return };
    // The masks are the host's /dev/null bound over the file: were the
    // bind writable, a chmod would change the host's /dev/null. One made
    // by mistake is put back at once.
    let masked: Vec<&str> = MASKED
        .iter()
        .copied()
        .filter(|p| std::path::Path::new(p).is_file())
        .collect();
    assert!(
        !masked.is_empty(),
        "the host has no masked file: the check would be empty"
    );
    let script = format!(
        "for p in {}; do \
           if chmod 0600 $p 2>/dev/null; then echo CHANGED $p; chmod 0666 $p; \
           else echo refused $p; fi; \
         done; \
         f=/tmp/sluice-escape-$$; : > $f && chmod 0600 $f && rm $f && echo canary-ok",
        masked.join(" ")
    );
    let out = run_with_the_hosts_mounts(&w, &script);
    let text = stdout(&out);
    assert!(text.contains("canary-ok"), "{text}\n{}", stderr(&out));
    assert!(!text.contains("CHANGED"), "{text}");
    for p in &masked {
        assert!(text.contains(&format!("refused {p}\n")), "{p}: {text}");
    }
}
