//! The peers sluice is measured against: haproxy (`mode tcp` to the fixed
//! origin; TLS routed by SNI, the `l7` name terminated in `mode http`) and
//! a minimal proxy (`sluice bench-proxy`: SO_ORIGINAL_DST and
//! `copy_bidirectional` on tokio), each with
//! no policy, behind the same kind of nft redirect sluice uses. Each gets a throwaway namespace of its own,
//! plumbed like a sandbox (the bridge with no ports that carries the
//! default routes) with sluice's own host ruleset applied and read
//! back; the proxy listens inside it (haproxy's `bind ... namespace`, the
//! tokio proxy's in-namespace listener) and connects upstream from the
//! bench's outer namespace, as sluice does.
//!
//! A peer is started once for the whole run and stopped (then its
//! namespace removed) when dropped. This module touches nothing outside
//! the bench's namespaces.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::condition::{client_command, Condition, ConditionKind, Skip};
use super::session::{self, Proxy, Session};
use super::{interrupt, BenchError, Testbed, ORIGIN};
use super::{L7_HEADER, L7_NAME, L7_SECRET, TLS_NAME, TLS_ORIGIN};
use crate::attach::{DNS_PORT, PROXY_PORT};
use crate::enforce::{self, SandboxSpec};
use crate::netns::SandboxNetns;
use crate::testbed::OuterNetns;

/// How long a peer may take to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(20);

/// A peer proxy and the namespace its clients run in.
pub(crate) struct Peer {
    kind: ConditionKind,
    // Dropped in this order: the proxy first, then its namespace.
    process: Process,
    pid: u32,
    ns: OuterNetns,
}

enum Process {
    /// haproxy.
    Haproxy(Option<Child>),
    /// `sluice bench-proxy`, spoken to like a client session (it says it
    /// is ready, and quits on `quit` or at the end of its input).
    Minimal(Option<Session>),
}

impl Peer {
    /// haproxy behind the redirect, or why it cannot run here.
    pub(crate) fn haproxy(bed: &Testbed) -> Result<Result<Peer, Skip>, BenchError> {
        let Some(haproxy) = crate::program::on_path("haproxy") else {
            return Ok(Err(
                "haproxy is not installed (apt-get install --no-install-recommends haproxy)".into(),
            ));
        };
        let ns = redirected_namespace("sluice-bench-haproxy")?;
        let config = bed.dir.join("haproxy.cfg");
        // haproxy's `crt`: the TLS origin's certificate and key in one file.
        let crt = bed.dir.join("haproxy-l7.pem");
        let files = [
            (&crt, format!("{}{}", bed.pki.cert_pem, bed.pki.key_pem)),
            (
                &config,
                haproxy_config(ns.name(), &crt, &bed.ca_file, ns.name()),
            ),
        ];
        for (path, text) in files {
            std::fs::write(path, text).map_err(|e| BenchError::Output {
                path: path.clone(),
                cause: e,
            })?;
        }
        let mut cmd = Command::new(&haproxy);
        // -db: stay in the foreground, one process; -q: quiet.
        cmd.arg("-db")
            .arg("-q")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        // Started in the outer namespace: its server side connects there.
        let mut child = session::spawn_in(&bed.outer, cmd).map_err(|cause| BenchError::Spawn {
            what: "haproxy".into(),
            program: haproxy.display().to_string(),
            cause,
        })?;
        let pid = child.id();
        interrupt::register(pid);
        let stderr = child.stderr.take().map(session::Tail::follow);
        let listening = wait_listening(&ns, &mut child, stderr.as_ref());
        let peer = Peer {
            kind: ConditionKind::Haproxy,
            process: Process::Haproxy(Some(child)),
            pid,
            ns,
        };
        listening?;
        Ok(Ok(peer))
    }

    /// The minimal proxy (`sluice bench-proxy`) behind the redirect.
    pub(crate) fn minimal_proxy(bed: &Testbed) -> Result<Peer, BenchError> {
        let kind = ConditionKind::TokioProxy;
        let ns = redirected_namespace("sluice-bench-tokio")?;
        let mut cmd = Command::new(&bed.exe);
        cmd.arg("bench-proxy")
            .arg("--netns")
            .arg(ns.path())
            .arg("--port")
            .arg(PROXY_PORT.to_string());
        let proxy = Session::start(kind.name(), cmd, &bed.outer, Proxy::Itself)?;
        let pid = proxy.pid();
        Ok(Peer {
            kind,
            process: Process::Minimal(Some(proxy)),
            pid,
            ns,
        })
    }
}

impl Condition for Peer {
    fn kind(&self) -> ConditionKind {
        self.kind
    }

    fn start(&self, bed: &Testbed, _round: usize) -> Result<Session, BenchError> {
        Session::start(
            self.kind.name(),
            client_command(bed),
            &self.ns,
            Proxy::Other(self.pid),
        )
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        match &mut self.process {
            Process::Haproxy(child) => {
                if let Some(child) = child.take() {
                    let pid = child.id();
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
                    if session::wait_bounded(child, session::EXIT_TIMEOUT).is_none() {
                        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                    }
                    interrupt::unregister(pid);
                }
            }
            Process::Minimal(proxy) => {
                if let Some(proxy) = proxy.take() {
                    let _ = proxy.finish();
                }
            }
        }
    }
}

/// A named namespace plumbed as a sandbox (lo, the in-namespace bridge
/// with no ports, default routes) with sluice's host ruleset applied and read back:
/// TCP to anywhere but loopback is redirected to 127.0.0.1:PROXY_PORT.
fn redirected_namespace(prefix: &str) -> Result<OuterNetns, BenchError> {
    let setup = |what: &str, cause: String| BenchError::Setup {
        what: format!("{what} for {prefix}"),
        cause,
    };
    let ns = OuterNetns::create(prefix, &[])
        .map_err(|e| setup("creating a namespace", format!("{e:#}")))?;
    let sandbox = SandboxNetns::from_path(&ns.path())
        .map_err(|e| setup("opening the namespace", e.to_string()))?;
    sandbox
        .plumb()
        .map_err(|e| setup("plumbing the namespace", e.to_string()))?;
    let spec = SandboxSpec::host(PROXY_PORT, DNS_PORT);
    sandbox
        .run_in(move || enforce::apply(&spec).and_then(|()| enforce::verify(&spec)))
        .map_err(|e| setup("entering the namespace", e.to_string()))?
        .map_err(|e| setup("the nft redirect", e.to_string()))?;
    Ok(ns)
}

/// haproxy's configuration: `mode tcp`, listening inside `netns` where the
/// redirect sends every connection, no policy; as many connections as
/// `sluice run` serves by default, and haproxy's defaults otherwise (a
/// thread per CPU, no splicing). Plain connections go to the one origin.
/// A TLS ClientHello is routed by its SNI: the `tls` workload's name is
/// relayed to the TLS origin; the `l7` workload's goes to a second frontend
/// (on an abstract socket named after `tag`) that terminates TLS with `crt`,
/// allows only the `l7` rule's requests, sets its header and connects to the
/// origin over TLS, verifying it against `ca_file`: what sluice's `l7-origin`
/// rule does, as haproxy is configured for it.
fn haproxy_config(
    netns: &str,
    crt: &std::path::Path,
    ca_file: &std::path::Path,
    tag: &str,
) -> String {
    format!(
        "global\n\
         \x20   maxconn 4096\n\
         defaults\n\
         \x20   mode tcp\n\
         \x20   timeout connect 5s\n\
         \x20   timeout client 60s\n\
         \x20   timeout server 60s\n\
         frontend redirected\n\
         \x20   bind 127.0.0.1:{PROXY_PORT} namespace {netns}\n\
         \x20   tcp-request inspect-delay 5s\n\
         \x20   tcp-request content accept if {{ req.ssl_hello_type 1 }}\n\
         \x20   tcp-request content accept if {{ req.len gt 0 }}\n\
         \x20   use_backend tls-relay if {{ req.ssl_sni -i {TLS_NAME} }}\n\
         \x20   use_backend l7-terminate if {{ req.ssl_sni -i {L7_NAME} }}\n\
         \x20   default_backend origin\n\
         backend origin\n\
         \x20   server origin {ORIGIN}\n\
         backend tls-relay\n\
         \x20   server tls {TLS_ORIGIN}\n\
         backend l7-terminate\n\
         \x20   server l7 abns@{tag}-l7\n\
         frontend l7\n\
         \x20   mode http\n\
         \x20   bind abns@{tag}-l7 ssl crt {crt} alpn http/1.1\n\
         \x20   http-request deny unless {{ method GET }} {{ path_reg ^/bytes/[^/]+$ }}\n\
         \x20   http-request set-header {L7_HEADER} \"Bearer {L7_SECRET}\"\n\
         \x20   default_backend l7-origin\n\
         backend l7-origin\n\
         \x20   mode http\n\
         \x20   server origin {TLS_ORIGIN} ssl verify required ca-file {ca} sni str({L7_NAME}) verifyhost {L7_NAME}\n",
        crt = crt.display(),
        ca = ca_file.display(),
    )
}

/// Wait (bounded) until something listens on the redirect's target inside
/// `ns`, or `child` exits.
fn wait_listening(
    ns: &OuterNetns,
    child: &mut Child,
    stderr: Option<&session::Tail>,
) -> Result<(), BenchError> {
    let target = SocketAddr::from((Ipv4Addr::LOCALHOST, PROXY_PORT));
    let deadline = Instant::now() + LISTEN_TIMEOUT;
    loop {
        // Loopback is exempt from the redirect: this reaches the listener.
        let connected = ns
            .run_in(move || TcpStream::connect_timeout(&target, Duration::from_millis(200)).is_ok())
            .unwrap_or(false);
        if connected {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let said = stderr
                .map(|t| t.text(Duration::from_secs(2)))
                .unwrap_or_default();
            return Err(BenchError::Setup {
                what: "haproxy".into(),
                cause: format!("it exited with {status} before it listened: {said}"),
            });
        }
        if interrupt::raised() {
            return Err(BenchError::Interrupted);
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Setup {
                what: "haproxy".into(),
                cause: format!("it did not listen on {target} within {LISTEN_TIMEOUT:?}"),
            });
        }
        // A child's listen is no event this process can wait on.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Said once ready: the line a bench session waits for.
fn say_ready() -> std::io::Result<()> {
    let mut out = std::io::stdout();
    out.write_all(b"{\"ready\":true}\n")?;
    out.flush()
}

/// Whether stdin says to quit: at `quit` or at its end.
fn wait_for_quit() {
    use std::io::BufRead;
    for line in std::io::stdin().lock().lines() {
        match line {
            Ok(l) if l.contains("\"quit\"") => break,
            Ok(_) => {}
            Err(_) => break,
        }
    }
}

/// `sluice bench-proxy`: the minimal transparent proxy, listening on
/// 127.0.0.1:`port` inside the namespace at `netns`, connecting upstream in
/// its own, on tokio. Says it is ready on stdout and quits at the end of
/// stdin (or on `quit`), so it never outlives the bench.
pub(crate) fn serve_minimal_proxy(netns: &std::path::Path, port: u16) -> anyhow::Result<i32> {
    use anyhow::Context;
    let ns = SandboxNetns::from_path(netns)?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let listener = ns
        .run_in(move || std::net::TcpListener::bind(addr))?
        .with_context(|| format!("cannot listen on {addr} in {}", netns.display()))?;
    listener.set_nonblocking(true)?;
    // One thread, as `sluice run` serves a sandbox.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        say_ready()?;
        let stdin_closed = tokio::task::spawn_blocking(wait_for_quit);
        let accepting = async {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let Ok(local) = client.local_addr() else {
                        return;
                    };
                    let Ok(dst) = crate::proxy::original_dst(&client, local) else {
                        return;
                    };
                    let Ok(mut upstream) = tokio::net::TcpStream::connect(dst).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = upstream.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
            }
        };
        tokio::select! {
            _ = stdin_closed => {}
            () = accepting => {}
        }
        Ok::<i32, anyhow::Error>(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn haproxy_listens_in_the_redirected_namespace_and_forwards_to_the_origin() {
        let config = haproxy_config(
            "sluice-bench-haproxy-1-0",
            std::path::Path::new("/b/crt.pem"),
            std::path::Path::new("/b/ca.pem"),
            "t",
        );
        assert!(config.contains("mode tcp"));
        assert!(config.contains(&format!(
            "bind 127.0.0.1:{PROXY_PORT} namespace sluice-bench-haproxy-1-0\n"
        )));
        assert!(config.contains(&format!("server origin {ORIGIN}\n")));
    }

    #[test]
    fn haproxy_terminates_only_the_l7_name_and_verifies_the_origin() {
        let config = haproxy_config(
            "ns",
            std::path::Path::new("/b/crt.pem"),
            std::path::Path::new("/b/ca.pem"),
            "t",
        );
        assert!(config.contains(&format!(
            "use_backend tls-relay if {{ req.ssl_sni -i {TLS_NAME} }}"
        )));
        assert!(config.contains("bind abns@t-l7 ssl crt /b/crt.pem alpn http/1.1\n"));
        assert!(config.contains(&format!(
            "server origin {TLS_ORIGIN} ssl verify required ca-file /b/ca.pem sni str({L7_NAME}) verifyhost {L7_NAME}\n"
        )));
        assert!(config.contains(&format!("http-request set-header {L7_HEADER} ")));
    }
}
