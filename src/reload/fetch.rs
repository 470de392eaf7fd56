//! Fetching a bundle over HTTPS (hyper + rustls, roots configured
//! explicitly) with ETag / If-None-Match, long polling (`Prefer: wait=N`,
//! RFC 7240: a server that supports it holds the request until the bundle
//! changes or N seconds pass; any other server answers at once and is
//! polled), and the jittered intervals and backoff the poller waits.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::{ETAG, IF_NONE_MATCH};
use hyper::{Request, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::bundle::{BundleError, MAX_ARCHIVE_BYTES};

/// The system CA bundle used when `system_roots` is on.
pub(crate) const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// How a remote bundle is fetched and polled.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Extra trusted CA certificates (PEM), e.g. `--ca FILE`.
    pub ca_file: Option<PathBuf>,
    /// Also trust the system's CA bundle ([`SYSTEM_ROOTS`]).
    pub system_roots: bool,
    /// Time between polls while things work (default 30 s).
    pub interval: Duration,
    /// Longest wait between retries after failures (default 5 min).
    pub max_backoff: Duration,
    /// Limit for one whole request, connect to last byte (default 30 s);
    /// a long poll may take `long_poll` more.
    pub timeout: Duration,
    /// How long a server may hold a request that carries our ETag until
    /// the bundle changes (`Prefer: wait=N`; default 60 s, zero: never
    /// asked).
    pub long_poll: Duration,
}

impl Default for FetchConfig {
    fn default() -> FetchConfig {
        FetchConfig {
            ca_file: None,
            system_roots: true,
            interval: Duration::from_secs(30),
            max_backoff: Duration::from_secs(300),
            timeout: Duration::from_secs(30),
            long_poll: Duration::from_secs(60),
        }
    }
}

/// What one poll got.
pub(crate) enum Fetched {
    /// 304: the bundle behind our ETag has not changed.
    NotModified,
    /// 200 with the archive bytes.
    Body(Bytes),
}

/// An HTTPS client for one URL that remembers the last ETag.
pub(crate) struct Fetcher {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    url: String,
    uri: Uri,
    etag: Option<String>,
    timeout: Duration,
    long_poll: Duration,
    /// Whether the last answer said the server held the request
    /// (`Preference-Applied: wait`): then the next poll goes at once.
    held: bool,
}

impl Fetcher {
    pub(crate) fn new(url: &str, config: &FetchConfig) -> Result<Fetcher, BundleError> {
        let fail = |msg: String| BundleError::Fetch {
            url: url.to_string(),
            msg,
        };
        let uri: Uri = url
            .parse()
            .map_err(|e| fail(format!("not a valid URL: {e}")))?;
        if uri.scheme_str() != Some("https") {
            return Err(fail("only https:// URLs are fetched".into()));
        }
        let roots = roots(config).map_err(fail)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| fail(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(https);
        Ok(Fetcher {
            client,
            url: url.to_string(),
            uri,
            etag: None,
            timeout: config.timeout,
            long_poll: config.long_poll,
            held: false,
        })
    }

    /// Whether the server holds our requests until the bundle changes (it
    /// said so on its last answer): the poller then asks again at once
    /// instead of waiting its interval.
    pub(crate) fn server_holds(&self) -> bool {
        self.held
    }

    /// GET the bundle, with If-None-Match when an ETag is known.
    pub(crate) async fn fetch(&mut self) -> Result<Fetched, BundleError> {
        let limit = match self.long_polls() {
            true => self.timeout + self.long_poll,
            false => self.timeout,
        };
        self.held = false;
        match tokio::time::timeout(limit, self.fetch_inner()).await {
            Ok(result) => result,
            Err(_) => Err(self.fail(format!("no answer within {limit:?}"))),
        }
    }

    /// A long poll needs an ETag to wait on.
    fn long_polls(&self) -> bool {
        self.etag.is_some() && !self.long_poll.is_zero()
    }

    async fn fetch_inner(&mut self) -> Result<Fetched, BundleError> {
        let mut req = Request::get(self.uri.clone());
        if let Some(etag) = &self.etag {
            req = req.header(IF_NONE_MATCH, etag.as_str());
        }
        if self.long_polls() {
            req = req.header(
                "prefer",
                format!("wait={}", self.long_poll.as_secs().max(1)),
            );
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| self.fail(e.to_string()))?;
        let resp = self
            .client
            .request(req)
            .await
            .map_err(|e| self.fail(error_chain(&e)))?;
        self.held = resp
            .headers()
            .get_all("preference-applied")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|p| p.trim().starts_with("wait")));
        match resp.status() {
            StatusCode::NOT_MODIFIED => return Ok(Fetched::NotModified),
            StatusCode::OK => {}
            other => return Err(self.fail(format!("the server answered {other}"))),
        }
        let etag = resp
            .headers()
            .get(ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = Limited::new(resp.into_body(), MAX_ARCHIVE_BYTES as usize)
            .collect()
            .await
            .map_err(|e| {
                self.fail(format!(
                    "reading the body failed ({e}); a bundle is at most {MAX_ARCHIVE_BYTES} bytes"
                ))
            })?
            .to_bytes();
        // Remembered even if the bundle is then refused, so that an
        // unchanged bad bundle is not fetched and refused every interval.
        self.etag = etag;
        Ok(Fetched::Body(body))
    }

    fn fail(&self, msg: String) -> BundleError {
        BundleError::Fetch {
            url: self.url.clone(),
            msg,
        }
    }
}

fn roots(config: &FetchConfig) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    let mut add = |path: &std::path::Path| -> Result<(), String> {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("cannot read CA file {}: {e}", path.display()))?;
        for cert in certs {
            let cert = cert.map_err(|e| format!("bad PEM in {}: {e}", path.display()))?;
            // The system bundle may hold certificates rustls cannot use;
            // skipping them is what every client does.
            let _ = roots.add(cert);
        }
        Ok(())
    };
    if let Some(ca) = &config.ca_file {
        add(ca)?;
    }
    if config.system_roots && std::path::Path::new(SYSTEM_ROOTS).exists() {
        add(std::path::Path::new(SYSTEM_ROOTS))?;
    }
    if roots.is_empty() {
        return Err("no trusted CA certificates: pass --ca FILE (PEM)".into());
    }
    Ok(roots)
}

/// Every cause in an error chain, joined (hyper hides TLS errors a level or
/// two down).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The wait before retry number `failures` (1 = first failure): doubling
/// from `interval`, capped at `max`, with jitter in [half, full].
pub(crate) fn backoff(interval: Duration, max: Duration, failures: u32) -> Duration {
    let doubled = interval.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    let full = doubled.min(max).max(Duration::from_millis(1));
    let half = full / 2;
    let jitter = rand::rng().random_range(0..=full.as_millis() as u64 - half.as_millis() as u64);
    half + Duration::from_millis(jitter)
}

/// The poll interval, give or take a tenth at random, so that a fleet
/// started together does not poll together.
pub(crate) fn jittered(interval: Duration) -> Duration {
    let tenth = (interval.as_millis() / 10) as u64;
    let spread = rand::rng().random_range(0..=2 * tenth);
    (interval + Duration::from_millis(spread))
        .saturating_sub(Duration::from_millis(tenth))
        .max(Duration::from_millis(1))
}

/// How long a poller waits after a poll the server held: a moment, so that
/// a server answering at once while saying it held cannot make it spin.
pub(crate) fn after_held() -> Duration {
    Duration::from_millis(rand::rng().random_range(50..=250))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_poll_interval_is_jittered_by_a_tenth_either_way() {
        let i = Duration::from_secs(30);
        let seen: Vec<Duration> = (0..200).map(|_| jittered(i)).collect();
        assert!(seen
            .iter()
            .all(|d| *d >= Duration::from_secs(27) && *d <= Duration::from_secs(33)));
        assert!(seen.iter().any(|d| *d != seen[0]), "no jitter at all");
    }

    #[test]
    fn backoff_doubles_with_jitter_and_stays_under_the_cap() {
        let i = Duration::from_secs(1);
        let max = Duration::from_secs(10);
        for _ in 0..100 {
            let first = backoff(i, max, 1);
            assert!(first >= Duration::from_millis(500) && first <= i);
            let third = backoff(i, max, 3);
            assert!(third >= Duration::from_secs(2) && third <= Duration::from_secs(4));
            assert!(backoff(i, max, 40) <= max);
        }
    }
}
