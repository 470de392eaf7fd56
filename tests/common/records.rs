//! A `sluice run` observed through all three of its records of a
//! connection at once, as an operator sees them: /metrics scraped from
//! sluice's namespace while the workload holds (it waits for the test's go
//! file before it exits), then the audit log and the timing file read once
//! sluice has exited and flushed them.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sluice::timing::TimingRecord;

use super::{audit_records, eventually, sluice_bin, wait_bounded, World};

/// A running `sluice run --policy P --audit A --timings T.jsonl --metrics
/// ADDR [FLAGS] -- ARGV`, its workload's stdout read line by line.
pub struct Observed<'w> {
    w: &'w World,
    /// `None` once finished.
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    printed: Vec<String>,
    metrics: String,
    timings: PathBuf,
    stderr: PathBuf,
}

/// What a finished run left: the workload's lines, sluice's log, the last
/// scrape, the audit records and the timing records.
pub struct Records {
    pub status: ExitStatus,
    pub printed: String,
    pub stderr: String,
    pub metrics: String,
    pub audit: Vec<serde_json::Value>,
    pub timings: Vec<TimingRecord>,
}

impl<'w> Observed<'w> {
    /// Start `argv` under sluice with metrics on `metrics` (an address in
    /// sluice's namespace), timings in the test's directory and `flags`
    /// (e.g. `--audit-allows`) before the `--`.
    pub fn start(
        w: &'w World,
        policy: &Path,
        metrics: &str,
        flags: &[&str],
        argv: &[&str],
    ) -> Observed<'w> {
        let timings = w.dir.path().join("timings.jsonl");
        let stderr = w.dir.path().join("sluice.stderr");
        let mut child = w
            .outer
            .command(sluice_bin())
            .arg("-v")
            .arg("run")
            .arg("--policy")
            .arg(policy)
            .arg("--audit")
            .arg(w.audit_path())
            .arg("--state-dir")
            .arg(w.state_dir())
            .arg("--timings")
            .arg(&timings)
            .args(["--metrics", metrics])
            .args(flags)
            .arg("--")
            .args(argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("sluice's log file"))
            .spawn()
            .expect("spawn sluice");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Observed {
            w,
            stdin: child.stdin.take(),
            child: Some(child),
            lines,
            printed: Vec::new(),
            metrics: metrics.to_string(),
            timings,
            stderr,
        }
    }

    /// Wait (bounded) until the workload prints a line that is `want`;
    /// fails with what it printed and sluice's log otherwise.
    pub fn expect_line(&mut self, want: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line == want;
                    self.printed.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => panic!(
                    "the workload never printed {want:?}; it printed {:?}\n{}",
                    self.printed,
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                ),
            }
        }
    }

    /// Write `line` to the workload's stdin.
    pub fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        writeln!(stdin, "{line}").expect("the workload reads its stdin");
    }

    /// Scrape /metrics until `cond` holds of the text (bounded); the last
    /// text scraped, whether it held or not.
    pub fn scrape_until(&self, cond: impl Fn(&str) -> bool) -> String {
        let mut text = String::new();
        eventually(Duration::from_secs(20), || {
            text = self
                .w
                .http_get_outer(&self.metrics, "/metrics")
                .unwrap_or_default();
            cond(&text)
        });
        text
    }

    /// Let the workload exit (its go file), wait for sluice (bounded), and
    /// read what it recorded; `metrics` is the scrape to keep.
    pub fn finish(mut self, metrics: String) -> Records {
        std::fs::write(self.w.go_path(), b"").unwrap();
        drop(self.stdin.take());
        let child = self.child.take().expect("not finished yet");
        let out = wait_bounded(child, Duration::from_secs(60));
        // The reader thread ends with the workload's stdout.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.printed.push(line);
        }
        let timings = if self.timings.exists() {
            sluice::timing::read_file(&self.timings).expect("the timing file")
        } else {
            Vec::new()
        };
        Records {
            status: out.status,
            printed: self.printed.join("\n"),
            stderr: std::fs::read_to_string(&self.stderr).unwrap_or_default(),
            metrics,
            audit: audit_records(&self.w.audit_path()),
            timings,
        }
    }
}

impl Drop for Observed<'_> {
    /// A test that failed before [`Observed::finish`] leaves no sluice
    /// behind.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The sum of every sample of `name` in a Prometheus text exposition (0
/// when it has none).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
