//! `sluice doctor`: its arguments, and the report as text or JSON. The
//! checks are `doctor`'s.

use std::io::Write;

use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::doctor::{Kind, Options, Report, Status};
use crate::exit_class::ExitClass;

pub(crate) const AFTER_HELP: &str = "Checks, for each kind of workload asked for, what this \
machine has and lacks, and prints each lack with the command that fixes it: host (`sluice run`: \
root and capabilities, a network namespace with sluice's nftables table applied and read back, \
the seccomp filter, descriptors), oci (`sluice oci`: podman, runc), vm (`sluice vm`: a tap's \
fence through libnftables and the netdev family, QEMU, /dev/kvm, the guest kit), daemon (`sluice \
daemon`: the OCI hook installed). A check that needs the machine tries it in a throwaway network \
namespace or thread; doctor installs nothing, loads no kernel module and changes nothing. Run it \
as root: without root, every check that needs privilege fails for that reason.\n\n\
A `warn` line lacks something no kind asked for needs: libnftables for host sandboxes (no drop \
counts without it), /dev/kvm (TCG emulation works), the guest kit (only the tests and `sluice \
bench` boot it), descriptors for sluice's default --max-connections (sluice then relays fewer at \
once). With --max-connections N, a descriptor limit that cannot hold N connections is missing.\n\n\
Exit status: 0 when everything the asked kinds need is there (warnings do not count); 3 when \
something is missing (the status `sluice run` exits with when it cannot enforce); 2 on bad \
arguments. docs/doctor.md says what each check means.\n\n\
Examples:\n  sudo sluice doctor\n  sudo sluice doctor --kind all\n  sudo sluice doctor --kind \
host,vm --max-connections 20000 --json";

/// A kind of workload on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum KindArg {
    /// `sluice run`: a command on the host.
    Host,
    /// `sluice oci`: a podman container.
    Oci,
    /// `sluice vm`: a microVM behind a tap.
    Vm,
    /// `sluice daemon` and its OCI hook.
    Daemon,
    /// Every kind.
    All,
}

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// The kinds of workload to check for (comma-separated or repeated).
    #[arg(
        long = "kind",
        value_name = "KIND",
        value_enum,
        value_delimiter = ',',
        default_value = "host"
    )]
    pub(crate) kinds: Vec<KindArg>,
    /// Print one JSON document (ok, ready per kind, and every check's name,
    /// kinds, required_by, status, detail and fix) instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Fail unless the descriptor limit holds N connections relayed at once
    /// (without it, a limit too low for sluice's default 4096 is a warning).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_connections: Option<u64>,
}

pub(crate) fn execute(args: DoctorArgs) -> anyhow::Result<i32> {
    let options = Options {
        kinds: kinds(&args.kinds),
        max_connections: args
            .max_connections
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let report = crate::doctor::run(&options);
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = json(&report);
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)
    } else {
        write!(out, "{}", text(&report))
    }
    .context("cannot write the report to stdout")?;
    Ok(if report.all_ready() {
        0
    } else {
        ExitClass::CannotEnforce.code()
    })
}

/// The kinds asked for, `all` spelled out.
fn kinds(args: &[KindArg]) -> Vec<Kind> {
    let mut kinds = Vec::new();
    for arg in args {
        match arg {
            KindArg::Host => kinds.push(Kind::Host),
            KindArg::Oci => kinds.push(Kind::Oci),
            KindArg::Vm => kinds.push(Kind::Vm),
            KindArg::Daemon => kinds.push(Kind::Daemon),
            KindArg::All => kinds.extend(Kind::ALL),
        }
    }
    kinds
}

/// The report as one JSON document.
fn json(report: &Report) -> serde_json::Value {
    let ready: serde_json::Map<String, serde_json::Value> = report
        .kinds
        .iter()
        .map(|kind| (kind.as_str().to_string(), report.ready(*kind).into()))
        .collect();
    serde_json::json!({
        "ok": report.all_ready(),
        "ready": ready,
        "checks": report.checks,
    })
}

/// The report as text: a line per check (a lack's fix below it), then a
/// line per kind.
fn text(report: &Report) -> String {
    let several = report.kinds.len() > 1;
    let mut out = String::new();
    for check in &report.checks {
        let status = match check.status {
            Status::Ok => "ok",
            Status::Missing => "MISSING",
            Status::Warn => "warn",
        };
        let kinds = if several {
            let names: Vec<&str> = check.kinds.iter().map(|k| k.as_str()).collect();
            format!(" [{}]", names.join(","))
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{status:<8} {:<16} {}{kinds}\n",
            check.name, check.detail
        ));
        if let Some(fix) = &check.fix {
            out.push_str(&format!("{:<8} {:<16} fix: {fix}\n", "", ""));
        }
    }
    out.push('\n');
    for kind in &report.kinds {
        let missing: Vec<&str> = report.missing_for(*kind).map(|c| c.name).collect();
        let warnings = report.warnings_for(*kind).count();
        let warned = match warnings {
            0 => String::new(),
            1 => " (1 warning)".to_string(),
            n => format!(" ({n} warnings)"),
        };
        if missing.is_empty() {
            out.push_str(&format!("{}: ready{warned}\n", kind.as_str()));
        } else {
            out.push_str(&format!(
                "{}: NOT READY, missing {}{warned}\n",
                kind.as_str(),
                missing.join(", ")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Check;

    fn report() -> Report {
        Report {
            kinds: vec![Kind::Host, Kind::Vm],
            checks: vec![
                Check {
                    name: "root",
                    kinds: vec![Kind::Host, Kind::Vm],
                    required_by: vec![Kind::Host, Kind::Vm],
                    status: Status::Ok,
                    detail: "running as root (uid 0)".into(),
                    fix: None,
                },
                Check {
                    name: "qemu",
                    kinds: vec![Kind::Vm],
                    required_by: vec![Kind::Vm],
                    status: Status::Missing,
                    detail: "qemu-system-x86_64 is not on PATH".into(),
                    fix: Some("apt-get install qemu-system-x86".into()),
                },
            ],
        }
    }

    #[test]
    fn all_means_every_kind() {
        assert_eq!(kinds(&[KindArg::All]), Kind::ALL.to_vec());
        assert_eq!(
            kinds(&[KindArg::Vm, KindArg::Host]),
            vec![Kind::Vm, Kind::Host]
        );
    }

    #[test]
    fn the_text_gives_each_lack_its_fix_and_each_kind_its_readiness() {
        let text = text(&report());
        assert!(text.contains("MISSING  qemu"), "{text}");
        assert!(
            text.contains("fix: apt-get install qemu-system-x86"),
            "{text}"
        );
        assert!(text.contains("host: ready\n"), "{text}");
        assert!(text.contains("vm: NOT READY, missing qemu\n"), "{text}");
    }

    #[test]
    fn the_json_says_ok_ready_per_kind_and_every_check() {
        let doc = json(&report());
        assert_eq!(doc["ok"], false);
        assert_eq!(doc["ready"]["host"], true);
        assert_eq!(doc["ready"]["vm"], false);
        assert_eq!(doc["checks"][1]["name"], "qemu");
        assert_eq!(doc["checks"][1]["status"], "missing");
        assert_eq!(doc["checks"][1]["kinds"][0], "vm");
        assert_eq!(doc["checks"][1]["fix"], "apt-get install qemu-system-x86");
        assert_eq!(doc["checks"][0]["fix"], serde_json::Value::Null);
    }

    #[test]
    fn kinds_parse_comma_separated_and_repeated() {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from([
            "sluice", "doctor", "--kind", "host,vm", "--kind", "oci", "--json",
        ])
        .unwrap();
        let crate::cli::Command::Doctor(args) = cli.command else {
            panic!("not doctor");
        };
        assert_eq!(args.kinds, [KindArg::Host, KindArg::Vm, KindArg::Oci]);
        assert!(args.json);
        let refused =
            crate::cli::Cli::try_parse_from(["sluice", "doctor", "--max-connections", "0"]);
        assert!(refused.is_err());
    }
}
