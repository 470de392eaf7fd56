//! The netlink format as nf_tables takes it: attributes ([`Attr`]) and
//! messages written into a buffer, and the kernel's datagrams, messages
//! and attributes read back out of one. Pure: no socket here, and nothing
//! that knows what a table, chain or rule is. It must never read past
//! what a length says: a message that claims more than is there ends the
//! reading ([`messages`]), a malformed attribute makes the whole list
//! `None` ([`attrs_of`]).

use netlink_packet_core::{NlaBuffer, NlasIterator};

use super::{NLA_F_NESTED, NLA_TYPE_MASK};

/// One netlink attribute's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Attr {
    /// Big-endian, as nf_tables' numbers are.
    U32(u32),
    U64(u64),
    /// Sent NUL-terminated.
    Str(&'static str),
    Bytes(Vec<u8>),
    Nest(Vec<(u16, Attr)>),
}

impl Attr {
    pub(super) fn put(&self, kind: u16, buf: &mut Vec<u8>) {
        let start = buf.len();
        buf.extend_from_slice(&[0; 4]);
        let mut flag = 0;
        match self {
            Attr::U32(v) => buf.extend_from_slice(&v.to_be_bytes()),
            Attr::U64(v) => buf.extend_from_slice(&v.to_be_bytes()),
            Attr::Str(s) => {
                buf.extend_from_slice(s.as_bytes());
                buf.push(0);
            }
            Attr::Bytes(b) => buf.extend_from_slice(b),
            Attr::Nest(children) => {
                flag = NLA_F_NESTED;
                for (k, a) in children {
                    a.put(*k, buf);
                }
            }
        }
        let len = (buf.len() - start) as u16;
        buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        buf[start + 2..start + 4].copy_from_slice(&(kind | flag).to_ne_bytes());
        buf.resize(buf.len().next_multiple_of(4), 0);
    }

    /// Whether `payload`, as the kernel dumped it, says the same.
    pub(super) fn matches(&self, payload: &[u8]) -> bool {
        match self {
            Attr::U32(v) => payload == v.to_be_bytes(),
            Attr::U64(v) => payload == v.to_be_bytes(),
            Attr::Str(s) => trim_nul(payload) == s.as_bytes(),
            Attr::Bytes(b) => payload == b.as_slice(),
            Attr::Nest(children) => match attrs_of(payload) {
                Some(got) => {
                    got.len() == children.len()
                        && children
                            .iter()
                            .all(|(k, want)| got.iter().any(|(gk, gp)| gk == k && want.matches(gp)))
                }
                None => false,
            },
        }
    }
}

/// Appends one netlink message: header, nfgenmsg, attributes.
pub(super) fn message(
    buf: &mut Vec<u8>,
    ty: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
    attrs: &[(u16, Attr)],
) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 4]); // length, below
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes()); // to the kernel
    buf.extend_from_slice(&[family, 0]); // NFNETLINK_V0
    buf.extend_from_slice(&res_id.to_be_bytes());
    for (k, a) in attrs {
        a.put(*k, buf);
    }
    let len = (buf.len() - start) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}

/// The messages in one datagram: (type, flags, sequence number, payload).
pub(super) fn messages(mut data: &[u8]) -> Vec<(u16, u16, u32, &[u8])> {
    let mut out = Vec::new();
    while data.len() >= 16 {
        let u32_at =
            |i: usize| u32::from_ne_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
        let len = u32_at(0) as usize;
        if len < 16 || len > data.len() {
            break;
        }
        let ty = u16::from_ne_bytes([data[4], data[5]]);
        let flags = u16::from_ne_bytes([data[6], data[7]]);
        out.push((ty, flags, u32_at(8), &data[16..len]));
        data = &data[len.next_multiple_of(4).min(data.len())..];
    }
    out
}

/// The attributes in `payload` as (type without flags, value); `None` if
/// any is malformed.
pub(super) fn attrs_of(payload: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    NlasIterator::new(payload)
        .map(|nla| {
            let nla: NlaBuffer<&[u8]> = nla.ok()?;
            let (kind, len) = (nla.kind() & NLA_TYPE_MASK, nla.value_length());
            nla.into_inner().get(4..4 + len).map(|value| (kind, value))
        })
        .collect()
}

pub(super) fn find(payload: &[u8], kind: u16) -> Option<&[u8]> {
    attrs_of(payload)?
        .into_iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| v)
}

pub(super) fn string(payload: &[u8], kind: u16) -> String {
    find(payload, kind).map_or_else(String::new, |v| {
        String::from_utf8_lossy(trim_nul(v)).into_owned()
    })
}

pub(super) fn be32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.try_into().ok()?))
}

pub(super) fn trim_nul(v: &[u8]) -> &[u8] {
    v.strip_suffix(&[0]).unwrap_or(v)
}
