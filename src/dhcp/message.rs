//! One DHCP packet in, at most one reply out (RFC 2131 section 4.3, server
//! side, for a single static lease). Pure: no sockets, no clock.

use std::net::{Ipv4Addr, SocketAddrV4};

use dhcproto::v4::{DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Encodable};

use super::server::CLIENT_PORT;
use super::GuestLease;

/// Longest packet looked at; longer ones are ignored unread. A DHCP message
/// must fit an Ethernet frame here (no fragments on a tap).
pub(crate) const MAX_PACKET: usize = 1500;
/// Fixed BOOTP header (236 bytes) plus the DHCP magic cookie.
const MIN_PACKET: usize = 240;
const MAGIC: [u8; 4] = [99, 130, 83, 99];
/// A client identifier longer than this is not echoed back (RFC 6842 asks
/// for the echo; the bound keeps every reply within the 576 bytes that any
/// client accepts).
const MAX_ECHOED_CLIENT_ID: usize = 64;

/// What the reply is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyKind {
    Offer,
    Ack,
    Nak,
}

/// A reply to send, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) kind: ReplyKind,
    pub(crate) bytes: Vec<u8>,
    /// 255.255.255.255:68 while the guest has no address (and for a NAK);
    /// the guest's address when it renews.
    pub(crate) to: SocketAddrV4,
}

/// Why a packet got no reply. Bounded: usable as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ignored {
    /// Longer than [`MAX_PACKET`].
    TooLong,
    /// Not a DHCP message (short, no magic cookie, options that do not parse).
    Malformed,
    /// A BOOTREPLY: a server's message, never answered.
    NotARequest,
    /// Not Ethernet with a 6-byte hardware address.
    NotEthernet,
    /// From a MAC other than the guest's.
    OtherClient,
    /// Through a relay agent (giaddr or hops set): there is none on a tap.
    Relayed,
    /// A REQUEST that selected another server's offer.
    OtherServer,
    /// No message type option.
    NoMessageType,
    /// DECLINE, RELEASE, INFORM or a server-side message type.
    Unhandled,
}

impl Ignored {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ignored::TooLong => "too-long",
            Ignored::Malformed => "malformed",
            Ignored::NotARequest => "not-a-request",
            Ignored::NotEthernet => "not-ethernet",
            Ignored::OtherClient => "other-client",
            Ignored::Relayed => "relayed",
            Ignored::OtherServer => "other-server",
            Ignored::NoMessageType => "no-message-type",
            Ignored::Unhandled => "unhandled",
        }
    }
}

/// Answer `packet` (a UDP payload that arrived on the guest's tap) for
/// `lease`, or say why not.
pub(crate) fn respond(lease: &GuestLease, packet: &[u8]) -> Result<Reply, Ignored> {
    if packet.len() > MAX_PACKET {
        return Err(Ignored::TooLong);
    }
    if packet.len() < MIN_PACKET || packet[236..240] != MAGIC {
        return Err(Ignored::Malformed);
    }
    let request = Message::from_bytes(&client_options(packet)?).map_err(|_| Ignored::Malformed)?;
    if request.opcode() != Opcode::BootRequest {
        return Err(Ignored::NotARequest);
    }
    // hlen is checked before chaddr(), which slices by it.
    if request.htype() != HType::Eth || request.hlen() != 6 {
        return Err(Ignored::NotEthernet);
    }
    if request.chaddr() != lease.mac().octets() {
        return Err(Ignored::OtherClient);
    }
    if !request.giaddr().is_unspecified() || request.hops() != 0 {
        return Err(Ignored::Relayed);
    }
    let guest = lease.address().addr();
    let requested = match request.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
        _ => None,
    };
    let server_id = match request.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
        _ => None,
    };
    let kind = match request.opts().msg_type() {
        None => return Err(Ignored::NoMessageType),
        Some(MessageType::Discover) => ReplyKind::Offer,
        Some(MessageType::Request) => match (server_id, requested) {
            // SELECTING: the guest chose an offer; only ours is answered.
            (Some(server), _) if server != lease.gateway() => return Err(Ignored::OtherServer),
            (Some(_), Some(ip)) | (None, Some(ip)) => ack_if(ip == guest),
            (Some(_), None) => ReplyKind::Nak,
            // RENEWING or REBINDING: the address is in ciaddr.
            (None, None) => ack_if(request.ciaddr() == guest),
        },
        Some(_) => return Err(Ignored::Unhandled),
    };
    let bytes = reply(lease, &request, kind)
        .to_vec()
        .map_err(|_| Ignored::Malformed)?;
    let ciaddr = request.ciaddr();
    let to = if kind != ReplyKind::Nak && ciaddr == guest {
        SocketAddrV4::new(guest, CLIENT_PORT)
    } else {
        // The guest may not have its address yet: it listens on a raw
        // socket for anything to port 68 with its transaction id.
        SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT)
    };
    Ok(Reply { kind, bytes, to })
}

/// The options a client's DISCOVER or REQUEST carries that this responder
/// reads, each with its exact length, and those only.
const KEPT_OPTIONS: [(u8, Option<usize>); 4] = [
    (50, Some(4)), // requested IP address
    (53, Some(1)), // message type
    (54, Some(4)), // server identifier
    (61, None),    // client identifier
];

/// `packet` with its options walked and filtered: only [`KEPT_OPTIONS`],
/// each at most once and of its exact length, then End. Hand-written
/// because dhcproto's option decoder trusts some lengths (debug assertions,
/// a subtraction that can underflow, an `unwrap` on a route prefix): what
/// reaches it here is only what it decodes safely.
fn client_options(packet: &[u8]) -> Result<Vec<u8>, Ignored> {
    let mut kept = packet[..MIN_PACKET].to_vec();
    let mut seen = [false; KEPT_OPTIONS.len()];
    let mut at = MIN_PACKET;
    while let Some(&code) = packet.get(at) {
        match code {
            0 => at += 1, // pad
            255 => break, // end
            _ => {
                let len = usize::from(*packet.get(at + 1).ok_or(Ignored::Malformed)?);
                let value = packet.get(at + 2..at + 2 + len).ok_or(Ignored::Malformed)?;
                if let Some(i) = KEPT_OPTIONS.iter().position(|&(c, _)| c == code) {
                    let exact = KEPT_OPTIONS[i].1;
                    if seen[i] || exact.is_some_and(|n| n != len) || len == 0 {
                        return Err(Ignored::Malformed);
                    }
                    seen[i] = true;
                    kept.extend_from_slice(&[code, len as u8]);
                    kept.extend_from_slice(value);
                }
                at += 2 + len;
            }
        }
    }
    kept.push(255);
    Ok(kept)
}

fn ack_if(matches: bool) -> ReplyKind {
    if matches {
        ReplyKind::Ack
    } else {
        ReplyKind::Nak
    }
}

fn reply(lease: &GuestLease, request: &Message, kind: ReplyKind) -> Message {
    let mut msg = Message::default();
    msg.set_opcode(Opcode::BootReply)
        .set_htype(HType::Eth)
        .set_chaddr(&lease.mac().octets())
        .set_xid(request.xid())
        .set_secs(0)
        .set_flags(if request.flags().broadcast() {
            Flags::default().set_broadcast()
        } else {
            Flags::default()
        })
        .set_hops(0)
        .clear_addrs();
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::ServerIdentifier(lease.gateway()));
    match kind {
        ReplyKind::Nak => {
            opts.insert(DhcpOption::MessageType(MessageType::Nak));
        }
        ReplyKind::Offer | ReplyKind::Ack => {
            let secs = lease.lease_secs();
            opts.insert(DhcpOption::MessageType(if kind == ReplyKind::Offer {
                MessageType::Offer
            } else {
                MessageType::Ack
            }));
            opts.insert(DhcpOption::AddressLeaseTime(secs));
            opts.insert(DhcpOption::Renewal(secs / 2));
            opts.insert(DhcpOption::Rebinding(secs / 8 * 7));
            opts.insert(DhcpOption::SubnetMask(lease.address().netmask()));
            opts.insert(DhcpOption::Router(vec![lease.gateway()]));
            opts.insert(DhcpOption::DomainNameServer(vec![lease.gateway()]));
        }
    }
    if let Some(DhcpOption::ClientIdentifier(id)) = request.opts().get(OptionCode::ClientIdentifier)
    {
        if id.len() <= MAX_ECHOED_CLIENT_ID {
            let id = id.clone();
            msg.opts_mut().insert(DhcpOption::ClientIdentifier(id));
        }
    }
    if kind != ReplyKind::Nak {
        msg.set_yiaddr(lease.address().addr());
        if kind == ReplyKind::Ack && request.ciaddr() == lease.address().addr() {
            msg.set_ciaddr(request.ciaddr());
        }
    }
    msg
}
