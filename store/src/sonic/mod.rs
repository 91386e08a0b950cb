//! SONiC's Redis, written the way SONiC's own tools read it: `COUNTERS:<oid>` in COUNTERS_DB and
//! `RATES:<oid>` (port_rates.lua semantics, see [`crate::rate`]).
//!
//! ```text
//!  decode threads ──submit(Arc<CounterBatch>)──▶ bounded queue (try_send: never blocks; full → Shed)
//!                                                   │
//!                            writer thread (own, blocking redis client, no runtime)
//!    latest value per (object, stat) ◀──────────────┘   rate samples every `rate_interval_ms`
//!             │ every ≥ flush_interval_us, changed fields only, one pipeline
//!             ▼
//!  COUNTERS_DB (2): HSET COUNTERS:<oid> SAI_PORT_STAT_IF_IN_OCTETS 123 …
//!                   HSET RATES:<oid> RX_BPS … ; HSET RATES:<oid>:PORT INIT_DONE DONE
//!  name → OID: COUNTERS_{PORT,QUEUE,PG,BUFFER_POOL,RIF,SWITCH}_NAME_MAP (re-read every
//!  `map_refresh_ms`); α: RATES:PORT PORT_ALPHA / RATES:RIF RIF_ALPHA; speed: STATE_DB
//!  PORT_TABLE|<port>, APPL_DB PORT_TABLE:<port> (portstat's rule)
//! ```
//!
//! Why a plain thread and the blocking client rather than tokio: the writer is one sequential
//! loop (coalesce, then one pipeline round trip), so a runtime would add a dependency and a
//! scheduler for nothing; it is a separate thread, so decode never waits on it.
//!
//! Redis down: values keep coalescing in memory (nothing queues up beyond the latest row per
//! session), the connection is retried with exponential backoff, and after a reconnect every
//! latest value and every rate is written again, so COUNTERS_DB converges.
//!
//! `stel_testkit::redis` starts a private `redis-server` for tests (also used by `stel-ingest`'s tests).

mod config;
mod sink;
#[cfg(test)]
mod tests;

pub use config::CountersDbConfig;
pub use sink::{CountersDbHandle, CountersDbSink, Shed};

/// COUNTERS_DB writer errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid redis url `{}`: {source}", crate::redact::redact(url))]
    Url {
        url: String,
        source: redis::RedisError,
    },
    #[error("invalid counters-db config: {0}")]
    Config(String),
    #[error("cannot start the counters-db writer thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// The COUNTERS_DB name map that resolves objects of a SAI object type (PGs: `COUNTERS_PG_NAME_MAP`,
/// the map orchagent writes, not the `…INGRESS_PRIORITY_GROUP…` one countersyncd looks in).
pub fn name_map_for(object_type: u32) -> Option<&'static str> {
    match object_type {
        1 => Some("COUNTERS_PORT_NAME_MAP"),
        6 => Some("COUNTERS_RIF_NAME_MAP"),
        21 => Some("COUNTERS_QUEUE_NAME_MAP"),
        24 => Some("COUNTERS_BUFFER_POOL_NAME_MAP"),
        26 => Some("COUNTERS_PG_NAME_MAP"),
        33 => Some("COUNTERS_SWITCH_NAME_MAP"),
        _ => None,
    }
}

/// Every name map the writer reads.
pub const NAME_MAPS: [&str; 6] = [
    "COUNTERS_PORT_NAME_MAP",
    "COUNTERS_RIF_NAME_MAP",
    "COUNTERS_QUEUE_NAME_MAP",
    "COUNTERS_BUFFER_POOL_NAME_MAP",
    "COUNTERS_PG_NAME_MAP",
    "COUNTERS_SWITCH_NAME_MAP",
];

/// The name-map key of an HFT object name: the last `|` becomes `:` (`Ethernet0|3` →
/// `Ethernet0:3`), as countersyncd does; other names are unchanged.
pub fn name_map_key(object: &str) -> String {
    match object.rfind('|') {
        Some(i) => format!("{}:{}", &object[..i], &object[i + 1..]),
        None => object.to_string(),
    }
}
