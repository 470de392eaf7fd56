//! The verdict on one destination and hostname, as every connection and
//! every checked request gets it: sluice's own addresses are refused first,
//! then the policy decides, and a hostname that a hosts rule allows but the
//! resolver had no answer for is verified (resolved by sluice itself)
//! before it is refused as a mismatch. It never admits what the policy
//! would not admit with a complete DNS history; the lookup only adds the
//! history the sandbox did not make through sluice.

use std::net::SocketAddr;

use super::ProxyContext;
use crate::policy::{AnyResolution, Decision, Policy, Reason, Verdict};

/// Decide a connection (or a request on one) to `dst` naming `host`.
pub(super) async fn decide<'p>(
    ctx: &ProxyContext,
    policy: &'p Policy,
    dst: SocketAddr,
    host: Option<&str>,
) -> Decision<'p> {
    if ctx.internal.contains(dst) {
        return Decision {
            verdict: Verdict::Deny,
            rule: None,
            reason: Reason::InternalAddress,
        };
    }
    let decision = policy.decide(dst, host, &*ctx.resolver);
    if decision.reason != Reason::HostAddressMismatch {
        return decision;
    }
    let Some(name) = host else {
        return decision;
    };
    if !ctx.resolver.verify(name, dst.ip()).await {
        return decision;
    }
    // Only the one (name, address) pair a mismatch is about was verified,
    // and the policy asks about no other.
    policy.decide(dst, host, &AnyResolution)
}
