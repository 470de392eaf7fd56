//! Property tests for every parser of untrusted bytes, in the normal suite
//! (no AFL): seeded random and mutated inputs (a failure reproduces from
//! its seed) keep the fuzz harness's invariants, cost work bounded by
//! their size (counted in allocations, never in wall time), and generated
//! well-formed inputs give back exactly what was put in.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

#[path = "common/fuzz.rs"]
mod fuzz_common;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use fuzz_common::{corpus, measure, mutate, CountingAlloc};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use sluice::bundle::{Bundle, BundleError, BundleFiles, Manifest};
use sluice::dns::message::{self as dns_message, Action};
use sluice::policy::Policy;
use sluice::proxy::peek::{inspect, Peeked};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `runs` inputs for `target`: corpus files mutated (several mutations
/// deep, splicing from other files) and now and then random bytes.
fn inputs(target: &str, seed: u64, runs: usize) -> Vec<Vec<u8>> {
    let files: Vec<Vec<u8>> = corpus(target).into_iter().map(|(_, b)| b).collect();
    let mut rng = rng(seed);
    (0..runs)
        .map(|i| {
            if i % 10 == 9 {
                let n = rng.random_range(0..256);
                return (0..n).map(|_| rng.random()).collect();
            }
            let mut input = files.choose(&mut rng).unwrap().clone();
            for _ in 0..rng.random_range(1..=3) {
                let other = files.choose(&mut rng).unwrap();
                input = mutate(&mut rng, &input, other);
            }
            input
        })
        .collect()
}

// --------------------------------------------------------------- peek ----

#[test]
fn peek_mutated_and_random_inputs_keep_the_harness_invariants() {
    for input in inputs("peek", 1, 20_000) {
        harness::peek(&input);
    }
}

#[test]
fn peek_never_allocates() {
    for input in inputs("peek", 2, 5_000) {
        let (_, bytes, blocks) = measure(|| {
            let _ = inspect(&input);
        });
        assert_eq!((bytes, blocks), (0, 0), "inspect allocated on {input:?}");
    }
}

/// A ClientHello for `name` with `extra` unknown extensions around the
/// server_name one (in random order), as one TLS record.
fn client_hello(rng: &mut ChaCha8Rng, name: &str) -> (Vec<u8>, usize) {
    let mut exts: Vec<Vec<u8>> = (0..rng.random_range(0..6))
        .map(|_| {
            let ty: u16 = rng.random_range(1..0xff00);
            let body: Vec<u8> = (0..rng.random_range(0..40)).map(|_| rng.random()).collect();
            [
                &ty.to_be_bytes()[..],
                &(body.len() as u16).to_be_bytes(),
                &body,
            ]
            .concat()
        })
        .collect();
    let host = name.as_bytes();
    let list = [&[0u8][..], &(host.len() as u16).to_be_bytes(), host].concat();
    let sni_body = [&(list.len() as u16).to_be_bytes()[..], &list].concat();
    let sni = [
        &[0, 0][..],
        &(sni_body.len() as u16).to_be_bytes(),
        &sni_body,
    ]
    .concat();
    let at = rng.random_range(0..=exts.len());
    exts.insert(at, sni);
    let exts = exts.concat();
    let session: Vec<u8> = (0..rng.random_range(0..=32))
        .map(|_| rng.random())
        .collect();
    let mut body = vec![3, 3];
    body.extend((0..32).map(|_| rng.random::<u8>()));
    body.push(session.len() as u8);
    body.extend(&session);
    body.extend([0, 4, 0x13, 0x01, 0x13, 0x02, 1, 0]);
    body.extend((exts.len() as u16).to_be_bytes());
    body.extend(&exts);
    let mut hs = vec![1];
    hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend(&body);
    let name_at = hs.windows(host.len()).rposition(|w| w == host).unwrap();
    (hs, name_at)
}

/// `hs` (handshake bytes) framed into records cut at `cuts`.
fn records(hs: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&hs.len())) {
        out.extend([22, 3, 1]);
        out.extend(((to - from) as u16).to_be_bytes());
        out.extend(&hs[from..to]);
        from = to;
    }
    out
}

/// A hostname as policies accept it: lowercase labels that start and end
/// with a letter or digit, the first label starting with a letter.
fn policy_hostname(rng: &mut ChaCha8Rng) -> String {
    let name = hostname(rng).to_ascii_lowercase();
    let labels: Vec<String> = name
        .split('.')
        .map(|l| format!("a{}z", l.trim_matches('-')))
        .collect();
    labels.join(".")
}

fn hostname(rng: &mut ChaCha8Rng) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-";
    let labels = rng.random_range(1..=4);
    (0..labels)
        .map(|_| {
            let n = rng.random_range(1..=20);
            (0..n)
                .map(|_| char::from(*CHARS.choose(rng).unwrap()))
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join(".")
}

#[test]
fn generated_client_hellos_yield_their_name_however_split() {
    let mut rng = rng(3);
    for _ in 0..500 {
        let name = hostname(&mut rng);
        let (hs, name_at) = client_hello(&mut rng, &name);
        // Cuts anywhere but inside the name.
        let mut cuts: Vec<usize> = (0..rng.random_range(0..5))
            .map(|_| rng.random_range(1..hs.len()))
            .filter(|&c| c <= name_at || c >= name_at + name.len())
            .collect();
        cuts.sort();
        cuts.dedup();
        let wire = records(&hs, &cuts);
        assert_eq!(inspect(&wire), Peeked::Tls { sni: Some(&name) }, "{cuts:?}");
        for end in 1..wire.len() {
            assert_eq!(inspect(&wire[..end]), Peeked::NeedMore, "decided at {end}");
        }
        harness::peek(&wire);
    }
}

#[test]
fn generated_http_heads_yield_their_host() {
    let mut rng = rng(4);
    for _ in 0..2_000 {
        let host = hostname(&mut rng);
        let method = *["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"]
            .choose(&mut rng)
            .unwrap();
        let host_field = match rng.random_range(0..3) {
            0 => host.clone(),
            1 => format!("{host}:{}", rng.random::<u16>()),
            _ => format!("{host}."),
        };
        let key = *["Host", "host", "HOST", "hOsT"].choose(&mut rng).unwrap();
        let mut fields: Vec<String> = (0..rng.random_range(0..5))
            .map(|i| format!("X-Field-{i}: {}", rng.random::<u32>()))
            .collect();
        let at = rng.random_range(0..=fields.len());
        fields.insert(
            at,
            format!("{key}:{}{host_field} ", " ".repeat(rng.random_range(0..3))),
        );
        let eol = if rng.random_bool(0.8) { "\r\n" } else { "\n" };
        let head = format!(
            "{method} /{} HTTP/1.1{eol}{}{eol}{eol}",
            rng.random::<u16>(),
            fields.join(eol)
        );
        let got = inspect(head.as_bytes());
        assert_eq!(got, Peeked::Http { host: Some(&host) }, "{head:?}");
        harness::peek(head.as_bytes());
    }
}

// ---------------------------------------------------------------- dns ----

#[test]
fn dns_mutated_queries_keep_the_harness_invariants() {
    for input in inputs("dns", 5, 5_000) {
        harness::dns(&input);
    }
}

#[test]
fn dns_mutated_upstream_answers_keep_the_harness_invariants() {
    for input in inputs("dns_upstream", 6, 5_000) {
        harness::dns_upstream(&input);
    }
}

/// The DNS harness's policy (enforce mode), loaded from the corpus's own
/// policy text would couple the two; one small policy is enough here.
fn dns_policy() -> Policy {
    let text = r#"
version: 1
name: props
rules:
  - name: packages
    action: allow
    hosts: ["pypi.org", "*.pythonhosted.org"]
dns:
  upstream: []
  hosts:
    origin.test: ["198.18.0.1", "2001:db8::1"]
    pypi.org: ["198.18.0.7"]
"#;
    Policy::from_yaml(text, "props.yaml").unwrap()
}

#[test]
fn dns_work_is_linear_in_the_message() {
    let policy = dns_policy();
    let upstream = [SocketAddr::from(([198, 18, 0, 53], 53))];
    let mut inputs = inputs("dns", 7, 3_000);
    inputs.extend(inputs_upstream_as_queries());
    for input in inputs {
        let (_, bytes, blocks) = measure(|| {
            let plan = dns_message::plan(&input, &policy, &upstream);
            if let Action::Reply(reply) = plan.action {
                let _ = dns_message::fit_udp(&input, reply);
            }
        });
        // Names are at most 255 bytes and each record takes 11 bytes or
        // more, so parsing and answering cost a bounded multiple.
        let bound = 1024 * input.len() + 64 * 1024;
        assert!(
            bytes <= bound,
            "{bytes} bytes allocated for {} input bytes",
            input.len()
        );
        assert!(blocks <= 8 * input.len() + 256, "{blocks} allocations");
    }
}

#[test]
fn dns_header_claiming_65535_questions_costs_no_more_than_its_size() {
    let policy = dns_policy();
    for (path, input) in corpus("dns").into_iter().chain(corpus("dns_upstream")) {
        if !path.to_string_lossy().contains("regress-huge") {
            continue;
        }
        let (_, bytes, _) = measure(|| {
            let _ = dns_message::plan(&input, &policy, &[]);
            let _ = dns_message::upstream_answer(
                &input,
                &Message::new(0, MessageType::Query, OpCode::Query),
                0,
            );
        });
        assert!(
            bytes < 4096,
            "{bytes} bytes allocated for {}",
            path.display()
        );
    }
}

/// Upstream answers sent as if they were queries (with QR cleared): many
/// records, compression pointers, a CNAME loop.
fn inputs_upstream_as_queries() -> Vec<Vec<u8>> {
    corpus("dns_upstream")
        .into_iter()
        .map(|(_, mut b)| {
            if b.len() > 2 {
                b[2] &= 0x7f;
            }
            b
        })
        .collect()
}

#[test]
fn generated_queries_get_exactly_the_static_answers_or_refused() {
    let policy = dns_policy();
    let mut rng = rng(8);
    let names = [
        "origin.test",
        "pypi.org",
        "files.pythonhosted.org",
        "evil.example",
        "test",
    ];
    for _ in 0..2_000 {
        let plain = *names.choose(&mut rng).unwrap();
        // 0x20 randomisation: the case of each letter at random.
        let asked: String = plain
            .chars()
            .map(|c| match rng.random_bool(0.5) {
                true => c.to_ascii_uppercase(),
                false => c,
            })
            .collect();
        let qtype = *[RecordType::A, RecordType::AAAA, RecordType::TXT]
            .choose(&mut rng)
            .unwrap();
        let id = rng.random::<u16>();
        let mut msg = Message::new(id, MessageType::Query, OpCode::Query);
        msg.add_query(Query::query(
            Name::from_ascii(format!("{asked}.")).unwrap(),
            qtype,
        ));
        if rng.random_bool(0.5) {
            msg.edns = Some(Edns::new());
        }
        let query = msg.to_vec().unwrap();
        let plan = dns_message::plan(&query, &policy, &[]);
        let Action::Reply(bytes) = plan.action else {
            panic!("{plain}: not answered at once");
        };
        let reply = Message::from_vec(&bytes).unwrap();
        assert_eq!(reply.metadata.id, id);
        assert_eq!(reply.edns.is_some(), msg.edns.is_some());
        let answered: Vec<IpAddr> = reply
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect();
        let want: Vec<IpAddr> = policy
            .dns()
            .hosts
            .get(plain)
            .into_iter()
            .flatten()
            .copied()
            .filter(|ip| match qtype {
                RecordType::A => ip.is_ipv4(),
                RecordType::AAAA => ip.is_ipv6(),
                _ => false,
            })
            .collect();
        let code = reply.metadata.response_code;
        match plain {
            "origin.test" | "pypi.org" => {
                assert_eq!((code, &answered), (ResponseCode::NoError, &want), "{asked}")
            }
            // Admitted but in no static entry, and `upstream: []`.
            "files.pythonhosted.org" => assert_eq!(code, ResponseCode::NXDomain),
            _ => assert_eq!(
                (code, answered.len()),
                (ResponseCode::Refused, 0),
                "{asked}"
            ),
        }
        harness::dns(&query);
    }
}

// ------------------------------------------------------------- policy ----

#[test]
fn policy_mutated_texts_keep_the_harness_invariants() {
    for input in inputs("policy", 9, 3_000) {
        harness::policy(&input);
    }
}

#[test]
fn policy_work_is_bounded_by_the_text() {
    let mut texts = inputs("policy", 10, 500);
    // An alias bomb (each level doubles) and deep nesting.
    let mut bomb = String::from("version: 1\nname: x\na0: &a0 [x, x]\n");
    for i in 1..30 {
        bomb.push_str(&format!("a{i}: &a{i} [*a{}, *a{}]\n", i - 1, i - 1));
    }
    bomb.push_str("rules: *a29\n");
    texts.push(bomb.into_bytes());
    texts.push(
        format!(
            "version: 1\nrules: {}{}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        )
        .into_bytes(),
    );
    texts.push(format!("version: 1\nrules: {}", "- ".repeat(10_000)).into_bytes());
    for text in texts {
        let text = String::from_utf8_lossy(&text).into_owned();
        let (_, bytes, _) = measure(|| {
            let _ = Policy::from_yaml(&text, "bounded.yaml");
        });
        let bound = 4096 * text.len() + 4 * 1024 * 1024;
        assert!(
            bytes <= bound,
            "{bytes} bytes allocated for {} bytes of text",
            text.len()
        );
    }
}

#[test]
fn generated_policies_load_as_written() {
    let mut rng = rng(11);
    for _ in 0..300 {
        let n = rng.random_range(1..6);
        let mut rules = String::new();
        let mut expect = Vec::new();
        for i in 0..n {
            let action = *["allow", "deny"].choose(&mut rng).unwrap();
            let cidr = format!(
                "198.{}.{}.0/24",
                rng.random_range(18..20),
                rng.random::<u8>()
            );
            let host = policy_hostname(&mut rng);
            let port = rng.random_range(1..=65535u16);
            rules.push_str(&format!(
                "  - name: r{i}\n    action: {action}\n    cidrs: [\"{cidr}\"]\n    hosts: [\"{host}\"]\n    ports: [{port}]\n"
            ));
            expect.push((format!("r{i}"), action, cidr, host, port));
        }
        let text = format!("version: 1\nname: gen\nrules:\n{rules}");
        let policy = Policy::from_yaml(&text, "gen.yaml").unwrap_or_else(|e| panic!("{e}\n{text}"));
        let got: Vec<(String, &str, String, String, u16)> = policy
            .rules()
            .iter()
            .map(|r| {
                (
                    r.name.to_string(),
                    r.action.as_str(),
                    r.cidrs[0].to_string(),
                    r.hosts[0].clone(),
                    r.ports[0].start,
                )
            })
            .collect();
        let want: Vec<(String, &str, String, String, u16)> = expect
            .iter()
            .map(|(n, a, c, h, p)| (n.clone(), *a, c.clone(), h.clone(), *p))
            .collect();
        assert_eq!(got, want);
        harness::policy(text.as_bytes());
    }
}

// ----------------------------------------------------------- manifest ----

#[test]
fn manifest_mutated_texts_keep_the_harness_invariants() {
    for input in inputs("manifest", 12, 5_000) {
        harness::manifest(&input);
    }
}

#[test]
fn generated_manifests_round_trip() {
    let mut rng = rng(13);
    for _ in 0..500 {
        let files: String = (0..rng.random_range(1..5))
            .map(|i| {
                let digest: [u8; 32] = rng.random();
                format!("  f{i}.yaml: {}\n", hex::encode(digest))
            })
            .collect();
        let year = rng.random_range(2000..2100);
        let text = format!(
            "name: {}\nrevision: {}\ncreated: {year}-01-02T03:04:05Z\nexpires: {}-01-02T03:04:05Z\nkey_id: k{}\nfiles:\n{files}",
            policy_hostname(&mut rng),
            rng.random::<u64>(),
            year + 1,
            rng.random::<u16>(),
        );
        let m = Manifest::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        assert_eq!(m.to_yaml(), text, "what is signed is what was read");
        harness::manifest(text.as_bytes());
    }
}

// ------------------------------------------------------------- bundle ----

/// A bundle signed with the development key (the one the harness trusts),
/// as .tar.gz bytes.
fn signed_bundle(policy: &str, revision: u64) -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b.tar.gz");
    let created = time::OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
    let expires = time::OffsetDateTime::from_unix_timestamp(2_000_000_000).unwrap();
    let key = root.join("bundles/dev-key.DEVELOPMENT-ONLY");
    sluice::bundle::sign_bytes(&key, policy, revision, created, expires, &out).unwrap();
    std::fs::read(out).unwrap()
}

fn verify(bytes: &[u8]) -> Result<sluice::bundle::VerifiedBundle, BundleError> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let trust = sluice::bundle::TrustStore::load(&root.join("bundles/dev-trust.yaml")).unwrap();
    let now = time::OffsetDateTime::from_unix_timestamp(1_893_456_000).unwrap();
    Bundle::from_tar_gz(bytes, Path::new("p.tar.gz"), &trust, now)
}

#[test]
fn bundle_seed_verifies_so_the_fuzzer_starts_from_a_signed_bundle() {
    let (_, bytes) = corpus("bundle")
        .into_iter()
        .find(|(p, _)| p.ends_with("dev.tar.gz"))
        .unwrap();
    assert!(verify(&bytes).is_ok());
}

#[test]
fn a_mutated_bundle_verifies_only_with_its_signed_content() {
    let policy =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/dev.yaml"))
            .unwrap();
    let signed = signed_bundle(&policy, 3);
    let original = verify(&signed).unwrap();
    let files = BundleFiles::from_tar_gz(&signed, Path::new("x")).unwrap();
    let tar = {
        let mut dec = flate2::read::GzDecoder::new(&signed[..]);
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut dec, &mut raw).unwrap();
        raw
    };
    let mut rng = rng(14);
    let mut accepted = 0;
    for i in 0..1_500 {
        // Mutate the compressed bytes, or the tar inside (then recompress).
        let bytes = if i % 2 == 0 {
            mutate(&mut rng, &signed, &tar)
        } else {
            let raw = mutate(&mut rng, &tar, policy.as_bytes());
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut enc, &raw).unwrap();
            enc.finish().unwrap()
        };
        if let Ok(v) = verify(&bytes) {
            accepted += 1;
            assert_eq!(v.digest, original.digest, "another manifest verified");
            assert_eq!(v.policy.rules(), original.policy.rules());
            let got = BundleFiles::from_tar_gz(&bytes, Path::new("x")).unwrap();
            assert_eq!(got.files, files.files, "verified with other files");
        }
        harness::bundle(&bytes);
    }
    // Mutations in the gzip header or tar padding leave the content alone;
    // they must not be the only thing this test ever sees.
    assert!(accepted < 1_500);
}

#[test]
fn bundle_gzip_bomb_is_refused_within_the_cap() {
    // 64 MiB of zeros in one tar entry compress to about 64 KiB.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut header = tar::Header::new_ustar();
    header.set_size(64 << 20);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_path("policy.yaml").unwrap();
    header.set_cksum();
    std::io::Write::write_all(&mut enc, header.as_bytes()).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..64 {
        std::io::Write::write_all(&mut enc, &zeros).unwrap();
    }
    let bomb = enc.finish().unwrap();
    drop(zeros);
    let (result, bytes, _) = measure(|| BundleFiles::from_tar_gz(&bomb, Path::new("bomb.tar.gz")));
    assert_eq!(result.unwrap_err().code(), "oversized");
    let cap = sluice::bundle::MAX_FILE_BYTES as usize;
    assert!(bytes <= 2 * cap, "{bytes} bytes allocated to refuse a bomb");

    // Many small entries whose sum passes the cap: the same refusal.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    for i in 0..40 {
        let mut header = tar::Header::new_ustar();
        header.set_size(1 << 20);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_path(format!("f{i}")).unwrap();
        header.set_cksum();
        std::io::Write::write_all(&mut enc, header.as_bytes()).unwrap();
        std::io::Write::write_all(&mut enc, &vec![0u8; 1 << 20]).unwrap();
    }
    let many = enc.finish().unwrap();
    let (result, bytes, _) = measure(|| BundleFiles::from_tar_gz(&many, Path::new("many.tar.gz")));
    assert!(result.is_err());
    let total = sluice::bundle::MAX_ARCHIVE_BYTES as usize;
    assert!(
        bytes <= 2 * total,
        "{bytes} bytes allocated to refuse many entries"
    );
}

#[test]
fn harness_targets_are_all_exercised_here() {
    // A new target must get its property test too.
    let this = include_str!("fuzz_properties.rs");
    for (target, _) in harness::TARGETS {
        assert!(
            this.contains(&format!("harness::{target}(")),
            "{target}: no property test"
        );
    }
}
