//! What `sluice bench` builds before a run when a condition lacks it: the
//! oci condition's image (containers/build-image.sh) and the microVM guest
//! kit (containers/vm/build-guest.sh), with the scripts of the source tree
//! this binary was built from. Both scripts are idempotent and say their
//! progress on stderr; a later run finds what they built. `--no-build`
//! skips such a condition instead.
//!
//! This module only runs those two scripts: it touches podman's image store
//! and the kit directory, nothing else, and never builds where the source
//! tree is gone (the condition is skipped, saying so).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// The source tree this binary was built from.
const SOURCE_TREE: &str = env!("CARGO_MANIFEST_DIR");

/// The image script, from the source tree.
const IMAGE_SCRIPT: &str = "containers/build-image.sh";

/// The guest kit script, from the source tree.
const KIT_SCRIPT: &str = "containers/vm/build-guest.sh";

/// Build `image` for the oci condition: busybox and the libraries `exe`
/// links against (the client binary is mounted in at run time).
pub(crate) fn build_image(exe: &Path, image: &str) -> Result<(), String> {
    let script = script(IMAGE_SCRIPT)?;
    eprintln!("oci: building the image {image} with {IMAGE_SCRIPT} (once: later runs find it)");
    let mut cmd = Command::new(&script);
    cmd.arg("--sluice").arg(exe).arg("--tag").arg(image);
    run(cmd, IMAGE_SCRIPT)
}

/// Build the guest kit into `dir` (minutes the first time: a kernel
/// download and a static sluice). A build that failed is not run again in
/// the same bench: vm and vm-direct share the kit, and the second would
/// pay for the same failure (a slow download twice).
pub(crate) fn build_kit(dir: &Path) -> Result<(), String> {
    static FAILED: Failures = Mutex::new(Vec::new());
    unless_failed_before(&FAILED, dir, || {
        let script = script(KIT_SCRIPT)?;
        eprintln!(
            "vm: building the guest kit in {} with {KIT_SCRIPT} (once, minutes: a kernel download and a static sluice)",
            dir.display()
        );
        let mut cmd = Command::new(&script);
        cmd.arg("--kit").arg(dir);
        run(cmd, KIT_SCRIPT)
    })
}

/// Builds that failed in this process, by directory, with why.
type Failures = Mutex<Vec<(PathBuf, String)>>;

/// `build()`, unless it failed for `dir` before: then the same error,
/// without running it again.
fn unless_failed_before(
    failures: &Failures,
    dir: &Path,
    build: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    let earlier = {
        let failures = failures.lock().unwrap_or_else(|e| e.into_inner());
        failures
            .iter()
            .find(|(d, _)| d == dir)
            .map(|(_, why)| why.clone())
    };
    if let Some(why) = earlier {
        return Err(format!("{why} (earlier in this run)"));
    }
    let built = build();
    if let Err(why) = &built {
        failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((dir.to_path_buf(), why.clone()));
    }
    built
}

/// `relative` in the source tree, or why it is not there.
fn script(relative: &str) -> Result<PathBuf, String> {
    script_in(Path::new(SOURCE_TREE), relative)
}

fn script_in(tree: &Path, relative: &str) -> Result<PathBuf, String> {
    let path = tree.join(relative);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is not here (the source tree this sluice was built from), so it cannot be built",
            path.display()
        ))
    }
}

/// Run a build script from the source tree: its progress on stderr, its
/// stdout (machine-readable lines) dropped.
fn run(mut cmd: Command, name: &str) -> Result<(), String> {
    let status = cmd
        .current_dir(SOURCE_TREE)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("cannot run {name}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{name} failed ({status}; its messages are above)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_build_scripts_are_in_the_source_tree() {
        for relative in [IMAGE_SCRIPT, KIT_SCRIPT] {
            assert!(script(relative).is_ok(), "{relative}");
        }
    }

    #[test]
    fn a_build_that_failed_is_not_run_again_for_the_same_directory() {
        let failures: Failures = Mutex::new(Vec::new());
        let runs = std::cell::Cell::new(0);
        let failing = || {
            runs.set(runs.get() + 1);
            Err("build-guest.sh failed".to_string())
        };
        let kit = Path::new("/tmp/kit-a");
        assert_eq!(
            unless_failed_before(&failures, kit, failing),
            Err("build-guest.sh failed".into())
        );
        let again = unless_failed_before(&failures, kit, failing).unwrap_err();
        assert_eq!(again, "build-guest.sh failed (earlier in this run)");
        assert_eq!(runs.get(), 1, "run once");
        let other = unless_failed_before(&failures, Path::new("/tmp/kit-b"), || Ok(()));
        assert_eq!(other, Ok(()), "another directory is built");
    }

    #[test]
    fn without_the_source_tree_nothing_is_built_and_the_reason_names_the_path() {
        let why = script_in(Path::new("/nonexistent/sluice-src"), KIT_SCRIPT).unwrap_err();
        assert!(
            why.starts_with("/nonexistent/sluice-src/containers/vm/build-guest.sh is not here"),
            "{why}"
        );
    }
}
