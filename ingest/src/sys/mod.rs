//! The only place in `stel-ingest` that calls the kernel directly. Each wrapper returns
//! [`SysError`] naming the call, so failures say what was attempted.

pub mod netlink;
pub mod signal;

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
    /// EAGAIN/EWOULDBLOCK (a receive timeout), EINTR or ENOBUFS: retry, nothing is broken.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.source.raw_os_error(),
            Some(libc::EAGAIN | libc::EINTR | libc::ENOBUFS)
        )
    }

    pub(crate) fn last(call: &'static str) -> Self {
        Self {
            call,
            source: io::Error::last_os_error(),
        }
    }
}
