//! `--plot`: a line chart in the terminal (no dependency: a character grid with one marker per
//! series, y-axis labels in human units, start and end time under the x axis).

use stel_store::rate::RateUnit;

use crate::window::fmt_ts;

/// Markers for up to eight series.
const MARKS: &[char] = &['*', '+', 'o', 'x', '#', '@', '%', '&'];

/// One named series of `(t_ns, value)` points.
pub type Series = (String, Vec<(i64, f64)>);

/// Renders `series` as a `width × height` chart; `fmt_y` formats axis values.
pub fn chart(
    title: &str,
    series: &[Series],
    width: usize,
    height: usize,
    fmt_y: &dyn Fn(f64) -> String,
) -> String {
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut t0, mut t1, mut y0, mut y1) = (i64::MAX, i64::MIN, f64::INFINITY, f64::NEG_INFINITY);
    for (t, y) in pts {
        if !y.is_finite() {
            continue;
        }
        t0 = t0.min(*t);
        t1 = t1.max(*t);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if t0 > t1 {
        return format!("{title}: nothing to plot\n");
    }
    y0 = y0.min(0.0);
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let (w, h) = (width.max(10), height.max(3));
    let mut grid = vec![vec![' '; w]; h];
    for (si, (_, p)) in series.iter().enumerate() {
        let m = MARKS[si % MARKS.len()];
        for (t, y) in p {
            if !y.is_finite() {
                continue;
            }
            let x = if t1 == t0 {
                0
            } else {
                (((t - t0) as f64 / (t1 - t0) as f64) * (w - 1) as f64).round() as usize
            };
            let row = (((y - y0) / (y1 - y0)) * (h - 1) as f64).round() as usize;
            grid[h - 1 - row.min(h - 1)][x.min(w - 1)] = m;
        }
    }
    let labels: Vec<String> = (0..h)
        .map(|r| {
            if r == 0 || r == h - 1 || r == h / 2 {
                fmt_y(y1 - (y1 - y0) * r as f64 / (h - 1) as f64)
            } else {
                String::new()
            }
        })
        .collect();
    let lw = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let mut out = format!("{title}\n");
    for (r, line) in grid.iter().enumerate() {
        let l: String = line.iter().collect();
        out.push_str(&format!("{:>lw$} |{}\n", labels[r], l.trim_end()));
    }
    out.push_str(&format!("{:>lw$} +{}\n", "", "-".repeat(w)));
    let (a, b) = (fmt_ts(t0), fmt_ts(t1));
    let pad = w.saturating_sub(a.len() + b.len());
    out.push_str(&format!("{:>lw$}  {a}{}{b}\n", "", " ".repeat(pad)));
    let legend: Vec<String> = series
        .iter()
        .enumerate()
        .map(|(i, (n, _))| format!("{} {n}", MARKS[i % MARKS.len()]))
        .collect();
    out.push_str(&format!("{:>lw$}  {}\n", "", legend.join("   ")));
    out
}

/// A rate axis's tick labels in one unit, the one [`RateUnit::format`] picks for `peak` (bytes/s)
/// — `8.00 Gb/s` … `32.00 Gb/s`, not `8000.00 Mb/s` beside `32.00 Gb/s`.
pub fn rate_axis(unit: RateUnit, peak: f64) -> impl Fn(f64) -> String {
    let v = unit.value(peak).abs();
    let (scale, name) = match unit {
        RateUnit::Bytes if v > 1e7 => (1e6, "MB/s"),
        RateUnit::Bytes if v > 1e4 => (1e3, "KB/s"),
        RateUnit::Bytes => (1.0, "B/s"),
        RateUnit::Bits if v > 1e10 => (1e9, "Gb/s"),
        RateUnit::Bits if v > 1e7 => (1e6, "Mb/s"),
        RateUnit::Bits if v > 1e4 => (1e3, "Kb/s"),
        RateUnit::Bits => (1.0, "b/s"),
    };
    move |bytes_per_s| format!("{:.2} {name}", unit.value(bytes_per_s) / scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_axis_has_one_unit() {
        // 4 GB/s peak in bits: 32 Gb/s; 1 GB/s is 8.00 Gb/s, not 8000.00 Mb/s.
        let f = rate_axis(RateUnit::Bits, 4e9);
        assert_eq!(f(4e9), "32.00 Gb/s");
        assert_eq!(f(1e9), "8.00 Gb/s");
        assert_eq!(f(0.0), "0.00 Gb/s");
        assert_eq!(RateUnit::Bits.format(1e9), "8000.00 Mb/s");
        let f = rate_axis(RateUnit::Bytes, 5e7);
        assert_eq!(f(5e3), "0.01 MB/s");
        assert_eq!(rate_axis(RateUnit::Bytes, 10.0)(5.0), "5.00 B/s");
    }

    #[test]
    fn a_ramp_rises_left_to_right() {
        let s = vec![(
            "Ethernet0".to_string(),
            (0..10).map(|i| (i * 1000, i as f64)).collect(),
        )];
        let c = chart("t", &s, 10, 5, &|v| format!("{v:.0}"));
        let lines: Vec<&str> = c.lines().collect();
        // Top row holds the last point at the right edge, bottom row the first at the left.
        assert!(lines[1].ends_with('*'), "{c}");
        assert!(lines[5].contains("|*"), "{c}");
        assert!(c.contains("* Ethernet0"));
    }
}
