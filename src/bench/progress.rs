//! What a running bench tells its user, on stderr: a progress bar with an
//! ETA on a terminal (indicatif), one plain line per condition and round
//! otherwise (a log, CI), or nothing (the demo prints its own lines). It
//! only reports; it never decides anything about the run.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use super::{ConditionKind, Metric, RoundOutcome, Workload};

/// How progress is shown.
pub enum Progress {
    Bar(Option<ProgressBar>),
    Lines { total: usize },
    Silent,
}

impl Progress {
    /// A bar when stderr is a terminal, plain lines otherwise.
    pub fn for_stderr() -> Progress {
        if std::io::stderr().is_terminal() {
            Progress::Bar(None)
        } else {
            Progress::Lines { total: 0 }
        }
    }

    pub fn skipped(&mut self, condition: ConditionKind, why: &str) {
        if !matches!(self, Progress::Silent) {
            eprintln!("{condition}: skipped: {why}");
        }
    }

    /// `rounds` rounds of `conditions` sessions each are about to run.
    pub fn begin(&mut self, rounds: usize, conditions: usize) {
        match self {
            Progress::Bar(bar) => {
                let b = ProgressBar::new((rounds * conditions) as u64);
                b.set_style(
                    ProgressStyle::with_template(
                        "{elapsed_precise} [{bar:32}] {pos}/{len} sessions, ETA {eta}  {wide_msg}",
                    )
                    .expect("a valid template")
                    .progress_chars("=> "),
                );
                *bar = Some(b);
            }
            Progress::Lines { total } => *total = rounds,
            Progress::Silent => {}
        }
    }

    /// One condition's session of round `round` (from 0) is done.
    pub fn step(&mut self, round: usize, warmup: bool, outcome: &RoundOutcome) {
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

    pub fn end(&mut self) {
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
