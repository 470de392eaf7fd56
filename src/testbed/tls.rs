//! TLS for the testbed: a throwaway CA that signs one server certificate
//! for some names, the fast origin served over rustls with it, and the
//! client side's configuration. The bench's `tls` and `l7` workloads use
//! it (and hand haproxy the same certificate).
//!
//! Nothing here is on sluice's path and nothing here is trusted outside
//! the testbed: the CA's key is dropped once the certificate is signed, and
//! the certificate's key lives in memory and in the bench's own temp dir.

use std::io::Read;
#[cfg(any(test, feature = "bench"))]
use std::io::Write;
#[cfg(any(test, feature = "bench"))]
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A fresh CA and the server certificate it signed.
pub struct TestPki {
    /// The CA's certificate: what a client trusts.
    pub ca_pem: String,
    /// The server certificate and its key, in PEM (haproxy's `crt` file is
    /// the two concatenated).
    pub cert_pem: String,
    // Read by the bench only.
    #[cfg_attr(not(feature = "bench"), allow(dead_code))]
    pub(crate) key_pem: String,
    cert: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl TestPki {
    /// A CA named `sluice testbed CA` and a certificate it signed for
    /// `names` (DNS names).
    pub fn issue(names: &[&str]) -> Result<TestPki, rcgen::Error> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sluice testbed CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca_params, &ca_key);
        let key = rcgen::KeyPair::generate()?;
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(TestPki {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert: cert.der().clone(),
            key_der: key.serialize_der(),
        })
    }

    /// The origin's rustls configuration: this certificate, HTTP/1.1.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![self.cert.clone()],
                PrivateKeyDer::Pkcs8(self.key_der.clone().into()),
            )?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Serve the fast origin over TLS on `listener` until it fails, a thread
/// per connection (as [`super::origin::serve_http_forever`]). Each
/// response ends with the TLS close_notify before the TCP close, so a
/// client reads a clean end.
#[cfg(test)]
pub(crate) fn serve_https_forever(listener: TcpListener, config: Arc<rustls::ServerConfig>) {
    serve_https_seeing(listener, config, Arc::new(|_: &str| {}));
}

/// `serve_https_forever`, giving `seen` every request head.
#[cfg(any(test, feature = "bench"))]
pub(crate) fn serve_https_seeing(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    seen: Arc<dyn Fn(&str) + Send + Sync>,
) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { break };
        let config = config.clone();
        let seen = seen.clone();
        std::thread::spawn(move || {
            let _ = stream.set_nodelay(true);
            let Ok(conn) = rustls::ServerConnection::new(config) else {
                return;
            };
            let mut tls = rustls::StreamOwned::new(conn, stream);
            super::origin::serve_http_on(&mut tls, &*seen);
            tls.conn.send_close_notify();
            let _ = tls.flush();
        });
    }
}

/// A client configuration trusting the certificates in `ca_pem` and, when
/// given, those in the file `extra` (a delivered bundle such as
/// `$SSL_CERT_FILE`). The error is one line.
pub fn client_config(
    ca_pem: &str,
    extra: Option<&Path>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let mut add = |pem: &[u8], from: &str| -> Result<(), String> {
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| format!("bad PEM in {from}: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("bad certificate in {from}: {e}"))?;
        }
        Ok(())
    };
    add(ca_pem.as_bytes(), "the CA given")?;
    if let Some(path) = extra {
        let mut pem = Vec::new();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(&mut pem))
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        add(&pem, &path.display().to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_trusting_the_ca_fetches_from_the_tls_origin_by_name() {
        let pki = TestPki::issue(&["origin.testbed.test"]).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let config = pki.server_config().unwrap();
        std::thread::spawn(move || serve_https_forever(listener, config));
        let tls = super::super::load::TlsTarget {
            config: client_config(&pki.ca_pem, None).unwrap(),
            name: "origin.testbed.test".into(),
        };
        let f = super::super::load::fetch_with(&format!("https://{addr}/bytes/3000"), Some(&tls))
            .unwrap();
        assert_eq!(f.status, 200);
        assert_eq!(f.body, crate::testbed::pattern(3000));
    }

    #[test]
    fn a_client_trusting_another_ca_gets_no_response() {
        let pki = TestPki::issue(&["origin.testbed.test"]).unwrap();
        let stranger = TestPki::issue(&["origin.testbed.test"]).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let config = pki.server_config().unwrap();
        std::thread::spawn(move || serve_https_forever(listener, config));
        let tls = super::super::load::TlsTarget {
            config: client_config(&stranger.ca_pem, None).unwrap(),
            name: "origin.testbed.test".into(),
        };
        let err =
            super::super::load::fetch_with(&format!("https://{addr}/"), Some(&tls)).unwrap_err();
        assert!(err.starts_with("FAIL"), "{err}");
    }

    #[test]
    fn a_missing_extra_bundle_is_an_error_naming_it() {
        let pki = TestPki::issue(&["a.test"]).unwrap();
        let err = client_config(&pki.ca_pem, Some(Path::new("/nonexistent/bundle"))).unwrap_err();
        assert!(err.starts_with("cannot read /nonexistent/bundle"), "{err}");
    }
}
