//! What a session's tiers hold, decided once per session schema: which counters are levels,
//! which octet counters carry burst figures, the objects (rows) and the tier files' columns.

use std::sync::Arc;

use crate::{sai::StatKey, schema::SessionSchema};

/// The rx/tx octet stats burst figures are measured on, per object type: ports
/// (`port_rates.lua`'s inputs) and router interfaces (`rif_rates.lua`'s).
pub fn octet_stats(object_type: u32) -> Option<(&'static str, &'static str)> {
    match object_type {
        1 => Some(("IF_IN_OCTETS", "IF_OUT_OCTETS")),
        6 => Some(("IN_OCTETS", "OUT_OCTETS")),
        _ => None,
    }
}

/// One burst series: an object's rx or tx octet counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// Row (object index) it belongs to.
    pub object: usize,
    /// 0 = rx, 1 = tx.
    pub dir: usize,
    /// Counter column in the session's row.
    pub column: usize,
}

/// Direction prefixes of the burst columns.
pub const DIRS: [&str; 2] = ["rx", "tx"];

/// A session's rollup plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub schema: Arc<SessionSchema>,
    /// Object names, in the order their first counter appears (the rows of a tier file).
    pub objects: Vec<String>,
    /// Per counter column: its object index.
    pub object_of: Vec<usize>,
    /// Per counter column: a level (gauge) rather than a cumulative counter.
    pub level: Vec<bool>,
    /// Stats in the order they first appear, with whether they are levels: the tier file's
    /// column groups (`<STAT>.first`, …).
    pub stats: Vec<(String, bool)>,
    /// Per counter column: index into `stats`.
    pub stat_of: Vec<usize>,
    /// `[object][stat]` → counter column, if the object has that stat.
    pub cell: Vec<Vec<Option<usize>>>,
    /// Burst series (rx/tx octets of every object that has them).
    pub series: Vec<Series>,
    /// `[object][dir]` → series index.
    pub series_of: Vec<[Option<usize>; 2]>,
}

impl Plan {
    /// The plan of `schema`'s rows.
    pub fn new(schema: &Arc<SessionSchema>) -> Self {
        let mut objects: Vec<String> = Vec::new();
        let mut stats: Vec<(String, bool)> = Vec::new();
        let mut object_of = Vec::with_capacity(schema.width());
        let mut stat_of = Vec::with_capacity(schema.width());
        let mut level = Vec::with_capacity(schema.width());
        for c in &schema.columns {
            let o = match objects.iter().position(|x| *x == c.object) {
                Some(o) => o,
                None => {
                    objects.push(c.object.clone());
                    objects.len() - 1
                }
            };
            let short = c.key.short_name();
            let is_level = c.key.is_level();
            let s = match stats.iter().position(|x| x.0 == short) {
                Some(s) => s,
                None => {
                    stats.push((short, is_level));
                    stats.len() - 1
                }
            };
            object_of.push(o);
            stat_of.push(s);
            level.push(is_level);
        }
        let mut cell = vec![vec![None; stats.len()]; objects.len()];
        for (c, (&o, &s)) in object_of.iter().zip(&stat_of).enumerate() {
            // A template that lists one (object, stat) twice: the first column wins.
            cell[o][s].get_or_insert(c);
        }
        let mut series = Vec::new();
        let mut series_of = vec![[None; 2]; objects.len()];
        for (o, row) in cell.iter().enumerate() {
            let key: Option<StatKey> = row.iter().flatten().next().map(|&c| schema.columns[c].key);
            let Some((rx, tx)) = key.and_then(|k| octet_stats(k.object_type)) else {
                continue;
            };
            for (dir, name) in [rx, tx].into_iter().enumerate() {
                let col = stats.iter().position(|s| s.0 == name).and_then(|s| row[s]);
                if let Some(column) = col {
                    series_of[o][dir] = Some(series.len());
                    series.push(Series {
                        object: o,
                        dir,
                        column,
                    });
                }
            }
        }
        Self {
            schema: Arc::clone(schema),
            objects,
            object_of,
            level,
            stats,
            stat_of,
            cell,
            series,
            series_of,
        }
    }

    /// Counters per snapshot.
    pub fn width(&self) -> usize {
        self.level.len()
    }

    /// Whether any object has burst figures (the file gets the burst columns).
    pub fn has_bursts(&self) -> bool {
        !self.series.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::schema::CounterColumn;

    /// A PORT session of `ports` objects × the named stats (object-major, as HFT templates are).
    pub(crate) fn port_schema(ports: usize, stats: &[&str]) -> Arc<SessionSchema> {
        let t = crate::sai::ObjectType::Port;
        let mut columns = Vec::new();
        for p in 0..ports {
            for s in stats {
                columns.push(CounterColumn {
                    label: p as u16 + 1,
                    object: format!("Ethernet{}", 4 * p),
                    key: StatKey {
                        object_type: 1,
                        stat_id: t.stat_by_name(s).unwrap().id,
                    },
                });
            }
        }
        Arc::new(SessionSchema::one_template(
            "p".into(),
            "PORT".into(),
            columns,
        ))
    }

    #[test]
    fn roles_rows_and_series() {
        let s = port_schema(
            2,
            &[
                "IF_IN_OCTETS",
                "IN_CURR_OCCUPANCY_BYTES",
                "IF_OUT_OCTETS",
                "IF_IN_DISCARDS",
            ],
        );
        let p = Plan::new(&s);
        assert_eq!(p.objects, ["Ethernet0", "Ethernet4"]);
        assert_eq!(
            p.level,
            [false, true, false, false, false, true, false, false]
        );
        assert_eq!(p.stats.len(), 4);
        assert_eq!(p.cell[1][2], Some(6));
        assert_eq!(p.series.len(), 4);
        assert_eq!(
            p.series[3],
            Series {
                object: 1,
                dir: 1,
                column: 6
            }
        );
        assert_eq!(p.series_of[1], [Some(2), Some(3)]);
    }
}
