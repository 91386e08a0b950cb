//! A SONiC-shaped Redis for an emulated switch (`stel-emu --redis <url>`, and tests): what
//! orchagent and `enable_counters.py` would have written for the emulator's session.
//!
//! | DB | Keys |
//! |---|---|
//! | CONFIG_DB (4) | `HIGH_FREQUENCY_TELEMETRY_PROFILE\|<profile>` (`stream_state`, `poll_interval` µs), `HIGH_FREQUENCY_TELEMETRY_GROUP\|<profile>\|<GROUP>` (`object_names`, `object_counters`) |
//! | STATE_DB (6) | `HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE\|<profile>\|<GROUP>` (`stream_status`, `object_names`, `object_ids`, `session_type`, `session_config` = raw IPFIX template message), `PORT_TABLE\|<port>` `speed` |
//! | APPL_DB (0) | `PORT_TABLE:<port>` (`speed`, `oper_status`, `admin_status`) |
//! | COUNTERS_DB (2) | `COUNTERS_<TYPE>_NAME_MAP` (queues/PGs as `Ethernet0:3`) with sairedis-style OIDs (object type in bits 55..48), `RATES:PORT` / `RATES:RIF` defaults (only if absent) |

use stel_store::sai::ObjectType;

use stel_emu::Emulator;

/// What to publish besides the session itself.
#[derive(Debug, Clone)]
pub struct FixtureOptions {
    /// Port speed, Mb/s (written to STATE_DB and APPL_DB `PORT_TABLE`).
    pub speed_mbps: u32,
    /// APPL_DB `oper_status`.
    pub oper_status: String,
    /// Write the name maps (false: test objects whose OID appears late).
    pub name_maps: bool,
}

impl Default for FixtureOptions {
    fn default() -> Self {
        Self {
            speed_mbps: 100_000,
            oper_status: "up".into(),
            name_maps: true,
        }
    }
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixtureReport {
    /// The STATE_DB session key.
    pub session_key: String,
    /// (object name as in the session, name-map key, OID) per object, then per port of a
    /// queue/PG session.
    pub oids: Vec<(String, String, String)>,
}

/// The sairedis-style OID for object `index` of a type: `oid:0x<type:8><0…><index+1>`.
pub fn fixture_oid(object_type: ObjectType, index: usize) -> String {
    format!(
        "oid:0x{:x}",
        ((object_type as u64 & 0xff) << 48) | (index as u64 + 1)
    )
}

fn db(client: &redis::Client, n: i64) -> redis::RedisResult<redis::Connection> {
    let mut c = client.get_connection()?;
    redis::cmd("SELECT").arg(n).query::<()>(&mut c)?;
    Ok(c)
}

/// Publishes the emulator's session and the tables around it to the Redis at `url`.
///
/// # Errors
/// Any Redis error (bad URL, connection refused, …).
pub fn publish(
    url: &str,
    emu: &Emulator,
    opts: &FixtureOptions,
) -> redis::RedisResult<FixtureReport> {
    let client = redis::Client::open(url)?;
    let spec = emu.session_spec();
    let group = emu.cfg.group;
    let names = spec.object_names.join(",");
    let ids = spec
        .object_ids
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let counters = emu
        .cfg
        .stats
        .iter()
        .map(|s| s.short)
        .collect::<Vec<_>>()
        .join(",");
    let profile = &spec.profile;
    let gname = group.name();

    let mut cfg = db(&client, 4)?;
    redis::pipe()
        .hset_multiple(
            format!("HIGH_FREQUENCY_TELEMETRY_PROFILE|{profile}"),
            &[
                ("stream_state", "enabled".to_string()),
                (
                    "poll_interval",
                    (emu.cfg.interval_ns / 1000).max(1).to_string(),
                ),
            ],
        )
        .hset_multiple(
            format!("HIGH_FREQUENCY_TELEMETRY_GROUP|{profile}|{gname}"),
            &[
                ("object_names", names.clone()),
                ("object_counters", counters),
            ],
        )
        .query::<()>(&mut cfg)?;

    // Ports: the objects themselves, or the ports of queues / PGs.
    let mut ports: Vec<String> = match group {
        ObjectType::Port => spec.object_names.clone(),
        ObjectType::Queue | ObjectType::IngressPriorityGroup => spec
            .object_names
            .iter()
            .map(|n| n.rsplit_once('|').map_or(n.as_str(), |p| p.0).to_string())
            .collect(),
        _ => Vec::new(),
    };
    ports.sort();
    ports.dedup();

    let mut oids = Vec::new();
    if opts.name_maps {
        let mut c = db(&client, 2)?;
        let mut p = redis::pipe();
        let map =
            stel_store::sonic::name_map_for(group as u32).unwrap_or("COUNTERS_SWITCH_NAME_MAP");
        for (i, n) in spec.object_names.iter().enumerate() {
            let key = stel_store::sonic::name_map_key(n);
            let oid = fixture_oid(group, i);
            p.hset(map, &key, &oid).ignore();
            oids.push((n.clone(), key, oid));
        }
        if group != ObjectType::Port {
            for (i, port) in ports.iter().enumerate() {
                let oid = fixture_oid(ObjectType::Port, i);
                p.hset("COUNTERS_PORT_NAME_MAP", port, &oid).ignore();
                oids.push((port.clone(), port.clone(), oid));
            }
        }
        for (k, field, v) in [
            ("RATES:PORT", "PORT_SMOOTH_INTERVAL", "10"),
            ("RATES:PORT", "PORT_ALPHA", "0.18"),
            ("RATES:RIF", "RIF_SMOOTH_INTERVAL", "10"),
            ("RATES:RIF", "RIF_ALPHA", "0.18"),
        ] {
            p.hset_nx(k, field, v).ignore();
        }
        p.query::<()>(&mut c)?;
    }

    let speed = opts.speed_mbps.to_string();
    let mut appl = db(&client, 0)?;
    let mut p = redis::pipe();
    for port in &ports {
        p.hset_multiple(
            format!("PORT_TABLE:{port}"),
            &[
                ("speed", speed.as_str()),
                ("oper_status", opts.oper_status.as_str()),
                ("admin_status", "up"),
            ],
        )
        .ignore();
    }
    p.query::<()>(&mut appl)?;

    let mut state = db(&client, 6)?;
    let session_key = format!("HIGH_FREQUENCY_TELEMETRY_SESSION_TABLE|{profile}|{gname}");
    let mut p = redis::pipe();
    for port in &ports {
        p.hset(format!("PORT_TABLE|{port}"), "speed", &speed)
            .ignore();
    }
    // The session last, as orchagent does once the templates exist: one HSET, all fields.
    p.cmd("HSET")
        .arg(&session_key)
        .arg("stream_status")
        .arg("enabled")
        .arg("object_names")
        .arg(&names)
        .arg("object_ids")
        .arg(&ids)
        .arg("session_type")
        .arg("ipfix")
        .arg("session_config")
        .arg(emu.session_config())
        .ignore();
    p.query::<()>(&mut state)?;
    Ok(FixtureReport { session_key, oids })
}
