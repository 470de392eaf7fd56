//! The `dns:` section: upstream resolvers, static answers (`hosts`, which
//! pin their names) and the per-sandbox limits on what is forwarded, each
//! violation reported at its node like the rest of the policy.

use super::Checker;
use crate::policy::hostname::{self, Pattern};
use crate::policy::model::{DnsConfig, DnsLimits, QUERY_TYPES};
use crate::policy::yaml::{list, Node, Pos, Value};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

const DNS_KEYS: &[&str] = &["upstream", "hosts", "limits"];
const LIMIT_KEYS: &[&str] = &[
    "query_types",
    "max_name_length",
    "queries_per_minute",
    "names_per_minute",
];
/// Longest name DNS can carry (RFC 1035), the ceiling of `max_name_length`.
const MAX_DNS_NAME: usize = 253;
/// Ceilings of the per-minute budgets: the distinct-name window holds up to
/// `names_per_minute` names per sandbox, so it is capped to bound memory.
const MAX_QUERIES_PER_MINUTE: i128 = 1_000_000;
const MAX_NAMES_PER_MINUTE: i128 = 10_000;

impl Checker {
    pub(super) fn dns(&mut self, v: &Node) -> DnsConfig {
        let mut out = DnsConfig::default();
        let Some(f) = self.optional_mapping(v, DNS_KEYS, "`dns`") else {
            return out;
        };
        if let Some(u) = f.get("upstream") {
            let items = self.list_of(
                u,
                "`dns.upstream`",
                "`upstream: [\"198.18.0.53:53\"]` (or `[]` to answer only from `dns.hosts`)",
            );
            let mut ups = Vec::with_capacity(items.len());
            for item in items {
                match &item.value {
                    Value::Str(s) => match parse_upstream(s) {
                        Ok(addr) => ups.push(addr),
                        Err(msg) => self.err(item.pos, msg),
                    },
                    _ => self.err(
                        item.pos,
                        format!(
                            "a DNS upstream must be a string, but this is {}; write \"198.18.0.53:53\" or \"[2001:db8::53]:53\"",
                            item.kind()
                        ),
                    ),
                }
            }
            out.upstream = Some(ups);
        }
        if let Some(l) = f.get("limits") {
            out.limits = self.dns_limits(l);
        }
        if let Some(h) = f.get("hosts") {
            match &h.value {
                Value::Null => {}
                Value::Map(entries) => out.hosts = self.dns_hosts(entries),
                _ => self.err(
                    h.pos,
                    format!(
                        "`dns.hosts` must be a mapping of name to addresses, but it is {}; write `hosts: {{ \"origin.test\": [\"198.18.0.1\"] }}`",
                        h.kind()
                    ),
                ),
            }
        }
        out
    }

    fn dns_hosts(&mut self, entries: &[(Node, Node)]) -> HashMap<String, Vec<IpAddr>> {
        let mut out = HashMap::new();
        let mut first_at: HashMap<String, Pos> = HashMap::new();
        for (key, value) in entries {
            let Value::Str(raw) = &key.value else {
                self.err(
                    key.pos,
                    format!(
                        "a `dns.hosts` name must be a string, but this is {}",
                        key.kind()
                    ),
                );
                continue;
            };
            let name = match hostname::parse_pattern(raw) {
                Ok(Pattern::Exact(n)) => Some(n),
                Ok(Pattern::Wildcard(_)) => {
                    self.err(
                        key.pos,
                        format!(
                            "`dns.hosts` answers exact names only, not `{raw}`; list each name"
                        ),
                    );
                    None
                }
                Err(msg) => {
                    self.err(key.pos, msg);
                    None
                }
            };
            let addrs = self.dns_addrs(value, raw);
            let Some(name) = name else { continue };
            if let Some(first) = first_at.get(&name) {
                self.err(
                    key.pos,
                    format!(
                        "`dns.hosts` lists `{name}` twice (first at line {}); merge the addresses into one entry",
                        first.line
                    ),
                );
                continue;
            }
            first_at.insert(name.clone(), key.pos);
            out.insert(name, addrs);
        }
        out
    }

    fn dns_addrs(&mut self, v: &Node, name: &str) -> Vec<IpAddr> {
        let what = format!("the addresses of `{name}` in `dns.hosts`");
        let items = self.list_of(v, &what, "`[\"198.18.0.1\", \"2001:db8::1\"]`");
        if items.is_empty() && matches!(v.value, Value::Seq(_)) {
            self.err(
                v.pos,
                format!("{what} are empty; list at least one address or remove the name"),
            );
        }
        let mut addrs = Vec::with_capacity(items.len());
        for item in items {
            match &item.value {
                Value::Str(s) => match s.trim().parse::<IpAddr>() {
                    Ok(ip) => addrs.push(ip),
                    Err(_) => self.err(
                        item.pos,
                        format!("`{s}` is not an IP address; write one like \"198.18.0.1\" or \"2001:db8::1\""),
                    ),
                },
                _ => self.err(
                    item.pos,
                    format!(
                        "an address in `dns.hosts` must be a string, but this is {}; write it like \"198.18.0.1\"",
                        item.kind()
                    ),
                ),
            }
        }
        addrs
    }

    /// The fields of a section that may be left out (null: `None`, no
    /// error) or be a mapping of `keys`; anything else is an error, `None`.
    pub(super) fn optional_mapping<'n>(
        &mut self,
        v: &'n Node,
        keys: &[&'static str],
        what: &str,
    ) -> Option<crate::policy::yaml::Fields<'n>> {
        match &v.value {
            Value::Map(entries) => Some(self.fields(v, entries, keys, what)),
            Value::Null => None,
            _ => {
                self.err(
                    v.pos,
                    format!(
                        "{what} must be a mapping with the keys {}, but it is {}",
                        list(keys),
                        v.kind()
                    ),
                );
                None
            }
        }
    }

    fn dns_limits(&mut self, v: &Node) -> DnsLimits {
        let mut out = DnsLimits::default();
        let Some(f) = self.optional_mapping(v, LIMIT_KEYS, "`dns.limits`") else {
            return out;
        };
        if let Some(t) = f.get("query_types") {
            out.query_types = self.query_types(t);
        }
        if let Some(n) = f.get("max_name_length") {
            if let Some(n) = self.bounded(n, "`dns.limits.max_name_length`", MAX_DNS_NAME as i128) {
                out.max_name_length = n as usize;
            }
        }
        if let Some(n) = f.get("queries_per_minute") {
            if let Some(n) =
                self.bounded(n, "`dns.limits.queries_per_minute`", MAX_QUERIES_PER_MINUTE)
            {
                out.queries_per_minute = n as u32;
            }
        }
        if let Some(n) = f.get("names_per_minute") {
            if let Some(n) = self.bounded(n, "`dns.limits.names_per_minute`", MAX_NAMES_PER_MINUTE)
            {
                out.names_per_minute = n as u32;
            }
        }
        out
    }

    /// A whole number in 1..=`max`.
    pub(super) fn bounded(&mut self, v: &Node, what: &str, max: i128) -> Option<i128> {
        match &v.value {
            Value::Int(n) if (1..=max).contains(n) => Some(*n),
            Value::Int(n) => {
                self.err(
                    v.pos,
                    format!("{what} is {n}; write a whole number from 1 to {max}"),
                );
                None
            }
            _ => {
                self.err(
                    v.pos,
                    format!(
                        "{what} must be a whole number, but it is {}; write a number from 1 to {max}",
                        v.kind()
                    ),
                );
                None
            }
        }
    }

    fn query_types(&mut self, v: &Node) -> Vec<u16> {
        let items = self.list_of(
            v,
            "`dns.limits.query_types`",
            "`query_types: [A, AAAA, CNAME, HTTPS, SVCB]`",
        );
        let mut codes = Vec::with_capacity(items.len());
        for item in items {
            let Value::Str(raw) = &item.value else {
                self.err(
                    item.pos,
                    format!(
                        "a query type must be a name such as A or AAAA, but this is {}",
                        item.kind()
                    ),
                );
                continue;
            };
            match parse_query_type(raw) {
                Ok(code) => codes.push(code),
                Err(msg) => self.err(item.pos, msg),
            }
        }
        codes.sort_unstable();
        codes.dedup();
        codes
    }
}

/// A query type by mnemonic (case-insensitive) or as `TYPEnnn` (RFC 3597).
fn parse_query_type(raw: &str) -> Result<u16, String> {
    let upper = raw.trim().to_ascii_uppercase();
    if let Some((_, code)) = QUERY_TYPES.iter().find(|(name, _)| *name == upper) {
        return Ok(*code);
    }
    if let Some(code) = upper
        .strip_prefix("TYPE")
        .and_then(|n| n.parse::<u16>().ok())
    {
        return Ok(code);
    }
    let known: Vec<&str> = QUERY_TYPES.iter().map(|(name, _)| *name).collect();
    Err(format!(
        "`{raw}` is not a DNS query type sluice knows; write one of {} or a type number as `TYPE123`",
        known.join(", ")
    ))
}

/// Parses a DNS upstream: "ip:port", "[v6]:port", or a bare address (port 53).
fn parse_upstream(raw: &str) -> Result<SocketAddr, String> {
    let s = raw.trim();
    let addr = match s.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => match s.parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, 53),
            Err(_) => {
                return Err(format!(
                    "`{raw}` is not a DNS server address; write \"198.18.0.53:53\" or \"[2001:db8::53]:53\" (an IP address, not a name)"
                ))
            }
        },
    };
    if addr.port() == 0 {
        return Err(format!(
            "`{raw}` has port 0; DNS servers listen on port 53 (write \"{}:53\")",
            match addr.ip() {
                IpAddr::V4(ip) => ip.to_string(),
                IpAddr::V6(ip) => format!("[{ip}]"),
            }
        ));
    }
    Ok(addr)
}
