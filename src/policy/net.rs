//! Address classification: which destinations a hostname rule must never
//! reach, the canonical form addresses are matched in, and the IPv4
//! addresses an IPv6 address carries for a translator or tunnel to reach.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) becomes IPv4; everything else is kept.
#[inline]
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// The IPv4 addresses inside an IPv6 address that a NAT64 translator, a
/// 6to4 relay or a Teredo relay would deliver to (at most two; Teredo
/// carries its server and its client). IPv4-mapped `::ffff:a.b.c.d` is not
/// here: [`canonical`] turns it into plain IPv4 first.
///
/// - NAT64 well-known prefix `64:ff9b::/96` (RFC 6052): the last 32 bits.
/// - NAT64 local-use prefix `64:ff9b:1::/48` (RFC 8215), RFC 6052's layout
///   for a /48: bits 48-63 and 72-87 (bits 64-71 are the reserved octet).
/// - 6to4 `2002::/16` (RFC 3056): bits 16-47.
/// - Teredo `2001::/32` (RFC 4380): the server at bits 32-63, the client in
///   the last 32 bits, inverted.
/// - IPv4-compatible `::a.b.c.d` (RFC 4291, deprecated), except `::` and
///   `::1`, which are IPv6's own.
#[inline]
pub(crate) fn embedded_v4(ip: Ipv6Addr) -> [Option<Ipv4Addr>; 2] {
    let o = ip.octets();
    let v4 = |a: usize, b: usize, c: usize, d: usize| Ipv4Addr::new(o[a], o[b], o[c], o[d]);
    match ip.segments() {
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => [Some(v4(12, 13, 14, 15)), None],
        [0x64, 0xff9b, 1, ..] => [Some(v4(6, 7, 9, 10)), None],
        [0x2002, ..] => [Some(v4(2, 3, 4, 5)), None],
        [0x2001, 0, ..] => [
            Some(v4(4, 5, 6, 7)),
            Some(Ipv4Addr::from(!u32::from(v4(12, 13, 14, 15)))),
        ],
        [0, 0, 0, 0, 0, 0, ..] if !ip.is_unspecified() && !ip.is_loopback() => {
            [Some(v4(12, 13, 14, 15)), None]
        }
        _ => [None, None],
    }
}

/// True if a connection to `ip` (canonical) stays on the machine that makes
/// it: loopback (127.0.0.0/8, `::1`), the unspecified and "this network"
/// addresses (0.0.0.0/8, `::`), which the kernel sends to the local host,
/// and every IPv6 form that embeds one of those ([`embedded_v4`]). From the
/// proxy's side that is sluice's own host, never the workload's.
pub(crate) fn is_local_host(ip: IpAddr) -> bool {
    let v4_local = |v4: Ipv4Addr| matches!(v4.octets()[0], 0 | 127);
    match ip {
        IpAddr::V4(v4) => v4_local(v4),
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.to_ipv4_mapped().is_some_and(v4_local)
                || embedded_v4(v6).into_iter().flatten().any(v4_local)
        }
    }
}

/// True if `net` names loopback itself: a prefix inside 127.0.0.0/8, or
/// `::1/128`. Only such a rule admits a loopback destination.
pub(crate) fn names_loopback(net: &ipnet::IpNet) -> bool {
    match net {
        ipnet::IpNet::V4(n) => n.prefix_len() >= 8 && n.network().octets()[0] == 127,
        ipnet::IpNet::V6(n) => n.prefix_len() == 128 && n.network().is_loopback(),
    }
}

/// True for addresses a hostname rule must not admit: loopback, RFC 1918,
/// link-local, unspecified and "this network" (0/8), CGNAT 100.64/10,
/// multicast, broadcast, IPv6 ULA fc00::/7, fe80::/10, ::1, ::, and any
/// IPv6 address whose IPv4 inside is one of those (IPv4-mapped, and every
/// form [`embedded_v4`] reads).
/// Not private: 198.18.0.0/15 and 2001:db8::/32 (test and benchmark origins).
pub(crate) fn is_private(ip: IpAddr) -> bool {
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
    if embedded_v4(ip).into_iter().flatten().any(is_private_v4) {
        return true;
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

    fn local(s: &str) -> bool {
        is_local_host(canonical(s.parse().unwrap()))
    }

    #[test]
    fn loopback_and_unspecified_in_every_spelling_are_the_local_host() {
        for a in [
            "127.0.0.1",
            "127.255.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:0.0.0.0",
            "64:ff9b::7f00:1",
            "64:ff9b:1:7f00:0:100::",
            "2002:7f00:1::1",
            "2001:0:7f00:1::",
            "::127.0.0.1",
        ] {
            assert!(local(a), "{a} reaches the local host");
        }
        for a in [
            "198.18.0.1",
            "2001:db8::1",
            "10.0.0.1",
            "::ffff:198.18.0.1",
            "fe80::1",
        ] {
            assert!(!local(a), "{a} is not the local host");
        }
    }

    #[test]
    fn only_prefixes_inside_loopback_name_it() {
        let n = |s: &str| names_loopback(&s.parse().unwrap());
        for yes in ["127.0.0.1/32", "127.0.0.0/8", "127.1.0.0/16", "::1/128"] {
            assert!(n(yes), "{yes}");
        }
        for no in [
            "0.0.0.0/0",
            "::/0",
            "64:ff9b::/96",
            "126.0.0.0/7",
            "::/127",
            "0.0.0.0/8",
        ] {
            assert!(!n(no), "{no}");
        }
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
    fn embedded_forms_of_private_ipv4_are_private() {
        for a in [
            "64:ff9b::7f00:1",             // NAT64 of 127.0.0.1
            "64:ff9b::a9fe:a9fe",          // NAT64 of 169.254.169.254
            "64:ff9b:1:c0a8:1:100::",      // local-use NAT64 of 192.168.1.1
            "2002:ac10:1::1",              // 6to4 of 172.16.0.1
            "2001:0:c633:6401::f5ff:fffe", // Teredo client 10.0.0.1
            "2001:0:a00:1::39ed:fffe",     // Teredo server 10.0.0.1
            "::7f00:1",                    // IPv4-compatible 127.0.0.1
        ] {
            assert!(p(a), "{a} should be private");
        }
    }

    #[test]
    fn embedded_forms_of_public_ipv4_are_not_private() {
        for a in [
            "64:ff9b::c612:1",
            "64:ff9b:1:c612:0:100::",
            "2002:c612:1::1",
            "2001:0:c633:6401::39ed:fffe",
            "::c612:1",
        ] {
            assert!(!p(a), "{a} should not be private");
        }
    }

    #[test]
    fn each_embedding_yields_the_ipv4_it_carries() {
        let got = |s: &str| -> Vec<Ipv4Addr> {
            embedded_v4(s.parse().unwrap())
                .into_iter()
                .flatten()
                .collect()
        };
        let v4 = |s: &str| -> Ipv4Addr { s.parse().unwrap() };
        assert_eq!(got("64:ff9b::a00:1"), [v4("10.0.0.1")]);
        assert_eq!(got("64:ff9b:1:a00:0:100::"), [v4("10.0.0.1")]);
        assert_eq!(got("2002:a00:1::1"), [v4("10.0.0.1")]);
        // RFC 4380's own example.
        assert_eq!(
            got("2001:0:4136:e378:8000:63bf:3fff:fdd2"),
            [v4("65.54.227.120"), v4("192.0.2.45")]
        );
        assert_eq!(got("::a00:1"), [v4("10.0.0.1")]);
        for none in [
            "::",
            "::1",
            "2001:db8::a00:1",
            "64:ff9b:2::a00:1",
            "fe80::1",
        ] {
            assert!(got(none).is_empty(), "{none}");
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
