//! The DHCP responder's socket: one per tap, several taps in one namespace.
//! Needs root; skips loudly without it, fails under
//! SLUICE_REQUIRE_PRIVILEGED=1.

#[path = "common/vm.rs"]
mod vm;

use sluice::dhcp::{bind_on_device, DhcpError};
use sluice::testbed::OuterNetns;

fn may_run() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("SLUICE_REQUIRE_PRIVILEGED").as_deref() == Ok("1") {
        panic!("privileged test cannot run: not root (SLUICE_REQUIRE_PRIVILEGED=1)");
    }
    eprintln!("SKIPPED: the DHCP socket test needs root");
    false
}

#[test]
fn each_tap_gets_its_own_dhcp_socket_and_only_one() {
    if !may_run() {
        return;
    }
    let ns = OuterNetns::create("sluice-dhcp", &[]).expect("test namespace");
    vm::add_tap(ns.name(), "tap0", &["198.18.0.1/30"]).unwrap();
    vm::add_tap(ns.name(), "tap1", &["198.18.0.5/30"]).unwrap();
    let (first, second, again, missing) = ns
        .run_in(|| {
            (
                bind_on_device("tap0"),
                bind_on_device("tap1"),
                bind_on_device("tap0"),
                bind_on_device("tap9"),
            )
        })
        .unwrap();
    let first = first.expect("a socket on tap0");
    let _second = second.expect("a socket on tap1 beside it");
    assert_eq!(first.local_addr().unwrap().port(), 67);
    match again {
        Err(DhcpError::Bind { device, source }) => {
            assert_eq!(device, "tap0");
            assert_eq!(source.raw_os_error(), Some(libc::EADDRINUSE));
        }
        other => panic!("a second socket on tap0: {other:?}"),
    }
    assert!(
        matches!(missing, Err(DhcpError::Bind { .. })),
        "{missing:?}"
    );
}
