//! What a running bench tells its user, on stderr: a progress bar with an
//! ETA on a terminal (indicatif), one plain line per condition and round
//! otherwise (a log, CI), or nothing (the demo prints its own lines). It
//! only reports; it never decides anything about the run.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use super::{ConditionKind, Metric, RoundOutcome, Workload};

/// How progress is shown.
pub(crate) enum Progress {
    Bar(Option<ProgressBar>),
    Lines { total: usize },
    Silent,
}

impl Progress {
    /// A bar when stderr is a terminal, plain lines otherwise.
    pub(crate) fn for_stderr() -> Progress {
        if std::io::stderr().is_terminal() {
            Progress::Bar(None)
        } else {
            Progress::Lines { total: 0 }
        }
    }

    pub(crate) fn skipped(&mut self, condition: ConditionKind, why: &str) {
        if !matches!(self, Progress::Silent) {
            eprintln!("{condition}: skipped: {why}");
        }
    }

    /// `rounds` rounds of `conditions` sessions each are about to run.
    pub(crate) fn begin(&mut self, rounds: usize, conditions: usize) {
        match self {
            Progress::Bar(bar) => {
                // A bar given in (one drawing elsewhere, as in the tests)
                // is kept; otherwise one on stderr.
                let b = bar.get_or_insert_with(ProgressBar::no_length);
                b.set_length((rounds * conditions) as u64);
                b.set_style(
                    ProgressStyle::with_template(
                        "{elapsed_precise} [{bar:32}] {pos}/{len} sessions, ETA {eta}  {wide_msg}",
                    )
                    .expect("a valid template")
                    .progress_chars("=> "),
                );
            }
            Progress::Lines { total } => *total = rounds,
            Progress::Silent => {}
        }
    }

    /// One condition's session of round `round` (from 0) is done.
    pub(crate) fn step(&mut self, round: usize, warmup: bool, outcome: &RoundOutcome) {
        let label = if warmup {
            "warmup".to_string()
        } else {
            format!("batch {}", outcome.batch)
        };
        match self {
            Progress::Bar(Some(bar)) => {
                bar.set_message(format!("{label}: {}", line(outcome)));
                bar.inc(1);
            }
            Progress::Lines { total } => {
                eprintln!("[{:>3}/{total}] {label}: {}", round + 1, line(outcome));
            }
            Progress::Bar(None) | Progress::Silent => {}
        }
    }

    pub(crate) fn end(&mut self) {
        if let Progress::Bar(Some(bar)) = self {
            bar.finish_and_clear();
        }
    }
}

/// One line on a session: its condition and each batch statistic.
fn line(o: &RoundOutcome) -> String {
    let mut parts = vec![o.condition.to_string()];
    for b in &o.batches {
        let ms = |m: Metric| {
            m.of(&b.reply.samples)
                .map(|v| format!("{:.3}", v / 1e3))
                .unwrap_or_else(|| "-".into())
        };
        let failed = if b.reply.failed > 0 {
            format!(" ({} failed)", b.reply.failed)
        } else {
            String::new()
        };
        let value = match b.workload {
            Workload::Stream => format!("{}/{}", ms(Metric::StreamFirst), ms(Metric::StreamLast)),
            w => ms(w.metrics()[0]),
        };
        parts.push(format!("{} {value} ms{failed}", b.workload.name()));
    }
    if let Some(d) = &o.deny {
        parts.push(if d.passed { "deny ok" } else { "DENY FAILED" }.to_string());
    }
    parts.push(format!(
        "start+exit {:.0} ms",
        (o.start + o.exit).as_secs_f64() * 1e3
    ));
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{BatchOutcome, DenyCheck};
    use indicatif::ProgressDrawTarget;
    use std::time::Duration;

    fn outcome(batch: usize) -> RoundOutcome {
        RoundOutcome {
            batch,
            position: 1,
            condition: ConditionKind::Host,
            start: Duration::from_millis(3),
            exit: Duration::from_millis(2),
            deny: Some(DenyCheck {
                passed: true,
                detail: String::new(),
            }),
            batches: vec![BatchOutcome {
                workload: Workload::Small,
                reply: crate::bench::client::Reply {
                    samples: vec![crate::bench::client::Sample {
                        connect_us: 1,
                        first_byte_us: 2,
                        last_byte_us: 1500,
                        total_us: 1600,
                    }],
                    ..Default::default()
                },
                cpu_ns: None,
            }],
        }
    }

    #[test]
    fn the_bar_counts_every_session_of_every_round_and_says_the_last() {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        let mut progress = Progress::Bar(Some(bar.clone()));
        // One warmup and two formal rounds of two conditions.
        progress.begin(3, 2);
        assert_eq!((bar.position(), bar.length()), (0, Some(6)));
        for round in 0..3 {
            for _ in 0..2 {
                progress.step(round, round == 0, &outcome(round));
            }
        }
        assert_eq!(bar.position(), 6);
        assert_eq!(
            bar.message(),
            "batch 2: host, small 1.500 ms, deny ok, start+exit 5 ms"
        );
        progress.end();
        assert!(bar.is_finished());
    }
}
