//! EVC attribution: (switch, VLAN, UNI port) → Ethernet Virtual Circuit id and name.
//!
//! Two sources, merged (the mapping file wins on conflicts):
//!
//! * a **Kytos mef_eline EVC listing** saved as JSON — what `GET /api/kytos/mef_eline/v2/evc/`
//!   returns: an object keyed by EVC id (a list of EVC objects is accepted too), each with
//!   `id`, `name`, `uni_a`/`uni_z` (`{"interface_id": "<dpid>:<port>", "tag": {"tag_type":
//!   1|"vlan", "value": <vlan>}}`), optionally `current_path` (links whose endpoints name
//!   switches, with the S-VLAN in `metadata.s_vlan.value`), `active`, `enabled`, `archived`;
//!   archived EVCs are skipped;
//! * a **mapping file** (TOML) for what Kytos does not know: which INT switch id is which
//!   datapath, and EVCs by hand:
//!
//! ```toml
//! [[switch]]
//! int_id = 4217755253                  # the INT Switch id / Node ID the switch reports
//! dpid = "00:00:00:00:00:00:00:01"      # its OpenFlow datapath id in Kytos
//!
//! [[evc]]
//! id = "a1b2c3"
//! name = "AmLight-SP-Miami"
//! [[evc.uni]]
//! dpid = "00:00:00:00:00:00:00:01"      # or: int_id = 4217755253
//! vlan = 42
//! port = 23                             # optional: only this UNI port
//! ```
//!
//! A report is matched on its reporting switch (the INT sink, normally the egress UNI's switch)
//! and on the first hop of its path (the ingress UNI's switch), each with the packet's outer
//! VLAN; when several EVCs share a (switch, VLAN), the UNI port (the sink hop's egress port or
//! the first hop's ingress port) decides. Without a `[[switch]]` entry an INT switch id is taken
//! to be the low 32 bits of the dpid.
//!
//! The map is immutable once built; a reload builds a new one ([`EvcSources::load`]) and the
//! daemon swaps it into each decoder ([`super::IntDecoder::set_evc_map`]).

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use super::FastMap;

use serde::Deserialize;

/// One EVC: its id and name (the columns `evc_id`, `evc_name`).
pub type Evc = stel_store::int::EvcName;

#[derive(Debug, Clone, Copy)]
struct Entry {
    evc: u32,
    port: Option<u32>,
}

/// The lookup table. Cheap to share (`Arc`), immutable.
#[derive(Debug, Default, Clone)]
pub struct EvcMap {
    evcs: Vec<Evc>,
    /// `evcs` as batches share them (refreshed after each `add_*`).
    names: Arc<[Evc]>,
    /// (dpid, vlan) → candidate EVCs.
    by_dpid_vlan: FastMap<(u64, u16), Vec<Entry>>,
    /// INT switch id → dpid.
    dpid_of: FastMap<u32, u64>,
}

/// Why a source could not be loaded (nothing is replaced then).
#[derive(Debug, thiserror::Error)]
pub enum EvcError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a Kytos mef_eline EVC listing: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: invalid EVC mapping: {source}")]
    Toml {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error(
        "{what}: bad datapath id {value:?} (expected 8 hex bytes like 00:00:00:00:00:00:00:01)"
    )]
    Dpid { what: String, value: String },
}

/// Parses `00:00:00:00:00:00:00:01` (or with `-`) into a u64.
pub fn parse_dpid(s: &str) -> Option<u64> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 8 {
        return None;
    }
    parts.iter().try_fold(0u64, |acc, p| {
        (p.len() == 2)
            .then(|| u8::from_str_radix(p, 16).ok())
            .flatten()
            .map(|b| acc << 8 | u64::from(b))
    })
}

/// `<dpid>:<port>` → (dpid, port).
fn parse_interface(s: &str) -> Option<(u64, u32)> {
    let (dpid, port) = s.rsplit_once(':')?;
    Some((parse_dpid(dpid)?, port.parse().ok()?))
}

#[derive(Debug, Deserialize)]
struct KTag {
    #[serde(default)]
    value: serde_json::Value,
}

#[derive(Debug, Deserialize)]
struct KUni {
    interface_id: String,
    #[serde(default)]
    tag: Option<KTag>,
}

#[derive(Debug, Deserialize)]
struct KEndpoint {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    interface_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct KLink {
    endpoint_a: KEndpoint,
    endpoint_b: KEndpoint,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct KEvc {
    id: serde_json::Value,
    #[serde(default)]
    name: String,
    uni_a: KUni,
    uni_z: KUni,
    #[serde(default)]
    current_path: Vec<KLink>,
    #[serde(default)]
    archived: bool,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum KListing {
    Map(HashMap<String, KEvc>),
    List(Vec<KEvc>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapFile {
    #[serde(default)]
    switch: Vec<MapSwitch>,
    #[serde(default)]
    evc: Vec<MapEvc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapSwitch {
    int_id: u32,
    dpid: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapEvc {
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    uni: Vec<MapUni>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapUni {
    #[serde(default)]
    dpid: Option<String>,
    #[serde(default)]
    int_id: Option<u32>,
    vlan: u16,
    #[serde(default)]
    port: Option<u32>,
}

/// A VLAN from a Kytos tag value: a number (EVPL); lists, ranges, "any", "untagged" match no
/// single VLAN and are skipped.
fn tag_vlan(t: &Option<KTag>) -> Option<u16> {
    let v = t.as_ref()?.value.as_u64()?;
    u16::try_from(v).ok().filter(|v| *v < 4096)
}

impl EvcMap {
    /// EVCs known.
    pub fn len(&self) -> usize {
        self.evcs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.evcs.is_empty()
    }

    /// The EVCs, indexed as [`EvcMap::lookup_index`] returns them; batches share this.
    pub fn names(&self) -> &Arc<[Evc]> {
        &self.names
    }

    fn refresh(&mut self) {
        self.names = self.evcs.clone().into();
    }

    fn add_evc(&mut self, id: String, name: String) -> u32 {
        if let Some(i) = self.evcs.iter().position(|e| e.id == id) {
            self.evcs[i].name = name;
            return i as u32;
        }
        self.evcs.push(Evc { id, name });
        (self.evcs.len() - 1) as u32
    }

    fn add_key(&mut self, dpid: u64, vlan: u16, evc: u32, port: Option<u32>) {
        let v = self.by_dpid_vlan.entry((dpid, vlan)).or_default();
        if !v.iter().any(|e| e.evc == evc && e.port == port) {
            v.push(Entry { evc, port });
        }
    }

    /// Adds a Kytos mef_eline listing (JSON text). Returns EVCs added.
    ///
    /// # Errors
    /// Not JSON of that shape.
    pub fn add_kytos_json(&mut self, json: &str) -> Result<usize, serde_json::Error> {
        let listing: KListing = serde_json::from_str(json)?;
        let evcs: Vec<(Option<String>, KEvc)> = match listing {
            KListing::Map(m) => m.into_iter().map(|(k, v)| (Some(k), v)).collect(),
            KListing::List(l) => l.into_iter().map(|v| (None, v)).collect(),
        };
        let mut n = 0;
        for (key, e) in evcs {
            if e.archived {
                continue;
            }
            let id = match &e.id {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => key.unwrap_or_default(),
                v => v.to_string(),
            };
            let idx = self.add_evc(id, e.name.clone());
            n += 1;
            for uni in [&e.uni_a, &e.uni_z] {
                if let (Some((dpid, port)), Some(vlan)) =
                    (parse_interface(&uni.interface_id), tag_vlan(&uni.tag))
                {
                    self.add_key(dpid, vlan, idx, Some(port));
                }
            }
            // Transit switches carry the EVC on its S-VLAN.
            for link in &e.current_path {
                let svlan = link
                    .metadata
                    .as_ref()
                    .and_then(|m| m.pointer("/s_vlan/value"))
                    .and_then(serde_json::Value::as_u64)
                    .and_then(|v| u16::try_from(v).ok());
                let Some(svlan) = svlan else { continue };
                for ep in [&link.endpoint_a, &link.endpoint_b] {
                    let iface = ep.id.as_deref().or(ep.interface_id.as_deref());
                    if let Some((dpid, _)) = iface.and_then(parse_interface) {
                        self.add_key(dpid, svlan, idx, None);
                    }
                }
            }
        }
        self.refresh();
        Ok(n)
    }

    /// Adds a mapping file (TOML text, see the module docs). Returns EVCs added.
    ///
    /// # Errors
    /// Bad TOML or a bad datapath id.
    pub fn add_mapping_toml(&mut self, text: &str) -> Result<usize, EvcError> {
        let f: MapFile = toml::from_str(text).map_err(|source| EvcError::Toml {
            path: PathBuf::from("<mapping>"),
            source,
        })?;
        for s in &f.switch {
            let dpid = parse_dpid(&s.dpid).ok_or_else(|| EvcError::Dpid {
                what: format!("switch {}", s.int_id),
                value: s.dpid.clone(),
            })?;
            self.dpid_of.insert(s.int_id, dpid);
        }
        let n = f.evc.len();
        for e in f.evc {
            let idx = self.add_evc(e.id.clone(), e.name.clone());
            for u in &e.uni {
                let dpid = match (&u.dpid, u.int_id) {
                    (Some(d), _) => parse_dpid(d).ok_or_else(|| EvcError::Dpid {
                        what: format!("evc {}", e.id),
                        value: d.clone(),
                    })?,
                    (None, Some(id)) => self.dpid(id),
                    (None, None) => {
                        return Err(EvcError::Dpid {
                            what: format!("evc {}", e.id),
                            value: String::new(),
                        })
                    }
                };
                self.add_key(dpid, u.vlan, idx, u.port);
            }
        }
        self.refresh();
        Ok(n)
    }

    fn dpid(&self, int_id: u32) -> u64 {
        self.dpid_of
            .get(&int_id)
            .copied()
            .unwrap_or(u64::from(int_id))
    }

    /// The EVC of a report: `switches` are (INT switch id, UNI port) pairs to try in order (the
    /// reporting/sink switch with its egress port, then the path's first switch with its ingress
    /// port).
    pub fn lookup(&self, vlan: u16, switches: &[(u32, Option<u32>)]) -> Option<&Evc> {
        self.lookup_index(vlan, switches).and_then(|i| self.get(i))
    }

    /// The EVC at an index [`EvcMap::lookup_index`] returned.
    pub fn get(&self, index: u32) -> Option<&Evc> {
        self.evcs.get(index as usize)
    }

    /// [`EvcMap::lookup`], as an index (decoders cache it per flow).
    pub fn lookup_index(&self, vlan: u16, switches: &[(u32, Option<u32>)]) -> Option<u32> {
        if self.by_dpid_vlan.is_empty() {
            return None;
        }
        for &(sw, port) in switches {
            let Some(c) = self.by_dpid_vlan.get(&(self.dpid(sw), vlan)) else {
                continue;
            };
            let pick = match c.as_slice() {
                [one] if one.port.is_none() || port.is_none() || one.port == port => Some(one),
                many => many
                    .iter()
                    .find(|e| port.is_some() && e.port == port)
                    .or_else(|| many.iter().find(|e| e.port.is_none())),
            };
            if let Some(e) = pick {
                return Some(e.evc);
            }
        }
        None
    }
}

/// Where the EVC map comes from; [`EvcSources::load`] is the reload function (SIGHUP in the
/// daemon).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvcSources {
    /// Mapping file (TOML).
    pub mapping: Option<PathBuf>,
    /// Kytos mef_eline listing (JSON, as `GET /api/kytos/mef_eline/v2/evc/` returns it).
    pub kytos_evcs: Option<PathBuf>,
}

impl EvcSources {
    /// Builds a fresh map from both files (Kytos first, then the mapping file).
    ///
    /// # Errors
    /// The first file that cannot be read or parsed; the caller keeps its old map.
    pub fn load(&self) -> Result<Arc<EvcMap>, EvcError> {
        let mut m = EvcMap::default();
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).map_err(|source| EvcError::Read {
                path: p.clone(),
                source,
            })
        };
        if let Some(p) = &self.kytos_evcs {
            m.add_kytos_json(&read(p)?)
                .map_err(|source| EvcError::Json {
                    path: p.clone(),
                    source,
                })?;
        }
        if let Some(p) = &self.mapping {
            m.add_mapping_toml(&read(p)?).map_err(|e| match e {
                EvcError::Toml { source, .. } => EvcError::Toml {
                    path: p.clone(),
                    source,
                },
                e => e,
            })?;
        }
        Ok(Arc::new(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shaped like mef_eline's `GET /v2/evc/` answer (object keyed by id; extra fields ignored).
    pub(crate) const KYTOS: &str = r#"{
      "3766c105686749": {
        "id": "3766c105686749", "name": "Vlan_42_Miami_SaoPaulo", "active": true, "enabled": true,
        "archived": false, "bandwidth": 0, "dynamic_backup_path": true, "queue_id": -1,
        "uni_a": {"interface_id": "00:00:00:00:fb:65:d6:75:23", "tag": {"tag_type": "vlan", "value": 42}},
        "uni_z": {"interface_id": "00:00:00:00:00:00:00:03:11", "tag": {"tag_type": 1, "value": 42}},
        "current_path": [
          {"id": "l1", "endpoint_a": {"id": "00:00:00:00:fb:65:d6:75:1", "switch": "00:00:00:00:fb:65:d6:75", "port_number": 1},
           "endpoint_b": {"id": "00:00:00:00:00:00:00:02:1", "switch": "00:00:00:00:00:00:00:02", "port_number": 1},
           "metadata": {"s_vlan": {"tag_type": "vlan", "value": 1001}}}
        ],
        "metadata": {"telemetry": {"enabled": true}}
      },
      "aa11": {
        "id": "aa11", "name": "old", "archived": true,
        "uni_a": {"interface_id": "00:00:00:00:00:00:00:01:1", "tag": {"tag_type": 1, "value": 7}},
        "uni_z": {"interface_id": "00:00:00:00:00:00:00:02:1", "tag": {"tag_type": 1, "value": 7}}
      },
      "bb22": {
        "id": "bb22", "name": "Vlan_42_port_5",
        "uni_a": {"interface_id": "00:00:00:00:00:00:00:03:5", "tag": {"tag_type": 1, "value": 42}},
        "uni_z": {"interface_id": "00:00:00:00:00:00:00:04:5", "tag": {"tag_type": 1, "value": 42}}
      }
    }"#;

    #[test]
    fn kytos_listing_attributes_by_switch_vlan_and_port() {
        let mut m = EvcMap::default();
        assert_eq!(m.add_kytos_json(KYTOS).unwrap(), 2);
        // Sink switch 3 (dpid low bits) VLAN 42: two EVCs, the egress port decides.
        assert_eq!(
            m.lookup(42, &[(3, Some(11))]).unwrap().name,
            "Vlan_42_Miami_SaoPaulo"
        );
        assert_eq!(m.lookup(42, &[(3, Some(5))]).unwrap().id, "bb22");
        // The source switch (0xFB65D675) with its ingress port.
        assert_eq!(
            m.lookup(42, &[(9, None), (0xFB65_D675, Some(23))])
                .unwrap()
                .id,
            "3766c105686749"
        );
        // Transit: S-VLAN on the path's switches.
        assert_eq!(m.lookup(1001, &[(2, None)]).unwrap().id, "3766c105686749");
        // Archived EVCs and unknown VLANs match nothing.
        assert!(m.lookup(7, &[(1, Some(1))]).is_none());
        assert!(m.lookup(43, &[(3, Some(11))]).is_none());
    }

    #[test]
    fn mapping_file_names_switches_and_evcs() {
        let mut m = EvcMap::default();
        m.add_kytos_json(KYTOS).unwrap();
        m.add_mapping_toml(
            r#"
            [[switch]]
            int_id = 77
            dpid = "00:00:00:00:00:00:00:03"
            [[evc]]
            id = "manual-1"
            name = "lab"
            [[evc.uni]]
            int_id = 500
            vlan = 100
            "#,
        )
        .unwrap();
        assert_eq!(
            m.lookup(42, &[(77, Some(11))]).unwrap().name,
            "Vlan_42_Miami_SaoPaulo"
        );
        assert_eq!(m.lookup(100, &[(500, Some(1))]).unwrap().id, "manual-1");
        assert!(m
            .add_mapping_toml("[[switch]]\nint_id = 1\ndpid = \"zz\"")
            .is_err());
        assert!(m.add_mapping_toml("bogus = 1").is_err());
    }

    #[test]
    fn list_shape_and_dpids() {
        let mut m = EvcMap::default();
        let list = r#"[{"id": "x", "name": "n",
            "uni_a": {"interface_id": "00:00:00:00:00:00:00:05:2", "tag": {"tag_type": 1, "value": 9}},
            "uni_z": {"interface_id": "00:00:00:00:00:00:00:06:2"}}]"#;
        assert_eq!(m.add_kytos_json(list).unwrap(), 1);
        assert_eq!(m.lookup(9, &[(5, None)]).unwrap().id, "x");
        assert_eq!(parse_dpid("00:00:00:00:fb:65:d6:75"), Some(0xFB65_D675));
        assert_eq!(parse_dpid("00-00-00-00-00-00-00-01"), Some(1));
        assert_eq!(parse_dpid("1:2"), None);
        assert!(m.add_kytos_json("[1, 2]").is_err());
    }

    #[test]
    fn sources_reload_from_files() {
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("evcs.json");
        std::fs::write(&k, KYTOS).unwrap();
        let src = EvcSources {
            mapping: None,
            kytos_evcs: Some(k.clone()),
        };
        assert_eq!(src.load().unwrap().len(), 2);
        std::fs::write(&k, "{not json").unwrap();
        let e = src.load().unwrap_err().to_string();
        assert!(e.contains("evcs.json"), "{e}");
    }
}
