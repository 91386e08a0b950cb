//! What one session's counter batches look like, in memory and as Arrow.
//!
//! # Layout decision (in memory)
//!
//! A session (one HFT profile/group) produces snapshots: a timestamp plus one u64 per
//! (object, stat) the template subscribes. In memory a batch is Arrow's
//! `{ ts: Timestamp(ns, UTC), values: FixedSizeList<UInt64>[width] }`, i.e. **row-major**: one
//! snapshot's counters are contiguous. That is what the wire carries, so decoding a record is a
//! single contiguous big-endian → native copy (the fastest loop there is, SIMD-friendly), and the
//! consumers that run at snapshot rate — COUNTERS_DB's latest value per field, rate math — read
//! rows. The wide, column-per-(object, stat) layout that DuckDB/Spark users query and that
//! compresses best (each counter column is a slowly-rising series: delta encoding shrinks it to a
//! few bits per value) is produced from this by [`crate::batch::CounterBatch::to_wide`], a
//! cache-tiled transpose that the Parquet sink runs off the decode threads.
//!
//! Column names in the wide form are `<object>.<STAT>` (`Ethernet0.IF_IN_OCTETS`,
//! `Ethernet0|3.PACKETS`), and every field carries metadata (`stel.object`, `stel.label`,
//! `stel.object_type`, `stel.stat_id`, `stel.sai_name`) so nothing has to be parsed out of a name.

use std::{collections::HashMap, sync::Arc};

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::sai::StatKey;

/// Name of the timestamp column (ns since the Unix epoch, UTC).
pub const TS_COLUMN: &str = "ts";
/// Name of the row-major counters column of the in-memory layout.
pub const VALUES_COLUMN: &str = "values";

/// One counter column: which object (by template label and resolved name) and which stat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterColumn {
    /// Object label from the template's element ID (`0x8000 | label`).
    pub label: u16,
    /// Object name (`Ethernet0`, `Ethernet0|3`); `unknown_<label>` when no session names it.
    pub object: String,
    pub key: StatKey,
}

impl CounterColumn {
    /// `<object>.<STAT>` — the wide-layout column name.
    pub fn wide_name(&self) -> String {
        format!("{}.{}", self.object, self.key.short_name())
    }
}

/// Everything a reader of one session's batches needs: identity, template parts, columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSchema {
    /// HFT profile name (`anonymous` for data whose template came only in-band).
    pub profile: String,
    /// HFT group name (the object type name: `PORT`, `QUEUE`, …).
    pub group: String,
    /// IPFIX observation domain.
    pub domain: u32,
    /// The template IDs whose records make up one snapshot, in column order. More than one when
    /// a group is too large for one message (> ~8K stats) and the switch splits it.
    pub template_ids: Vec<u16>,
    /// First column of each template part; `part_offsets[i]..part_offsets[i+1]`.
    pub part_offsets: Vec<usize>,
    pub columns: Vec<CounterColumn>,
    /// Increments every time the session's templates change: batches of different generations
    /// never share a file.
    pub generation: u64,
}

impl SessionSchema {
    /// A session of one template part (ID 256, observation domain 0, generation 1): what
    /// synthetic data, tests and benchmarks build.
    pub fn one_template(profile: String, group: String, columns: Vec<CounterColumn>) -> Self {
        Self {
            profile,
            group,
            domain: 0,
            template_ids: vec![256],
            part_offsets: vec![0],
            columns,
            generation: 1,
        }
    }

    /// Number of counters per snapshot.
    pub fn width(&self) -> usize {
        self.columns.len()
    }

    /// Index of the column of `object`'s stat `stat` (short name, `IF_IN_OCTETS`).
    pub fn column_index(&self, object: &str, stat: &str) -> Option<usize> {
        self.columns
            .iter()
            .position(|c| c.object == object && c.key.short_name() == stat)
    }

    /// Number of template parts per snapshot.
    pub fn parts(&self) -> usize {
        self.template_ids.len()
    }

    /// Columns of template part `part`.
    pub fn part_range(&self, part: usize) -> std::ops::Range<usize> {
        let end = self
            .part_offsets
            .get(part + 1)
            .copied()
            .unwrap_or(self.columns.len());
        self.part_offsets[part]..end
    }

    fn metadata(&self) -> HashMap<String, String> {
        HashMap::from([
            ("stel.profile".to_string(), self.profile.clone()),
            ("stel.group".to_string(), self.group.clone()),
            ("stel.domain".to_string(), self.domain.to_string()),
            (
                "stel.template_ids".to_string(),
                self.template_ids
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("stel.generation".to_string(), self.generation.to_string()),
            (
                "stel.version".to_string(),
                env!("CARGO_PKG_VERSION").to_string(),
            ),
        ])
    }

    fn ts_field() -> Field {
        Field::new(
            TS_COLUMN,
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        )
    }

    /// The in-memory (row-major) Arrow schema: `ts`, `values: FixedSizeList<UInt64>[width]`.
    pub fn arrow_schema(&self) -> SchemaRef {
        let item = Arc::new(Field::new("item", DataType::UInt64, true));
        let values = Field::new(
            VALUES_COLUMN,
            DataType::FixedSizeList(item, self.width() as i32),
            false,
        );
        Arc::new(Schema::new_with_metadata(
            vec![Self::ts_field(), values],
            self.metadata(),
        ))
    }

    /// The session schema a raw history file was written with, from its wide Arrow fields (the
    /// `stel.*` field metadata) and its footer keys ([`crate::parquet::keys`]). Where each
    /// template part starts is not in the file: every part starts at column 0 (the file's nulls
    /// say which values are missing).
    ///
    /// # Errors
    /// A key or field metadata the daemon always writes is missing or malformed: not a stel
    /// raw file.
    pub fn from_stel_file(
        fields: &arrow_schema::Fields,
        kv: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, String> {
        use crate::sai::{ObjectType, StatKey};
        let key = |k: &str| {
            kv.get(k)
                .cloned()
                .ok_or(format!("no {k} footer key: not a stel raw file"))
        };
        let template_ids: Vec<u16> = key(keys::TEMPLATE_IDS)?
            .split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.parse::<u16>().map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let mut columns = Vec::new();
        for f in fields.iter().skip(1) {
            let md = f.metadata();
            let get = |k: &str| md.get(k).ok_or(format!("column {}: no {k}", f.name()));
            let ot = get("stel.object_type")?;
            let object_type = match ObjectType::from_name(ot) {
                Some(t) => t as u32,
                None => ot
                    .strip_prefix("OBJECT_TYPE_")
                    .and_then(|n| n.parse().ok())
                    .ok_or(format!("column {}: object type {ot}", f.name()))?,
            };
            columns.push(CounterColumn {
                label: get("stel.label")?.parse().map_err(|e| format!("{e}"))?,
                object: get("stel.object")?.clone(),
                key: StatKey {
                    object_type,
                    stat_id: get("stel.stat_id")?.parse().map_err(|e| format!("{e}"))?,
                },
            });
        }
        Ok(SessionSchema {
            profile: key(keys::PROFILE)?,
            group: key(keys::GROUP)?,
            domain: key(keys::DOMAIN)?.parse().map_err(|e| format!("{e}"))?,
            part_offsets: vec![0; template_ids.len().max(1)],
            template_ids,
            columns,
            generation: key(keys::GENERATION)?.parse().map_err(|e| format!("{e}"))?,
        })
    }

    /// The wide Arrow schema: `ts` then one nullable UInt64 column per counter.
    pub fn wide_arrow_schema(&self) -> SchemaRef {
        let mut fields = Vec::with_capacity(self.width() + 1);
        fields.push(Self::ts_field());
        for c in &self.columns {
            let md = HashMap::from([
                ("stel.object".to_string(), c.object.clone()),
                ("stel.label".to_string(), c.label.to_string()),
                ("stel.object_type".to_string(), c.key.object_type_name()),
                ("stel.stat_id".to_string(), c.key.stat_id.to_string()),
                ("stel.sai_name".to_string(), c.key.full_name()),
            ]);
            fields.push(Field::new(c.wide_name(), DataType::UInt64, true).with_metadata(md));
        }
        Arc::new(Schema::new_with_metadata(fields, self.metadata()))
    }
}

/// Key-value metadata keys written into every file's footer (besides Arrow's `ARROW:schema`,
/// which carries the per-column `stel.*` field metadata).
pub mod keys {
    /// HFT profile (unescaped).
    pub const PROFILE: &str = "stel.profile";
    /// HFT group (unescaped).
    pub const GROUP: &str = "stel.group";
    /// IPFIX observation domain.
    pub const DOMAIN: &str = "stel.domain";
    /// Template IDs of the snapshot's parts, comma-separated, in column order.
    pub const TEMPLATE_IDS: &str = "stel.template_ids";
    /// Session schema generation (changes whenever the templates change).
    pub const GENERATION: &str = "stel.generation";
    /// stel version that wrote the file.
    pub const VERSION: &str = "stel.version";
    /// Switch identity (config `switch_name` or the host name).
    pub const SWITCH: &str = "stel.switch";
    /// JSON object `{"<label>": "<object name>", …}`.
    pub const OBJECTS: &str = "stel.objects";
    /// JSON object `{"<SHORT>": "<SAI_…_STAT_…>", …}`: column suffix → SAI stat name.
    pub const SAI_NAMES: &str = "stel.sai_names";
    /// First and last timestamp in the file (ns since the epoch), rows and counter values.
    pub const FIRST_NS: &str = "stel.first_ns";
    pub const LAST_NS: &str = "stel.last_ns";
    pub const ROWS: &str = "stel.rows";
    pub const SAMPLES: &str = "stel.samples";
    /// Values that are null because a split snapshot's part never arrived.
    pub const MISSING_SAMPLES: &str = "stel.missing_samples";
    /// JSON object `{"<port>": <Mb/s>, …}`: each port's speed from SONiC's PORT tables when the
    /// daemon read them (absent otherwise); stel-query's utilisation uses it.
    pub const PORT_SPEED_MBPS: &str = "stel.port_speed_mbps";
}
