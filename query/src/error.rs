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

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
