//! The trust sluice places in origins when it terminates a workload's TLS:
//! the rustls client configuration for the origin side, whose roots are the
//! system bundle plus every `--upstream-ca` file. This module owns reading
//! those files. It must never trust the sandbox CA or skip verification:
//! a secret goes only to an origin whose certificate verified for its name.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Where Debian and its derivatives keep the system's trusted roots (PEM).
pub(crate) const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Why an extra CA file cannot be trusted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RootsError {
    #[error(
        "cannot read the upstream CA file {path}: {reason}; check the path and its permissions"
    )]
    Unreadable { path: PathBuf, reason: String },
    #[error(
        "the upstream CA file {path} is not valid PEM: {reason}; give a file of PEM certificates"
    )]
    Pem { path: PathBuf, reason: String },
    #[error("the upstream CA file {path} holds no certificate; give a file of PEM certificates (-----BEGIN CERTIFICATE-----)")]
    Empty { path: PathBuf },
    #[error("the upstream CA file {path} holds a certificate that is not a usable CA: {reason}")]
    Unusable { path: PathBuf, reason: String },
}

/// The rustls client configuration for the origin side: roots = the system
/// bundle (if readable: certificates in it rustls cannot use are skipped,
/// and an unreadable bundle is a warning) + every certificate of every
/// `extra` PEM file (an error names the file if it is unreadable, is not
/// PEM, holds no certificate or one rustls cannot use); ALPN `http/1.1`;
/// the ring provider.
pub(crate) fn upstream_client_config(
    system_bundle: &Path,
    extra: &[PathBuf],
) -> Result<Arc<rustls::ClientConfig>, RootsError> {
    let mut roots = rustls::RootCertStore::empty();
    match CertificateDer::pem_file_iter(system_bundle) {
        Ok(certs) => {
            let (added, skipped) = roots.add_parsable_certificates(certs.flatten());
            tracing::debug!(path = %system_bundle.display(), added, skipped, "system roots");
        }
        Err(error) => tracing::warn!(
            path = %system_bundle.display(),
            %error,
            "cannot read the system CA bundle; origins verify only against --upstream-ca files"
        ),
    }
    for path in extra {
        for cert in extra_certificates(path)? {
            roots.add(cert).map_err(|e| RootsError::Unusable {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The origin side's trust, built on first use. The `--upstream-ca` files
/// are checked when this is made, so a bad one is an error at start and
/// not a failed request later; the system bundle (some 200 KiB of PEM) is
/// parsed only when a sandbox first terminates TLS, so a policy that never
/// does costs `sluice run` nothing for it.
#[derive(Clone)]
pub(crate) struct UpstreamTrust {
    system: PathBuf,
    extra: Vec<PathBuf>,
    config: Arc<OnceLock<Arc<rustls::ClientConfig>>>,
}

impl UpstreamTrust {
    pub(crate) fn new(
        system_bundle: &Path,
        extra: &[PathBuf],
    ) -> Result<UpstreamTrust, RootsError> {
        for path in extra {
            extra_certificates(path)?;
        }
        Ok(UpstreamTrust {
            system: system_bundle.to_path_buf(),
            extra: extra.to_vec(),
            config: Arc::default(),
        })
    }

    /// The configuration ([`upstream_client_config`]), made once.
    pub(crate) fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, RootsError> {
        if let Some(config) = self.config.get() {
            return Ok(config.clone());
        }
        let config = upstream_client_config(&self.system, &self.extra)?;
        Ok(self.config.get_or_init(|| config).clone())
    }
}

/// Every certificate in the PEM file `path`, at least one.
fn extra_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, RootsError> {
    // Read first: pem_file_iter reports a missing file as a PEM error.
    let bytes = std::fs::read(path).map_err(|e| RootsError::Unreadable {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| RootsError::Pem {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(RootsError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_extra_file_is_refused_when_the_trust_is_made_not_at_first_use() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("extra.pem");
        std::fs::write(&path, "not pem").unwrap();
        let err = UpstreamTrust::new(Path::new("/nonexistent/bundle"), &[path])
            .err()
            .expect("refused");
        assert!(err.to_string().contains("extra.pem"), "{err}");
    }

    #[test]
    fn the_trust_is_built_once_and_shared() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("extra.pem");
        std::fs::write(&path, ca_pem()).unwrap();
        let trust = UpstreamTrust::new(Path::new("/nonexistent/bundle"), &[path]).unwrap();
        let (a, b) = (
            trust.client_config().unwrap(),
            trust.clone().client_config().unwrap(),
        );
        assert!(Arc::ptr_eq(&a, &b));
    }

    fn ca_pem() -> String {
        crate::intercept::ca::SandboxCa::mint("test")
            .unwrap()
            .cert_pem()
            .to_string()
    }

    #[test]
    fn a_missing_extra_file_is_named() {
        let err = upstream_client_config(
            Path::new("/nonexistent/bundle"),
            &[PathBuf::from("/nonexistent/extra.pem")],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read the upstream CA file /nonexistent/extra.pem:"),
            "{err}"
        );
    }

    #[test]
    fn an_extra_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("extra.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = upstream_client_config(
            Path::new("/nonexistent/bundle"),
            std::slice::from_ref(&path),
        )
        .unwrap_err();
        assert!(matches!(err, RootsError::Empty { .. }), "{err}");
        assert!(err.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn an_extra_file_with_broken_pem_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("extra.pem");
        std::fs::write(
            &path,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = upstream_client_config(Path::new("/nonexistent/bundle"), &[path]).unwrap_err();
        assert!(matches!(err, RootsError::Pem { .. }), "{err}");
    }

    #[test]
    fn an_unreadable_system_bundle_still_gives_a_config_with_the_extra_roots() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("extra.pem");
        std::fs::write(&path, ca_pem()).unwrap();
        let config = upstream_client_config(Path::new("/nonexistent/bundle"), &[path]);
        assert!(config.is_ok());
    }

    #[test]
    fn the_upstream_config_offers_only_http1() {
        let config = upstream_client_config(Path::new("/nonexistent/bundle"), &[]).unwrap();
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
    }
}
