//! Control-plane sources: where sessions come from.
//!
//! [`state_db`] watches SONiC's STATE_DB for HFT sessions (templates + object labels) and turns
//! them into [`state_db::SessionEvent`]s the daemon routes to its decoders and the eBPF filter.

pub mod fixture;
pub mod port_speed;
pub mod state_db;
