//! What kind of failure an error is, as sluice's exit status says it
//! (DESIGN.md, "Command line"; docs/architecture.md, "Errors and exit
//! status"): each of the library's error types says its own class
//! ([`Classified`]), variant by variant. The command line (`cli::exit`) asks the outermost classified
//! cause of an error's chain, so the type that knows the context decides
//! (a `BadInput` wrapper, or an `AttachError` for the `ConfineError` inside
//! it); a chain with none is [`ExitClass::CannotEnforce`].
//!
//! A small leaf: it imports nothing of sluice's, and never prints or exits.

use std::error::Error;

/// The kind of failure, and so the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExitClass {
    /// 2: what the user gave is wrong: a policy, a bundle, an argument, a
    /// file that cannot be read or written, a sandbox id, a request the
    /// daemon refused as bad.
    BadInput,
    /// 3: this machine cannot enforce (not root, libnftables missing, the
    /// ruleset did not read back as applied, a namespace or socket that
    /// cannot be made), or sluice could not set itself up.
    CannotEnforce,
    /// 4: no daemon answers at the control socket.
    NoDaemon,
    /// 126: the wrapped command exists but cannot be run.
    CommandCannotRun,
    /// 127: the wrapped command was not found.
    CommandNotFound,
}

impl ExitClass {
    /// The exit status.
    pub(crate) const fn code(self) -> i32 {
        match self {
            ExitClass::BadInput => 2,
            ExitClass::CannotEnforce => 3,
            ExitClass::NoDaemon => 4,
            ExitClass::CommandCannotRun => 126,
            ExitClass::CommandNotFound => 127,
        }
    }

    /// A command that could not be started, by why: not found (127) or
    /// found and not runnable (126), as shells and `env` say it.
    pub(crate) fn of_spawn(err: &std::io::Error) -> ExitClass {
        match err.kind() {
            std::io::ErrorKind::NotFound => ExitClass::CommandNotFound,
            _ => ExitClass::CommandCannotRun,
        }
    }
}

/// An error that says what kind of failure it is.
pub(crate) trait Classified: Error {
    fn exit_class(&self) -> ExitClass;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spawn_error_says_not_found_or_cannot_run() {
        let not_found = std::io::Error::from(std::io::ErrorKind::NotFound);
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(ExitClass::of_spawn(&not_found).code(), 127);
        assert_eq!(ExitClass::of_spawn(&denied).code(), 126);
    }
}
