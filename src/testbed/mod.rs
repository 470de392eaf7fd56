//! The testbed: what the demo, the benchmark and the end-to-end tests build
//! around sluice to exercise it on one machine. A throwaway namespace
//! standing in for the host (`topology`), the fast origin server inside it
//! (`origin`; over TLS with a throwaway CA: `tls`), the load client that
//! measures requests from the workload's side (`load`), and the test
//! microVM's kit, QEMU arguments and control port (`guest`). Nothing here is on sluice's enforcement path:
//! it only ever runs beside sluice, never inside it, and never sends
//! anything beyond this machine.

pub mod guest;
pub(crate) mod load;
pub(crate) mod origin;
pub mod tls;
pub(crate) mod topology;

pub use origin::pattern;
pub use topology::OuterNetns;
