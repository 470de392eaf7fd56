//! A throwaway "host" namespace holding origin servers, for the demo, the
//! benchmark and the tests: everything sluice proxies to lives here, so
//! nothing is ever sent beyond this machine and the root namespace is never
//! touched.
//!
//! The namespace is named (so `ip netns exec` can start sluice in it) and
//! removed on drop, with every process still inside it killed.

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A named network namespace standing in for the host sluice runs on.
pub struct OuterNetns {
    name: String,
}

impl OuterNetns {
    /// Create `<prefix>-<pid>-<n>` with `lo` up and `addrs` on it.
    pub fn create(prefix: &str, addrs: &[IpAddr]) -> Result<OuterNetns> {
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        ip(&["netns", "add", &name]).context("cannot create a test namespace")?;
        let ns = OuterNetns { name };
        let mut batch = String::from("link set lo up\n");
        for addr in addrs {
            let len = if addr.is_ipv4() { 32 } else { 128 };
            batch.push_str(&format!("addr add {addr}/{len} dev lo\n"));
        }
        let mut child = Command::new("ip")
            .args(["-n", &ns.name, "-batch", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .context("cannot run `ip`: install iproute2")?;
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(batch.as_bytes())?;
        if !child.wait()?.success() {
            bail!("configuring namespace {} failed", ns.name);
        }
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// Run `f` on a thread that entered this namespace (sockets made there
    /// belong to it).
    pub fn run_in<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let path = self.path();
        std::thread::spawn(move || -> Result<T> {
            let file = std::fs::File::open(&path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .context("setns into the test namespace")?;
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("namespace thread panicked"))?
    }

    /// A `Command` that runs `program` inside this namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Serve HTTP/1.1 on `addr`: `/` answers "hello from origin", `/bytes/N`
    /// answers N deterministic bytes. Returns the request counter.
    pub fn http_origin(&self, addr: SocketAddr) -> Result<Arc<AtomicU64>> {
        let listener = self.run_in(move || TcpListener::bind(addr))??;
        let hits = Arc::new(AtomicU64::new(0));
        let counter = hits.clone();
        std::thread::spawn(move || super::origin::serve_http_counting(listener, counter));
        Ok(hits)
    }

    /// Serve the same origin over TLS on `addr` with `config`, giving `seen`
    /// every request head ([`super::tls::serve_https_seeing`]).
    #[cfg(feature = "bench")]
    pub(crate) fn https_origin(
        &self,
        addr: SocketAddr,
        config: Arc<rustls::ServerConfig>,
        seen: Arc<dyn Fn(&str) + Send + Sync>,
    ) -> Result<()> {
        let listener = self.run_in(move || TcpListener::bind(addr))??;
        std::thread::spawn(move || super::tls::serve_https_seeing(listener, config, seen));
        Ok(())
    }

    /// Count the datagrams arriving on `addr` (there should be none).
    pub fn udp_sink(&self, addr: SocketAddr) -> Result<Arc<AtomicU64>> {
        let socket = self.run_in(move || UdpSocket::bind(addr))??;
        let hits = Arc::new(AtomicU64::new(0));
        let counter = hits.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while socket.recv_from(&mut buf).is_ok() {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        });
        Ok(hits)
    }
}

impl Drop for OuterNetns {
    fn drop(&mut self) {
        // Kill anything still running in the namespace, then remove it.
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        let _ = ip(&["netns", "del", &self.name]);
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run `ip`: install iproute2")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
