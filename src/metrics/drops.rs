//! `sluice_dropped_packets_total{sandbox}`: read from each sandbox's nft
//! counter at scrape time through a closure the sandbox's owner registers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus::core::Desc;
use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};

/// Reads one sandbox's dropped-packet count; `None` when it cannot be read
/// right now (the series is then left out of that scrape).
pub type DropSource = Box<dyn Fn() -> Option<u64> + Send + Sync>;

const NAME: &str = "sluice_dropped_packets_total";
const HELP: &str =
    "Packets the sandbox's nftables output filter dropped (everything that is not redirected to sluice), read from the nft counter at scrape time.";

pub(super) struct DroppedPackets {
    desc: Desc,
    sources: Mutex<BTreeMap<String, Arc<DropSource>>>,
}

impl DroppedPackets {
    pub(super) fn new() -> Result<DroppedPackets, prometheus::Error> {
        Ok(DroppedPackets {
            desc: Desc::new(
                NAME.to_string(),
                HELP.to_string(),
                vec!["sandbox".to_string()],
                Default::default(),
            )?,
            sources: Mutex::new(BTreeMap::new()),
        })
    }

    pub(super) fn register(&self, sandbox: String, f: DropSource) {
        self.lock().insert(sandbox, Arc::new(f));
    }

    pub(super) fn unregister(&self, sandbox: &str) {
        self.lock().remove(sandbox);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<DropSource>>> {
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
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
        // Call the sources without holding the lock: a source may enter a
        // namespace and take a while.
        let sources: Vec<(String, Arc<DropSource>)> = self
            .0
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut metrics = Vec::with_capacity(sources.len());
        for (sandbox, source) in sources {
            let Some(value) = source() else {
                continue;
            };
            let mut label = LabelPair::default();
            label.set_name("sandbox".to_string());
            label.set_value(sandbox);
            let mut counter = Counter::default();
            counter.set_value(value as f64);
            let mut metric = Metric::from_label(vec![label]);
            metric.set_counter(counter);
            metrics.push(metric);
        }
        let mut family = MetricFamily::default();
        family.set_name(NAME.to_string());
        family.set_help(HELP.to_string());
        family.set_field_type(MetricType::COUNTER);
        family.set_metric(metrics);
        vec![family]
    }
}
