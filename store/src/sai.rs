//! SAI object types and stat names: (object type, stat ID) ⇔ `SAI_PORT_STAT_IF_IN_OCTETS` ⇔
//! `IF_IN_OCTETS`.
//!
//! The tables are generated at build time from `store/sai/*.tsv` (one line per enumerator,
//! taken from the SAI master headers; range markers such as `START`/`*_RANGE_BASE` are omitted
//! because they alias real values). Lookups are binary searches over static slices: no
//! allocation, usable on any thread.

use std::fmt;

/// One enumerator of a `sai_<object>_stat_t` enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatName {
    /// Numeric value of the enumerator.
    pub id: u32,
    /// Name without the `SAI_<OBJECT>_STAT_` prefix, as HFT's `object_counters` uses it.
    pub short: &'static str,
    /// Full C enumerator name, as COUNTERS_DB hash fields use it.
    pub full: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/sai_tables.rs"));

/// The SAI object types whose stats stel can name (`sai_object_type_t` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum ObjectType {
    Port = 1,
    RouterInterface = 6,
    Queue = 21,
    BufferPool = 24,
    IngressPriorityGroup = 26,
    Switch = 33,
}

impl ObjectType {
    /// Every object type with a stat table, in `sai_object_type_t` order.
    pub const ALL: [ObjectType; 6] = [
        ObjectType::Port,
        ObjectType::RouterInterface,
        ObjectType::Queue,
        ObjectType::BufferPool,
        ObjectType::IngressPriorityGroup,
        ObjectType::Switch,
    ];

    /// From a `sai_object_type_t` value.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| *t as u32 == id)
    }

    /// The enumerator name without `SAI_OBJECT_TYPE_` (`PORT`, `INGRESS_PRIORITY_GROUP`), which is
    /// also what HFT uses as the group name.
    pub fn name(self) -> &'static str {
        match self {
            ObjectType::Port => "PORT",
            ObjectType::RouterInterface => "ROUTER_INTERFACE",
            ObjectType::Queue => "QUEUE",
            ObjectType::BufferPool => "BUFFER_POOL",
            ObjectType::IngressPriorityGroup => "INGRESS_PRIORITY_GROUP",
            ObjectType::Switch => "SWITCH",
        }
    }

    /// From a group/object type name (`PORT`, `queue`, `SAI_OBJECT_TYPE_QUEUE`).
    pub fn from_name(name: &str) -> Option<Self> {
        let name = name.trim();
        let name = name.strip_prefix("SAI_OBJECT_TYPE_").unwrap_or(name);
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    fn tables(self) -> (&'static [StatName], &'static [u16]) {
        match self {
            ObjectType::Port => (PORT_BY_ID, PORT_BY_NAME),
            ObjectType::RouterInterface => (ROUTER_INTERFACE_BY_ID, ROUTER_INTERFACE_BY_NAME),
            ObjectType::Queue => (QUEUE_BY_ID, QUEUE_BY_NAME),
            ObjectType::BufferPool => (BUFFER_POOL_BY_ID, BUFFER_POOL_BY_NAME),
            ObjectType::IngressPriorityGroup => {
                (INGRESS_PRIORITY_GROUP_BY_ID, INGRESS_PRIORITY_GROUP_BY_NAME)
            }
            ObjectType::Switch => (SWITCH_BY_ID, SWITCH_BY_NAME),
        }
    }

    /// All stats of this type, sorted by ID.
    pub fn stats(self) -> &'static [StatName] {
        self.tables().0
    }

    /// The stat with this ID, if the table knows it.
    pub fn stat(self, id: u32) -> Option<&'static StatName> {
        let by_id = self.stats();
        by_id
            .binary_search_by_key(&id, |s| s.id)
            .ok()
            .map(|i| &by_id[i])
    }

    /// The stat with this short (`IF_IN_OCTETS`) or full (`SAI_PORT_STAT_IF_IN_OCTETS`) name.
    pub fn stat_by_name(self, name: &str) -> Option<&'static StatName> {
        let (by_id, by_name) = self.tables();
        let short = name
            .strip_prefix("SAI_")
            .and_then(|n| n.strip_prefix(self.name()))
            .and_then(|n| n.strip_prefix("_STAT_"))
            .unwrap_or(name);
        by_name
            .binary_search_by(|i| by_id[*i as usize].short.cmp(short))
            .ok()
            .map(|i| &by_id[by_name[i] as usize])
    }
}

impl fmt::Display for ObjectType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a stat (by short name) is a **level** (a gauge: buffer occupancy, watermarks, queue
/// length, credits in use, congestion level) rather than a cumulative counter. SAI's stat enums
/// mix both; the names are the only marker: `*CURR_OCCUPANCY*`, `*WATERMARK*`, `IF_OUT_QLEN`,
/// `CBFC_SENDER_CREDITS_USED`, `*_LEVEL`. Everything else counts events or bytes since the
/// counter was cleared and only goes up (until it wraps or is cleared).
pub fn is_level(short: &str) -> bool {
    short.contains("CURR_OCCUPANCY")
        || short.contains("WATERMARK")
        || short.ends_with("_LEVEL")
        || short == "IF_OUT_QLEN"
        || short == "CBFC_SENDER_CREDITS_USED"
}

impl StatName {
    /// See [`is_level`].
    pub fn is_level(&self) -> bool {
        is_level(self.short)
    }
}

/// Resolves a full C name (`SAI_QUEUE_STAT_PACKETS`) to its object type and stat.
pub fn stat_by_full_name(full: &str) -> Option<(ObjectType, &'static StatName)> {
    ObjectType::ALL.into_iter().find_map(|t| {
        let prefix_ok = full
            .strip_prefix("SAI_")
            .and_then(|n| n.strip_prefix(t.name()))
            .is_some_and(|n| n.starts_with("_STAT_"));
        if prefix_ok {
            t.stat_by_name(full).map(|s| (t, s))
        } else {
            None
        }
    })
}

/// A (object type, stat) pair as it travels in an HFT template, with names for display even when
/// the tables do not know it (`SAI_OBJECT_TYPE_99` / `STAT_7`): names are never dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatKey {
    pub object_type: u32,
    pub stat_id: u32,
}

impl StatKey {
    /// The known stat, if any.
    pub fn known(self) -> Option<&'static StatName> {
        ObjectType::from_id(self.object_type).and_then(|t| t.stat(self.stat_id))
    }

    /// Short name, or `STAT_<id>` when unknown.
    pub fn short_name(self) -> String {
        match self.known() {
            Some(s) => s.short.to_string(),
            None => format!("STAT_{}", self.stat_id),
        }
    }

    /// Full C name, or `SAI_<TYPE>_STAT_<id>` / `SAI_OBJECT_TYPE_<n>_STAT_<id>` when unknown.
    pub fn full_name(self) -> String {
        match (self.known(), ObjectType::from_id(self.object_type)) {
            (Some(s), _) => s.full.to_string(),
            (None, Some(t)) => format!("SAI_{}_STAT_{}", t.name(), self.stat_id),
            (None, None) => format!("SAI_OBJECT_TYPE_{}_STAT_{}", self.object_type, self.stat_id),
        }
    }

    /// Whether the stat is a level (gauge), see [`is_level`]. Unknown stats count as counters.
    pub fn is_level(self) -> bool {
        self.known().is_some_and(StatName::is_level)
    }

    /// Object type name, or `OBJECT_TYPE_<n>` when unknown.
    pub fn object_type_name(self) -> String {
        match ObjectType::from_id(self.object_type) {
            Some(t) => t.name().to_string(),
            None => format!("OBJECT_TYPE_{}", self.object_type),
        }
    }
}

/// Natural order of names: runs of digits compare as numbers, so `Ethernet4` < `Ethernet12` <
/// `Ethernet100` and `Ethernet0|3` < `Ethernet0|10` (ties, like `Ethernet01` vs `Ethernet1`,
/// fall back to the plain byte order).
pub fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let (x, y) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < x.len() && j < y.len() {
        if x[i].is_ascii_digit() && y[j].is_ascii_digit() {
            let (si, sj) = (i, j);
            while i < x.len() && x[i].is_ascii_digit() {
                i += 1;
            }
            while j < y.len() && y[j].is_ascii_digit() {
                j += 1;
            }
            // Compare the numbers without parsing them (any length): fewer significant digits
            // is smaller, then digit by digit.
            let (p, q) = (trim_zeros(&x[si..i]), trim_zeros(&y[sj..j]));
            let o = p.len().cmp(&q.len()).then_with(|| p.cmp(q));
            if o != Ordering::Equal {
                return o;
            }
        } else {
            if x[i] != y[j] {
                return x[i].cmp(&y[j]);
            }
            i += 1;
            j += 1;
        }
    }
    (x.len() - i).cmp(&(y.len() - j)).then_with(|| a.cmp(b))
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let k = d.iter().position(|c| *c != b'0').unwrap_or(d.len());
    &d[k..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_directions_for_every_table() {
        for t in ObjectType::ALL {
            assert!(!t.stats().is_empty(), "{t} has no stats");
            for s in t.stats() {
                assert_eq!(t.stat(s.id), Some(s));
                assert_eq!(t.stat_by_name(s.short), Some(s), "{}", s.short);
                assert_eq!(t.stat_by_name(s.full), Some(s), "{}", s.full);
                assert_eq!(stat_by_full_name(s.full), Some((t, s)), "{}", s.full);
                assert!(s.full.starts_with(&format!("SAI_{}_STAT_", t.name())));
            }
        }
    }

    #[test]
    fn reference_values() {
        let p = ObjectType::Port;
        assert_eq!(p.stat(0).unwrap().full, "SAI_PORT_STAT_IF_IN_OCTETS");
        assert_eq!(p.stat(4).unwrap().short, "IF_IN_ERRORS");
        assert_eq!(p.stat(9).unwrap().short, "IF_OUT_OCTETS");
        // SAI places the 1519..16383 buckets at 0x3000.. (countersyncd has them at 0x200a).
        assert_eq!(
            p.stat(0x3000).unwrap().short,
            "ETHER_IN_PKTS_1519_TO_2500_OCTETS"
        );
        assert_eq!(
            p.stat(0x2008).unwrap().short,
            "IF_IN_HW_PROTECTION_SWITCHOVER_EVENTS"
        );
        let q = ObjectType::Queue;
        assert_eq!(q.stat_by_name("WRED_ECN_MARKED_PACKETS").unwrap().id, 0x22);
        assert_eq!(
            ObjectType::IngressPriorityGroup.stat(7).unwrap().full,
            "SAI_INGRESS_PRIORITY_GROUP_STAT_XOFF_ROOM_WATERMARK_BYTES"
        );
        assert_eq!(
            ObjectType::BufferPool.stat(2).unwrap().short,
            "DROPPED_PACKETS"
        );
        assert_eq!(
            ObjectType::RouterInterface.stat(3).unwrap().short,
            "OUT_PACKETS"
        );
        assert_eq!(
            ObjectType::Switch.stat(0x3003).unwrap().short,
            "GLOBAL_DROP"
        );
        assert_eq!(
            ObjectType::from_name("ingress_priority_group"),
            Some(ObjectType::IngressPriorityGroup)
        );
        assert_eq!(ObjectType::from_id(21), Some(ObjectType::Queue));
        assert_eq!(ObjectType::from_id(2), None);
        assert!(p.stat_by_name("START").is_none());
        assert!(p.stat_by_name("SAI_QUEUE_STAT_PACKETS").is_none());
    }

    #[test]
    fn levels_are_the_occupancy_watermark_and_queue_length_stats() {
        let level = |t: ObjectType, s: &str| t.stat_by_name(s).unwrap().is_level();
        assert!(level(ObjectType::Queue, "CURR_OCCUPANCY_BYTES"));
        assert!(level(ObjectType::Queue, "WATERMARK_CELLS"));
        assert!(level(ObjectType::Queue, "CURR_OCCUPANCY_LEVEL"));
        assert!(level(ObjectType::Port, "IN_CURR_OCCUPANCY_BYTES"));
        assert!(level(ObjectType::Port, "IF_OUT_QLEN"));
        assert!(level(ObjectType::BufferPool, "XOFF_ROOM_WATERMARK_BYTES"));
        assert!(level(
            ObjectType::IngressPriorityGroup,
            "SHARED_WATERMARK_BYTES"
        ));
        assert!(!level(ObjectType::Port, "IF_IN_OCTETS"));
        assert!(!level(ObjectType::Queue, "DROPPED_PACKETS"));
        assert!(!level(ObjectType::Port, "PFC_3_RX_PAUSE_DURATION_US"));
        assert!(!level(ObjectType::Queue, "CREDIT_WD_DELETED_PACKETS"));
        assert!(!StatKey {
            object_type: 99,
            stat_id: 1
        }
        .is_level());
        // The rule sees every table: a level in each object type that has one.
        let levels = |t: ObjectType| t.stats().iter().filter(|s| s.is_level()).count();
        assert_eq!(levels(ObjectType::RouterInterface), 0);
        assert!(levels(ObjectType::Queue) >= 10);
    }

    #[test]
    fn unknown_keys_keep_their_numbers() {
        let k = StatKey {
            object_type: 1,
            stat_id: 0x0FFF_FFFF,
        };
        assert_eq!(k.full_name(), "SAI_PORT_STAT_268435455");
        let k = StatKey {
            object_type: 99,
            stat_id: 7,
        };
        assert_eq!(k.full_name(), "SAI_OBJECT_TYPE_99_STAT_7");
        assert_eq!(k.short_name(), "STAT_7");
    }
}
