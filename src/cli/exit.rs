//! Exit statuses of sluice's own failures (a wrapped command's status is
//! passed through unchanged): the class that the outermost classified cause
//! of an error says ([`crate::exit_class`]); an error with none (a plain
//! message about the machine or sluice itself: a thread, a signal handler, a
//! runtime that could not start, a tool that is not installed) exits
//! [`ExitClass::CannotEnforce`]. Whatever is the user's input is typed (`BadInput`,
//! or a classified error), so it never lands there.
//!
//! The list of sluice's error types is here, at the top, where every module
//! may be named; so are the classes of the errors of modules that know
//! nothing of exit statuses (`policy`, `audit`, `timing`, `dhcp`,
//! `attach::vm`).

use std::error::Error;

use crate::exit_class::{Classified, ExitClass};

/// The wrapped command was not found.
#[cfg(test)]
pub(crate) const COMMAND_NOT_FOUND: i32 = ExitClass::CommandNotFound.code();

/// The class of `err`: its outermost classified cause's, else
/// [`ExitClass::CannotEnforce`].
pub(crate) fn class_of(err: &anyhow::Error) -> ExitClass {
    err.chain()
        .find_map(class_of_cause)
        .unwrap_or(ExitClass::CannotEnforce)
}

/// Whether `$cause` is one of the types, and if so its class.
macro_rules! classify {
    ($cause:expr, $($ty:ty),+ $(,)?) => {{
        let cause: &(dyn Error + 'static) = $cause;
        None
        $(.or_else(|| cause.downcast_ref::<$ty>().map(Classified::exit_class)))+
    }};
}

/// The class of one cause, if its type is one of sluice's.
fn class_of_cause(cause: &(dyn Error + 'static)) -> Option<ExitClass> {
    classify!(
        cause,
        super::BadInput,
        super::status::NoDaemon,
        crate::sandbox_id::BadSandboxId,
        crate::attach::AttachError,
        crate::attach::oci::OciError,
        crate::attach::oci_check::Refusal,
        crate::attach::vm::VmNetError,
        crate::confine::ConfineError,
        crate::confine::NotRoot,
        crate::confine::mounts::MountError,
        crate::confine::seccomp::SeccompError,
        crate::enforce::EnforceError,
        crate::netns::NetnsError,
        crate::dhcp::DhcpError,
        crate::daemon::ClientError,
        crate::daemon::config::ConfigError,
        crate::daemon::SocketError,
        crate::metrics::ServeError,
        crate::serve::runtime::BadWorkers,
        crate::serve::runtime::BadNice,
        crate::bundle::BundleError,
        crate::policy::PolicyError,
        crate::audit::AuditError,
        crate::audit::checkpoint::KeyError,
        crate::timing::TimingError,
        crate::timing::PlotError,
        crate::mac::MacError,
    )
    .or_else(|| bench_class(cause))
}

/// The class of a `sluice bench` failure, in a build that has the bench.
#[cfg(feature = "bench")]
fn bench_class(cause: &(dyn Error + 'static)) -> Option<ExitClass> {
    classify!(cause, crate::bench::BenchError)
}

#[cfg(not(feature = "bench"))]
fn bench_class(_: &(dyn Error + 'static)) -> Option<ExitClass> {
    None
}

// The classes of the errors of modules that know nothing of exit statuses.

impl Classified for crate::policy::PolicyError {
    /// A policy that does not load is the user's to fix.
    fn exit_class(&self) -> ExitClass {
        ExitClass::BadInput
    }
}

impl Classified for crate::audit::AuditError {
    /// An audit log (or its key) that cannot be opened, rotated or
    /// written: the path the user gave for it.
    fn exit_class(&self) -> ExitClass {
        ExitClass::BadInput
    }
}

impl Classified for crate::audit::checkpoint::KeyError {
    /// A checkpoint key file that cannot be read, made or parsed.
    fn exit_class(&self) -> ExitClass {
        ExitClass::BadInput
    }
}

impl Classified for crate::timing::TimingError {
    /// A timings file that cannot be opened, written or read.
    fn exit_class(&self) -> ExitClass {
        ExitClass::BadInput
    }
}

impl Classified for crate::timing::PlotError {
    /// A plot that cannot be written where `compare` was told to.
    fn exit_class(&self) -> ExitClass {
        ExitClass::BadInput
    }
}

impl Classified for crate::dhcp::DhcpError {
    /// The DHCP responder's socket on a tap could not be made.
    fn exit_class(&self) -> ExitClass {
        ExitClass::CannotEnforce
    }
}

impl Classified for crate::attach::vm::VmNetError {
    /// A guest's addressing that does not fit (prefix, gateway, MAC).
    fn exit_class(&self) -> ExitClass {
        ExitClass::BadInput
    }
}

impl Classified for super::BadInput {
    /// The user's input, by definition.
    fn exit_class(&self) -> ExitClass {
        ExitClass::BadInput
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outermost_classified_cause_decides() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let enforce = crate::enforce::EnforceError::Netlink(io);
        let err = anyhow::Error::new(enforce).context("cannot enforce the sandbox");
        assert_eq!(class_of(&err), ExitClass::CannotEnforce);
        let wrapped: anyhow::Error = super::super::BadInput(err).into();
        assert_eq!(class_of(&wrapped), ExitClass::BadInput);
    }

    #[test]
    fn a_plain_message_is_a_failure_to_enforce() {
        let err = anyhow::anyhow!("cannot start a thread").context("cannot start");
        assert_eq!(class_of(&err), ExitClass::CannotEnforce);
    }

    #[test]
    fn a_command_that_cannot_start_says_so_through_the_attach_error() {
        let err = anyhow::Error::new(crate::attach::AttachError::Spawn {
            program: "x".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })
        .context("the workload was not started");
        assert_eq!(class_of(&err).code(), COMMAND_NOT_FOUND);
    }
}
