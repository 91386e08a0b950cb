//! `--plot FILE.svg|FILE.png`: the series the terminal chart ([`crate::plot`]) draws, as an image
//! file — a line per series, the y axis in the quantity's units, the x axis in UTC, a legend.
//!
//! Drawn with plotters (SVG and bitmap backends). Text is laid out with a TrueType font read at
//! run time: `$STEL_PLOT_FONT`, else DejaVu Sans or Liberation Sans where Debian, Fedora and
//! Arch install them (`apt-get install fonts-dejavu-core`).

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use plotters::{
    coord::Shift,
    prelude::*,
    style::{register_font, FontStyle},
};

use crate::{
    error::{Error, Result},
    plot::Series,
    window::fmt_ts,
};

/// Image size in pixels (SVG user units).
const SIZE: (u32, u32) = (1280, 720);

/// Where a sans-serif TrueType font usually is.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

/// Registers the font once per process.
fn font() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let candidates: Vec<PathBuf> = std::env::var_os("STEL_PLOT_FONT")
            .map(PathBuf::from)
            .into_iter()
            .chain(FONTS.iter().map(PathBuf::from))
            .collect();
        for p in &candidates {
            let Ok(bytes) = std::fs::read(p) else {
                continue;
            };
            // plotters keeps fonts for the process's life.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(());
            }
        }
        Err(format!(
            "--plot FILE needs a TrueType font for its text and found none (set STEL_PLOT_FONT=/path/font.ttf or install fonts-dejavu-core; looked in {})",
            FONTS.join(", ")
        ))
    })
    .clone()
    .map_err(Error::Usage)
}

/// The image format of `path`, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Svg,
    Png,
}

impl Kind {
    /// # Errors
    /// An extension other than `.svg` or `.png`.
    pub fn of(path: &Path) -> Result<Self> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("svg") => Ok(Kind::Svg),
            Some("png") => Ok(Kind::Png),
            _ => Err(Error::Usage(format!(
                "--plot {}: give a file ending in .svg or .png (or no value for a chart in the terminal)",
                path.display()
            ))),
        }
    }
}

/// What a chart shows.
#[derive(Debug, Clone, Copy)]
pub struct Labels<'a> {
    /// Title above the plot (`RX rate per interface`).
    pub title: &'a str,
    /// The y axis: quantity and unit (`RX_BPS (bytes/s)`).
    pub y: &'a str,
}

/// `HH:MM:SS.mmm` (with the date when the span crosses midnight) of `ns`, UTC.
fn tick(ns: i64, with_date: bool) -> String {
    let t = chrono::DateTime::from_timestamp_nanos(ns);
    if with_date {
        t.format("%m-%d %H:%M:%S").to_string()
    } else {
        t.format("%H:%M:%S%.3f").to_string()
    }
}

/// Writes `series` as a line chart to `path` (`.svg` or `.png`); `fmt_y` formats y tick labels.
///
/// # Errors
/// A bad extension, no font, nothing to plot, or the file cannot be written.
pub fn write(
    path: &Path,
    labels: Labels<'_>,
    series: &[Series],
    fmt_y: &dyn Fn(f64) -> String,
) -> Result<()> {
    let kind = Kind::of(path)?;
    font()?;
    let pts = series
        .iter()
        .flat_map(|(_, p)| p.iter())
        .filter(|p| p.1.is_finite());
    let (mut t0, mut t1, mut y0, mut y1) = (i64::MAX, i64::MIN, 0.0f64, f64::NEG_INFINITY);
    for (t, y) in pts {
        t0 = t0.min(*t);
        t1 = t1.max(*t);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if t0 > t1 {
        return Err(Error::NotFound(format!(
            "--plot {}: nothing to plot (no values in the window)",
            path.display()
        )));
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let t1 = t1.max(t0 + 1);
    let ranges = ((t0, t1), (y0, y1 * 1.05));
    let res = match kind {
        Kind::Svg => draw(
            SVGBackend::new(path, SIZE).into_drawing_area(),
            labels,
            series,
            ranges,
            fmt_y,
        ),
        Kind::Png => draw(
            BitMapBackend::new(path, SIZE).into_drawing_area(),
            labels,
            series,
            ranges,
            fmt_y,
        ),
    };
    res.map_err(|e| Error::Usage(format!("--plot {}: {e}", path.display())))
}

/// Draws the chart on `root` and writes it out.
fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    labels: Labels<'_>,
    series: &[Series],
    (x, y): ((i64, i64), (f64, f64)),
    fmt_y: &dyn Fn(f64) -> String,
) -> std::result::Result<(), String> {
    chart(&root, labels, series, x, y, fmt_y)?;
    root.present().map_err(|e| e.to_string())
}

fn chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    labels: Labels<'_>,
    series: &[Series],
    (t0, t1): (i64, i64),
    (y0, y1): (f64, f64),
    fmt_y: &dyn Fn(f64) -> String,
) -> std::result::Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let with_date = t1 - t0 > 86_400_000_000_000
        || chrono::DateTime::from_timestamp_nanos(t0).date_naive()
            != chrono::DateTime::from_timestamp_nanos(t1).date_naive();
    let mut c = ChartBuilder::on(root)
        .caption(labels.title, ("sans-serif", 26))
        .margin(16)
        .margin_right(56)
        .x_label_area_size(56)
        .y_label_area_size(110)
        .build_cartesian_2d(t0..t1, y0..y1)
        .map_err(err)?;
    c.configure_mesh()
        .x_desc(format!("time (UTC), {} … {}", fmt_ts(t0), fmt_ts(t1)))
        .y_desc(labels.y)
        .x_labels(8)
        .y_labels(8)
        .x_label_formatter(&|t| tick(*t, with_date))
        .y_label_formatter(&|v| fmt_y(*v))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let line: Vec<(i64, f64)> = pts.iter().filter(|p| p.1.is_finite()).copied().collect();
        c.draw_series(LineSeries::new(line, color.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extension_picks_the_format() {
        assert_eq!(Kind::of(Path::new("a.SVG")).unwrap(), Kind::Svg);
        assert_eq!(Kind::of(Path::new("x/a.png")).unwrap(), Kind::Png);
        assert!(Kind::of(Path::new("a.jpg")).is_err());
        assert_eq!(tick(1_700_000_000_123_000_000, false), "22:13:20.123");
    }
}

/// Where `--plot` draws: alone, in the terminal (table output only); with a file name, an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlotTo {
    Nowhere,
    Terminal,
    File(PathBuf),
}

impl PlotTo {
    /// From the flag's value (`None`: not given, `""`: given without a file) and whether the
    /// output is a table.
    pub fn new(arg: Option<&str>, table: bool) -> Self {
        match arg {
            None => PlotTo::Nowhere,
            Some("") if table => PlotTo::Terminal,
            Some("") => PlotTo::Nowhere,
            Some(f) => PlotTo::File(PathBuf::from(f)),
        }
    }

    /// Whether series need collecting.
    pub fn wanted(&self) -> bool {
        *self != PlotTo::Nowhere
    }

    /// Draws `series`: the terminal chart (`height` rows) after the table, or the image file
    /// (its path said on stderr).
    ///
    /// # Errors
    /// Printing, or writing the image.
    pub fn draw(
        &self,
        p: &mut crate::output::Printer,
        labels: Labels<'_>,
        series: &[Series],
        height: usize,
        fmt_y: &dyn Fn(f64) -> String,
    ) -> Result<()> {
        match self {
            PlotTo::Nowhere => Ok(()),
            PlotTo::Terminal => p.text(&format!(
                "\n{}",
                crate::plot::chart(labels.title, series, 72, height, fmt_y)
            )),
            PlotTo::File(f) => {
                write(f, labels, series, fmt_y)?;
                eprintln!("stel-query: wrote the chart to {}", f.display());
                Ok(())
            }
        }
    }
}
