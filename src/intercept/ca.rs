//! The sandbox's certificate authority: minted per sandbox when a policy has
//! rules that terminate TLS, trusted by the workload (through the bundle
//! [`bundle_pem`] writes), and the issuer of one leaf certificate per name
//! sluice terminates for, cached and bounded. This module owns the CA's key
//! and the leaves' keys; they live in memory only and must never be written,
//! logged or put in `Debug` output. It knows nothing of sockets: the
//! intercept layer hands [`SandboxCa::server_config`] to its TLS acceptor.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, DnsName, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration as StdDuration, Instant};
use time::{Duration, OffsetDateTime};

/// How long the CA is valid (from an hour before it was minted).
pub(crate) const CA_VALIDITY: Duration = Duration::days(30);
/// How long a leaf is valid (from an hour before it was minted).
pub(crate) const LEAF_VALIDITY: Duration = Duration::days(7);
/// How far back a certificate's validity starts, for clocks a little behind.
const BACKDATE: Duration = Duration::hours(1);
/// A cached leaf older than this is minted again, well before it expires.
const LEAF_REFRESH: StdDuration = StdDuration::from_secs(6 * 24 * 3600);
/// At most this many names have a cached leaf; past it the oldest goes.
pub(crate) const LEAF_CACHE: usize = 1024;

/// Why a certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot make the sandbox CA: {0}")]
    Mint(#[source] rcgen::Error),
    #[error("{name:?} is not a DNS name; sluice makes certificates for host names only")]
    Name { name: String },
    #[error("cannot make a certificate for {name}: {source}")]
    Leaf {
        name: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("the certificate made for {name} does not load into rustls: {source}")]
    Load {
        name: String,
        #[source]
        source: rustls::Error,
    },
}

/// One sandbox's CA: its certificate, its key (in memory only) and the
/// leaves it issued. Send + Sync; share it as an `Arc`.
pub struct SandboxCa {
    sandbox: String,
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    cert_pem: String,
    provider: Arc<CryptoProvider>,
    leaves: Mutex<LeafCache>,
}

#[derive(Default)]
struct LeafCache {
    by_name: HashMap<String, (Instant, Arc<CertifiedKey>)>,
    /// Names in the order their leaves were minted, oldest first.
    order: VecDeque<String>,
}

impl SandboxCa {
    /// A fresh CA: CN "sluice sandbox CA <sandbox>", valid from an hour ago
    /// for [`CA_VALIDITY`], CA:true with pathlen 0, key usage certSign only,
    /// an ECDSA P-256 key.
    pub fn mint(sandbox: &str) -> Result<SandboxCa, CaError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CaError::Mint)?;
        let mut params = CertificateParams::default();
        let mut subject = DistinguishedName::new();
        subject.push(DnType::OrganizationName, "sluice");
        subject.push(DnType::CommonName, format!("sluice sandbox CA {sandbox}"));
        params.distinguished_name = subject;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now - BACKDATE + CA_VALIDITY;
        let cert = params.self_signed(&key).map_err(CaError::Mint)?;
        Ok(SandboxCa {
            sandbox: sandbox.to_string(),
            cert_pem: cert.pem(),
            cert: cert.der().clone(),
            issuer: Issuer::new(params, key),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
            leaves: Mutex::new(LeafCache::default()),
        })
    }

    /// The CA certificate, PEM: what the workload trusts.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    #[cfg(test)]
    pub(crate) fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// A leaf for `name` (compared without case): DNS SAN `name`, EKU
    /// serverAuth, valid from an hour ago for [`LEAF_VALIDITY`], its own
    /// P-256 key; chain [leaf, CA]. Cached for [`LEAF_CACHE`] names (the
    /// oldest leaf goes first) and minted again after six days.
    pub fn leaf(&self, name: &str) -> Result<Arc<CertifiedKey>, CaError> {
        let name = name.to_ascii_lowercase();
        if let Some(leaf) = self.cache().get(&name) {
            return Ok(leaf);
        }
        // Mint without the lock held: handshakes for other names go on.
        let leaf = Arc::new(self.mint_leaf(&name)?);
        Ok(self.cache().insert(name, leaf))
    }

    /// How many names have a cached leaf.
    pub(crate) fn cached_leaves(&self) -> usize {
        self.cache().by_name.len()
    }

    /// A rustls server configuration that presents the leaf for the
    /// ClientHello's SNI name, or for `default_name` when the ClientHello
    /// names none; ALPN `http/1.1` only; the ring provider.
    pub fn server_config(self: &Arc<Self>, default_name: &str) -> Arc<rustls::ServerConfig> {
        let resolver = Resolver {
            ca: Arc::clone(self),
            default_name: default_name.to_string(),
        };
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports TLS 1.2 and 1.3")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    fn mint_leaf(&self, name: &str) -> Result<CertifiedKey, CaError> {
        let bad_name = || CaError::Name {
            name: name.to_string(),
        };
        if name.contains('*') || DnsName::try_from(name).is_err() {
            return Err(bad_name());
        }
        let leaf_error = |source| CaError::Leaf {
            name: name.to_string(),
            source,
        };
        let mut params = CertificateParams::default();
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, name);
        params.distinguished_name = subject;
        params.subject_alt_names = vec![SanType::DnsName(name.try_into().map_err(|_| bad_name())?)];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now - BACKDATE + LEAF_VALIDITY;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(leaf_error)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(leaf_error)?;
        CertifiedKey::from_der(
            vec![cert.der().clone(), self.cert.clone()],
            PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            &self.provider,
        )
        .map_err(|source| CaError::Load {
            name: name.to_string(),
            source,
        })
    }

    fn cache(&self) -> MutexGuard<'_, LeafCache> {
        // Every change to the cache leaves it consistent before it can panic.
        self.leaves.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LeafCache {
    fn get(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        let (minted, leaf) = self.by_name.get(name)?;
        (minted.elapsed() < LEAF_REFRESH).then(|| Arc::clone(leaf))
    }

    /// Caches `leaf` for `name` unless a fresh one was cached meanwhile, and
    /// returns the one cached.
    fn insert(&mut self, name: String, leaf: Arc<CertifiedKey>) -> Arc<CertifiedKey> {
        if let Some(cached) = self.get(&name) {
            return cached;
        }
        if self.by_name.remove(&name).is_some() {
            self.order.retain(|n| *n != name);
        }
        while self.order.len() >= LEAF_CACHE {
            if let Some(oldest) = self.order.pop_front() {
                self.by_name.remove(&oldest);
            }
        }
        self.order.push_back(name.clone());
        self.by_name
            .insert(name, (Instant::now(), Arc::clone(&leaf)));
        leaf
    }
}

/// The sandbox and how many leaves are cached; never a key.
impl fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxCa")
            .field("sandbox", &self.sandbox)
            .field("cached_leaves", &self.cached_leaves())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Resolver {
    ca: Arc<SandboxCa>,
    default_name: String,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name().unwrap_or(&self.default_name);
        match self.ca.leaf(name) {
            Ok(leaf) => Some(leaf),
            Err(error) => {
                tracing::debug!(%error, "no certificate for the ClientHello; the handshake fails");
                None
            }
        }
    }
}

/// The system roots (the PEM file at `system_bundle`, if readable) and the
/// sandbox CA, as one PEM text: what `sluice run` writes for the workload.
/// The system bundle is copied as it is; when it cannot be read the bundle
/// holds the CA alone (and a warning says so).
pub(crate) fn bundle_pem(ca: &SandboxCa, system_bundle: &Path) -> String {
    let mut bundle = match std::fs::read_to_string(system_bundle) {
        Ok(text) => text,
        Err(error) => {
            tracing::warn!(
                path = %system_bundle.display(),
                %error,
                "cannot read the system CA bundle; the workload trusts only the sandbox CA"
            );
            String::new()
        }
    };
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(ca.cert_pem());
    bundle
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::{ServerName, UnixTime};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const NAME: &str = "api.example.test";

    fn ca() -> Arc<SandboxCa> {
        Arc::new(SandboxCa::mint("sb-1").unwrap())
    }

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn roots(ca: &SandboxCa) -> Arc<rustls::RootCertStore> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        Arc::new(roots)
    }

    fn verify(ca: &SandboxCa, leaf: &CertifiedKey, name: &str) -> Result<(), rustls::Error> {
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots(ca), provider())
                .build()
                .unwrap();
        verifier
            .verify_server_cert(
                &leaf.cert[0],
                &leaf.cert[1..],
                &ServerName::try_from(name.to_string()).unwrap(),
                &[],
                UnixTime::now(),
            )
            .map(|_| ())
    }

    fn client_config(ca: &SandboxCa) -> rustls::ClientConfig {
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots(ca))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        config
    }

    /// A TLS handshake over an in-memory pipe, the client asking for `name`;
    /// then one message each way. Returns the ALPN protocol agreed.
    async fn handshake(
        server: Arc<rustls::ServerConfig>,
        client: rustls::ClientConfig,
        name: &str,
    ) -> Result<Option<Vec<u8>>, std::io::Error> {
        let (near, far) = tokio::io::duplex(64 * 1024);
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let serve = tokio::spawn(async move {
            let mut tls = acceptor.accept(far).await?;
            let mut buf = [0u8; 4];
            tls.read_exact(&mut buf).await?;
            tls.write_all(b"pong").await?;
            tls.shutdown().await?;
            Ok::<_, std::io::Error>(())
        });
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let mut tls = connector
            .connect(ServerName::try_from(name.to_string()).unwrap(), near)
            .await?;
        tls.write_all(b"ping").await?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await?;
        assert_eq!(answer, b"pong");
        serve.await.unwrap()?;
        Ok(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
    }

    #[test]
    fn a_leaf_verifies_against_the_ca_for_its_name() {
        let ca = ca();
        let leaf = ca.leaf(NAME).unwrap();
        verify(&ca, &leaf, NAME).unwrap();
    }

    #[test]
    fn a_leaf_does_not_verify_for_another_name() {
        let ca = ca();
        let leaf = ca.leaf(NAME).unwrap();
        assert!(verify(&ca, &leaf, "other.example.test").is_err());
        assert!(verify(&ca, &leaf, "sub.api.example.test").is_err());
    }

    #[test]
    fn a_leaf_does_not_verify_against_another_sandboxes_ca() {
        let (one, two) = (ca(), ca());
        let leaf = one.leaf(NAME).unwrap();
        assert!(verify(&two, &leaf, NAME).is_err());
    }

    #[test]
    fn a_leafs_chain_is_the_leaf_then_the_ca() {
        let ca = ca();
        let leaf = ca.leaf(NAME).unwrap();
        assert_eq!(leaf.cert.len(), 2);
        assert_eq!(&leaf.cert[1], ca.cert_der());
    }

    #[test]
    fn the_ca_certificate_names_its_sandbox() {
        let ca = ca();
        let der: &[u8] = ca.cert_der();
        let cn = b"sluice sandbox CA sb-1";
        assert!(der.windows(cn.len()).any(|w| w == cn));
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[test]
    fn each_mint_is_a_new_ca() {
        assert_ne!(ca().cert_pem(), ca().cert_pem());
    }

    #[test]
    fn a_leaf_is_cached_per_name_without_case() {
        let ca = ca();
        let first = ca.leaf(NAME).unwrap();
        let again = ca.leaf(&NAME.to_ascii_uppercase()).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let other = ca.leaf("other.example.test").unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(ca.cached_leaves(), 2);
    }

    #[test]
    fn the_cache_holds_at_most_its_bound_and_evicts_the_oldest() {
        let ca = ca();
        let first = ca.leaf("n0.example.test").unwrap();
        let second = ca.leaf("n1.example.test").unwrap();
        for i in 2..=LEAF_CACHE {
            ca.leaf(&format!("n{i}.example.test")).unwrap();
        }
        assert_eq!(ca.cached_leaves(), LEAF_CACHE);
        assert!(!Arc::ptr_eq(&first, &ca.leaf("n0.example.test").unwrap()));
        assert_eq!(ca.cached_leaves(), LEAF_CACHE);
        // n0 came back in n1's place, the oldest then.
        assert!(!Arc::ptr_eq(&second, &ca.leaf("n1.example.test").unwrap()));
        assert!(Arc::ptr_eq(
            &ca.leaf("n0.example.test").unwrap(),
            &ca.leaf("n0.example.test").unwrap()
        ));
    }

    #[test]
    fn a_name_that_is_not_a_dns_name_gets_no_leaf() {
        let ca = ca();
        for name in ["", "not a name", "*.example.test", "a..b", "10.0.0.1"] {
            assert!(
                matches!(ca.leaf(name), Err(CaError::Name { .. })),
                "{name:?} got a leaf"
            );
        }
        assert_eq!(ca.cached_leaves(), 0);
    }

    #[tokio::test]
    async fn a_client_trusting_the_ca_completes_a_handshake_for_the_sni_name() {
        let ca = ca();
        let alpn = handshake(ca.server_config("default.test"), client_config(&ca), NAME)
            .await
            .unwrap();
        assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
        assert_eq!(ca.cached_leaves(), 1);
        assert!(ca.cache().get(NAME).is_some());
    }

    #[tokio::test]
    async fn a_client_hello_without_sni_gets_the_default_names_leaf() {
        let ca = ca();
        let mut client = client_config(&ca);
        client.enable_sni = false;
        handshake(ca.server_config("default.test"), client, "default.test")
            .await
            .unwrap();
        assert!(ca.cache().get("default.test").is_some());
    }

    #[tokio::test]
    async fn a_client_not_trusting_the_ca_fails_the_handshake() {
        let ca = ca();
        let stranger = SandboxCa::mint("other").unwrap();
        let result = handshake(
            ca.server_config("default.test"),
            client_config(&stranger),
            NAME,
        );
        assert!(result.await.is_err());
    }

    #[tokio::test]
    async fn the_upstream_config_trusts_an_extra_ca_file_and_not_the_sandbox_ca() {
        let origin = ca();
        let dir = tempfile::tempdir().unwrap();
        let extra = dir.path().join("origin-ca.pem");
        std::fs::write(&extra, origin.cert_pem()).unwrap();
        let none = Path::new("/nonexistent/bundle");
        let trusting = crate::intercept::roots::upstream_client_config(none, &[extra]).unwrap();
        let server = origin.server_config("default.test");
        handshake(Arc::clone(&server), (*trusting).clone(), NAME)
            .await
            .unwrap();
        let plain = crate::intercept::roots::upstream_client_config(none, &[]).unwrap();
        assert!(handshake(server, (*plain).clone(), NAME).await.is_err());
    }

    #[test]
    fn the_server_config_offers_only_http1() {
        assert_eq!(
            ca().server_config("default.test").alpn_protocols,
            [b"http/1.1".to_vec()]
        );
    }

    #[test]
    fn the_bundle_is_the_system_roots_then_the_ca() {
        let ca = ca();
        let dir = tempfile::tempdir().unwrap();
        let system = dir.path().join("ca-certificates.crt");
        std::fs::write(
            &system,
            "# system roots\n-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----",
        )
        .unwrap();
        let bundle = bundle_pem(&ca, &system);
        assert_eq!(
            bundle,
            format!(
                "# system roots\n-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n{}",
                ca.cert_pem()
            )
        );
    }

    #[test]
    fn the_bundle_without_a_readable_system_file_is_the_ca_alone() {
        let ca = ca();
        assert_eq!(
            bundle_pem(&ca, Path::new("/nonexistent/bundle")),
            ca.cert_pem()
        );
    }

    #[test]
    fn debug_output_shows_no_key() {
        let ca = ca();
        ca.leaf(NAME).unwrap();
        assert_eq!(
            format!("{ca:?}"),
            r#"SandboxCa { sandbox: "sb-1", cached_leaves: 1, .. }"#
        );
    }

    #[test]
    fn the_ca_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<SandboxCa>();
    }
}
