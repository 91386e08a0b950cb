//! The crate's one error type: every module's failures folded in, each message naming the thing,
//! the value and (where there is one) what to do next.

use std::io;

/// Everything `stel-query` can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag or argument that cannot be used as typed.
    #[error("{0}")]
    Usage(String),
    /// Nothing to answer from: no files, no session, an empty window. The text says what exists.
    #[error("{0}")]
    NotFound(String),
    /// A Parquet file that cannot be read or is not a stel file (only with --strict; otherwise
    /// such files are skipped with a warning).
    #[error("{0}")]
    BadFile(String),
    /// A remote engine (Spark Connect) refused or failed the question; the text is its own.
    #[error("{0}")]
    Engine(String),
    #[error("query engine: {0}")]
    DataFusion(#[from] datafusion::error::DataFusionError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("parquet: {0}")]
    Parquet(#[from] datafusion::parquet::errors::ParquetError),
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl Error {
    /// Whether this is stdout going away (`stel-query … | head`): exits 0 quietly.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Error::Io(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }
}

/// What to change for the failures of an S3 lake's requests that object_store words without
/// the cause: an `http://` endpoint refused by the HTTP client ("builder error") without
/// `AWS_ALLOW_HTTP=true`, and the credential chain falling through to the EC2 instance
/// metadata endpoint (169.254.169.254) because nothing else gave credentials. `var` reads the
/// environment (`std::env::var`, a map in tests).
pub fn s3_hint(message: &str, var: impl Fn(&str) -> Option<String>) -> Option<&'static str> {
    let http_endpoint = var("AWS_ENDPOINT_URL")
        .is_some_and(|u| u.trim().to_ascii_lowercase().starts_with("http://"));
    let http_allowed = var("AWS_ALLOW_HTTP").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if message.contains("builder error") && http_endpoint && !http_allowed {
        return Some("(an http:// AWS_ENDPOINT_URL needs AWS_ALLOW_HTTP=true)");
    }
    if message.contains("169.254.169.254") {
        return Some(
            "(no AWS credentials found: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, or an instance role; ~/.aws profiles are not read)",
        );
    }
    None
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn s3_failures_get_what_to_change() {
        let builder = "object store: Generic S3 error: Error performing list request: Error performing GET http://127.0.0.1:1/lake?list-type=2 in 39µs - HTTP error: builder error";
        let http = [("AWS_ENDPOINT_URL", "http://127.0.0.1:1")];
        assert_eq!(
            s3_hint(builder, env(&http)),
            Some("(an http:// AWS_ENDPOINT_URL needs AWS_ALLOW_HTTP=true)")
        );
        let allowed = [http[0], ("AWS_ALLOW_HTTP", "true")];
        assert_eq!(s3_hint(builder, env(&allowed)), None);
        assert_eq!(
            s3_hint(builder, env(&[("AWS_ENDPOINT_URL", "https://s3.example")])),
            None
        );
        let imds = "object store: Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token in 2ms - Server returned non-2xx status code: 403 Forbidden";
        assert_eq!(
            s3_hint(imds, env(&[])),
            Some("(no AWS credentials found: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, or an instance role; ~/.aws profiles are not read)")
        );
        assert_eq!(s3_hint("no Parquet files under /x", env(&http)), None);
    }
}
