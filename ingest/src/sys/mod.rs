//! The only place in `stel-ingest` that calls the kernel directly. Each wrapper returns
//! [`SysError`] naming the call, so failures say what was attempted.

pub mod netlink;

use std::io;

/// A failed system call.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {source}")]
pub struct SysError {
    pub call: &'static str,
    #[source]
    pub source: io::Error,
}

impl SysError {
    pub(crate) fn last(call: &'static str) -> Self {
        Self {
            call,
            source: io::Error::last_os_error(),
        }
    }
}
