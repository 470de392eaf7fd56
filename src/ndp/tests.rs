use super::*;

fn router(prefix: &str) -> GuestRouter {
    GuestRouter {
        guest: prefix.parse().unwrap(),
        guest_mac: "52:54:00:5c:fe:02".parse().unwrap(),
        tap_mac: Some("02:00:00:00:00:01".parse().unwrap()),
    }
}

/// A router solicitation (type 133, code 0, checksum left 0) with a source
/// link-layer option for `mac` when given.
fn solicitation(mac: Option<[u8; 6]>) -> Vec<u8> {
    let mut m = vec![133, 0, 0, 0, 0, 0, 0, 0];
    if let Some(mac) = mac {
        m.extend_from_slice(&[1, 1]);
        m.extend_from_slice(&mac);
    }
    m
}

fn guest_link_local() -> Ipv6Addr {
    "fe80::5054:ff:fe5c:fe02".parse().unwrap()
}

#[test]
fn a_solicitation_gets_the_guests_prefix_for_autoconfiguration_from_the_router() {
    let r = router("2001:db8:5c:fffe::2/64");
    let ra = respond(
        &r,
        guest_link_local(),
        &solicitation(Some([0x52, 0x54, 0, 0x5c, 0xfe, 2])),
    )
    .unwrap();
    let packet = Icmpv6Packet::new_checked(&ra[..]).unwrap();
    match NdiscRepr::parse(&packet).unwrap() {
        NdiscRepr::RouterAdvert {
            hop_limit,
            flags,
            router_lifetime,
            lladdr,
            prefix_info,
            ..
        } => {
            assert_eq!(hop_limit, 64);
            // No managed or other flag: there is no DHCPv6 to ask.
            assert!(flags.is_empty());
            assert_eq!(router_lifetime.secs(), ROUTER_LIFETIME_SECS);
            assert_eq!(
                lladdr,
                Some(RawHardwareAddress::from_bytes(&[2, 0, 0, 0, 0, 1]))
            );
            let p = prefix_info.unwrap();
            assert_eq!(p.prefix_len, 64);
            assert_eq!(p.prefix, "2001:db8:5c:fffe::".parse::<Ipv6Addr>().unwrap());
            assert!(p.flags.contains(NdiscPrefixInfoFlags::ON_LINK));
            assert!(p.flags.contains(NdiscPrefixInfoFlags::ADDRCONF));
            assert_eq!(p.valid_lifetime.secs(), PREFIX_VALID_SECS);
            assert_eq!(p.preferred_lifetime.secs(), PREFIX_PREFERRED_SECS);
        }
        other => panic!("not an advertisement: {other:?}"),
    }
}

#[test]
fn a_prefix_narrower_than_a_64_is_on_link_but_not_autoconfigured() {
    let r = router("2001:db8:5c:fffe::2/120");
    let ra = respond(&r, Ipv6Addr::UNSPECIFIED, &solicitation(None)).unwrap();
    let packet = Icmpv6Packet::new_checked(&ra[..]).unwrap();
    let Ok(NdiscRepr::RouterAdvert { prefix_info, .. }) = NdiscRepr::parse(&packet) else {
        panic!("not an advertisement");
    };
    let p = prefix_info.unwrap();
    assert_eq!(p.prefix_len, 120);
    assert_eq!(p.prefix, "2001:db8:5c:fffe::".parse::<Ipv6Addr>().unwrap());
    assert!(p.flags.contains(NdiscPrefixInfoFlags::ON_LINK));
    assert!(!p.flags.contains(NdiscPrefixInfoFlags::ADDRCONF));
}

#[test]
fn nothing_but_a_well_formed_solicitation_is_answered() {
    let r = router("2001:db8:5c:fffe::2/64");
    let from = guest_link_local();
    // A neighbour solicitation reaches the same socket.
    let mut ns = vec![135, 0, 0, 0, 0, 0, 0, 0];
    ns.extend_from_slice(&GATEWAY_LINK_LOCAL.octets());
    assert_eq!(respond(&r, from, &ns), Err(Ignored::NotASolicitation));
    // A router advertisement (the guest playing router) is not answered.
    assert_eq!(
        respond(&r, from, &r.advertisement()),
        Err(Ignored::NotASolicitation)
    );
    assert_eq!(respond(&r, from, &[133, 0, 0]), Err(Ignored::Malformed));
    let mut coded = solicitation(None);
    coded[1] = 1;
    assert_eq!(respond(&r, from, &coded), Err(Ignored::Malformed));
    // An option of length 0 would loop a parser for ever.
    let mut zero = solicitation(None);
    zero.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(respond(&r, from, &zero), Err(Ignored::Malformed));
    assert_eq!(
        respond(&r, from, &vec![0u8; MAX_MESSAGE + 1]),
        Err(Ignored::TooLong)
    );
    // From :: a solicitation must carry no link-layer address.
    assert_eq!(
        respond(&r, Ipv6Addr::UNSPECIFIED, &solicitation(Some([2; 6]))),
        Err(Ignored::UnspecifiedWithLinkLayer)
    );
}

#[test]
fn the_slaac_address_is_the_prefix_and_the_modified_eui64_of_the_mac() {
    let mac: MacAddr = "52:54:00:5c:fe:02".parse().unwrap();
    assert_eq!(
        slaac_address("2001:db8:5c:fffe::2/64".parse().unwrap(), mac),
        Some("2001:db8:5c:fffe:5054:ff:fe5c:fe02".parse().unwrap())
    );
    assert_eq!(
        slaac_address("2001:db8:5c:fffe::2/96".parse().unwrap(), mac),
        None
    );
}
