//! The report's numbers, from a run's rounds: per condition and metric,
//! P50 and P95 across the batch statistics of the batches that succeeded
//! (failed ones never contribute), two clusters where bulk has them, the
//! paired difference to native per round with its seeded bootstrap CI, and
//! the ratio of P50s; the deny checks passed; the proxy's CPU per
//! connection; and which differences are called out (the CI excludes zero
//! and the difference exceeds [`CALL_OUT_FRACTION`] of native's P50).
//! Pure: a function of `Results`, using `timing::stats` for every
//! statistic.

use std::collections::BTreeMap;

use super::{ConditionKind, Metric, Results, Workload};
use crate::timing::stats::{paired_median_ci, quantile_sorted, two_clusters, Cluster, PairedDiff};

/// A difference smaller than this share of native's P50 is not called out.
pub(crate) const CALL_OUT_FRACTION: f64 = 0.05;

/// One condition's numbers for one metric (microseconds).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MetricStats {
    /// Batches that counted, and those that failed.
    pub(crate) batches: usize,
    pub(crate) failed: usize,
    pub(crate) p50: Option<f64>,
    pub(crate) p95: Option<f64>,
    /// Two clusters across the batch statistics (bulk), when they have two.
    pub(crate) clusters: Option<[Cluster; 2]>,
    /// Against native (None for native itself).
    pub(crate) diff: Option<PairedDiff>,
    pub(crate) ratio: Option<f64>,
    /// vm only, when vm-direct ran: against vm-direct in the same round,
    /// so virtualisation cancels and what is left is sluice's own cost.
    pub(crate) vs_plain_tap: Option<PairedDiff>,
    pub(crate) plain_tap_ratio: Option<f64>,
}

impl MetricStats {
    /// Whether the paired difference is real and large enough to say so.
    pub(crate) fn called_out(&self, native_p50: Option<f64>) -> bool {
        match (self.diff, native_p50) {
            (Some(d), Some(n)) => {
                d.excludes_zero() && d.median_diff_us.abs() > CALL_OUT_FRACTION * n
            }
            _ => false,
        }
    }
}

/// One condition's row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ConditionStats {
    pub(crate) condition: ConditionKind,
    pub(crate) metrics: BTreeMap<Metric, MetricStats>,
    /// Deny checks passed and made (None: the condition does not enforce).
    pub(crate) deny: Option<(usize, usize)>,
    /// The proxy's CPU per connection (µs) in the small and the serial
    /// workloads, over every formal batch.
    pub(crate) cpu_small_us: Option<f64>,
    pub(crate) cpu_serial_us: Option<f64>,
    /// The same over the `tls` and the `l7` workloads' connections.
    pub(crate) cpu_tls_us: Option<f64>,
    pub(crate) cpu_l7_us: Option<f64>,
}

/// The whole run's numbers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Summary {
    pub(crate) conditions: Vec<ConditionStats>,
}

impl Summary {
    pub(crate) fn of(&self, condition: ConditionKind) -> Option<&ConditionStats> {
        self.conditions.iter().find(|c| c.condition == condition)
    }

    /// native's P50 of `metric`.
    pub(crate) fn native_p50(&self, metric: Metric) -> Option<f64> {
        self.of(ConditionKind::Native)?.metrics.get(&metric)?.p50
    }
}

/// The batch statistics of every (condition, metric): batch -> value (µs),
/// successful batches only; and the number of failed batches.
type Series = BTreeMap<(ConditionKind, Metric), (BTreeMap<usize, f64>, usize)>;

fn series(results: &Results) -> Series {
    let mut out: Series = BTreeMap::new();
    for round in &results.rounds {
        for batch in &round.batches {
            for &metric in batch.workload.metrics() {
                let entry = out.entry((round.condition, metric)).or_default();
                match batch
                    .ok()
                    .then(|| metric.of(&batch.reply.samples))
                    .flatten()
                {
                    Some(v) => {
                        entry.0.insert(round.batch, v);
                    }
                    None => entry.1 += 1,
                }
            }
        }
        let entry = out.entry((round.condition, Metric::StartExit)).or_default();
        entry
            .0
            .insert(round.batch, (round.start + round.exit).as_secs_f64() * 1e6);
    }
    out
}

/// The paired difference of `values` to `base` over the batches both have
/// (seeded bootstrap CI), and the ratio of their P50s.
fn paired(
    values: &BTreeMap<usize, f64>,
    base: &BTreeMap<usize, f64>,
    seed: u64,
) -> (Option<PairedDiff>, Option<f64>) {
    let diffs: Vec<f64> = values
        .iter()
        .filter_map(|(b, v)| Some(v - base.get(b)?))
        .collect();
    let p50 = |m: &BTreeMap<usize, f64>| {
        let mut sorted: Vec<f64> = m.values().copied().collect();
        sorted.sort_by(f64::total_cmp);
        quantile_sorted(&sorted, 0.5)
    };
    let ratio = match (p50(values), p50(base)) {
        (Some(m), Some(n)) if n > 0.0 => Some(m / n),
        _ => None,
    };
    (paired_median_ci(&diffs, seed), ratio)
}

/// Summarise `results`; the bootstrap is seeded with the plan's seed.
pub(crate) fn summarise(results: &Results) -> Summary {
    let series = series(results);
    let seed = results.plan.seed;
    let conditions = results
        .ran
        .iter()
        .map(|&condition| {
            let metrics = Metric::ALL
                .iter()
                .filter_map(|&metric| {
                    let (values, failed) = series.get(&(condition, metric))?;
                    let mut sorted: Vec<f64> = values.values().copied().collect();
                    sorted.sort_by(f64::total_cmp);
                    let against = |base: ConditionKind| match series.get(&(base, metric)) {
                        Some((base, _)) => paired(values, base, seed),
                        None => (None, None),
                    };
                    let (diff, ratio) = if condition == ConditionKind::Native {
                        (None, None)
                    } else {
                        against(ConditionKind::Native)
                    };
                    let (vs_plain_tap, plain_tap_ratio) = if condition == ConditionKind::Vm {
                        against(ConditionKind::VmDirect)
                    } else {
                        (None, None)
                    };
                    let clusters = matches!(metric, Metric::Bulk1k | Metric::Bulk64k)
                        .then(|| two_clusters(&sorted))
                        .flatten();
                    Some((
                        metric,
                        MetricStats {
                            batches: sorted.len(),
                            failed: *failed,
                            p50: quantile_sorted(&sorted, 0.5),
                            p95: quantile_sorted(&sorted, 0.95),
                            clusters,
                            diff,
                            ratio,
                            vs_plain_tap,
                            plain_tap_ratio,
                        },
                    ))
                })
                .collect();
            let rounds = results.rounds.iter().filter(|r| r.condition == condition);
            let deny = condition.enforces().then(|| {
                rounds
                    .clone()
                    .filter_map(|r| r.deny.as_ref())
                    .fold((0, 0), |(p, n), d| (p + usize::from(d.passed), n + 1))
            });
            let cpu = |workload: Workload| {
                let (ns, conns) = rounds
                    .clone()
                    .flat_map(|r| &r.batches)
                    .filter(|b| b.workload == workload)
                    .try_fold((0u64, 0usize), |(ns, n), b| {
                        Some((ns + b.cpu_ns?, n + b.connections()))
                    })?;
                (conns > 0).then(|| ns as f64 / 1e3 / conns as f64)
            };
            ConditionStats {
                condition,
                metrics,
                deny,
                cpu_small_us: cpu(Workload::Small),
                cpu_serial_us: cpu(Workload::Serial),
                cpu_tls_us: cpu(Workload::Tls),
                cpu_l7_us: cpu(Workload::L7),
            }
        })
        .collect();
    Summary { conditions }
}

/// The P50, P90 and P99 (µs) of every request's time (connect start to the
/// body's last byte) in `condition`'s successful formal batches of
/// `workload`: the tail a per-batch median hides.
pub(crate) fn request_quantiles(
    results: &Results,
    condition: ConditionKind,
    workload: Workload,
) -> Option<[f64; 3]> {
    let times: Vec<f64> = results
        .rounds
        .iter()
        .filter(|r| r.condition == condition)
        .flat_map(|r| &r.batches)
        .filter(|b| b.workload == workload && b.ok())
        .flat_map(|b| b.reply.samples.iter().map(|s| s.last_byte_us as f64))
        .collect();
    p50_p90_p99(times)
}

/// The P50, P90 and P99 of `times`.
fn p50_p90_p99(mut times: Vec<f64>) -> Option<[f64; 3]> {
    times.sort_by(f64::total_cmp);
    Some([
        quantile_sorted(&times, 0.5)?,
        quantile_sorted(&times, 0.9)?,
        quantile_sorted(&times, 0.99)?,
    ])
}

/// The P50, P90 and P99 (µs) of `condition`'s start+exit over the formal
/// rounds.
pub(crate) fn start_exit_quantiles(
    results: &Results,
    condition: ConditionKind,
) -> Option<[f64; 3]> {
    let times: Vec<f64> = results
        .rounds
        .iter()
        .filter(|r| r.condition == condition)
        .map(|r| (r.start + r.exit).as_secs_f64() * 1e6)
        .collect();
    p50_p90_p99(times)
}

/// One of DESIGN.md's speed targets, judged on this run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Target {
    pub(crate) target: &'static str,
    /// Whether it holds; None when the run lacks what it needs.
    pub(crate) holds: Option<bool>,
    pub(crate) measured: String,
}

/// DESIGN.md's targets for sluice's `condition` (host, oci), judged side by
/// side with native and the peers of the same run.
pub(crate) fn targets(summary: &Summary, condition: ConditionKind) -> Vec<Target> {
    let Some(me) = summary.of(condition) else {
        return Vec::new();
    };
    let metric = |c: ConditionKind, m: Metric| summary.of(c)?.metrics.get(&m).cloned();
    // A microVM is judged against the same guest on a plain tap when that
    // ran (under emulation the guest's own stack dwarfs everything else);
    // every other condition against native.
    let plain_tap = condition == ConditionKind::Vm
        && metric(condition, Metric::Small).is_some_and(|m| m.vs_plain_tap.is_some());
    let base = if plain_tap { "vm-direct" } else { "native" };
    let own = |m: MetricStats| {
        if plain_tap {
            (m.vs_plain_tap, m.plain_tap_ratio)
        } else {
            (m.diff, m.ratio)
        }
    };
    let ratio = |c| {
        let m = metric(c, Metric::Small)?;
        if c == condition {
            own(m).1
        } else {
            m.ratio
        }
    };
    let diff_us = |m| Some(own(metric(condition, m)?).0?.median_diff_us);
    let mut out = Vec::new();
    let haproxy_cpu = summary
        .of(ConditionKind::Haproxy)
        .and_then(|h| h.cpu_small_us);
    out.push(Target {
        target: "less proxy CPU per fresh connection than haproxy",
        holds: me.cpu_small_us.zip(haproxy_cpu).map(|(a, b)| a < b),
        measured: format!("{} vs haproxy {}", us(me.cpu_small_us), us(haproxy_cpu)),
    });
    let peers: Vec<(ConditionKind, f64)> = [ConditionKind::Haproxy, ConditionKind::TokioProxy]
        .into_iter()
        .filter_map(|c| Some((c, ratio(c)?)))
        .collect();
    out.push(Target {
        target: "8-thread ratio to native below haproxy's and the minimal proxy's",
        holds: ratio(condition)
            .filter(|_| !peers.is_empty())
            .map(|r| peers.iter().all(|(_, p)| r < *p)),
        measured: std::iter::once(format!(
            "{condition} {}{}",
            x(ratio(condition)),
            if plain_tap { " of vm-direct" } else { "" }
        ))
        .chain(peers.iter().map(|(c, r)| format!("{c} {}", x(Some(*r)))))
        .collect::<Vec<_>>()
        .join(", "),
    });
    let within = |m, limit_us: f64, what: &'static str| {
        let d = diff_us(m);
        Target {
            target: what,
            holds: d.map(|d| d <= limit_us),
            measured: format!("{} (paired median, vs {base})", signed_us(d)),
        }
    };
    out.push(within(
        Metric::Serial,
        70.0,
        "one-at-a-time overhead at most +70 µs",
    ));
    out.push(within(
        Metric::StreamFirst,
        100.0,
        "stream first byte within +0.1 ms of native",
    ));
    let bulk = metric(condition, Metric::Bulk64k).and_then(|m| own(m).1);
    out.push(Target {
        target: "32 MiB (64 KiB writes) at 95% or more of native throughput",
        holds: bulk.map(|r| 1.0 / r >= 0.95),
        measured: bulk
            .map(|r| format!("{:.0}% of {base}", 100.0 / r))
            .unwrap_or_else(|| "-".into()),
    });
    out.push(within(
        Metric::StartExit,
        5000.0,
        "start + exit at most 5 ms more than the native client's",
    ));
    out
}

fn us(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0} µs"))
        .unwrap_or_else(|| "-".into())
}

fn signed_us(v: Option<f64>) -> String {
    v.map(|v| format!("{v:+.0} µs"))
        .unwrap_or_else(|| "-".into())
}

fn x(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}x")).unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::client::{Reply, Sample};
    use crate::bench::{BatchOutcome, DenyCheck, Plan, RoundOutcome};
    use std::time::Duration;

    fn round(batch: usize, condition: ConditionKind, small_us: u64, ok: bool) -> RoundOutcome {
        let sample = Sample {
            connect_us: 1,
            first_byte_us: small_us / 2,
            last_byte_us: small_us,
            total_us: small_us,
        };
        RoundOutcome {
            batch,
            position: 1,
            condition,
            start: Duration::from_millis(2),
            exit: Duration::from_millis(1),
            deny: condition.enforces().then(|| DenyCheck {
                passed: true,
                detail: String::new(),
            }),
            batches: vec![BatchOutcome {
                workload: Workload::Small,
                reply: Reply {
                    samples: vec![sample; 4],
                    failed: usize::from(!ok),
                    ..Reply::default()
                },
                cpu_ns: condition.enforces().then_some(400_000),
            }],
        }
    }

    fn results(rounds: Vec<RoundOutcome>) -> Results {
        Results {
            plan: Plan {
                conditions: vec![ConditionKind::Native, ConditionKind::Host],
                workloads: vec![Workload::Small],
                batches: 4,
                warmups: 0,
                conns: 4,
                threads: 1,
                seed: 3,
                image: String::new(),
                build_missing: false,
            },
            ran: vec![ConditionKind::Native, ConditionKind::Host],
            skipped: Vec::new(),
            rounds,
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    fn a_failed_batch_never_contributes_latency() {
        let mut rounds = Vec::new();
        for b in 1..=4 {
            rounds.push(round(b, ConditionKind::Native, 100, true));
            // Round 4's host batch failed: its huge time must not count.
            rounds.push(round(
                b,
                ConditionKind::Host,
                if b == 4 { 99_999 } else { 300 },
                b != 4,
            ));
        }
        let s = summarise(&results(rounds));
        let host = &s.of(ConditionKind::Host).unwrap().metrics[&Metric::Small];
        assert_eq!((host.batches, host.failed), (3, 1));
        assert_eq!(host.p50, Some(300.0));
        assert_eq!(host.ratio, Some(3.0));
        let diff = host.diff.unwrap();
        assert_eq!((diff.pairs, diff.median_diff_us), (3, 200.0));
        assert!(host.called_out(s.native_p50(Metric::Small)));
    }

    #[test]
    fn a_microvm_is_paired_with_the_same_guest_on_a_plain_tap_and_judged_against_it() {
        let mut rounds = Vec::new();
        for b in 1..=4 {
            rounds.push(round(b, ConditionKind::Native, 100, true));
            rounds.push(round(b, ConditionKind::Vm, 2_100 + 10 * b as u64, true));
            rounds.push(round(
                b,
                ConditionKind::VmDirect,
                2_000 + 10 * b as u64,
                true,
            ));
        }
        let mut r = results(rounds);
        r.ran = vec![
            ConditionKind::Native,
            ConditionKind::Vm,
            ConditionKind::VmDirect,
        ];
        let s = summarise(&r);
        let vm = &s.of(ConditionKind::Vm).unwrap().metrics[&Metric::Small];
        // Every round's vm is 100 µs over that round's vm-direct.
        let own = vm.vs_plain_tap.unwrap();
        assert_eq!((own.pairs, own.median_diff_us), (4, 100.0));
        assert!(vm.diff.unwrap().median_diff_us > 2_000.0);
        let direct = &s.of(ConditionKind::VmDirect).unwrap().metrics[&Metric::Small];
        assert_eq!(direct.vs_plain_tap, None);
        let stream = targets(&s, ConditionKind::Vm)
            .into_iter()
            .find(|t| t.target.starts_with("one-at-a-time"))
            .unwrap();
        assert!(
            stream.measured.contains("vs vm-direct"),
            "{}",
            stream.measured
        );
    }

    #[test]
    fn cpu_per_connection_and_deny_checks_are_counted_per_condition() {
        let mut rounds = Vec::new();
        for b in 1..=2 {
            rounds.push(round(b, ConditionKind::Native, 100, true));
            rounds.push(round(b, ConditionKind::Host, 300, true));
        }
        let s = summarise(&results(rounds));
        let host = s.of(ConditionKind::Host).unwrap();
        // 400 µs over 4 connections a batch.
        assert_eq!(host.cpu_small_us, Some(100.0));
        assert_eq!(host.deny, Some((2, 2)));
        let native = s.of(ConditionKind::Native).unwrap();
        assert_eq!((native.deny, native.cpu_small_us), (None, None));
        assert_eq!(host.metrics[&Metric::StartExit].p50, Some(3000.0));
    }

    /// A condition's small metric whose paired difference to native is
    /// `median_diff_us` with the interval `ci_us`.
    fn differing_by(median_diff_us: f64, ci_us: (f64, f64)) -> MetricStats {
        MetricStats {
            batches: 10,
            failed: 0,
            p50: Some(1000.0 + median_diff_us),
            p95: None,
            clusters: None,
            diff: Some(PairedDiff {
                pairs: 10,
                median_diff_us,
                ci_low_us: ci_us.0,
                ci_high_us: ci_us.1,
            }),
            ratio: None,
            vs_plain_tap: None,
            plain_tap_ratio: None,
        }
    }

    #[test]
    fn a_real_difference_of_at_most_5_percent_of_natives_p50_is_not_called_out() {
        // native's P50 is 1000 µs: 50 µs either way is within 5%.
        for m in [
            differing_by(50.0, (40.0, 60.0)),
            differing_by(-50.0, (-60.0, -40.0)),
        ] {
            assert!(m.diff.unwrap().excludes_zero());
            assert!(!m.called_out(Some(1000.0)), "{m:?}");
        }
    }

    #[test]
    fn a_real_difference_above_5_percent_of_natives_p50_is_called_out() {
        for m in [
            differing_by(51.0, (41.0, 61.0)),
            differing_by(-51.0, (-61.0, -41.0)),
        ] {
            assert!(m.called_out(Some(1000.0)), "{m:?}");
        }
    }

    #[test]
    fn a_large_difference_whose_interval_holds_zero_is_not_called_out() {
        let m = differing_by(500.0, (-10.0, 900.0));
        assert!(!m.called_out(Some(1000.0)), "{m:?}");
    }
}
