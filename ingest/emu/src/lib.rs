//! stel-emu, the switch stand-ins tests, benches, the `stel-emu` tool and the daemon's `--demo`
//! use. At the crate root, the HFT switch emulator: a load model driving consistent counters, encoded as HFT
//! IPFIX (template, then data messages of several snapshots), with ground truth of what was sent.
//!
//! The model is per object: an offered load (steady, ramp, microbursts) in bytes per interval at a
//! fixed packet size feeds a queue drained at line rate. Octet and packet counters only rise
//! (octets = packets × size), the queue's occupancy and watermark are gauges, drops happen only
//! when the queue overflows. Timestamps are switch time: `start_ns + i × interval_ns`, so tests
//! know every value exactly.

use stel_store::sai::{ObjectType, StatName};

use stel_store::hft::{SeqMode, SessionSpec};

pub mod encode;
pub mod int;

pub use encode::{Encoder, HftField, HftTemplate};

/// Largest IPFIX payload of one netlink message (`stel_ebpf_common::MAX_IPFIX_PAYLOAD`).
pub const MAX_IPFIX_PAYLOAD: usize = stel_ebpf_common::MAX_IPFIX_PAYLOAD as usize;

/// Load pattern.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// Each object at a fixed utilisation between 20 % and 80 %.
    Steady,
    /// Utilisation rises 0 → 100 % over `ramp_ns`, then starts again.
    Ramp,
    /// 30 % base load with bursts (`burst_ns` long every `burst_period_ns`): the port receives at
    /// line rate while its egress queue is offered 130 % (traffic fanned in from other ports), so
    /// the queue fills, occupancy peaks, TX runs at line rate and overflows count as egress
    /// discards.
    Microburst,
}

/// Longest stretch of switch time one message holds by default (10 ms: at the design rate a
/// message fills up long before; at slow rates each message carries what 10 ms produced).
pub const MAX_MESSAGE_SPAN_NS: u64 = 10_000_000;

/// What to emulate.
#[derive(Debug, Clone)]
pub struct EmuConfig {
    pub group: ObjectType,
    /// Ports (for QUEUE / INGRESS_PRIORITY_GROUP: ports × `per_port` objects; BUFFER_POOL: pools).
    pub ports: usize,
    /// Queues or priority groups per port.
    pub per_port: usize,
    /// Stat short names, in template order.
    pub stats: Vec<&'static StatName>,
    pub interval_ns: u64,
    /// Snapshots per message; 0 = as many as fit in 64 KiB and in [`MAX_MESSAGE_SPAN_NS`].
    pub snapshots_per_message: usize,
    pub pattern: Pattern,
    pub speed_gbps: f64,
    pub packet_size: u32,
    pub domain: u32,
    pub template_id: u16,
    pub seq_mode: SeqMode,
    pub start_ns: u64,
    /// Zero every counter once at this snapshot (a counter reset), if set.
    pub reset_at_snapshot: Option<u64>,
    pub ramp_ns: u64,
    pub burst_ns: u64,
    pub burst_period_ns: u64,
    /// Queue capacity in bytes before drops.
    pub queue_bytes: u64,
    /// HFT profile name written into the session spec.
    pub profile: String,
}

impl EmuConfig {
    /// The design rate: 64 ports × 30 stats every 10 µs.
    pub fn design() -> Self {
        Self {
            group: ObjectType::Port,
            ports: 64,
            per_port: 1,
            stats: default_stats(ObjectType::Port, 30),
            interval_ns: 10_000,
            snapshots_per_message: 0,
            pattern: Pattern::Steady,
            speed_gbps: 100.0,
            packet_size: 800,
            domain: 0,
            template_id: 256,
            seq_mode: SeqMode::PerMessage,
            start_ns: 1_700_000_000_000_000_000,
            reset_at_snapshot: None,
            ramp_ns: 10_000_000_000,
            burst_ns: 50_000,
            burst_period_ns: 1_000_000,
            queue_bytes: 2_000_000,
            profile: "stel_demo".to_string(),
        }
    }

    /// Counters per second this config produces.
    pub fn counters_per_s(&self) -> f64 {
        (self.objects() * self.stats.len()) as f64 * 1e9 / self.interval_ns as f64
    }

    /// Number of objects.
    pub fn objects(&self) -> usize {
        match self.group {
            ObjectType::Queue | ObjectType::IngressPriorityGroup => self.ports * self.per_port,
            _ => self.ports,
        }
    }
}

/// The first `n` stats for `group`: the HFT YANG model's allowed counters first, then the rest
/// of the SAI enum in ID order.
pub fn default_stats(group: ObjectType, n: usize) -> Vec<&'static StatName> {
    const PORT: &[&str] = &[
        "IF_IN_OCTETS",
        "IF_IN_UCAST_PKTS",
        "IF_IN_DISCARDS",
        "IF_IN_ERRORS",
        "IN_CURR_OCCUPANCY_BYTES",
        "IF_OUT_OCTETS",
        "IF_OUT_DISCARDS",
        "IF_OUT_ERRORS",
        "IF_OUT_UCAST_PKTS",
        "OUT_CURR_OCCUPANCY_BYTES",
        "TRIM_PACKETS",
        "PAUSE_RX_PKTS",
        "PAUSE_TX_PKTS",
    ];
    const QUEUE: &[&str] = &[
        "PACKETS",
        "BYTES",
        "DROPPED_PACKETS",
        "CURR_OCCUPANCY_BYTES",
        "WATERMARK_BYTES",
        "WRED_ECN_MARKED_PACKETS",
        "TRIM_PACKETS",
        "CURR_OCCUPANCY_CELLS",
        "WATERMARK_CELLS",
    ];
    const PG: &[&str] = &[
        "PACKETS",
        "BYTES",
        "CURR_OCCUPANCY_BYTES",
        "WATERMARK_BYTES",
        "XOFF_ROOM_CURR_OCCUPANCY_BYTES",
        "XOFF_ROOM_WATERMARK_BYTES",
        "DROPPED_PACKETS",
        "CURR_OCCUPANCY_CELLS",
        "WATERMARK_CELLS",
    ];
    const POOL: &[&str] = &[
        "DROPPED_PACKETS",
        "CURR_OCCUPANCY_BYTES",
        "WATERMARK_BYTES",
        "XOFF_ROOM_WATERMARK_BYTES",
    ];
    let mut names: Vec<String> = match group {
        ObjectType::Port => {
            let mut v: Vec<String> = PORT.iter().map(|s| s.to_string()).collect();
            for dir in ["RX", "TX"] {
                for i in 0..8 {
                    v.push(format!("PFC_{i}_{dir}_PKTS"));
                }
            }
            v
        }
        ObjectType::Queue => QUEUE.iter().map(|s| s.to_string()).collect(),
        ObjectType::IngressPriorityGroup => PG.iter().map(|s| s.to_string()).collect(),
        ObjectType::BufferPool => POOL.iter().map(|s| s.to_string()).collect(),
        _ => Vec::new(),
    };
    let mut out: Vec<&'static StatName> = names
        .drain(..)
        .filter_map(|n| group.stat_by_name(&n))
        .collect();
    for s in group.stats() {
        if out.len() >= n {
            break;
        }
        if !out.iter().any(|o| o.id == s.id) && s.id < 0x8000 {
            out.push(s);
        }
    }
    out.truncate(n);
    out
}

/// What a counter column measures in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    InOctets,
    InPackets,
    OutOctets,
    OutPackets,
    Occupancy,
    Watermark,
    /// Egress queue overflows (`IF_OUT_DISCARDS`, a queue's or pool's `DROPPED_PACKETS`).
    Discards,
    /// Ingress discards (`IF_IN_DISCARDS`): the model receives at most line rate and drops
    /// nothing on the way in, so this stays 0 — an overflow is one drop, counted once, at egress.
    InDiscards,
    /// Other counters: a slow, monotonic trickle (errors, pauses, PFC).
    Trickle,
}

const KINDS: usize = 9;

fn kind_of(short: &str) -> Kind {
    let s = short;
    let has = |p: &str| s.contains(p);
    if has("WATERMARK") {
        Kind::Watermark
    } else if has("OCCUPANCY") {
        Kind::Occupancy
    } else if s == "IF_IN_DISCARDS" {
        Kind::InDiscards
    } else if has("DISCARD") || has("DROPPED") {
        Kind::Discards
    } else if s == "IF_IN_OCTETS" || s == "BYTES" {
        Kind::InOctets
    } else if s == "IF_OUT_OCTETS" {
        Kind::OutOctets
    } else if s == "IF_IN_UCAST_PKTS" || s == "PACKETS" {
        Kind::InPackets
    } else if s == "IF_OUT_UCAST_PKTS" {
        Kind::OutPackets
    } else {
        Kind::Trickle
    }
}

#[derive(Debug, Clone, Default)]
struct ObjState {
    base_util: f64,
    in_bytes: f64,
    out_bytes: f64,
    queue: f64,
    watermark: f64,
    dropped_bytes: f64,
    trickle: u64,
    size: f64,
}

/// Ground truth: what the emulator sent.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GroundTruth {
    pub domain: u32,
    pub template_id: u16,
    pub seq_mode: SeqMode,
    pub template_messages: u64,
    /// Data messages.
    pub messages: u64,
    /// Snapshots (data records).
    pub records: u64,
    /// Counter values (records × counters per record).
    pub samples: u64,
    /// IPFIX bytes of data messages.
    pub bytes: u64,
    pub first_seq: u32,
    pub last_seq: u32,
    pub target_counters_per_s: f64,
    pub achieved_counters_per_s: f64,
    pub elapsed_s: f64,
    /// False when pacing fell more than 1 % behind the target in any whole second.
    pub kept_up: bool,
    pub worst_second_ratio: f64,
    pub send_errors: u64,
}

/// The emulator state: model, encoder and ground truth.
#[derive(Debug)]
pub struct Emulator {
    pub cfg: EmuConfig,
    template: HftTemplate,
    object_names: Vec<String>,
    object_ids: Vec<u16>,
    /// Per template field: (object index, kind).
    fields: Vec<(u32, Kind)>,
    objs: Vec<ObjState>,
    encoder: Encoder,
    snapshot: u64,
    per_message: usize,
    values: Vec<u64>,
    kinds_scratch: Vec<[u64; KINDS]>,
    pub truth: GroundTruth,
}

impl Emulator {
    /// # Errors
    /// A config that cannot produce a message (no objects, no stats, a snapshot larger than a
    /// message).
    pub fn new(cfg: EmuConfig) -> Result<Self, String> {
        let names = object_names(cfg.group, cfg.ports, cfg.per_port);
        if names.is_empty() {
            return Err("no objects: --ports must be at least 1".into());
        }
        if cfg.stats.is_empty() {
            return Err("no stats selected".into());
        }
        if cfg.interval_ns == 0 {
            return Err("interval must be > 0".into());
        }
        // Labels: names sorted lexicographically, numbered from 1 (HFTelGroup::updateObjects).
        let mut sorted: Vec<String> = names.clone();
        sorted.sort();
        let object_ids: Vec<u16> = (1..=sorted.len() as u16).collect();
        let mut fields = Vec::new();
        let mut hft = Vec::new();
        for (oi, _) in sorted.iter().enumerate() {
            for s in &cfg.stats {
                hft.push(HftField {
                    label: object_ids[oi],
                    object_type: cfg.group as u32,
                    stat_id: s.id,
                });
                fields.push((oi as u32, kind_of(s.short)));
            }
        }
        let template = HftTemplate {
            template_id: cfg.template_id,
            fields: hft,
            width: 8,
        };
        let fit = template.records_per_message(MAX_IPFIX_PAYLOAD);
        if fit == 0 {
            return Err(format!(
                "one snapshot ({} bytes) does not fit in a message ({} bytes); use fewer objects × stats",
                template.record_len(),
                MAX_IPFIX_PAYLOAD
            ));
        }
        let per_message = if cfg.snapshots_per_message == 0 {
            // As many as fit, but no more than MAX_MESSAGE_SPAN_NS of switch time: a switch
            // sends what it has promptly. (At 1 counter every 100 ms "as many as fit" would be
            // thousands of snapshots: one message every few minutes.)
            let span = (MAX_MESSAGE_SPAN_NS / cfg.interval_ns.max(1)).max(1) as usize;
            fit.min(span)
        } else {
            cfg.snapshots_per_message.min(fit)
        };
        let objs = (0..sorted.len())
            .map(|i| ObjState {
                base_util: 0.2 + 0.6 * (i % 7) as f64 / 6.0,
                size: cfg.packet_size as f64,
                ..Default::default()
            })
            .collect();
        let truth = GroundTruth {
            domain: cfg.domain,
            template_id: cfg.template_id,
            seq_mode: cfg.seq_mode,
            target_counters_per_s: cfg.counters_per_s(),
            kept_up: true,
            worst_second_ratio: 1.0,
            ..Default::default()
        };
        Ok(Self {
            encoder: Encoder::new(cfg.domain, cfg.seq_mode),
            values: vec![0; template.fields.len() * per_message],
            kinds_scratch: vec![[0; KINDS]; sorted.len()],
            object_names: sorted,
            object_ids,
            fields,
            objs,
            template,
            snapshot: 0,
            per_message,
            truth,
            cfg,
        })
    }

    /// The session as STATE_DB would describe it.
    pub fn session_spec(&self) -> SessionSpec {
        SessionSpec {
            profile: self.cfg.profile.clone(),
            group: self.cfg.group.name().to_string(),
            domain: self.cfg.domain,
            object_names: self.object_names.clone(),
            object_ids: self.object_ids.clone(),
        }
    }

    pub fn template(&self) -> &HftTemplate {
        &self.template
    }

    /// Snapshots per data message.
    pub fn snapshots_per_message(&self) -> usize {
        self.per_message
    }

    /// Counters per snapshot.
    pub fn width(&self) -> usize {
        self.template.fields.len()
    }

    /// Snapshots generated so far.
    pub fn snapshots(&self) -> u64 {
        self.snapshot
    }

    /// The `session_config` bytes: one IPFIX message with the template set. Does not advance the
    /// data sequence number (a separate encoder), as the control plane delivers it.
    pub fn session_config(&self) -> Vec<u8> {
        let mut out = Vec::new();
        Encoder::new(self.cfg.domain, self.cfg.seq_mode).template_message(
            &mut out,
            0,
            std::slice::from_ref(&self.template),
        );
        out
    }

    /// Appends the in-band template message.
    pub fn template_message(&mut self, out: &mut Vec<u8>) {
        let t = (self.now_ns() / 1_000_000_000) as u32;
        self.encoder
            .template_message(out, t, std::slice::from_ref(&self.template));
        self.truth.template_messages += 1;
    }

    fn now_ns(&self) -> u64 {
        self.cfg.start_ns + self.snapshot * self.cfg.interval_ns
    }

    fn utilisation(&self, obj: usize, t_ns: u64) -> f64 {
        let base = self.objs[obj].base_util;
        match self.cfg.pattern {
            Pattern::Steady => base,
            Pattern::Ramp => {
                (t_ns % self.cfg.ramp_ns.max(1)) as f64 / self.cfg.ramp_ns.max(1) as f64
            }
            Pattern::Microburst => {
                // Stagger bursts per object so they do not all coincide.
                let phase = (obj as u64 * 7919 * 1000) % self.cfg.burst_period_ns.max(1);
                if (t_ns + phase) % self.cfg.burst_period_ns.max(1) < self.cfg.burst_ns {
                    1.3
                } else {
                    0.3
                }
            }
        }
    }

    /// Advances the model by one interval and writes one snapshot's counters into `dst`.
    fn step(&mut self, dst_off: usize) {
        let t = self.now_ns() - self.cfg.start_ns;
        if Some(self.snapshot) == self.cfg.reset_at_snapshot {
            for o in &mut self.objs {
                let (b, s) = (o.base_util, o.size);
                *o = ObjState {
                    base_util: b,
                    size: s,
                    ..Default::default()
                };
            }
        }
        let line = self.cfg.speed_gbps * 1e9 / 8.0 * self.cfg.interval_ns as f64 / 1e9; // bytes
        for i in 0..self.objs.len() {
            let u = self.utilisation(i, t);
            let o = &mut self.objs[i];
            // What this port's egress queue is offered (may exceed line rate: fan-in from other
            // ports); what the port itself receives never does.
            let offered = u * line;
            o.in_bytes += offered.min(line);
            o.queue += offered;
            let sent = o.queue.min(line);
            o.queue -= sent;
            o.out_bytes += sent;
            if o.queue > self.cfg.queue_bytes as f64 {
                o.dropped_bytes += o.queue - self.cfg.queue_bytes as f64;
                o.queue = self.cfg.queue_bytes as f64;
            }
            o.watermark = o.watermark.max(o.queue);
            if self.snapshot % 1000 == (i as u64 % 1000) {
                o.trickle += 1;
            }
            let pk = |b: f64| (b / o.size) as u64;
            // Packets first, octets = packets × size: the two always agree.
            let in_p = pk(o.in_bytes);
            let out_p = pk(o.out_bytes);
            let s = o.size as u64;
            self.kinds_scratch[i] = [
                in_p * s,
                in_p,
                out_p * s,
                out_p,
                o.queue as u64,
                o.watermark as u64,
                pk(o.dropped_bytes),
                0,
                o.trickle,
            ];
        }
        let w = self.template.fields.len();
        let dst = &mut self.values[dst_off..dst_off + w];
        for (d, (obj, kind)) in dst.iter_mut().zip(&self.fields) {
            *d = self.kinds_scratch[*obj as usize][*kind as usize];
        }
        self.snapshot += 1;
    }

    /// Generates the next `snapshots_per_message()` snapshots and appends them as one IPFIX data
    /// message. Returns the number of snapshots.
    pub fn data_message(&mut self, out: &mut Vec<u8>) -> usize {
        let w = self.template.fields.len();
        let n = self.per_message;
        let first_ts = self.now_ns();
        for r in 0..n {
            self.step(r * w);
        }
        if self.truth.messages == 0 {
            self.truth.first_seq = self.encoder.sequence;
        }
        self.truth.last_seq = self.encoder.sequence;
        let start = out.len();
        let interval = self.cfg.interval_ns;
        let values = &self.values;
        self.encoder.data_message(
            out,
            (first_ts / 1_000_000_000) as u32,
            &self.template,
            (0..n).map(|r| (first_ts + r as u64 * interval, &values[r * w..(r + 1) * w])),
        );
        self.truth.messages += 1;
        self.truth.records += n as u64;
        self.truth.samples += (n * w) as u64;
        self.truth.bytes += (out.len() - start) as u64;
        n
    }
}

/// Object names for a group: `Ethernet0, Ethernet4, …`; queues and PGs `Ethernet0|3`; pools.
pub fn object_names(group: ObjectType, ports: usize, per_port: usize) -> Vec<String> {
    match group {
        ObjectType::Queue | ObjectType::IngressPriorityGroup => (0..ports)
            .flat_map(|p| (0..per_port).map(move |q| format!("Ethernet{}|{q}", 4 * p)))
            .collect(),
        ObjectType::BufferPool => {
            const POOLS: &[&str] = &[
                "egress_lossless_pool",
                "egress_lossy_pool",
                "ingress_lossless_pool",
                "ingress_lossy_pool",
            ];
            (0..ports)
                .map(|i| {
                    POOLS
                        .get(i)
                        .map_or_else(|| format!("pool{i}"), |s| s.to_string())
                })
                .collect()
        }
        ObjectType::RouterInterface => (0..ports).map(|i| format!("Vlan{}", 1000 + i)).collect(),
        ObjectType::Switch => (0..ports).map(|i| format!("switch{i}")).collect(),
        ObjectType::Port => (0..ports).map(|p| format!("Ethernet{}", 4 * p)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn design_config_stats_exist_and_message_fits() {
        let cfg = EmuConfig::design();
        assert_eq!(cfg.stats.len(), 30);
        assert_eq!(cfg.stats[0].short, "IF_IN_OCTETS");
        assert!(cfg.stats.iter().any(|s| s.short == "PFC_7_TX_PKTS"));
        let e = Emulator::new(cfg).unwrap();
        assert_eq!(e.width(), 1920);
        assert_eq!(e.snapshots_per_message(), 4);
        assert_eq!((e.session_spec().object_names[1]).as_str(), "Ethernet100");
    }

    /// A port never receives or sends above line rate; a queue overflow is one egress discard,
    /// not an ingress one too.
    #[test]
    fn microbursts_stay_physical() {
        let mut cfg = EmuConfig::design();
        cfg.ports = 4;
        cfg.pattern = Pattern::Microburst;
        cfg.queue_bytes = 50_000;
        let mut e = Emulator::new(cfg.clone()).unwrap();
        let col = |name: &str| e.cfg.stats.iter().position(|s| s.short == name).unwrap();
        let (rx, tx, ind, outd) = (
            col("IF_IN_OCTETS"),
            col("IF_OUT_OCTETS"),
            col("IF_IN_DISCARDS"),
            col("IF_OUT_DISCARDS"),
        );
        let stats = e.cfg.stats.len();
        let line = cfg.speed_gbps * 1e9 / 8.0 * cfg.interval_ns as f64 / 1e9;
        let size = cfg.packet_size as f64;
        let mut prev: Option<Vec<u64>> = None;
        let mut max_rx = 0.0f64;
        let mut buf = Vec::new();
        for _ in 0..300 {
            buf.clear();
            let n = e.data_message(&mut buf);
            let w = e.width();
            for r in 0..n {
                let row = e.values[r * w..(r + 1) * w].to_vec();
                if let Some(p) = &prev {
                    for obj in 0..4 {
                        let at = |c: usize| obj * stats + c;
                        let d_rx = (row[at(rx)] - p[at(rx)]) as f64;
                        let d_tx = (row[at(tx)] - p[at(tx)]) as f64;
                        // Whole packets: a delta may carry one packet of rounding.
                        assert!(
                            d_rx <= line + size,
                            "RX {d_rx} B in one interval > line {line}"
                        );
                        assert!(
                            d_tx <= line + size,
                            "TX {d_tx} B in one interval > line {line}"
                        );
                        max_rx = max_rx.max(d_rx);
                    }
                }
                prev = Some(row);
            }
        }
        let last = prev.unwrap();
        let (mut out_drops, mut in_drops) = (0, 0);
        for obj in 0..4 {
            out_drops += last[obj * stats + outd];
            in_drops += last[obj * stats + ind];
        }
        assert!(out_drops > 0, "bursts overflow the small queue");
        assert_eq!(in_drops, 0, "an overflow is counted once, at egress");
        assert!(
            max_rx >= line - size,
            "bursts reach line rate ({max_rx} of {line})"
        );
    }
}
