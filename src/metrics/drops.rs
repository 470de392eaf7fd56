//! `sluice_dropped_packets_total{sandbox,reason}`: each sandbox's nft drop
//! counters, read in the background and exported as last read. A host
//! sandbox has one reason (`output`); a microVM's fence one per reason it
//! refuses a packet for (`mac`, `arp`, `ipv4-source`, ...: a bounded set,
//! named by `enforce`).
//!
//! Reading a counter means entering the sandbox's namespace (a thread that
//! runs a libnftables read there): milliseconds, and more with many sandboxes. A
//! scrape must never wait for a refresh, so scrapes read a cache that one
//! refresher thread (`sluice-drops`) keeps current, every [`REFRESH`] while
//! someone scrapes, and rests once nobody has scraped for [`IDLE`].
//!
//! Every series is there from the first scrape: the refresher reads each
//! sandbox's counters once as soon as it is registered (it starts with
//! [`DroppedPackets::read_from_start`], which sluice calls when it serves
//! `/metrics`, else with the first scrape), and a scrape that finds a
//! sandbox not read even once waits for that first read, at most
//! [`FIRST_READ_WAIT`]. A sluice nobody can scrape never reads a counter.
//! This module never reads a counter on a scrape's thread.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use prometheus::core::Desc;
use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};

/// Reads one sandbox's dropped-packet count; `None` when it cannot be read
/// right now (the series is then left out until it can). Called on the
/// refresher thread, never on a scrape's.
pub(crate) type DropSource = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// Reads one sandbox's dropped-packet counts per reason (label values from a
/// bounded set); `None` when they cannot be read right now.
pub(crate) type DropCounts = Box<dyn Fn() -> Option<Vec<(&'static str, u64)>> + Send + Sync>;

/// One read of a sandbox's counts: `(reason, packets)`.
type Counts = Vec<(&'static str, u64)>;

/// The reason a [`DropSource`]'s single count is exported under: what a
/// host sandbox's one drop rule drops, the namespace's own output.
pub(crate) const SINGLE_REASON: &str = "output";

/// How often the counters are read while someone scrapes.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);
/// No scrape for this long: the refresher rests until the next one (and
/// reads only sandboxes registered meanwhile, once).
pub(crate) const IDLE: Duration = Duration::from_secs(60);
/// The longest a scrape waits for the first read of a sandbox's counters
/// (one never read is otherwise left out of that scrape).
pub const FIRST_READ_WAIT: Duration = Duration::from_secs(2);

const NAME: &str = "sluice_dropped_packets_total";
const HELP: &str =
    "Packets the sandbox's nftables rules dropped, by reason (output: the namespace's own traffic not redirected to sluice; a microVM's tap fence: mac, vlan, arp, ipv4-source, ipv6-router, ipv6-source, ethertype, not-redirected, input, forward), read from the nft counters in the background (at most a second or two old).";

struct Source {
    read: Arc<DropCounts>,
    /// The last values read (`None`: not read yet, or unreadable).
    last: Option<Counts>,
    /// Not read even once yet: a scrape waits for that first read.
    unread: bool,
}

#[derive(Default)]
struct State {
    sources: BTreeMap<String, Source>,
    /// When the last scrape asked; `None` before the first.
    last_scrape: Option<Instant>,
    refresher_started: bool,
    stopping: bool,
}

impl State {
    /// Whether someone scraped within [`IDLE`].
    fn scraped_lately(&self) -> bool {
        self.last_scrape.is_some_and(|at| at.elapsed() < IDLE)
    }

    fn any_unread(&self) -> bool {
        self.sources.values().any(|s| s.unread)
    }
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the refresher: a scrape after a rest, a new source, shutdown.
    wake: Condvar,
    /// Wakes scrapes waiting for a first read: the refresher read sources.
    read: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(super) struct DroppedPackets {
    desc: Desc,
    shared: Arc<Shared>,
}

impl DroppedPackets {
    pub(super) fn new() -> Result<DroppedPackets, prometheus::Error> {
        Ok(DroppedPackets {
            desc: Desc::new(
                NAME.to_string(),
                HELP.to_string(),
                vec!["sandbox".to_string(), "reason".to_string()],
                Default::default(),
            )?,
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
                read: Condvar::new(),
            }),
        })
    }

    /// Start the refresher now rather than at the first scrape, so that
    /// every sandbox's counters are read as soon as it is registered (for
    /// a sluice that serves `/metrics`: its first scrape then finds them
    /// read).
    pub(super) fn read_from_start(&self) {
        let mut state = self.shared.lock();
        self.start_refresher(&mut state);
    }

    /// Start the refresher thread unless it runs.
    fn start_refresher(&self, state: &mut State) {
        if state.refresher_started {
            return;
        }
        state.refresher_started = true;
        let shared = self.shared.clone();
        let started = std::thread::Builder::new()
            .name("sluice-drops".into())
            .spawn(move || refresh(&shared));
        if let Err(err) = started {
            state.refresher_started = false;
            tracing::warn!(%err, "cannot start the drop counter refresher; sluice_dropped_packets_total stays empty");
        }
    }

    pub(super) fn register(&self, sandbox: String, read: DropCounts) {
        let mut state = self.shared.lock();
        state.sources.insert(
            sandbox,
            Source {
                read: Arc::new(read),
                last: None,
                unread: true,
            },
        );
        drop(state);
        self.shared.wake.notify_all();
    }

    pub(super) fn unregister(&self, sandbox: &str) {
        self.shared.lock().sources.remove(sandbox);
    }

    /// The cached values; notes the scrape and starts or wakes the
    /// refresher, and waits (at most [`FIRST_READ_WAIT`]) for the first
    /// read of sources never read. Never reads a counter itself, and never
    /// waits for a refresh of one read before.
    fn scrape(&self) -> Vec<(String, &'static str, u64)> {
        let mut state = self.shared.lock();
        let rested = !state.scraped_lately();
        state.last_scrape = Some(Instant::now());
        self.start_refresher(&mut state);
        if rested {
            self.shared.wake.notify_all();
        }
        if state.refresher_started && state.any_unread() {
            state = self
                .shared
                .read
                .wait_timeout_while(state, FIRST_READ_WAIT, |s| !s.stopping && s.any_unread())
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        let mut out = Vec::new();
        for (sandbox, source) in &state.sources {
            for &(reason, value) in source.last.iter().flatten() {
                out.push((sandbox.clone(), reason, value));
            }
        }
        out
    }
}

impl Drop for DroppedPackets {
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.wake.notify_all();
        self.shared.read.notify_all();
    }
}

/// The refresher thread: read every source, then wait [`REFRESH`]; when
/// nobody scraped for [`IDLE`] (or ever), read only the sources never read,
/// and wait for a scrape or a new source.
fn refresh(shared: &Shared) {
    loop {
        let sources: Vec<(String, Arc<DropCounts>)> = {
            let mut state = shared.lock();
            loop {
                if state.stopping {
                    return;
                }
                if state.scraped_lately() || state.any_unread() {
                    break;
                }
                state = shared
                    .wake
                    .wait_while(state, |s| {
                        !s.stopping && !s.scraped_lately() && !s.any_unread()
                    })
                    .unwrap_or_else(|e| e.into_inner());
            }
            let all = state.scraped_lately();
            state
                .sources
                .iter()
                .filter(|(_, s)| all || s.unread)
                .map(|(k, s)| (k.clone(), s.read.clone()))
                .collect()
        };
        // Read without the lock: a read may take a while, and scrapes and
        // registrations must not wait for it.
        let values: Vec<(String, Arc<DropCounts>, Option<Counts>)> = sources
            .into_iter()
            .map(|(sandbox, read)| {
                let value = read();
                (sandbox, read, value)
            })
            .collect();
        let mut state = shared.lock();
        for (sandbox, read, value) in values {
            // Only if it is still the same source (not unregistered, or
            // replaced by a sandbox of the same id meanwhile).
            if let Some(source) = state.sources.get_mut(&sandbox) {
                if Arc::ptr_eq(&source.read, &read) {
                    source.last = value;
                    source.unread = false;
                }
            }
        }
        shared.read.notify_all();
        if state.scraped_lately() && !state.any_unread() {
            // A new source wakes this early, so its series appears at once.
            drop(
                shared
                    .wake
                    .wait_timeout(state, REFRESH)
                    .unwrap_or_else(|e| e.into_inner()),
            );
        }
    }
}

/// The registered face of `DroppedPackets` (the registry takes ownership of
/// a box; `Metrics` keeps the shared state).
pub(super) struct Collector(pub(super) Arc<DroppedPackets>);

impl prometheus::core::Collector for Collector {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let metrics = self
            .0
            .scrape()
            .into_iter()
            .map(|(sandbox, reason, value)| {
                let label = |name: &str, value: String| {
                    let mut label = LabelPair::default();
                    label.set_name(name.to_string());
                    label.set_value(value);
                    label
                };
                let mut counter = Counter::default();
                counter.set_value(value as f64);
                let mut metric = Metric::from_label(vec![
                    label("reason", reason.to_string()),
                    label("sandbox", sandbox),
                ]);
                metric.set_counter(counter);
                metric
            })
            .collect();
        let mut family = MetricFamily::default();
        family.set_name(NAME.to_string());
        family.set_help(HELP.to_string());
        family.set_field_type(MetricType::COUNTER);
        family.set_metric(metrics);
        vec![family]
    }
}
