//! The report's "Calibration and tails" section: native beside the
//! reference pair (`bench::reference`), and every request's and every
//! round's P50 / P90 / P99. It reads results; it measures nothing.

use std::fmt::Write as _;

use super::stats::{self, Summary};
use super::{ConditionKind, Metric, Results, Workload};

/// The calibration (native beside the reference pair) and the tails a
/// median hides: every request's P50 / P90 / P99 for small and serial,
/// and every round's start+exit.
pub(crate) fn section(results: &Results, summary: &Summary) -> String {
    let mut md = String::from("\n## Calibration and tails\n\n");
    let small = |c: ConditionKind| summary.of(c)?.metrics.get(&Metric::Small)?.p50;
    match (
        small(ConditionKind::Native),
        small(ConditionKind::Reference),
    ) {
        (Some(native), Some(reference)) if reference > 0.0 => {
            let over = native / reference;
            let holds = (over - 1.0).abs() <= super::reference::CALIBRATED_WITHIN;
            let _ = writeln!(
                md,
                "Calibration: native's small P50 is {:.3} ms, the reference pair's {:.3} ms: \
                 native / reference = {over:.2}, {} (the rule: within {:.0}%).\n",
                native / 1e3,
                reference / 1e3,
                if holds {
                    "calibrated"
                } else {
                    "**not calibrated**: the bench's own client or origin is part of what native \
                     measures, so every ratio to native is compressed by up to that much"
                },
                super::reference::CALIBRATED_WITHIN * 100.0
            );
        }
        _ => md.push_str(
            "Calibration: not measured (run the `reference` condition beside `native`).\n\n",
        ),
    }
    md.push_str(
        "Every request of the formal batches (small, serial) and every round's start+exit, \
         in ms: P50 / P90 / P99.\n\n\
         | condition | small requests | serial requests | start+exit |\n|---|---|---|---|\n",
    );
    let three = |q: Option<[f64; 3]>| {
        q.map_or("-".into(), |[a, b, c]| {
            format!("{:.3} / {:.3} / {:.3}", a / 1e3, b / 1e3, c / 1e3)
        })
    };
    for c in &summary.conditions {
        let kind = c.condition;
        let _ = writeln!(
            md,
            "| {kind} | {} | {} | {} |",
            three(stats::request_quantiles(results, kind, Workload::Small)),
            three(stats::request_quantiles(results, kind, Workload::Serial)),
            three(stats::start_exit_quantiles(results, kind)),
        );
    }
    md
}
