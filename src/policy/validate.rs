//! Validation: turns the YAML tree into rules and settings, collecting every
//! violation (with the tree location it belongs to) instead of stopping at
//! the first. Messages say what is wrong and what to write instead.

use super::hostname::{self, Pattern};
use super::model::{DnsConfig, Mode, PortRange, Rule, Verdict};
use super::yaml::{Loc, Node};
use ipnet::{IpNet, Ipv4Net};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

/// Placeholder in a message for "where the first one is" (`Problem::first`).
pub(crate) const FIRST: &str = "{first}";

/// A violation before its position is looked up.
#[derive(Debug)]
pub(crate) struct Problem {
    pub at: Loc,
    pub message: String,
    /// Replaces [`FIRST`] in the message with that node's line.
    pub first: Option<Loc>,
}

/// Everything a valid file says.
#[derive(Debug)]
pub(crate) struct Validated {
    pub name: String,
    pub mode: Mode,
    pub rules: Vec<Rule>,
    pub dns: DnsConfig,
}

const TOP_KEYS: &[&str] = &["version", "name", "mode", "rules", "dns"];
const RULE_KEYS: &[&str] = &["name", "action", "cidrs", "hosts", "ports"];
const DNS_KEYS: &[&str] = &["upstream", "hosts"];

/// Validates a parsed policy document.
pub(crate) fn validate(root: &Node) -> Result<Validated, Vec<Problem>> {
    let mut c = Checker::default();
    let out = c.policy(root);
    if c.problems.is_empty() {
        Ok(out)
    } else {
        Err(c.problems)
    }
}

#[derive(Default)]
struct Checker {
    problems: Vec<Problem>,
}

/// The known keys of one mapping: key -> (entry index, value).
struct Fields<'n> {
    at: Loc,
    found: HashMap<&'static str, (usize, &'n Node)>,
}

impl<'n> Fields<'n> {
    fn get(&self, key: &str) -> Option<(Loc, &'n Node)> {
        self.found.get(key).map(|&(i, v)| (self.at.child(i), v))
    }
}

impl Checker {
    fn err(&mut self, at: Loc, message: impl Into<String>) {
        self.problems.push(Problem {
            at,
            message: message.into(),
            first: None,
        });
    }

    /// Checks a mapping's keys: strings, known, not repeated.
    fn fields<'n>(
        &mut self,
        entries: &'n [(Node, Node)],
        at: &Loc,
        allowed: &[&'static str],
        what: &str,
    ) -> Fields<'n> {
        let mut found: HashMap<&'static str, (usize, &'n Node)> = HashMap::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            let Node::Str(key) = key else {
                self.err(
                    at.key_of(i),
                    format!(
                        "{what} has a key that is {}; the allowed keys are {}",
                        key.kind(),
                        list(allowed)
                    ),
                );
                continue;
            };
            let Some(&known) = allowed.iter().find(|k| **k == key) else {
                let hint = suggest(key, allowed)
                    .map(|s| format!("did you mean `{s}`? "))
                    .unwrap_or_default();
                self.err(
                    at.key_of(i),
                    format!(
                        "unknown key `{key}` in {what}; {hint}the allowed keys are {}",
                        list(allowed)
                    ),
                );
                continue;
            };
            if let Some(&(first, _)) = found.get(known) {
                self.problems.push(Problem {
                    at: at.key_of(i),
                    message: format!(
                        "key `{key}` appears twice in {what} (first at {FIRST}); keep only one"
                    ),
                    first: Some(at.key_of(first)),
                });
                continue;
            }
            found.insert(known, (i, value));
        }
        Fields {
            at: at.clone(),
            found,
        }
    }

    fn policy(&mut self, root: &Node) -> Validated {
        let top = Loc::default();
        let mut out = Validated {
            name: String::new(),
            mode: Mode::Enforce,
            rules: Vec::new(),
            dns: DnsConfig::default(),
        };
        let entries = match root {
            Node::Map(entries) => entries,
            Node::Null => {
                self.err(
                    top,
                    "the policy is empty; start it with `version: 1`, `name: ...` and `rules:`",
                );
                return out;
            }
            other => {
                self.err(
                    top,
                    format!(
                        "the policy must be a mapping with the keys {}, but it is {}",
                        list(TOP_KEYS),
                        other.kind()
                    ),
                );
                return out;
            }
        };
        let f = self.fields(entries, &top, TOP_KEYS, "the policy");

        match f.get("version") {
            None => self.err(
                top.clone(),
                "missing `version`; add `version: 1` at the top",
            ),
            Some((_, Node::Int(1))) => {}
            Some((at, v)) => self.err(
                at,
                format!(
                    "unsupported policy version {}; this sluice understands `version: 1`",
                    short(v)
                ),
            ),
        }
        match f.get("name") {
            None => self.err(
                top.clone(),
                "missing `name`; add `name: <policy name>` at the top",
            ),
            Some((at, v)) => out.name = self.nonempty_string(at, v, "the policy `name`"),
        }
        if let Some((at, v)) = f.get("mode") {
            match v {
                Node::Str(s) if s == "enforce" => out.mode = Mode::Enforce,
                Node::Str(s) if s == "audit" => out.mode = Mode::Audit,
                other => self.err(
                    at,
                    format!(
                        "`mode` is {}; write `mode: enforce` (block) or `mode: audit` (only log would-deny)",
                        other.kind()
                    ),
                ),
            }
        }
        if let Some((at, v)) = f.get("rules") {
            out.rules = self.rules(&at, v);
        }
        if let Some((at, v)) = f.get("dns") {
            out.dns = self.dns(&at, v);
        }
        out
    }

    fn nonempty_string(&mut self, at: Loc, v: &Node, what: &str) -> String {
        match v {
            Node::Str(s) if !s.trim().is_empty() => s.clone(),
            Node::Str(_) => {
                self.err(at, format!("{what} is empty; give it a short name"));
                String::new()
            }
            other => {
                self.err(
                    at,
                    format!("{what} must be a string, but it is {}", other.kind()),
                );
                String::new()
            }
        }
    }

    /// The items of a list-valued key, or a violation if it is not a list.
    fn list_of<'n>(&mut self, at: &Loc, v: &'n Node, what: &str, example: &str) -> &'n [Node] {
        match v {
            Node::Seq(items) => items,
            other => {
                self.err(
                    at.clone(),
                    format!(
                        "{what} must be a list, but it is {}; write it like {example}",
                        other.kind()
                    ),
                );
                &[]
            }
        }
    }

    fn rules(&mut self, at: &Loc, v: &Node) -> Vec<Rule> {
        if matches!(v, Node::Null) {
            return Vec::new();
        }
        let items = self.list_of(
            at,
            v,
            "`rules`",
            "`rules: [{name: web, action: allow, cidrs: [\"198.18.0.1/32\"]}]`",
        );
        let mut rules = Vec::with_capacity(items.len());
        let mut names: HashMap<String, Loc> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let Some((rule, name_at)) = self.rule(&at.child(i), item, i) else {
                continue;
            };
            if let Some(name_at) = name_at {
                if let Some(first) = names.get(&rule.name) {
                    self.problems.push(Problem {
                        at: name_at,
                        message: format!(
                            "duplicate rule name `{}` (first used at {FIRST}); give every rule its own name, audit and metrics report it",
                            rule.name
                        ),
                        first: Some(first.clone()),
                    });
                    continue;
                }
                names.insert(rule.name.clone(), name_at);
            }
            rules.push(rule);
        }
        rules
    }

    /// Returns the rule and where its name is, or None if it has no usable name.
    fn rule(&mut self, at: &Loc, v: &Node, index: usize) -> Option<(Rule, Option<Loc>)> {
        let Node::Map(entries) = v else {
            self.err(
                at.clone(),
                format!(
                    "rule #{} must be a mapping with the keys {}, but it is {}",
                    index + 1,
                    list(RULE_KEYS),
                    v.kind()
                ),
            );
            return None;
        };
        let label = match entries
            .iter()
            .find(|(k, _)| matches!(k, Node::Str(s) if s == "name"))
        {
            Some((_, Node::Str(s))) if !s.trim().is_empty() => format!("rule `{s}`"),
            _ => format!("rule #{}", index + 1),
        };
        let f = self.fields(entries, at, RULE_KEYS, &label);
        let before = self.problems.len();

        let mut name_at = None;
        let name = match f.get("name") {
            None => {
                self.err(
                    at.clone(),
                    format!("{label} has no `name`; add `name: <unique name>`"),
                );
                String::new()
            }
            Some((nat, v)) => {
                name_at = Some(nat.clone());
                self.nonempty_string(nat, v, &format!("{label}'s `name`"))
            }
        };
        let action = match f.get("action") {
            Some((_, Node::Str(s))) if s == "allow" => Verdict::Allow,
            Some((_, Node::Str(s))) if s == "deny" => Verdict::Deny,
            Some((aat, other)) => {
                self.err(
                    aat,
                    format!(
                        "{label}'s `action` is {}; write `action: allow` or `action: deny`",
                        other.kind()
                    ),
                );
                Verdict::Deny
            }
            None => {
                self.err(
                    at.clone(),
                    format!("{label} has no `action`; add `action: allow` or `action: deny`"),
                );
                Verdict::Deny
            }
        };

        let mut cidrs = Vec::new();
        let mut given = 0;
        if let Some((cat, v)) = f.get("cidrs") {
            let items = self.list_of(
                &cat,
                v,
                &format!("{label}'s `cidrs`"),
                "`cidrs: [\"198.18.0.0/15\"]`",
            );
            given += items.len();
            for (i, item) in items.iter().enumerate() {
                match item {
                    Node::Str(s) => match parse_cidr(s) {
                        Ok(net) => {
                            if !cidrs.contains(&net) {
                                cidrs.push(net);
                            }
                        }
                        Err(msg) => self.err(cat.child(i), msg),
                    },
                    other => self.err(
                        cat.child(i),
                        format!(
                            "a CIDR must be a string, but this is {}; write it in quotes like \"198.18.0.0/15\"",
                            other.kind()
                        ),
                    ),
                }
            }
        }
        let mut hosts = Vec::new();
        if let Some((hat, v)) = f.get("hosts") {
            let items = self.list_of(
                &hat,
                v,
                &format!("{label}'s `hosts`"),
                "`hosts: [\"example.com\", \"*.example.com\"]`",
            );
            given += items.len();
            for (i, item) in items.iter().enumerate() {
                match item {
                    Node::Str(s) => match hostname::parse_pattern(s) {
                        Ok(p) => {
                            let text = match p {
                                Pattern::Exact(n) => n,
                                Pattern::Wildcard(suffix) => format!("*.{suffix}"),
                            };
                            if !hosts.contains(&text) {
                                hosts.push(text);
                            }
                        }
                        Err(msg) => self.err(hat.child(i), msg),
                    },
                    other => self.err(
                        hat.child(i),
                        format!(
                            "a hostname must be a string, but this is {}; write it like \"example.com\"",
                            other.kind()
                        ),
                    ),
                }
            }
        }
        let mut ports = Vec::new();
        if let Some((pat, v)) = f.get("ports") {
            let items = self.list_of(
                &pat,
                v,
                &format!("{label}'s `ports`"),
                "`ports: [443, \"8000-8100\"]`",
            );
            if items.is_empty() {
                self.err(
                    pat.clone(),
                    format!("{label} has an empty `ports` list, which would match no port; list ports, or remove `ports` to match any port"),
                );
            }
            for (i, item) in items.iter().enumerate() {
                match parse_port(item) {
                    Ok(r) => ports.push(r),
                    Err(msg) => self.err(pat.child(i), msg),
                }
            }
        }
        if given == 0 {
            self.err(
                at.clone(),
                format!(
                    "{label} has neither `cidrs` nor `hosts`, so it matches nothing; add `cidrs: [...]` or `hosts: [...]` (to match everything: cidrs: [\"0.0.0.0/0\", \"::/0\"])"
                ),
            );
        }
        if self.problems.len() != before {
            // Keep checking the name for duplicates even if the rule is bad.
            let rule = Rule {
                name,
                action,
                cidrs,
                hosts,
                ports: Vec::new(),
            };
            return (!rule.name.is_empty()).then_some((rule, name_at));
        }
        Some((
            Rule {
                name,
                action,
                cidrs,
                hosts,
                ports: merge_ports(ports),
            },
            name_at,
        ))
    }

    fn dns(&mut self, at: &Loc, v: &Node) -> DnsConfig {
        let mut out = DnsConfig::default();
        let entries = match v {
            Node::Map(entries) => entries,
            Node::Null => return out,
            other => {
                self.err(
                    at.clone(),
                    format!(
                        "`dns` must be a mapping with the keys {}, but it is {}",
                        list(DNS_KEYS),
                        other.kind()
                    ),
                );
                return out;
            }
        };
        let f = self.fields(entries, at, DNS_KEYS, "`dns`");
        if let Some((uat, v)) = f.get("upstream") {
            let items = self.list_of(
                &uat,
                v,
                "`dns.upstream`",
                "`upstream: [\"198.18.0.53:53\"]` (or `[]` to answer only from `dns.hosts`)",
            );
            let mut ups = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Node::Str(s) => match parse_upstream(s) {
                        Ok(addr) => ups.push(addr),
                        Err(msg) => self.err(uat.child(i), msg),
                    },
                    other => self.err(
                        uat.child(i),
                        format!(
                            "a DNS upstream must be a string, but this is {}; write \"198.18.0.53:53\" or \"[2001:db8::53]:53\"",
                            other.kind()
                        ),
                    ),
                }
            }
            out.upstream = Some(ups);
        }
        if let Some((hat, v)) = f.get("hosts") {
            match v {
                Node::Null => {}
                Node::Map(entries) => {
                    let mut first_at: HashMap<String, usize> = HashMap::new();
                    for (i, (key, value)) in entries.iter().enumerate() {
                        let Node::Str(raw) = key else {
                            self.err(
                                hat.key_of(i),
                                format!("a `dns.hosts` name must be a string, but this is {}", key.kind()),
                            );
                            continue;
                        };
                        let name = match hostname::parse_pattern(raw) {
                            Ok(Pattern::Exact(n)) => Some(n),
                            Ok(Pattern::Wildcard(_)) => {
                                self.err(
                                    hat.key_of(i),
                                    format!("`dns.hosts` answers exact names only, not `{raw}`; list each name"),
                                );
                                None
                            }
                            Err(msg) => {
                                self.err(hat.key_of(i), msg);
                                None
                            }
                        };
                        let addrs = self.dns_addrs(&hat.child(i), value, raw);
                        let Some(name) = name else { continue };
                        if let Some(&first) = first_at.get(&name) {
                            self.problems.push(Problem {
                                at: hat.key_of(i),
                                message: format!(
                                    "`dns.hosts` lists `{name}` twice (first at {FIRST}); merge the addresses into one entry"
                                ),
                                first: Some(hat.key_of(first)),
                            });
                            continue;
                        }
                        first_at.insert(name.clone(), i);
                        out.hosts.insert(name, addrs);
                    }
                }
                other => self.err(
                    hat,
                    format!(
                        "`dns.hosts` must be a mapping of name to addresses, but it is {}; write `hosts: {{ \"origin.test\": [\"198.18.0.1\"] }}`",
                        other.kind()
                    ),
                ),
            }
        }
        out
    }

    fn dns_addrs(&mut self, at: &Loc, v: &Node, name: &str) -> Vec<IpAddr> {
        let what = format!("the addresses of `{name}` in `dns.hosts`");
        let items = self.list_of(at, v, &what, "`[\"198.18.0.1\", \"2001:db8::1\"]`");
        if items.is_empty() && matches!(v, Node::Seq(_)) {
            self.err(
                at.clone(),
                format!("{what} are empty; list at least one address or remove the name"),
            );
        }
        let mut addrs = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Node::Str(s) => match s.trim().parse::<IpAddr>() {
                    Ok(ip) => addrs.push(ip),
                    Err(_) => self.err(
                        at.child(i),
                        format!("`{s}` is not an IP address; write one like \"198.18.0.1\" or \"2001:db8::1\""),
                    ),
                },
                other => self.err(
                    at.child(i),
                    format!(
                        "an address in `dns.hosts` must be a string, but this is {}; write it like \"198.18.0.1\"",
                        other.kind()
                    ),
                ),
            }
        }
        addrs
    }
}

/// Parses a CIDR (or a bare address, meaning just that address).
pub(crate) fn parse_cidr(raw: &str) -> Result<IpNet, String> {
    let s = raw.trim();
    let net = match s.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => match s.parse::<IpAddr>() {
            Ok(ip) => IpNet::from(ip),
            Err(_) => {
                return Err(format!(
                    "`{raw}` is not a CIDR; write an address with a prefix length, like \"198.18.0.0/15\" or \"2001:db8::/32\""
                ))
            }
        },
    };
    if net.trunc() != net {
        let single = IpNet::from(net.addr());
        return Err(format!(
            "`{raw}` has host bits set; write the network as \"{}\" (or \"{single}\" for just that address)",
            net.trunc()
        ));
    }
    // Destinations like ::ffff:a.b.c.d are matched as IPv4, so store
    // IPv4-mapped networks as IPv4.
    if let IpNet::V6(v6) = net {
        if v6.prefix_len() >= 96 {
            if let Some(v4) = v6.addr().to_ipv4_mapped() {
                let v4net = Ipv4Net::new(v4, v6.prefix_len() - 96).expect("prefix fits");
                return Ok(IpNet::V4(v4net));
            }
        }
    }
    Ok(net)
}

/// Parses one `ports` entry: an integer or "A-B" (a lone "443" is accepted).
pub(crate) fn parse_port(v: &Node) -> Result<PortRange, String> {
    let one = |n: i128| -> Result<u16, String> {
        match u16::try_from(n) {
            Ok(p) if p >= 1 => Ok(p),
            _ => Err(format!("port {n} is out of range; ports are 1-65535")),
        }
    };
    match v {
        Node::Int(n) => one(*n).map(|p| PortRange { start: p, end: p }),
        Node::Str(s) => {
            let t = s.trim();
            let bad = || {
                format!("`{s}` is not a port or port range; write a number (443) or a range in quotes (\"8000-8100\")")
            };
            let (a, b) = match t.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (t, t),
            };
            let a: i128 = a.parse().map_err(|_| bad())?;
            let b: i128 = b.parse().map_err(|_| bad())?;
            let (a, b) = (one(a)?, one(b)?);
            if a > b {
                return Err(format!(
                    "port range `{s}` runs backwards; write the lower port first (\"{b}-{a}\")"
                ));
            }
            Ok(PortRange { start: a, end: b })
        }
        other => Err(format!(
            "a port must be a number or a range string, but this is {}; write 443 or \"8000-8100\"",
            other.kind()
        )),
    }
}

/// Parses a DNS upstream: "ip:port", "[v6]:port", or a bare address (port 53).
pub(crate) fn parse_upstream(raw: &str) -> Result<SocketAddr, String> {
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

/// Sorts and merges overlapping or adjacent ranges.
fn merge_ports(mut ports: Vec<PortRange>) -> Vec<PortRange> {
    ports.sort();
    let mut out: Vec<PortRange> = Vec::with_capacity(ports.len());
    for r in ports {
        match out.last_mut() {
            Some(last) if u32::from(r.start) <= u32::from(last.end) + 1 => {
                last.end = last.end.max(r.end);
            }
            _ => out.push(r),
        }
    }
    out
}

fn list(keys: &[&str]) -> String {
    keys.iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn short(v: &Node) -> String {
    match v {
        Node::Int(i) => i.to_string(),
        Node::Str(s) => format!("{s:?}"),
        other => other.kind(),
    }
}

/// The allowed key closest to a misspelled one, if it is close.
fn suggest(key: &str, allowed: &[&'static str]) -> Option<&'static str> {
    allowed
        .iter()
        .map(|k| (edit_distance(&key.to_ascii_lowercase(), k), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}
