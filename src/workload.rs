//! The workload path: which way a workload reaches sluice. A small leaf
//! (it imports nothing of sluice's) so that every module that records or
//! labels a connection, from `attach` down to `audit`, names the path with
//! the same type. Records and metric labels print it as `host`, `oci` or
//! `vm`, and only ever these: it is a bounded label value.

use std::fmt;

/// How a workload is attached to sluice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadPath {
    /// A host command under `sluice run`.
    Host,
    /// An OCI container (`sluice oci`, or the hook and the daemon).
    Oci,
    /// A microVM behind a tap device.
    Vm,
}

impl WorkloadPath {
    pub const ALL: [WorkloadPath; 3] = [WorkloadPath::Host, WorkloadPath::Oci, WorkloadPath::Vm];

    /// The name records, labels and `sluice status` print.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadPath::Host => "host",
            WorkloadPath::Oci => "oci",
            WorkloadPath::Vm => "vm",
        }
    }
}

impl fmt::Display for WorkloadPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_print_as_the_records_name_them() {
        let names: Vec<&str> = WorkloadPath::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(names, ["host", "oci", "vm"]);
        assert_eq!(WorkloadPath::Oci.to_string(), "oci");
    }
}
