//! `sluice compare --plot FILE.svg`: the two runs' distributions side by
//! side, one panel per phase (connect, first byte, total), each an
//! empirical CDF of A and of B on a log time axis. A second cluster shows
//! as a second step; a shift shows as a gap between the curves.

use std::path::Path;

use plotters::prelude::*;

use super::compare::{Input, Phase};

#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {what}")]
pub struct PlotError {
    pub path: String,
    pub what: String,
}

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
        let ea = ecdf(a, phase);
        let eb = ecdf(b, phase);
        let all = ea.iter().chain(&eb).map(|p| p.0);
        let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let title = format!("{} (ECDF, µs from start)", phase.as_str());
        if ea.is_empty() && eb.is_empty() {
            panel
                .titled(&format!("{title}: no data"), ("sans-serif", 16))
                .map_err(|e| err(e.to_string()))?;
            continue;
        }
        let (lo, hi) = ((lo * 0.8).max(1.0), (hi * 1.25).max(lo * 2.0).max(2.0));
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(44)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0f64..1.0f64)
            .map_err(|e| err(e.to_string()))?;
        chart
            .configure_mesh()
            .x_labels(6)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .light_line_style(WHITE.mix(0.0))
            .x_desc("µs (log scale)")
            .y_desc("fraction of connections")
            .draw()
            .map_err(|e| err(e.to_string()))?;
        for (points, color, label) in [(&ea, BLUE, &a.label), (&eb, RED, &b.label)] {
            if points.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(|e| err(e.to_string()))?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(e.to_string()))?;
    }
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

/// Step points of the empirical CDF (x = µs, y = fraction <= x).
fn ecdf(input: &Input, phase: Phase) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = input
        .records()
        .filter_map(|r| phase.of(r))
        .map(|x| (x as f64).max(1.0))
        .collect();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    let mut points = Vec::with_capacity(v.len() * 2);
    for (i, x) in v.iter().enumerate() {
        points.push((*x, i as f64 / n));
        points.push((*x, (i + 1) as f64 / n));
    }
    points
}
