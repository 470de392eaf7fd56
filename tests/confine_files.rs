//! What a root workload can do to the files sluice hides from it (a
//! secret, a directory of them) or shows it in place of its own (the
//! sandbox's CA bundle over the distribution's): nothing. Each test runs
//! the real confinement (`sluice::confine`: the init, its mount namespace,
//! seccomp filter and capabilities) on a shell script as root, in a
//! network namespace of its own with nothing in it, and asserts on what
//! the script printed and on the host's files afterwards.
//!
//! The init's parent must be a thread that outlives the workload, which no
//! test of libtest's is: this binary runs itself again as that process
//! ([`Confined`]), before the test harness starts. The init is this binary
//! again too (sluice starts `/proc/self/exe` as `sluice-init`), so it is
//! dispatched first.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

/// Set in the environment of this binary run as the confining process:
/// what it hides and replaces, one `hide\tPATH` or `replace\tSOURCE\tTARGET`
/// a line.
const PLAN_VAR: &str = "SLUICE_TEST_CONFINE_FILES_PLAN";
/// The script the confined workload runs (`sh -c`).
const SCRIPT_VAR: &str = "SLUICE_TEST_CONFINE_FILES_SCRIPT";

/// Runs before `main`, while the process is one thread: when this binary
/// was started as the confining process, be it and exit.
#[used]
#[link_section = ".init_array"]
static BEFORE_MAIN: extern "C" fn() = before_main;

extern "C" fn before_main() {
    // std's own arguments may not be set up yet this early.
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    if cmdline.split(|b| *b == 0).next() == Some(sluice::confine::INIT_NAME.as_bytes()) {
        sluice::confine::run_init();
    }
    if let (Some(plan), Some(script)) = (std::env::var_os(PLAN_VAR), std::env::var_os(SCRIPT_VAR)) {
        let code = match confine_and_run(&plan.to_string_lossy(), script) {
            Ok(code) => code,
            Err(why) => {
                eprintln!("confining process: {why}");
                100
            }
        };
        std::process::exit(code);
    }
}

/// What `sluice run` does with its files, without the network: fork the
/// init first, tell it the plan, hand it an empty network namespace, wait
/// for the workload. Its exit status.
fn confine_and_run(plan: &str, script: std::ffi::OsString) -> Result<i32, String> {
    let mut init = sluice::confine::PreparedInit::fork().map_err(|e| e.to_string())?;
    let mut files = sluice::confine::SluiceFiles::default();
    for line in plan.lines() {
        match line.split('\t').collect::<Vec<_>>()[..] {
            ["hide", path] => {
                files.hide(path);
            }
            ["replace", source, target] => {
                init.replace(source, target).map_err(|e| e.to_string())?
            }
            _ => return Err(format!("a plan line is neither hide nor replace: {line:?}")),
        }
    }
    let argv = ["sh".into(), "-c".into(), script];
    init.plan(&argv, None, &files, &[])
        .map_err(|e| e.to_string())?;
    let netns = std::thread::spawn(|| {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
        std::fs::File::open("/proc/thread-self/ns/net")
    })
    .join()
    .map_err(|_| "the namespace thread panicked".to_string())?
    .map_err(|e| format!("cannot make a network namespace: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut workload = sluice::confine::start(init, Some(netns.into()))
            .await
            .map_err(|e| e.to_string())?;
        let status = workload.wait().await.map_err(|e| e.to_string())?;
        Ok(status.code().unwrap_or(1))
    })
}

/// A plan for the confining process.
#[derive(Default)]
struct Confined {
    lines: Vec<String>,
}

impl Confined {
    fn hide(mut self, path: &Path) -> Self {
        self.lines.push(format!("hide\t{}", path.display()));
        self
    }

    fn replace(mut self, source: &Path, target: &Path) -> Self {
        self.lines.push(format!(
            "replace\t{}\t{}",
            source.display(),
            target.display()
        ));
        self
    }

    /// Run `script` as the confined workload, to completion (bounded).
    fn run(self, script: &str) -> Output {
        let child = Command::new(std::env::current_exe().expect("this test binary"))
            .env(PLAN_VAR, self.lines.join("\n"))
            .env(SCRIPT_VAR, script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the confining process");
        let out = wait_bounded(child, Duration::from_secs(60));
        assert!(
            stdout(&out).contains("done"),
            "the workload did not finish: {}\n{}",
            stdout(&out),
            stderr(&out)
        );
        out
    }
}

#[test]
fn a_root_workload_cannot_open_a_hidden_secret_file_even_after_trying_to_unmount_it() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("gh-token");
    std::fs::write(&secret, "ghp_not_for_the_workload\n").unwrap();
    let out = Confined::default().hide(&secret).run(&format!(
        "cat {s} 2>&1; echo read=$?; \
         umount {s} 2>/dev/null && echo UNMOUNTED; \
         umount -l {s} 2>/dev/null && echo DETACHED; \
         cp {s} {d}/copy 2>/dev/null && echo COPIED; \
         cat {s} 2>&1; echo read-again=$?; echo done",
        s = secret.display(),
        d = dir.path().display(),
    ));
    let text = stdout(&out);
    assert!(!text.contains("ghp_not_for_the_workload"), "{text}");
    assert!(text.contains("Permission denied"), "{text}");
    assert!(text.contains("read=1"), "{text}");
    assert!(text.contains("read-again=1"), "{text}");
    for what in ["UNMOUNTED", "DETACHED", "COPIED"] {
        assert!(!text.contains(what), "{what}: {text}");
    }
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "ghp_not_for_the_workload\n"
    );
}

#[test]
fn a_hidden_directory_looks_empty_and_its_files_are_not_there() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let secrets = dir.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join("gh"), "ghp_not_for_the_workload\n").unwrap();
    let out = Confined::default().hide(&secrets).run(&format!(
        "echo entries=$(ls -A {s} | wc -l); cat {s}/gh 2>&1; echo read=$?; \
         touch {s}/planted 2>/dev/null && echo PLANTED; echo done",
        s = secrets.display(),
    ));
    let text = stdout(&out);
    assert!(text.contains("entries=0"), "{text}");
    assert!(!text.contains("ghp_not_for_the_workload"), "{text}");
    assert!(text.contains("No such file or directory"), "{text}");
    assert!(text.contains("read=1"), "{text}");
    assert!(!text.contains("PLANTED"), "{text}");
}

#[test]
fn a_replaced_file_shows_its_source_and_a_root_workload_cannot_write_unmount_or_cover_it() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = (dir.path().join("sandbox.pem"), dir.path().join("roots.crt"));
    std::fs::write(&source, "sandbox CA\n").unwrap();
    std::fs::write(&target, "distribution roots\n").unwrap();
    let absent = dir.path().join("absent.crt");
    let system = Path::new("/etc/ssl/certs/ca-certificates.crt");
    let out = Confined::default()
        .replace(&source, &target)
        .replace(&source, &absent)
        .replace(&source, system)
        .run(&format!(
            "echo shown=$(cat {t}); \
             awk -v p={t} '$5 == p {{ print \"options\", $6 }}' /proc/self/mountinfo; \
             cmp -s {src} {sys} && echo SYSTEM-SHOWN; \
             [ -e {a} ] && echo ABSENT-MADE; \
             ( echo forged > {t} ) 2>/dev/null && echo WROTE-TARGET; \
             ( echo forged > {src} ) 2>/dev/null && echo WROTE-SOURCE; \
             umount {t} 2>/dev/null && echo UNMOUNTED; \
             umount -l {t} 2>/dev/null && echo DETACHED; \
             echo forged > {d}/forged; \
             mount --bind {d}/forged {t} 2>/dev/null && echo COVERED; \
             mv {t} {t}.moved 2>/dev/null && echo MOVED; \
             rm -f {t} 2>/dev/null; [ -e {t} ] || echo REMOVED; \
             echo shown-after=$(cat {t}); echo done",
            t = target.display(),
            src = source.display(),
            sys = system.display(),
            a = absent.display(),
            d = dir.path().display(),
        ));
    let text = stdout(&out);
    assert!(text.contains("shown=sandbox CA"), "{text}");
    assert!(text.contains("shown-after=sandbox CA"), "{text}");
    // The mount at the target is read-only itself.
    assert!(text.contains("options ro,"), "{text}");
    assert_eq!(text.contains("SYSTEM-SHOWN"), system.exists(), "{text}");
    for what in [
        "ABSENT-MADE",
        "WROTE-TARGET",
        "WROTE-SOURCE",
        "UNMOUNTED",
        "DETACHED",
        "COVERED",
        "MOVED",
        "REMOVED",
    ] {
        assert!(!text.contains(what), "{what}: {text}");
    }
    // The host's files are as they were: the binds were the workload's alone.
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "distribution roots\n"
    );
    assert_eq!(std::fs::read_to_string(&source).unwrap(), "sandbox CA\n");
    assert!(!absent.exists());
}

#[test]
fn a_replacement_whose_source_is_missing_starts_nothing() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("roots.crt");
    std::fs::write(&target, "distribution roots\n").unwrap();
    let marker = dir.path().join("ran");
    let child = Command::new(std::env::current_exe().unwrap())
        .env(
            PLAN_VAR,
            format!(
                "replace\t{}\t{}",
                dir.path().join("never-written.pem").display(),
                target.display()
            ),
        )
        .env(SCRIPT_VAR, format!("touch {}", marker.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(100), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("never-written.pem"),
        "{}",
        stderr(&out)
    );
    assert!(!marker.exists());
}

/// Under `sluice run`, the audit checkpoint key (a regular file sluice
/// hides) cannot be opened: the same hiding, through the binary.
#[test]
fn a_workload_under_sluice_run_cannot_open_the_checkpoint_key() {
    let Some(w) = World::new() else { return };
    let policy = w.policy(
        "version: 1\nname: files\nrules:\n  - name: origin\n    action: allow\n    \
         cidrs: [\"198.18.0.1/32\"]\n    ports: [8080]\ndns:\n  upstream: []\n",
    );
    let key = w.state_dir().join("audit.key");
    let out = w.run(
        &policy,
        &[
            "sh",
            "-c",
            &format!("cat {} 2>&1; echo read=$?", key.display()),
        ],
    );
    let text = stdout(&out);
    assert!(key.exists(), "sluice made no key: {}", stderr(&out));
    assert!(
        text.contains("Permission denied"),
        "{text}\n{}",
        stderr(&out)
    );
    assert!(text.contains("read=1"), "{text}");
}
