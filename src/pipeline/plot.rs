//! Small SVG charts for reports: line charts of metrics over steps and grouped bar charts.
//!
//! Written by hand rather than with `plotters`: its text rendering needs the `ttf` feature, which
//! links fontconfig and freetype dynamically and would break the glibc-only binary; an SVG viewer
//! lays out text itself, so the charts need no fonts here.

use std::fmt::Write;

const W: f64 = 640.0;
const H: f64 = 360.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 48.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// One named series of (x, y) points.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points; non-finite values are skipped.
    pub points: Vec<(f64, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Round tick values covering [lo, hi].
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let span = (hi - lo).abs().max(1e-12);
    let raw = span / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let start = (lo / step).ceil() * step;
    let mut out = Vec::new();
    let mut v = start;
    while v <= hi + step * 1e-9 && out.len() < 50 {
        out.push(if v.abs() < step * 1e-9 { 0.0 } else { v });
        v += step;
    }
    out
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1e4 || v.abs() < 1e-3 {
        format!("{v:.1e}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn frame(svg: &mut String, title: &str, x_label: &str, y_label: &str) {
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = write!(
        svg,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">{}</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        esc(title)
    );
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 10.0,
        esc(x_label)
    );
    let _ = write!(
        svg,
        r#"<text x="14" y="{}" text-anchor="middle" transform="rotate(-90 14 {})">{}</text>"#,
        (TOP + H - BOTTOM) / 2.0,
        (TOP + H - BOTTOM) / 2.0,
        esc(y_label)
    );
}

/// A horizontal grid line at plot height `y` labelled with the value `v`.
fn grid_line(svg: &mut String, y: f64, v: f64) {
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
        W - RIGHT,
        LEFT - 6.0,
        y + 4.0,
        fmt_num(v)
    );
}

/// A line chart of several series over a shared x axis.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let pts = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| p.0.is_finite() && p.1.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 - x0 < 1e-12 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-12 {
        y0 -= 0.5;
        y1 += 0.5;
    }
    let pad = (y1 - y0) * 0.05;
    let (y0, y1) = (y0 - pad, y1 + pad);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| TOP + ph - (y - y0) / (y1 - y0) * ph;
    let mut svg = String::new();
    frame(&mut svg, title, x_label, y_label);
    for t in ticks(y0, y1, 5) {
        grid_line(&mut svg, sy(t), t);
    }
    for t in ticks(x0, x1, 6) {
        let x = sx(t);
        let _ = write!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + ph + 16.0,
            fmt_num(t)
        );
    }
    let _ = write!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#404040"/>"##
    );
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if path.len() == 1 {
            let _ = write!(
                svg,
                r#"<circle cx="{}" r="3" fill="{c}"/>"#,
                path[0].replace(',', "\" cy=\"")
            );
        } else if !path.is_empty() {
            let _ = write!(
                svg,
                r#"<polyline fill="none" stroke="{c}" stroke-width="1.8" points="{}"/>"#,
                path.join(" ")
            );
        }
        let ly = TOP + 10.0 + 18.0 * i as f64;
        let _ = write!(
            svg,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{c}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            W - RIGHT + 10.0,
            W - RIGHT + 28.0,
            W - RIGHT + 32.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// A grouped bar chart: `values[g][c]` is the bar of group `g` (legend) in category `c` (x axis).
pub fn bar_chart(
    title: &str,
    y_label: &str,
    categories: &[String],
    groups: &[String],
    values: &[Vec<f64>],
) -> String {
    let ymax = values
        .iter()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let sy = |y: f64| TOP + ph - y / ymax * ph;
    let mut svg = String::new();
    frame(&mut svg, title, "", y_label);
    for t in ticks(0.0, ymax, 5) {
        grid_line(&mut svg, sy(t), t);
    }
    let nc = categories.len().max(1) as f64;
    let ng = groups.len().max(1) as f64;
    let slot = pw / nc;
    let bw = slot * 0.8 / ng;
    for (c, cat) in categories.iter().enumerate() {
        let x = LEFT + slot * c as f64;
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            x + slot / 2.0,
            TOP + ph + 16.0,
            esc(cat)
        );
        for (g, row) in values.iter().enumerate() {
            let v = row.get(c).copied().unwrap_or(0.0);
            if !v.is_finite() {
                continue;
            }
            let bx = x + slot * 0.1 + bw * g as f64;
            let _ = write!(
                svg,
                r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                sy(v),
                bw * 0.95,
                TOP + ph - sy(v),
                COLORS[g % COLORS.len()],
                esc(groups.get(g).map(String::as_str).unwrap_or("")),
                fmt_num(v)
            );
        }
    }
    let _ = write!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#404040"/>"##
    );
    for (g, name) in groups.iter().enumerate() {
        let ly = TOP + 10.0 + 18.0 * g as f64;
        let _ = write!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="14" height="10" fill="{}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            W - RIGHT + 10.0,
            ly - 5.0,
            COLORS[g % COLORS.len()],
            W - RIGHT + 30.0,
            ly + 4.0,
            esc(name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// %Resolved against the number of edit samples the selection saw, one line per stage
/// (`curves`: stage name, then (samples, %Resolved) points).
pub fn resolved_curve_chart(curves: &[(String, Vec<(usize, f64)>)]) -> String {
    let series: Vec<Series> = curves
        .iter()
        .map(|(name, pts)| Series {
            name: name.clone(),
            points: pts.iter().map(|&(k, r)| (k as f64, r)).collect(),
        })
        .collect();
    line_chart(
        "%Resolved against edit samples (prefixes of one sample set)",
        "edit samples",
        "% resolved",
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_chart_maps_extremes_to_the_plot_corners_and_escapes_labels() {
        let s = Series {
            name: "reward <mean>".into(),
            points: vec![(0.0, 0.0), (10.0, 1.0), (5.0, f64::NAN)],
        };
        let svg = line_chart("t", "step", "reward", &[s]);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("reward &lt;mean&gt;"));
        // x = 0 maps to LEFT, x = 10 to the plot's right edge.
        assert!(svg.contains(&format!("{:.1},", LEFT)));
        assert!(svg.contains(&format!("{:.1},", W - RIGHT)));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn resolved_curve_has_one_line_per_stage_over_the_sample_counts() {
        let svg = resolved_curve_chart(&[
            ("sft".into(), vec![(1, 0.0), (2, 10.0), (4, 20.0)]),
            ("sft+rl".into(), vec![(1, 5.0), (2, 15.0), (4, 30.0)]),
        ]);
        assert!(svg.contains("edit samples") && svg.contains("sft+rl"));
        // 1 sample maps to the left edge, 4 to the right edge.
        assert!(svg.contains(&format!("{:.1},", LEFT)));
        assert!(svg.contains(&format!("{:.1},", W - RIGHT)));
    }

    #[test]
    fn bar_chart_draws_one_bar_per_group_and_category() {
        let cats = vec![
            "file".to_string(),
            "function".to_string(),
            "line".to_string(),
        ];
        let groups = vec!["initial".to_string(), "sft".to_string()];
        let svg = bar_chart(
            "hit rates",
            "%",
            &cats,
            &groups,
            &[vec![10.0, 5.0, 1.0], vec![40.0, 20.0, 8.0]],
        );
        assert_eq!(svg.matches("<rect x=").count(), 6 + 1 + 2);
        assert!(svg.contains("sft: 40"));
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        let t = ticks(0.0, 1.0, 5);
        let want = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0];
        assert_eq!(t.len(), want.len());
        assert!(
            t.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-9),
            "{t:?}"
        );
        let t = ticks(-3.0, 17.0, 4);
        assert_eq!(t.first().copied(), Some(0.0));
        assert!(t.iter().all(|v| (v / 5.0).fract().abs() < 1e-9));
    }
}
