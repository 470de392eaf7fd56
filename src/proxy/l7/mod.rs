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

mod check;
mod io;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderName, HeaderValue, CONNECTION, HOST, UPGRADE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::connection::{audit_request, denial_text};
use super::upstream::connect_upstream;
use super::ProxyContext;
use crate::audit::RequestFields;
use crate::bundle::ActivePolicy;
use crate::intercept::ca::SandboxCa;
use crate::outcome::{
    Cause, DenyReason, Outcome, Refusal, RequestDenial, UpstreamFailure, Verdict,
};
use crate::policy::{Mode, Reason, RequestReason, Rule};
use crate::secret::SecretStore;

use check::{contains, host_header_names, is_certificate_error, same_name};
use io::{scanned, Counted, Counters, Prefixed};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;

/// What a sandbox needs to terminate TLS: its CA, the origin side's TLS
/// client configuration, and the credentials its rules inject.
pub struct Interception {
    pub ca: Arc<SandboxCa>,
    pub upstream_tls: Arc<rustls::ClientConfig>,
    pub secrets: Arc<SecretStore>,
}

/// One connection to serve request by request.
pub(super) struct Terminated<'a> {
    pub ctx: &'a ProxyContext,
    pub peer: SocketAddr,
    pub dst: SocketAddr,
    /// The name the connection was decided on (its SNI, Host or resolved
    /// name): the only name its requests may address.
    pub host: String,
    /// The rule that admitted the connection.
    pub rule: Arc<str>,
    /// The client's first bytes, already read by the peek.
    pub first: Vec<u8>,
    /// They are a plain HTTP request head (else a TLS ClientHello).
    pub plain: bool,
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
    pub first_byte_down: Option<std::time::Instant>,
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
        return refused_connection(&conn, RequestDenial::NoInterception).await;
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
                return handshake_failed(&conn, counters, &state).await;
            }
        };
        let sni = start
            .client_hello()
            .server_name()
            .map(str::to_ascii_lowercase);
        if sni.as_deref().is_some_and(|s| !same_name(s, &conn.host)) {
            let outcome = refused(&conn, RequestDenial::HostMismatch);
            audit_request(
                conn.ctx,
                conn.peer,
                conn.dst,
                &outcome,
                Some(conn.host.clone()),
                None,
            )
            .await;
            return finish(counters, &state, Some(outcome));
        }
        // The leaf is minted (or taken from the cache) for the decided name;
        // the ClientHello's SNI, if any, is that name.
        let config = SandboxCa::server_config(&interception.ca, &conn.host);
        match tokio::time::timeout(head_timeout, start.into_stream(config)).await {
            Ok(Ok(tls)) => serve_http(tls, conn.ctx, scope, state.clone(), head_timeout).await,
            // A client that pins its certificates, or does not trust the
            // sandbox CA, gives up here: nothing reached the origin.
            _ => return handshake_failed(&conn, counters, &state).await,
        }
    };
    finish(counters, &state, served)
}

/// The client's TLS handshake with sluice failed: refused and audited.
async fn handshake_failed(
    conn: &Terminated<'_>,
    counters: Arc<Counters>,
    state: &Shared,
) -> Served {
    let outcome = refused(conn, RequestDenial::BadHandshake);
    audit_request(
        conn.ctx,
        conn.peer,
        conn.dst,
        &outcome,
        Some(conn.host.clone()),
        None,
    )
    .await;
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

async fn refused_connection(conn: &Terminated<'_>, denial: RequestDenial) -> Served {
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
    Served {
        outcome: Some(outcome),
        ..Served::default()
    }
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

/// What one request needs of the sandbox, owned (hyper's service is
/// 'static).
#[derive(Clone)]
struct RequestHandle {
    scope: Arc<Scope>,
    state: Arc<Shared>,
    policy: crate::bundle::PolicyHandle,
    audit: crate::audit::AuditLog,
    audit_allows: bool,
    path: crate::workload::WorkloadPath,
    connect_timeout: std::time::Duration,
}

impl RequestHandle {
    fn of(ctx: &ProxyContext, scope: Arc<Scope>, state: Arc<Shared>) -> RequestHandle {
        RequestHandle {
            scope,
            state,
            policy: ctx.policy.clone(),
            audit: ctx.audit.clone(),
            audit_allows: ctx.audit_allows,
            path: ctx.path,
            connect_timeout: ctx.limits.connect_timeout,
        }
    }

    /// Decide `req`, and answer it: forwarded, or refused with a 403 that
    /// names the rule and the reason (and closes the connection).
    async fn answer(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        let policy = self.policy.current();
        let mode = policy.mode();
        let fields = request_fields(&req);
        let injections = match self.decide(&req, &policy, mode, &fields).await {
            Ok(injections) => injections,
            Err(refused) => return refused,
        };
        let Some(rule) = policy.rule_named(&self.scope.rule) else {
            return self.refuse(self.outcome_of(Checked::Policy(Reason::NoRule), mode));
        };
        let placeholders = self.scan_targets(rule);
        let label = policy.label().to_string();
        drop(policy);

        // The origin first: nothing is injected before its certificate
        // verified for the name.
        let mut sender = self.state.upstream.lock().await;
        if let Err(denial) = self.ensure_origin(&mut sender).await {
            return self.origin_failed(denial, fields, &label).await;
        }
        self.inject(&mut req, injections, &fields, &label).await;
        if self.audit_allows {
            self.record_allowed(&fields, &label).await;
        }

        let upgrade = req
            .headers()
            .contains_key(UPGRADE)
            .then(|| hyper::upgrade::on(&mut req));
        let (req, misuse) = scanned(req, placeholders);
        let Some(s) = sender.as_mut() else {
            unreachable!("connected above")
        };
        let sent = s.send_request(req).await;
        drop(sender);
        let mut resp = match sent {
            Ok(resp) => resp,
            Err(err) => return self.send_failed(err, &misuse, fields, &label, mode).await,
        };
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            if let Some(client_side) = upgrade {
                splice_upgrade(client_side, &mut resp);
            }
        }
        resp.map(|b| b.map_err(BoxError::from).boxed())
    }

    /// Decide `req` under the connection's rule. `Ok` carries the headers
    /// to inject (none for a request that failed a check in audit mode);
    /// `Err` the refusal to answer with. Every failed check is audited
    /// here.
    async fn decide(
        &self,
        req: &Request<Incoming>,
        policy: &ActivePolicy,
        mode: Mode,
        fields: &RequestFields,
    ) -> Result<Vec<(String, HeaderName, HeaderValue)>, Response<ProxyBody>> {
        let rule = policy
            .rule_named(&self.scope.rule)
            .filter(|r| r.terminates());
        let checked = match rule {
            None => Err(Checked::Policy(Reason::NoRule)),
            Some(rule) => match self.check(req, rule) {
                Ok(injects) => self.render(injects).await,
                Err(why) => Err(why),
            },
        };
        match checked {
            Ok(injections) => Ok(injections),
            Err(why) => {
                let outcome = self.outcome_of(why, mode);
                self.record(&outcome, Some(fields.clone()), policy.label())
                    .await;
                if outcome.is_denied() {
                    return Err(self.refuse(outcome));
                }
                // Audit mode: forwarded as it came, never with a credential.
                Ok(Vec::new())
            }
        }
    }

    /// A ready origin connection in `sender`: the one there, or, if there
    /// is none or it closed (the origin ended its keep-alive), a new one.
    async fn ensure_origin(
        &self,
        sender: &mut Option<hyper::client::conn::http1::SendRequest<ProxyBody>>,
    ) -> Result<(), Connect> {
        if let Some(s) = sender.as_mut() {
            if s.ready().await.is_err() {
                *sender = None;
            }
        }
        if sender.is_none() {
            *sender = Some(self.connect().await?);
        }
        Ok(())
    }

    /// The origin could not be reached, or its certificate did not verify
    /// for the name: audited, the connection's outcome, and a 502 that
    /// closes it.
    async fn origin_failed(
        &self,
        denial: Connect,
        fields: RequestFields,
        label: &str,
    ) -> Response<ProxyBody> {
        let outcome = match denial {
            Connect::Failed(failure) => Outcome {
                verdict: Verdict::Allow,
                rule: Some(self.scope.rule.clone()),
                cause: Cause::Upstream(failure),
            },
            Connect::Certificate => self.outcome_of(
                Checked::Request(RequestDenial::UpstreamCertificate),
                Mode::Enforce,
            ),
        };
        self.record(&outcome, Some(fields), label).await;
        let status = StatusCode::BAD_GATEWAY;
        *self.state.outcome() = Some(outcome.clone());
        self.reply(status, &outcome, true)
    }

    /// Set the rendered headers on `req`, each injection audited. A header
    /// replaces whatever the workload sent under that name.
    async fn inject(
        &self,
        req: &mut Request<Incoming>,
        injections: Vec<(String, HeaderName, HeaderValue)>,
        fields: &RequestFields,
        label: &str,
    ) {
        for (secret, header, value) in injections {
            req.headers_mut().insert(header.clone(), value);
            let fields = RequestFields {
                secret: Some(secret),
                header: Some(header.as_str().to_string()),
                ..fields.clone()
            };
            let outcome = Outcome {
                verdict: Verdict::Allow,
                rule: Some(self.scope.rule.clone()),
                cause: Cause::Injected,
            };
            self.record(&outcome, Some(fields), label).await;
        }
    }

    /// The audit record of an allowed request (when allows are audited).
    async fn record_allowed(&self, fields: &RequestFields, label: &str) {
        let outcome = Outcome {
            verdict: Verdict::Allow,
            rule: Some(self.scope.rule.clone()),
            cause: Cause::Allowed,
        };
        self.record(&outcome, Some(fields.clone()), label).await;
    }

    /// The origin failed the request. If the body scan found a placeholder
    /// (and so cut the body), the request is refused for it, naming the
    /// secret; otherwise the origin reset it: a 502 that closes the
    /// connection.
    async fn send_failed(
        &self,
        err: hyper::Error,
        misuse: &OnceLock<String>,
        fields: RequestFields,
        label: &str,
        mode: Mode,
    ) -> Response<ProxyBody> {
        if let Some(secret) = misuse.get() {
            let outcome = self.outcome_of(Checked::Request(RequestDenial::SecretMisuse), mode);
            let fields = RequestFields {
                secret: Some(secret.clone()),
                ..fields
            };
            self.record(&outcome, Some(fields), label).await;
            return self.refuse(outcome);
        }
        tracing::debug!(%err, "the origin failed the request");
        let outcome = Outcome {
            verdict: Verdict::Allow,
            rule: Some(self.scope.rule.clone()),
            cause: Cause::Upstream(UpstreamFailure::Reset),
        };
        *self.state.outcome() = Some(outcome.clone());
        self.reply(StatusCode::BAD_GATEWAY, &outcome, true)
    }

    /// The checks of one request under `rule`: its Host, its method and
    /// path, the placeholders in its target and headers. `Ok` carries the
    /// headers to inject.
    fn check(
        &self,
        req: &Request<Incoming>,
        rule: &Rule,
    ) -> Result<Vec<crate::policy::Inject>, Checked> {
        // Only origin-form targets: an absolute-form or authority-form
        // target names a host of its own.
        let uri = req.uri();
        if uri.scheme().is_some() || uri.authority().is_some() {
            return Err(Checked::Request(RequestDenial::HostMismatch));
        }
        let mut hosts = req.headers().get_all(HOST).iter();
        let (Some(host), None) = (hosts.next(), hosts.next()) else {
            return Err(Checked::Request(RequestDenial::HostMismatch));
        };
        if !host_header_names(
            host,
            &self.scope.host,
            self.scope.dst.port(),
            self.scope.plain,
        ) {
            return Err(Checked::Request(RequestDenial::HostMismatch));
        }
        // hyper reads CL+TE as chunked and keeps both headers: an origin
        // that prefers Content-Length would read another request out of
        // the body. One framing, or none.
        let headers = req.headers();
        let lengths = headers
            .get_all(hyper::header::CONTENT_LENGTH)
            .iter()
            .count();
        let codings = headers
            .get_all(hyper::header::TRANSFER_ENCODING)
            .iter()
            .count();
        if lengths > 1 || (lengths > 0 && codings > 0) {
            return Err(Checked::Framing(Refusal::ConflictingLength));
        }
        if codings > 1
            || headers
                .get(hyper::header::TRANSFER_ENCODING)
                .is_some_and(|v| v != "chunked")
        {
            return Err(Checked::Framing(Refusal::BadTransferEncoding));
        }
        // WebSocket only: after any other upgrade (h2c above all) the bytes
        // would be requests sluice no longer decides.
        let upgrades: Vec<&HeaderValue> = headers.get_all(UPGRADE).iter().collect();
        if !upgrades.is_empty()
            && (upgrades.len() > 1 || !upgrades[0].as_bytes().eq_ignore_ascii_case(b"websocket"))
        {
            return Err(Checked::Framing(Refusal::Upgrade));
        }
        rule.admits_request(req.method().as_str(), uri.path())
            .map_err(Checked::Rule)?;
        // A placeholder in the target is never admitted; in a header, only
        // on a request of a rule that injects that secret.
        let target = uri.path_and_query().map(|p| p.as_str()).unwrap_or("");
        let injected: Vec<&str> = rule.inject.iter().flat_map(|i| i.value.secrets()).collect();
        for (secret, placeholder) in self.scope.interception.secrets.placeholders() {
            if contains(target.as_bytes(), placeholder.as_bytes()) {
                return Err(Checked::Request(RequestDenial::SecretMisuse));
            }
            let in_headers = req
                .headers()
                .values()
                .any(|v| contains(v.as_bytes(), placeholder.as_bytes()));
            if in_headers && !injected.contains(&secret) {
                return Err(Checked::Request(RequestDenial::SecretMisuse));
            }
        }
        if rule.inject.is_empty() {
            return Ok(Vec::new());
        }
        if self.scope.plain {
            // A credential only ever travels inside TLS to an origin whose
            // certificate verified for the name.
            return Err(Checked::Request(RequestDenial::InjectNeedsTls));
        }
        Ok(rule.inject.clone())
    }

    /// The headers `injects` set, with the secrets' current values. On a
    /// blocking thread: a command secret whose ttl passed is run again
    /// (up to its deadline), which must not hold up the sandbox's other
    /// connections.
    async fn render(
        &self,
        injects: Vec<crate::policy::Inject>,
    ) -> Result<Vec<(String, HeaderName, HeaderValue)>, Checked> {
        if injects.is_empty() {
            return Ok(Vec::new());
        }
        let secrets = self.scope.interception.secrets.clone();
        let rendered = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for inject in &injects {
                let name = HeaderName::from_bytes(inject.header.as_bytes()).ok()?;
                let value = inject.value.render(&|s| secrets.value(s))?;
                let mut value = HeaderValue::from_str(&value).ok()?;
                value.set_sensitive(true);
                let secret = inject
                    .value
                    .secrets()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                out.push((secret, name, value));
            }
            Some(out)
        })
        .await;
        match rendered {
            Ok(Some(out)) => Ok(out),
            _ => Err(Checked::Request(RequestDenial::SecretUnavailable)),
        }
    }

    /// The placeholders a request body of `rule` must not carry: all of
    /// them (a body is never where a credential goes).
    fn scan_targets(&self, _rule: &Rule) -> Arc<Vec<(String, String)>> {
        Arc::new(
            self.scope
                .interception
                .secrets
                .placeholders()
                .map(|(s, p)| (s.to_string(), p.to_string()))
                .collect(),
        )
    }

    /// A TLS (or, for a plain connection, TCP) connection to the origin
    /// with hyper's client on it. The certificate is verified for the
    /// connection's name against the configured roots.
    async fn connect(&self) -> Result<hyper::client::conn::http1::SendRequest<ProxyBody>, Connect> {
        let tcp = connect_upstream(self.scope.dst, self.connect_timeout)
            .await
            .map_err(|e| Connect::Failed(UpstreamFailure::of(&e)))?;
        let _ = self.state.connected.set(());
        if self.scope.plain {
            return handshake(tcp).await;
        }
        let name = rustls::pki_types::ServerName::try_from(self.scope.host.clone())
            .map_err(|_| Connect::Certificate)?;
        let connector =
            tokio_rustls::TlsConnector::from(self.scope.interception.upstream_tls.clone());
        let tls = match tokio::time::timeout(self.connect_timeout, connector.connect(name, tcp))
            .await
        {
            Ok(Ok(tls)) => tls,
            Ok(Err(err)) if is_certificate_error(&err) => {
                tracing::info!(host = %self.scope.host, %err, "the origin's certificate did not verify");
                return Err(Connect::Certificate);
            }
            Ok(Err(err)) => return Err(Connect::Failed(UpstreamFailure::of(&err))),
            Err(_) => return Err(Connect::Failed(UpstreamFailure::Timeout)),
        };
        handshake(tls).await
    }

    fn outcome_of(&self, why: Checked, mode: Mode) -> Outcome {
        let reason = match why {
            Checked::Policy(reason) => DenyReason::Policy(reason),
            Checked::Framing(refusal) => DenyReason::Request(refusal),
            Checked::Rule(RequestReason::Method) => DenyReason::L7(RequestDenial::HttpMethod),
            Checked::Rule(RequestReason::Path) => DenyReason::L7(RequestDenial::HttpPath),
            Checked::Request(denial) => DenyReason::L7(denial),
        };
        Outcome {
            verdict: Verdict::of(crate::policy::Verdict::Deny, mode),
            rule: Some(self.scope.rule.clone()),
            cause: Cause::Denied(reason),
        }
    }

    async fn record(&self, outcome: &Outcome, fields: Option<RequestFields>, label: &str) {
        let flow = crate::audit::Flow {
            sandbox: &self.scope.ctx_sandbox,
            path: self.path,
            src: self.scope.peer,
            dst: Some(self.scope.dst),
            bundle: label,
        };
        let mut event =
            crate::audit::AuditEvent::of_outcome(flow, outcome, Some(self.scope.host.clone()));
        event.request = fields;
        self.audit.record(event).await;
    }

    /// Refused: the connection's outcome from here on, and a 403 that
    /// closes it.
    fn refuse(&self, outcome: Outcome) -> Response<ProxyBody> {
        *self.state.outcome() = Some(outcome.clone());
        self.reply(StatusCode::FORBIDDEN, &outcome, true)
    }

    fn reply(&self, status: StatusCode, outcome: &Outcome, close: bool) -> Response<ProxyBody> {
        let body = denial_text(outcome);
        let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|n| match n {}).boxed());
        *resp.status_mut() = status;
        let headers = resp.headers_mut();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        if let Ok(reason) = HeaderValue::from_str(outcome.reason()) {
            headers.insert("x-sluice-reason", reason);
        }
        if close {
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// Why a request is refused, before it becomes an outcome.
enum Checked {
    Policy(Reason),
    Framing(Refusal),
    Rule(RequestReason),
    Request(RequestDenial),
}

/// What every audit record of `req` says of it.
fn request_fields(req: &Request<Incoming>) -> RequestFields {
    RequestFields {
        method: Some(req.method().as_str().to_string()),
        request_path: Some(req.uri().path().to_string()),
        secret: None,
        header: None,
    }
}

/// Splice the client's and the origin's upgraded connections (a WebSocket
/// the origin switched to) on a task of their own.
fn splice_upgrade(client_side: hyper::upgrade::OnUpgrade, resp: &mut Response<Incoming>) {
    let origin_side = hyper::upgrade::on(resp);
    tokio::spawn(async move {
        let (Ok(client), Ok(origin)) = tokio::join!(client_side, origin_side) else {
            return;
        };
        let (mut client, mut origin) = (TokioIo::new(client), TokioIo::new(origin));
        let _ = tokio::io::copy_bidirectional(&mut client, &mut origin).await;
    });
}

enum Connect {
    Failed(UpstreamFailure),
    Certificate,
}

async fn handshake<I>(io: I) -> Result<hyper::client::conn::http1::SendRequest<ProxyBody>, Connect>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|_| Connect::Failed(UpstreamFailure::Reset))?;
    tokio::spawn(async move {
        if let Err(err) = connection.with_upgrades().await {
            tracing::debug!(%err, "origin connection ended");
        }
    });
    Ok(sender)
}
