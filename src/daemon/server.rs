//! The control socket: accept, check the peer is root, read the opening
//! byte (and the namespace descriptor it may carry), then serve HTTP/1.1
//! with hyper. Routes are in `api`.

use std::convert::Infallible;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinSet;

use super::api::ApiError;
use super::api::{AttachRequest, ErrorBody, Fence, AUDIT, FENCE_REMOVE, SANDBOXES};
use super::fdpass::{recv_opening, Opening};
use super::registry::Registry;
use crate::drain::Watch;

/// Largest request body accepted (an attach request is a few hundred bytes).
const MAX_BODY: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub(crate) enum SocketError {
    #[error("cannot create {}: {cause}", path.display())]
    Dir {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("another sluice daemon is already listening on {}: stop it first, or set another `socket` in the config", path.display())]
    InUse { path: PathBuf },
    #[error("cannot listen on {}: {cause}", path.display())]
    Bind {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// Bind the control socket at `path`, mode 0600. The directory is created
/// (0700) when missing; a stale socket left by a killed daemon is replaced,
/// a live one is not.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, SocketError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.exists()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| SocketError::Dir {
                path: dir.to_owned(),
                cause: source,
            })?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(SocketError::InUse {
                path: path.to_owned(),
            });
        }
        let _ = std::fs::remove_file(path);
    }
    let bind_err = |source| SocketError::Bind {
        path: path.to_owned(),
        cause: source,
    };
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(bind_err)?;
    Ok(listener)
}

/// Serve the control API on `listener` until the drain starts; requests
/// in flight then get until the drain's deadline.
pub(crate) async fn serve(listener: UnixListener, registry: Arc<Registry>, drain: Watch) {
    let mut conns = JoinSet::new();
    let draining = drain.draining();
    tokio::pin!(draining);
    loop {
        tokio::select! {
            _ = &mut draining => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    conns.spawn(connection(stream, registry.clone()));
                }
                Err(err) => {
                    tracing::warn!(%err, "control socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let overdue = tokio::select! {
        _ = async { while conns.join_next().await.is_some() {} } => false,
        _ = drain.overdue() => true,
    };
    if overdue {
        tracing::warn!(
            requests = conns.len(),
            "control requests still in flight at the shutdown deadline: dropped"
        );
        conns.shutdown().await;
    }
}

async fn connection(stream: UnixStream, registry: Arc<Registry>) {
    // Root only: the socket is 0600 too, this is the second lock.
    match nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials) {
        Ok(cred) if cred.uid() == 0 => {}
        Ok(cred) => {
            tracing::warn!(
                uid = cred.uid(),
                pid = cred.pid(),
                "control connection from a non-root peer refused"
            );
            return;
        }
        Err(err) => {
            tracing::warn!(%err, "cannot read the control peer's credentials");
            return;
        }
    }
    let opening = loop {
        if stream.readable().await.is_err() {
            return;
        }
        match stream.try_io(tokio::io::Interest::READABLE, || recv_opening(&stream)) {
            Ok(opening) => break opening,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(err) => {
                tracing::warn!(%err, "bad control connection opening");
                return;
            }
        }
    };
    let fd = match opening {
        Opening::Closed => return,
        Opening::Open(fd) => Arc::new(Mutex::new(fd)),
    };
    let service = service_fn(move |req| {
        let registry = registry.clone();
        let fd = fd.clone();
        async move { Ok::<_, Infallible>(route(req, &registry, &fd).await) }
    });
    if let Err(err) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(%err, "control connection ended with an error");
    }
}

async fn route(
    req: Request<Incoming>,
    registry: &Arc<Registry>,
    fd: &Mutex<Option<OwnedFd>>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let result = match (req.method().clone(), path.as_str()) {
        (Method::GET, SANDBOXES) => Ok((StatusCode::OK, json(&registry.list().await))),
        (Method::GET, AUDIT) => Ok((StatusCode::OK, json(&registry.audit_head()))),
        (Method::POST, SANDBOXES) => attach(req, registry, fd).await,
        (Method::DELETE, p) if p.starts_with(SANDBOXES) && p.len() > SANDBOXES.len() + 1 => {
            let id = p[SANDBOXES.len() + 1..].parse::<crate::sandbox_id::SandboxId>();
            match (id, Fence::from_query(req.uri().query())) {
                (Ok(id), Ok(fence)) => registry
                    .detach(&id, fence)
                    .await
                    .map(|info| (StatusCode::OK, json(&info))),
                (Err(bad), _) => Err(ApiError {
                    status: StatusCode::BAD_REQUEST,
                    message: bad.to_string(),
                }),
                (_, Err(message)) => Err(ApiError {
                    status: StatusCode::BAD_REQUEST,
                    message,
                }),
            }
        }
        _ => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "{} {path}: not an endpoint (GET/POST {SANDBOXES}, DELETE {SANDBOXES}/ID[?{FENCE_REMOVE}], GET {AUDIT})",
                req.method()
            ),
        }),
    };
    match result {
        Ok((status, body)) => respond(status, body),
        Err(err) => respond(err.status, json(&ErrorBody { error: err.message })),
    }
}

async fn attach(
    req: Request<Incoming>,
    registry: &Arc<Registry>,
    fd: &Mutex<Option<OwnedFd>>,
) -> Result<(StatusCode, Vec<u8>), ApiError> {
    let bad = |message: String| ApiError {
        status: StatusCode::BAD_REQUEST,
        message,
    };
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| bad(format!("cannot read the request: {e}")))?
        .to_bytes();
    let request: AttachRequest =
        serde_json::from_slice(&body).map_err(|e| bad(format!("bad attach request: {e}")))?;
    let fd = fd.lock().unwrap_or_else(|e| e.into_inner()).take().ok_or_else(|| {
        bad("an attach needs the namespace descriptor sent (SCM_RIGHTS) with the connection's first byte".into())
    })?;
    // Run to completion even if the client goes away mid-way (hyper drops
    // this future then): a half-done attach would leave a reserved id, or a
    // served sandbox outside the registry. Completed, it is released like any
    // other once the container's process is gone.
    let registry = registry.clone();
    let info = tokio::spawn(async move { registry.attach(request, fd).await })
        .await
        .map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("attach task failed: {e}"),
        })??;
    Ok((StatusCode::CREATED, json(&info)))
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    let mut body = serde_json::to_vec(value).unwrap_or_default();
    body.push(b'\n');
    body
}

fn respond(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

impl crate::exit_class::Classified for SocketError {
    /// Another daemon on the socket: pick another (bad input); the rest: the host.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        match self {
            SocketError::InUse { .. } => crate::exit_class::ExitClass::BadInput,
            _ => crate::exit_class::ExitClass::CannotEnforce,
        }
    }
}
