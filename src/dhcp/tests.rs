use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::v4::{DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Encodable};
use rand::{Rng, SeedableRng};

use super::*;

const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
const GUEST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const GATEWAY: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const BROADCAST_TO: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT);

fn lease() -> GuestLease {
    GuestLease::new(
        MacAddr(GUEST_MAC),
        "198.18.0.2/30".parse().unwrap(),
        GATEWAY,
        3600,
    )
    .unwrap()
}

/// A client message as a guest would send it.
fn client(kind: MessageType) -> Message {
    let mut msg = Message::default();
    msg.set_opcode(Opcode::BootRequest)
        .set_htype(HType::Eth)
        .set_chaddr(&GUEST_MAC)
        .set_xid(0x5151_0001)
        .set_flags(Flags::default().set_broadcast());
    msg.opts_mut().insert(DhcpOption::MessageType(kind));
    msg
}

fn with(mut msg: Message, opt: DhcpOption) -> Message {
    msg.opts_mut().insert(opt);
    msg
}

fn answer(msg: &Message) -> Result<Reply, Ignored> {
    respond(&lease(), &msg.to_vec().unwrap())
}

fn decoded(reply: &Reply) -> Message {
    Message::from_bytes(&reply.bytes).unwrap()
}

fn selecting(ip: Ipv4Addr, server: Ipv4Addr) -> Message {
    let msg = with(
        client(MessageType::Request),
        DhcpOption::RequestedIpAddress(ip),
    );
    with(msg, DhcpOption::ServerIdentifier(server))
}

#[test]
fn a_discover_from_the_guest_gets_its_lease_offered() {
    let reply = answer(&client(MessageType::Discover)).unwrap();
    assert_eq!(reply.kind, ReplyKind::Offer);
    assert_eq!(reply.to, BROADCAST_TO);
    let offer = decoded(&reply);
    assert_eq!(offer.opcode(), Opcode::BootReply);
    assert_eq!(offer.xid(), 0x5151_0001);
    assert_eq!(offer.chaddr(), GUEST_MAC);
    assert_eq!(offer.yiaddr(), GUEST);
    assert!(offer.flags().broadcast());
    let opts = offer.opts();
    assert_eq!(opts.msg_type(), Some(MessageType::Offer));
    assert_eq!(
        opts.get(OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(GATEWAY))
    );
    assert_eq!(
        opts.get(OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 252)))
    );
    assert_eq!(
        opts.get(OptionCode::Router),
        Some(&DhcpOption::Router(vec![GATEWAY]))
    );
    assert_eq!(
        opts.get(OptionCode::DomainNameServer),
        Some(&DhcpOption::DomainNameServer(vec![GATEWAY]))
    );
    assert_eq!(
        opts.get(OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(3600))
    );
    assert_eq!(
        opts.get(OptionCode::Renewal),
        Some(&DhcpOption::Renewal(1800))
    );
}

#[test]
fn a_request_for_our_offer_is_acked() {
    let reply = answer(&selecting(GUEST, GATEWAY)).unwrap();
    assert_eq!(reply.kind, ReplyKind::Ack);
    assert_eq!(reply.to, BROADCAST_TO);
    let ack = decoded(&reply);
    assert_eq!(ack.opts().msg_type(), Some(MessageType::Ack));
    assert_eq!(ack.yiaddr(), GUEST);
}

#[test]
fn a_request_for_another_address_is_naked() {
    let reply = answer(&selecting(Ipv4Addr::new(198, 18, 0, 3), GATEWAY)).unwrap();
    assert_eq!(reply.kind, ReplyKind::Nak);
    assert_eq!(reply.to, BROADCAST_TO);
    let nak = decoded(&reply);
    assert_eq!(nak.opts().msg_type(), Some(MessageType::Nak));
    assert_eq!(nak.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(nak.opts().get(OptionCode::AddressLeaseTime), None);
}

#[test]
fn a_request_that_chose_another_server_is_ignored() {
    let other = Ipv4Addr::new(198, 18, 0, 99);
    assert_eq!(answer(&selecting(GUEST, other)), Err(Ignored::OtherServer));
}

#[test]
fn a_rebooting_guest_asking_for_its_address_is_acked() {
    let msg = with(
        client(MessageType::Request),
        DhcpOption::RequestedIpAddress(GUEST),
    );
    assert_eq!(answer(&msg).unwrap().kind, ReplyKind::Ack);
    let wrong = with(
        client(MessageType::Request),
        DhcpOption::RequestedIpAddress(Ipv4Addr::new(198, 19, 0, 2)),
    );
    assert_eq!(answer(&wrong).unwrap().kind, ReplyKind::Nak);
}

#[test]
fn a_renewal_is_acked_to_the_guests_address() {
    let mut msg = client(MessageType::Request);
    msg.set_ciaddr(GUEST).set_flags(Flags::default());
    let reply = answer(&msg).unwrap();
    assert_eq!(reply.kind, ReplyKind::Ack);
    assert_eq!(reply.to, SocketAddrV4::new(GUEST, CLIENT_PORT));
    assert_eq!(decoded(&reply).ciaddr(), GUEST);

    msg.set_ciaddr(Ipv4Addr::new(198, 18, 0, 3));
    let reply = answer(&msg).unwrap();
    assert_eq!(reply.kind, ReplyKind::Nak);
    assert_eq!(reply.to, BROADCAST_TO);
}

#[test]
fn another_mac_gets_nothing() {
    let mut msg = client(MessageType::Discover);
    msg.set_chaddr(&[0x52, 0x54, 0x00, 0x12, 0x34, 0x57]);
    assert_eq!(answer(&msg), Err(Ignored::OtherClient));
    let mut request = selecting(GUEST, GATEWAY);
    request.set_chaddr(&[0x02, 0, 0, 0, 0, 1]);
    assert_eq!(answer(&request), Err(Ignored::OtherClient));
}

#[test]
fn a_server_message_is_never_answered() {
    // A guest posing as a DHCP server, or replaying our own offer.
    let mut offer = client(MessageType::Offer);
    offer.set_opcode(Opcode::BootReply);
    assert_eq!(answer(&offer), Err(Ignored::NotARequest));
    // The right opcode with a server's message type.
    for kind in [MessageType::Offer, MessageType::Ack, MessageType::Nak] {
        assert_eq!(answer(&client(kind)), Err(Ignored::Unhandled));
    }
}

#[test]
fn decline_release_and_inform_are_not_answered() {
    for kind in [
        MessageType::Decline,
        MessageType::Release,
        MessageType::Inform,
        MessageType::Unknown(200),
    ] {
        assert_eq!(answer(&client(kind)), Err(Ignored::Unhandled), "{kind:?}");
    }
}

#[test]
fn relayed_messages_are_ignored() {
    let mut msg = client(MessageType::Discover);
    msg.set_giaddr(Ipv4Addr::new(198, 18, 0, 9));
    assert_eq!(answer(&msg), Err(Ignored::Relayed));
    let mut msg = client(MessageType::Discover);
    msg.set_hops(1);
    assert_eq!(answer(&msg), Err(Ignored::Relayed));
}

#[test]
fn a_message_without_a_type_is_ignored() {
    let mut msg = client(MessageType::Discover);
    msg.opts_mut().remove(OptionCode::MessageType);
    assert_eq!(answer(&msg), Err(Ignored::NoMessageType));
}

#[test]
fn a_hardware_length_past_sixteen_is_refused_not_sliced() {
    let mut bytes = client(MessageType::Discover).to_vec().unwrap();
    for hlen in [0u8, 5, 7, 16, 17, 255] {
        bytes[2] = hlen;
        assert_eq!(
            respond(&lease(), &bytes),
            Err(Ignored::NotEthernet),
            "{hlen}"
        );
    }
    bytes[2] = 6;
    bytes[1] = 6; // IEEE 802 rather than Ethernet
    assert_eq!(respond(&lease(), &bytes), Err(Ignored::NotEthernet));
}

#[test]
fn short_long_and_cookieless_packets_are_ignored() {
    let good = client(MessageType::Discover).to_vec().unwrap();
    assert_eq!(respond(&lease(), &[]), Err(Ignored::Malformed));
    assert_eq!(respond(&lease(), &good[..239]), Err(Ignored::Malformed));
    let mut bootp = good.clone();
    bootp[236..240].copy_from_slice(&[0, 0, 0, 0]);
    assert_eq!(respond(&lease(), &bootp), Err(Ignored::Malformed));
    let mut long = good.clone();
    long.resize(MAX_PACKET + 1, 0);
    assert_eq!(respond(&lease(), &long), Err(Ignored::TooLong));
    // Padding up to the limit is fine.
    let mut padded = good;
    padded.resize(MAX_PACKET, 0);
    assert_eq!(respond(&lease(), &padded).unwrap().kind, ReplyKind::Offer);
}

#[test]
fn a_short_client_identifier_is_echoed_and_a_long_one_is_not() {
    let id = vec![1, 0x52, 0x54, 0, 0x12, 0x34, 0x56];
    let msg = with(
        client(MessageType::Discover),
        DhcpOption::ClientIdentifier(id.clone()),
    );
    let offer = decoded(&answer(&msg).unwrap());
    assert_eq!(
        offer.opts().get(OptionCode::ClientIdentifier),
        Some(&DhcpOption::ClientIdentifier(id))
    );
    let msg = with(
        client(MessageType::Discover),
        DhcpOption::ClientIdentifier(vec![7; 200]),
    );
    let reply = answer(&msg).unwrap();
    assert!(reply.bytes.len() <= 576, "{} bytes", reply.bytes.len());
    assert_eq!(
        decoded(&reply).opts().get(OptionCode::ClientIdentifier),
        None
    );
}

#[test]
fn a_lease_must_be_one_a_guest_can_use() {
    let mac = MacAddr(GUEST_MAC);
    let net = |s: &str| s.parse::<Ipv4Net>().unwrap();
    assert!(matches!(
        GuestLease::new(
            mac,
            net("198.18.0.2/30"),
            Ipv4Addr::new(198, 18, 1, 1),
            3600
        ),
        Err(DhcpError::GatewayOutsidePrefix { .. })
    ));
    assert!(matches!(
        GuestLease::new(mac, net("198.18.0.2/30"), GUEST, 3600),
        Err(DhcpError::GatewayIsGuest(_))
    ));
    assert!(matches!(
        GuestLease::new(mac, net("198.18.0.3/30"), GATEWAY, 3600),
        Err(DhcpError::NotHostAddress { .. })
    ));
    assert!(matches!(
        GuestLease::new(
            mac,
            net("198.18.0.2/30"),
            Ipv4Addr::new(198, 18, 0, 0),
            3600
        ),
        Err(DhcpError::NotHostAddress { .. })
    ));
    assert!(matches!(
        GuestLease::new(mac, net("198.18.0.2/30"), GATEWAY, 59),
        Err(DhcpError::LeaseTooShort(59))
    ));
    assert!(matches!(
        GuestLease::new(MacAddr([0xff; 6]), net("198.18.0.2/30"), GATEWAY, 3600),
        Err(DhcpError::Mac(_))
    ));
    // A /31 has no network or broadcast address.
    assert!(GuestLease::new(mac, net("198.18.0.0/31"), Ipv4Addr::new(198, 18, 0, 1), 60).is_ok());
}

/// Property: whatever arrives, `respond` returns, and any reply it makes is
/// a BOOTREPLY to the guest's MAC offering nothing but the guest's address.
#[test]
fn hostile_packets_never_panic_and_only_the_lease_is_ever_offered() {
    let seeds: Vec<Vec<u8>> = [
        client(MessageType::Discover),
        selecting(GUEST, GATEWAY),
        with(
            client(MessageType::Discover),
            DhcpOption::ClientIdentifier(vec![1, 2, 3]),
        ),
        with(
            client(MessageType::Discover),
            DhcpOption::ParameterRequestList(vec![OptionCode::Router, OptionCode::SubnetMask]),
        ),
    ]
    .iter()
    .map(|m| m.to_vec().unwrap())
    .collect();
    // Seeded, so a failure reproduces.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0xd4c9_0e11_57a7_1c0d);
    let mut replies = 0;
    for i in 0..20_000 {
        let mut packet = if i % 10 == 0 {
            // Pure noise of any length, sometimes with a valid cookie.
            let len = rng.random_range(0..=MAX_PACKET + 2);
            let mut noise: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            if len >= 240 && rng.random_ratio(1, 2) {
                noise[236..240].copy_from_slice(&[99, 130, 83, 99]);
            }
            noise
        } else {
            seeds[i % seeds.len()].clone()
        };
        if !packet.is_empty() {
            for _ in 0..=rng.random_range(0..8) {
                let at = rng.random_range(0..packet.len());
                packet[at] = rng.random();
            }
        }
        if rng.random_ratio(1, 4) {
            let to = rng.random_range(0..=packet.len());
            packet.truncate(to);
        } else if rng.random_ratio(1, 8) {
            let extra = rng.random_range(0..64);
            packet.extend((0..extra).map(|_| rng.random::<u8>()));
        }
        if let Ok(reply) = respond(&lease(), &packet) {
            replies += 1;
            let msg = Message::from_bytes(&reply.bytes).expect("a reply decodes");
            assert_eq!(msg.opcode(), Opcode::BootReply);
            assert_eq!(msg.chaddr(), GUEST_MAC);
            assert!(
                msg.yiaddr() == GUEST || msg.yiaddr().is_unspecified(),
                "offered {}",
                msg.yiaddr()
            );
            assert!(reply.to == BROADCAST_TO || reply.to == SocketAddrV4::new(GUEST, CLIENT_PORT));
            assert!(reply.bytes.len() <= 576);
        }
    }
    // The mutations left many packets valid: the property was exercised.
    assert!(replies > 1_000, "only {replies} replies");
}

/// The packet `msg` encodes with `extra` spliced in before its End option.
fn spliced(msg: &Message, extra: &[u8]) -> Vec<u8> {
    let mut bytes = msg.to_vec().unwrap();
    let end = bytes.iter().rposition(|&b| b == 255).unwrap();
    bytes.splice(end..end, extra.iter().copied());
    bytes
}

#[test]
fn options_it_does_not_read_never_reach_the_decoder() {
    // Lengths dhcproto's decoder would trust: client FQDN of length 0
    // (an underflow), a bulk lease query time of 1 byte (an assertion),
    // a classless route, a split (RFC 3396) option.
    let odd: [&[u8]; 5] = [
        &[81, 0],
        &[153, 1, 7],
        &[121, 5, 33, 1, 2, 3, 4],
        &[12, 1, b'a', 12, 1, b'b'],
        &[151, 0],
    ];
    for extra in odd {
        let bytes = spliced(&client(MessageType::Discover), extra);
        assert_eq!(
            respond(&lease(), &bytes).map(|r| r.kind),
            Ok(ReplyKind::Offer),
            "{extra:?}"
        );
    }
}

#[test]
fn a_read_option_of_the_wrong_length_or_twice_is_malformed() {
    let discover = client(MessageType::Discover);
    for extra in [
        &[53u8, 1, 1][..],          // a second message type
        &[50, 3, 198, 18, 0],       // a 3-byte requested address
        &[54, 5, 198, 18, 0, 1, 0], // a 5-byte server identifier
        &[61, 0],                   // an empty client identifier
        &[61, 200, 1],              // running past the packet
    ] {
        assert_eq!(
            respond(&lease(), &spliced(&discover, extra)),
            Err(Ignored::Malformed),
            "{extra:?}"
        );
    }
}
