//! The systemd readiness protocol (sd_notify) for `sluice daemon` under
//! `Type=notify`: `READY=1` once the control socket listens, `RELOADING=1`
//! then `READY=1` around a SIGHUP reload, `STOPPING=1` when it stops. One
//! datagram per state to the socket named by `NOTIFY_SOCKET` (a path, or an
//! abstract name written with a leading `@`), from a fresh unbound socket.
//!
//! Without `NOTIFY_SOCKET` (the daemon started by hand) it does nothing. A
//! notification that cannot be sent is logged and never stops the daemon:
//! systemd then times the start out, which says more than a failed daemon.
//! It never unsets the variable (that would race with other threads):
//! `NotifyAccess=main`, systemd's default for `Type=notify`, ignores what
//! the daemon's children might send.

use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Where the service manager listens, if it does.
#[derive(Debug)]
pub(crate) struct Notifier {
    addr: Option<SocketAddr>,
}

impl Notifier {
    /// The socket `NOTIFY_SOCKET` names; none when it is unset or empty.
    pub(crate) fn from_env() -> Notifier {
        let var = std::env::var_os("NOTIFY_SOCKET");
        match var.as_deref().filter(|v| !v.is_empty()).map(address) {
            None => Notifier { addr: None },
            Some(Ok(addr)) => Notifier { addr: Some(addr) },
            Some(Err(err)) => {
                tracing::warn!(%err, "NOTIFY_SOCKET is not a socket address: not notifying systemd");
                Notifier { addr: None }
            }
        }
    }

    /// Ready: the control socket accepts requests.
    pub(crate) fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={status}"));
    }

    /// A reload (SIGHUP) begins; [`Notifier::ready`] ends it.
    pub(crate) fn reloading(&self) {
        self.send("RELOADING=1");
    }

    /// The daemon is releasing its sandboxes and stopping.
    pub(crate) fn stopping(&self) {
        self.send("STOPPING=1");
    }

    fn send(&self, state: &str) {
        let Some(addr) = &self.addr else { return };
        if let Err(err) =
            UnixDatagram::unbound().and_then(|s| s.send_to_addr(state.as_bytes(), addr))
        {
            tracing::warn!(%err, state, "cannot notify systemd");
        }
    }
}

/// `NOTIFY_SOCKET`'s value as an address: `@name` is the abstract `name`,
/// anything else a path (systemd passes an absolute one).
fn address(value: &OsStr) -> std::io::Result<SocketAddr> {
    match value.as_bytes().strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(value),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn received(socket: &UnixDatagram) -> String {
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).expect("a notification arrives");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn ready_reloading_and_stopping_reach_a_path_socket_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier {
            addr: Some(address(path.as_os_str()).unwrap()),
        };
        notifier.ready("listening on /run/sluice/daemon.sock");
        notifier.reloading();
        notifier.ready("reloaded");
        notifier.stopping();
        assert_eq!(
            received(&listener),
            "READY=1\nSTATUS=listening on /run/sluice/daemon.sock"
        );
        assert_eq!(received(&listener), "RELOADING=1");
        assert_eq!(received(&listener), "READY=1\nSTATUS=reloaded");
        assert_eq!(received(&listener), "STOPPING=1");
    }

    #[test]
    fn an_at_sign_names_an_abstract_socket() {
        let name = format!("sluice-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(&name).unwrap();
        let listener = UnixDatagram::bind_addr(&addr).unwrap();
        let notifier = Notifier {
            addr: Some(address(OsStr::new(&format!("@{name}"))).unwrap()),
        };
        notifier.ready("up");
        assert_eq!(received(&listener), "READY=1\nSTATUS=up");
    }

    #[test]
    fn without_a_socket_nothing_is_sent_and_nothing_fails() {
        let notifier = Notifier { addr: None };
        notifier.ready("up");
        notifier.stopping();
    }

    #[test]
    fn a_socket_nobody_listens_on_is_only_logged() {
        let dir = tempfile::tempdir().unwrap();
        let notifier = Notifier {
            addr: Some(address(dir.path().join("gone").as_os_str()).unwrap()),
        };
        notifier.ready("up");
    }
}
