//! MAC addresses: parsing and printing the `aa:bb:cc:dd:ee:ff` form, and the
//! rule for an address a guest's NIC may be given (unicast, not all zeros).
//! A guest's MAC is what sluice's layer-2 fence and its DHCP responder key
//! on, so this module refuses anything that could not be one guest's own
//! address. It knows nothing of interfaces, sockets or rules.

use std::fmt;
use std::str::FromStr;

/// A 48-bit Ethernet address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

/// Why a string is not a guest's MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    #[error("'{0}' is not a MAC address: expected six hex pairs such as 52:54:00:12:34:56")]
    Syntax(String),
    #[error("{0} is a multicast address: a guest's NIC needs a unicast one (an even first octet, e.g. 52:54:00:...)")]
    Multicast(MacAddr),
    #[error("00:00:00:00:00:00 cannot be a guest's MAC address")]
    Zero,
}

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// The address from the first six bytes of `bytes`, if there are six.
    pub fn from_slice(bytes: &[u8]) -> Option<MacAddr> {
        Some(MacAddr(bytes.get(..6)?.try_into().ok()?))
    }

    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// The IPv6 link-local address a kernel gives an interface with this
    /// MAC by default: fe80::/64 with the modified EUI-64 (RFC 4291 2.5.1).
    pub(crate) fn link_local(&self) -> std::net::Ipv6Addr {
        let m = self.0;
        std::net::Ipv6Addr::from([
            0xfe,
            0x80,
            0,
            0,
            0,
            0,
            0,
            0,
            m[0] ^ 0x02,
            m[1],
            m[2],
            0xff,
            0xfe,
            m[3],
            m[4],
            m[5],
        ])
    }

    /// The group bit: multicast and broadcast addresses.
    pub(crate) fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }

    /// Ok when a guest's NIC may carry this address.
    pub(crate) fn check_guest(self) -> Result<MacAddr, MacError> {
        if self.0 == [0; 6] {
            Err(MacError::Zero)
        } else if self.is_multicast() {
            Err(MacError::Multicast(self))
        } else {
            Ok(self)
        }
    }

    /// Parse `s` and check it is fit for a guest's NIC.
    pub fn parse_guest(s: &str) -> Result<MacAddr, MacError> {
        s.parse::<MacAddr>()?.check_guest()
    }
}

impl FromStr for MacAddr {
    type Err = MacError;

    /// Six hex pairs separated by `:` or `-` (either case).
    fn from_str(s: &str) -> Result<MacAddr, MacError> {
        let bad = || MacError::Syntax(s.chars().take(40).collect());
        let mut octets = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for octet in &mut octets {
            let part = parts.next().ok_or_else(bad)?;
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *octet = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(octets))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// As its text (`52:54:00:5c:fe:02`), read back with [`MacAddr::from_str`]:
/// the daemon's requests carry it so.
impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MacAddr, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl crate::exit_class::Classified for MacError {
    /// A MAC address that does not parse or is not unicast.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::BadInput
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_both_separators() {
        let mac: MacAddr = "52:54:00:AB:cd:0f".parse().unwrap();
        assert_eq!(mac.0, [0x52, 0x54, 0, 0xab, 0xcd, 0x0f]);
        assert_eq!(mac.to_string(), "52:54:00:ab:cd:0f");
        assert_eq!("52-54-00-ab-cd-0f".parse::<MacAddr>().unwrap(), mac);
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:0f:00",
            "52:54:00:ab:cd:0",
            "52:54:00:ab:cd:0g",
            "525400abcd0f",
            "52:54:00:ab:cd:+f",
            "52::54:00:ab:cd",
        ] {
            assert!(
                matches!(bad.parse::<MacAddr>(), Err(MacError::Syntax(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_guest_mac_is_unicast_and_not_zero() {
        assert!(MacAddr::parse_guest("52:54:00:12:34:56").is_ok());
        assert_eq!(
            MacAddr::parse_guest("00:00:00:00:00:00"),
            Err(MacError::Zero)
        );
        assert!(matches!(
            MacAddr::parse_guest("ff:ff:ff:ff:ff:ff"),
            Err(MacError::Multicast(_))
        ));
        assert!(matches!(
            MacAddr::parse_guest("33:33:00:00:00:01"),
            Err(MacError::Multicast(_))
        ));
    }

    #[test]
    fn the_link_local_address_is_the_modified_eui64_of_the_mac() {
        let mac: MacAddr = "52:54:00:5c:fe:02".parse().unwrap();
        assert_eq!(mac.link_local().to_string(), "fe80::5054:ff:fe5c:fe02");
    }

    #[test]
    fn from_slice_needs_six_bytes() {
        assert_eq!(MacAddr::from_slice(&[1, 2, 3, 4, 5]), None);
        assert_eq!(
            MacAddr::from_slice(&[2, 2, 3, 4, 5, 6, 7]),
            Some(MacAddr([2, 2, 3, 4, 5, 6]))
        );
    }
}
