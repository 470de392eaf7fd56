//! What the client does in every round, and what one batch of it is
//! summarised by. The published method's workloads plus what it lacked:
//!
//! - small: `--conns` fresh connections (256), `--threads` at once (8),
//!   1 KiB bodies, `Connection: close`; request time from connect start to
//!   the body's last byte; the batch statistic is the median of the batch.
//! - serial: the same one at a time.
//! - bulk: one 32 MiB body in 1 KiB origin writes, and one in 64 KiB writes.
//! - stream: [`STREAMS`] responses of ten 13-byte events 2 ms apart; the
//!   batch statistics are the median time to the first byte and to the last.
//! - tls: `--conns` fresh TLS connections one at a time, one 1 KiB GET
//!   each, to a name whose rule admits it by SNI: sluice relays the bytes.
//! - l7: the same to a name whose rule has an `http` block and injects a
//!   header: sluice terminates the TLS, decides the request, adds the
//!   credential and makes its own TLS connection to the origin. Request
//!   time includes the handshake(s), as for any client.
//!
//! Every body's length and SHA-256 are checked by the client after the
//! clock stopped; the expected digests are computed here, once.

use super::client::{Command, TlsFetch};
use super::{FORBIDDEN, L7_NAME, ORIGIN, TLS_NAME, TLS_ORIGIN};
use crate::testbed::pattern;

/// The bulk body size.
pub(crate) const BULK_BYTES: usize = 32 << 20;
/// Streams per batch.
pub(crate) const STREAMS: usize = 5;
/// The stream: events, bytes per event, ms between events.
pub(crate) const STREAM_EVENTS: usize = 10;
pub(crate) const STREAM_EVENT_BYTES: usize = 13;
pub(crate) const STREAM_GAP_MS: usize = 2;

/// One kind of request the client makes every round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    Small,
    Serial,
    Bulk1k,
    Bulk64k,
    Stream,
    Tls,
    L7,
}

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::Small,
        Workload::Serial,
        Workload::Bulk1k,
        Workload::Bulk64k,
        Workload::Stream,
        Workload::Tls,
        Workload::L7,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Small => "small",
            Workload::Serial => "serial",
            Workload::Bulk1k => "bulk-1k",
            Workload::Bulk64k => "bulk-64k",
            Workload::Stream => "stream",
            Workload::Tls => "tls",
            Workload::L7 => "l7",
        }
    }

    pub fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }

    /// One of the 32 MiB transfers.
    pub(crate) fn is_bulk(&self) -> bool {
        matches!(self, Workload::Bulk1k | Workload::Bulk64k)
    }

    /// What a batch of this workload is summarised by.
    pub(crate) fn metrics(self) -> &'static [Metric] {
        match self {
            Workload::Small => &[Metric::Small],
            Workload::Serial => &[Metric::Serial],
            Workload::Bulk1k => &[Metric::Bulk1k],
            Workload::Bulk64k => &[Metric::Bulk64k],
            Workload::Stream => &[Metric::StreamFirst, Metric::StreamLast],
            Workload::Tls => &[Metric::Tls],
            Workload::L7 => &[Metric::L7],
        }
    }
}

/// A batch statistic (microseconds), and the one per round that is no
/// workload's: the session's start plus exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Metric {
    Small,
    Serial,
    Bulk1k,
    Bulk64k,
    StreamFirst,
    StreamLast,
    Tls,
    L7,
    StartExit,
}

impl Metric {
    pub(crate) const ALL: [Metric; 9] = [
        Metric::Small,
        Metric::Serial,
        Metric::Bulk1k,
        Metric::Bulk64k,
        Metric::StreamFirst,
        Metric::StreamLast,
        Metric::Tls,
        Metric::L7,
        Metric::StartExit,
    ];

    /// Its name in paired.csv and batches.csv.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Metric::Small => "small",
            Metric::Serial => "serial",
            Metric::Bulk1k => "bulk-1k",
            Metric::Bulk64k => "bulk-64k",
            Metric::StreamFirst => "stream-first-byte",
            Metric::StreamLast => "stream-last-byte",
            Metric::Tls => "tls",
            Metric::L7 => "l7",
            Metric::StartExit => "start-exit",
        }
    }

    /// How the report names it.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Metric::Small => "small (8 threads), per-batch median",
            Metric::Serial => "serial (one at a time), per-batch median",
            Metric::Bulk1k => "32 MiB in 1 KiB writes",
            Metric::Bulk64k => "32 MiB in 64 KiB writes",
            Metric::StreamFirst => "stream, first byte",
            Metric::StreamLast => "stream, last byte",
            Metric::Tls => "tls (fresh TLS connections, relayed), per-batch median",
            Metric::L7 => {
                "l7 (fresh TLS connections, terminated, header injected), per-batch median"
            }
            Metric::StartExit => "session start + exit",
        }
    }

    /// The batch statistic of a batch's request samples: the median of the
    /// last-byte times (the first-byte times for a stream's first byte).
    pub(crate) fn of(self, samples: &[super::client::Sample]) -> Option<f64> {
        let pick = |s: &super::client::Sample| match self {
            Metric::StreamFirst => s.first_byte_us,
            _ => s.last_byte_us,
        };
        let v: Vec<f64> = samples.iter().map(|s| pick(s) as f64).collect();
        crate::timing::stats::median(&v)
    }
}

/// The commands of one round, built once per run (with their digests).
#[derive(Debug, Clone)]
pub(crate) struct Commands {
    pub(crate) workloads: Vec<(Workload, Command)>,
    /// The same plain workloads for the reference pair's client.
    pub(crate) reference: Vec<(Workload, Command)>,
    pub(crate) deny: Command,
}

impl Commands {
    /// The workloads `kind`'s client runs, with their commands.
    pub(crate) fn of(&self, kind: super::ConditionKind) -> &[(Workload, Command)] {
        if kind == super::ConditionKind::Reference {
            &self.reference
        } else {
            &self.workloads
        }
    }

    /// `ca_pem`: the CA of the TLS origin (and of haproxy's certificate),
    /// which every client trusts besides what its sandbox delivers.
    pub(crate) fn new(
        workloads: &[Workload],
        conns: usize,
        threads: usize,
        ca_pem: &str,
    ) -> Commands {
        let digest =
            |len: usize| hex::encode(ring::digest::digest(&ring::digest::SHA256, &pattern(len)));
        let small = digest(1024);
        let bulk = if workloads.iter().any(Workload::is_bulk) {
            digest(BULK_BYTES)
        } else {
            String::new()
        };
        let workloads = workloads
            .iter()
            .map(|&w| {
                let fetch = |path: String, count, threads, len: usize, sha: &str| Command::Fetch {
                    url: format!("http://{ORIGIN}{path}"),
                    count,
                    threads,
                    expect_len: len,
                    expect_sha256: sha.to_string(),
                    tls: None,
                };
                // By address (no name to resolve), with the name as SNI.
                let fetch_tls = |name: &str| Command::Fetch {
                    url: format!("https://{TLS_ORIGIN}/bytes/1024"),
                    count: conns,
                    threads: 1,
                    expect_len: 1024,
                    expect_sha256: small.clone(),
                    tls: Some(TlsFetch {
                        name: name.to_string(),
                        ca_pem: ca_pem.to_string(),
                    }),
                };
                let command = match w {
                    Workload::Small => fetch("/bytes/1024".into(), conns, threads, 1024, &small),
                    Workload::Serial => fetch("/bytes/1024".into(), conns, 1, 1024, &small),
                    Workload::Bulk1k | Workload::Bulk64k => {
                        let write = if w == Workload::Bulk1k { 1024 } else { 64 << 10 };
                        fetch(
                            format!("/bytes/{BULK_BYTES}?write={write}"),
                            1,
                            1,
                            BULK_BYTES,
                            &bulk,
                        )
                    }
                    Workload::Stream => {
                        let len = STREAM_EVENTS * STREAM_EVENT_BYTES;
                        fetch(
                            format!("/stream?events={STREAM_EVENTS}&size={STREAM_EVENT_BYTES}&gap_ms={STREAM_GAP_MS}"),
                            STREAMS,
                            1,
                            len,
                            &digest(len),
                        )
                    }
                    Workload::Tls => fetch_tls(TLS_NAME),
                    Workload::L7 => fetch_tls(L7_NAME),
                };
                (w, command)
            })
            .collect::<Vec<_>>();
        let reference = workloads
            .iter()
            .filter_map(|(w, command)| match command {
                Command::Fetch {
                    url,
                    count,
                    threads,
                    expect_len,
                    tls: None,
                    ..
                } if *w != Workload::Stream => Some((
                    *w,
                    Command::Reference {
                        addr: super::reference::REFERENCE_ORIGIN.to_string(),
                        path: url.strip_prefix(&format!("http://{ORIGIN}"))?.to_string(),
                        count: *count,
                        threads: *threads,
                        expect_len: *expect_len,
                    },
                )),
                _ => None,
            })
            .collect();
        Commands {
            workloads,
            reference,
            deny: Command::Deny {
                forbidden: FORBIDDEN.to_string(),
                allowed: format!("http://{ORIGIN}/"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::client::Sample;

    #[test]
    fn every_workload_asks_for_what_it_checks() {
        let commands = Commands::new(&Workload::ALL, 256, 8, "CA");
        assert_eq!(commands.workloads.len(), 7);
        for (w, c) in &commands.workloads {
            let Command::Fetch {
                url,
                count,
                threads,
                expect_len,
                tls,
                ..
            } = c
            else {
                panic!("{w:?} is not a fetch");
            };
            match w {
                Workload::Small => assert_eq!((*count, *threads, *expect_len), (256, 8, 1024)),
                Workload::Serial => assert_eq!((*count, *threads), (256, 1)),
                Workload::Bulk1k => assert!(url.ends_with("?write=1024")),
                Workload::Bulk64k => assert!(url.ends_with("?write=65536")),
                Workload::Stream => assert_eq!(*expect_len, 130),
                Workload::Tls | Workload::L7 => {
                    let tls = tls.as_ref().expect("a TLS fetch");
                    let name = if *w == Workload::Tls {
                        TLS_NAME
                    } else {
                        L7_NAME
                    };
                    assert_eq!((*count, *threads, tls.name.as_str()), (256, 1, name));
                    assert!(url.starts_with("https://"), "{url}");
                }
            }
            if !matches!(w, Workload::Tls | Workload::L7) {
                assert!(tls.is_none(), "{w:?}");
            }
        }
    }

    #[test]
    fn the_reference_pair_gets_the_plain_workloads_at_its_own_origin() {
        let commands = Commands::new(&Workload::ALL, 256, 8, "CA");
        let reference: Vec<Workload> = commands.reference.iter().map(|(w, _)| *w).collect();
        assert_eq!(
            reference,
            [
                Workload::Small,
                Workload::Serial,
                Workload::Bulk1k,
                Workload::Bulk64k
            ]
        );
        let Command::Reference {
            addr,
            path,
            count,
            threads,
            ..
        } = &commands.reference[0].1
        else {
            panic!("not a reference command");
        };
        assert_eq!(addr, super::super::reference::REFERENCE_ORIGIN);
        assert_eq!((path.as_str(), *count, *threads), ("/bytes/1024", 256, 8));
    }

    #[test]
    fn a_batch_is_summarised_by_the_median_of_its_requests() {
        let s = |first, last| Sample {
            connect_us: 1,
            first_byte_us: first,
            last_byte_us: last,
            total_us: last + 1,
        };
        let samples = [s(10, 100), s(20, 300), s(30, 200)];
        assert_eq!(Metric::Small.of(&samples), Some(200.0));
        assert_eq!(Metric::StreamFirst.of(&samples), Some(20.0));
        assert_eq!(Metric::Small.of(&[]), None);
    }
}
