//! What `sluice bench` leaves in `--out DIR`: report.md (the machine, the
//! exact command, the seed, the table in the published report's shape, the
//! paired differences, what is called out, DESIGN.md's targets), and the
//! data behind it: batches.csv (a row per condition, workload and batch),
//! paired.csv (`condition,workload,diff_median_ms,ci_low_ms,ci_high_ms,ratio`;
//! vm paired with vm-direct too, as condition `vm-vs-vm-direct`),
//! raw.jsonl (every request's times). The plots come from `plot`. This
//! module writes only inside DIR and computes nothing `stats` did not.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::stats::{self, ConditionStats, MetricStats, Summary};
use super::{BenchError, ConditionKind, Metric, Results, Workload};

pub const BATCHES_HEADER: &str = "batch,position,condition,workload,ok,requests,failed,median_ms,p95_ms,first_byte_median_ms,cpu_us_per_connection,session_start_ms,session_exit_ms";
pub(crate) const PAIRED_HEADER: &str =
    "condition,workload,diff_median_ms,ci_low_ms,ci_high_ms,ratio";

/// Where and on what a run happened.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) cpu_model: String,
    pub(crate) kernel: String,
    pub(crate) load_before: String,
    pub(crate) load_after: String,
    pub(crate) started: String,
    pub(crate) build: &'static str,
}

impl Machine {
    /// This machine now (`load_after` is filled in at the end).
    pub(crate) fn observe() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: read("/proc/cpuinfo")
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
                .unwrap_or_else(|| "unknown CPU".into()),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            load_before: load_average(),
            load_after: String::new(),
            started: time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
        }
    }
}

/// The 1, 5 and 15 minute load averages.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Write every file of the report into `dir` (created if need be).
pub(crate) fn write(
    dir: &Path,
    results: &Results,
    summary: &Summary,
    machine: &Machine,
    command: &str,
) -> Result<(), BenchError> {
    let out = |name: &str| dir.join(name);
    let write = |path: PathBuf, text: String| {
        std::fs::write(&path, text).map_err(|cause| BenchError::Output { path, cause })
    };
    std::fs::create_dir_all(dir).map_err(|cause| BenchError::Output {
        path: dir.to_path_buf(),
        cause,
    })?;
    write(out("batches.csv"), batches_csv(results))?;
    write(out("paired.csv"), paired_csv(summary))?;
    write(out("raw.jsonl"), raw_jsonl(results))?;
    super::plot::ecdf_small(results, &out("ecdf-small.svg"))?;
    super::plot::paired(summary, &out("paired.svg"))?;
    write(
        out("report.md"),
        markdown(results, summary, machine, command),
    )?;
    Ok(())
}

fn ms(us: Option<f64>) -> String {
    us.map(|v| format!("{:.3}", v / 1e3)).unwrap_or_default()
}

fn batches_csv(results: &Results) -> String {
    let mut out = format!("{BATCHES_HEADER}\n");
    for r in &results.rounds {
        for b in &r.batches {
            let mut last: Vec<f64> = b
                .reply
                .samples
                .iter()
                .map(|s| s.last_byte_us as f64)
                .collect();
            last.sort_by(f64::total_cmp);
            let first: Vec<f64> = b
                .reply
                .samples
                .iter()
                .map(|s| s.first_byte_us as f64)
                .collect();
            let cpu = b
                .cpu_ns
                .filter(|_| b.connections() > 0)
                .map(|ns| format!("{:.1}", ns as f64 / 1e3 / b.connections() as f64))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{cpu},{:.3},{:.3}",
                r.batch,
                r.position,
                r.condition,
                b.workload.name(),
                b.ok(),
                b.connections(),
                b.reply.failed,
                ms(stats_quantile(&last, 0.5)),
                ms(stats_quantile(&last, 0.95)),
                ms(crate::timing::stats::median(&first)),
                r.start.as_secs_f64() * 1e3,
                r.exit.as_secs_f64() * 1e3,
            );
        }
    }
    out
}

fn stats_quantile(sorted: &[f64], q: f64) -> Option<f64> {
    crate::timing::stats::quantile_sorted(sorted, q)
}

fn paired_csv(summary: &Summary) -> String {
    let mut out = format!("{PAIRED_HEADER}\n");
    for c in &summary.conditions {
        if c.condition == ConditionKind::Native {
            continue;
        }
        for (metric, m) in &c.metrics {
            let d = |f: fn(&crate::timing::stats::PairedDiff) -> f64| ms(m.diff.as_ref().map(f));
            let _ = writeln!(
                out,
                "{},{},{},{},{},{}",
                c.condition,
                metric.name(),
                d(|d| d.median_diff_us),
                d(|d| d.ci_low_us),
                d(|d| d.ci_high_us),
                m.ratio.map(|r| format!("{r:.3}")).unwrap_or_default()
            );
        }
    }
    // vm against the same guest on a plain tap, paired in the same rounds.
    for c in summary
        .conditions
        .iter()
        .filter(|c| c.condition == ConditionKind::Vm)
    {
        for (metric, m) in &c.metrics {
            let Some(d) = m.vs_plain_tap else { continue };
            let _ = writeln!(
                out,
                "{VM_OVER_PLAIN_TAP},{},{},{},{},{}",
                metric.name(),
                ms(Some(d.median_diff_us)),
                ms(Some(d.ci_low_us)),
                ms(Some(d.ci_high_us)),
                m.plain_tap_ratio
                    .map(|r| format!("{r:.3}"))
                    .unwrap_or_default()
            );
        }
    }
    out
}

/// paired.csv's `condition` for vm paired with vm-direct rather than native.
pub(crate) const VM_OVER_PLAIN_TAP: &str = "vm-vs-vm-direct";

fn raw_jsonl(results: &Results) -> String {
    let mut out = String::new();
    for r in &results.rounds {
        for b in &r.batches {
            for (seq, s) in b.reply.samples.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "{}",
                    serde_json::json!({
                        "batch": r.batch,
                        "condition": r.condition.name(),
                        "workload": b.workload.name(),
                        "seq": seq,
                        "connect_us": s.connect_us,
                        "first_byte_us": s.first_byte_us,
                        "last_byte_us": s.last_byte_us,
                        "total_us": s.total_us,
                    })
                );
            }
        }
    }
    out
}

/// A cell: P50 in ms, or each cluster's count and median.
fn cell(m: Option<&MetricStats>) -> String {
    let Some(m) = m else { return "-".into() };
    let failed = if m.failed > 0 {
        format!(" ({} failed)", m.failed)
    } else {
        String::new()
    };
    match m.clusters {
        Some([lo, hi]) => format!(
            "{} at {:.1}, {} at {:.1}{failed}",
            lo.count,
            lo.median_us / 1e3,
            hi.count,
            hi.median_us / 1e3
        ),
        None => format!("{}{failed}", or_dash(ms(m.p50))),
    }
}

fn or_dash(s: String) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s
    }
}

fn diff_cell(m: Option<&MetricStats>) -> String {
    match m.and_then(|m| m.diff) {
        Some(d) => format!(
            "{:+.3} [{:+.3}, {:+.3}]",
            d.median_diff_us / 1e3,
            d.ci_low_us / 1e3,
            d.ci_high_us / 1e3
        ),
        None => "-".into(),
    }
}

fn row(c: &ConditionStats) -> String {
    let m = |metric| c.metrics.get(&metric);
    let ratio = m(Metric::Small)
        .and_then(|m| m.ratio)
        .map(|r| format!("{r:.2}"))
        .unwrap_or_else(|| {
            if c.condition == ConditionKind::Native {
                "1.00".into()
            } else {
                "-".into()
            }
        });
    let deny = c
        .deny
        .map(|(p, n)| format!("{p}/{n}"))
        .unwrap_or_else(|| "-".into());
    let cpu = |v: Option<f64>| {
        v.map(|v| format!("{v:.0} µs"))
            .unwrap_or_else(|| "-".into())
    };
    format!(
        "| {} | {} | {} | {ratio} | {} | {} | {} | {} | {} | {} | {deny} | {} | {} |",
        c.condition,
        cell(m(Metric::Small)),
        or_dash(ms(m(Metric::Small).and_then(|m| m.p95))),
        diff_cell(m(Metric::Small)),
        cell(m(Metric::Serial)),
        cell(m(Metric::Bulk1k)),
        cell(m(Metric::Bulk64k)),
        cell(m(Metric::StreamFirst)),
        cell(m(Metric::StreamLast)),
        cpu(c.cpu_small_us),
        cell(m(Metric::StartExit)),
    )
}

/// The `tls` and `l7` workloads side by side: per-batch P50, its ratio to
/// native, and the P90/P99 of every request (the tail a median hides), the
/// proxy's CPU per connection, and l7's P50 over tls's.
pub(crate) fn tls_table(results: &Results, summary: &Summary) -> String {
    let mut md = String::from(
        "\n## TLS: relayed by SNI (tls) and terminated with a header injected (l7)\n\n\
         Fresh TLS connections one at a time, one 1 KiB GET each, by address with the name as \
         SNI. tls: the rule admits the name, the proxy relays the bytes. l7: the rule decides \
         every request (GET /bytes/*) and injects `Authorization`; sluice terminates with its \
         sandbox CA (the client trusts the bundle `sluice run` delivers in SSL_CERT_FILE), \
         haproxy with the origin's own certificate, and each verifies the origin on a TLS \
         connection of its own. Requests: P50 / P90 / P99 over every request of the formal \
         batches.\n\n\
         | condition | tls P50 | x native | tls requests P50 / P90 / P99 | l7 P50 | x native | l7 requests P50 / P90 / P99 | l7 / tls | proxy CPU / conn, tls | l7 |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let ratio = |m: Option<&MetricStats>, native: bool| match m.and_then(|m| m.ratio) {
        Some(r) => format!("{r:.2}"),
        None if native && m.is_some() => "1.00".into(),
        None => "-".into(),
    };
    let tail = |c: ConditionKind, w: Workload| match stats::request_quantiles(results, c, w) {
        Some([p50, p90, p99]) => format!("{:.3} / {:.3} / {:.3}", p50 / 1e3, p90 / 1e3, p99 / 1e3),
        None => c
            .skips(w)
            .map_or("-".into(), |why| format!("skipped: {why}")),
    };
    let cpu = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0} µs"));
    for c in &summary.conditions {
        let native = c.condition == ConditionKind::Native;
        let tls = c.metrics.get(&Metric::Tls);
        let l7 = c.metrics.get(&Metric::L7);
        let over = match (l7.and_then(|m| m.p50), tls.and_then(|m| m.p50)) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {over} | {} | {} |",
            c.condition,
            cell(tls),
            ratio(tls, native),
            tail(c.condition, Workload::Tls),
            cell(l7),
            ratio(l7, native),
            tail(c.condition, Workload::L7),
            cpu(c.cpu_tls_us),
            cpu(c.cpu_l7_us),
        );
    }
    md
}

/// The main table, as report.md has it (also printed at the end of a run).
pub(crate) fn table(summary: &Summary) -> String {
    let mut out = String::from(
        "| condition | small P50 | small P95 | x native | small diff to native [95% CI] | serial P50 | 32 MiB, 1 KiB writes | 32 MiB, 64 KiB writes | stream first byte | stream last byte | deny | proxy CPU / conn | start+exit |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in &summary.conditions {
        out.push_str(&row(c));
        out.push('\n');
    }
    out
}

fn markdown(results: &Results, summary: &Summary, machine: &Machine, command: &str) -> String {
    let mut md = String::from("# sluice bench\n\n");
    write_run(&mut md, results, machine, command);
    write_results(&mut md, summary);
    md.push_str(&super::calibration::section(results, summary));
    let called = write_paired(&mut md, summary);
    write_plain_tap(&mut md, summary);
    if results
        .plan
        .workloads
        .iter()
        .any(|w| matches!(w, Workload::Tls | Workload::L7))
    {
        md.push_str(&tls_table(results, summary));
    }
    write_called_out(&mut md, called);
    write_targets(&mut md, results, summary);
    write_deny_failures(&mut md, results);
    md.push_str(
        "\n## Files\n\nbatches.csv (a row per condition, workload and batch), paired.csv (the \
         paired differences), raw.jsonl (every request's times, µs from connect start).\n\n\
         ![ECDF of small request times per condition](ecdf-small.svg)\n\n\
         ![Paired differences to native with 95% CIs](paired.svg)\n",
    );
    md
}

/// The run: when and where, the exact command, the plan, the conditions.
fn write_run(md: &mut String, results: &Results, machine: &Machine, command: &str) {
    let plan = &results.plan;
    let _ = writeln!(
        md,
        "Run {} ({:.0} s). Machine: {} CPUs ({}), Linux {}; load average {} before, {} after. \
         sluice {} ({} build).\n",
        machine.started,
        results.elapsed.as_secs_f64(),
        machine.cpus,
        machine.cpu_model,
        machine.kernel,
        machine.load_before,
        machine.load_after,
        env!("CARGO_PKG_VERSION"),
        machine.build
    );
    if machine.build == "debug" {
        md.push_str("**A debug build measured this run: the client, the origin and sluice are all slower than in a release build. Use a release build for numbers to quote.**\n\n");
    }
    let _ = writeln!(md, "    {command}\n");
    let _ = writeln!(
        md,
        "Seed {}. {} batches after {} warmup rounds; in every round each condition starts a fresh \
         session and runs every workload; the condition order is shuffled every round. small: {} \
         fresh connections, {} threads, 1 KiB bodies, `Connection: close`; serial: the same one at \
         a time; bulk: 32 MiB in 1 KiB and in 64 KiB origin writes; stream: {} responses of ten \
         13-byte events 2 ms apart.\n",
        plan.seed,
        plan.batches,
        plan.warmups,
        plan.conns,
        plan.threads,
        super::workload::STREAMS
    );
    md.push_str("Conditions:\n\n");
    for kind in &results.ran {
        let _ = writeln!(md, "- **{kind}**: {}", kind.describe());
    }
    for (kind, why) in &results.skipped {
        let _ = writeln!(md, "- {kind}: skipped: {why}");
    }
}

/// The main table and how to read it.
fn write_results(md: &mut String, summary: &Summary) {
    md.push_str("\n## Results\n\n");
    md.push_str(&table(summary));
    md.push_str(
        "\nTimes in ms. Each batch is summarised by the median of its requests (connect start to \
         the body's last byte); P50 and P95 are across those batch medians, failed batches left \
         out (their count is shown). x native: P50 over native's P50. The paired difference is \
         the median over rounds of (condition - native) in the same round, with a 95% bootstrap \
         interval (5,000 resamples, seeded). Bulk shows each cluster's count and median when \
         its batches fall in two clusters. deny: deny checks passed (a socket to a live service \
         the policy forbids must fail, an allowed one succeed, and the deny be in sluice's audit \
         log; `-` where no policy is enforced). proxy CPU / conn: user + system time of the proxy process \
         (sluice, haproxy, the tokio proxy) over the small workload's connections. start+exit: \
         from starting the session to the client's first line, plus from `quit` to the \
         session's exit.\n",
    );
}

/// The paired differences of every condition to native. Returns the ones
/// called out, one line each, for the list after the tables.
fn write_paired(md: &mut String, summary: &Summary) -> Vec<String> {
    md.push_str("\n## Paired differences to native\n\n| condition | metric | difference (ms) | 95% CI (ms) | ratio | |\n|---|---|---|---|---|---|\n");
    let mut called = Vec::new();
    for c in &summary.conditions {
        if c.condition == ConditionKind::Native {
            continue;
        }
        for (metric, m) in &c.metrics {
            let Some(d) = m.diff else { continue };
            let out = m.called_out(summary.native_p50(*metric));
            if out {
                called.push(format!(
                    "{} {}: {:+.3} ms [{:+.3}, {:+.3}], {}",
                    c.condition,
                    metric.title(),
                    d.median_diff_us / 1e3,
                    d.ci_low_us / 1e3,
                    d.ci_high_us / 1e3,
                    m.ratio
                        .map(|r| format!("{r:.2}x native"))
                        .unwrap_or_default()
                ));
            }
            let _ = writeln!(
                md,
                "| {} | {} | {:+.3} | [{:+.3}, {:+.3}] | {} | {} |",
                c.condition,
                metric.title(),
                d.median_diff_us / 1e3,
                d.ci_low_us / 1e3,
                d.ci_high_us / 1e3,
                m.ratio
                    .map(|r| format!("{r:.2}"))
                    .unwrap_or_else(|| "-".into()),
                if out { "called out" } else { "" }
            );
        }
    }
    called
}

/// vm paired with vm-direct, when both ran: sluice's own cost on the
/// microVM path.
fn write_plain_tap(md: &mut String, summary: &Summary) {
    let plain_tap: Vec<(Metric, crate::timing::stats::PairedDiff, Option<f64>)> = summary
        .of(ConditionKind::Vm)
        .map(|c| {
            c.metrics
                .iter()
                .filter_map(|(metric, m)| Some((*metric, m.vs_plain_tap?, m.plain_tap_ratio)))
                .collect()
        })
        .unwrap_or_default();
    if plain_tap.is_empty() {
        return;
    }
    md.push_str(
        "\n## sluice's own cost on the microVM path: vm - vm-direct\n\nThe same guest \
         through `sluice vm` and on a plain tap, paired in the same rounds, so the cost of \
         virtualisation cancels.\n\n| metric | difference (ms) | 95% CI (ms) | ratio |\n|---|---|---|---|\n",
    );
    for (metric, d, ratio) in plain_tap {
        let _ = writeln!(
            md,
            "| {} | {:+.3} | [{:+.3}, {:+.3}] | {} |",
            metric.title(),
            d.median_diff_us / 1e3,
            d.ci_low_us / 1e3,
            d.ci_high_us / 1e3,
            ratio
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into()),
        );
    }
}

/// The differences called out (or "nothing").
fn write_called_out(md: &mut String, called: Vec<String>) {
    let _ = writeln!(
        md,
        "\nCalled out (the interval excludes zero and the difference exceeds {:.0}% of native's P50):\n",
        stats::CALL_OUT_FRACTION * 100.0
    );
    if called.is_empty() {
        md.push_str("- nothing\n");
    }
    for c in called {
        let _ = writeln!(md, "- {c}");
    }
}

/// DESIGN.md's targets, for every sluice condition that ran.
fn write_targets(md: &mut String, results: &Results, summary: &Summary) {
    for kind in results.ran.iter().filter(|k| k.is_sluice()) {
        let _ = writeln!(
            md,
            "\n## DESIGN.md's targets, {kind}\n\n| target | holds | measured |\n|---|---|---|"
        );
        for t in stats::targets(summary, *kind) {
            let holds = match t.holds {
                Some(true) => "yes",
                Some(false) => "no",
                None => "not measured",
            };
            let _ = writeln!(md, "| {} | {holds} | {} |", t.target, t.measured);
        }
    }
}

/// Every deny check that failed, if any did.
fn write_deny_failures(md: &mut String, results: &Results) {
    let failures = results.deny_failures();
    if failures.is_empty() {
        return;
    }
    md.push_str("\n## Deny checks that failed\n\n");
    for f in failures {
        let _ = writeln!(md, "- {f}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_column_for_every_number_the_published_report_gives() {
        let t = table(&Summary {
            conditions: Vec::new(),
        });
        let header = t.lines().next().unwrap();
        for column in [
            "small P50",
            "small P95",
            "x native",
            "small diff to native [95% CI]",
            "serial P50",
            "32 MiB, 1 KiB writes",
            "32 MiB, 64 KiB writes",
            "stream first byte",
            "stream last byte",
            "deny",
            "proxy CPU / conn",
            "start+exit",
        ] {
            assert!(header.contains(column), "{column}");
        }
        assert_eq!(
            t.lines().nth(1).unwrap().matches('|').count(),
            header.matches('|').count()
        );
    }

    /// One round of `condition` whose 32 MiB (64 KiB writes) batch took
    /// `us`.
    fn bulk_round(batch: usize, condition: ConditionKind, us: u64) -> crate::bench::RoundOutcome {
        use crate::bench::client::{Reply, Sample};
        crate::bench::RoundOutcome {
            batch,
            position: 1,
            condition,
            start: std::time::Duration::ZERO,
            exit: std::time::Duration::ZERO,
            deny: None,
            batches: vec![crate::bench::BatchOutcome {
                workload: crate::bench::Workload::Bulk64k,
                reply: Reply {
                    samples: vec![Sample {
                        connect_us: 1,
                        first_byte_us: 2,
                        last_byte_us: us,
                        total_us: us,
                    }],
                    ..Reply::default()
                },
                cpu_ns: None,
            }],
        }
    }

    #[test]
    fn bulk_batches_in_two_clusters_are_reported_as_two_counts_and_medians() {
        // host's bulk batches fall at ~20 ms (6) and ~200 ms (4); native's
        // all at 10 ms.
        let host = [
            19_000, 200_000, 20_000, 20_000, 190_000, 21_000, 20_000, 210_000, 20_000, 200_000,
        ];
        let mut rounds = Vec::new();
        for (i, us) in host.into_iter().enumerate() {
            rounds.push(bulk_round(i + 1, ConditionKind::Native, 10_000));
            rounds.push(bulk_round(i + 1, ConditionKind::Host, us));
        }
        let results = Results {
            plan: crate::bench::Plan {
                conditions: vec![ConditionKind::Native, ConditionKind::Host],
                workloads: vec![crate::bench::Workload::Bulk64k],
                batches: host.len(),
                warmups: 0,
                conns: 1,
                threads: 1,
                seed: 1,
                image: String::new(),
                build_missing: false,
            },
            ran: vec![ConditionKind::Native, ConditionKind::Host],
            skipped: Vec::new(),
            rounds,
            elapsed: std::time::Duration::ZERO,
        };
        let summary = crate::bench::stats::summarise(&results);
        let bulk = &summary.of(ConditionKind::Host).unwrap().metrics[&Metric::Bulk64k];
        let clusters = bulk.clusters.expect("two clusters");
        assert_eq!(
            clusters.map(|c| (c.count, c.median_us)),
            [(6, 20_000.0), (4, 200_000.0)]
        );
        let table = table(&summary);
        let row = |name: &str| {
            table
                .lines()
                .find(|l| l.starts_with(&format!("| {name} |")))
                .unwrap()
                .split(" | ")
                .nth(7)
                .unwrap()
                .to_string()
        };
        assert_eq!(row("host"), "6 at 20.0, 4 at 200.0", "{table}");
        assert_eq!(row("native"), "10.000", "{table}");
    }
}
