//! Address classification: which destinations a hostname rule must never
//! reach, and the canonical form addresses are matched in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) becomes IPv4; everything else is kept.
#[inline]
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// True for addresses a hostname rule must not admit: loopback, RFC 1918,
/// link-local, unspecified and "this network" (0/8), CGNAT 100.64/10,
/// multicast, broadcast, IPv6 ULA fc00::/7, fe80::/10, ::1, ::, and the
/// IPv4-mapped / IPv4-compatible forms of the IPv4 ones.
/// Not private: 198.18.0.0/15 and 2001:db8::/32 (test and benchmark origins).
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_private_v4(v4),
        IpAddr::V6(v6) => is_private_v6(v6),
    }
}

fn is_private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    a == 0 // unspecified and "this network"
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // CGNAT
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || (224..240).contains(&a) // multicast
        || ip == Ipv4Addr::BROADCAST
}

fn is_private_v6(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    if ip.is_unspecified() || ip.is_loopback() {
        return true;
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_private_v4(v4);
    }
    // IPv4-compatible ::a.b.c.d (deprecated, but still routable by some stacks).
    if seg[..6].iter().all(|s| *s == 0) {
        return is_private_v4(Ipv4Addr::from(u128::from(ip) as u32));
    }
    (seg[0] & 0xfe00) == 0xfc00 // ULA fc00::/7
        || (seg[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (seg[0] & 0xff00) == 0xff00 // multicast
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> bool {
        is_private(s.parse().unwrap())
    }

    #[test]
    fn internal_ipv4_ranges_are_private() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "100.127.255.255",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            assert!(p(a), "{a} should be private");
        }
    }

    #[test]
    fn benchmark_and_public_ipv4_are_not_private() {
        for a in [
            "198.18.0.1",
            "198.19.255.255",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
        ] {
            assert!(!p(a), "{a} should not be private");
        }
    }

    #[test]
    fn internal_ipv6_ranges_are_private() {
        for a in [
            "::1",
            "::",
            "fd00::1",
            "fc00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::10.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(p(a), "{a} should be private");
        }
    }

    #[test]
    fn documentation_ipv6_and_mapped_public_are_not_private() {
        for a in ["2001:db8::1", "2606:4700::1", "::ffff:198.18.0.1"] {
            assert!(!p(a), "{a} should not be private");
        }
    }

    #[test]
    fn ipv4_mapped_is_canonicalized_to_ipv4() {
        assert_eq!(
            canonical("::ffff:198.18.0.1".parse().unwrap()),
            "198.18.0.1".parse::<IpAddr>().unwrap()
        );
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(canonical(v6), v6);
    }
}
