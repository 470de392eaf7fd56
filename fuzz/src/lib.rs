//! The fuzz harnesses: one function per parser of untrusted bytes, each
//! feeding the input through sluice's public API and checking what any
//! answer must satisfy. A broken invariant panics, which AFL++ reports as a
//! crash and a test reports as a failure. The AFL++ targets in src/bin call
//! these functions, and sluice's own test suite compiles this file too
//! (tests/fuzz_corpus.rs replays every committed corpus file through it,
//! tests/fuzz_properties.rs feeds it generated inputs), so a regression
//! input added to fuzz/corpus/ is checked by `cargo test` without AFL.
//!
//! The harnesses never write outside a temporary directory of their own
//! and never touch the network; they may use only crates sluice depends on.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::OnceLock;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{Name, RData};
use sha2::{Digest, Sha256};

use sluice::bundle::{Bundle, BundleError, BundleFiles, Manifest, TrustStore};
use sluice::dns::message::{self as dns_message, Action};
use sluice::policy::{AnyResolution, Mode, Policy, PolicyError, Reason, Verdict};
use sluice::proxy::peek::{inspect, skip_blank_lines, Peeked};

/// A harness: panics if an invariant does not hold for the input.
pub type Harness = fn(&[u8]);

/// Every target by name, as scripts/fuzz and the corpus replay know them
/// (the corpus of target `t` is `fuzz/corpus/t/`).
pub const TARGETS: &[(&str, Harness)] = &[
    ("peek", peek),
    ("dns", dns),
    ("dns_upstream", dns_upstream),
    ("policy", policy),
    ("manifest", manifest),
    ("bundle", bundle),
];

// --------------------------------------------------------------- peek ----

/// `proxy::peek::inspect` on the first bytes of a connection: a hostname it
/// reports is borrowed from the input and is a valid name; the verdict does
/// not depend on how the bytes were split into reads (a prefix that is
/// already decided is decided the same way as the whole, and a whole that
/// needs more was never decided earlier).
pub fn peek(data: &[u8]) {
    let whole = inspect(data);
    match whole {
        Peeked::Tls { sni } => {
            assert_eq!(data.first(), Some(&22), "TLS without a handshake record");
            if let Some(name) = sni {
                assert_borrowed(data, name);
                assert_hostname(name);
            }
        }
        Peeked::Http { host } => {
            let request = skip_blank_lines(data);
            assert!(
                request.first().is_some_and(u8::is_ascii_uppercase),
                "HTTP without a method"
            );
            if let Some(host) = host {
                assert_borrowed(data, host);
                if host.contains(':') {
                    // An IPv6 literal, brackets stripped.
                    assert!(
                        host.bytes()
                            .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.'),
                        "odd IPv6 literal {host:?}"
                    );
                } else {
                    assert_hostname(host);
                }
            }
        }
        Peeked::Unreadable { http } => {
            let request = skip_blank_lines(data);
            assert_eq!(
                request.first().is_some_and(u8::is_ascii_uppercase),
                http,
                "unreadable, but neither a request nor a ClientHello"
            );
            if !http {
                assert_eq!(data.first(), Some(&22), "TLS without a handshake record");
            }
        }
        Peeked::NeedMore | Peeked::Other => {}
    }
    // A few cut points (all of them would make each run quadratic).
    let n = data.len();
    let salt = data
        .iter()
        .fold(0usize, |h, &b| h.wrapping_mul(31) ^ usize::from(b));
    for cut in [1, 5, 9, n / 2, n.saturating_sub(1), salt % (n + 1)] {
        if cut == 0 || cut >= n {
            continue;
        }
        let early = inspect(&data[..cut]);
        if whole == Peeked::NeedMore {
            assert_eq!(
                early,
                Peeked::NeedMore,
                "decided at {cut} bytes, undecided at {n}"
            );
        } else if early != Peeked::NeedMore {
            assert_eq!(early, whole, "decided differently at {cut} and {n} bytes");
        }
    }
}

/// `part` points into `data` (the peek never copies or invents a name).
fn assert_borrowed(data: &[u8], part: &str) {
    let range = data.as_ptr_range();
    let p = part.as_ptr();
    assert!(
        range.start <= p && p.wrapping_add(part.len()) <= range.end,
        "{part:?} is not a slice of the input"
    );
}

/// Letters, digits, `-` and `.`, labels of 1..=63, at most 253 bytes.
fn assert_hostname(name: &str) {
    assert!(!name.is_empty() && name.len() <= 253, "bad length {name:?}");
    assert!(!name.ends_with('.'), "trailing dot {name:?}");
    for label in name.split('.') {
        assert!(
            !label.is_empty() && label.len() <= 63,
            "bad label in {name:?}"
        );
        assert!(
            label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-'),
            "bad byte in {name:?}"
        );
    }
}

// ---------------------------------------------------------------- dns ----

/// The policy the DNS harness decides against: hosts rules (one wildcard),
/// a cidrs rule, static answers of both families, many addresses for one
/// name, and a deny rule over a name.
const DNS_POLICY: &str = r#"
version: 1
name: fuzz-dns
mode: enforce
rules:
  - name: origin
    action: allow
    cidrs: ["198.18.0.1/32"]
  - name: packages
    action: allow
    hosts: ["pypi.org", "*.pythonhosted.org", "v6.test", "many.test"]
    ports: [443]
  - name: no-evil
    action: deny
    hosts: ["evil.pythonhosted.org"]
dns:
  upstream: ["198.18.0.53:53"]
  hosts:
    origin.test: ["198.18.0.1", "2001:db8::1"]
    v6.test: ["2001:db8::2"]
    many.test: ["198.18.1.1", "198.18.1.2", "198.18.1.3", "198.18.1.4",
                "198.18.1.5", "198.18.1.6", "198.18.1.7", "198.18.1.8",
                "198.18.1.9", "198.18.1.10", "198.18.1.11", "198.18.1.12",
                "198.18.1.13", "198.18.1.14", "198.18.1.15", "198.18.1.16",
                "198.18.1.17", "198.18.1.18", "198.18.1.19", "198.18.1.20",
                "198.18.1.21", "198.18.1.22", "198.18.1.23", "198.18.1.24",
                "198.18.1.25", "198.18.1.26", "198.18.1.27", "198.18.1.28",
                "198.18.1.29", "198.18.1.30", "198.18.1.31", "198.18.1.32",
                "198.18.1.33", "198.18.1.34", "198.18.1.35", "198.18.1.36",
                "198.18.1.37", "198.18.1.38", "198.18.1.39", "198.18.1.40"]
"#;

/// The same policy in each mode, compiled once per process.
fn dns_policies() -> &'static [Policy; 2] {
    static POLICIES: OnceLock<[Policy; 2]> = OnceLock::new();
    POLICIES.get_or_init(|| {
        let audit = DNS_POLICY.replace("mode: enforce", "mode: audit");
        [
            Policy::from_yaml(DNS_POLICY, "fuzz-dns.yaml").expect("the DNS policy loads"),
            Policy::from_yaml(&audit, "fuzz-dns.yaml").expect("the DNS policy loads"),
        ]
    })
}

/// What the responder does with a query's bytes (`dns::message::plan`),
/// in enforce and audit mode: a reply it builds parses, answers the query
/// (same id, a response, the question echoed unless FORMERR), refuses in
/// enforce mode every name the policy cannot admit, carries only addresses
/// `dns.hosts` gives that name, fits UDP after `fit_udp`, and is accepted as
/// the answer to its own query by the upstream-answer check.
pub fn dns(data: &[u8]) {
    let default_upstream: [SocketAddr; 1] = [SocketAddr::from(([198, 18, 0, 53], 53))];
    for policy in dns_policies() {
        let plan = dns_message::plan(data, policy, &default_upstream);
        let query = Message::from_vec(data).ok();
        if let Some(asked) = &plan.asked {
            let query = query
                .as_ref()
                .expect("a question was read from a parsed query");
            assert_eq!(query.queries.len(), 1);
            if asked.admitted {
                let plain = dns_message::plain_name(query.queries[0].name());
                let name = plain.expect("an admitted name is plain");
                assert_eq!(asked.host, name);
                assert!(
                    policy.dns().hosts.contains_key(&name) || policy.admits_name(&name),
                    "{name} admitted without a rule"
                );
            }
            if let Some((name, ips)) = &asked.remember {
                let listed = &policy.dns().hosts[name];
                assert!(ips.iter().all(|ip| listed.contains(ip)));
            }
        }
        match &plan.action {
            Action::Drop => {
                // Only what is no query, or cannot be answered at all.
                if let Some(q) = &query {
                    let answerable = dns_message::reply(q, ResponseCode::ServFail, Vec::new());
                    assert!(
                        q.metadata.message_type != MessageType::Query || answerable.is_none(),
                        "a query dropped"
                    );
                }
            }
            Action::Reply(bytes) => {
                let query = query.as_ref().expect("a reply to an unparsable query");
                check_reply(data, query, bytes, policy, plan.asked.as_ref());
            }
            Action::Forward { parsed, upstreams } => {
                let asked = plan.asked.as_ref().expect("forwarded without a question");
                assert!(asked.admitted || policy.mode() == Mode::Audit);
                assert!(asked.limit.is_none() || policy.mode() == Mode::Audit);
                assert_eq!(parsed.queries.len(), 1);
                assert!(!upstreams.is_empty());
                check_rebuilt(parsed);
            }
        }
    }
}

/// What goes upstream for an admitted query is its one question and at
/// most sluice's own EDNS, one whole message with nothing after it.
fn check_rebuilt(parsed: &Message) {
    let bytes = dns_message::upstream_query(parsed, 0x5a5a).expect("an admitted query rebuilds");
    let sent = Message::from_vec(&bytes).expect("the rebuilt query parses");
    assert_eq!(sent.metadata.id, 0x5a5a);
    assert_eq!(sent.metadata.message_type, MessageType::Query);
    assert_eq!(sent.queries, parsed.queries);
    assert!(sent.answers.is_empty() && sent.authorities.is_empty());
    assert!(sent.additionals.is_empty() && sent.signature.is_none());
    assert_eq!(sent.edns.is_some(), parsed.edns.is_some());
    if let Some(edns) = &sent.edns {
        assert!(
            edns.options().options.is_empty(),
            "a client EDNS option forwarded"
        );
    }
    assert_eq!(sent.to_vec().expect("re-encodes").len(), bytes.len());
}

fn check_reply(
    data: &[u8],
    query: &Message,
    bytes: &[u8],
    policy: &Policy,
    asked: Option<&dns_message::Asked>,
) {
    let reply = Message::from_vec(bytes).expect("sluice's reply parses");
    let meta = &reply.metadata;
    assert_eq!(meta.id, query.metadata.id);
    assert_eq!(meta.message_type, MessageType::Response);
    assert!(bytes.len() <= usize::from(u16::MAX), "over a TCP frame");
    if meta.response_code != ResponseCode::FormErr && query.queries.len() == 1 {
        assert_eq!(reply.queries, query.queries, "question not echoed");
    } else {
        assert!(reply.queries.is_empty(), "several questions echoed");
    }
    if let Some(asked) = asked {
        if !asked.admitted && policy.mode() == Mode::Enforce {
            assert_eq!(meta.response_code, ResponseCode::Refused, "{}", asked.host);
            assert!(reply.answers.is_empty());
        }
    }
    // Every address answered is one `dns.hosts` gives the asked name.
    for record in &reply.answers {
        let ip = match &record.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            other => panic!("sluice answered {other:?}"),
        };
        let name = dns_message::plain_name(&record.name).expect("answers name a plain name");
        assert!(policy.dns().hosts[&name].contains(&ip));
    }
    match dns_message::fit_udp(data, bytes.to_vec()) {
        Some(udp) => {
            assert!(
                udp.len() <= dns_message::udp_limit(data),
                "UDP answer too large"
            );
            let fitted = Message::from_vec(&udp).expect("a fitted answer parses");
            assert_eq!(fitted.metadata.id, query.metadata.id);
            if udp.len() < bytes.len() {
                assert!(fitted.metadata.truncation, "shortened without TC");
            }
        }
        None => panic!("a reply sluice built cannot be sent over UDP"),
    }
    // A reply to the query is accepted as the answer to it, and teaches
    // only what `dns.hosts` says.
    if meta.response_code == ResponseCode::NoError && !query.queries.is_empty() {
        let answer = dns_message::upstream_answer(bytes, query, query.metadata.id)
            .expect("its own reply answers the query");
        check_learned(query.queries[0].name(), &answer);
    }
}

/// The upstream side: `data` as an upstream's answer to the question it
/// carries itself and to a fixed one. An accepted answer is a response
/// with the expected id and question; what is learned from it is only the
/// addresses its records give, at most one entry per chain link, named
/// plainly; `fit_udp` never lets it exceed what a client accepts.
pub fn dns_upstream(data: &[u8]) {
    let Ok(message) = Message::from_vec(data) else {
        assert!(dns_message::upstream_answer(data, &fixed_query(), 0).is_none());
        return;
    };
    let id = message.metadata.id;
    let mut asked_for = vec![fixed_query()];
    if let Some(q) = message.queries.first() {
        let mut own = Message::new(0, MessageType::Query, hickory_proto::op::OpCode::Query);
        own.add_query(q.clone());
        asked_for.push(own);
    }
    for asked in &asked_for {
        if let Some(answer) = dns_message::upstream_answer(data, asked, id) {
            assert_eq!(answer.metadata.message_type, MessageType::Response);
            check_learned(asked.queries[0].name(), &answer);
            check_remembered(asked.queries[0].name(), &answer);
        }
        assert!(dns_message::upstream_answer(data, asked, id.wrapping_add(1)).is_none());
        if let Ok(query) = asked.to_vec() {
            if let Some(udp) = dns_message::fit_udp(&query, data.to_vec()) {
                assert!(
                    udp.len() <= dns_message::udp_limit(&query),
                    "UDP answer too large"
                );
            }
        }
    }
}

fn fixed_query() -> Message {
    let mut q = Message::new(0, MessageType::Query, hickory_proto::op::OpCode::Query);
    let name = Name::from_ascii("pypi.org.").expect("a valid name");
    q.add_query(hickory_proto::op::Query::query(
        name,
        hickory_proto::rr::RecordType::A,
    ));
    q
}

/// No answer adds an address to a name `dns.hosts` pins, and a CNAME
/// target is remembered only if the policy could admit it.
fn check_remembered(asked: &Name, answer: &Message) {
    let policy = &dns_policies()[0];
    for entry in dns_message::remembered(asked, answer, policy) {
        assert!(!policy.pins(&entry.name), "{} is pinned", entry.name);
        assert!(
            !entry.alias || policy.admits_name(&entry.name),
            "{}",
            entry.name
        );
    }
}

fn check_learned(asked: &Name, answer: &Message) {
    let learned = dns_message::learned_addresses(asked, answer);
    assert!(learned.len() <= dns_message::MAX_CHAIN + 1);
    let given: Vec<(Name, IpAddr)> = answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some((r.name.clone(), IpAddr::V4(a.0))),
            RData::AAAA(a) => Some((r.name.clone(), IpAddr::V6(a.0))),
            _ => None,
        })
        .collect();
    for (i, entry) in learned.iter().enumerate() {
        assert!(!entry.ips.is_empty());
        assert_eq!(entry.name, entry.name.to_ascii_lowercase());
        if entry.alias {
            // Each of its addresses is given to that very name.
            for ip in &entry.ips {
                assert!(
                    given.iter().any(|(n, g)| g == ip
                        && dns_message::plain_name(n).as_ref() == Some(&entry.name)),
                    "{ip} is not an address of {}",
                    entry.name
                );
            }
        } else {
            assert_eq!(i, learned.len() - 1, "the asked name comes last");
            assert_eq!(Some(&entry.name), dns_message::plain_name(asked).as_ref());
            for ip in &entry.ips {
                assert!(given.iter().any(|(_, g)| g == ip), "{ip} is in no record");
            }
        }
    }
}

// ------------------------------------------------------------- policy ----

/// `Policy::from_yaml` on any text: a policy that loads re-serializes to
/// text that loads as the same policy, and decides every destination its
/// own rules name consistently; a refusal lists at least one violation,
/// each at a position inside the text.
pub fn policy(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match Policy::from_yaml(&text, "fuzz.yaml") {
        Ok(policy) => check_policy(&policy),
        Err(err) => check_violations(&text, &err),
    }
}

fn check_policy(policy: &Policy) {
    let again = to_yaml(policy);
    let back = Policy::from_yaml(&again, "again.yaml")
        .unwrap_or_else(|e| panic!("re-serialized policy refused: {e}\n{again}"));
    assert_eq!(back.name(), policy.name());
    assert_eq!(back.mode(), policy.mode());
    assert_eq!(back.rules(), policy.rules(), "{again}");
    assert_eq!(back.dns(), policy.dns(), "{again}");

    for rule in policy.rules().iter().take(16) {
        let ports = rule
            .ports
            .iter()
            .flat_map(|r| [r.start, r.end])
            .chain(rule.ports.is_empty().then_some(443));
        for port in ports.take(8) {
            for net in rule.cidrs.iter().take(4) {
                check_decision(policy, SocketAddr::new(net.network(), port), None);
            }
            for host in rule.hosts.iter().take(4) {
                let name = host
                    .strip_prefix("*.")
                    .map_or(host.clone(), |h| format!("a.{h}"));
                let _ = policy.admits_name(&name);
                for ip in ["198.18.0.1", "10.0.0.1", "2001:db8::1"] {
                    let ip: IpAddr = ip.parse().expect("an address");
                    check_decision(policy, SocketAddr::new(ip, port), Some(&name));
                }
            }
        }
    }
}

fn check_decision(policy: &Policy, dst: SocketAddr, host: Option<&str>) {
    let d = policy.decide(dst, host, &AnyResolution);
    assert_eq!(d.verdict == Verdict::Allow, d.reason == Reason::AllowRule);
    assert_eq!(d.rule.is_none(), d.reason == Reason::NoRule);
    if let Some(name) = d.rule {
        let rule = policy
            .rules()
            .iter()
            .find(|r| r.name == *name)
            .expect("the decision names a rule of the policy");
        assert!(rule.covers_port(dst.port()), "{name} does not cover {dst}");
        match d.reason {
            Reason::DenyRule => assert_eq!(rule.action, Verdict::Deny),
            Reason::AllowRule
            | Reason::PrivateAddress
            | Reason::HostAddressMismatch
            | Reason::LoopbackAddress => {
                assert_eq!(rule.action, Verdict::Allow)
            }
            other => panic!("policy decided {other:?}"),
        }
    }
}

/// The policy as YAML (JSON flow style, which YAML reads as it is).
fn to_yaml(policy: &Policy) -> String {
    use serde_json::{json, Map, Value};
    let rules: Vec<Value> = policy
        .rules()
        .iter()
        .map(|r| {
            let mut rule = Map::new();
            rule.insert("name".into(), json!(&*r.name));
            rule.insert("action".into(), json!(r.action.as_str()));
            if !r.cidrs.is_empty() {
                let cidrs: Vec<String> = r.cidrs.iter().map(|c| c.to_string()).collect();
                rule.insert("cidrs".into(), json!(cidrs));
            }
            if !r.hosts.is_empty() {
                rule.insert("hosts".into(), json!(r.hosts));
            }
            if !r.ports.is_empty() {
                let ports: Vec<Value> = r
                    .ports
                    .iter()
                    .map(|p| match p.start == p.end {
                        true => json!(p.start),
                        false => json!(p.to_string()),
                    })
                    .collect();
                rule.insert("ports".into(), json!(ports));
            }
            Value::Object(rule)
        })
        .collect();
    let mut doc = Map::new();
    doc.insert("version".into(), json!(1));
    doc.insert("name".into(), json!(policy.name()));
    doc.insert("mode".into(), json!(policy.mode().as_str()));
    doc.insert("rules".into(), json!(rules));
    let dns = policy.dns();
    let mut dns_map = Map::new();
    if let Some(upstream) = &dns.upstream {
        let list: Vec<String> = upstream.iter().map(|a| a.to_string()).collect();
        dns_map.insert("upstream".into(), json!(list));
    }
    if !dns.hosts.is_empty() {
        let hosts: Map<String, Value> = dns
            .hosts
            .iter()
            .map(|(name, ips)| {
                let ips: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
                (name.clone(), json!(ips))
            })
            .collect();
        dns_map.insert("hosts".into(), Value::Object(hosts));
    }
    if !dns_map.is_empty() {
        doc.insert("dns".into(), Value::Object(dns_map));
    }
    ascii_escaped(&Value::Object(doc).to_string())
}

/// JSON text with every character outside printable ASCII escaped, in the
/// escapes JSON and YAML share (`\uXXXX`, and YAML's `\UXXXXXXXX` beyond
/// the BMP): YAML reads some raw characters JSON leaves alone (NEL, LS,
/// PS, DEL) as line breaks or refuses them. Outside strings JSON text is
/// ASCII, so every such character is inside a string.
fn ascii_escaped(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match u32::from(c) {
            0x20..=0x7e => out.push(c),
            n @ 0..=0xffff => out.push_str(&format!("\\u{n:04x}")),
            n => out.push_str(&format!("\\U{n:08x}")),
        }
    }
    out
}

fn check_violations(text: &str, err: &PolicyError) {
    let violations = err.violations();
    assert!(!violations.is_empty(), "refused without a violation: {err}");
    assert!(violations.len() <= 101, "{} violations", violations.len());
    let last = last_line(text);
    for v in violations {
        assert!(!v.message.is_empty());
        assert!(v.line >= 1 && v.column >= 1, "position 0 in {v}");
        assert!(v.line <= last, "{v} is past the last line {last}");
    }
    let _ = err.to_string();
}

/// A bound on the number a YAML position may give the last line: YAML
/// breaks lines at LF, CR and CRLF (and YAML 1.1 also at NEL, LS and PS),
/// and a position may point just past the end.
fn last_line(text: &str) -> usize {
    let breaks = text
        .chars()
        .filter(|c| matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}'))
        .count();
    breaks + 2
}

// ----------------------------------------------------------- manifest ----

/// `Manifest::parse` on any text: a manifest that parses serializes to the
/// bytes that parse back to it (what gets signed is what gets read); a
/// refusal points inside the text.
pub fn manifest(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match Manifest::parse(&text) {
        Ok(m) => {
            let yaml = m.to_yaml();
            let back = Manifest::parse(&yaml)
                .unwrap_or_else(|e| panic!("re-serialized manifest refused: {e:?}\n{yaml}"));
            assert_eq!(back, m, "{yaml}");
            assert_eq!(back.to_yaml(), yaml, "serialization is not stable");
            assert!(m.label().ends_with(&format!("@{}", m.revision)));
            for (name, digest) in &m.files.0 {
                assert!(!name.is_empty() && !name.contains('/') && name != "..");
                assert!(
                    digest.len() == 64 && hex::decode(digest).is_ok(),
                    "{digest}"
                );
            }
        }
        Err((line, col, msg)) => {
            assert!(!msg.is_empty());
            assert!(line >= 1 && col >= 1, "position 0: {msg}");
            assert!(line <= last_line(&text), "{line} is past the end: {msg}");
        }
    }
}

// ------------------------------------------------------------- bundle ----

/// The time the bundle harness verifies at (inside the corpus bundles'
/// validity).
const BUNDLE_NOW: i64 = 1_893_456_000; // 2030-01-01T00:00:00Z

fn bundle_trust() -> &'static TrustStore {
    static TRUST: OnceLock<TrustStore> = OnceLock::new();
    TRUST.get_or_init(|| {
        let text = include_str!("../../bundles/dev-trust.yaml");
        TrustStore::from_yaml(text, Path::new("dev-trust.yaml")).expect("the dev trust file loads")
    })
}

/// The whole verify path of a bundle: `data` is a .tar.gz (gzip magic) or
/// a plain tar the harness compresses first (so mutations reach the tar
/// reader rather than dying at the gzip CRC). An archive that unpacks holds
/// only plain names within the caps and round-trips; a bundle that
/// verifies was signed by the trusted key over its exact manifest bytes,
/// with every digest right; and the directory form of the same files
/// verifies the same way.
pub fn bundle(data: &[u8]) {
    let gz;
    let bytes = if data.starts_with(&[0x1f, 0x8b]) {
        data
    } else {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(data).expect("writing to memory");
        gz = enc.finish().expect("writing to memory");
        &gz[..]
    };
    let shown = Path::new("fuzz.tar.gz");
    let now = time::OffsetDateTime::from_unix_timestamp(BUNDLE_NOW).expect("a valid time");
    let unpacked = BundleFiles::from_tar_gz(bytes, shown);
    let verified = Bundle::from_tar_gz(bytes, shown, bundle_trust(), now);
    let files = match unpacked {
        Ok(files) => files,
        Err(err) => {
            let again = verified.expect_err("verified what does not unpack");
            assert_eq!(again.code(), err.code());
            let _ = err.to_string();
            return;
        }
    };
    assert!(files.files.len() <= sluice::bundle::MAX_ENTRIES);
    for (name, data) in &files.files {
        assert!(!name.is_empty() && !name.contains('/') && name != "." && name != "..");
        assert!(data.len() as u64 <= sluice::bundle::MAX_FILE_BYTES);
    }
    let round = BundleFiles::from_tar_gz(&files.to_tar_gz(0), shown).expect("round trip");
    assert_eq!(round.files, files.files);

    if let Ok(v) = &verified {
        check_signed(&files, v);
    }
    let as_dir = verify_as_directory(&files, now);
    if let Some(dir) = as_dir {
        assert_eq!(
            dir.as_ref().map(|v| v.digest).map_err(|e| e.code()),
            verified.as_ref().map(|v| v.digest).map_err(|e| e.code()),
            "directory and archive disagree"
        );
    }
}

/// What the trusted key and the digests say, checked without sluice.
fn check_signed(files: &BundleFiles, v: &sluice::bundle::VerifiedBundle) {
    let manifest = &files.files[sluice::bundle::MANIFEST];
    let sig_text = std::str::from_utf8(&files.files[sluice::bundle::SIGNATURE]).expect("hex");
    let sig = hex::decode(sig_text.trim()).expect("hex");
    let key = bundle_trust()
        .key(&v.manifest.key_id)
        .expect("a trusted key");
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
        .verify(manifest, &sig)
        .expect("a verified bundle is signed by the trusted key");
    assert_eq!(v.digest, <[u8; 32]>::from(Sha256::digest(manifest)));
    for (name, want) in &v.manifest.files.0 {
        let got = hex::encode(Sha256::digest(&files.files[name]));
        assert!(got.eq_ignore_ascii_case(want), "{name} digest");
    }
    assert!(v.manifest.expires.0.unix_timestamp() > BUNDLE_NOW);
}

/// The same files verified as a directory; `None` where the two forms
/// legitimately differ (the directory reader skips dot files).
fn verify_as_directory(
    files: &BundleFiles,
    now: time::OffsetDateTime,
) -> Option<Result<sluice::bundle::VerifiedBundle, BundleError>> {
    if files.files.keys().any(|n| n.starts_with('.')) {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("sluice-fuzz-bundle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("a temporary directory");
    let mut written = true;
    for (name, data) in &files.files {
        // A name the filesystem refuses cannot be compared.
        written &= std::fs::write(dir.join(name), data).is_ok();
    }
    let result = written.then(|| Bundle::load(&dir, bundle_trust(), now));
    let _ = std::fs::remove_dir_all(&dir);
    result
}
