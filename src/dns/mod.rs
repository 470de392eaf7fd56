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
mod server;
mod upstream;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use crate::audit::{AuditEvent, AuditLog, Proto};
use crate::bundle::PolicyHandle;
use crate::policy::Mode;

pub use cache::{DnsCache, MAX_NAMES, MIN_TTL};
pub use server::{serve_tcp, serve_udp, MAX_TCP_CONNECTIONS, MAX_UDP_IN_FLIGHT, TCP_IDLE_TIMEOUT};
pub use upstream::UPSTREAM_TIMEOUT;

/// TTL of answers from `dns.hosts`.
pub const HOSTS_TTL: u32 = 60;
/// EDNS payload size advertised in answers sluice builds itself.
const EDNS_PAYLOAD: u16 = 1232;

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
pub async fn answer(query: &[u8], ctx: &DnsContext, client: SocketAddr) -> Option<Vec<u8>> {
    let parsed = Message::from_vec(query).ok()?;
    if parsed.metadata.message_type != MessageType::Query {
        return None; // never answer an answer
    }
    if parsed.metadata.op_code != OpCode::Query {
        return reply(&parsed, ResponseCode::NotImp, Vec::new());
    }
    if parsed.queries.len() != 1 {
        return reply(&parsed, ResponseCode::FormErr, Vec::new());
    }
    let question = &parsed.queries[0];
    let name = plain_name(question.name());
    let policy = ctx.policy.current();
    let dns = policy.dns();
    // A name the policy defines in `dns.hosts` is admitted too: its author
    // named it (typically for a cidrs rule, as in DESIGN.md's example).
    let admitted = name
        .as_deref()
        .is_some_and(|n| dns.hosts.contains_key(n) || policy.admits_name(n));
    if let Some(metrics) = ctx.metrics.as_ref() {
        metrics.dns_query(if admitted { "allow" } else { "refused" });
    }
    if !admitted {
        let enforce = policy.mode() == Mode::Enforce;
        let host = name.clone().unwrap_or_else(|| question.name().to_ascii());
        let verdict = if enforce { "deny" } else { "would-deny" };
        tracing::debug!(%client, %host, qtype = %question.query_type(), "DNS {verdict}");
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
        if enforce {
            return reply(&parsed, ResponseCode::Refused, Vec::new());
        }
    }

    // Static answers: the name is defined here, whatever the type.
    if let Some(ips) = name.as_deref().and_then(|n| dns.hosts.get(n)) {
        let qtype = question.query_type();
        let family: Vec<IpAddr> = ips
            .iter()
            .copied()
            .filter(|ip| match qtype {
                RecordType::A => ip.is_ipv4(),
                RecordType::AAAA => ip.is_ipv6(),
                _ => false,
            })
            .collect();
        let answers = family
            .iter()
            .map(|&ip| {
                let data = match ip {
                    IpAddr::V4(v4) => RData::A(A(v4)),
                    IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
                };
                Record::from_rdata(question.name().clone(), HOSTS_TTL, data)
            })
            .collect();
        if let Some(n) = name.as_deref() {
            let ttl = Duration::from_secs(HOSTS_TTL.into());
            ctx.cache.remember(n, &family, ttl);
        }
        return reply(&parsed, ResponseCode::NoError, answers);
    }

    let upstreams = match &dns.upstream {
        Some(list) => list.as_slice(),
        None => ctx.default_upstream.as_slice(),
    };
    if upstreams.is_empty() {
        // `upstream: []` means "only the static hosts"; no configured and
        // no host resolver is a failure, not proof the name is absent.
        let code = if dns.upstream.is_some() {
            ResponseCode::NXDomain
        } else {
            ResponseCode::ServFail
        };
        return reply(&parsed, code, Vec::new());
    }
    match upstream::forward(query, &parsed, upstreams).await {
        Some(forwarded) => {
            remember_answer(&ctx.cache, question.name(), &forwarded.message);
            Some(forwarded.bytes)
        }
        None => reply(&parsed, ResponseCode::ServFail, Vec::new()),
    }
}

/// The name as policy sees it: lowercase labels of letters, digits, `-`
/// and `_`, joined by dots, no trailing dot. `None` for the root or any
/// label with other bytes (such a name can match no rule).
fn plain_name(name: &Name) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    for label in name.iter() {
        let ok = !label.is_empty()
            && label
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return None;
        }
        if !out.is_empty() {
            out.push('.');
        }
        out.extend(label.iter().map(|&b| char::from(b.to_ascii_lowercase())));
    }
    (!out.is_empty()).then_some(out)
}

/// A response to `query` built here: id, opcode, RD and CD mirrored, RA set,
/// the question echoed (unless it is malformed), EDNS if the query had it.
fn reply(query: &Message, code: ResponseCode, answers: Vec<Record>) -> Option<Vec<u8>> {
    let mut msg = Message::response(query.metadata.id, query.metadata.op_code);
    msg.metadata.recursion_desired = query.metadata.recursion_desired;
    msg.metadata.checking_disabled = query.metadata.checking_disabled;
    msg.metadata.recursion_available = true;
    msg.metadata.response_code = code;
    if code != ResponseCode::FormErr {
        msg.queries = query.queries.clone();
    }
    msg.answers = answers;
    if query.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        msg.edns = Some(edns);
    }
    msg.to_vec().ok()
}

/// Remember the addresses of an upstream answer: for the asked name all
/// addresses at the end of its CNAME chain, and for each CNAME target its
/// own. Records off the chain (unsolicited names) are ignored.
fn remember_answer(cache: &DnsCache, asked: &Name, message: &Message) {
    let mut chain: Vec<&Name> = vec![asked];
    // Each pass adds at least one name or stops; bounded by the answer count.
    for _ in 0..message.answers.len().min(16) {
        let before = chain.len();
        for record in &message.answers {
            if let RData::CNAME(target) = &record.data {
                if chain.contains(&&record.name) && !chain.contains(&&target.0) {
                    chain.push(&target.0);
                }
            }
        }
        if chain.len() == before {
            break;
        }
    }
    let mut all = Vec::new();
    let mut ttl = u32::MAX;
    for (i, owner) in chain.iter().enumerate() {
        let mut ips = Vec::new();
        for record in message.answers.iter().filter(|r| &&r.name == owner) {
            let ip = match &record.data {
                RData::A(a) => IpAddr::V4(a.0),
                RData::AAAA(aaaa) => IpAddr::V6(aaaa.0),
                _ => continue,
            };
            ips.push(ip);
            ttl = ttl.min(record.ttl);
        }
        if ips.is_empty() {
            continue;
        }
        if i > 0 {
            if let Some(alias) = plain_name(owner) {
                cache.remember_alias(&alias, &ips, Duration::from_secs(ttl.into()));
            }
        }
        all.extend(ips);
    }
    if let (false, Some(asked)) = (all.is_empty(), plain_name(asked)) {
        cache.remember(&asked, &all, Duration::from_secs(ttl.into()));
    }
}

#[cfg(test)]
mod tests;
