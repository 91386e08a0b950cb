//! The family and group names from SONiC's `/etc/sonic/constants.yml`:
//! `constants.high_frequency_telemetry.{genl_family,genl_multicast_group}` (current HLD and
//! countersyncd), then the original HLD's `constants.stream_telemetry.*`, then the defaults
//! `sonic_stel` / `ipfix` (orchagent's `createNetlinkChannel("sonic_stel", "ipfix")`). Each key
//! falls back on its own.
//!
//! Why no YAML crate: we read four scalar keys from a file whose other sections belong to other
//! daemons (bgp, peers, ...). serde_yaml is deprecated and its forks are young; a full YAML
//! parser is a dependency of the daemon for the sake of a path lookup. The reader below is
//! indentation-aware block YAML: it tracks the key path by indentation, understands comments,
//! single/double-quoted keys and values, sequences, document markers, and skips what it does not
//! model (block scalars `|`/`>`, flow collections, multi-line plain scalars) *when it belongs to
//! another key*. On the path to our keys it is strict: anything it cannot read exactly (an
//! alias, a tag, a flow mapping, a multi-line or block value, a tab in the indentation) is an
//! error naming the file and line, never a silent default.

use std::{
    io,
    path::{Path, PathBuf},
};

use super::{check_name, NameError};

/// Where SONiC keeps it.
pub const DEFAULT_CONSTANTS_PATH: &str = "/etc/sonic/constants.yml";
/// orchagent's family name.
pub const DEFAULT_FAMILY: &str = "sonic_stel";
/// orchagent's multicast group name.
pub const DEFAULT_GROUP: &str = "ipfix";

/// Sections in order of precedence.
const SECTIONS: [&str; 2] = ["high_frequency_telemetry", "stream_telemetry"];
const FAMILY_KEY: &str = "genl_family";
const GROUP_KEY: &str = "genl_multicast_group";

/// The generic netlink family and multicast group the switch sends counters on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenlConfig {
    /// Generic netlink family name (≤ 15 bytes).
    pub family: String,
    /// Multicast group name within the family (≤ 15 bytes).
    pub group: String,
}

impl Default for GenlConfig {
    fn default() -> Self {
        Self {
            family: DEFAULT_FAMILY.to_owned(),
            group: DEFAULT_GROUP.to_owned(),
        }
    }
}

/// constants.yml could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConstantsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}:{line}: {msg}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        msg: String,
    },
}

impl GenlConfig {
    /// Reads `path` (normally [`DEFAULT_CONSTANTS_PATH`]). A missing file gives the defaults
    /// (logged at info): a switch image without HFT, or a lab machine.
    ///
    /// # Errors
    /// The file exists but cannot be read, is not UTF-8, is not readable as YAML on the path to
    /// our keys, or names an invalid family/group (empty, > 15 bytes).
    pub fn from_constants_file(path: &Path) -> Result<Self, ConstantsError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let d = Self::default();
                tracing::info!(path = %path.display(), family = %d.family, group = %d.group,
                    "No constants.yml; using the default generic netlink names.");
                return Ok(d);
            }
            Err(source) => {
                return Err(ConstantsError::Read {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        let text = String::from_utf8(bytes).map_err(|e| {
            let ok = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            ConstantsError::Parse {
                path: path.to_owned(),
                line: ok.iter().filter(|&&c| c == b'\n').count() + 1,
                msg: "not UTF-8".to_owned(),
            }
        })?;
        let cfg = Self::from_constants_str(&text, path)?;
        tracing::info!(path = %path.display(), family = %cfg.family, group = %cfg.group,
            "Generic netlink names from constants.yml.");
        Ok(cfg)
    }

    /// Parses constants.yml text; `path` is only used in errors.
    ///
    /// # Errors
    /// As [`from_constants_file`](Self::from_constants_file).
    pub fn from_constants_str(text: &str, path: &Path) -> Result<Self, ConstantsError> {
        let targets: Vec<[&str; 3]> = SECTIONS
            .iter()
            .flat_map(|s| [["constants", s, FAMILY_KEY], ["constants", s, GROUP_KEY]])
            .collect();
        let found = scan(text, &targets).map_err(|(line, msg)| ConstantsError::Parse {
            path: path.to_owned(),
            line,
            msg,
        })?;
        let pick = |key: &str, default: &str| -> Result<String, ConstantsError> {
            for (t, f) in targets.iter().zip(&found) {
                if t[2] != key {
                    continue;
                }
                if let Some((value, line)) = f {
                    check_name(value).map_err(|NameError { reason, .. }| {
                        ConstantsError::Parse {
                            path: path.to_owned(),
                            line: *line,
                            msg: format!(
                                "{} = {value:?} is not a generic netlink name: {reason}",
                                t.join(".")
                            ),
                        }
                    })?;
                    return Ok(value.clone());
                }
            }
            Ok(default.to_owned())
        };
        Ok(Self {
            family: pick(FAMILY_KEY, DEFAULT_FAMILY)?,
            group: pick(GROUP_KEY, DEFAULT_GROUP)?,
        })
    }
}

type LineError = (usize, String);

/// Finds the scalar value (and its line) at each of `targets`, a path of mapping keys from the
/// document root. Null (`~`, `null`, empty) counts as absent. Later duplicates win, like PyYAML.
fn scan(text: &str, targets: &[[&str; 3]]) -> Result<Vec<Option<(String, usize)>>, LineError> {
    let mut found = vec![None; targets.len()];
    // Open mappings/sequence items by indentation; `None` = inside a sequence item (never on
    // the path to a target).
    let mut stack: Vec<(usize, Option<String>)> = Vec::new();
    // Skip lines more indented than this (block scalar or sequence item content).
    let mut skip_deeper: Option<usize> = None;
    // Inside a multi-line flow collection: bracket depth.
    let mut flow_depth: usize = 0;
    // The last line set a target scalar at this indentation: a deeper line would continue it.
    let mut target_at: Option<(usize, String)> = None;

    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        let mut line = raw.strip_suffix('\r').unwrap_or(raw);
        if i == 0 {
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        let content = line.trim_start_matches(' ');
        let indent = line.len() - content.len();
        let blank = content.is_empty() || content.starts_with('#');
        if flow_depth > 0 {
            flow_depth = flow_balance(content, flow_depth);
            continue;
        }
        if let Some(k) = skip_deeper {
            if blank || indent > k {
                continue;
            }
            skip_deeper = None;
        }
        if blank {
            continue;
        }
        if content.starts_with('\t') {
            return Err((lineno, "tab in indentation".to_owned()));
        }
        if indent == 0 {
            if content == "..." || content.starts_with("... ") {
                break;
            }
            if content == "---" || content.starts_with("--- ") || content.starts_with('%') {
                stack.clear();
                target_at = None;
                continue;
            }
        }
        if let Some((k, key)) = target_at.take() {
            if indent > k {
                return Err((
                    lineno,
                    format!("multi-line value for {key} is not supported"),
                ));
            }
        }
        while stack.last().is_some_and(|&(ind, _)| ind >= indent) {
            stack.pop();
        }
        if content == "-" || content.starts_with("- ") {
            stack.push((indent, None));
            skip_deeper = Some(indent);
            continue;
        }
        if content.starts_with('[') || content.starts_with('{') {
            flow_depth = flow_balance(content, 0);
            continue;
        }
        let Some((key, rest)) = split_key(content).map_err(|m| (lineno, m))? else {
            // A continuation of another key's multi-line scalar, a complex key (`?`): not ours.
            continue;
        };
        let path: Option<Vec<&str>> = stack
            .iter()
            .map(|(_, k)| k.as_deref())
            .chain([Some(key.as_str())])
            .collect();
        let (is_target, on_path) = match &path {
            Some(p) => (
                targets.iter().position(|t| t[..] == p[..]),
                targets
                    .iter()
                    .any(|t| p.len() < t.len() && t[..p.len()] == p[..]),
            ),
            None => (None, false),
        };
        let dotted = || path.as_ref().map(|p| p.join(".")).unwrap_or_default();
        let value = strip_comment(rest).map_err(|m| (lineno, m))?.trim();
        if value.is_empty() {
            // A nested mapping follows (or a null).
            if let Some(t) = is_target {
                found[t] = None;
                target_at = Some((indent, dotted()));
            }
            stack.push((indent, Some(key)));
        } else if value.starts_with('|') || value.starts_with('>') {
            if is_target.is_some() || on_path {
                return Err((
                    lineno,
                    format!("block scalar for {} is not supported", dotted()),
                ));
            }
            skip_deeper = Some(indent);
        } else if value.starts_with('[') || value.starts_with('{') {
            if is_target.is_some() || on_path {
                return Err((
                    lineno,
                    format!("flow collection for {} is not supported", dotted()),
                ));
            }
            flow_depth = flow_balance(value, 0);
        } else if value.starts_with(['&', '*', '!']) {
            if is_target.is_some() || on_path {
                return Err((
                    lineno,
                    format!("anchor, alias or tag on {} is not supported", dotted()),
                ));
            }
            stack.push((indent, Some(key)));
        } else if let Some(t) = is_target {
            found[t] = scalar(value).map_err(|m| (lineno, m))?.map(|v| (v, lineno));
            target_at = Some((indent, dotted()));
        } else if on_path {
            return Err((lineno, format!("{} must be a mapping", dotted())));
        }
    }
    Ok(found)
}

/// Splits `key: rest` (the key plain or quoted). `Ok(None)` when the line is no mapping entry.
fn split_key(content: &str) -> Result<Option<(String, &str)>, String> {
    if content.starts_with(['"', '\'']) {
        let (key, after) = quoted(content)?;
        let after = after.trim_start_matches(' ');
        return Ok(after
            .strip_prefix(':')
            .filter(|r| r.is_empty() || r.starts_with([' ', '\t']))
            .map(|r| (key, r)));
    }
    if content.starts_with(['?', '#']) {
        return Ok(None);
    }
    let b = content.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        if c == b'#' && i > 0 && matches!(b[i - 1], b' ' | b'\t') {
            return Ok(None);
        }
        if c == b':' && matches!(b.get(i + 1), None | Some(b' ' | b'\t')) {
            return Ok(Some((
                content[..i].trim_end().to_owned(),
                &content[i + 1..],
            )));
        }
    }
    Ok(None)
}

/// Removes a trailing ` # comment` (outside quotes) from a value.
fn strip_comment(rest: &str) -> Result<&str, String> {
    let t = rest.trim_start();
    let start = rest.len() - t.len();
    let scan_from = if t.starts_with(['"', '\'']) {
        let (_, after) = quoted(t)?;
        start + (t.len() - after.len())
    } else {
        0
    };
    let b = rest.as_bytes();
    for i in scan_from..b.len() {
        if b[i] == b'#' && (i == 0 || matches!(b[i - 1], b' ' | b'\t')) {
            return Ok(&rest[..i]);
        }
    }
    Ok(rest)
}

/// Parses a quoted scalar at the start of `s`; returns it and what follows the closing quote.
fn quoted(s: &str) -> Result<(String, &str), String> {
    let mut out = String::new();
    let mut it = s.char_indices();
    let q = match it.next() {
        Some((_, c @ ('"' | '\''))) => c,
        _ => return Err("expected a quote".to_owned()),
    };
    while let Some((i, c)) = it.next() {
        match (q, c) {
            ('\'', '\'') => {
                if s[i + 1..].starts_with('\'') {
                    it.next();
                    out.push('\'');
                } else {
                    return Ok((out, &s[i + 1..]));
                }
            }
            ('"', '"') => return Ok((out, &s[i + 1..])),
            ('"', '\\') => {
                let e = match it.next() {
                    Some((_, e)) => e,
                    None => break,
                };
                out.push(match e {
                    '\\' => '\\',
                    '"' => '"',
                    '/' => '/',
                    'n' => '\n',
                    't' => '\t',
                    '0' => '\0',
                    ' ' => ' ',
                    other => return Err(format!("unsupported escape \\{other}")),
                });
            }
            _ => out.push(c),
        }
    }
    Err("unterminated quoted string (multi-line quoted values are not supported)".to_owned())
}

/// A target's scalar: quoted or plain; `None` for null.
fn scalar(v: &str) -> Result<Option<String>, String> {
    if v.starts_with(['"', '\'']) {
        let (s, after) = quoted(v)?;
        if !after.trim().is_empty() {
            return Err(format!(
                "unexpected {:?} after the quoted value",
                after.trim()
            ));
        }
        return Ok(Some(s));
    }
    Ok(match v {
        "~" | "null" | "Null" | "NULL" => None,
        _ => Some(v.to_owned()),
    })
}

/// Bracket depth after `s`, starting from `depth` (quotes respected, comments ignored).
fn flow_balance(s: &str, mut depth: usize) -> usize {
    let mut quote = None;
    let mut prev = ' ';
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') if prev == ' ' || prev == '\t' => break,
            (None, '[' | '{') => depth += 1,
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
        prev = c;
    }
    depth
}
