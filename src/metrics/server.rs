//! The `/metrics` endpoint: GET /metrics in the Prometheus text format
//! (0.0.4), 404 for anything else. It runs in sluice's own namespace; the
//! caller binds the socket there (`bind`) before handing it over. sluice
//! serves it with [`serve_on_thread`]: gathering and encoding the registry
//! then happens on a thread of its own, never on the runtime that relays
//! connections (`sluice run`'s is a single thread).

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::task::JoinSet;

use crate::drain::Watch;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen for metrics on {addr}: {source}; pick a free address for --metrics (e.g. 127.0.0.1:9464)")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("metrics listener failed: {0}")]
    Accept(std::io::Error),
}

/// Bind the metrics listener (non-blocking, ready for `serve_listener`).
/// Call it in the namespace the endpoint must live in.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ServeError> {
    let bind_err = |source| ServeError::Bind { addr, source };
    let listener = std::net::TcpListener::bind(addr).map_err(bind_err)?;
    listener.set_nonblocking(true).map_err(bind_err)?;
    Ok(listener)
}

/// Serve `registry` on an already-bound listener until the drain starts:
/// then stop accepting, let scrapes in flight finish and close idle
/// connections, and drop whatever is left at the drain's deadline (scrapes
/// are short and idempotent).
pub async fn serve_listener(
    listener: std::net::TcpListener,
    registry: Registry,
    drain: Watch,
) -> Result<(), ServeError> {
    listener.set_nonblocking(true).map_err(ServeError::Accept)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(ServeError::Accept)?;
    let mut conns = JoinSet::new();
    let draining = drain.draining();
    tokio::pin!(draining);
    loop {
        tokio::select! {
            _ = &mut draining => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(err) => {
                        // Out of descriptors and the like: pause, keep serving.
                        tracing::warn!(%err, "metrics accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let registry = registry.clone();
                let drain = drain.clone();
                conns.spawn(async move {
                    let service = service_fn(move |req| {
                        let registry = registry.clone();
                        async move { Ok::<_, Infallible>(respond(&req, &registry)) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        _ = drain.draining() => {
                            // Finish the scrape in flight, then close.
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let overdue = tokio::select! {
        _ = async { while conns.join_next().await.is_some() {} } => false,
        _ = drain.overdue() => true,
    };
    if overdue {
        conns.shutdown().await;
    }
    Ok(())
}

/// Serve `registry` on `listener` (as [`serve_listener`]) on a new thread
/// `sluice-metrics` with a runtime of its own. The returned future ends
/// when that thread does, after the drain; the thread itself never
/// outlives the drain's trigger.
pub(crate) fn serve_on_thread(
    listener: std::net::TcpListener,
    registry: Registry,
    drain: Watch,
) -> std::io::Result<impl std::future::Future<Output = Result<(), ServeError>>> {
    let (done, finished) = tokio::sync::oneshot::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("sluice-metrics".into())
        .spawn(move || {
            let result = runtime.block_on(serve_listener(listener, registry, drain));
            let _ = done.send(result);
        })?;
    Ok(async move {
        finished.await.unwrap_or_else(|_| {
            Err(ServeError::Accept(std::io::Error::other(
                "the metrics thread ended without a word",
            )))
        })
    })
}

fn respond(req: &Request<Incoming>, registry: &Registry) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found; metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    let (body, content_type) = render(registry);
    let mut response = Response::new(Full::new(Bytes::from(body)));
    if let Ok(v) = HeaderValue::from_str(&content_type) {
        response.headers_mut().insert(CONTENT_TYPE, v);
    }
    response
}

/// The registry in the text exposition format, and its content type.
pub fn render(registry: &Registry) -> (String, String) {
    let encoder = TextEncoder::new();
    let mut buf = Vec::with_capacity(8 * 1024);
    if let Err(err) = encoder.encode(&registry.gather(), &mut buf) {
        tracing::error!(%err, "cannot encode metrics");
    }
    (
        String::from_utf8(buf).unwrap_or_default(),
        encoder.format_type().to_string(),
    )
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response
}

impl crate::exit_class::Classified for ServeError {
    /// An address that cannot be listened on was the user's choice (--metrics).
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        match self {
            ServeError::Bind { .. } => crate::exit_class::ExitClass::BadInput,
            ServeError::Accept(_) => crate::exit_class::ExitClass::CannotEnforce,
        }
    }
}
