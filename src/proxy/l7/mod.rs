//! Requests on a connection whose rule needs them (an `http` or `inject`
//! block): sluice terminates the client's TLS with a leaf of the sandbox
//! CA, decides every request on its own (the Host against the verified
//! name, the method and path against the rule, placeholders anywhere they
//! are not admitted), injects the rule's credentials into the requests it
//! admits, and forwards them with hyper over its own TLS connection to the
//! origin, whose certificate it verified for the name first.
//!
//! hyper parses and writes both sides: a hand-written parser is where
//! request smuggling lives, and a re-serialised request carries exactly the
//! framing hyper read. This module never relays a byte of a request it did
//! not decide, never injects before the origin's certificate verified for
//! the name, and never writes a secret's value anywhere but the request's
//! header (no log, no record).
//!
//! This file owns the connection: the client's TLS handshake (its SNI
//! against the decided name, a leaf for that name), hyper's server on it,
//! and what the connection leaves for its record. Each request is decided,
//! injected, recorded and sent in `request`; the client's bytes are
//! counted and request bodies scanned in `io`; the pure name and byte
//! checks are in `check`. It never serves a request on a connection whose
//! SNI names another host, or whose sandbox has no CA to terminate with:
//! such a connection, and one whose handshake fails, is refused and
//! audited, and nothing of it reaches the origin.

mod check;
mod io;
mod request;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use http_body_util::combinators::BoxBody;
use hyper::body::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::connection::audit_request;
use super::ProxyContext;
use crate::intercept::ca::SandboxCa;
use crate::outcome::{Cause, DenyReason, Outcome, RequestDenial, Verdict};
use crate::secret::SecretStore;

use check::same_name;
use io::{Counted, Counters, Prefixed};
use request::RequestHandle;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;

/// What a sandbox needs to terminate TLS: its CA, the origin side's TLS
/// client configuration, and the credentials its rules inject.
pub(crate) struct Interception {
    pub(crate) ca: Arc<SandboxCa>,
    pub(crate) upstream_tls: Arc<rustls::ClientConfig>,
    pub(crate) secrets: Arc<SecretStore>,
}

/// One connection to serve request by request.
pub(super) struct Terminated<'a> {
    pub(crate) ctx: &'a ProxyContext,
    pub(crate) peer: SocketAddr,
    pub(crate) dst: SocketAddr,
    /// The name the connection was decided on (its SNI, Host or resolved
    /// name): the only name its requests may address.
    pub(crate) host: String,
    /// The rule that admitted the connection.
    pub(crate) rule: Arc<str>,
    /// The client's first bytes, already read by the peek.
    pub(crate) first: Vec<u8>,
    /// They are a plain HTTP request head (else a TLS ClientHello).
    pub(crate) plain: bool,
}

/// How a terminated connection went, for its record.
#[derive(Default)]
pub(super) struct Served {
    /// The outcome that replaces the connection's allow (a refused
    /// request, a failed origin), if any.
    pub outcome: Option<Outcome>,
    pub connected: bool,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub(crate) first_byte_down: Option<std::time::Instant>,
}

/// Serve `client` request by request until either side ends.
pub(super) async fn serve(client: TcpStream, conn: Terminated<'_>) -> Served {
    let counters = Arc::new(Counters::default());
    let client = Counted {
        inner: Prefixed {
            prefix: conn.first.clone(),
            at: 0,
            inner: client,
        },
        counters: counters.clone(),
    };
    let state = Arc::new(Shared {
        outcome: Mutex::new(None),
        connected: OnceLock::new(),
        upstream: tokio::sync::Mutex::new(None),
    });
    let Some(interception) = conn.ctx.interception.clone() else {
        // A rule that needs requests reached a sandbox that cannot
        // terminate (no CA: its starting policy had no such rule, so its
        // workload was given none to trust): refused, never relayed
        // undecided.
        tracing::warn!(
            rule = %conn.rule,
            "a rule needs requests decided and this sandbox has no CA (its starting policy terminated no TLS); restart the sandbox with this policy"
        );
        return Served {
            outcome: Some(audited_refusal(&conn, RequestDenial::NoInterception).await),
            ..Served::default()
        };
    };
    let scope = Arc::new(Scope {
        ctx_sandbox: conn.ctx.sandbox.clone(),
        peer: conn.peer,
        dst: conn.dst,
        host: conn.host.clone(),
        rule: conn.rule.clone(),
        plain: conn.plain,
        interception: interception.clone(),
    });
    let head_timeout = conn.ctx.policy.current().limits().request_head;
    let served = if conn.plain {
        serve_http(client, conn.ctx, scope, state.clone(), head_timeout).await
    } else {
        let acceptor =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), client);
        let start = match tokio::time::timeout(head_timeout, acceptor).await {
            Ok(Ok(start)) => start,
            // Not TLS after all, a ClientHello rustls refuses, or silence.
            _ => {
                return refuse_connection(&conn, counters, &state, RequestDenial::BadHandshake)
                    .await;
            }
        };
        let sni = start
            .client_hello()
            .server_name()
            .map(str::to_ascii_lowercase);
        if sni.as_deref().is_some_and(|s| !same_name(s, &conn.host)) {
            return refuse_connection(&conn, counters, &state, RequestDenial::HostMismatch).await;
        }
        // The leaf is minted (or taken from the cache) for the decided name;
        // the ClientHello's SNI, if any, is that name.
        let config = SandboxCa::server_config(&interception.ca, &conn.host);
        match tokio::time::timeout(head_timeout, start.into_stream(config)).await {
            Ok(Ok(tls)) => serve_http(tls, conn.ctx, scope, state.clone(), head_timeout).await,
            // A client that pins its certificates, or does not trust the
            // sandbox CA, gives up here: nothing reached the origin.
            _ => {
                return refuse_connection(&conn, counters, &state, RequestDenial::BadHandshake)
                    .await
            }
        }
    };
    finish(counters, &state, served)
}

/// The client's TLS handshake with sluice failed, or named another host
/// than the one decided: the connection is refused (`why`) and audited
/// before any request.
async fn refuse_connection(
    conn: &Terminated<'_>,
    counters: Arc<Counters>,
    state: &Shared,
    why: RequestDenial,
) -> Served {
    let outcome = audited_refusal(conn, why).await;
    finish(counters, state, Some(outcome))
}

fn finish(counters: Arc<Counters>, state: &Shared, served: Option<Outcome>) -> Served {
    let outcome = state.outcome().take().or(served);
    Served {
        outcome,
        connected: state.connected.get().is_some(),
        bytes_up: counters.up.load(Ordering::Relaxed),
        bytes_down: counters.down.load(Ordering::Relaxed),
        first_byte_down: counters.first_down.get().copied(),
    }
}

/// The outcome of a connection refused for `denial` under its rule.
fn refused(conn: &Terminated<'_>, denial: RequestDenial) -> Outcome {
    Outcome {
        verdict: Verdict::Deny,
        rule: Some(conn.rule.clone()),
        cause: Cause::Denied(DenyReason::L7(denial)),
    }
}

/// The connection refused for `denial` before any request, its audit
/// record written: its outcome.
async fn audited_refusal(conn: &Terminated<'_>, denial: RequestDenial) -> Outcome {
    let outcome = refused(conn, denial);
    audit_request(
        conn.ctx,
        conn.peer,
        conn.dst,
        &outcome,
        Some(conn.host.clone()),
        None,
    )
    .await;
    outcome
}

/// What every request of the connection shares.
struct Scope {
    ctx_sandbox: String,
    peer: SocketAddr,
    dst: SocketAddr,
    host: String,
    rule: Arc<str>,
    plain: bool,
    interception: Arc<Interception>,
}

/// What the requests of one connection leave for its record, and the
/// origin connection they share.
struct Shared {
    /// The last refusal (a refused request ends the connection).
    outcome: Mutex<Option<Outcome>>,
    connected: OnceLock<()>,
    upstream: tokio::sync::Mutex<Option<hyper::client::conn::http1::SendRequest<ProxyBody>>>,
}

impl Shared {
    /// The outcome slot. Held only to set or take a value, so a poisoned
    /// lock (a panic elsewhere while holding it) still holds a whole value:
    /// its record must not be lost to a second panic.
    fn outcome(&self) -> std::sync::MutexGuard<'_, Option<Outcome>> {
        self.outcome
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Serve HTTP/1.1 on `io` (the client's TLS stream, or its plain bytes).
/// Returns the outcome that replaces the connection's allow, if any.
async fn serve_http<I>(
    io: I,
    ctx: &ProxyContext,
    scope: Arc<Scope>,
    state: Arc<Shared>,
    head_timeout: std::time::Duration,
) -> Option<Outcome>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The service runs on this task; it borrows nothing of the context but
    // what it is handed (hyper's service must be 'static).
    let handle = RequestHandle::of(ctx, scope, state);
    let service = hyper::service::service_fn(move |req| {
        let handle = handle.clone();
        async move { Ok::<_, std::convert::Infallible>(handle.answer(req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades()
        .await;
    if let Err(err) = served {
        tracing::debug!(%err, "terminated connection ended");
    }
    None
}
