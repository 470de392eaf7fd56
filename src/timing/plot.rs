//! `sluice compare --plot FILE.svg`: the two runs' distributions side by
//! side, one panel per phase (connect, first byte, total), each an
//! empirical CDF of A and of B on a log time axis. A second cluster shows
//! as a second step; a shift shows as a gap between the curves. The ECDF
//! panel itself ([`ecdf_panel`]) is shared with `sluice bench`'s plots.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::compare::{Input, Phase};

#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {what}")]
pub struct PlotError {
    pub path: String,
    pub what: String,
}

/// The colours series are drawn in, in order.
pub(crate) const PALETTE: [RGBColor; 8] = [
    BLUE,
    RED,
    RGBColor(0, 150, 0),
    RGBColor(230, 140, 0),
    RGBColor(140, 0, 170),
    RGBColor(0, 160, 170),
    RGBColor(120, 120, 120),
    BLACK,
];

/// Draw A and B's distributions into an SVG file at `path`.
pub fn plot_svg(a: &Input, b: &Input, path: &Path) -> Result<(), PlotError> {
    let err = |what: String| PlotError {
        path: path.display().to_string(),
        what,
    };
    let root = SVGBackend::new(path, (1500, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let panels = root.split_evenly((1, 3));
    for (panel, phase) in panels.iter().zip(Phase::ALL) {
        let values = |input: &Input| -> Vec<f64> {
            input
                .records()
                .filter_map(|r| phase.of(r))
                .map(|x| x as f64)
                .collect()
        };
        let series = [
            (a.label.as_str(), ecdf_points(values(a))),
            (b.label.as_str(), ecdf_points(values(b))),
        ];
        let title = format!("{} (ECDF, µs from start)", phase.as_str());
        ecdf_panel(panel, &title, "µs (log scale)", &series).map_err(err)?;
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// Step points of the empirical CDF of `values` (x = the value, at least
/// 1 for the log axis; y = fraction <= x).
pub(crate) fn ecdf_points(mut values: Vec<f64>) -> Vec<(f64, f64)> {
    for v in values.iter_mut() {
        *v = v.max(1.0);
    }
    values.sort_by(f64::total_cmp);
    let n = values.len() as f64;
    let mut points = Vec::with_capacity(values.len() * 2);
    for (i, x) in values.iter().enumerate() {
        points.push((*x, i as f64 / n));
        points.push((*x, (i + 1) as f64 / n));
    }
    points
}

/// One panel of ECDFs on a log x axis, a legend naming each series (drawn
/// in [`PALETTE`] order). Empty series are left out; a panel with none
/// says so in its title.
pub(crate) fn ecdf_panel<DB: DrawingBackend>(
    panel: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    series: &[(&str, Vec<(f64, f64)>)],
) -> Result<(), String> {
    let all = series.iter().flat_map(|s| s.1.iter().map(|p| p.0));
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    if series.iter().all(|s| s.1.is_empty()) {
        panel
            .titled(&format!("{title}: no data"), ("sans-serif", 16))
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    let (lo, hi) = ((lo * 0.8).max(1.0), (hi * 1.25).max(lo * 2.0).max(2.0));
    let mut chart = ChartBuilder::on(panel)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(44)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0f64..1.0f64)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_labels(6)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .x_desc(x_desc)
        .y_desc("fraction of connections")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (label, points)) in series.iter().enumerate() {
        if points.is_empty() {
            continue;
        }
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(*label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}
