//! Validation: turns the YAML tree into rules and settings, collecting every
//! violation (at the node it belongs to) instead of stopping at the first.
//! Messages say what is wrong and what to write instead. It never reads a
//! file or a secret's value: it sees the tree it is given.

mod dns;
mod http;
mod secrets;

use super::hostname::{self, Pattern};
use super::http::{HttpEntry, Inject, SecretRef};
use super::model::{DnsConfig, Limits, Mode, PortRange, Rule, Verdict};
use super::yaml::{self, list, Node, Pos, Problem, Value};
use ipnet::{IpNet, Ipv4Net};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// Everything a valid file says.
#[derive(Debug)]
pub(crate) struct Validated {
    pub(crate) name: String,
    pub(crate) mode: Mode,
    pub(crate) rules: Vec<Rule>,
    pub(crate) dns: DnsConfig,
    pub(crate) limits: Limits,
    pub(crate) secrets: Vec<SecretRef>,
}

const TOP_KEYS: &[&str] = &[
    "version", "name", "mode", "rules", "dns", "limits", "secrets",
];
const LIMIT_KEYS: &[&str] = &["request_head_seconds"];
/// The longest `limits.request_head_seconds` accepted (an hour).
const MAX_REQUEST_HEAD_SECONDS: i128 = 3600;
const RULE_KEYS: &[&str] = &[
    "name", "action", "cidrs", "hosts", "ports", "http", "inject",
];

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
    /// Names `secrets` declares, for checking the rules' templates.
    secret_names: HashSet<String>,
}

impl Checker {
    fn err(&mut self, at: Pos, message: impl Into<String>) {
        self.problems.push(Problem::new(at, message));
    }

    fn fields<'n>(
        &mut self,
        node: &Node,
        entries: &'n [(Node, Node)],
        allowed: &[&'static str],
        what: &str,
    ) -> yaml::Fields<'n> {
        yaml::fields(node.pos, entries, allowed, what, &mut self.problems)
    }

    fn policy(&mut self, root: &Node) -> Validated {
        let top = root.pos;
        let mut out = Validated {
            name: String::new(),
            mode: Mode::Enforce,
            rules: Vec::new(),
            dns: DnsConfig::default(),
            limits: Limits::default(),
            secrets: Vec::new(),
        };
        let entries = match &root.value {
            Value::Map(entries) => entries,
            Value::Null => {
                self.err(
                    top,
                    "the policy is empty; start it with `version: 1`, `name: ...` and `rules:`",
                );
                return out;
            }
            _ => {
                self.err(
                    top,
                    format!(
                        "the policy must be a mapping with the keys {}, but it is {}",
                        list(TOP_KEYS),
                        root.kind()
                    ),
                );
                return out;
            }
        };
        let f = self.fields(root, entries, TOP_KEYS, "the policy");

        match f.get("version") {
            None => self.err(top, "missing `version`; add `version: 1` at the top"),
            Some(Node {
                value: Value::Int(1),
                ..
            }) => {}
            Some(v) => self.err(
                v.pos,
                format!(
                    "unsupported policy version {}; this sluice understands `version: 1`",
                    short(v)
                ),
            ),
        }
        match f.get("name") {
            None => self.err(top, "missing `name`; add `name: <policy name>` at the top"),
            Some(v) => out.name = self.nonempty_string(v, "the policy `name`"),
        }
        if let Some(v) = f.get("mode") {
            match &v.value {
                Value::Str(s) if s == "enforce" => out.mode = Mode::Enforce,
                Value::Str(s) if s == "audit" => out.mode = Mode::Audit,
                _ => self.err(
                    v.pos,
                    format!(
                        "`mode` is {}; write `mode: enforce` (block) or `mode: audit` (only log would-deny)",
                        v.kind()
                    ),
                ),
            }
        }
        // Before the rules, wherever the file has it: templates refer to it.
        if let Some(v) = f.get("secrets") {
            out.secrets = self.secrets(v);
        }
        if let Some(v) = f.get("rules") {
            out.rules = self.rules(v);
        }
        if let Some(v) = f.get("dns") {
            out.dns = self.dns(v);
        }
        if let Some(v) = f.get("limits") {
            out.limits = self.limits(v);
        }
        out
    }

    /// `limits`: bounds on what one connection may hold.
    fn limits(&mut self, v: &Node) -> Limits {
        let mut out = Limits::default();
        let Some(f) = self.optional_mapping(v, LIMIT_KEYS, "`limits`") else {
            return out;
        };
        if let Some(n) = f.get("request_head_seconds") {
            if let Some(n) =
                self.bounded(n, "`limits.request_head_seconds`", MAX_REQUEST_HEAD_SECONDS)
            {
                out.request_head = std::time::Duration::from_secs(n as u64);
            }
        }
        out
    }

    fn nonempty_string(&mut self, v: &Node, what: &str) -> String {
        match &v.value {
            Value::Str(s) if !s.trim().is_empty() => s.clone(),
            Value::Str(_) => {
                self.err(v.pos, format!("{what} is empty; give it a short name"));
                String::new()
            }
            _ => {
                self.err(
                    v.pos,
                    format!("{what} must be a string, but it is {}", v.kind()),
                );
                String::new()
            }
        }
    }

    /// The items of a list-valued key, or a violation if it is not a list.
    fn list_of<'n>(&mut self, v: &'n Node, what: &str, example: &str) -> &'n [Node] {
        v.seq(what, example).unwrap_or_else(|p| {
            self.problems.push(p);
            &[]
        })
    }

    fn rules(&mut self, v: &Node) -> Vec<Rule> {
        if v.value == Value::Null {
            return Vec::new();
        }
        let items = self.list_of(
            v,
            "`rules`",
            "`rules: [{name: web, action: allow, cidrs: [\"198.18.0.1/32\"]}]`",
        );
        let mut rules = Vec::with_capacity(items.len());
        let mut names: HashMap<String, Pos> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let Some((rule, name_at)) = self.rule(item, i) else {
                continue;
            };
            if let Some(name_at) = name_at {
                if let Some(first) = names.get(&*rule.name) {
                    self.err(
                        name_at,
                        format!(
                            "duplicate rule name `{}` (first used at line {}); give every rule its own name, audit and metrics report it",
                            rule.name, first.line
                        ),
                    );
                    continue;
                }
                names.insert(rule.name.to_string(), name_at);
            }
            rules.push(rule);
        }
        rules
    }

    /// Returns the rule and where its name is, or None if it has no usable name.
    fn rule(&mut self, v: &Node, index: usize) -> Option<(Rule, Option<Pos>)> {
        let Value::Map(entries) = &v.value else {
            self.err(
                v.pos,
                format!(
                    "rule #{} must be a mapping with the keys {}, but it is {}",
                    index + 1,
                    list(RULE_KEYS),
                    v.kind()
                ),
            );
            return None;
        };
        let label = rule_label(entries, index);
        let f = self.fields(v, entries, RULE_KEYS, &label);
        let before = self.problems.len();

        let (name, name_at) = self.rule_name(v, f.get("name"), &label);
        let action = self.rule_action(v, f.get("action"), &label);
        let (cidrs, cidrs_given) = match f.get("cidrs") {
            Some(c) => self.rule_cidrs(c, &label),
            None => (Vec::new(), 0),
        };
        let (hosts, hosts_given) = match f.get("hosts") {
            Some(h) => self.rule_hosts(h, &label),
            None => (Vec::new(), 0),
        };
        let ports = match f.get("ports") {
            Some(p) => self.rule_ports(p, &label),
            None => Vec::new(),
        };
        let (http, inject) = self.rule_requests(&f, &cidrs, &hosts, &label);
        if cidrs_given + hosts_given == 0 {
            self.err(
                v.pos,
                format!(
                    "{label} has neither `cidrs` nor `hosts`, so it matches nothing; add `cidrs: [...]` or `hosts: [...]` (to match everything: cidrs: [\"0.0.0.0/0\", \"::/0\"])"
                ),
            );
        }
        if self.problems.len() != before {
            // Keep checking the name for duplicates even if the rule is bad.
            let rule = Rule {
                name: name.into(),
                action,
                cidrs,
                hosts,
                ports: Vec::new(),
                http: Vec::new(),
                inject: Vec::new(),
            };
            return (!rule.name.is_empty()).then_some((rule, name_at));
        }
        Some((
            Rule {
                name: name.into(),
                action,
                cidrs,
                hosts,
                ports: merge_ports(ports),
                http,
                inject,
            },
            name_at,
        ))
    }

    /// A rule's `name` (empty if missing or bad) and where it is.
    fn rule_name(&mut self, v: &Node, n: Option<&Node>, label: &str) -> (String, Option<Pos>) {
        match n {
            None => {
                self.err(
                    v.pos,
                    format!("{label} has no `name`; add `name: <unique name>`"),
                );
                (String::new(), None)
            }
            Some(n) => (
                self.nonempty_string(n, &format!("{label}'s `name`")),
                Some(n.pos),
            ),
        }
    }

    /// A rule's `action`; deny if missing or bad, so that nothing slips through.
    fn rule_action(&mut self, v: &Node, a: Option<&Node>, label: &str) -> Verdict {
        let Some(a) = a else {
            self.err(
                v.pos,
                format!("{label} has no `action`; add `action: allow` or `action: deny`"),
            );
            return Verdict::Deny;
        };
        match &a.value {
            Value::Str(s) if s == "allow" => Verdict::Allow,
            Value::Str(s) if s == "deny" => Verdict::Deny,
            _ => {
                self.err(
                    a.pos,
                    format!(
                        "{label}'s `action` is {}; write `action: allow` or `action: deny`",
                        a.kind()
                    ),
                );
                Verdict::Deny
            }
        }
    }

    /// A rule's `cidrs` without repeats, and how many items the list had.
    fn rule_cidrs(&mut self, c: &Node, label: &str) -> (Vec<IpNet>, usize) {
        let items = self.list_of(
            c,
            &format!("{label}'s `cidrs`"),
            "`cidrs: [\"198.18.0.0/15\"]`",
        );
        let mut cidrs = Vec::new();
        for item in items {
            match &item.value {
                Value::Str(s) => match parse_cidr(s) {
                    Ok(net) => {
                        if !cidrs.contains(&net) {
                            cidrs.push(net);
                        }
                    }
                    Err(msg) => self.err(item.pos, msg),
                },
                _ => self.err(
                    item.pos,
                    format!(
                        "a CIDR must be a string, but this is {}; write it in quotes like \"198.18.0.0/15\"",
                        item.kind()
                    ),
                ),
            }
        }
        (cidrs, items.len())
    }

    /// A rule's `hosts` in canonical form without repeats, and how many
    /// items the list had.
    fn rule_hosts(&mut self, h: &Node, label: &str) -> (Vec<String>, usize) {
        let items = self.list_of(
            h,
            &format!("{label}'s `hosts`"),
            "`hosts: [\"example.com\", \"*.example.com\"]`",
        );
        let mut hosts = Vec::new();
        for item in items {
            match &item.value {
                Value::Str(s) => match hostname::parse_pattern(s) {
                    Ok(p) => {
                        let text = match p {
                            Pattern::Exact(n) => n,
                            Pattern::Wildcard(suffix) => format!("*.{suffix}"),
                        };
                        if !hosts.contains(&text) {
                            hosts.push(text);
                        }
                    }
                    Err(msg) => self.err(item.pos, msg),
                },
                _ => self.err(
                    item.pos,
                    format!(
                        "a hostname must be a string, but this is {}; write it like \"example.com\"",
                        item.kind()
                    ),
                ),
            }
        }
        (hosts, items.len())
    }

    /// A rule's `ports`, not yet merged.
    fn rule_ports(&mut self, p: &Node, label: &str) -> Vec<PortRange> {
        let items = self.list_of(
            p,
            &format!("{label}'s `ports`"),
            "`ports: [443, \"8000-8100\"]`",
        );
        if items.is_empty() {
            self.err(
                p.pos,
                format!("{label} has an empty `ports` list, which would match no port; list ports, or remove `ports` to match any port"),
            );
        }
        let mut ports = Vec::new();
        for item in items {
            match parse_port(item) {
                Ok(r) => ports.push(r),
                Err(msg) => self.err(item.pos, msg),
            }
        }
        ports
    }

    /// A rule's `http` and `inject` blocks, each checked only if the rule
    /// may have it.
    fn rule_requests(
        &mut self,
        f: &yaml::Fields,
        cidrs: &[IpNet],
        hosts: &[String],
        label: &str,
    ) -> (Vec<HttpEntry>, Vec<Inject>) {
        let mut http = Vec::new();
        let mut inject = Vec::new();
        for key in ["http", "inject"] {
            let Some(block) = f.get(key) else { continue };
            if let Some(why) = why_not_terminated(f, cidrs, hosts) {
                self.err(block.pos, format!("{label} cannot have `{key}`: {why}"));
                continue;
            }
            if key == "http" {
                http = self.http(block, label);
            } else {
                inject = self.inject(block, label);
            }
        }
        (http, inject)
    }
}

/// How messages name a rule: by its name if it has a usable one, else by
/// its place in the list.
fn rule_label(entries: &[(Node, Node)], index: usize) -> String {
    match entries
        .iter()
        .find(|(k, _)| matches!(&k.value, Value::Str(s) if s == "name"))
        .map(|(_, v)| &v.value)
    {
        Some(Value::Str(s)) if !s.trim().is_empty() => format!("rule `{s}`"),
        _ => format!("rule #{}", index + 1),
    }
}

/// Why a rule's connections cannot be terminated (so it may have no `http`
/// or `inject`), or None if they can.
fn why_not_terminated(f: &yaml::Fields, cidrs: &[IpNet], hosts: &[String]) -> Option<&'static str> {
    // sluice terminates TLS for these connections and verifies the
    // origin for the name: it needs one, from `hosts`, and an
    // address rule would admit connections without one.
    let denies = f
        .get("action")
        .is_some_and(|a| matches!(&a.value, Value::Str(s) if s == "deny"));
    if denies {
        Some("a deny rule refuses the whole connection, so no request is left to decide; make it `action: allow` or remove the block")
    } else if !cidrs.is_empty() || f.get("cidrs").is_some() {
        Some("it has `cidrs` (sluice needs a name from `hosts` to verify the origin's certificate for); move the addresses to a rule of their own")
    } else if hosts.is_empty() && f.get("hosts").is_none() {
        Some("it has no `hosts` (sluice needs a name to verify the origin's certificate for); add `hosts: [...]`")
    } else {
        None
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
    match &v.value {
        Value::Int(n) => one(*n).map(|p| PortRange { start: p, end: p }),
        Value::Str(s) => {
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
        _ => Err(format!(
            "a port must be a number or a range string, but this is {}; write 443 or \"8000-8100\"",
            v.kind()
        )),
    }
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

fn short(v: &Node) -> String {
    match &v.value {
        Value::Int(i) => i.to_string(),
        Value::Str(s) => format!("{s:?}"),
        _ => v.kind(),
    }
}
