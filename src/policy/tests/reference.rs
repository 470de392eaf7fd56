//! The compiled matcher agrees with a plain reading of the rules, on
//! randomly generated policies and destinations.

use super::*;
use crate::policy::{is_private, AnyResolution, Reason, Rule, Verdict};
use std::fmt::Write;
use std::net::Ipv6Addr;

/// xorshift64*: deterministic, no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const NAMES: &[&str] = &[
    "a.test",
    "b.a.test",
    "c.b.a.test",
    "x.test",
    "y.x.test",
    "test",
];

fn matches_host(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => name.len() > suffix.len() + 1 && name.ends_with(&format!(".{suffix}")),
        None => pattern == name,
    }
}

/// The IPv4 addresses docs/policy.md says an IPv6 address embeds, read
/// straight off the bits.
fn embedded(ip: IpAddr) -> Vec<IpAddr> {
    let IpAddr::V6(v6) = ip else {
        return Vec::new();
    };
    let x = u128::from(v6);
    let v4 = |bits: u128| IpAddr::from(std::net::Ipv4Addr::from(bits as u32));
    if x >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
        vec![v4(x)]
    } else if x >> 80 == 0x0064_ff9b_0001 {
        vec![v4((x >> 64 & 0xffff) << 16 | (x >> 40 & 0xffff))]
    } else if x >> 112 == 0x2002 {
        vec![v4(x >> 80)]
    } else if x >> 96 == 0x2001_0000 {
        vec![v4(x >> 64), v4(!x)]
    } else if x >> 32 == 0 && x > 1 {
        vec![v4(x)]
    } else {
        Vec::new()
    }
}

/// A direct reading of the semantics in DESIGN.md and docs/policy.md.
fn naive(
    rules: &[Rule],
    ip: IpAddr,
    port: u16,
    host: Option<&str>,
) -> (Verdict, Reason, Option<String>) {
    let inside = embedded(ip);
    let by_cidr = |r: &Rule| r.covers_port(port) && r.cidrs.iter().any(|c| c.contains(&ip));
    let deny_by_cidr = |r: &Rule| {
        r.covers_port(port)
            && r.cidrs
                .iter()
                .any(|c| c.contains(&ip) || inside.iter().any(|v4| c.contains(v4)))
    };
    let by_host = |r: &Rule| {
        r.covers_port(port) && host.is_some_and(|h| r.hosts.iter().any(|p| matches_host(p, h)))
    };
    if let Some(r) = rules
        .iter()
        .find(|r| r.action == Verdict::Deny && (deny_by_cidr(r) || by_host(r)))
    {
        return (Verdict::Deny, Reason::DenyRule, Some(r.name.to_string()));
    }
    if let Some(r) = rules
        .iter()
        .find(|r| r.action == Verdict::Allow && by_cidr(r))
    {
        // sluice's own host: only a rule naming loopback admits it.
        let v4_local =
            |ip: &IpAddr| matches!(ip, IpAddr::V4(v4) if matches!(v4.octets()[0], 0 | 127));
        let local = v4_local(&ip)
            || matches!(ip, IpAddr::V6(v6) if v6.is_loopback() || v6.is_unspecified())
            || inside.iter().any(v4_local);
        if local {
            let named = |c: &ipnet::IpNet| match c {
                ipnet::IpNet::V4(n) => n.prefix_len() >= 8 && n.network().octets()[0] == 127,
                ipnet::IpNet::V6(n) => n.prefix_len() == 128 && n.network().is_loopback(),
            };
            return match rules.iter().find(|r| {
                r.action == Verdict::Allow
                    && r.covers_port(port)
                    && r.cidrs.iter().any(|c| named(c) && c.contains(&ip))
            }) {
                Some(n) => (Verdict::Allow, Reason::AllowRule, Some(n.name.to_string())),
                None => (
                    Verdict::Deny,
                    Reason::LoopbackAddress,
                    Some(r.name.to_string()),
                ),
            };
        }
        return (Verdict::Allow, Reason::AllowRule, Some(r.name.to_string()));
    }
    if let Some(r) = rules
        .iter()
        .find(|r| r.action == Verdict::Allow && by_host(r))
    {
        if is_private(ip) {
            return (
                Verdict::Deny,
                Reason::PrivateAddress,
                Some(r.name.to_string()),
            );
        }
        return (Verdict::Allow, Reason::AllowRule, Some(r.name.to_string()));
    }
    (Verdict::Deny, Reason::NoRule, None)
}

fn random_v4(rng: &mut Rng) -> [u8; 4] {
    // A small space so that networks overlap and nest often.
    [
        [10, 198, 0, 255][rng.below(4) as usize],
        rng.below(3) as u8,
        rng.below(3) as u8,
        rng.below(4) as u8,
    ]
}

fn random_v6(rng: &mut Rng) -> Ipv6Addr {
    let [a, b, c, d] = random_v4(rng).map(u16::from);
    let (hi, lo) = (a << 8 | b, c << 8 | d);
    match rng.below(7) {
        // NAT64 (both prefixes), 6to4, Teredo and IPv4-compatible forms of
        // the same small IPv4 space, so IPv4 rules meet them.
        0 => Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo),
        1 => Ipv6Addr::new(0x64, 0xff9b, 1, hi, c, d << 8, 0, 0),
        2 => Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, rng.below(2) as u16),
        3 => Ipv6Addr::new(0x2001, 0, hi, lo, 0, 0, !hi, !lo),
        4 => Ipv6Addr::new(0, 0, 0, 0, 0, 0, hi, lo),
        _ => {
            let top = [0x2001u16, 0xfd00, 0xffff][rng.below(3) as usize];
            Ipv6Addr::new(
                top,
                0xdb8,
                0,
                0,
                0,
                0,
                rng.below(3) as u16,
                rng.below(4) as u16,
            )
        }
    }
}

fn random_policy(rng: &mut Rng) -> String {
    let mut doc = String::from("version: 1\nname: random\nrules:\n");
    for i in 0..rng.below(12) + 1 {
        let action = if rng.below(3) == 0 { "deny" } else { "allow" };
        let mut cidrs = Vec::new();
        for _ in 0..rng.below(3) {
            if rng.below(2) == 0 {
                let prefix = [0u8, 8, 16, 24, 30, 32][rng.below(6) as usize];
                let net = ipnet::Ipv4Net::new(random_v4(rng).into(), prefix)
                    .unwrap()
                    .trunc();
                cidrs.push(format!("\"{net}\""));
            } else {
                let prefix = [0u8, 16, 112, 126, 128][rng.below(5) as usize];
                let net = ipnet::Ipv6Net::new(random_v6(rng), prefix).unwrap().trunc();
                cidrs.push(format!("\"{net}\""));
            }
        }
        let mut hosts = Vec::new();
        for _ in 0..rng.below(3) {
            let name = NAMES[rng.below(NAMES.len() as u64) as usize];
            hosts.push(if rng.below(2) == 0 {
                format!("\"*.{name}\"")
            } else {
                format!("\"{name}\"")
            });
        }
        if cidrs.is_empty() && hosts.is_empty() {
            cidrs.push("\"10.0.0.0/8\"".into());
        }
        let _ = write!(
            doc,
            "  - {{name: r{i}, action: {action}, cidrs: [{}], hosts: [{}]",
            cidrs.join(","),
            hosts.join(",")
        );
        if rng.below(2) == 0 {
            let a = rng.below(4) + 1;
            let b = a + rng.below(3);
            let _ = write!(doc, ", ports: [{a}, \"{}-{}\"]", b, b + rng.below(2));
        }
        doc.push_str("}\n");
    }
    doc
}

#[test]
fn compiled_matcher_agrees_with_plain_reading() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for _ in 0..400 {
        let yaml = random_policy(&mut rng);
        let p = policy(&yaml);
        for _ in 0..200 {
            let ip: IpAddr = match rng.below(3) {
                0 => IpAddr::from(random_v4(&mut rng)),
                1 => IpAddr::from(random_v6(&mut rng)),
                _ => IpAddr::from(std::net::Ipv4Addr::from(random_v4(&mut rng)).to_ipv6_mapped()),
            };
            let port = rng.below(8) as u16 + 1;
            let host = match rng.below(4) {
                0 => None,
                _ => Some(NAMES[rng.below(NAMES.len() as u64) as usize]),
            };
            let got = p.decide(SocketAddr::new(ip, port), host, &AnyResolution);
            let canon = match ip {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
                v4 => v4,
            };
            let want = naive(p.rules(), canon, port, host);
            assert_eq!(
                (got.verdict, got.reason, got.rule.map(|r| r.to_string())),
                want,
                "{ip} port {port} host {host:?}\n{yaml}"
            );
        }
    }
}
