//! Throughput against concurrency as a small hand-written SVG: log2 tasks across, log10
//! ops/s up (in-memory and Redis cases differ by two orders of magnitude, so a linear
//! axis would flatten the Redis lines into the floor). No plotting dependency.

use std::fmt::Write as _;

use crate::report::{Series, fmt_rate};

const W: f64 = 900.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 370.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Colour-blind-safe palette (Okabe–Ito), then greys.
const COLORS: [&str; 10] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
    "#777777", "#AAAAAA",
];

pub fn svg(title: &str, series: &[Series]) -> String {
    let pts = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| p.1 > 0.0);
    let (mut xmax, mut ymin, mut ymax) = (1usize, f64::MAX, 0f64);
    for &(x, y) in pts {
        xmax = xmax.max(x);
        ymin = ymin.min(y);
        ymax = ymax.max(y);
    }
    if ymax <= 0.0 {
        ymin = 1.0;
        ymax = 10.0;
    }
    let (lo, hi) = (
        ymin.log10().floor(),
        ymax.log10().ceil().max(ymin.log10().floor() + 1.0),
    );
    let xhi = (xmax as f64).log2().max(1.0);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |x: usize| LEFT + (x as f64).log2() / xhi * pw;
    let sy = |y: f64| TOP + ph - (y.log10() - lo) / (hi - lo) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + pw / 2.0,
        esc(title)
    );
    // Grid: one line per decade up, one per power of two across.
    let mut d = lo;
    while d <= hi + 1e-9 {
        let y = sy(10f64.powf(d));
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            fmt_rate(10f64.powf(d))
        );
        d += 1.0;
    }
    let mut x = 1usize;
    while x <= xmax {
        let px = sx(x);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#eee"/><text x="{px:.1}" y="{:.1}" text-anchor="middle">{x}</text>"##,
            TOP + ph,
            TOP + ph + 18.0
        );
        x *= 2;
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">concurrent tasks</text>"#,
        LEFT + pw / 2.0,
        H - 10.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">ops/s (log scale)</text>"#,
        TOP + ph / 2.0
    );
    for (i, ser) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let dash = if ser.name.starts_with("idem") {
            ""
        } else {
            r#" stroke-dasharray="6 3""#
        };
        let path: Vec<String> = ser
            .points
            .iter()
            .filter(|p| p.1 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if path.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        for p in &path {
            let (cx, cy) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, r#"<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>"#);
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = LEFT + pw + 14.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            esc(&ser.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
