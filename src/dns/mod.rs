//! The DNS responder inside the sandbox. nftables steers every UDP and TCP
//! query on port 53 to sockets the integrator binds in the sandbox namespace
//! and hands to [`serve_udp`] / [`serve_tcp`]. A name that some allow rule
//! could admit is answered from the policy's static `dns.hosts` or forwarded
//! to the upstream resolvers (from sluice's own namespace); every address in
//! an answer is remembered in the [`DnsCache`], which is what lets hostname
//! rules match later connections. Any other name gets REFUSED and an audit
//! record. This module never creates namespaces or firewall rules, never
//! answers a name the policy could not admit (in enforce mode), and never
//! panics on a hostile packet.

mod cache;
pub mod message;
mod server;
mod upstream;

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};

use crate::audit::{AuditEvent, AuditLog, Proto};
use crate::bundle::PolicyHandle;
use crate::policy::Mode;

pub use cache::{DnsCache, MAX_NAMES, MIN_TTL};
use message::Action;
pub use message::HOSTS_TTL;
pub use server::{serve_tcp, serve_udp, MAX_TCP_CONNECTIONS, MAX_UDP_IN_FLIGHT, TCP_IDLE_TIMEOUT};
pub use upstream::UPSTREAM_TIMEOUT;

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
}

/// Answer one DNS message (UDP payload or TCP frame without its length).
/// `None`: not a query we can parse, drop it. The answer is not size-capped
/// for UDP here; `serve_udp` truncates it to what the client accepts.
/// The decision is [`message::plan`]'s; this adds metrics, audit, the cache
/// and the upstream exchange.
pub async fn answer(query: &[u8], ctx: &DnsContext, client: SocketAddr) -> Option<Vec<u8>> {
    let policy = ctx.policy.current();
    let plan = message::plan(query, &policy, &ctx.default_upstream);
    if let Some(asked) = plan.asked {
        if let Some(metrics) = ctx.metrics.as_ref() {
            metrics.dns_query(if asked.admitted { "allow" } else { "refused" });
        }
        if !asked.admitted {
            let enforce = policy.mode() == Mode::Enforce;
            let verdict = if enforce { "deny" } else { "would-deny" };
            let host = asked.host;
            tracing::debug!(%client, %host, qtype = %asked.qtype, "DNS {verdict}");
            ctx.audit
                .record(AuditEvent {
                    sandbox: ctx.sandbox.clone(),
                    path: ctx.path,
                    verdict,
                    rule: None,
                    reason: "dns-refused",
                    proto: Proto::Dns,
                    src: Some(client),
                    dst: None,
                    host: Some(host),
                    bundle: policy.label().to_string(),
                })
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
            match upstream::forward(query, &parsed, upstreams).await {
                Some(forwarded) => {
                    remember_answer(&ctx.cache, &parsed, &forwarded.message);
                    Some(forwarded.bytes)
                }
                None => message::reply(&parsed, ResponseCode::ServFail, Vec::new()),
            }
        }
    }
}

/// Remember what an upstream answer to `query` teaches
/// ([`message::learned_addresses`]).
fn remember_answer(cache: &DnsCache, query: &Message, answer: &Message) {
    let Some(question) = query.queries.first() else {
        return;
    };
    for learned in message::learned_addresses(question.name(), answer) {
        let ttl = Duration::from_secs(learned.ttl.into());
        if learned.alias {
            cache.remember_alias(&learned.name, &learned.ips, ttl);
        } else {
            cache.remember(&learned.name, &learned.ips, ttl);
        }
    }
}

#[cfg(test)]
mod tests;
