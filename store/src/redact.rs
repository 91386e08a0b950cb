//! Credentials out of everything stel logs or writes: one function, [`redact`], for every URL
//! (Redis, S3 endpoints, OTLP collectors) and for any text that may hold one (an error message
//! that quotes the URL it failed on), used by the daemon, the sinks and `stel-query`.
//!
//! What it hides:
//! - the password of a URL's user info: `redis://:s3cret@host` → `redis://:***@host`,
//!   `https://user:pw@h` → `https://user:***@h`; user info without a colon is a token
//!   (`https://TOKEN@host`) and is hidden whole: `https://***@host`;
//! - the values of query parameters that carry secrets (`?password=`, `pass=`, `token=`,
//!   `secret=`, `key=`, `signature=`, `credential=`, `auth…`): `redis+unix:///s?pass=x` →
//!   `redis+unix:///s?pass=***`.
//!
//! Header values (OTLP `[otlp.headers]`) are never printed at all; [`redact_header`] is what
//! prints in their place.
use std::borrow::Cow;

/// What replaces a secret.
pub const MASK: &str = "***";

/// `text` with the credentials of every URL in it replaced by [`MASK`] (see the module docs).
/// Borrowed when there was nothing to hide.
pub fn redact(text: &str) -> Cow<'_, str> {
    if !text.contains("://") && !text.contains('=') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // The authority ends at the first of these; user info is what precedes its last '@'.
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace() || is_quote(c))
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) => {
                let info = &authority[..at];
                match info.find(':') {
                    Some(c) => {
                        out.push_str(&info[..=c]);
                        out.push_str(MASK);
                    }
                    None => out.push_str(MASK),
                }
                out.push_str(&authority[at..]);
                changed = true;
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    let out = redact_params(&out, &mut changed);
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(text)
    }
}

fn is_quote(c: char) -> bool {
    matches!(c, '"' | '\'' | '`' | '<' | '>')
}

/// Whether a query parameter's name says its value is a secret.
fn secret_param(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    let n = n.rsplit(['-', '_', '.']).next().unwrap_or(&n);
    matches!(
        n,
        "pass" | "password" | "passwd" | "pwd" | "token" | "secret" | "key" | "signature"
    ) || n.starts_with("auth")
        || n.contains("credential")
        || n.contains("secret")
        || n.contains("password")
}

/// Masks the values of secret query parameters (`name=value` after `?` or `&`).
fn redact_params(text: &str, changed: &mut bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(['?', '&']) {
        out.push_str(&rest[..=i]);
        let tail = &rest[i + 1..];
        let name_end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
            .unwrap_or(tail.len());
        let name = &tail[..name_end];
        if tail[name_end..].starts_with('=') && secret_param(name) {
            let value = &tail[name_end + 1..];
            let v_end = value
                .find(|c: char| matches!(c, '&' | '#') || c.is_whitespace() || is_quote(c))
                .unwrap_or(value.len());
            out.push_str(name);
            out.push('=');
            out.push_str(MASK);
            *changed |= v_end > 0;
            rest = &value[v_end..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// What is printed for a header's value: its name and the mask, never the value
/// (`authorization: ***`).
pub fn redact_header(name: &str) -> String {
    format!("{name}: {MASK}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_credential_is_masked() {
        for (input, want) in [
            ("redis://:s3cret@10.0.0.1:6379/0", "redis://:***@10.0.0.1:6379/0"),
            ("redis://default:s3cret@host", "redis://default:***@host"),
            ("rediss://u:p%40ss@host:6380", "rediss://u:***@host:6380"),
            ("https://TOKEN@otel.example:4318/v1/metrics", "https://***@otel.example:4318/v1/metrics"),
            ("redis+unix:///run/redis.sock?db=4&pass=s3cret", "redis+unix:///run/redis.sock?db=4&pass=***"),
            ("unix:///r.sock?password=s3cret&db=1", "unix:///r.sock?password=***&db=1"),
            ("http://h/?X-Amz-Signature=abc&X-Amz-Credential=AKIA", "http://h/?X-Amz-Signature=***&X-Amz-Credential=***"),
            (
                "counters-db (redis://:s3cret@h:1): Connection refused; retrying redis://:s3cret@h:1",
                "counters-db (redis://:***@h:1): Connection refused; retrying redis://:***@h:1",
            ),
            ("url=\"redis://:s3cret@h\"", "url=\"redis://:***@h\""),
        ] {
            assert_eq!(redact(input), want, "{input}");
        }
        for clean in [
            "redis://127.0.0.1:6379/0",
            "unix:///var/run/redis/redis.sock",
            "s3://lake/stel",
            "http://127.0.0.1:4317",
            "a=b c=d",
            "https://h/path?db=4&x=y",
            "no url here",
        ] {
            assert!(matches!(redact(clean), Cow::Borrowed(_)), "{clean}");
        }
        assert_eq!(redact_header("authorization"), "authorization: ***");
    }
}
