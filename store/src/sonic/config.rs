use serde::Deserialize;

use super::Error;

/// COUNTERS_DB + RATES writer settings. `Default` is for production on a SONiC switch.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CountersDbConfig {
    /// Redis to write: `unix:///var/run/redis/redis.sock` (SONiC's default instance) or
    /// `redis://127.0.0.1:6379`. A database index in the URL is ignored: the indices below are
    /// selected explicitly.
    pub url: String,
    /// COUNTERS_DB index (SONiC: 2).
    pub counters_db: i64,
    /// STATE_DB index (SONiC: 6), for `PORT_TABLE|<port>` speed.
    pub state_db: i64,
    /// APPL_DB index (SONiC: 0), for the `PORT_TABLE:<port>` speed fallback.
    pub appl_db: i64,
    /// Least time between two write rounds, µs. A round starts as soon as new values wait and
    /// this long has passed since the previous one; values arriving in between are coalesced
    /// (only the latest per field is written). The arrival → written lag is at most about this
    /// plus one pipeline round trip. Rounds are bounded by batch arrivals too (a decoder batch
    /// is ~5.5 ms of switch time at the design session), so a short interval costs few extra
    /// rounds: 5 → 2 ms took `stel-bench e2e --quick` lag p99 from 11.9 to 7.4 ms at 1× and
    /// 14.4 to 9.6–10.0 ms at 2× (medians of 3–4) for +5–40 % rounds and ~+5 % redis-server CPU.
    pub flush_interval_us: u64,
    /// Interval between rate samples, ms of switch time (flex counters' `PORT_RATES` poll: 1000).
    pub rate_interval_ms: u64,
    /// Write `RATES:<oid>` / `RATES:<oid>:PORT|RIF`. Turn off where SONiC's own port_rates.lua
    /// already computes rates for the same ports.
    pub write_rates: bool,
    /// How often the name maps, α and port speeds are re-read, ms. A re-created port (new OID)
    /// and an object whose OID appears late are picked up within this time.
    pub map_refresh_ms: u64,
    /// Batches the queue holds before `submit` sheds (drop newest).
    pub queue_batches: usize,
    /// Redis connect/read/write timeout, ms.
    pub io_timeout_ms: u64,
    /// First reconnect delay, ms; doubles per failure up to `reconnect_max_ms`.
    pub reconnect_min_ms: u64,
    pub reconnect_max_ms: u64,
}

impl Default for CountersDbConfig {
    fn default() -> Self {
        Self {
            url: "unix:///var/run/redis/redis.sock".to_string(),
            counters_db: 2,
            state_db: 6,
            appl_db: 0,
            flush_interval_us: 2_000,
            rate_interval_ms: 1_000,
            write_rates: true,
            map_refresh_ms: 1_000,
            queue_batches: 64,
            io_timeout_ms: 1_000,
            reconnect_min_ms: 50,
            reconnect_max_ms: 2_000,
        }
    }
}

impl CountersDbConfig {
    /// Fast refreshes and short backoff, for tests against a private server at `url`.
    pub fn for_test(url: &str) -> Self {
        Self {
            url: url.to_string(),
            map_refresh_ms: 50,
            rate_interval_ms: 100,
            reconnect_min_ms: 20,
            reconnect_max_ms: 200,
            io_timeout_ms: 500,
            ..Self::default()
        }
    }

    pub(crate) fn validate(&self) -> Result<redis::Client, Error> {
        let mut problems = Vec::new();
        if self.queue_batches == 0 {
            problems.push("queue_batches must be at least 1");
        }
        if self.map_refresh_ms == 0 {
            problems.push("map_refresh_ms must be at least 1");
        }
        if self.io_timeout_ms == 0 {
            problems.push("io_timeout_ms must be at least 1");
        }
        if self.reconnect_min_ms == 0 || self.reconnect_max_ms < self.reconnect_min_ms {
            problems.push("need 0 < reconnect_min_ms <= reconnect_max_ms");
        }
        if !problems.is_empty() {
            return Err(Error::Config(problems.join("; ")));
        }
        redis::Client::open(self.url.as_str()).map_err(|source| Error::Url {
            url: self.url.clone(),
            source,
        })
    }
}
