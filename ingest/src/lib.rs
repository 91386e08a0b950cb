//! stel-ingest: the daemon's data path.
//!
//! In flow order: [`reader`] (sockets, or capture files through [`input`]) → [`netlink`] frames
//! (nlmsghdr + genlmsghdr around raw IPFIX) → [`ipfix`] wire format and template compilation →
//! [`decode`] (per-core decoder: bytes → Arrow counter batches, sequence accounting, every
//! malformed input counted) → sinks. `sessions` owns what sessions exist and applies them to the
//! filter and the decoders together. The switch stand-ins (`stel-emu`: the HFT emulator, its
//! IPFIX encoder, the INT generator) are a crate of their own; [`sys`] holds the few unsafe
//! syscall wrappers.
//!
//! `decode` does no I/O so benchmarks and fuzzers drive it with plain byte slices. [`int`] is the
//! second source: INT telemetry reports (UDP payloads) → the `int_*` tables, equally I/O-free.

//! # The public surface
//!
//! What other crates and the crate's own binaries, benches, fuzzers and tests use, and nothing
//! more: [`topology`] builds and stops a whole daemon from a [`config::DaemonConfig`] (the
//! binary, `stel-bench e2e`, the daemon tests); [`daemon`], [`pipeline`], [`reader`] and
//! [`input`] are its data path, driven directly by benches and tests; [`decode`], [`ipfix`],
//! [`netlink`], [`genl`], [`filter`] and [`int`] are the I/O-free decoders the fuzzers and
//! `stel-query` use; [`sources`] (fixture sessions, the STATE_DB watcher) feed tests and benches;
//! [`status`] (the daemon's figures in the registry), [`report`] (the status file and line built
//! from them) and [`demo`] serve `stel-ingestd`; [`sys`] holds the few unsafe
//! syscall wrappers. Internal modules (the session registry, the daemon's sink wrappers, hex
//! helpers) are `pub(crate)`; the types of theirs that appear in a public signature are
//! re-exported where that signature lives ([`topology::Live`], [`daemon::SessionStats`], …),
//! and `unnameable_types` warns when one is missed.
#![warn(unnameable_types)]

pub mod config;
pub mod daemon;
pub mod decode;
pub mod demo;
pub mod filter;
pub mod genl;
mod hex;
pub mod input;
pub mod int;
pub mod ipfix;
pub mod netlink;
pub mod pipeline;
pub mod reader;
pub mod report;
pub(crate) mod sessions;
pub(crate) mod sinks;
pub mod sources;
pub mod status;
pub mod sys;
pub mod topology;
