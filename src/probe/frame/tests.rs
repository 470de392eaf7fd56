use super::*;

#[test]
fn the_checksum_of_a_known_ipv4_header_is_right() {
    // RFC 1071's example style: a header whose checksum field holds the
    // right value sums to zero.
    let h = ipv4(
        Ipv4Addr::new(192, 0, 2, 1),
        Ipv4Addr::new(192, 0, 2, 2),
        17,
        &[],
    );
    assert_eq!(checksum(&[&h[..20]]), 0);
}

#[test]
fn a_vlan_tag_goes_after_the_source_mac() {
    let f = ethernet(
        MacAddr::BROADCAST,
        MacAddr([2, 0, 0, 0, 0, 1]),
        ETH_P_IP,
        &[1, 2],
    );
    let t = vlan_tagged(&f, 5);
    assert_eq!(&t[12..16], &[0x81, 0x00, 0x00, 0x05]);
    assert_eq!(&t[16..18], &[0x08, 0x00]);
    assert_eq!(t.len(), f.len() + 4);
}

#[test]
fn a_tcp_segment_checksums_to_zero_and_reads_back_from_its_frame() {
    let (s, d): (IpAddr, IpAddr) = (
        "2001:db8::2".parse().unwrap(),
        "::ffff:127.0.0.1".parse().unwrap(),
    );
    let seg = tcp(s, d, 40001, 8080, 7, 9, TCP_ACK | TCP_PSH, b"hi");
    let pseudo = pseudo_header(s, d, 6, seg.len() as u32).unwrap();
    assert_eq!(checksum(&[&pseudo, &seg]), 0);
    let frame = framed(
        MacAddr([2, 0, 0, 0, 0, 1]),
        MacAddr::BROADCAST,
        s,
        d,
        6,
        &seg,
    )
    .unwrap();
    let seen = tcp_segment(&frame).unwrap();
    assert_eq!(
        (seen.src, seen.dst, seen.sport, seen.dport),
        (s, d, 40001, 8080)
    );
    assert_eq!((seen.seq, seen.ack, seen.flags), (7, 9, TCP_ACK | TCP_PSH));
    assert_eq!(seen.data, b"hi");
    let v4 = framed(
        MacAddr([2, 0, 0, 0, 0, 1]),
        MacAddr::BROADCAST,
        "198.19.254.2".parse().unwrap(),
        "127.0.0.1".parse().unwrap(),
        6,
        &tcp(
            "198.19.254.2".parse().unwrap(),
            "127.0.0.1".parse().unwrap(),
            1,
            2,
            3,
            4,
            TCP_SYN,
            &[],
        ),
    )
    .unwrap();
    let seen = tcp_segment(&v4).unwrap();
    assert_eq!((seen.sport, seen.dport, seen.flags), (1, 2, TCP_SYN));
    assert!(seen.data.is_empty());
    assert_eq!(tcp_segment(&v4[..20]), None);
}

#[test]
fn an_icmpv6_message_checksums_to_zero_with_its_pseudo_header() {
    let (s, d) = ("fe80::1".parse().unwrap(), "ff02::1".parse().unwrap());
    let p = icmpv6(s, d, 134, &[0; 12]);
    let m = &p[40..];
    let pseudo = pseudo_header(IpAddr::V6(s), IpAddr::V6(d), 58, m.len() as u32).unwrap();
    assert_eq!(checksum(&[&pseudo, m]), 0);
    assert_eq!(p[7], 255);
}
