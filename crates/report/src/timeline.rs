//! The progress timeline of `progress.json` as an inline SVG: steps (or units of progress) over time, the last
//! progress and the stall detection marked.

use std::fmt::Write;

use hangwatch_model::{duration_text, ProgressTimeline};

use crate::escape::Esc;

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 230.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 26.0;
const BOTTOM: f64 = 40.0;

/// The SVG, or `None` when the timeline has no point to draw.
pub fn svg(timeline: &ProgressTimeline) -> Option<String> {
    let points = &timeline.points;
    let first = points.first()?;
    let last_point = points.last()?;
    let detected = timeline.stall_detected_at_unix_s;
    let mut t0 = first.at_unix_s;
    if timeline.started_at_unix_s > 0.0 && timeline.started_at_unix_s < t0 {
        t0 = timeline.started_at_unix_s;
    }
    let t1 = detected
        .unwrap_or(last_point.at_unix_s)
        .max(last_point.at_unix_s);
    let span = (t1 - t0).max(1.0);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |t: f64| LEFT + (t - t0) / span * plot_w;
    let bottom = TOP + plot_h;

    let max_step = points.iter().filter_map(|p| p.step).max();
    let max_units = points.iter().map(|p| p.units).max().unwrap_or(0).max(1);
    // With steps, units are a low band under the step line; without, they fill the plot.
    let units_h = if max_step.is_some() {
        plot_h * 0.3
    } else {
        plot_h
    };
    let last_progress = points.iter().rev().find(|p| p.units > 0);

    let mut s = String::with_capacity(points.len() * 24 + 2048);
    let _ = write!(
        s,
        r##"<svg class="timeline" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" aria-label="progress over time" xmlns="http://www.w3.org/2000/svg">"##
    );
    let _ = write!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w:.1}" height="{plot_h:.1}" fill="#fafafa" stroke="#ccc"/>"##
    );
    if let (Some(last), Some(det)) = (last_progress, detected) {
        let (a, b) = (x(last.at_unix_s), x(det));
        if b > a {
            let _ = write!(
                s,
                r##"<rect x="{a:.1}" y="{TOP}" width="{:.1}" height="{plot_h:.1}" fill="#fde2e1"><title>no progress for {}</title></rect>"##,
                b - a,
                Esc(&duration_text(det - last.at_unix_s))
            );
        }
    }

    let mut bars = String::new();
    for p in points.iter().filter(|p| p.units > 0) {
        let h = p.units as f64 / max_units as f64 * units_h;
        let _ = write!(bars, "M{:.1} {bottom:.1}v-{h:.1}", x(p.at_unix_s));
    }
    if !bars.is_empty() {
        let stroke = (plot_w / points.len() as f64).clamp(1.0, 6.0);
        let _ = write!(
            s,
            r##"<path d="{bars}" stroke="#9fb8d6" stroke-width="{stroke:.1}" fill="none"/>"##
        );
    }
    if let Some(max_step) = max_step {
        let max_step = max_step.max(1) as f64;
        let mut line = String::new();
        for p in points {
            let Some(step) = p.step else { continue };
            let y = bottom - step as f64 / max_step * (plot_h - 4.0);
            let cmd = if line.is_empty() { 'M' } else { 'L' };
            let _ = write!(line, "{cmd}{:.1} {y:.1}", x(p.at_unix_s));
        }
        let _ = write!(
            s,
            r##"<path d="{line}" stroke="#1f4e8c" stroke-width="2" fill="none"/>"##
        );
        axis_label(&mut s, TOP + 4.0, &format!("step {max_step:.0}"));
        axis_label(&mut s, bottom, "0");
    } else {
        axis_label(&mut s, TOP + 4.0, &format!("{max_units}/span"));
        axis_label(&mut s, bottom, "0");
    }

    if let Some(last) = last_progress {
        let lx = x(last.at_unix_s);
        let _ = write!(
            s,
            r##"<line x1="{lx:.1}" y1="{TOP}" x2="{lx:.1}" y2="{bottom:.1}" stroke="#555" stroke-dasharray="4 3"/><text x="{lx:.1}" y="{:.1}" font-size="12" text-anchor="end" fill="#333">last progress</text>"##,
            TOP - 8.0
        );
    }
    if let Some(det) = detected {
        let dx = x(det);
        let _ = write!(
            s,
            r##"<line x1="{dx:.1}" y1="{TOP}" x2="{dx:.1}" y2="{bottom:.1}" stroke="#c00" stroke-width="2"/><text x="{dx:.1}" y="{:.1}" font-size="12" text-anchor="end" fill="#c00" font-weight="bold">stall detected</text>"##,
            bottom + 30.0
        );
    }

    let reference = detected.unwrap_or(t1);
    for i in 0..=4 {
        let t = t0 + span * f64::from(i) / 4.0;
        let anchor = match i {
            0 => "start",
            4 => "end",
            _ => "middle",
        };
        let label = if (reference - t).abs() < 0.5 {
            "0".to_string()
        } else {
            format!("-{}", duration_text(reference - t))
        };
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="{anchor}" fill="#555">{}</text>"##,
            x(t),
            bottom + 15.0,
            Esc(&label)
        );
    }
    s.push_str("</svg>");
    Some(s)
}

fn axis_label(s: &mut String, y: f64, text: &str) {
    let _ = write!(
        s,
        r##"<text x="{:.1}" y="{y:.1}" font-size="12" text-anchor="end" fill="#555">{}</text>"##,
        LEFT - 6.0,
        Esc(text)
    );
}
