use super::*;

fn plan() -> Plan {
    Plan {
        conditions: vec![ConditionKind::Native, ConditionKind::Host],
        workloads: Workload::ALL.to_vec(),
        batches: 30,
        warmups: 3,
        conns: 256,
        threads: 8,
        seed: 1,
        image: "x".into(),
        build_missing: false,
    }
}

#[test]
fn a_plan_without_native_or_with_one_batch_is_refused() {
    assert!(plan().check().is_ok());
    let mut p = plan();
    p.conditions = vec![ConditionKind::Host];
    assert!(p.check().unwrap_err().to_string().contains("native"));
    let mut p = plan();
    p.batches = 1;
    assert!(p.check().is_err());
}

#[test]
fn a_deny_check_passes_only_when_blocked_and_the_control_works() {
    let probe = |reached, control_ok| Reply {
        deny: Some(client::DenyProbe {
            forbidden_reached: reached,
            forbidden: "reset".into(),
            control_ok,
            control: "HTTP 200".into(),
        }),
        ..Reply::default()
    };
    assert!(judge_deny(probe(false, true), false).passed);
    assert!(!judge_deny(probe(true, true), false).passed);
    assert!(!judge_deny(probe(false, true), true).passed);
    assert!(!judge_deny(probe(false, false), false).passed);
    assert!(!judge_deny(Reply::default(), false).passed);
}

#[test]
fn the_origin_counts_only_the_injected_header_with_the_secret() {
    let head = |h: &str| format!("GET /bytes/1024 HTTP/1.1\r\nHost: {L7_NAME}\r\n{h}\r\n\r\n");
    assert!(carries_injected_header(&head(&format!(
        "authorization: Bearer {L7_SECRET}"
    ))));
    assert!(!carries_injected_header(&head(
        "Authorization: Bearer other"
    )));
    assert!(!carries_injected_header(&head("X-Other: x")));
}

#[test]
fn an_l7_batch_whose_origin_missed_the_header_voids_the_run() {
    let reply = Reply {
        samples: vec![
            client::Sample {
                connect_us: 1,
                first_byte_us: 2,
                last_byte_us: 3,
                total_us: 4,
            };
            3
        ],
        ..Reply::default()
    };
    assert!(check_injected(ConditionKind::Host, &reply, 3).is_ok());
    let err = check_injected(ConditionKind::Haproxy, &reply, 2).unwrap_err();
    assert!(
        err.to_string()
            .contains("injected Authorization header on 2 of 3 requests"),
        "{err}"
    );
}

#[test]
fn the_same_seed_gives_the_same_condition_orders() {
    assert_eq!(round_orders(7, 10, 5), round_orders(7, 10, 5));
}

#[test]
fn every_round_runs_every_condition_once() {
    for order in round_orders(7, 10, 5) {
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, [0, 1, 2, 3, 4], "{order:?}");
    }
}

#[test]
fn the_condition_order_is_shuffled_afresh_every_round() {
    for seed in 0..20 {
        let orders = round_orders(seed, 4, 7);
        assert!(
            orders.windows(2).any(|w| w[0] != w[1]),
            "seed {seed}: {orders:?}"
        );
    }
}

/// A fetch of `len` bytes from a loopback origin, checked against
/// `expect_len` and the SHA-256 of `expected`.
fn fetch_checked_against(len: usize, expect_len: usize, expected: &[u8]) -> Reply {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || crate::testbed::origin::serve_http_forever(listener));
    client::execute(&client::Command::Fetch {
        url: format!("http://{addr}/bytes/{len}"),
        count: 3,
        threads: 1,
        expect_len,
        expect_sha256: hex::encode(ring::digest::digest(&ring::digest::SHA256, expected)),
        tls: None,
    })
}

#[test]
fn a_body_with_the_wrong_sha256_voids_the_run_instead_of_giving_a_sample() {
    let mut other = crate::testbed::pattern(1024);
    other[0] ^= 1;
    let reply = fetch_checked_against(1024, 1024, &other);
    assert_eq!((reply.failed, reply.mismatched), (0, 3), "{reply:?}");
    let err = checked_batch(ConditionKind::Host, Workload::Small, reply, None).unwrap_err();
    assert!(
        matches!(&err, BenchError::Content { condition: ConditionKind::Host, workload: "small", detail }
            if detail.starts_with("3 of the batch's bodies differ") && detail.contains("SHA-256")),
        "{err}"
    );
}

#[test]
fn a_body_of_the_wrong_length_voids_the_run_instead_of_giving_a_sample() {
    let reply = fetch_checked_against(1000, 1024, &crate::testbed::pattern(1024));
    let err = checked_batch(ConditionKind::Oci, Workload::Bulk1k, reply, None).unwrap_err();
    assert!(
        matches!(&err, BenchError::Content { condition: ConditionKind::Oci, detail, .. }
            if detail.contains("1000 bytes") && detail.contains("expected 1024 bytes")),
        "{err}"
    );
}

#[test]
fn bodies_that_match_give_a_batch() {
    let body = crate::testbed::pattern(1024);
    let reply = fetch_checked_against(1024, 1024, &body);
    let batch = checked_batch(ConditionKind::Host, Workload::Small, reply, Some(5)).unwrap();
    assert!(batch.ok(), "{batch:?}");
    assert_eq!(batch.reply.samples.len(), 3);
}
