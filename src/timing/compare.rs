//! `sluice compare A B`: summarize two runs' timings and the difference.
//!
//! Inputs. A file is one run; a directory is one run made of batches, one
//! file (`*.csv`, `*.jsonl`, `*.json`) per batch, taken in file-name order.
//! A single file is cut into batches of `batch_size` consecutive records
//! (ordered by `start`). Records with verdict `deny` are left out (they never
//! went anywhere); their number is reported.
//!
//! Per input and phase (connect, first byte, total): count, median, P95
//! (linear interpolation between order statistics). Where a phase's
//! distribution has two separated clusters, each cluster's count and median
//! are reported as well, because one median would describe neither (the
//! statistics themselves are in `timing::stats`, shared with `sluice bench`).
//!
//! Between inputs, per phase: the ratio of medians (B / A), and the paired
//! difference of medians by batch: batch i of B against batch i of A, d_i =
//! median(B_i) - median(A_i), reported as the median of the d_i with a 95%
//! percentile bootstrap confidence interval (`BOOTSTRAP_RESAMPLES`
//! resamples of the d_i, ChaCha8 seeded with `BOOTSTRAP_SEED`, so the same
//! inputs always give the same interval). It needs two pairs or more.

use crate::outcome::Verdict;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{read_file, TimingError, TimingRecord};

pub(crate) use super::stats::median;
pub use super::stats::two_clusters;
pub(crate) use super::stats::{quantile_sorted, Cluster, PairedDiff, BOOTSTRAP_SEED};

/// A timing phase, measured from accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Connect,
    FirstByte,
    Total,
}

impl Phase {
    pub(crate) const ALL: [Phase; 3] = [Phase::Connect, Phase::FirstByte, Phase::Total];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Connect => "connect",
            Phase::FirstByte => "first_byte",
            Phase::Total => "total",
        }
    }

    pub(crate) fn of(self, r: &TimingRecord) -> Option<u64> {
        match self {
            Phase::Connect => r.connect_us,
            Phase::FirstByte => r.first_byte_us,
            Phase::Total => Some(r.total_us),
        }
    }
}

/// One run: a label and its batches of records.
#[derive(Debug, Clone)]
pub struct Input {
    pub label: String,
    pub batches: Vec<Vec<TimingRecord>>,
    /// Denied records left out.
    pub excluded: usize,
}

impl Input {
    /// Build from records already in memory, cut into batches of
    /// `batch_size` in `start` order.
    pub fn from_records(label: &str, mut records: Vec<TimingRecord>, batch_size: usize) -> Input {
        let before = records.len();
        records.retain(|r| r.verdict != Verdict::Deny.as_str());
        let excluded = before - records.len();
        records.sort_by_key(|r| (r.start, r.id));
        let batches = records
            .chunks(batch_size.max(1))
            .map(<[TimingRecord]>::to_vec)
            .collect();
        Input {
            label: label.to_string(),
            batches,
            excluded,
        }
    }

    /// Build from batches given explicitly.
    pub fn from_batches(label: &str, batches: Vec<Vec<TimingRecord>>) -> Input {
        let mut excluded = 0;
        let batches = batches
            .into_iter()
            .map(|mut b| {
                let before = b.len();
                b.retain(|r| r.verdict != Verdict::Deny.as_str());
                excluded += before - b.len();
                b
            })
            .collect();
        Input {
            label: label.to_string(),
            batches,
            excluded,
        }
    }

    pub fn records(&self) -> impl Iterator<Item = &TimingRecord> {
        self.batches.iter().flatten()
    }
}

/// Read a file or a directory of batch files.
pub fn load_input(path: &Path, batch_size: usize) -> Result<Input, TimingError> {
    let label = path.display().to_string();
    if path.is_dir() {
        let read_err = |source| TimingError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(read_err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("csv" | "jsonl" | "json")
                    )
            })
            .collect();
        files.sort();
        let batches = files
            .iter()
            .map(|f| read_file(f))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(Input::from_batches(&label, batches));
    }
    Ok(Input::from_records(&label, read_file(path)?, batch_size))
}

/// One input's numbers for one phase.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseStats {
    pub(crate) phase: Phase,
    pub n: usize,
    pub median_us: Option<f64>,
    pub(crate) p95_us: Option<f64>,
    /// Lower and upper cluster, when the distribution has two.
    pub clusters: Option<[Cluster; 2]>,
}

/// One input's numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct InputStats {
    pub label: String,
    pub count: usize,
    pub excluded: usize,
    pub batches: usize,
    pub phases: Vec<PhaseStats>,
}

/// B against A for one phase.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseComparison {
    pub(crate) phase: Phase,
    /// median(B) / median(A) over all records.
    pub ratio: Option<f64>,
    pub diff: Option<PairedDiff>,
}

/// Everything `sluice compare` prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub a: InputStats,
    pub b: InputStats,
    pub phases: Vec<PhaseComparison>,
}

/// Compare run B against run A.
pub fn compare(a: &Input, b: &Input) -> Comparison {
    let sa = input_stats(a);
    let sb = input_stats(b);
    let phases = Phase::ALL
        .iter()
        .enumerate()
        .map(|(i, &phase)| PhaseComparison {
            phase,
            ratio: match (sa.phases[i].median_us, sb.phases[i].median_us) {
                (Some(ma), Some(mb)) if ma > 0.0 => Some(mb / ma),
                _ => None,
            },
            diff: paired_diff(a, b, phase),
        })
        .collect();
    Comparison {
        a: sa,
        b: sb,
        phases,
    }
}

fn input_stats(input: &Input) -> InputStats {
    let phases = Phase::ALL
        .iter()
        .map(|&phase| {
            let mut v: Vec<f64> = input
                .records()
                .filter_map(|r| phase.of(r))
                .map(|x| x as f64)
                .collect();
            v.sort_by(f64::total_cmp);
            PhaseStats {
                phase,
                n: v.len(),
                median_us: quantile_sorted(&v, 0.5),
                p95_us: quantile_sorted(&v, 0.95),
                clusters: two_clusters(&v),
            }
        })
        .collect();
    InputStats {
        label: input.label.clone(),
        count: input.records().count(),
        excluded: input.excluded,
        batches: input.batches.len(),
        phases,
    }
}

fn paired_diff(a: &Input, b: &Input, phase: Phase) -> Option<PairedDiff> {
    let batch_median = |batch: &Vec<TimingRecord>| {
        let v: Vec<f64> = batch
            .iter()
            .filter_map(|r| phase.of(r))
            .map(|x| x as f64)
            .collect();
        median(&v)
    };
    let diffs: Vec<f64> = a
        .batches
        .iter()
        .zip(&b.batches)
        .filter_map(|(ba, bb)| Some(batch_median(bb)? - batch_median(ba)?))
        .collect();
    super::stats::paired_median_ci(&diffs, BOOTSTRAP_SEED)
}

fn ms(us: Option<f64>) -> String {
    us.map(|v| format!("{:.3} ms", v / 1000.0))
        .unwrap_or_else(|| "-".into())
}

impl Comparison {
    /// The readable table `sluice compare` prints.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        for (name, s) in [("A", &self.a), ("B", &self.b)] {
            let _ = writeln!(
                out,
                "{name}: {}  ({} connections in {} batches{})",
                s.label,
                s.count,
                s.batches,
                if s.excluded > 0 {
                    format!(", {} denied left out", s.excluded)
                } else {
                    String::new()
                }
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<11} {:>6} {:>12} {:>12} {:>6} {:>12} {:>12} {:>7}  B-A median by batch [95% CI]",
            "phase", "A n", "A median", "A p95", "B n", "B median", "B p95", "B/A"
        );
        let mut notes = Vec::new();
        for (i, pc) in self.phases.iter().enumerate() {
            let (pa, pb) = (&self.a.phases[i], &self.b.phases[i]);
            let med = |p: &PhaseStats, who: &str, notes: &mut Vec<String>| {
                if let Some([lo, hi]) = p.clusters {
                    notes.push(format!(
                        "{who} {}: two clusters: {} at {} and {} at {} (the overall median describes neither)",
                        p.phase.as_str(),
                        lo.count,
                        ms(Some(lo.median_us)),
                        hi.count,
                        ms(Some(hi.median_us))
                    ));
                    format!("{}*", ms(p.median_us))
                } else {
                    ms(p.median_us)
                }
            };
            let ma = med(pa, "A", &mut notes);
            let mb = med(pb, "B", &mut notes);
            let diff = pc
                .diff
                .map(|d| {
                    format!(
                        "{:+.3} ms [{:+.3}, {:+.3}] ({} pairs)",
                        d.median_diff_us / 1000.0,
                        d.ci_low_us / 1000.0,
                        d.ci_high_us / 1000.0,
                        d.pairs
                    )
                })
                .unwrap_or_else(|| "- (needs 2+ batches each)".into());
            let _ = writeln!(
                out,
                "{:<11} {:>6} {:>12} {:>12} {:>6} {:>12} {:>12} {:>7}  {}",
                pc.phase.as_str(),
                pa.n,
                ma,
                ms(pa.p95_us),
                pb.n,
                mb,
                ms(pb.p95_us),
                pc.ratio
                    .map(|r| format!("{r:.2}x"))
                    .unwrap_or_else(|| "-".into()),
                diff
            );
        }
        if !notes.is_empty() {
            let _ = writeln!(out);
            for n in notes {
                let _ = writeln!(out, "* {n}");
            }
        }
        out
    }

    /// The same numbers as CSV, one value per row:
    /// `input,phase,statistic,value` (input is A, B, or B-A / B/A for the
    /// comparisons; durations in microseconds).
    pub fn render_csv(&self) -> String {
        let mut out = String::from("input,phase,statistic,value\n");
        let mut row = |input: &str, phase: &str, stat: &str, value: String| {
            let _ = writeln!(out, "{input},{phase},{stat},{value}");
        };
        for (name, s) in [("A", &self.a), ("B", &self.b)] {
            row(name, "", "count", s.count.to_string());
            row(name, "", "batches", s.batches.to_string());
            row(name, "", "excluded_denied", s.excluded.to_string());
            for p in &s.phases {
                let ph = p.phase.as_str();
                row(name, ph, "n", p.n.to_string());
                if let Some(m) = p.median_us {
                    row(name, ph, "median_us", format!("{m}"));
                }
                if let Some(m) = p.p95_us {
                    row(name, ph, "p95_us", format!("{m}"));
                }
                if let Some([lo, hi]) = p.clusters {
                    row(name, ph, "cluster1_count", lo.count.to_string());
                    row(name, ph, "cluster1_median_us", format!("{}", lo.median_us));
                    row(name, ph, "cluster2_count", hi.count.to_string());
                    row(name, ph, "cluster2_median_us", format!("{}", hi.median_us));
                }
            }
        }
        for pc in &self.phases {
            let ph = pc.phase.as_str();
            if let Some(r) = pc.ratio {
                row("B/A", ph, "median_ratio", format!("{r}"));
            }
            if let Some(d) = pc.diff {
                row("B-A", ph, "pairs", d.pairs.to_string());
                row("B-A", ph, "median_diff_us", format!("{}", d.median_diff_us));
                row("B-A", ph, "ci95_low_us", format!("{}", d.ci_low_us));
                row("B-A", ph, "ci95_high_us", format!("{}", d.ci_high_us));
            }
        }
        out
    }
}
