//! The example policies shipped in policies/ load and say what they mean.

use super::*;
use crate::policy::AnyResolution;
use std::path::Path;

fn load(name: &str) -> Policy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("policies")
        .join(name);
    Policy::load(&path).unwrap_or_else(|e| panic!("{name}:\n{e}"))
}

#[test]
fn dev_policy_loads_and_allows_the_origin() {
    let p = load("dev.yaml");
    assert_eq!(p.name(), "dev");
    assert_eq!(p.dns().upstream, Some(vec![]));
    assert_eq!(p.dns().hosts["origin.test"].len(), 2);
    assert_eq!(
        show(p.decide(sa("198.18.0.1:8443"), None, &AnyResolution)),
        "allow/allow-rule/origin"
    );
    assert_eq!(
        show(p.decide(sa("[2001:db8::1]:8080"), None, &AnyResolution)),
        "allow/allow-rule/origin"
    );
    assert_eq!(
        show(p.decide(sa("169.254.169.254:80"), None, &AnyResolution)),
        "deny/deny-rule/no-metadata"
    );
    assert!(p.admits_name("origin.test"));
}

#[test]
fn demo_policy_loads_and_keeps_the_admin_port_closed() {
    let p = load("demo.yaml");
    assert_eq!(
        show(p.decide(sa("198.18.0.1:8080"), None, &AnyResolution)),
        "allow/allow-rule/origin-http"
    );
    assert_eq!(
        show(p.decide(sa("198.18.0.1:9090"), None, &AnyResolution)),
        "deny/deny-rule/no-admin"
    );
    assert_eq!(
        show(p.decide(sa("198.18.0.1:9090"), Some("origin.test"), &AnyResolution)),
        "deny/deny-rule/no-admin"
    );
    assert_eq!(p.dns().upstream, Some(vec![]));
    assert!(p.admits_name("origin.test"));
}
