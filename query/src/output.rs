//! Printing results: an aligned table (default), CSV, or JSON Lines.
//!
//! # JSON Lines format
//! Every line is `{"type": T, "data": {…}}`: one `begin` (what was asked: window, session,
//! columns), then one `row` per result row, then one `summary` (row count, samples scanned,
//! elapsed). Values in `row` are raw numbers (bytes/s, not "MB/s"); times are RFC 3339 strings
//! with a `*_ns` twin where the precision matters. Errors are one `{"type":"error",…}` line on
//! stderr.
//!
//! A table's column widths come from its first [`TABLE_SAMPLE`] rows; later rows stream.

use std::io::{self, BufWriter, Stdout, Write};

use serde_json::{json, Value};

use crate::error::Result;

pub use crate::diag::warn;

/// Chooses how [`warn`] writes (the process's output format; set once by `main`).
pub fn set_diagnostics(format: Format) {
    crate::diag::set_json(format == Format::Json);
}

/// The keys of JSON rows for `header`: each lowercased name, quoted and escaped, with its
/// cell's index, in the order a JSON object's keys print (sorted; a repeated name keeps its
/// last cell).
fn json_keys(header: &[String]) -> Vec<(String, usize)> {
    let mut keys: std::collections::BTreeMap<String, usize> = Default::default();
    for (i, h) in header.iter().enumerate() {
        keys.insert(h.to_lowercase(), i);
    }
    keys.into_iter()
        .map(|(k, i)| (Value::String(k).to_string(), i))
        .collect()
}

/// One JSON row line, `{"data":{…},"type":"row"}`, byte for byte as serde_json prints that
/// object (keys sorted), written without building it: `keys` from [`Printer::begin`].
fn json_row(w: &mut impl Write, keys: &[(String, usize)], cells: &[Cell]) -> io::Result<()> {
    w.write_all(b"{\"data\":{")?;
    let mut first = true;
    for (k, i) in keys {
        let Some(c) = cells.get(*i) else { continue };
        if !first {
            w.write_all(b",")?;
        }
        first = false;
        w.write_all(k.as_bytes())?;
        w.write_all(b":")?;
        serde_json::to_writer(&mut *w, &c.json)?;
    }
    w.write_all(b"},\"type\":\"row\"}\n")
}

/// Rows a table buffers to size its columns before it streams.
pub const TABLE_SAMPLE: usize = 512;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Csv,
}

/// One cell: what JSON carries and what a person reads.
#[derive(Debug, Clone)]
pub struct Cell {
    pub json: Value,
    pub text: String,
}

impl Cell {
    pub fn str(s: impl Into<String>) -> Self {
        let s = s.into();
        Self {
            json: Value::String(s.clone()),
            text: s,
        }
    }
    pub fn u64(v: u64) -> Self {
        Self {
            json: json!(v),
            text: v.to_string(),
        }
    }
    /// A count: raw in JSON and CSV, `1,234,567` in a table.
    pub fn count(v: u64) -> Self {
        Self {
            json: json!(v),
            text: thousands(v),
        }
    }
    pub fn f64(v: f64, text: String) -> Self {
        Self {
            json: if v.is_finite() { json!(v) } else { Value::Null },
            text,
        }
    }
    pub fn opt_f64(v: Option<f64>, text: impl FnOnce(f64) -> String) -> Self {
        match v {
            Some(v) => Self::f64(v, text(v)),
            None => Self::na(),
        }
    }
    pub fn na() -> Self {
        Self {
            json: Value::Null,
            text: "N/A".into(),
        }
    }
    pub fn time(ns: i64) -> Self {
        Self::str(crate::window::fmt_ts(ns))
    }
}

/// Where rows go.
#[derive(Debug)]
pub struct Printer {
    format: Format,
    out: BufWriter<Stdout>,
    header: Vec<String>,
    /// Units of header columns, shown in the CSV header (`RX_BPS (bytes/s)`).
    units: Vec<(String, String)>,
    pending: Vec<Vec<String>>,
    widths: Option<Vec<usize>>,
    rows: u64,
    /// JSON rows' keys ([`json_keys`]).
    json_keys: Vec<(String, usize)>,
}

impl Printer {
    pub fn new(format: Format) -> Self {
        Self {
            format,
            out: BufWriter::with_capacity(1 << 16, io::stdout()),
            header: Vec::new(),
            units: Vec::new(),
            pending: Vec::new(),
            widths: None,
            rows: 0,
            json_keys: Vec::new(),
        }
    }

    /// Whether cells' `text` is printed (tables): JSON and CSV print their `json` value only,
    /// so callers may leave `text` empty for them and skip formatting it.
    pub fn wants_text(&self) -> bool {
        self.format == Format::Table
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// Rows printed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The units of some columns (set before [`Printer::begin`]): the CSV header carries them
    /// (`RX_BPS (bytes/s)`), since CSV cells are raw numbers.
    pub fn set_units(&mut self, units: &[(&str, &str)]) {
        self.units = units
            .iter()
            .map(|(c, u)| (c.to_string(), u.to_string()))
            .collect();
    }

    /// Starts the output: the column names and what was asked (`begin` in JSON).
    pub fn begin(&mut self, header: &[&str], about: Value) -> Result<()> {
        self.header = header.iter().map(|s| s.to_string()).collect();
        self.json_keys = json_keys(&self.header);
        match self.format {
            Format::Json => self.line(json!({"type": "begin", "data": about}))?,
            Format::Csv => {
                let h = self
                    .header
                    .iter()
                    .map(|h| match self.units.iter().find(|(c, _)| c == h) {
                        Some((_, u)) => csv_field(&format!("{h} ({u})")),
                        None => csv_field(h),
                    })
                    .collect::<Vec<_>>()
                    .join(",");
                writeln!(self.out, "{h}")?;
            }
            Format::Table => {}
        }
        Ok(())
    }

    /// Ends the table in progress (tables only): prints it, and the next [`Printer::begin`]
    /// starts another with its own columns.
    pub fn end_table(&mut self) -> Result<()> {
        if self.format == Format::Table {
            if self.widths.is_none() && !self.pending.is_empty() {
                self.flush_table()?;
            }
            self.widths = None;
            self.pending.clear();
        }
        Ok(())
    }

    /// A sentence about the answer: a line of its own on stdout for tables (before the table
    /// when no row is out yet), on stderr (`stel-query: …`) for CSV; JSON carries the same in
    /// its `begin`/`summary`.
    pub fn note(&mut self, line: &str) -> Result<()> {
        match self.format {
            Format::Table => {
                if self.widths.is_none() && !self.pending.is_empty() {
                    self.flush_table()?;
                }
                writeln!(self.out, "{line}")?;
            }
            Format::Csv => {
                self.out.flush()?;
                eprintln!("stel-query: {line}");
            }
            Format::Json => {}
        }
        Ok(())
    }

    fn line(&mut self, v: Value) -> Result<()> {
        serde_json::to_writer(&mut self.out, &v).map_err(io::Error::from)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }

    /// One result row, cells in header order.
    pub fn row(&mut self, cells: Vec<Cell>) -> Result<()> {
        self.rows += 1;
        match self.format {
            Format::Json => Ok(json_row(&mut self.out, &self.json_keys, &cells)?),
            Format::Csv => {
                // Raw values (the JSON ones): numbers without units or separators, N/A empty.
                let line = cells
                    .iter()
                    .map(|c| match &c.json {
                        Value::Null => String::new(),
                        Value::String(s) => csv_field(s),
                        v => csv_field(&v.to_string()),
                    })
                    .collect::<Vec<_>>()
                    .join(",");
                writeln!(self.out, "{line}")?;
                Ok(())
            }
            Format::Table => {
                let texts: Vec<String> = cells.into_iter().map(|c| c.text).collect();
                if self.widths.is_some() {
                    self.table_line(&texts)
                } else {
                    self.pending.push(texts);
                    if self.pending.len() >= TABLE_SAMPLE {
                        self.flush_table()?;
                    }
                    Ok(())
                }
            }
        }
    }

    fn table_line(&mut self, cells: &[String]) -> Result<()> {
        let widths = self.widths.as_deref().unwrap_or(&[]);
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let w = widths.get(i).copied().unwrap_or(0);
            if i > 0 {
                s.push_str("  ");
            }
            // First column left-aligned (names, times), numbers right-aligned like portstat.
            if i == 0 || !looks_numeric(c) {
                s.push_str(&format!("{c:<w$}"));
            } else {
                s.push_str(&format!("{c:>w$}"));
            }
        }
        writeln!(self.out, "{}", s.trim_end())?;
        Ok(())
    }

    fn flush_table(&mut self) -> Result<()> {
        if self.widths.is_some() {
            return Ok(());
        }
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.pending {
            for (i, c) in r.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(c.chars().count());
                }
            }
        }
        self.widths = Some(widths.clone());
        let header = self.header.clone();
        self.table_line(&header)?;
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        self.table_line(&rule)?;
        for r in std::mem::take(&mut self.pending) {
            self.table_line(&r)?;
        }
        Ok(())
    }

    /// Ends the output: `summary` in JSON (with `files_skipped`, the unreadable or foreign
    /// files left out); for tables and CSV, a line on stderr when files were skipped.
    pub fn summary(&mut self, mut about: Value) -> Result<()> {
        let skipped = crate::quarantine::skipped_total();
        match self.format {
            Format::Json => {
                if let Some(m) = about.as_object_mut() {
                    m.insert("files_skipped".into(), json!(skipped));
                }
                self.line(json!({"type": "summary", "data": about}))?
            }
            Format::Table => {
                if self.rows > 0 {
                    self.flush_table()?;
                }
            }
            Format::Csv => {}
        }
        self.out.flush()?;
        if skipped > 0 && self.format != Format::Json {
            eprintln!(
                "stel-query: {skipped} unreadable or foreign Parquet file{} skipped (named above; --strict fails on them instead)",
                if skipped == 1 { "" } else { "s" }
            );
        }
        Ok(())
    }

    /// Free-form text (charts) into the same stream, tables only.
    pub fn text(&mut self, s: &str) -> Result<()> {
        if self.format == Format::Table {
            self.flush_table()?;
            self.out.write_all(s.as_bytes())?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

fn looks_numeric(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '-')
        && !s.contains('T')
        || s == "N/A"
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub use stel_store::sai::natural_cmp;

/// `1234567` → `1,234,567` (portstat's RX_OK).
pub fn thousands(v: u64) -> String {
    let s = v.to_string();
    let head = match s.len() % 3 {
        0 => 3,
        n => n,
    };
    let mut out = s[..head.min(s.len())].to_string();
    for chunk in s.as_bytes()[head.min(s.len())..].chunks(3) {
        out.push(',');
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
    }
    out
}

/// A duration in the unit a person would say: `40µs`, `1.50ms`, `2.00s`.
pub fn human_ns(ns: i64) -> String {
    let a = ns.unsigned_abs();
    if a < 1_000 {
        format!("{ns}ns")
    } else if a < 1_000_000 {
        format!("{}µs", trim_float(ns as f64 / 1e3))
    } else if a < 1_000_000_000 {
        format!("{}ms", trim_float(ns as f64 / 1e6))
    } else {
        format!("{}s", trim_float(ns as f64 / 1e9))
    }
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// Counts with SI suffixes: 1.20 M, 3.40 G.
pub fn human_count(v: f64) -> String {
    let a = v.abs();
    if a >= 1e12 {
        format!("{:.2} T", v / 1e12)
    } else if a >= 1e9 {
        format!("{:.2} G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.2} K", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_rows_print_as_the_row_object_would() {
        let header = ["TIME", "IFACE", "RX_BPS", "Rank", "rank", "Q\"X"];
        let keys = json_keys(&header.map(String::from));
        let cells = || {
            vec![
                Cell::time(1_714_564_800_000_000_001),
                Cell::str("Ethernet0"),
                Cell::f64(1.5e9, String::new()),
                Cell::u64(1),
                Cell::u64(2),
                Cell::na(),
            ]
        };
        let mut m = serde_json::Map::new();
        for (h, c) in header.iter().zip(cells()) {
            m.insert(h.to_lowercase(), c.json);
        }
        let want = format!("{}\n", json!({"type": "row", "data": m}));
        let mut got = Vec::new();
        json_row(&mut got, &keys, &cells()).unwrap();
        assert_eq!(String::from_utf8(got).unwrap(), want);
    }

    #[test]
    fn number_formats() {
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(human_ns(40_000), "40µs");
        assert_eq!(human_ns(1_500_000), "1.5ms");
        assert_eq!(human_ns(999), "999ns");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        let mut ports = vec![
            "Ethernet100",
            "Ethernet4",
            "Ethernet0",
            "Ethernet12",
            "Ethernet0|10",
            "Ethernet0|3",
        ];
        ports.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            ports,
            [
                "Ethernet0",
                "Ethernet0|3",
                "Ethernet0|10",
                "Ethernet4",
                "Ethernet12",
                "Ethernet100"
            ]
        );
    }
}
