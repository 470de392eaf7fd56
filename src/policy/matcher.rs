//! The compiled matcher: rules turned into lookup tables once, so that a
//! decision is a few binary searches and hash lookups, with no allocation.
//!
//! CIDRs are laminar (two networks are either nested or disjoint), so each
//! address family becomes a sorted list of elementary segments, each pointing
//! at the innermost network covering it; networks link to their parent.
//! Looking up an address walks at most 33 (IPv4) or 129 (IPv6) networks.
//! Hostnames are two hash maps: exact names, and wildcard suffixes
//! (`*.example.com` is stored as `example.com`) probed at every dot of the
//! name. Each table entry lists rule indices in file order, so the first
//! index whose ports match is the first matching rule.

use super::model::{PortRange, Rule, Verdict};
use super::net;
use ipnet::IpNet;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;

const NONE: u32 = u32::MAX;

/// FNV-1a: the keys are the policy's own names, so no flooding concern, and
/// short-string hashing dominates a host lookup.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0 = h;
    }
}

type NameMap = HashMap<Box<str>, Box<[u32]>, BuildHasherDefault<Fnv>>;

/// All rules, compiled.
#[derive(Debug)]
pub(crate) struct Matcher {
    deny: Class,
    allow: Class,
    /// Per rule, a range into `port_ranges`; an empty range means any port.
    rule_ports: Box<[(u32, u32)]>,
    port_ranges: Box<[PortRange]>,
    /// Bit per port: some rule with `hosts` covers it.
    host_ports: Box<[u64]>,
    /// Bit per port: some deny rule with `hosts` covers it.
    deny_host_ports: Box<[u64]>,
}

/// The rules of one action.
#[derive(Debug, Default)]
struct Class {
    v4: CidrTable,
    v6: CidrTable,
    exact: NameMap,
    wild: NameMap,
}

#[derive(Debug, Default)]
struct CidrTable {
    /// Segment start addresses, ascending; a segment ends where the next starts.
    starts: Box<[u128]>,
    /// Innermost network covering each segment, or NONE.
    seg_net: Box<[u32]>,
    nets: Box<[Net]>,
}

#[derive(Debug)]
struct Net {
    parent: u32,
    rules: Box<[u32]>,
}

impl std::fmt::Debug for Fnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fnv")
    }
}

impl Matcher {
    pub(crate) fn new(rules: &[Rule]) -> Matcher {
        let mut rule_ports = Vec::with_capacity(rules.len());
        let mut port_ranges = Vec::new();
        for rule in rules {
            let start = port_ranges.len() as u32;
            port_ranges.extend_from_slice(&rule.ports);
            rule_ports.push((start, port_ranges.len() as u32));
        }
        let host_rules = rules.iter().filter(|r| !r.hosts.is_empty());
        let deny_host_rules = host_rules.clone().filter(|r| r.action == Verdict::Deny);
        Matcher {
            host_ports: port_bits(host_rules),
            deny_host_ports: port_bits(deny_host_rules),
            deny: Class::new(rules, Verdict::Deny),
            allow: Class::new(rules, Verdict::Allow),
            rule_ports: rule_ports.into_boxed_slice(),
            port_ranges: port_ranges.into_boxed_slice(),
        }
    }

    #[inline]
    fn port_ok(&self, rule: u32, port: u16) -> bool {
        let (a, b) = self.rule_ports[rule as usize];
        if a == b {
            return true;
        }
        let ranges = &self.port_ranges[a as usize..b as usize];
        // Ranges are sorted and disjoint.
        let i = ranges.partition_point(|r| r.end < port);
        ranges.get(i).is_some_and(|r| r.start <= port)
    }

    #[inline]
    fn any_port(&self, rule: u32) -> bool {
        let (a, b) = self.rule_ports[rule as usize];
        a == b
    }

    /// First deny rule (file order) matching by address, by an IPv4 address
    /// the address embeds (NAT64, 6to4, Teredo, IPv4-compatible), or by name.
    pub(crate) fn deny(&self, ip: IpAddr, name: Option<&str>, port: u16) -> Option<u32> {
        let ok = |r| self.port_ok(r, port);
        let mut best = self.deny.cidr_first(ip, ok, None);
        if let IpAddr::V6(v6) = ip {
            if !self.deny.v4.starts.is_empty() {
                for v4 in net::embedded_v4(v6).into_iter().flatten() {
                    best = self.deny.v4.first(u128::from(u32::from(v4)), ok, best);
                }
            }
        }
        match name {
            Some(n) => self.deny.host_first(n, ok, best),
            None => best,
        }
    }

    /// First allow rule matching by address. An IPv4 rule does not admit the
    /// IPv6 forms that embed its addresses: only an IPv6 rule covers those.
    pub(crate) fn allow_cidr(&self, ip: IpAddr, port: u16) -> Option<u32> {
        self.allow.cidr_first(ip, |r| self.port_ok(r, port), None)
    }

    /// First allow rule matching by name.
    pub(crate) fn allow_host(&self, name: &str, port: u16) -> Option<u32> {
        self.allow.host_first(name, |r| self.port_ok(r, port), None)
    }

    /// Some allow rule names `name` (any port), and no deny rule that covers
    /// every port names it.
    pub(crate) fn admits_name(&self, name: &str) -> bool {
        self.allow.host_first(name, |_| true, None).is_some()
            && self
                .deny
                .host_first(name, |r| self.any_port(r), None)
                .is_none()
    }

    pub(crate) fn host_can_matter(&self, port: u16) -> bool {
        self.host_ports[usize::from(port / 64)] & (1 << (port % 64)) != 0
    }

    /// Some deny rule with `hosts` covers `port`.
    pub(crate) fn host_can_deny(&self, port: u16) -> bool {
        self.deny_host_ports[usize::from(port / 64)] & (1 << (port % 64)) != 0
    }
}

/// A bit per port (1024 words) set for every port one of `rules` covers.
fn port_bits<'r>(rules: impl Iterator<Item = &'r Rule>) -> Box<[u64]> {
    let mut bits = vec![0u64; 1024].into_boxed_slice();
    let mut ranges = Vec::new();
    for rule in rules {
        if rule.ports.is_empty() {
            bits.fill(u64::MAX);
            return bits;
        }
        ranges.extend_from_slice(&rule.ports);
    }
    ranges.sort();
    let mut next = 0u32; // first port not yet set
    for r in ranges {
        for p in u32::from(r.start).max(next)..=u32::from(r.end) {
            bits[(p / 64) as usize] |= 1 << (p % 64);
        }
        next = next.max(u32::from(r.end) + 1);
    }
    bits
}

impl Class {
    fn new(rules: &[Rule], action: Verdict) -> Class {
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        let mut exact: HashMap<&str, Vec<u32>> = HashMap::new();
        let mut wild: HashMap<&str, Vec<u32>> = HashMap::new();
        for (i, rule) in rules.iter().enumerate() {
            if rule.action != action {
                continue;
            }
            let i = i as u32;
            for net in &rule.cidrs {
                match net {
                    IpNet::V4(n) => v4.push((
                        u128::from(u32::from(n.network())),
                        u128::from(u32::from(n.broadcast())),
                        i,
                    )),
                    IpNet::V6(n) => {
                        v6.push((u128::from(n.network()), u128::from(n.broadcast()), i))
                    }
                }
            }
            for host in &rule.hosts {
                let (map, key) = match host.strip_prefix("*.") {
                    Some(suffix) => (&mut wild, suffix),
                    None => (&mut exact, host.as_str()),
                };
                let list = map.entry(key).or_default();
                if list.last() != Some(&i) {
                    list.push(i);
                }
            }
        }
        let freeze = |m: HashMap<&str, Vec<u32>>| -> NameMap {
            m.into_iter()
                .map(|(k, v)| (Box::from(k), v.into_boxed_slice()))
                .collect()
        };
        Class {
            v4: CidrTable::new(v4),
            v6: CidrTable::new(v6),
            exact: freeze(exact),
            wild: freeze(wild),
        }
    }

    #[inline]
    fn cidr_first(&self, ip: IpAddr, ok: impl Fn(u32) -> bool, best: Option<u32>) -> Option<u32> {
        match ip {
            IpAddr::V4(v4) => self.v4.first(u128::from(u32::from(v4)), ok, best),
            IpAddr::V6(v6) => self.v6.first(u128::from(v6), ok, best),
        }
    }

    /// `name` must be normalized (see `hostname::normalize`).
    #[inline]
    fn host_first(
        &self,
        name: &str,
        ok: impl Fn(u32) -> bool,
        mut best: Option<u32>,
    ) -> Option<u32> {
        if let Some(list) = self.exact.get(name) {
            best = first_ok(list, &ok, best);
        }
        if !self.wild.is_empty() {
            for (i, b) in name.bytes().enumerate() {
                if b == b'.' {
                    if let Some(list) = self.wild.get(&name[i + 1..]) {
                        best = first_ok(list, &ok, best);
                    }
                }
            }
        }
        best
    }
}

/// The first rule in `list` (ascending) that passes `ok` and beats `best`.
#[inline]
fn first_ok(list: &[u32], ok: &impl Fn(u32) -> bool, best: Option<u32>) -> Option<u32> {
    for &r in list {
        if best.is_some_and(|b| r >= b) {
            break;
        }
        if ok(r) {
            return Some(r);
        }
    }
    best
}

impl CidrTable {
    /// Builds from `(first, last, rule)` address intervals of CIDR networks.
    fn new(mut entries: Vec<(u128, u128, u32)>) -> CidrTable {
        if entries.is_empty() {
            return CidrTable::default();
        }
        // Distinct networks sorted outermost-first, each with its rules in
        // file order.
        entries.sort_by(|a, b| {
            (a.0, std::cmp::Reverse(a.1), a.2).cmp(&(b.0, std::cmp::Reverse(b.1), b.2))
        });
        let mut bounds: Vec<(u128, u128)> = Vec::new();
        let mut rules: Vec<Vec<u32>> = Vec::new();
        for (lo, hi, r) in entries {
            if bounds.last() == Some(&(lo, hi)) {
                let list = rules.last_mut().expect("parallel to bounds");
                if list.last() != Some(&r) {
                    list.push(r);
                }
            } else {
                bounds.push((lo, hi));
                rules.push(vec![r]);
            }
        }

        let mut starts: Vec<u128> = Vec::new();
        let mut seg_net: Vec<u32> = Vec::new();
        let mut parents = vec![NONE; bounds.len()];
        let mut emit = |start: u128, net: u32| {
            if seg_net.last() == Some(&net) {
                return;
            }
            if starts.last() == Some(&start) {
                // An empty segment was emitted at this start; replace it.
                *seg_net.last_mut().expect("parallel") = net;
                return;
            }
            starts.push(start);
            seg_net.push(net);
        };
        // `cursor` is the first address not yet assigned to a segment;
        // None once past the top of the address space.
        let mut cursor: Option<u128> = Some(0);
        let mut stack: Vec<usize> = Vec::new();
        for (id, &(lo, _)) in bounds.iter().enumerate() {
            while let Some(&top) = stack.last() {
                let top_hi = bounds[top].1;
                if top_hi >= lo {
                    break;
                }
                if let Some(c) = cursor.filter(|c| *c <= top_hi) {
                    emit(c, top as u32);
                }
                cursor = top_hi.checked_add(1);
                stack.pop();
            }
            if let Some(c) = cursor.filter(|c| *c < lo) {
                emit(c, stack.last().map_or(NONE, |t| *t as u32));
            }
            parents[id] = stack.last().map_or(NONE, |t| *t as u32);
            stack.push(id);
            cursor = Some(lo);
        }
        while let Some(top) = stack.pop() {
            let top_hi = bounds[top].1;
            if let Some(c) = cursor.filter(|c| *c <= top_hi) {
                emit(c, top as u32);
            }
            cursor = top_hi.checked_add(1);
        }
        if let Some(c) = cursor {
            emit(c, NONE);
        }

        CidrTable {
            starts: starts.into_boxed_slice(),
            seg_net: seg_net.into_boxed_slice(),
            nets: parents
                .into_iter()
                .zip(rules)
                .map(|(parent, rules)| Net {
                    parent,
                    rules: rules.into_boxed_slice(),
                })
                .collect(),
        }
    }

    #[inline]
    fn first(&self, key: u128, ok: impl Fn(u32) -> bool, mut best: Option<u32>) -> Option<u32> {
        let i = self.starts.partition_point(|s| *s <= key);
        if i == 0 {
            return best;
        }
        let mut net = self.seg_net[i - 1];
        while net != NONE {
            let n = &self.nets[net as usize];
            best = first_ok(&n.rules, &ok, best);
            net = n.parent;
        }
        best
    }
}
