//! Diagnostics on stderr: warnings as `stel-query: warning: …` text, or as JSON lines under
//! `--json`. A leaf module: the data layer (e.g. `quarantine`) warns through it, and `output`
//! chooses its form.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{json, Map, Value};

/// Whether diagnostics on stderr are JSON lines (`--json`) or `stel-query: …` text.
static JSON_DIAGNOSTICS: AtomicBool = AtomicBool::new(false);

/// Diagnostics as JSON lines (`true`) or text.
pub fn set_json(json: bool) {
    JSON_DIAGNOSTICS.store(json, Ordering::Relaxed);
}

/// A warning on stderr: `stel-query: warning: <message>`, or with `--json` one
/// `{"type":"warning","data":{"message":…, …data}}` line.
pub fn warn(message: &str, data: Value) {
    if JSON_DIAGNOSTICS.load(Ordering::Relaxed) {
        let mut d = match data {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        d.insert("message".into(), Value::String(message.to_string()));
        eprintln!("{}", json!({"type": "warning", "data": d}));
    } else {
        eprintln!("stel-query: warning: {message}");
    }
}

/// Information on stderr, not a problem: `stel-query: <message>`, or with `--json` one
/// `{"type":"note","data":{"message":…}}` line.
pub fn note(message: &str) {
    if JSON_DIAGNOSTICS.load(Ordering::Relaxed) {
        eprintln!("{}", json!({"type": "note", "data": {"message": message}}));
    } else {
        eprintln!("stel-query: {message}");
    }
}
