//! The bench client (`sluice bench-client`, hidden): the process that runs
//! inside each condition's sandbox (natively, as `sluice run`'s workload, in
//! a container, behind a peer proxy) and makes the requests. It speaks one
//! JSON object per line: it says it is ready, then reads a [`Command`] from
//! stdin and answers each with one [`Reply`] on stdout, until `quit` or the
//! end of its input.
//!
//! Every request is timed by the load client (`testbed::load`) from connect
//! start; bodies are checked against the length and SHA-256 the command
//! names only after the clock stopped. The client judges nothing beyond
//! that: whether a batch counts, or whether a deny check passed, is the
//! bench's call, made outside the sandbox. It never writes anything but its
//! replies to stdout.

use std::io::{BufRead, Read, Write};

use serde::{Deserialize, Serialize};

use crate::testbed::load::{self, connect};

/// What the bench asks the client to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub(crate) enum Command {
    /// `count` GETs of `url`, each on a fresh connection, `threads` in
    /// flight at once; each body must be `expect_len` bytes with SHA-256
    /// `expect_sha256` (hex).
    Fetch {
        url: String,
        count: usize,
        threads: usize,
        expect_len: usize,
        expect_sha256: String,
        /// For an https:// URL: the name to ask for and the CA to trust.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tls: Option<TlsFetch>,
    },
    /// The reference pair's client (`bench::reference`): `count` GETs of
    /// `path` at `addr`, fresh connections, `threads` at once, each body
    /// `expect_len` bytes (its length checked, not its digest).
    Reference {
        addr: String,
        path: String,
        count: usize,
        threads: usize,
        expect_len: usize,
    },
    /// A socket to `forbidden` (`addr:port`, a live service the policy
    /// forbids) and a GET of `allowed` (the control).
    Deny { forbidden: String, allowed: String },
    /// Exit.
    Quit,
}

/// An https:// fetch's name (SNI and Host) and the CA (PEM) the client
/// trusts, besides the bundle in `$SSL_CERT_FILE` when its sandbox set one
/// (`sluice run` does, with the sandbox CA in it, for a policy that
/// terminates TLS).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TlsFetch {
    pub(crate) name: String,
    pub(crate) ca_pem: String,
}

/// Bodies over this size get their buffers made ready before the clock
/// (`load::ready_buffers`).
const BIG_BODY: usize = 1 << 20;

/// The line a client prints first, once it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Ready {
    pub(crate) ready: bool,
}

/// One request's times, in microseconds from connect start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Sample {
    pub(crate) connect_us: u64,
    pub(crate) first_byte_us: u64,
    /// The body's last byte: what the bench calls the request time.
    pub(crate) last_byte_us: u64,
    /// The server's close.
    pub(crate) total_us: u64,
}

/// What one command gave.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Reply {
    /// The requests that succeeded (2xx), in completion order per thread.
    pub(crate) samples: Vec<Sample>,
    /// Requests that failed (no connection, an error, not 2xx).
    pub(crate) failed: usize,
    /// The first failure's line.
    pub(crate) first_failure: Option<String>,
    /// Successful requests whose body had the wrong length or digest, and
    /// the first such mismatch.
    pub(crate) mismatched: usize,
    pub(crate) first_mismatch: Option<String>,
    /// For `deny`: what each socket saw.
    pub(crate) deny: Option<DenyProbe>,
}

/// What the deny check's two sockets saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DenyProbe {
    /// Whether the forbidden service answered (its banner came back).
    pub(crate) forbidden_reached: bool,
    /// What happened to the forbidden socket, in one line.
    pub(crate) forbidden: String,
    /// Whether the control GET succeeded with the origin's greeting.
    pub(crate) control_ok: bool,
    pub(crate) control: String,
}

/// What the forbidden service says to anyone who reaches it.
pub(crate) const FORBIDDEN_BANNER: &[u8] = b"forbidden service reached\n";
/// What the origin's `/` answers.
pub(crate) const GREETING: &[u8] = b"hello from origin\n";

/// Run the client on stdin and stdout until `quit` or end of input.
pub(crate) fn main() -> i32 {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if say(&mut out, &Ready { ready: true }).is_err() {
        return 1;
    }
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { return 1 };
        let reply = match serde_json::from_str::<Command>(&line) {
            Ok(Command::Quit) => return 0,
            Ok(command) => execute(&command),
            Err(e) => Reply {
                failed: 1,
                first_failure: Some(format!("FAIL bench client: bad command {line:?}: {e}")),
                ..Reply::default()
            },
        };
        if say(&mut out, &reply).is_err() {
            return 1;
        }
    }
    0
}

fn say(out: &mut impl Write, what: &impl Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(what).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// Run one command (not `quit`).
pub(crate) fn execute(command: &Command) -> Reply {
    match command {
        Command::Fetch {
            url,
            count,
            threads,
            expect_len,
            expect_sha256,
            tls,
        } => fetch(
            url,
            *count,
            *threads,
            *expect_len,
            expect_sha256,
            tls.as_ref(),
        ),
        Command::Reference {
            addr,
            path,
            count,
            threads,
            expect_len,
        } => super::reference::fetch(addr, path, *count, *threads, *expect_len),
        Command::Deny { forbidden, allowed } => Reply {
            deny: Some(deny(forbidden, allowed)),
            ..Reply::default()
        },
        Command::Quit => Reply::default(),
    }
}

fn fetch(
    url: &str,
    count: usize,
    threads: usize,
    len: usize,
    sha256: &str,
    tls: Option<&TlsFetch>,
) -> Reply {
    let failed = |why: String| Reply {
        failed: count,
        first_failure: Some(why),
        ..Reply::default()
    };
    // Once per batch, before the clock: the trust store.
    let tls = match tls {
        None => None,
        Some(t) => {
            let delivered = std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
            match crate::testbed::tls::client_config(&t.ca_pem, delivered.as_deref()) {
                Ok(config) => Some(load::TlsTarget {
                    config,
                    name: t.name.clone(),
                }),
                Err(why) => return failed(format!("FAIL TLS trust: {why}")),
            }
        }
    };
    if len > BIG_BODY {
        // Before the clock: where each body will go.
        load::ready_buffers(count, len + 64 * 1024);
    }
    let batch = match load::fetch_many_with(url, count.max(1), threads.max(1), tls) {
        Ok(batch) => batch,
        Err(why) => return failed(why),
    };
    // The clock has stopped for every request: now the content check.
    let mut reply = Reply {
        failed: batch.failures,
        first_failure: batch.first_failure,
        ..Reply::default()
    };
    for f in &batch.fetched {
        let got = hex::encode(ring::digest::digest(&ring::digest::SHA256, &f.body));
        if f.body.len() != len || got != sha256 {
            reply.mismatched += 1;
            reply.first_mismatch.get_or_insert_with(|| {
                format!(
                    "{url}: {} bytes with SHA-256 {got}, expected {len} bytes with {sha256}",
                    f.body.len()
                )
            });
        }
        reply.samples.push(Sample {
            connect_us: f.connect_us,
            first_byte_us: f.first_byte_us,
            last_byte_us: f.last_byte_us,
            total_us: f.total_us,
        });
    }
    reply
}

fn deny(forbidden: &str, allowed: &str) -> DenyProbe {
    let (forbidden_reached, forbidden_line) = match connect(forbidden) {
        Err(why) => (false, why),
        Ok(mut stream) => {
            let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: forbidden\r\n\r\n");
            let mut back = Vec::new();
            let read = stream.read_to_end(&mut back);
            let reached = back
                .windows(FORBIDDEN_BANNER.len())
                .any(|w| w == FORBIDDEN_BANNER);
            let line = match read {
                Err(e) => format!("connected, then {e} after {} bytes", back.len()),
                Ok(_) => format!(
                    "connected, got {:?}",
                    String::from_utf8_lossy(&back[..back.len().min(80)])
                ),
            };
            (reached, line)
        }
    };
    let (control_ok, control) = match load::fetch(allowed) {
        Ok(f) => (
            f.is_success() && f.body == GREETING,
            format!("HTTP {} {} bytes", f.status, f.body.len()),
        ),
        Err(why) => (false, why),
    };
    DenyProbe {
        forbidden_reached,
        forbidden: forbidden_line,
        control_ok,
        control,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_replies_are_one_json_line_each() {
        let command = Command::Fetch {
            url: "http://198.18.0.1:8080/bytes/1024".into(),
            count: 256,
            threads: 8,
            expect_len: 1024,
            expect_sha256: "ab".into(),
            tls: None,
        };
        let line = serde_json::to_string(&command).unwrap();
        assert!(line.starts_with(r#"{"op":"fetch","#), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Command>(&line).unwrap(), command);
        let quit = serde_json::to_string(&Command::Quit).unwrap();
        assert_eq!(quit, r#"{"op":"quit"}"#);
        let reply = Reply {
            samples: vec![Sample {
                connect_us: 1,
                first_byte_us: 2,
                last_byte_us: 3,
                total_us: 4,
            }],
            ..Reply::default()
        };
        let back: Reply = serde_json::from_str(&serde_json::to_string(&reply).unwrap()).unwrap();
        assert_eq!(back, reply);
    }
}
