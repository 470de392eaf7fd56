//! TLS interception's keys and trust: the per-sandbox CA and its leaf
//! certificates ([`ca`]), and the roots an origin's certificate is checked
//! against ([`roots`]). The CA's key lives only in sluice's memory and dies
//! with the sandbox: nothing here writes a key to disk or hands it out, and
//! nothing here touches a socket (the proxy does the handshakes).

pub mod ca;
pub(crate) mod roots;
