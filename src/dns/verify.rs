//! Hostnames verified without the sandbox's help (as Squid's
//! `host_verify_strict`): when a connection names a host (SNI or Host) that
//! a hosts rule allows but the cache has no answer for, sluice asks its own
//! upstreams for that name, of the destination's family, and the proxy
//! admits the connection only if the destination is among the answers.
//! Lookups are bounded in time ([`VERIFY_TIMEOUT`]), spend from the same
//! `dns.limits` budgets as the sandbox's own queries (a name in an SNI is as
//! good a covert channel as a name in a query), are cached by TTL through
//! the ordinary [`DnsCache`], and concurrent lookups of one name and family
//! share one exchange. A lookup that fails, times out or is over a budget
//! confirms nothing: the connection stays denied (never fail open).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use tokio::sync::OnceCell;

use super::cache::normalize;
use super::message::{self, Limit};
use super::{remember_answer, upstream, DnsContext};

/// The longest a connection waits for sluice's own lookup of its hostname,
/// all upstreams together.
pub(crate) const VERIFY_TIMEOUT: Duration = Duration::from_secs(3);

/// EDNS payload size sluice's own lookups advertise.
const EDNS_PAYLOAD: u16 = 1232;

/// Lookups in flight, one per (name, IPv6?): later askers wait for the
/// first one's answer instead of asking again.
#[derive(Default)]
pub struct Lookups {
    in_flight: Mutex<InFlight>,
}

/// (name, IPv6?) -> the addresses its lookup found, once it has.
type InFlight = HashMap<(String, bool), Arc<OnceCell<Arc<[IpAddr]>>>>;

impl DnsContext {
    /// Does `name` resolve to `ip`, as sluice's own upstreams answer it?
    /// Only asked when the cache has no answer of `ip`'s family for the
    /// name: if it has one, the connection's address was not in it and this
    /// says so without a lookup. A name `dns.hosts` pins is answered from
    /// there.
    pub async fn verify(&self, name: &str, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let name = normalize(name);
        let policy = self.policy.current();
        if let Some(pinned) = policy.dns().hosts.get(&name) {
            return pinned.iter().any(|p| p.to_canonical() == ip);
        }
        // Only names some allow rule could admit are worth a lookup.
        if !policy.admits_name(&name) {
            return false;
        }
        if self.cache.knows(&name, ip) {
            return false;
        }
        drop(policy);
        let found = self.lookup(&name, ip.is_ipv6()).await;
        let confirmed = found.contains(&ip);
        if let Some(metrics) = self.metrics.as_ref() {
            let result = match (confirmed, found.is_empty()) {
                (true, _) => "confirmed",
                (false, false) => "mismatch",
                (false, true) => "no-answer",
            };
            metrics.hostname_lookup(result);
        }
        confirmed
    }

    /// The addresses of `name` (A, or AAAA if `v6`), shared by everyone
    /// asking at the same time.
    async fn lookup(&self, name: &str, v6: bool) -> Arc<[IpAddr]> {
        let key = (name.to_string(), v6);
        let cell = {
            let mut map = self.lookups.lock();
            map.entry(key.clone()).or_default().clone()
        };
        let found = cell
            .get_or_init(|| async {
                match tokio::time::timeout(VERIFY_TIMEOUT, self.resolve(name, v6)).await {
                    Ok(found) => found,
                    Err(_) => {
                        tracing::debug!(name, "hostname lookup timed out");
                        Arc::from(Vec::new())
                    }
                }
            })
            .await
            .clone();
        // The answer is in the cache (or there was none): the next asker
        // starts afresh.
        let mut map = self.lookups.lock();
        if map.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            map.remove(&key);
        }
        found
    }

    /// One lookup through the upstreams, within `dns.limits`; what it
    /// teaches is remembered (without claiming the addresses for the name:
    /// the sandbox did not ask for it).
    async fn resolve(&self, name: &str, v6: bool) -> Arc<[IpAddr]> {
        let policy = self.policy.current();
        let limits = &policy.dns().limits;
        let qtype = if v6 { RecordType::AAAA } else { RecordType::A };
        let limit = if !limits.forwards_type(u16::from(qtype)) {
            Err(Limit::QueryType)
        } else if name.len() > limits.max_name_length {
            Err(Limit::NameLength)
        } else {
            self.budget.spend(name, Instant::now(), limits)
        };
        if let Err(limit) = limit {
            tracing::debug!(
                name,
                reason = limit.reason(),
                "hostname lookup over dns.limits"
            );
            if let Some(metrics) = self.metrics.as_ref() {
                metrics.dns_limited(limit.label());
                metrics.hostname_lookup("limited");
            }
            return Arc::from(Vec::new());
        }
        let Ok(qname) = Name::from_ascii(format!("{name}.")) else {
            return Arc::from(Vec::new());
        };
        let mut query = Message::new(0, MessageType::Query, OpCode::Query);
        query.metadata.recursion_desired = true;
        query.add_query(Query::query(qname.clone(), qtype));
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        query.edns = Some(edns);
        let upstreams = match &policy.dns().upstream {
            Some(list) => list.as_slice(),
            None => self.default_upstream.as_slice(),
        };
        let Some(answer) = upstream::forward(&query, upstreams).await else {
            return Arc::from(Vec::new());
        };
        remember_answer(&self.cache, &policy, &query, &answer.message, false);
        message::learned_addresses(&qname, &answer.message)
            .into_iter()
            .find(|l| !l.alias)
            .map(|l| l.ips.into_iter().map(|ip| ip.to_canonical()).collect())
            .unwrap_or_else(|| Arc::from(Vec::new()))
    }
}

impl Lookups {
    fn lock(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }
}
