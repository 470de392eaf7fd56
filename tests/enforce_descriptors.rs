//! Enforcing while sluice holds many descriptors: libnftables waits with
//! select(2), which glibc aborts the process over for a descriptor numbered
//! 1024 or more. A daemon whose sandboxes hold a thousand connections must
//! still attach, read back and count. Its own binary: it fills this
//! process's descriptor table.

mod common;

use std::os::fd::OwnedFd;

use sluice::enforce::{self, SandboxSpec};
use sluice::netns::SandboxNetns;

#[test]
fn a_table_applies_and_reads_back_while_over_1024_descriptors_are_open() {
    if !common::privileged() {
        return;
    }
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .expect("getrlimit");
    assert!(
        hard >= 1300,
        "this test needs a descriptor hard limit of at least 1300 (ulimit -Hn is {hard})"
    );
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)
        .expect("raise the descriptor limit");
    let null = std::fs::File::open("/dev/null").unwrap();
    let held: Vec<OwnedFd> = (0..1200)
        .map(|_| OwnedFd::from(null.try_clone().unwrap()))
        .collect();
    assert!(
        held.iter()
            .any(|fd| std::os::fd::AsRawFd::as_raw_fd(fd) >= 1024),
        "the next descriptor would not have been numbered 1024 or more"
    );
    let spec = SandboxSpec::host(15001, 15053);
    let ns = SandboxNetns::create().expect("create sandbox namespace");
    // The first apply and its read-back are netlink; the second apply finds
    // the table there and has libnftables replace it, which then lists it
    // and reads its counter.
    ns.run_in(move || {
        enforce::apply(&spec)?;
        enforce::verify(&spec)?;
        enforce::apply(&spec)?;
        enforce::verify_with_libnftables(&spec)?;
        enforce::dropped_packets().map(|_| ())
    })
    .unwrap()
    .expect("apply and verify with more than 1024 descriptors open");
    drop(held);
}
