//! The files of the INT tables' tree (`<root>/table=<t>/switch=<id>/date=…/hour=…/`): one walk
//! for the writer's recovery and for readers that ask whether unpublished parts exist.

use std::{
    fs::{self, Metadata},
    path::{Path, PathBuf},
};

use crate::paths::{classify_table, TableEntry};

/// Calls `f` with every file under `root/table=*` (or only `root/table=<table>`), its
/// classification and metadata. Unreadable directories and entries are skipped.
pub(crate) fn for_each_file(
    root: &Path,
    table: Option<&str>,
    mut f: impl FnMut(PathBuf, TableEntry, Metadata),
) {
    let want = table.map(|t| format!("table={t}"));
    let mut stack: Vec<PathBuf> = match fs::read_dir(root) {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                match &want {
                    Some(w) => name == w.as_str(),
                    None => name.starts_with("table="),
                }
            })
            .map(|e| e.path())
            .collect(),
        Err(_) => Vec::new(),
    };
    while let Some(dir) = stack.pop() {
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let path = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(path);
                continue;
            }
            let Ok(md) = e.metadata() else { continue };
            let entry = classify_table(root, &path);
            f(path, entry, md);
        }
    }
}

/// Temporary parts of `table` under `root`: files the INT sink is still writing (or that a
/// killed writer left). A reader that finds no published file but some of these can say the
/// data exists and will be published.
pub fn unpublished_parts(root: &Path, table: &str) -> usize {
    let mut n = 0;
    for_each_file(root, Some(table), |_, e, _| {
        n += usize::from(matches!(e, TableEntry::Temp { .. }));
    });
    n
}
