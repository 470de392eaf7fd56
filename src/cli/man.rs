//! `sluice man DIR` (hidden): one roff manual page per command and
//! subcommand (`sluice.1`, `sluice-run.1`, `sluice-bundle-sign.1`, ...)
//! written into DIR, from the clap command, for scripts/package. Hidden
//! commands (the bench helpers, this one) get no page.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, CommandFactory};

#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// The directory the pages are written into (created if missing).
    #[arg(value_name = "DIR")]
    pub(crate) dir: PathBuf,
}

pub(crate) fn execute(args: ManArgs) -> anyhow::Result<i32> {
    write_pages(&args.dir)
        .with_context(|| format!("cannot write the manual pages into {}", args.dir.display()))?;
    Ok(0)
}

/// Every visible command's page, `<name>-<sub>...1`, into `dir`, each
/// headed `sluice VERSION` (clap_mangen's `generate_to` would give a
/// subcommand's page only its own name there) and undated, so the same
/// sources make the same pages.
pub(crate) fn write_pages(dir: &std::path::Path) -> std::io::Result<()> {
    fn write(cmd: clap::Command, dir: &std::path::Path, source: &str) -> std::io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            write(sub.clone(), dir, source)?;
        }
        clap_mangen::Man::new(cmd)
            .source(source.to_string())
            .manual("sluice manual")
            .generate_to(dir)
            .map(drop)
    }
    std::fs::create_dir_all(dir)?;
    let mut cmd = super::Cli::command().disable_help_subcommand(true);
    cmd.build();
    write(cmd, dir, &format!("sluice {}", env!("CARGO_PKG_VERSION")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sluice`, then each visible subcommand's dashed name, recursively.
    fn visible_names(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
        out.push(prefix.to_string());
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() != "help" {
                visible_names(sub, &format!("{prefix}-{}", sub.get_name()), out);
            }
        }
    }

    #[test]
    fn every_visible_command_and_subcommand_gets_a_page() {
        let dir = tempfile::tempdir().unwrap();
        write_pages(dir.path()).unwrap();
        let mut expected = Vec::new();
        visible_names(&crate::cli::Cli::command(), "sluice", &mut expected);
        for name in [
            "sluice",
            "sluice-run",
            "sluice-bundle-sign",
            "sluice-completions",
        ] {
            assert!(
                expected.iter().any(|e| e == name),
                "{name} is not a command"
            );
        }
        let mut written: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        written.sort();
        let mut wanted: Vec<String> = expected.iter().map(|n| format!("{n}.1")).collect();
        wanted.sort();
        assert_eq!(written, wanted);
        let run = std::fs::read_to_string(dir.path().join("sluice-run.1")).unwrap();
        assert!(run.contains("\\-\\-policy"), "{run}");
        let title = format!(
            ".TH sluice-run 1  \"sluice {}\" \"sluice manual\"",
            env!("CARGO_PKG_VERSION")
        );
        assert!(run.contains(&title), "{run}");
    }
}
