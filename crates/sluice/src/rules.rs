//! Access rules shared by the config file, the exports and the listener:
//! who is squashed, and which client addresses are admitted.

use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::net::IpAddr;

/// Which callers lose their identity.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Squash {
    /// Everyone keeps their identity.
    None,
    /// uid 0 becomes the anonymous user, gid 0 the anonymous group.
    #[default]
    Root,
    /// Everyone becomes the anonymous user and group.
    All,
}

/// An address range: an address and a prefix length ("10.0.0.0/8",
/// "::1", "192.168.1.7").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    addr: IpAddr,
    prefix: u8,
}

/// True when `ip` lies in one of `ranges`; an empty list admits everyone.
pub fn admitted(ranges: &[IpRange], ip: IpAddr) -> bool {
    ranges.is_empty() || ranges.iter().any(|r| r.contains(ip))
}

impl IpRange {
    /// Parses "ADDR" or "ADDR/PREFIX".
    pub fn parse(s: &str) -> Result<Self, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not an address or address/prefix range"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(IpRange { addr, prefix })
    }

    /// True when `ip` lies in the range (IPv4-mapped IPv6 addresses match
    /// IPv4 ranges).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - self.prefix as u32).unwrap_or(0);
                u32::from(net) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - self.prefix as u32).unwrap_or(0);
                u128::from(net) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl<'de> Deserialize<'de> for IpRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        IpRange::parse(&s).map_err(de::Error::custom)
    }
}

impl std::fmt::Display for IpRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}
