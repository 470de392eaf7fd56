//! A client that hides its first bytes from sluice's peek: it connects,
//! stays silent until the test says go on, then sends. The test says so
//! once sluice has connected upstream, which it does only after the peek
//! gave up on the silent client (the event that ends the silence; the
//! silence itself is the attack, so it cannot be waited out otherwise).

use super::World;

/// A bash workload that connects to 198.18.0.1:8081, sends `$2`'s bytes
/// at once if it is given (what the peek sees), says "connected", and, once
/// told to go on (a line on its stdin), sends `$1`'s bytes and then reads
/// to the end.
pub const LATE_SENDER: &str = r#"
    exec 3<>/dev/tcp/198.18.0.1/8081
    if [ -n "$2" ]; then cat "$2" >&3; fi
    echo connected
    read -r line
    cat "$1" >&3
    cat <&3
    echo "ended"
"#;

/// `bytes` in a file of the test's own directory, for a workload to send.
pub fn test_file(w: &World, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let file = w.audit_path().with_file_name(name);
    std::fs::write(&file, bytes).unwrap();
    file
}

/// A ClientHello for `name`, as rustls sends it.
pub fn client_hello(name: &str) -> Vec<u8> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}
