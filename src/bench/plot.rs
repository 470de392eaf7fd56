//! The report's two plots (SVG, plotters): the ECDF of every small request
//! time per condition on a log axis (`timing`'s ECDF panel), and each
//! condition's paired difference to native with its 95% CI, one panel per
//! metric. Drawing only: the numbers come from `Results` and `stats`.

use std::path::Path;

use plotters::prelude::*;

use super::stats::Summary;
use super::{ConditionKind, Metric, Results, Workload};
use crate::timing::{ecdf_panel, ecdf_points, PlotError, PALETTE};

fn error(path: &Path) -> impl Fn(String) -> PlotError + '_ {
    move |what| PlotError {
        path: path.display().to_string(),
        what,
    }
}

/// The ECDF of small request times (connect start to last body byte, µs),
/// one curve per condition, from successful batches only.
pub(crate) fn ecdf_small(results: &Results, path: &Path) -> Result<(), PlotError> {
    let err = error(path);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let series: Vec<(&str, Vec<(f64, f64)>)> = results
        .ran
        .iter()
        .map(|&kind| {
            let values = results
                .rounds
                .iter()
                .filter(|r| r.condition == kind)
                .flat_map(|r| &r.batches)
                .filter(|b| b.workload == Workload::Small && b.ok())
                .flat_map(|b| b.reply.samples.iter().map(|s| s.last_byte_us as f64))
                .collect();
            (kind.name(), ecdf_points(thinned(values)))
        })
        .collect();
    let title = format!(
        "small requests ({} fresh connections per batch, {} threads): ECDF",
        results.plan.conns, results.plan.threads
    );
    ecdf_panel(
        &root,
        &title,
        "µs from connect start to last body byte (log scale)",
        &series,
    )
    .map_err(&err)?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// At most [`ECDF_POINTS`] values spread evenly over the ranks of
/// `values`: the same curve at the plot's resolution, in a file a browser
/// opens at once.
fn thinned(mut values: Vec<f64>) -> Vec<f64> {
    if values.len() <= ECDF_POINTS {
        return values;
    }
    values.sort_by(f64::total_cmp);
    let last = (values.len() - 1) as f64;
    (0..ECDF_POINTS)
        .map(|i| values[(i as f64 * last / (ECDF_POINTS - 1) as f64).round() as usize])
        .collect()
}

/// The height of the `i`th of `n` bars in the paired plot: the first
/// condition on top, as in the report's table.
fn row_of(i: usize, n: usize) -> f64 {
    (n - 1 - i) as f64
}

/// Which of `n` bars a y-axis label at `y` names, if it sits on one:
/// [`row_of`]'s inverse, so every label names its own bar.
fn label_at(y: f64, n: usize) -> Option<usize> {
    let row = y.round();
    if (y - row).abs() > 1e-6 || row < 0.0 || row >= n as f64 {
        return None;
    }
    Some(n - 1 - row as usize)
}

/// Points per ECDF curve.
const ECDF_POINTS: usize = 1500;

/// Each condition's paired difference to native (ms) with its 95% CI, a
/// panel per metric, zero marked.
pub(crate) fn paired(summary: &Summary, path: &Path) -> Result<(), PlotError> {
    let err = error(path);
    let root = SVGBackend::new(path, (1600, 760)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let others: Vec<ConditionKind> = summary
        .conditions
        .iter()
        .map(|c| c.condition)
        .filter(|&c| c != ConditionKind::Native)
        .collect();
    let panels = root.split_evenly((2, 4));
    for (panel, metric) in panels.iter().zip(Metric::ALL) {
        let bars: Vec<(usize, f64, f64, f64)> = others
            .iter()
            .enumerate()
            .filter_map(|(i, &c)| {
                let d = summary.of(c)?.metrics.get(&metric)?.diff?;
                Some((
                    i,
                    d.ci_low_us / 1e3,
                    d.median_diff_us / 1e3,
                    d.ci_high_us / 1e3,
                ))
            })
            .collect();
        let title = format!("{} - native (ms)", metric.title());
        if bars.is_empty() {
            panel
                .titled(&format!("{title}: no pairs"), ("sans-serif", 14))
                .map_err(|e| err(e.to_string()))?;
            continue;
        }
        let lo = bars.iter().map(|b| b.1).fold(0.0f64, f64::min);
        let hi = bars.iter().map(|b| b.3).fold(0.0f64, f64::max);
        let pad = ((hi - lo) * 0.1).max(1e-3);
        let n = others.len() as f64;
        let names = others.clone();
        let mut chart = ChartBuilder::on(panel)
            .caption(&title, ("sans-serif", 14))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(80)
            .build_cartesian_2d((lo - pad)..(hi + pad), -0.5f64..(n - 0.5))
            .map_err(|e| err(e.to_string()))?;
        chart
            .configure_mesh()
            .y_labels(others.len().max(1))
            .y_label_formatter(&move |&y| {
                label_at(y, names.len())
                    .map(|i| names[i].to_string())
                    .unwrap_or_default()
            })
            .x_labels(5)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| err(e.to_string()))?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                [(0.0, -0.5), (0.0, n - 0.5)],
                BLACK.mix(0.5).stroke_width(1),
            )))
            .map_err(|e| err(e.to_string()))?;
        for (i, low, mid, high) in bars {
            let color = PALETTE[(i + 1) % PALETTE.len()];
            let y = row_of(i, others.len());
            chart
                .draw_series([
                    PathElement::new([(low, y), (high, y)], color.stroke_width(2)),
                    PathElement::new([(low, y - 0.15), (low, y + 0.15)], color.stroke_width(2)),
                    PathElement::new([(high, y - 0.15), (high, y + 0.15)], color.stroke_width(2)),
                ])
                .map_err(|e| err(e.to_string()))?;
            chart
                .draw_series(std::iter::once(Circle::new((mid, y), 4, color.filled())))
                .map_err(|e| err(e.to_string()))?;
        }
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_paired_label_names_the_condition_of_its_own_bar() {
        for n in 1..8 {
            for i in 0..n {
                assert_eq!(label_at(row_of(i, n), n), Some(i), "bar {i} of {n}");
            }
            assert_eq!(label_at(0.5, n), None);
            assert_eq!(label_at(n as f64, n), None);
        }
        // The first condition is drawn on top.
        assert_eq!(row_of(0, 6), 5.0);
    }

    #[test]
    fn a_long_series_is_thinned_to_its_quantiles_ends_included() {
        let values: Vec<f64> = (0..10_000).rev().map(f64::from).collect();
        let t = thinned(values);
        assert_eq!(t.len(), ECDF_POINTS);
        assert_eq!((t[0], t[ECDF_POINTS - 1]), (0.0, 9999.0));
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(thinned(vec![3.0, 1.0]), vec![3.0, 1.0]);
    }
}
