//! `sluice daemon --config FILE`: the daemon's YAML configuration, parsed
//! into raw serde types (unknown keys refused) and then validated into
//! [`DaemonConfig`], reporting every problem at once.
//!
//! ```yaml
//! socket: /run/sluice/daemon.sock   # control API (created 0600)
//! metrics: 127.0.0.1:9464           # /metrics, from the daemon's namespace
//! audit: /var/log/sluice/audit.jsonl
//! audit_allows: false
//! audit_max_bytes: 104857600
//! timings: /var/log/sluice/timings.jsonl
//! defaults:
//!   trust: /etc/sluice/trust.yaml   # for io.sluice.bundle without io.sluice.trust
//!   state_dir: /var/lib/sluice      # bundle rollback memory, restart records
//!   max_connections: 4096           # per sandbox
//!   poll_interval: 30s              # https:// bundles
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::api::DEFAULT_SOCKET;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    version: Option<u32>,
    #[serde(default)]
    socket: Option<PathBuf>,
    #[serde(default)]
    metrics: Option<String>,
    #[serde(default)]
    audit: Option<PathBuf>,
    #[serde(default)]
    audit_allows: bool,
    #[serde(default)]
    audit_max_bytes: Option<u64>,
    #[serde(default)]
    timings: Option<PathBuf>,
    #[serde(default)]
    defaults: RawDefaults,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    #[serde(default)]
    trust: Option<PathBuf>,
    #[serde(default)]
    state_dir: Option<PathBuf>,
    #[serde(default)]
    max_connections: Option<usize>,
    #[serde(default)]
    poll_interval: Option<String>,
}

/// A validated daemon configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct DaemonConfig {
    pub socket: PathBuf,
    pub metrics: Option<SocketAddr>,
    pub audit: Option<PathBuf>,
    pub audit_allows: bool,
    pub audit_max_bytes: Option<u64>,
    pub timings: Option<PathBuf>,
    pub defaults: Defaults,
}

/// What an attach request gets unless it says otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct Defaults {
    pub trust: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub max_connections: usize,
    pub poll_interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the daemon config {}: {cause}", path.display())]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("{}: {}", path.display(), problems.join("; "))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

impl DaemonConfig {
    pub fn load(path: &Path) -> Result<DaemonConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            cause: source,
        })?;
        DaemonConfig::parse(&text, path)
    }

    /// Parse `text` (`path` is for messages). An empty document is the
    /// defaults.
    pub fn parse(text: &str, path: &Path) -> Result<DaemonConfig, ConfigError> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_yaml::from_str(text).map_err(|e| ConfigError::Syntax {
                path: path.to_owned(),
                message: match e.location() {
                    Some(at) => format!("line {}, column {}: {e}", at.line(), at.column()),
                    None => e.to_string(),
                },
            })?
        };
        let mut problems = Vec::new();
        if let Some(v) = raw.version.filter(|v| *v != 1) {
            problems.push(format!("version: {v} is not supported (expected 1)"));
        }
        let socket = raw.socket.unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        if !socket.is_absolute() {
            problems.push(format!(
                "socket: `{}` must be an absolute path (e.g. {DEFAULT_SOCKET})",
                socket.display()
            ));
        }
        let metrics = match raw.metrics.as_deref() {
            None => None,
            Some(text) => match text.parse::<SocketAddr>() {
                Ok(addr) => Some(addr),
                Err(_) => {
                    problems.push(format!(
                        "metrics: `{text}` is not an address (expected e.g. 127.0.0.1:9464)"
                    ));
                    None
                }
            },
        };
        let max_connections = raw.defaults.max_connections.unwrap_or(4096);
        if max_connections == 0 {
            problems.push("defaults.max_connections: 0 is not allowed (expected 1 or more)".into());
        }
        let poll_interval = match raw.defaults.poll_interval.as_deref() {
            None => Duration::from_secs(30),
            Some(text) => humantime::parse_duration(text).unwrap_or_else(|e| {
                problems.push(format!(
                    "defaults.poll_interval: `{text}` is not a duration ({e}; expected e.g. 30s)"
                ));
                Duration::from_secs(30)
            }),
        };
        if !problems.is_empty() {
            return Err(ConfigError::Invalid {
                path: path.to_owned(),
                problems,
            });
        }
        Ok(DaemonConfig {
            socket,
            metrics,
            audit: raw.audit,
            audit_allows: raw.audit_allows,
            audit_max_bytes: raw.audit_max_bytes,
            timings: raw.timings,
            defaults: Defaults {
                trust: raw.defaults.trust,
                state_dir: raw
                    .defaults
                    .state_dir
                    .unwrap_or_else(|| PathBuf::from("/var/lib/sluice")),
                max_connections,
                poll_interval,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DaemonConfig, ConfigError> {
        DaemonConfig::parse(text, Path::new("d.yaml"))
    }

    #[test]
    fn an_empty_config_is_the_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(c.metrics, None);
        assert_eq!(c.defaults.max_connections, 4096);
    }

    #[test]
    fn a_full_config_parses() {
        let c = parse(
            "version: 1\nsocket: /tmp/s.sock\nmetrics: 127.0.0.1:9464\naudit: /tmp/a.jsonl\n\
             audit_allows: true\ntimings: /tmp/t.csv\ndefaults:\n  trust: /etc/t.yaml\n  \
             state_dir: /tmp/st\n  max_connections: 10\n  poll_interval: 5s\n",
        )
        .unwrap();
        assert_eq!(c.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        assert!(c.audit_allows);
        assert_eq!(c.defaults.poll_interval, Duration::from_secs(5));
        assert_eq!(c.defaults.trust, Some(PathBuf::from("/etc/t.yaml")));
    }

    #[test]
    fn unknown_keys_are_refused_with_their_place() {
        let err = parse("socket: /s\nmetric: 1.2.3.4:5\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `metric`"), "{err}");
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let err = parse("socket: rel.sock\nmetrics: nope\ndefaults:\n  max_connections: 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("socket: `rel.sock`"), "{err}");
        assert!(err.contains("metrics: `nope`"), "{err}");
        assert!(err.contains("max_connections: 0"), "{err}");
    }
}
