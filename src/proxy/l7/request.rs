//! One request on a terminated connection, as hyper's service: decided
//! under the connection's rule (its Host against the verified name, its
//! framing and upgrade, its method and path, the placeholders in its
//! target and headers), then, once the origin's certificate verified for
//! the name, given the rule's credentials, recorded, and sent to the
//! origin on the connection the requests share (made again if the origin
//! closed it). This file owns the order of those steps, the origin
//! connection, and every refusal's record and answer (a 403, or a 502 for
//! an origin that failed, that closes the connection).
//!
//! It never forwards a request it has not decided (one a check refuses in
//! audit mode is recorded and forwarded as it came), never injects before
//! the origin's certificate verified for the name (nor into a plain
//! connection's request, nor into one a check refused), audits every check
//! that fails before it answers, and never writes a secret's value
//! anywhere but the request's header: its records name the secret, never
//! the value.

use std::sync::{Arc, OnceLock};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderName, HeaderValue, CONNECTION, HOST, UPGRADE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::check::{contains, host_header_names, is_certificate_error};
use super::io::scanned;
use super::{BoxError, ProxyBody, Scope, Shared};
use crate::audit::RequestFields;
use crate::bundle::ActivePolicy;
use crate::outcome::{
    Cause, DenyReason, Outcome, Refusal, RequestDenial, UpstreamFailure, Verdict,
};
use crate::policy::{Mode, Reason, RequestReason, Rule};
use crate::proxy::connection::denial_text;
use crate::proxy::upstream::connect_upstream;
use crate::proxy::ProxyContext;

/// What one request needs of the sandbox, owned (hyper's service is
/// 'static).
#[derive(Clone)]
pub(super) struct RequestHandle {
    scope: Arc<Scope>,
    state: Arc<Shared>,
    policy: crate::bundle::PolicyHandle,
    audit: crate::audit::AuditLog,
    audit_allows: bool,
    path: crate::workload::WorkloadPath,
    connect_timeout: std::time::Duration,
}

impl RequestHandle {
    pub(super) fn of(ctx: &ProxyContext, scope: Arc<Scope>, state: Arc<Shared>) -> RequestHandle {
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
    pub(super) async fn answer(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
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
