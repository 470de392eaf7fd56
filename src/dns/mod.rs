//! The DNS responder inside the sandbox. nftables steers every UDP and TCP
//! query on port 53 to sockets the integrator binds in the sandbox namespace
//! and hands to [`serve_udp`] / [`serve_tcp`]. A name that some allow rule
//! could admit is answered from the policy's static `dns.hosts` or forwarded
//! to the upstream resolvers (from sluice's own namespace), rebuilt from its
//! question and within the policy's `dns.limits`; what an answer teaches
//! about names the policy could admit (never about a name `dns.hosts` pins)
//! is remembered in the [`DnsCache`], which is what lets hostname rules
//! match later connections. Any other name gets REFUSED and an audit
//! record. For the proxy it also verifies a hostname the cache does not
//! know ([`DnsContext::verify`]). This module never creates namespaces or
//! firewall rules, never answers a name the policy could not admit (in
//! enforce mode), and never panics on a hostile packet.

mod cache;
mod limits;
pub mod message;
mod server;
mod upstream;
mod verify;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};

use crate::audit::{AuditEvent, AuditLog};
use crate::bundle::PolicyHandle;
use crate::policy::{Mode, Policy};

pub use cache::DnsCache;
pub(crate) use limits::Budget;
use message::Action;
pub(crate) use message::HOSTS_TTL;
pub(crate) use server::serve_tcp;
pub use server::serve_udp;
#[cfg(test)]
pub(crate) use upstream::UPSTREAM_TIMEOUT;
pub(crate) use verify::Lookups;
#[cfg(test)]
pub(crate) use verify::VERIFY_TIMEOUT;

/// Everything a query needs; one per sandbox, shared by its servers.
pub struct DnsContext {
    pub policy: PolicyHandle,
    pub cache: std::sync::Arc<DnsCache>,
    pub audit: AuditLog,
    pub sandbox: String,
    /// How the sandbox's workload is attached (audit records' `path`).
    pub path: crate::workload::WorkloadPath,
    /// Upstreams used when the policy says nothing (`dns.upstream` absent):
    /// the host's resolv.conf nameservers, read once at startup.
    pub default_upstream: Vec<SocketAddr>,
    /// Counts `sluice_dns_queries_total{verdict}` when metrics are on.
    pub metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    /// What this sandbox forwarded lately (`dns.limits`' per-minute budgets).
    pub budget: Budget,
    /// The proxy's hostname lookups in flight, one per name and family.
    pub lookups: Lookups,
}

impl DnsContext {
    /// A sandbox's resolver context with no default upstream, no metrics
    /// and fresh budgets.
    pub fn new(
        policy: PolicyHandle,
        cache: std::sync::Arc<DnsCache>,
        audit: AuditLog,
        sandbox: String,
        path: crate::workload::WorkloadPath,
    ) -> DnsContext {
        DnsContext {
            policy,
            cache,
            audit,
            sandbox,
            path,
            default_upstream: Vec::new(),
            metrics: None,
            budget: Budget::default(),
            lookups: Lookups::default(),
        }
    }
}

/// Answer one DNS message (UDP payload or TCP frame without its length).
/// `None`: not a query we can parse, drop it. The answer is not size-capped
/// for UDP here; `serve_udp` truncates it to what the client accepts.
/// The decision is [`message::plan`]'s and the per-minute budgets'; this
/// adds metrics, audit, the cache and the upstream exchange.
pub(crate) async fn answer(query: &[u8], ctx: &DnsContext, client: SocketAddr) -> Option<Vec<u8>> {
    let policy = ctx.policy.current();
    let enforce = policy.mode() == Mode::Enforce;
    let mut plan = message::plan(query, &policy, &ctx.default_upstream);
    if let Some(asked) = plan.asked.as_mut() {
        if let (None, Action::Forward { parsed, .. }) = (asked.limit, &plan.action) {
            let spent = ctx
                .budget
                .spend(&asked.host, Instant::now(), &policy.dns().limits);
            if let Err(limit) = spent {
                asked.limit = Some(limit);
                if enforce {
                    plan.action = match message::reply(parsed, ResponseCode::Refused, Vec::new()) {
                        Some(bytes) => Action::Reply(bytes),
                        None => Action::Drop,
                    };
                }
            }
        }
    }
    if let Some(asked) = plan.asked {
        let refused = !asked.admitted || asked.limit.is_some();
        if let Some(metrics) = ctx.metrics.as_ref() {
            metrics.dns_query(if refused && enforce {
                "refused"
            } else {
                "allow"
            });
            if let Some(limit) = asked.limit {
                metrics.dns_limited(limit.label());
            }
        }
        if refused {
            let verdict = crate::outcome::Verdict::of(crate::policy::Verdict::Deny, policy.mode());
            let reason = match asked.limit {
                Some(limit) if asked.admitted => limit.reason(),
                _ => "dns-refused",
            };
            let host = asked.host;
            tracing::debug!(%client, %host, qtype = %asked.qtype, reason, "DNS {verdict}");
            ctx.audit
                .record(AuditEvent::of_dns_refusal(
                    &ctx.sandbox,
                    ctx.path,
                    verdict.as_str(),
                    reason,
                    client,
                    host,
                    policy.label(),
                ))
                .await;
        }
        if let Some((name, ips)) = asked.remember {
            let ttl = Duration::from_secs(HOSTS_TTL.into());
            ctx.cache.remember(&name, &ips, ttl);
        }
    }
    match plan.action {
        Action::Drop => None,
        Action::Reply(bytes) => Some(bytes),
        Action::Forward { parsed, upstreams } => {
            match upstream::forward(&parsed, upstreams).await {
                Some(forwarded) => {
                    remember_answer(&ctx.cache, &policy, &parsed, &forwarded.message, true);
                    Some(forwarded.bytes)
                }
                None => message::reply(&parsed, ResponseCode::ServFail, Vec::new()),
            }
        }
    }
}

/// Remember what an upstream answer to `query` teaches under `policy`
/// ([`message::remembered`]). With `claim`, the asked name's addresses also
/// map back to it (the sandbox asked for that name).
fn remember_answer(
    cache: &DnsCache,
    policy: &Policy,
    query: &Message,
    answer: &Message,
    claim: bool,
) {
    let Some(question) = query.queries.first() else {
        return;
    };
    for learned in message::remembered(question.name(), answer, policy) {
        let ttl = Duration::from_secs(learned.ttl.into());
        if learned.alias || !claim {
            cache.remember_alias(&learned.name, &learned.ips, ttl);
        } else {
            cache.remember(&learned.name, &learned.ips, ttl);
        }
    }
}

#[cfg(test)]
mod forward_tests;
#[cfg(test)]
mod tests;
