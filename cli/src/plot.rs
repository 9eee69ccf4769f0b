//! SVG plot of a benchmark run: bus bandwidth and latency against message size, one line per
//! operation, log-scaled sizes.

use crate::bench::Record;
use plotters::prelude::*;
use std::path::Path;

fn series(records: &[Record]) -> Vec<(&'static str, Vec<&Record>)> {
    let mut ops: Vec<&'static str> = records.iter().map(|r| r.op()).collect();
    ops.dedup();
    ops.into_iter().map(|op| (op, records.iter().filter(|r| r.op() == op).collect())).collect()
}

/// Draw `records` into an SVG at `path`.
pub fn draw(path: &Path, records: &[Record]) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1100, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(550);
    let sizes: Vec<f64> = records.iter().map(|r| r.bytes() as f64).collect();
    let (xmin, xmax) =
        (sizes.iter().cloned().fold(f64::MAX, f64::min).max(1.0), sizes.iter().cloned().fold(1.0, f64::max));
    let bw_max = records.iter().map(|r| r.busbw()).fold(0.001, f64::max) * 1.15;
    let (lat_min, lat_max) =
        records.iter().fold((f64::MAX, 1.0f64), |(lo, hi), r| (lo.min(r.median_us()), hi.max(r.median_us())));
    let n = records.first().map(|r| r.ranks()).unwrap_or(0);
    let colors = [RED, BLUE, GREEN, MAGENTA, BLACK];

    let mut bw = ChartBuilder::on(&left)
        .caption(format!("boltccl bus bandwidth, {n} ranks"), ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d((xmin..xmax).log_scale(), 0.0..bw_max)?;
    bw.configure_mesh().x_desc("message size (bytes)").y_desc("busbw (GB/s)").draw()?;
    for (i, (op, rs)) in series(records).into_iter().enumerate() {
        let c = colors[i % colors.len()];
        bw.draw_series(LineSeries::new(rs.iter().map(|r| (r.bytes() as f64, r.busbw())), c.stroke_width(2)))?
            .label(op)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    bw.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;

    let mut lat = ChartBuilder::on(&right)
        .caption("median latency", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(65)
        .build_cartesian_2d((xmin..xmax).log_scale(), (lat_min.max(0.1) * 0.8..lat_max * 1.2).log_scale())?;
    lat.configure_mesh().x_desc("message size (bytes)").y_desc("time (us)").draw()?;
    for (i, (op, rs)) in series(records).into_iter().enumerate() {
        let c = colors[i % colors.len()];
        lat.draw_series(LineSeries::new(rs.iter().map(|r| (r.bytes() as f64, r.median_us())), c.stroke_width(2)))?
            .label(op)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    lat.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
