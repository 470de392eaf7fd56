//! The fence's addresses and drop reasons, without a kernel. Its chains
//! are pinned by the golden tests in `ruleset` (`testdata/vm.json`,
//! `testdata/vm-attach.json`), never restated here.

use super::*;

#[test]
fn the_link_local_address_is_the_modified_eui64_of_the_mac() {
    let fence = super::super::example_fence("tap0");
    assert_eq!(
        fence.guest_link_local(),
        "fe80::5054:ff:fe5c:2".parse::<Ipv6Addr>().unwrap()
    );
}

#[test]
fn reasons_name_their_counters_and_back() {
    for reason in DropReason::ALL {
        assert_eq!(DropReason::of_counter(&reason.counter()), Some(reason));
    }
    assert_eq!(DropReason::of_counter("dropped"), None);
    assert_eq!(DropReason::of_counter("dropped-nonsense"), None);
}

#[test]
fn only_the_vmms_own_namespace_counts_output() {
    let mut fence = super::super::example_fence("tap0");
    assert!(fence.reasons().contains(&DropReason::Output));
    fence.dedicated = false;
    assert!(!fence.reasons().contains(&DropReason::Output));
}
