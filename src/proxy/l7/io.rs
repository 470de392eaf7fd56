//! The byte-level wrappers of a terminated connection: the client's
//! stream with the peek's first bytes put back in front of it
//! (`Prefixed`), its bytes counted both ways for the connection's record
//! (`Counted`), and a request body searched for placeholders on its way
//! to the origin (`Scanned`).
//!
//! They decide nothing, and never change, drop or reorder a byte they
//! pass: a body that carries a placeholder is cut with an error, so the
//! origin never receives it complete. They never see a secret's value:
//! the scan knows placeholders and secret names only.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::Request;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::check::contains;
use super::{BoxError, ProxyBody};

/// `req` with its body scanned on its way to the origin for the
/// `placeholders` it must not carry; the slot returned names the secret
/// of the first one found.
pub(super) fn scanned(
    req: Request<Incoming>,
    placeholders: Arc<Vec<(String, String)>>,
) -> (Request<ProxyBody>, Arc<OnceLock<String>>) {
    let misuse = Arc::new(OnceLock::new());
    let (parts, body) = req.into_parts();
    let body = Scanned {
        inner: body,
        placeholders,
        tail: Vec::new(),
        found: misuse.clone(),
    };
    (Request::from_parts(parts, body.boxed()), misuse)
}

/// A request body on its way to the origin, searched for placeholders:
/// one found ends the body with an error, so the origin never receives a
/// complete request carrying it. A placeholder split across frames is
/// found with the tail of the frame before.
struct Scanned {
    inner: Incoming,
    placeholders: Arc<Vec<(String, String)>>,
    tail: Vec<u8>,
    found: Arc<OnceLock<String>>,
}

impl Body for Scanned {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            Some(Ok(frame)) => frame,
        };
        if let Some(data) = frame.data_ref() {
            let longest = this
                .placeholders
                .iter()
                .map(|(_, p)| p.len())
                .max()
                .unwrap_or(0);
            let mut window = std::mem::take(&mut this.tail);
            window.extend_from_slice(data);
            for (secret, placeholder) in this.placeholders.iter() {
                if contains(&window, placeholder.as_bytes()) {
                    let _ = this.found.set(secret.clone());
                    return Poll::Ready(Some(Err("a placeholder in the request body".into())));
                }
            }
            let keep = longest.saturating_sub(1).min(window.len());
            this.tail = window[window.len() - keep..].to_vec();
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// The bytes the peek already read, then the socket.
pub(super) struct Prefixed<S> {
    pub(super) prefix: Vec<u8>,
    pub(super) at: usize,
    pub(super) inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.prefix.len() {
            let n = (this.prefix.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            if this.at == this.prefix.len() {
                this.prefix = Vec::new();
                this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Bytes to and from the client, for the connection's record.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) up: AtomicU64,
    pub(super) down: AtomicU64,
    pub(super) first_down: OnceLock<std::time::Instant>,
}

/// `inner`, its bytes counted into `counters` as they pass.
pub(super) struct Counted<S> {
    pub(super) inner: S,
    pub(super) counters: Arc<Counters>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        this.counters.up.fetch_add(n as u64, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            if n > 0 {
                let _ = this.counters.first_down.set(std::time::Instant::now());
            }
            this.counters.down.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
