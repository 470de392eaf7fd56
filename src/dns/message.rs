//! The pure part of DNS handling: what the responder does with a query's
//! bytes (parse, decide against the policy, build the reply sluice gives
//! itself), how a reply is fitted to UDP, and what an upstream's answer is
//! taken to say (which question it answers, which addresses of its CNAME
//! chain may be remembered). No sockets, no clock, no cache, no audit:
//! [`super::answer`] does the I/O around these functions, and the fuzz
//! targets `dns` and `dns_upstream` drive them directly. Nothing here may
//! panic or do more than linear work on a hostile message; an unparsable
//! query is dropped, never guessed at.

use std::net::{IpAddr, SocketAddr};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use crate::policy::{DnsConfig, Policy};

/// TTL of answers from `dns.hosts`.
pub(crate) const HOSTS_TTL: u32 = 60;
/// EDNS payload size advertised in answers sluice builds itself.
const EDNS_PAYLOAD: u16 = 1232;
/// Largest UDP message sluice reads (queries) or sends (answers).
pub(crate) const UDP_MAX: usize = 4096;
/// UDP answer size without EDNS (RFC 1035).
pub(crate) const UDP_CLASSIC: usize = 512;
/// CNAME links followed in an upstream answer.
pub const MAX_CHAIN: usize = 16;
/// Fewest bytes a question takes on the wire (root name, type, class).
const MIN_QUESTION: usize = 5;
/// Fewest bytes a resource record takes (root name, type, class, TTL,
/// empty data).
const MIN_RECORD: usize = 11;

/// `bytes` parsed as a DNS message, refusing at once a header whose counts
/// cannot fit in the bytes that follow. hickory-proto reserves room for
/// the header's question count before reading any question, so without
/// this a 12-byte message claiming 65535 questions costs megabytes of
/// allocation (found by tests/fuzz_properties.rs).
pub(crate) fn parse(bytes: &[u8]) -> Option<Message> {
    let header = bytes.get(..12)?;
    let count = |i: usize| usize::from(u16::from_be_bytes([header[i], header[i + 1]]));
    let records = count(6) + count(8) + count(10);
    let needed = 12 + count(4) * MIN_QUESTION + records * MIN_RECORD;
    if needed > bytes.len() {
        return None;
    }
    Message::from_vec(bytes).ok()
}

/// What to do with one query, decided from its bytes and the policy alone.
#[derive(Debug)]
pub struct Plan<'a> {
    pub action: Action<'a>,
    /// The question and the policy's view of it, when exactly one was read.
    pub asked: Option<Asked>,
}

/// What goes back to the client.
#[derive(Debug)]
pub enum Action<'a> {
    /// Not a query sluice can parse, or not a query at all: send nothing.
    Drop,
    /// Send these bytes (a reply built here).
    Reply(Vec<u8>),
    /// Ask these upstreams; `parsed` is the query (for matching the answer
    /// and for a SERVFAIL if none answers).
    Forward {
        parsed: Box<Message>,
        upstreams: &'a [SocketAddr],
    },
}

/// The one question of a query, as the policy saw it.
#[derive(Debug)]
pub struct Asked {
    /// The name as policy sees it (see [`plain_name`]), else the name's
    /// ASCII form: what audit records carry as `host`.
    pub host: String,
    pub qtype: RecordType,
    /// Some allow rule could admit the name, or `dns.hosts` defines it.
    pub admitted: bool,
    /// A static answer was given: remember these addresses for this name.
    pub remember: Option<(String, Vec<IpAddr>)>,
    /// An admitted query that `dns.limits` keeps from the upstreams (in
    /// enforce mode it was REFUSED; in audit mode it is forwarded anyway).
    /// The per-minute budgets are the caller's to check: they need a clock.
    pub limit: Option<Limit>,
}

/// Which of `dns.limits` a query ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Its type is not in `query_types`.
    QueryType,
    /// Its name is longer than `max_name_length`.
    NameLength,
    /// `queries_per_minute` is spent.
    Queries,
    /// `names_per_minute` distinct names were forwarded in the last minute.
    Names,
}

impl Limit {
    /// The audit record's `reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Limit::QueryType => "dns-query-type",
            Limit::NameLength => "dns-name-too-long",
            Limit::Queries => "dns-query-budget",
            Limit::Names => "dns-name-budget",
        }
    }

    /// The `limit` label of `sluice_dns_limited_total`.
    pub fn label(self) -> &'static str {
        match self {
            Limit::QueryType => "query-type",
            Limit::NameLength => "name-length",
            Limit::Queries => "queries",
            Limit::Names => "names",
        }
    }
}

/// Decide what to do with `query` (a UDP payload or a TCP frame without its
/// length) under `policy`; `default_upstream` is used when the policy has no
/// `dns.upstream`. In enforce mode a name the policy could not admit is
/// REFUSED; in audit mode it is answered like any other (the caller audits
/// it either way, from [`Plan::asked`]).
pub fn plan<'a>(query: &[u8], policy: &'a Policy, default_upstream: &'a [SocketAddr]) -> Plan<'a> {
    let done = |action| Plan {
        action,
        asked: None,
    };
    let Some(parsed) = parse(query) else {
        return done(Action::Drop);
    };
    if parsed.metadata.message_type != MessageType::Query {
        return done(Action::Drop); // never answer an answer
    }
    if parsed.metadata.op_code != OpCode::Query {
        return done(reply_action(&parsed, ResponseCode::NotImp, Vec::new()));
    }
    if parsed.queries.len() != 1 {
        return done(reply_action(&parsed, ResponseCode::FormErr, Vec::new()));
    }
    let question = &parsed.queries[0];
    let qtype = question.query_type();
    let name = plain_name(question.name());
    let dns = policy.dns();
    // A name the policy defines in `dns.hosts` is admitted too: its author
    // named it (typically for a cidrs rule, as in DESIGN.md's example).
    let admitted = name
        .as_deref()
        .is_some_and(|n| dns.hosts.contains_key(n) || policy.admits_name(n));
    let mut asked = Asked {
        host: name.clone().unwrap_or_else(|| question.name().to_ascii()),
        qtype,
        admitted,
        remember: None,
        limit: None,
    };
    if !admitted && policy.mode() == crate::policy::Mode::Enforce {
        let action = reply_action(&parsed, ResponseCode::Refused, Vec::new());
        return Plan {
            action,
            asked: Some(asked),
        };
    }

    // Static answers: the name is defined here, whatever the type.
    if let Some((n, ips)) = name.and_then(|n| dns.hosts.get(&n).map(|ips| (n, ips))) {
        let (family, answers) = static_answers(question.name(), ips, qtype);
        let action = reply_action(&parsed, ResponseCode::NoError, answers);
        asked.remember = Some((n, family));
        return Plan {
            action,
            asked: Some(asked),
        };
    }

    let upstreams = match &dns.upstream {
        Some(list) => list.as_slice(),
        None => default_upstream,
    };
    asked.limit = limit(dns, upstreams, qtype, &asked.host);
    let action = upstream_action(parsed, policy, upstreams, asked.limit.is_some());
    Plan {
        action,
        asked: Some(asked),
    }
}

/// The addresses of `ips` a `qtype` query asks for, and the answer records
/// for `name` that give them.
fn static_answers(name: &Name, ips: &[IpAddr], qtype: RecordType) -> (Vec<IpAddr>, Vec<Record>) {
    let family: Vec<IpAddr> = ips
        .iter()
        .copied()
        .filter(|ip| match qtype {
            RecordType::A => ip.is_ipv4(),
            RecordType::AAAA => ip.is_ipv6(),
            _ => false,
        })
        .collect();
    let answers = family
        .iter()
        .map(|&ip| {
            let data = match ip {
                IpAddr::V4(v4) => RData::A(A(v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
            };
            Record::from_rdata(name.clone(), HOSTS_TTL, data)
        })
        .collect();
    (family, answers)
}

/// Which of `dns.limits` keeps a query for `host` from `upstreams`, if any.
fn limit(
    dns: &DnsConfig,
    upstreams: &[SocketAddr],
    qtype: RecordType,
    host: &str,
) -> Option<Limit> {
    // The limits bound what reaches an upstream; with none to reach they
    // have nothing to bound.
    if upstreams.is_empty() {
        None
    } else if !dns.limits.forwards_type(u16::from(qtype)) {
        Some(Limit::QueryType)
    } else if host.trim_end_matches('.').len() > dns.limits.max_name_length {
        Some(Limit::NameLength)
    } else {
        None
    }
}

/// What to do with an admitted query no static answer covers: refuse it if
/// `limited` (in enforce mode), fail it if there is no upstream, else
/// forward it.
fn upstream_action<'a>(
    parsed: Message,
    policy: &Policy,
    upstreams: &'a [SocketAddr],
    limited: bool,
) -> Action<'a> {
    if limited && policy.mode() == crate::policy::Mode::Enforce {
        reply_action(&parsed, ResponseCode::Refused, Vec::new())
    } else if upstreams.is_empty() {
        // `upstream: []` means "only the static hosts"; no configured and
        // no host resolver is a failure, not proof the name is absent.
        let code = if policy.dns().upstream.is_some() {
            ResponseCode::NXDomain
        } else {
            ResponseCode::ServFail
        };
        reply_action(&parsed, code, Vec::new())
    } else {
        Action::Forward {
            parsed: Box::new(parsed),
            upstreams,
        }
    }
}

fn reply_action(query: &Message, code: ResponseCode, answers: Vec<Record>) -> Action<'static> {
    match reply(query, code, answers) {
        Some(bytes) => Action::Reply(bytes),
        None => Action::Drop,
    }
}

/// The name as policy sees it: lowercase labels of letters, digits, `-`
/// and `_`, joined by dots, no trailing dot. `None` for the root or any
/// label with other bytes (such a name can match no rule).
pub fn plain_name(name: &Name) -> Option<String> {
    let mut out = String::with_capacity(name.len());
    for label in name.iter() {
        let ok = !label.is_empty()
            && label
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return None;
        }
        if !out.is_empty() {
            out.push('.');
        }
        out.extend(label.iter().map(|&b| char::from(b.to_ascii_lowercase())));
    }
    (!out.is_empty()).then_some(out)
}

/// A response to `query` built here: id, opcode, RD and CD mirrored, RA set,
/// the question echoed if there is exactly one (a NOTIMP for a query with
/// hundreds of questions would otherwise echo them all, past what the
/// client accepts over UDP; found by fuzzing), EDNS if the query had it.
/// `None` if the message cannot be encoded (it is then not sent).
pub fn reply(query: &Message, code: ResponseCode, answers: Vec<Record>) -> Option<Vec<u8>> {
    let mut msg = Message::response(query.metadata.id, query.metadata.op_code);
    msg.metadata.recursion_desired = query.metadata.recursion_desired;
    msg.metadata.checking_disabled = query.metadata.checking_disabled;
    msg.metadata.recursion_available = true;
    msg.metadata.response_code = code;
    if code != ResponseCode::FormErr && query.queries.len() == 1 {
        msg.queries = query.queries.clone();
    }
    msg.answers = answers;
    if query.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        msg.edns = Some(edns);
    }
    msg.to_vec().ok()
}

/// `response` as sent over UDP: unchanged if it fits what the client
/// accepts (512 bytes, or its EDNS payload size up to 4096), else the
/// header and question with TC set, so the client retries over TCP.
/// `None` if it fits in no form (then nothing is sent).
pub fn fit_udp(query: &[u8], response: Vec<u8>) -> Option<Vec<u8>> {
    if response.len() <= UDP_CLASSIC {
        return Some(response);
    }
    let limit = udp_limit(query);
    if response.len() <= limit {
        return Some(response);
    }
    let truncated = parse(&response)?.truncate().to_vec().ok()?;
    (truncated.len() <= limit).then_some(truncated)
}

/// The largest UDP answer the client of `query` accepts.
pub fn udp_limit(query: &[u8]) -> usize {
    parse(query)
        .and_then(|q| q.edns.map(|e| usize::from(e.max_payload())))
        .unwrap_or(UDP_CLASSIC)
        .clamp(UDP_CLASSIC, UDP_MAX)
}

/// The query sluice sends upstream for `query` (whose one question the
/// policy admitted): rebuilt from that question alone, with id `id`,
/// recursion desired, the client's CD bit, and EDNS only if the client
/// used it (sluice's own payload size, the client's DO bit, no options).
/// Nothing else the client sent travels on: no other section, no EDNS
/// option, no byte after the message.
pub fn upstream_query(query: &Message, id: u16) -> Option<Vec<u8>> {
    let question = match query.queries.as_slice() {
        [one] => one,
        _ => return None,
    };
    let mut out = Message::new(id, MessageType::Query, OpCode::Query);
    out.metadata.recursion_desired = true;
    out.metadata.checking_disabled = query.metadata.checking_disabled;
    out.add_query(question.clone());
    if let Some(client) = &query.edns {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        edns.set_dnssec_ok(client.flags().dnssec_ok);
        out.edns = Some(edns);
    }
    out.to_vec().ok()
}

/// `bytes` parsed, if it is a response with `id` to the same question as
/// `asked` (an upstream's answer to a query sluice forwarded).
pub fn upstream_answer(bytes: &[u8], asked: &Message, id: u16) -> Option<Message> {
    let message = parse(bytes)?;
    let meta = &message.metadata;
    if meta.id != id || meta.message_type != MessageType::Response {
        return None;
    }
    let (asked, got) = (asked.queries.first()?, message.queries.first());
    // Answers to refused or failed queries may omit the question.
    let same = match got {
        // Name equality is case-insensitive (0x20 randomisation survives).
        Some(got) => {
            got.name() == asked.name()
                && got.query_type() == asked.query_type()
                && got.query_class() == asked.query_class()
        }
        None => meta.response_code != ResponseCode::NoError,
    };
    same.then_some(message)
}

/// Addresses an upstream answer gives one name, to be remembered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Learned {
    /// As [`plain_name`] gives it.
    pub name: String,
    pub ips: Vec<IpAddr>,
    /// The smallest TTL among the records read so far along the chain.
    pub ttl: u32,
    /// A CNAME target (not the name asked): its addresses must not map
    /// back to it, since the sandbox asked for another name.
    pub alias: bool,
}

/// What an upstream answer to `asked` teaches: for the asked name all
/// addresses at the end of its CNAME chain (at most [`MAX_CHAIN`] links),
/// and for each CNAME target its own. Records off the chain (unsolicited
/// names) are ignored. The asked name's entry comes last.
pub fn learned_addresses(asked: &Name, message: &Message) -> Vec<Learned> {
    let mut chain: Vec<&Name> = vec![asked];
    // Each pass adds at least one name or stops; bounded by the answer count.
    for _ in 0..message.answers.len().min(MAX_CHAIN) {
        let before = chain.len();
        for record in &message.answers {
            if let RData::CNAME(target) = &record.data {
                if chain.contains(&&record.name) && !chain.contains(&&target.0) {
                    chain.push(&target.0);
                }
            }
        }
        if chain.len() == before {
            break;
        }
    }
    let mut out = Vec::new();
    let mut all = Vec::new();
    let mut ttl = u32::MAX;
    for (i, owner) in chain.iter().enumerate() {
        let mut ips = Vec::new();
        for record in message.answers.iter().filter(|r| &&r.name == owner) {
            let ip = match &record.data {
                RData::A(a) => IpAddr::V4(a.0),
                RData::AAAA(aaaa) => IpAddr::V6(aaaa.0),
                _ => continue,
            };
            ips.push(ip);
            ttl = ttl.min(record.ttl);
        }
        if ips.is_empty() {
            continue;
        }
        if i > 0 {
            if let Some(alias) = plain_name(owner) {
                out.push(Learned {
                    name: alias,
                    ips: ips.clone(),
                    ttl,
                    alias: true,
                });
            }
        }
        all.extend(ips);
    }
    if let (false, Some(name)) = (all.is_empty(), plain_name(asked)) {
        out.push(Learned {
            name,
            ips: all,
            ttl,
            alias: false,
        });
    }
    out
}

/// What sluice keeps of an upstream answer to `asked` under `policy`: what
/// [`learned_addresses`] reads, except for names `dns.hosts` pins (no
/// upstream answer adds an address to them) and CNAME targets no allow rule
/// could admit (queried directly they would be refused, so they inherit
/// nothing, and they would only take room in the cache).
pub fn remembered(asked: &Name, message: &Message, policy: &Policy) -> Vec<Learned> {
    let mut learned = learned_addresses(asked, message);
    learned.retain(|l| {
        !policy.dns().hosts.contains_key(&l.name) && (!l.alias || policy.admits_name(&l.name))
    });
    learned
}
