//! What sluice's resolver told the sandbox: name -> addresses (each with an
//! expiry) and address -> the name most recently resolved to it.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use crate::policy::ResolvedNames;

/// Names kept before the least recently remembered is evicted.
pub(crate) const MAX_NAMES: usize = 65_536;
/// Addresses kept per name (the soonest to expire goes first).
pub(crate) const MAX_ADDRS_PER_NAME: usize = 32;
/// Floor on how long an answer counts, so that a connection made shortly
/// after a low-TTL answer still matches.
pub(crate) const MIN_TTL: Duration = Duration::from_secs(60);
/// Ceiling, so that no absurd TTL pins a stale binding.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// Thread-safe resolution memory shared by the DNS responder (writer) and
/// the proxy (reader, once per connection). Names are compared
/// case-insensitively with any trailing dot ignored; IPv4-mapped IPv6
/// addresses are treated as the IPv4 address they carry.
pub struct DnsCache {
    inner: RwLock<Inner>,
    capacity: usize,
}

#[derive(Default)]
struct Inner {
    names: HashMap<String, NameEntry>,
    /// address -> (name, expiry) of the most recent answer containing it.
    reverse: HashMap<IpAddr, (String, Instant)>,
    /// Remember order for eviction: (stamp, name); stale when the name's
    /// entry carries a newer stamp.
    order: VecDeque<(u64, String)>,
    next_stamp: u64,
}

struct NameEntry {
    addrs: Vec<(IpAddr, Instant)>,
    stamp: u64,
}

impl Default for DnsCache {
    fn default() -> Self {
        Self::new()
    }
}

impl DnsCache {
    pub fn new() -> Self {
        Self::with_capacity(MAX_NAMES)
    }

    /// A cache holding at most `capacity` names (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        DnsCache {
            inner: RwLock::new(Inner::default()),
            capacity: capacity.max(1),
        }
    }

    /// Record that `name` resolved to `ips`, valid for `ttl` (clamped to
    /// [`MIN_TTL`]..=[`MAX_TTL`]); each address now maps back to `name`.
    pub fn remember(&self, name: &str, ips: &[IpAddr], ttl: Duration) {
        self.insert(name, ips, ttl, true);
    }

    /// Like [`remember`](Self::remember), but the addresses do not map back
    /// to `name` (for CNAME targets: the sandbox asked for another name).
    pub(crate) fn remember_alias(&self, name: &str, ips: &[IpAddr], ttl: Duration) {
        self.insert(name, ips, ttl, false);
    }

    /// The name most recently resolved to `ip`, if that answer is still valid.
    pub fn name_for(&self, ip: IpAddr) -> Option<String> {
        let ip = ip.to_canonical();
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let (name, expiry) = inner.reverse.get(&ip)?;
        (*expiry > Instant::now()).then(|| name.clone())
    }

    /// True if `name` has an unexpired address of `ip`'s family (an
    /// IPv4-mapped address counts as IPv4): the cache has an answer for it,
    /// whether or not `ip` is in it.
    pub(crate) fn knows(&self, name: &str, ip: IpAddr) -> bool {
        let v4 = ip.to_canonical().is_ipv4();
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        inner.names.get(&normalize(name)).is_some_and(|e| {
            e.addrs
                .iter()
                .any(|&(a, exp)| a.is_ipv4() == v4 && exp > now)
        })
    }

    /// Number of names held.
    pub fn len(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert(&self, name: &str, ips: &[IpAddr], ttl: Duration, reverse: bool) {
        let key = normalize(name);
        if key.is_empty() || ips.is_empty() {
            return;
        }
        let now = Instant::now();
        let expiry = now + ttl.clamp(MIN_TTL, MAX_TTL);
        let mut guard = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *guard;
        let stamp = inner.next_stamp;
        inner.next_stamp += 1;

        let entry = inner.names.entry(key.clone()).or_insert(NameEntry {
            addrs: Vec::new(),
            stamp,
        });
        entry.stamp = stamp;
        // Drop expired addresses, then refresh or add the new ones.
        let mut dropped = Vec::new();
        entry.addrs.retain(|&(ip, exp)| {
            let keep = exp > now;
            if !keep {
                dropped.push(ip);
            }
            keep
        });
        for ip in ips.iter().map(IpAddr::to_canonical) {
            match entry.addrs.iter_mut().find(|(a, _)| *a == ip) {
                Some(slot) => slot.1 = slot.1.max(expiry),
                None => entry.addrs.push((ip, expiry)),
            }
        }
        if entry.addrs.len() > MAX_ADDRS_PER_NAME {
            entry.addrs.sort_by_key(|&(_, exp)| std::cmp::Reverse(exp));
            dropped.extend(entry.addrs.drain(MAX_ADDRS_PER_NAME..).map(|(ip, _)| ip));
        }
        for ip in dropped {
            remove_reverse(&mut inner.reverse, ip, &key);
        }
        if reverse {
            for ip in ips.iter().map(IpAddr::to_canonical) {
                if let Some(&(_, exp)) = entry.addrs.iter().find(|(a, _)| *a == ip) {
                    inner.reverse.insert(ip, (key.clone(), exp));
                }
            }
        }
        inner.order.push_back((stamp, key));
        inner.evict(self.capacity);
    }
}

impl Inner {
    fn evict(&mut self, capacity: usize) {
        while self.names.len() > capacity {
            let Some((stamp, name)) = self.order.pop_front() else {
                break;
            };
            if self.names.get(&name).is_some_and(|e| e.stamp == stamp) {
                if let Some(entry) = self.names.remove(&name) {
                    for (ip, _) in entry.addrs {
                        remove_reverse(&mut self.reverse, ip, &name);
                    }
                }
            }
        }
        // Re-remembered names leave stale order entries behind; compact
        // before they outgrow the names themselves.
        if self.order.len() > 2 * capacity.max(self.names.len()) {
            let names = &self.names;
            self.order
                .retain(|(stamp, name)| names.get(name).is_some_and(|e| e.stamp == *stamp));
        }
    }
}

fn remove_reverse(reverse: &mut HashMap<IpAddr, (String, Instant)>, ip: IpAddr, name: &str) {
    if reverse.get(&ip).is_some_and(|(n, _)| n == name) {
        reverse.remove(&ip);
    }
}

/// Lowercase, without one trailing dot.
pub(crate) fn normalize(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

impl ResolvedNames for DnsCache {
    fn resolved(&self, name: &str, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let name = name.strip_suffix('.').unwrap_or(name);
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        // Names are stored lowercased; avoid allocating when already so.
        let entry = if name.bytes().any(|b| b.is_ascii_uppercase()) {
            inner.names.get(&name.to_ascii_lowercase())
        } else {
            inner.names.get(name)
        };
        let now = Instant::now();
        entry.is_some_and(|e| e.addrs.iter().any(|&(a, exp)| a == ip && exp > now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn remembered_name_resolves_case_insensitively() {
        let cache = DnsCache::new();
        cache.remember("PyPI.org.", &[ip("198.18.0.7")], Duration::from_secs(1));
        assert!(cache.resolved("pypi.org", ip("198.18.0.7")));
        assert!(cache.resolved("PYPI.ORG.", ip("198.18.0.7")));
        assert!(!cache.resolved("pypi.org", ip("198.18.0.8")));
        assert!(!cache.resolved("other.org", ip("198.18.0.7")));
        assert_eq!(
            cache.name_for(ip("198.18.0.7")).as_deref(),
            Some("pypi.org")
        );
        assert_eq!(cache.name_for(ip("198.18.0.8")), None);
    }

    #[test]
    fn addresses_accumulate_and_reverse_is_most_recent() {
        let cache = DnsCache::new();
        let ttl = Duration::from_secs(300);
        cache.remember("a.test", &[ip("198.18.0.1")], ttl);
        cache.remember("a.test", &[ip("198.18.0.2")], ttl);
        cache.remember("b.test", &[ip("198.18.0.1"), ip("2001:db8::1")], ttl);
        assert!(cache.resolved("a.test", ip("198.18.0.1")));
        assert!(cache.resolved("a.test", ip("198.18.0.2")));
        assert!(cache.resolved("b.test", ip("2001:db8::1")));
        assert_eq!(cache.name_for(ip("198.18.0.1")).as_deref(), Some("b.test"));
        assert_eq!(cache.name_for(ip("198.18.0.2")).as_deref(), Some("a.test"));
    }

    #[test]
    fn alias_does_not_claim_the_address() {
        let cache = DnsCache::new();
        let ttl = Duration::from_secs(60);
        cache.remember_alias("cdn.test", &[ip("198.18.0.9")], ttl);
        assert!(cache.resolved("cdn.test", ip("198.18.0.9")));
        assert_eq!(cache.name_for(ip("198.18.0.9")), None);
    }

    #[test]
    fn oldest_name_is_evicted_at_capacity() {
        let cache = DnsCache::with_capacity(3);
        let ttl = Duration::from_secs(60);
        for i in 0..4u8 {
            cache.remember(&format!("n{i}.test"), &[IpAddr::from([198, 18, 1, i])], ttl);
        }
        assert_eq!(cache.len(), 3);
        assert!(!cache.resolved("n0.test", IpAddr::from([198, 18, 1, 0])));
        assert_eq!(cache.name_for(IpAddr::from([198, 18, 1, 0])), None);
        assert!(cache.resolved("n3.test", IpAddr::from([198, 18, 1, 3])));
        // Refreshing n1 makes n2 the oldest.
        cache.remember("n1.test", &[IpAddr::from([198, 18, 1, 1])], ttl);
        cache.remember("n4.test", &[IpAddr::from([198, 18, 1, 4])], ttl);
        assert!(cache.resolved("n1.test", IpAddr::from([198, 18, 1, 1])));
        assert!(!cache.resolved("n2.test", IpAddr::from([198, 18, 1, 2])));
    }

    #[test]
    fn order_queue_stays_bounded_under_refreshes() {
        let cache = DnsCache::with_capacity(4);
        for i in 0..10_000u32 {
            let name = format!("n{}.test", i % 2);
            cache.remember(&name, &[IpAddr::from([198, 18, 2, 1])], MIN_TTL);
        }
        let inner = cache.inner.read().unwrap();
        assert!(inner.order.len() <= 8, "{}", inner.order.len());
    }

    #[test]
    fn addresses_per_name_are_capped() {
        let cache = DnsCache::new();
        let ips: Vec<IpAddr> = (0..100u8).map(|i| IpAddr::from([198, 18, 3, i])).collect();
        cache.remember("many.test", &ips, MIN_TTL);
        let inner = cache.inner.read().unwrap();
        assert_eq!(inner.names["many.test"].addrs.len(), MAX_ADDRS_PER_NAME);
        assert!(inner.reverse.len() <= MAX_ADDRS_PER_NAME);
    }

    #[test]
    fn ipv4_mapped_addresses_match_their_ipv4() {
        let cache = DnsCache::new();
        cache.remember("m.test", &[ip("::ffff:198.18.0.5")], MIN_TTL);
        assert!(cache.resolved("m.test", ip("198.18.0.5")));
        assert!(cache.resolved("m.test", ip("::ffff:198.18.0.5")));
        assert_eq!(cache.name_for(ip("198.18.0.5")).as_deref(), Some("m.test"));
    }

    #[test]
    fn a_name_is_known_per_family_until_its_answer_expires() {
        let cache = DnsCache::new();
        cache.remember_alias("k.test", &[ip("198.18.0.5")], MIN_TTL);
        assert!(cache.knows("K.test.", ip("198.18.0.99")));
        assert!(cache.knows("k.test", ip("::ffff:198.18.0.99")));
        assert!(!cache.knows("k.test", ip("2001:db8::5")));
        assert!(!cache.knows("other.test", ip("198.18.0.5")));
    }

    #[test]
    fn huge_ttl_does_not_overflow() {
        let cache = DnsCache::new();
        cache.remember("t.test", &[ip("198.18.0.1")], Duration::MAX);
        assert!(cache.resolved("t.test", ip("198.18.0.1")));
    }
}
