//! Port speeds from SONiC, for utilisation.
//!
//! The stream carries counters but no port speed, so a history read elsewhere (stel-query's
//! UTIL, bursts) would have to assume one. When the daemon has Redis, it reads each port's
//! speed once at start, the way portstat chooses it (`stel_store::rate::port_speed_mbps`):
//! STATE_DB `PORT_TABLE|<port>` `speed` when APPL_DB `PORT_TABLE:<port>` `oper_status` is `up`,
//! else APPL_DB's `speed`, else CONFIG_DB `PORT|<port>` `speed` — all in Mb/s. The map goes into
//! every Parquet file's footer ([`stel_store::parquet::keys::PORT_SPEED_MBPS`]).
//!
//! A port whose speed changes while the daemon runs (a breakout, `config interface speed`)
//! keeps the start-time speed in new files until the daemon restarts.

use std::{collections::BTreeMap, time::Duration};

/// SONiC's database indices.
const APPL_DB: i64 = 0;
const CONFIG_DB: i64 = 4;
const STATE_DB: i64 = 6;

/// Each port's speed in Mb/s, from the Redis at `url` (its database index is ignored). Ports
/// with no usable speed are left out; an empty map when SONiC has no port table.
///
/// # Errors
/// A bad URL, Redis not answering within `timeout`, a command error.
pub fn read(url: &str, timeout: Duration) -> Result<BTreeMap<String, u64>, redis::RedisError> {
    let base = redis::Client::open(url)?.get_connection_info().clone();
    let connect = |db: i64| -> Result<redis::Connection, redis::RedisError> {
        let mut info = base.clone();
        info.redis.db = db;
        redis::Client::open(info)?.get_connection_with_timeout(timeout)
    };
    // `<prefix><port>` → the hash's fields we need.
    let table = |c: &mut redis::Connection,
                 prefix: &str,
                 fields: &[&str]|
     -> Result<BTreeMap<String, Vec<Option<String>>>, redis::RedisError> {
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{prefix}*"))
                .arg("COUNT")
                .arg(1000)
                .query(c)?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        let mut out = BTreeMap::new();
        for k in keys {
            let v: Vec<Option<String>> = redis::cmd("HMGET").arg(&k).arg(fields).query(c)?;
            if let Some(port) = k.strip_prefix(prefix) {
                out.insert(port.to_string(), v);
            }
        }
        Ok(out)
    };
    let appl = table(
        &mut connect(APPL_DB)?,
        "PORT_TABLE:",
        &["speed", "oper_status"],
    )?;
    let state = table(&mut connect(STATE_DB)?, "PORT_TABLE|", &["speed"])?;
    let config = table(&mut connect(CONFIG_DB)?, "PORT|", &["speed"])?;
    let first = |m: &BTreeMap<String, Vec<Option<String>>>, port: &str, i: usize| {
        m.get(port).and_then(|v| v.get(i).cloned().flatten())
    };
    let mut ports: Vec<&String> = appl.keys().chain(config.keys()).collect();
    ports.sort();
    ports.dedup();
    let mut out = BTreeMap::new();
    for p in ports {
        let chosen = stel_store::rate::port_speed_mbps(
            first(&state, p, 0).as_deref(),
            first(&appl, p, 0).as_deref(),
            first(&appl, p, 1).as_deref(),
        )
        .or_else(|| {
            first(&config, p, 0)
                .and_then(|s| s.trim().parse::<f64>().ok())
                .filter(|v| *v > 0.0)
        });
        if let Some(mbps) = chosen {
            out.insert(p.clone(), mbps.round() as u64);
        }
    }
    Ok(out)
}
