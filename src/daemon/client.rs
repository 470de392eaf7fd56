//! The control API's client, for `sluice oci-hook`, `sluice status` and
//! `sluice vm attach|detach --daemon`:
//! connect, send the opening byte (with the namespace descriptor for an
//! attach), then one HTTP/1.1 request with hyper. Blocking to its callers
//! (a small single-threaded runtime inside), bounded by a timeout.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;

use crate::sandbox_id::SandboxId;

use super::api::{
    AttachRequest, ErrorBody, Fence, SandboxInfo, AUDIT, DEFAULT_SOCKET, SANDBOXES, SOCKET_ENV,
};
use super::fdpass::send_opening;

/// How long one request may take, attach included.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the sluice daemon at {}: {cause}; is `sluice daemon --config FILE` running (and is this the socket its config names)?", socket.display())]
    Connect {
        socket: PathBuf,
        cause: std::io::Error,
    },
    #[error("the sluice daemon refused: {message}")]
    Refused { status: u16, message: String },
    #[error("talking to the sluice daemon at {} failed: {message}", socket.display())]
    Protocol { socket: PathBuf, message: String },
    #[error("the sluice daemon at {} did not answer within {TIMEOUT:?}", socket.display())]
    Timeout { socket: PathBuf },
}

/// The socket to use: the given one, else $SLUICE_DAEMON_SOCKET, else the default.
pub(crate) fn socket_path(given: Option<&Path>) -> PathBuf {
    given
        .map(Path::to_path_buf)
        .or_else(|| {
            std::env::var_os(SOCKET_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET))
}

/// A client of one daemon socket.
pub struct Client {
    socket: PathBuf,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>) -> Client {
        Client {
            socket: socket.into(),
        }
    }

    /// Attach `netns` (the container's namespace) under `req`; returns once
    /// the daemon enforces it.
    pub fn attach(
        &self,
        req: &AttachRequest,
        netns: BorrowedFd<'_>,
    ) -> Result<SandboxInfo, ClientError> {
        let body = serde_json::to_vec(req).expect("serializable");
        let (status, body) = self.call(Method::POST, SANDBOXES.to_string(), body, Some(netns))?;
        self.decode(status, &body, StatusCode::CREATED)
    }

    /// Stop serving sandbox `id`; `Ok(None)` if none was attached. A VM's
    /// fence stays.
    pub fn detach(&self, id: &SandboxId) -> Result<Option<SandboxInfo>, ClientError> {
        self.delete(id, Fence::Keep)
    }

    /// Stop serving VM `id` and remove its tap's fence (`sluice vm detach
    /// --daemon`); `Ok(None)` if none was attached. A sandbox that is not a
    /// VM is refused (and stays attached).
    pub(crate) fn detach_removing_fence(
        &self,
        id: &SandboxId,
    ) -> Result<Option<SandboxInfo>, ClientError> {
        self.delete(id, Fence::Remove)
    }

    fn delete(&self, id: &SandboxId, fence: Fence) -> Result<Option<SandboxInfo>, ClientError> {
        let path = match fence.query() {
            "" => format!("{SANDBOXES}/{id}"),
            query => format!("{SANDBOXES}/{id}?{query}"),
        };
        let (status, body) = self.call(Method::DELETE, path, Vec::new(), None)?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        self.decode(status, &body, StatusCode::OK).map(Some)
    }

    /// Every attached sandbox.
    pub(crate) fn list(&self) -> Result<Vec<SandboxInfo>, ClientError> {
        let (status, body) = self.call(Method::GET, SANDBOXES.to_string(), Vec::new(), None)?;
        self.decode(status, &body, StatusCode::OK)
    }

    /// The head of the daemon's audit log.
    pub(crate) fn audit_head(&self) -> Result<crate::audit::AuditHead, ClientError> {
        let (status, body) = self.call(Method::GET, AUDIT.to_string(), Vec::new(), None)?;
        self.decode(status, &body, StatusCode::OK)
    }

    fn decode<T: serde::de::DeserializeOwned>(
        &self,
        status: StatusCode,
        body: &[u8],
        expected: StatusCode,
    ) -> Result<T, ClientError> {
        if status != expected {
            let message = serde_json::from_slice::<ErrorBody>(body)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(body).trim().to_string());
            return Err(ClientError::Refused {
                status: status.as_u16(),
                message,
            });
        }
        serde_json::from_slice(body).map_err(|e| self.protocol(format!("bad answer: {e}")))
    }

    fn protocol(&self, message: String) -> ClientError {
        ClientError::Protocol {
            socket: self.socket.clone(),
            message,
        }
    }

    fn call(
        &self,
        method: Method,
        path: String,
        body: Vec<u8>,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(StatusCode, Vec<u8>), ClientError> {
        let connect_err = |source| ClientError::Connect {
            socket: self.socket.clone(),
            cause: source,
        };
        let stream = std::os::unix::net::UnixStream::connect(&self.socket).map_err(connect_err)?;
        stream
            .set_write_timeout(Some(TIMEOUT))
            .map_err(connect_err)?;
        send_opening(stream.as_raw_fd(), fd).map_err(connect_err)?;
        stream.set_nonblocking(true).map_err(connect_err)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| self.protocol(format!("cannot start a runtime: {e}")))?;
        let exchange = async move {
            let stream = tokio::net::UnixStream::from_std(stream).map_err(|e| e.to_string())?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| e.to_string())?;
            let driver = tokio::spawn(conn);
            let request = Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, "sluice")
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)))
                .map_err(|e| e.to_string())?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes()
                .to_vec();
            drop(sender);
            driver.abort();
            Ok::<_, String>((status, body))
        };
        runtime
            .block_on(async { tokio::time::timeout(TIMEOUT, exchange).await })
            .map_err(|_| ClientError::Timeout {
                socket: self.socket.clone(),
            })?
            .map_err(|m| self.protocol(m))
    }
}

impl crate::exit_class::Classified for ClientError {
    /// No daemon: 4; a request it refused as bad (4xx): bad input; its own failure or a broken exchange: cannot enforce.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        match self {
            ClientError::Connect { .. } => crate::exit_class::ExitClass::NoDaemon,
            ClientError::Refused {
                status: 400..=499, ..
            } => crate::exit_class::ExitClass::BadInput,
            _ => crate::exit_class::ExitClass::CannotEnforce,
        }
    }
}
