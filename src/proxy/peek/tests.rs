use super::*;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn client_hello(server: &str, sni: bool) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    config.enable_sni = sni;
    let name = rustls::pki_types::ServerName::try_from(server.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

/// Re-frame the handshake bytes of a one-record ClientHello into records
/// whose payloads end at each of `cuts` (offsets into the handshake).
fn reframe(hello: &[u8], cuts: &[usize]) -> Vec<u8> {
    let len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
    assert_eq!(hello.len(), 5 + len, "one record expected");
    let hs = &hello[5..];
    let mut out = Vec::new();
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&hs.len())) {
        let part = &hs[from..to];
        out.extend_from_slice(&[22, hello[1], hello[2]]);
        out.extend_from_slice(&(part.len() as u16).to_be_bytes());
        out.extend_from_slice(part);
        from = to;
    }
    out
}

/// Offset in the handshake bytes of the SNI host_name.
fn sni_offset(hello: &[u8], name: &str) -> usize {
    hello
        .windows(name.len())
        .position(|w| w == name.as_bytes())
        .unwrap()
        - 5
}

#[test]
fn tls_client_hello_yields_sni() {
    let hello = client_hello("pypi.org", true);
    assert_eq!(
        inspect(&hello),
        Peeked::Tls {
            sni: Some("pypi.org")
        }
    );
}

#[test]
fn tls_without_sni_yields_none() {
    let hello = client_hello("198.18.0.1", true); // IP names send no SNI
    assert_eq!(inspect(&hello), Peeked::Tls { sni: None });
    let hello = client_hello("pypi.org", false);
    assert_eq!(inspect(&hello), Peeked::Tls { sni: None });
}

#[test]
fn tls_one_byte_at_a_time_needs_more_until_complete() {
    let hello = client_hello("files.pythonhosted.org", true);
    for end in 1..hello.len() {
        assert_eq!(inspect(&hello[..end]), Peeked::NeedMore, "at {end}");
    }
    assert_eq!(
        inspect(&hello),
        Peeked::Tls {
            sni: Some("files.pythonhosted.org")
        }
    );
}

#[test]
fn tls_hello_split_across_records_is_reassembled() {
    let hello = client_hello("pypi.org", true);
    let hs_len = hello.len() - 5;
    // Cut inside the handshake header, then in the middle of the body
    // (but not inside the name: rustls orders extensions at random, so
    // the name's offset varies from one ClientHello to the next).
    let at = sni_offset(&hello, "pypi.org");
    let mut mid = hs_len / 2;
    if (at..=at + "pypi.org".len()).contains(&mid) {
        mid = at + "pypi.org".len() + 1;
    }
    let two = reframe(&hello, &[2, mid]);
    assert_eq!(
        inspect(&two),
        Peeked::Tls {
            sni: Some("pypi.org")
        }
    );
    for end in 1..two.len() {
        assert_eq!(inspect(&two[..end]), Peeked::NeedMore, "at {end}");
    }
    // One record per handshake byte.
    let cuts: Vec<usize> = (1..hs_len).collect();
    let many = reframe(&hello, &cuts);
    // The name straddles records: a server reassembles it, sluice does
    // not guess.
    assert_eq!(inspect(&many), Peeked::Unreadable { http: false });
    // A cut just before and just after the name keeps it whole.
    let around = reframe(&hello, &[at, at + "pypi.org".len()]);
    assert_eq!(
        inspect(&around),
        Peeked::Tls {
            sni: Some("pypi.org")
        }
    );
    // A cut inside the name makes it unreadable (denied).
    let inside = reframe(&hello, &[at + 3]);
    assert_eq!(inspect(&inside), Peeked::Unreadable { http: false });
}

#[test]
fn tls_trailing_application_bytes_are_ignored() {
    let mut hello = client_hello("pypi.org", true);
    hello.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
    assert_eq!(
        inspect(&hello),
        Peeked::Tls {
            sni: Some("pypi.org")
        }
    );
}

#[test]
fn tls_record_of_other_type_mid_hello_is_malformed() {
    let hello = client_hello("pypi.org", true);
    let mut two = reframe(&hello, &[10]);
    let second = 5 + 10;
    two[second] = 23;
    assert_eq!(inspect(&two), Peeked::Unreadable { http: false });
}

#[test]
fn tls_truncated_or_lying_lengths_are_rejected() {
    let hello = client_hello("pypi.org", true);
    // Handshake length larger than 16 KiB.
    let mut huge = hello.clone();
    huge[6..9].copy_from_slice(&[0x01, 0x00, 0x00]);
    assert_eq!(inspect(&huge), Peeked::Unreadable { http: false });
    // Record length 0 or beyond 2^14.
    let mut zero = hello.clone();
    zero[3..5].copy_from_slice(&[0, 0]);
    assert_eq!(inspect(&zero), Peeked::Other);
    let mut big = hello.clone();
    big[3..5].copy_from_slice(&[0x40, 0x01]);
    assert_eq!(inspect(&big), Peeked::Other);
    // Handshake length shorter than the real body: extension lengths lie.
    let mut short = hello.clone();
    let real = usize::from(hello[7]) << 8 | usize::from(hello[8]);
    short[7..9].copy_from_slice(&((real - 20) as u16).to_be_bytes());
    assert_eq!(inspect(&short), Peeked::Unreadable { http: false });
    // Not a ClientHello.
    let mut server_hello = hello.clone();
    server_hello[5] = 2;
    assert_eq!(inspect(&server_hello), Peeked::Other);
}

#[test]
fn tls_invalid_hostname_is_unreadable() {
    for bad in ["a..b", "-x_y.com", ".lead", "sp ace.test"] {
        // Same length as "pypi.org.test" so lengths stay right.
        let hello = client_hello("pypi.org.test", true);
        let at = sni_offset(&hello, "pypi.org.test") + 5;
        let mut mutated = hello.clone();
        let mut name = bad.as_bytes().to_vec();
        name.resize(13, b'x');
        mutated[at..at + 13].copy_from_slice(&name);
        assert_eq!(
            inspect(&mutated),
            Peeked::Unreadable { http: false },
            "{bad}"
        );
    }
}

#[test]
fn hostname_validation() {
    assert_eq!(valid_hostname(b"Example.COM."), Some("Example.COM"));
    assert_eq!(valid_hostname(b"a-1.b"), Some("a-1.b"));
    assert_eq!(valid_hostname(b""), None);
    assert_eq!(valid_hostname(b"."), None);
    assert_eq!(valid_hostname(b"a..b"), None);
    assert_eq!(valid_hostname(b"a_b.c"), None);
    assert_eq!(valid_hostname(&[b'a'; 64]), None);
    let long = [&b"abcdefghi."[..]; 26].concat(); // 260 bytes
    assert_eq!(valid_hostname(&long), None);
}

#[test]
fn not_tls_or_http_is_other_at_once() {
    assert_eq!(inspect(b""), Peeked::NeedMore);
    assert_eq!(inspect(b"\x00"), Peeked::Other);
    assert_eq!(inspect(b"SSH-2.0-OpenSSH\r\n"), Peeked::Other);
    assert_eq!(inspect(b"get / HTTP/1.1\r\n"), Peeked::Other);
    assert_eq!(inspect(b"\x16\x02"), Peeked::Other);
    assert_eq!(inspect(b"\x16"), Peeked::NeedMore);
    assert_eq!(inspect(b"\x16\x03\x01"), Peeked::NeedMore);
    assert_eq!(inspect(b"\x80\x2e\x01\x03\x01"), Peeked::Other);
}

#[test]
fn http_host_header_without_port() {
    let req = b"GET /simple/ HTTP/1.1\r\nUser-Agent: x\r\nHost: pypi.org:8080\r\n\r\n";
    assert_eq!(
        inspect(req),
        Peeked::Http {
            host: Some("pypi.org")
        }
    );
}

#[test]
fn http_host_header_plain_lowercase_name_and_whitespace() {
    let req = b"POST /x HTTP/1.1\r\nhost: \t Origin.Test. \r\ncontent-length: 3\r\n\r\nabc";
    assert_eq!(
        inspect(req),
        Peeked::Http {
            host: Some("Origin.Test")
        }
    );
    let req = b"HEAD / HTTP/1.0\nHOST: origin.test\n\n";
    assert_eq!(
        inspect(req),
        Peeked::Http {
            host: Some("origin.test")
        }
    );
}

#[test]
fn http_ipv6_literal_host_loses_brackets() {
    let req = b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\n\r\n";
    assert_eq!(
        inspect(req),
        Peeked::Http {
            host: Some("2001:db8::1")
        }
    );
    let req = b"GET / HTTP/1.1\r\nHost: [2001:db8::1]\r\n\r\n";
    assert_eq!(
        inspect(req),
        Peeked::Http {
            host: Some("2001:db8::1")
        }
    );
    let req = b"GET / HTTP/1.1\r\nHost: [2001:db8::1\r\n\r\n";
    assert_eq!(inspect(req), Peeked::Unreadable { http: true });
}

#[test]
fn http_connect_uses_request_target() {
    for req in [
        &b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n"[..],
        b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: PyPI.org:443\r\n\r\n",
    ] {
        assert_eq!(
            inspect(req),
            Peeked::Http {
                host: Some("pypi.org")
            }
        );
    }
    let other = b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: other.test\r\n\r\n";
    assert_eq!(inspect(other), Peeked::Unreadable { http: true });
}

#[test]
fn http_absolute_form_target_names_the_host_whatever_its_scheme() {
    for req in [
        &b"GET http://user@pypi.org:80/x HTTP/1.1\r\n\r\n"[..],
        b"GET http://pypi.org/x HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
        b"GET ftp://pypi.org/x HTTP/1.1\r\n\r\n",
        b"GET svn+ssh://pypi.org HTTP/1.1\r\n\r\n",
    ] {
        assert_eq!(
            inspect(req),
            Peeked::Http {
                host: Some("pypi.org")
            },
            "{}",
            String::from_utf8_lossy(req)
        );
    }
    // A URL in an origin-form target's query is not an authority.
    let req = b"GET /go?to=http://other.test/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n";
    assert_eq!(
        inspect(req),
        Peeked::Http {
            host: Some("pypi.org")
        }
    );
}

#[test]
fn http_absolute_form_target_and_host_header_that_differ_are_unreadable() {
    let req = b"GET http://pypi.org/x HTTP/1.1\r\nHost: other.test\r\n\r\n";
    assert_eq!(inspect(req), Peeked::Unreadable { http: true });
    let req = b"GET http://pypi.org:x/ HTTP/1.1\r\n\r\n";
    assert_eq!(inspect(req), Peeked::Unreadable { http: true });
}

#[test]
fn http_missing_or_empty_host_is_none() {
    let req = b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n";
    assert_eq!(inspect(req), Peeked::Http { host: None });
    let req = b"GET / HTTP/1.1\r\nHost: \r\n\r\n";
    assert_eq!(inspect(req), Peeked::Http { host: None });
}

#[test]
fn http_duplicate_or_invalid_host_is_unreadable() {
    for req in [
        &b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a.test\r\nhost: a.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test:x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test:123456\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a_b.test\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test b.test\r\n\r\n",
    ] {
        assert_eq!(
            inspect(req),
            Peeked::Unreadable { http: true },
            "{}",
            String::from_utf8_lossy(req)
        );
    }
}

#[test]
fn http_blank_lines_before_the_request_line_are_skipped() {
    let req = b"\r\n\r\nGET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n";
    assert_eq!(
        inspect(req),
        Peeked::Http {
            host: Some("pypi.org")
        }
    );
    assert_eq!(inspect(b"\r\n"), Peeked::NeedMore);
    assert_eq!(inspect(b"\n\nGE"), Peeked::NeedMore);
    assert_eq!(inspect(b"\r\nSSH-2.0"), Peeked::Other);
    assert_eq!(inspect(b"\r\n\x16\x03"), Peeked::Other);
}

#[test]
fn http_partial_head_needs_more() {
    let req: &[u8] = b"DELETE /a HTTP/1.1\r\nHost: pypi.org\r\n\r\n";
    for end in 1..req.len() {
        assert_eq!(inspect(&req[..end]), Peeked::NeedMore, "at {end}");
    }
    assert_eq!(
        inspect(req),
        Peeked::Http {
            host: Some("pypi.org")
        }
    );
}

#[test]
fn http_invalid_is_other() {
    assert_eq!(inspect(b"GETX / HTTP/1.1\r\n\r\n"), Peeked::Other);
    assert_eq!(inspect(b"FETCH /"), Peeked::Other);
    assert_eq!(inspect(b"GET /\r\n\r\n"), Peeked::Other);
    assert_eq!(inspect(b"GET / HTTP/2.0\r\n\r\n"), Peeked::Other);
    assert_eq!(inspect(b"GET  / HTTP/1.1\r\n\r\n"), Peeked::Other);
    let folded = b"GET / HTTP/1.1\r\nHost: a.test\r\n b.test\r\n\r\n";
    assert_eq!(inspect(folded), Peeked::Other);
    let no_colon = b"GET / HTTP/1.1\r\nHost a.test\r\n\r\n";
    assert_eq!(inspect(no_colon), Peeked::Other);
}

#[test]
fn hostile_inputs_never_panic() {
    // Seeded, so a failure reproduces.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    let hello = client_hello("pypi.org", true);
    let split = reframe(&hello, &[3, 40, 100]);
    let seeds: [&[u8]; 4] = [
        &hello,
        &split,
        b"GET http://a.test/ HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
        b"CONNECT a.test:443 HTTP/1.1\r\n\r\n",
    ];
    for i in 0..20_000 {
        let seed = seeds[i % seeds.len()];
        let mut input = seed.to_vec();
        match rng.random_range(0..4) {
            0 => {
                for _ in 0..=rng.random_range(0..8) {
                    let at = rng.random_range(0..input.len());
                    input[at] = rng.random::<u8>();
                }
            }
            1 => input.truncate(rng.random_range(0..=input.len())),
            2 => {
                let at = rng.random_range(0..input.len());
                input.insert(at, rng.random::<u8>());
            }
            _ => {
                let n = rng.random_range(0..64);
                input = (0..n).map(|_| rng.random::<u8>()).collect();
                if n > 0 && rng.random_bool(0.5) {
                    input[0] = TLS_HANDSHAKE;
                }
            }
        }
        let _ = inspect(&input);
    }
}
