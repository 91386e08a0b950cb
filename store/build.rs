//! Generates the SAI stat name tables from `sai/*.tsv` — the one table the names come from.
//! Each TSV line is `<decimal id>\t<SHORT_NAME>`; `#` starts a comment. Output (in OUT_DIR):
//! one static slice per object type sorted by id, and one sorted by short name, so both
//! directions are a binary search and nothing is a hand-written match.
use std::{env, fmt::Write as _, fs, path::Path};

const TYPES: &[(&str, &str)] = &[
    ("port", "PORT"),
    ("queue", "QUEUE"),
    ("ingress_priority_group", "INGRESS_PRIORITY_GROUP"),
    ("buffer_pool", "BUFFER_POOL"),
    ("router_interface", "ROUTER_INTERFACE"),
    ("switch", "SWITCH"),
];

fn main() {
    let mut out = String::new();
    for (file, upper) in TYPES {
        let path = format!("sai/{file}.tsv");
        println!("cargo:rerun-if-changed={path}");
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        let mut rows: Vec<(u32, String)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (id, name) = line
                .split_once('\t')
                .unwrap_or_else(|| panic!("{path}:{}: expected `<id>\\t<name>`", n + 1));
            let id: u32 = id
                .parse()
                .unwrap_or_else(|e| panic!("{path}:{}: {e}", n + 1));
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "{path}:{}: bad name {name}",
                n + 1
            );
            rows.push((id, name.to_string()));
        }
        rows.sort_by_key(|r| r.0);
        for w in rows.windows(2) {
            assert!(w[0].0 != w[1].0, "{path}: duplicate id {}", w[0].0);
        }
        writeln!(out, "static {upper}_BY_ID: &[StatName] = &[").unwrap();
        for (id, name) in &rows {
            writeln!(
                out,
                "    StatName {{ id: {id}, short: \"{name}\", full: \"SAI_{upper}_STAT_{name}\" }},"
            )
            .unwrap();
        }
        writeln!(out, "];").unwrap();
        let mut by_name: Vec<usize> = (0..rows.len()).collect();
        by_name.sort_by(|a, b| rows[*a].1.cmp(&rows[*b].1));
        writeln!(out, "static {upper}_BY_NAME: &[u16] = &{by_name:?};").unwrap();
    }
    let dest = Path::new(&env::var("OUT_DIR").unwrap()).join("sai_tables.rs");
    fs::write(dest, out).unwrap();
}
