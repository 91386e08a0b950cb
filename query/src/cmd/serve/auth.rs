//! The optional bearer token (`--token-file`), checked on every call before it reaches the
//! service.
//!
//! Accepted forms of the `authorization` header:
//! - `Bearer <token>`: what Grafana's FlightSQL data source (token), ADBC
//!   (`adbc.flight.sql.authorization_header`), pyarrow (`FlightCallOptions(headers=…)`) and the
//!   JDBC driver (`token=`) send;
//! - `Basic base64(<any user>:<token>)`: the username/password form (JDBC `user`/`password`,
//!   Grafana's username/password); the `Handshake` call then answers with `Bearer <token>`,
//!   which those clients send from then on.
//!
//! Without `--token-file` every call is let through.

use std::sync::Arc;

use base64::Engine;
use tonic::{metadata::MetadataMap, service::Interceptor, Request, Status};

use super::limits::{Refusal, Stats};

/// The interceptor in front of the Flight service.
#[derive(Debug, Clone)]
pub(super) struct Auth {
    token: Option<Arc<str>>,
    stats: Arc<Stats>,
}

impl Auth {
    pub(super) fn new(token: Option<Arc<str>>, stats: Arc<Stats>) -> Self {
        Self { token, stats }
    }

    /// Whether `md` carries the token (always when there is none to check).
    pub(super) fn allows(&self, md: &MetadataMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let Some(h) = md.get("authorization").and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let h = h.trim();
        if let Some(t) = strip_prefix_ci(h, "bearer ") {
            return same(t.trim().as_bytes(), token.as_bytes());
        }
        if let Some(b) = strip_prefix_ci(h, "basic ") {
            let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b.trim()) else {
                return false;
            };
            let Some(i) = raw.iter().position(|c| *c == b':') else {
                return false;
            };
            return same(&raw[i + 1..], token.as_bytes());
        }
        false
    }
}

impl Interceptor for Auth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        if self.allows(req.metadata()) {
            Ok(req)
        } else {
            Err(self.stats.refuse(
                Refusal::Unauthenticated,
                "missing or wrong token: send the header `authorization: Bearer <token>` with the token from the server's --token-file (or username/password with the token as the password)",
            ))
        }
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// Compares without stopping at the first difference (the time taken does not tell how much of
/// a guess was right).
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads the token from `path`: the file's content without surrounding whitespace.
///
/// # Errors
/// An unreadable or empty file.
pub(super) fn read_token(path: &std::path::Path) -> crate::Result<Arc<str>> {
    let s = std::fs::read_to_string(path).map_err(|e| {
        crate::Error::Usage(format!("cannot read --token-file {}: {e}", path.display()))
    })?;
    let t = s.trim();
    if t.is_empty() {
        return Err(crate::Error::Usage(format!(
            "--token-file {} is empty; put the token in it (e.g. `openssl rand -hex 32 > {}`)",
            path.display(),
            path.display()
        )));
    }
    Ok(t.into())
}

#[cfg(test)]
mod tests {
    use tonic::metadata::MetadataValue;

    use super::*;

    fn md(h: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", MetadataValue::try_from(h).unwrap());
        m
    }

    #[test]
    fn bearer_and_basic_forms_carry_the_token() {
        let a = Auth::new(Some("s3cret".into()), Stats::new());
        assert!(a.allows(&md("Bearer s3cret")));
        assert!(a.allows(&md("bearer s3cret")));
        assert!(!a.allows(&md("Bearer s3cre")));
        assert!(!a.allows(&MetadataMap::new()));
        let basic = base64::engine::general_purpose::STANDARD.encode("grafana:s3cret");
        assert!(a.allows(&md(&format!("Basic {basic}"))));
        let wrong = base64::engine::general_purpose::STANDARD.encode("grafana:nope");
        assert!(!a.allows(&md(&format!("Basic {wrong}"))));
        let open = Auth::new(None, Stats::new());
        assert!(open.allows(&MetadataMap::new()));
    }
}
