//! What reaches the upstream and what an upstream answer may teach: queries
//! forwarded rebuilt, `dns.limits`, names `dns.hosts` pins, and the proxy's
//! own hostname lookups ([`DnsContext::verify`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, CNAME, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

use super::*;
use crate::audit::{AuditRecord, AuditWriter};
use crate::policy::{Policy, ResolvedNames};

const CLIENT: &str = "127.0.0.1:40000";

/// An upstream that answers each UDP query with what `answer` makes of it
/// and keeps every query it received, as received.
struct Upstream {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Vec<u8>>>>,
    task: JoinHandle<()>,
}

impl Upstream {
    async fn start(answer: Answerer) -> Upstream {
        let udp = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = udp.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let seen = received.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            loop {
                let (n, from) = udp.recv_from(&mut buf).await.unwrap();
                seen.lock().unwrap().push(buf[..n].to_vec());
                let q = Message::from_vec(&buf[..n]).unwrap();
                let mut r = Message::new(q.metadata.id, MessageType::Response, OpCode::Query);
                r.metadata.recursion_desired = q.metadata.recursion_desired;
                r.metadata.recursion_available = true;
                r.queries = q.queries.clone();
                for record in answer(&q) {
                    // Records whose owner is `additional.` go to the
                    // additional section, renamed to origin.test.
                    if record.name == name("additional.") {
                        let mut moved = record.clone();
                        moved.name = name("origin.test.");
                        r.add_additional(moved);
                    } else {
                        r.add_answer(record);
                    }
                }
                udp.send_to(&r.to_vec().unwrap(), from).await.unwrap();
            }
        });
        Upstream {
            addr,
            received,
            task,
        }
    }

    /// The queries received so far, parsed.
    fn queries(&self) -> Vec<Message> {
        let raw = self.received.lock().unwrap().clone();
        raw.iter().map(|q| Message::from_vec(q).unwrap()).collect()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn name(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

fn a(owner: &str, ip: [u8; 4]) -> Record {
    Record::from_rdata(name(owner), 60, RData::A(A(Ipv4Addr::from(ip))))
}

fn cname(owner: &str, target: &str) -> Record {
    Record::from_rdata(name(owner), 60, RData::CNAME(CNAME(name(target))))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct Harness {
    ctx: Arc<DnsContext>,
    writer: JoinHandle<Result<u64, crate::audit::AuditError>>,
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl Harness {
    /// A sandbox whose policy admits origin.test (pinned to 198.18.0.1) and
    /// anything under example, forwarding to `upstream`, with `limits`
    /// (YAML lines under `dns.limits`, indented by four) and `mode`.
    fn new(upstream: SocketAddr, mode: &str, limits: &str) -> Harness {
        let yaml = format!(
            r#"
version: 1
name: forward-test
mode: {mode}
rules:
  - name: origin
    action: allow
    hosts: ["origin.test"]
    ports: [443]
  - name: examples
    action: allow
    hosts: ["*.example"]
    ports: [443]
dns:
  upstream: ["{upstream}"]
  hosts:
    origin.test: ["198.18.0.1"]
  limits:
    max_name_length: 128
{limits}
"#
        );
        let policy = Policy::from_yaml(&yaml, "forward.yaml").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let (audit, writer) = AuditWriter::new(Some(&path));
        let ctx = DnsContext::new(
            PolicyHandle::new(policy, "forward-test@1".to_string()),
            Arc::new(DnsCache::new()),
            audit,
            "sb-forward".to_string(),
            crate::workload::WorkloadPath::Host,
        );
        Harness {
            ctx: Arc::new(ctx),
            writer: tokio::spawn(writer.run()),
            _dir: dir,
            path,
        }
    }

    async fn ask_bytes(&self, query: &[u8]) -> Message {
        let bytes = answer(query, &self.ctx, CLIENT.parse().unwrap())
            .await
            .expect("an answer");
        Message::from_vec(&bytes).unwrap()
    }

    async fn ask(&self, qname: &str, qtype: RecordType) -> Message {
        self.ask_bytes(&query_message(qname, qtype).to_vec().unwrap())
            .await
    }

    /// Would a connection to `dst` naming `host` be admitted, given what
    /// this sandbox's cache remembers?
    fn admits(&self, dst: &str, host: &str) -> String {
        let policy = self.ctx.policy.current();
        let d = policy.decide(dst.parse().unwrap(), Some(host), &*self.ctx.cache);
        format!("{}/{}", d.verdict.as_str(), d.reason.as_str())
    }

    async fn audit_records(self) -> Vec<AuditRecord> {
        let Harness {
            ctx, writer, path, ..
        } = self;
        drop(Arc::try_unwrap(ctx).ok().expect("no other holder"));
        writer.await.unwrap().unwrap();
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn query_message(qname: &str, qtype: RecordType) -> Message {
    let mut msg = Message::new(0x4242, MessageType::Query, OpCode::Query);
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(name(qname), qtype));
    msg
}

/// Answers every query with one A record for its own name.
fn one_address(q: &Message) -> Vec<Record> {
    let owner = q.queries[0].name().to_ascii();
    vec![a(&owner, [198, 18, 0, 7])]
}

#[tokio::test]
async fn a_forwarded_query_carries_only_its_question() {
    let up = Upstream::start(one_address).await;
    let h = Harness::new(up.addr, "enforce", "");
    let mut q = query_message("data.example.", RecordType::A);
    let payload = "exfiltrated-secret-in-additional";
    q.add_additional(Record::from_rdata(
        name("x.example."),
        0,
        RData::TXT(TXT::new(vec![payload.to_string()])),
    ));
    q.edns = Some(Edns::new());
    let mut bytes = q.to_vec().unwrap();
    bytes.extend_from_slice(b"trailing-bytes-after-the-message");
    let got = h.ask_bytes(&bytes).await;
    assert_eq!(got.metadata.response_code, ResponseCode::NoError);
    assert_eq!(got.metadata.id, 0x4242);

    let raw = up.received.lock().unwrap().clone();
    assert_eq!(raw.len(), 1);
    let sent = &raw[0];
    let contains = |needle: &[u8]| sent.windows(needle.len()).any(|w| w == needle);
    assert!(
        !contains(payload.as_bytes()),
        "the additional TXT went upstream"
    );
    assert!(!contains(b"trailing-bytes"), "trailing bytes went upstream");
    let parsed = Message::from_vec(sent).unwrap();
    assert_eq!(parsed.queries.len(), 1);
    assert_eq!(parsed.queries[0].name(), &name("data.example."));
    assert!(parsed.answers.is_empty() && parsed.authorities.is_empty());
    assert!(parsed.additionals.is_empty(), "{:?}", parsed.additionals);
    // Exactly one message: re-encoding it gives every byte sent.
    assert_eq!(parsed.to_vec().unwrap().len(), sent.len());
}

/// Makes an upstream's answer records from the query.
type Answerer = fn(&Message) -> Vec<Record>;

/// Answers shaped to add 198.18.0.2 to the pinned origin.test.
fn cname_to_pinned(q: &Message) -> Vec<Record> {
    let asked = q.queries[0].name().to_ascii();
    vec![
        cname(&asked, "origin.test."),
        a("origin.test.", [198, 18, 0, 2]),
    ]
}

fn chain_to_pinned(q: &Message) -> Vec<Record> {
    let asked = q.queries[0].name().to_ascii();
    vec![
        cname(&asked, "mid.example."),
        cname("mid.example.", "origin.test."),
        a("origin.test.", [198, 18, 0, 2]),
    ]
}

fn unrelated_records(q: &Message) -> Vec<Record> {
    let asked = q.queries[0].name().to_ascii();
    vec![
        a(&asked, [198, 18, 0, 3]),
        a("origin.test.", [198, 18, 0, 2]),
    ]
}

fn additional_section(q: &Message) -> Vec<Record> {
    let asked = q.queries[0].name().to_ascii();
    vec![
        a(&asked, [198, 18, 0, 3]),
        a("additional.", [198, 18, 0, 2]),
    ]
}

#[tokio::test]
async fn a_pinned_name_keeps_its_pin_across_every_answer_shape() {
    let shapes: [(&str, Answerer); 4] = [
        ("CNAME to the pinned name", cname_to_pinned),
        ("a CNAME chain ending at it", chain_to_pinned),
        ("A records for an unrelated name", unrelated_records),
        ("the additional section", additional_section),
    ];
    for (shape, answer) in shapes {
        let up = Upstream::start(answer).await;
        let h = Harness::new(up.addr, "enforce", "");
        let got = h.ask("alias.example.", RecordType::A).await;
        assert_eq!(got.metadata.response_code, ResponseCode::NoError, "{shape}");
        assert!(
            !h.ctx.cache.resolved("origin.test", ip("198.18.0.2")),
            "{shape}"
        );
        assert_eq!(
            h.admits("198.18.0.2:443", "origin.test"),
            "deny/host-address-mismatch",
            "{shape}"
        );
        assert_eq!(
            h.admits("198.18.0.1:443", "origin.test"),
            "allow/allow-rule",
            "{shape}"
        );
    }
}

fn cname_to_an_unadmitted_name(q: &Message) -> Vec<Record> {
    let asked = q.queries[0].name().to_ascii();
    vec![
        cname(&asked, "cdn.elsewhere.test."),
        a("cdn.elsewhere.test.", [198, 18, 0, 9]),
    ]
}

#[tokio::test]
async fn a_cname_target_no_rule_admits_inherits_nothing() {
    let up = Upstream::start(cname_to_an_unadmitted_name).await;
    let h = Harness::new(up.addr, "enforce", "");
    h.ask("www.example.", RecordType::A).await;
    // The name asked keeps the chain's address; its target learns nothing.
    assert!(h.ctx.cache.resolved("www.example", ip("198.18.0.9")));
    assert!(!h.ctx.cache.resolved("cdn.elsewhere.test", ip("198.18.0.9")));
}

fn cname_to_an_admitted_name(q: &Message) -> Vec<Record> {
    let asked = q.queries[0].name().to_ascii();
    vec![
        cname(&asked, "cdn.example."),
        a("cdn.example.", [198, 18, 0, 9]),
    ]
}

#[tokio::test]
async fn a_cname_target_a_rule_admits_learns_its_addresses() {
    let up = Upstream::start(cname_to_an_admitted_name).await;
    let h = Harness::new(up.addr, "enforce", "");
    h.ask("www.example.", RecordType::A).await;
    assert!(h.ctx.cache.resolved("cdn.example", ip("198.18.0.9")));
    assert_eq!(
        h.ctx.cache.name_for(ip("198.18.0.9")).as_deref(),
        Some("www.example")
    );
}

/// Asks `qname` and returns the answer's code, checking that the query did
/// not reach the upstream.
async fn over_limit(h: &Harness, up: &Upstream, qname: &str, qtype: RecordType) -> ResponseCode {
    let before = up.queries().len();
    let got = h.ask(qname, qtype).await;
    // The canary: an ordinary query after the probe reaches the upstream,
    // and it is the only one that did.
    let canary = h.ask("canary.example.", RecordType::A).await;
    assert_eq!(canary.metadata.response_code, ResponseCode::NoError);
    let after = up.queries();
    assert_eq!(after.len(), before + 1, "{after:?}");
    assert_eq!(after[before].queries[0].name(), &name("canary.example."));
    got.metadata.response_code
}

#[tokio::test]
async fn a_query_type_outside_the_limits_is_refused_and_audited() {
    let up = Upstream::start(one_address).await;
    let h = Harness::new(up.addr, "enforce", "");
    let code = over_limit(&h, &up, "data.example.", RecordType::TXT).await;
    assert_eq!(code, ResponseCode::Refused);
    let records = h.audit_records().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].verdict, "deny");
    assert_eq!(records[0].reason, "dns-query-type");
    assert_eq!(records[0].host.as_deref(), Some("data.example"));
}

#[tokio::test]
async fn a_name_longer_than_the_limit_is_refused_and_audited() {
    let up = Upstream::start(one_address).await;
    let h = Harness::new(up.addr, "enforce", "");
    let long = format!("{}.{}.example.", "a".repeat(63), "b".repeat(63));
    let code = over_limit(&h, &up, &long, RecordType::A).await;
    assert_eq!(code, ResponseCode::Refused);
    let records = h.audit_records().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].reason, "dns-name-too-long");
}

#[tokio::test]
async fn queries_past_the_per_minute_budget_are_refused_and_audited() {
    let up = Upstream::start(one_address).await;
    let h = Harness::new(up.addr, "enforce", "    queries_per_minute: 3");
    for _ in 0..2 {
        let got = h.ask("www.example.", RecordType::A).await;
        assert_eq!(got.metadata.response_code, ResponseCode::NoError);
    }
    let got = h.ask("www.example.", RecordType::A).await;
    assert_eq!(got.metadata.response_code, ResponseCode::NoError);
    let refused = h.ask("www.example.", RecordType::A).await;
    assert_eq!(refused.metadata.response_code, ResponseCode::Refused);
    assert_eq!(up.queries().len(), 3);
    let records = h.audit_records().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].reason, "dns-query-budget");
}

#[tokio::test]
async fn distinct_names_past_the_per_minute_budget_are_refused_and_audited() {
    let up = Upstream::start(one_address).await;
    let h = Harness::new(up.addr, "enforce", "    names_per_minute: 2");
    h.ask("canary.example.", RecordType::A).await;
    h.ask("one.example.", RecordType::A).await;
    let code = over_limit(&h, &up, "two.example.", RecordType::A).await;
    assert_eq!(code, ResponseCode::Refused);
    let records = h.audit_records().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].reason, "dns-name-budget");
    assert_eq!(records[0].host.as_deref(), Some("two.example"));
}

#[tokio::test]
async fn in_audit_mode_a_limited_query_is_forwarded_and_audited_would_deny() {
    let up = Upstream::start(one_address).await;
    let h = Harness::new(up.addr, "audit", "");
    let got = h.ask("data.example.", RecordType::TXT).await;
    assert_eq!(got.metadata.response_code, ResponseCode::NoError);
    assert_eq!(up.queries().len(), 1);
    let records = h.audit_records().await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].verdict, "would-deny");
    assert_eq!(records[0].reason, "dns-query-type");
}

/// Gives `h`'s sandbox a metrics registry of its own and returns it.
fn with_metrics(h: &mut Harness) -> prometheus::Registry {
    let registry = prometheus::Registry::new();
    let metrics = Arc::new(crate::metrics::Metrics::new(&registry).unwrap());
    Arc::get_mut(&mut h.ctx).unwrap().metrics = Some(metrics);
    registry
}

fn metrics_text(registry: &prometheus::Registry) -> String {
    crate::metrics::render(registry).0
}

#[tokio::test]
async fn limit_hits_are_counted_by_limit() {
    let up = Upstream::start(one_address).await;
    let mut h = Harness::new(
        up.addr,
        "enforce",
        "    queries_per_minute: 4\n    names_per_minute: 3",
    );
    let registry = with_metrics(&mut h);
    // query-type: TXT is not forwarded by default (twice).
    h.ask("data.example.", RecordType::TXT).await;
    h.ask("data.example.", RecordType::TXT).await;
    // name-length: over the harness's max_name_length of 128.
    let label = "a".repeat(50);
    let long = format!("{label}.{label}.{label}.example.");
    h.ask(&long, RecordType::A).await;
    // names: the fourth distinct name this minute (three forwarded first).
    for n in [
        "one.example.",
        "two.example.",
        "three.example.",
        "four.example.",
    ] {
        h.ask(n, RecordType::A).await;
    }
    // queries: a fourth forwarded query spends the last of the four, the
    // next is over.
    h.ask("one.example.", RecordType::A).await;
    h.ask("one.example.", RecordType::A).await;
    let text = metrics_text(&registry);
    for series in [
        "sluice_dns_limited_total{limit=\"query-type\"} 2",
        "sluice_dns_limited_total{limit=\"name-length\"} 1",
        "sluice_dns_limited_total{limit=\"names\"} 1",
        "sluice_dns_limited_total{limit=\"queries\"} 1",
    ] {
        assert!(text.contains(series), "no {series} in:\n{text}");
    }
}

#[tokio::test]
async fn a_hostname_the_cache_does_not_know_is_verified_through_the_upstream() {
    let up = Upstream::start(one_address).await;
    let h = Harness::new(up.addr, "enforce", "");
    assert!(h.ctx.verify("api.example", ip("198.18.0.7")).await);
    let sent = up.queries();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].queries[0].name(), &name("api.example."));
    assert_eq!(sent[0].queries[0].query_type(), RecordType::A);
    // The answer is cached: the next connection to it needs no lookup.
    assert!(h.ctx.cache.resolved("api.example", ip("198.18.0.7")));
    // ...but it is not claimed as the name the sandbox asked for.
    assert_eq!(h.ctx.cache.name_for(ip("198.18.0.7")), None);
}

#[tokio::test]
async fn each_hostname_lookup_is_counted_by_its_result() {
    let up = Upstream::start(one_address).await;
    let mut h = Harness::new(up.addr, "enforce", "");
    let registry = with_metrics(&mut h);
    assert!(h.ctx.verify("api.example", ip("198.18.0.7")).await);
    assert!(!h.ctx.verify("www.example", ip("198.18.0.8")).await);
    let text = metrics_text(&registry);
    for series in [
        "sluice_hostname_lookups_total{result=\"confirmed\"} 1",
        "sluice_hostname_lookups_total{result=\"mismatch\"} 1",
    ] {
        assert!(text.contains(series), "no {series} in:\n{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_lookup_the_upstream_never_answers_ends_in_a_deny_at_the_time_bound() {
    // Bound but never read: every query to it goes unanswered.
    let silent = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let mut h = Harness::new(silent.local_addr().unwrap(), "enforce", "");
    let registry = with_metrics(&mut h);
    let started = tokio::time::Instant::now();
    assert!(!h.ctx.verify("api.example", ip("198.18.0.7")).await);
    // Virtual time (the clock is paused): the lookup gave up by its bound.
    assert!(started.elapsed() <= crate::dns::VERIFY_TIMEOUT + Duration::from_millis(1));
    let text = metrics_text(&registry);
    assert!(
        text.contains("sluice_hostname_lookups_total{result=\"no-answer\"} 1"),
        "{text}"
    );
    // Nothing was cached from the silence: the next connection asks again.
    assert!(!h.ctx.cache.knows("api.example", ip("198.18.0.7")));
}

#[tokio::test]
async fn an_ipv6_destination_is_verified_by_an_aaaa_lookup() {
    let up = Upstream::start(|q: &Message| {
        let owner = q.queries[0].name().to_ascii();
        match q.queries[0].query_type() {
            RecordType::AAAA => vec![Record::from_rdata(
                name(&owner),
                60,
                RData::AAAA(hickory_proto::rr::rdata::AAAA(
                    "2001:db8::7".parse().unwrap(),
                )),
            )],
            _ => vec![a(&owner, [198, 18, 0, 7])],
        }
    })
    .await;
    let h = Harness::new(up.addr, "enforce", "");
    assert!(h.ctx.verify("api.example", ip("2001:db8::7")).await);
    assert!(!h.ctx.verify("www.example", ip("2001:db8::8")).await);
    let sent = up.queries();
    assert_eq!(sent.len(), 2);
    assert!(sent
        .iter()
        .all(|q| q.queries[0].query_type() == RecordType::AAAA));
}

#[tokio::test]
async fn a_wrong_address_is_not_verified_with_or_without_a_prior_lookup() {
    let up = Upstream::start(one_address).await;
    let h = Harness::new(up.addr, "enforce", "");
    // Without: sluice's own lookup says 198.18.0.7.
    assert!(!h.ctx.verify("api.example", ip("198.18.0.8")).await);
    // With: the answer is cached, so no second lookup is made.
    assert!(!h.ctx.verify("api.example", ip("198.18.0.8")).await);
    assert_eq!(up.queries().len(), 1);
    // After the sandbox's own lookup of another name, the same.
    h.ask("www.example.", RecordType::A).await;
    assert!(!h.ctx.verify("www.example", ip("198.18.0.8")).await);
    assert_eq!(up.queries().len(), 2);
}

#[tokio::test]
async fn a_pinned_name_is_verified_from_the_policy_alone() {
    let up = Upstream::start(cname_to_pinned).await;
    let h = Harness::new(up.addr, "enforce", "");
    assert!(h.ctx.verify("origin.test", ip("198.18.0.1")).await);
    assert!(h.ctx.verify("origin.test", ip("::ffff:198.18.0.1")).await);
    assert!(!h.ctx.verify("origin.test", ip("198.18.0.2")).await);
    // A name no rule admits is not looked up either.
    assert!(!h.ctx.verify("bank.test", ip("198.18.0.2")).await);
    // The canary: the next lookup is the first the upstream sees.
    assert!(!h.ctx.verify("x.example", ip("198.18.0.99")).await);
    let sent = up.queries();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].queries[0].name(), &name("x.example."));
}

#[tokio::test]
async fn concurrent_verifications_of_one_name_share_one_lookup() {
    let up = Upstream::start(one_address).await;
    let h = Harness::new(up.addr, "enforce", "");
    let ctx = &h.ctx;
    let (a, b, c) = tokio::join!(
        ctx.verify("api.example", ip("198.18.0.7")),
        ctx.verify("api.example", ip("198.18.0.7")),
        ctx.verify("API.example.", ip("198.18.0.8")),
    );
    assert_eq!((a, b, c), (true, true, false));
    assert_eq!(up.queries().len(), 1);
}

#[tokio::test]
async fn a_verification_spends_from_the_dns_limits() {
    let up = Upstream::start(one_address).await;
    let h = Harness::new(up.addr, "enforce", "    names_per_minute: 1");
    h.ask("www.example.", RecordType::A).await;
    // Another name would be a second distinct name this minute.
    assert!(!h.ctx.verify("api.example", ip("198.18.0.7")).await);
    assert_eq!(up.queries().len(), 1);
}
