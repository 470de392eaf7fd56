//! `sluice completions SHELL`: the shell completion script for sluice,
//! printed to stdout (the Debian package installs the bash, zsh and fish
//! ones; scripts/package). Generated from the clap command, so it never
//! lists a subcommand or an option sluice does not have.

use clap::{Args, CommandFactory, ValueEnum};

/// The shells a completion script is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Shell {
    Bash,
    Zsh,
    Fish,
}

pub(crate) const AFTER_HELP: &str = "Install it where the shell looks, e.g. \
`sluice completions bash > /usr/share/bash-completion/completions/sluice`, \
`sluice completions zsh > /usr/share/zsh/vendor-completions/_sluice`, \
`sluice completions fish > /usr/share/fish/vendor_completions.d/sluice.fish` \
(the Debian package installs all three).";

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub(crate) shell: Shell,
}

pub(crate) fn execute(args: CompletionsArgs) -> anyhow::Result<i32> {
    let mut out = std::io::stdout().lock();
    write(args.shell, &mut out);
    Ok(0)
}

/// The completion script for `shell`, written to `out`.
pub(crate) fn write(shell: Shell, out: &mut dyn std::io::Write) {
    let mut cmd = without_hidden_subcommands(super::Cli::command());
    let name = cmd.get_name().to_string();
    match shell {
        Shell::Bash => clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, name, out),
        Shell::Zsh => clap_complete::generate(clap_complete::Shell::Zsh, &mut cmd, name, out),
        Shell::Fish => clap_complete::generate(clap_complete::Shell::Fish, &mut cmd, name, out),
    }
}

/// `cmd` without its hidden subcommands (the bench helpers, `man`):
/// clap_complete's bash script would offer them, its zsh and fish ones not.
fn without_hidden_subcommands(cmd: clap::Command) -> clap::Command {
    let mut visible = clap::Command::new(super::NAME)
        .version(env!("CARGO_PKG_VERSION"))
        .subcommand_required(true);
    if let Some(about) = cmd.get_about() {
        visible = visible.about(about.clone());
    }
    for arg in cmd.get_arguments() {
        visible = visible.arg(arg.clone());
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        visible = visible.subcommand(sub.clone());
    }
    visible
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_gets_a_script_that_completes_subcommands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut out = Vec::new();
            write(shell, &mut out);
            let script = String::from_utf8(out).expect("a script is text");
            assert!(!script.is_empty(), "{shell:?}");
            for subcommand in ["run", "daemon", "oci-hook", "completions"] {
                assert!(script.contains(subcommand), "{shell:?} lacks {subcommand}");
            }
            assert!(
                !script.contains("bench-client"),
                "{shell:?} lists a hidden command"
            );
        }
    }
}
