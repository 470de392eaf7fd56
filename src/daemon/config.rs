//! `sluice daemon --config FILE`: the daemon's YAML configuration, read
//! through the policy's YAML layer (every node with its `line:col`, unknown
//! keys refused) and validated into [`DaemonConfig`], reporting every
//! problem at once, each at its place.
//!
//! ```yaml
//! socket: /run/sluice/daemon.sock   # control API (created 0600)
//! metrics: 127.0.0.1:9464           # /metrics, from the daemon's namespace
//! audit: /var/log/sluice/audit.jsonl
//! audit_allows: false
//! audit_max_bytes: 104857600
//! audit_checkpoint_records: 1000      # a signed checkpoint after N records,
//! audit_checkpoint_interval: 10s      # or when a record waited this long
//! timings: /var/log/sluice/timings.jsonl
//! upstream_ca: [/etc/sluice/origin-ca.pem]  # trusted for origins of TLS-terminating rules, besides the system roots
//! defaults:
//!   trust: /etc/sluice/trust.yaml   # for io.sluice.bundle without io.sluice.trust
//!   state_dir: /var/lib/sluice      # bundle rollback memory, restart records, audit.key
//!   max_connections: 4096           # per sandbox
//!   poll_interval: 30s              # https:// bundles (give or take a tenth)
//!   long_poll: 60s                  # how long their server may hold a poll (0s: never ask)
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::api::DEFAULT_SOCKET;
use crate::policy::yaml::{self, Node, Problem, Value};

const TOP_KEYS: &[&str] = &[
    "version",
    "socket",
    "metrics",
    "audit",
    "audit_allows",
    "audit_max_bytes",
    "audit_checkpoint_records",
    "audit_checkpoint_interval",
    "timings",
    "upstream_ca",
    "defaults",
];
const DEFAULTS_KEYS: &[&str] = &[
    "trust",
    "state_dir",
    "max_connections",
    "poll_interval",
    "long_poll",
];

/// The state directory unless the config names another.
pub(crate) use crate::bundle::DEFAULT_STATE_DIR;

/// Largest config file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A validated daemon configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DaemonConfig {
    pub(crate) socket: PathBuf,
    pub(crate) metrics: Option<SocketAddr>,
    pub(crate) audit: Option<PathBuf>,
    pub(crate) audit_allows: bool,
    pub(crate) audit_max_bytes: Option<u64>,
    /// Records between signed checkpoints (0: not by count).
    pub(crate) audit_checkpoint_records: u64,
    /// Longest a record waits for a signed checkpoint (zero: not by time).
    pub(crate) audit_checkpoint_interval: Duration,
    /// CA files trusted for origins besides the system roots, when sluice
    /// terminates TLS (`--upstream-ca` of the other commands).
    pub(crate) upstream_ca: Vec<PathBuf>,
    pub(crate) timings: Option<PathBuf>,
    pub(crate) defaults: Defaults,
}

/// What an attach request gets unless it says otherwise.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Defaults {
    pub(crate) trust: Option<PathBuf>,
    pub(crate) state_dir: PathBuf,
    pub(crate) max_connections: usize,
    pub(crate) poll_interval: Duration,
    /// How long an https:// bundle's server may hold a poll.
    pub(crate) long_poll: Duration,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("cannot read the daemon config {}: {cause}; check the path given to --config", path.display())]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// Not YAML sluice reads (syntax, anchors, tags, limits).
    #[error("{}:{line}:{column}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    /// Every problem found, one per line as `FILE:LINE:COL: what to do`.
    #[error("{}", problems.iter().map(|p| format!("{}:{p}", path.display())).collect::<Vec<_>>().join("\n"))]
    Invalid {
        path: PathBuf,
        /// `LINE:COL: message`, in file order.
        problems: Vec<String>,
    },
}

impl DaemonConfig {
    pub(crate) fn load(path: &Path) -> Result<DaemonConfig, ConfigError> {
        use std::io::Read;
        let read = |cause| ConfigError::Read {
            path: path.to_owned(),
            cause,
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
            .map_err(read)?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigError::Syntax {
                path: path.to_owned(),
                line: 1,
                column: 1,
                message: format!(
                    "the daemon config is over the {MAX_CONFIG_BYTES}-byte limit; it holds a few settings"
                ),
            });
        }
        DaemonConfig::parse(&text, path)
    }

    /// Parse `text` (`path` is for messages). An empty document is the
    /// defaults.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<DaemonConfig, ConfigError> {
        let root = yaml::parse(text).map_err(|p| ConfigError::Syntax {
            path: path.to_owned(),
            line: p.at.line,
            column: p.at.column,
            message: p.message,
        })?;
        let mut c = Checker::default();
        let config = c.config(&root);
        if c.problems.is_empty() {
            return Ok(config);
        }
        c.problems.sort_by_key(|p| p.at);
        Err(ConfigError::Invalid {
            path: path.to_owned(),
            problems: c
                .problems
                .into_iter()
                .map(|p| format!("{}: {}", p.at, p.message))
                .collect(),
        })
    }
}

/// Collects every problem while reading the config.
#[derive(Default)]
struct Checker {
    problems: Vec<Problem>,
}

impl Checker {
    fn ok<T>(&mut self, r: Result<T, Problem>) -> Option<T> {
        r.map_err(|p| self.problems.push(p)).ok()
    }

    fn path(&mut self, node: Option<&Node>, key: &str) -> Option<PathBuf> {
        let node = node?;
        self.ok(node.text(&format!("`{key}`"))).map(PathBuf::from)
    }

    fn config(&mut self, root: &Node) -> DaemonConfig {
        let what = "the daemon config";
        let entries = self.ok(root.map(what, TOP_KEYS)).unwrap_or(&[]);
        let f = yaml::fields(root.pos, entries, TOP_KEYS, what, &mut self.problems);

        if let Some(v) = f.get("version") {
            if let Some(n) = self.ok(v.unsigned("`version`")) {
                if n != 1 {
                    self.problems.push(Problem::new(
                        v.pos,
                        format!("`version: {n}` is not supported; write `version: 1`"),
                    ));
                }
            }
        }
        let socket = match f.get("socket") {
            None => PathBuf::from(DEFAULT_SOCKET),
            Some(v) => match self.path(Some(v), "socket") {
                Some(p) if p.is_absolute() => p,
                Some(p) => {
                    self.problems.push(Problem::new(
                        v.pos,
                        format!(
                            "`socket` is `{}`, not an absolute path; write one like {DEFAULT_SOCKET}",
                            p.display()
                        ),
                    ));
                    p
                }
                None => PathBuf::from(DEFAULT_SOCKET),
            },
        };
        let metrics = f.get("metrics").and_then(|v| {
            let text = self.ok(v.text("`metrics`"))?;
            let addr = text.parse::<SocketAddr>().map_err(|_| {
                Problem::new(
                    v.pos,
                    format!("`metrics` is `{text}`, not an address; write one like 127.0.0.1:9464"),
                )
            });
            self.ok(addr)
        });
        let audit = self.path(f.get("audit"), "audit");
        let audit_allows = f
            .get("audit_allows")
            .and_then(|v| self.ok(v.flag("`audit_allows`")))
            .unwrap_or(false);
        let audit_max_bytes = f
            .get("audit_max_bytes")
            .and_then(|v| self.ok(v.unsigned("`audit_max_bytes`")));
        let audit_checkpoint_records = f
            .get("audit_checkpoint_records")
            .and_then(|v| self.ok(v.unsigned("`audit_checkpoint_records`")))
            .unwrap_or(crate::audit::CHECKPOINT_EVERY_RECORDS);
        let audit_checkpoint_interval = f
            .get("audit_checkpoint_interval")
            .and_then(|v| self.duration(v, "audit_checkpoint_interval", "10s"))
            .unwrap_or(crate::audit::CHECKPOINT_INTERVAL);
        let timings = self.path(f.get("timings"), "timings");
        let mut upstream_ca = Vec::new();
        if let Some(v) = f.get("upstream_ca") {
            let items = self
                .ok(v.seq("`upstream_ca`", "[/etc/sluice/origin-ca.pem]"))
                .unwrap_or(&[]);
            for item in items {
                upstream_ca.extend(self.path(Some(item), "upstream_ca"));
            }
        }
        let defaults = self.defaults(f.get("defaults"));
        DaemonConfig {
            socket,
            metrics,
            audit,
            audit_allows,
            audit_max_bytes,
            audit_checkpoint_records,
            audit_checkpoint_interval,
            timings,
            upstream_ca,
            defaults,
        }
    }

    fn defaults(&mut self, node: Option<&Node>) -> Defaults {
        let mut out = Defaults {
            trust: None,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            max_connections: 4096,
            poll_interval: Duration::from_secs(30),
            long_poll: Duration::from_secs(60),
        };
        let Some(node) = node else { return out };
        let entries = self
            .ok(node.map("`defaults`", DEFAULTS_KEYS))
            .unwrap_or(&[]);
        let f = yaml::fields(
            node.pos,
            entries,
            DEFAULTS_KEYS,
            "`defaults`",
            &mut self.problems,
        );
        out.trust = self.path(f.get("trust"), "defaults.trust");
        if let Some(dir) = self.path(f.get("state_dir"), "defaults.state_dir") {
            out.state_dir = dir;
        }
        if let Some(v) = f.get("max_connections") {
            match self.ok(v.unsigned("`defaults.max_connections`")) {
                Some(0) => self.problems.push(Problem::new(
                    v.pos,
                    "`defaults.max_connections: 0` would refuse every connection; write 1 or more",
                )),
                Some(n) => out.max_connections = usize::try_from(n).unwrap_or(usize::MAX),
                None => {}
            }
        }
        if let Some(v) = f.get("poll_interval") {
            if let Some(d) = self.duration(v, "defaults.poll_interval", "30s") {
                out.poll_interval = d;
            }
        }
        if let Some(v) = f.get("long_poll") {
            if let Some(d) = self.duration(v, "defaults.long_poll", "60s") {
                out.long_poll = d;
            }
        }
        out
    }

    /// A duration with its unit (`30s`); `key` and `example` are for the
    /// message.
    fn duration(&mut self, v: &Node, key: &str, example: &str) -> Option<Duration> {
        let parsed = match &v.value {
            Value::Int(n) => Err(Problem::new(
                v.pos,
                format!("`{key}` is {n} without a unit; write it like `{n}s`"),
            )),
            _ => v.text(&format!("`{key}`")).and_then(|text| {
                humantime::parse_duration(text).map_err(|e| {
                    Problem::new(
                        v.pos,
                        format!(
                            "`{key}` is `{text}`, not a duration ({e}); write one like {example}"
                        ),
                    )
                })
            }),
        };
        self.ok(parsed)
    }
}

impl crate::exit_class::Classified for ConfigError {
    /// A config file that does not load.
    fn exit_class(&self) -> crate::exit_class::ExitClass {
        crate::exit_class::ExitClass::BadInput
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DaemonConfig, ConfigError> {
        DaemonConfig::parse(text, Path::new("d.yaml"))
    }

    #[test]
    fn the_packaged_config_loads_with_the_socket_and_state_dir_its_unit_makes() {
        // packaging/debian/sluice-daemon.service makes /run/sluice
        // (RuntimeDirectory) and /var/lib/sluice (StateDirectory).
        let text = include_str!("../../packaging/debian/daemon.yaml");
        let c = parse(text).unwrap();
        assert_eq!(c.socket, PathBuf::from("/run/sluice/daemon.sock"));
        assert_eq!(c.defaults.state_dir, PathBuf::from("/var/lib/sluice"));
        assert_eq!(c.audit, Some(PathBuf::from("/var/log/sluice/audit.jsonl")));
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
             audit_allows: true\naudit_checkpoint_records: 50\naudit_checkpoint_interval: 2s\n\
             timings: /tmp/t.csv\ndefaults:\n  trust: /etc/t.yaml\n  \
             state_dir: /tmp/st\n  max_connections: 10\n  poll_interval: 5s\n  long_poll: 0s\n",
        )
        .unwrap();
        assert_eq!(c.defaults.long_poll, Duration::ZERO);
        assert_eq!(c.audit_checkpoint_records, 50);
        assert_eq!(c.audit_checkpoint_interval, Duration::from_secs(2));
        assert_eq!(c.metrics, Some("127.0.0.1:9464".parse().unwrap()));
        assert!(c.audit_allows);
        assert_eq!(c.defaults.poll_interval, Duration::from_secs(5));
        assert_eq!(c.defaults.trust, Some(PathBuf::from("/etc/t.yaml")));
    }

    #[test]
    fn unknown_keys_are_refused_with_their_place_and_the_keys_allowed() {
        let err = parse("socket: /s\nmetric: 1.2.3.4:5\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "d.yaml:2:1: unknown key `metric` in the daemon config; did you mean `metrics`?"
            ),
            "{err}"
        );
        assert!(err.contains("`socket`, `metrics`, `audit`"), "{err}");
        assert!(!err.contains("field"), "{err}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let err = parse("socket: rel.sock\nmetrics: nope\ndefaults:\n  max_connections: 0\n")
            .unwrap_err()
            .to_string();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert!(
            lines[0].starts_with("d.yaml:1:9: `socket` is `rel.sock`"),
            "{err}"
        );
        assert!(
            lines[1].starts_with("d.yaml:2:10: `metrics` is `nope`"),
            "{err}"
        );
        assert!(
            lines[2].starts_with("d.yaml:4:20: `defaults.max_connections: 0`"),
            "{err}"
        );
    }

    #[test]
    fn a_wrong_type_says_what_to_write_at_its_place() {
        let err = parse("audit_allows: yes\ndefaults:\n  poll_interval: 30\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("d.yaml:1:15: `audit_allows` must be `true` or `false`, but it is the string \"yes\""),
            "{err}"
        );
        assert!(
            err.contains(
                "d.yaml:3:18: `defaults.poll_interval` is 30 without a unit; write it like `30s`"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_yaml_syntax_error_is_placed_once() {
        let err = parse("socket: [/s\n").unwrap_err().to_string();
        assert!(err.starts_with("d.yaml:2:1: "), "{err}");
        assert_eq!(err.matches("line").count(), 0, "{err}");
    }
}
