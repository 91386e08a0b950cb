//! stel-ingest: the daemon's data path.
//!
//! In flow order: [`reader`] (sockets, or capture files through [`input`]) → [`netlink`] frames (nlmsghdr + genlmsghdr around raw IPFIX) → [`ipfix`] wire
//! format and template compilation → [`decode`] (per-core decoder: bytes → Arrow counter batches,
//! sequence accounting, every malformed input counted) → sinks. [`sessions`] owns what sessions
//! exist and applies them to the filter and the decoders together. [`emu`] is the switch stand-in
//! (`stel-emu`) built on the same encoder; [`sys`] holds the few unsafe syscall wrappers.
//!
//! `decode` does no I/O so benchmarks and fuzzers drive it with plain byte slices. [`int`] is the
//! second source: INT telemetry reports (UDP payloads) → the `int_*` tables, equally I/O-free.

pub mod config;
pub mod daemon;
pub mod decode;
pub mod demo;
pub mod emu;
pub mod filter;
pub mod genl;
mod hex;
pub mod input;
pub mod int;
pub mod ipfix;
pub mod netlink;
pub mod pipeline;
pub mod reader;
pub mod sessions;
pub mod sinks;
pub mod sources;
pub mod status;
pub mod sys;
pub mod topology;
