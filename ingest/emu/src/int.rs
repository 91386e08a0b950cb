//! The INT report generator behind `stel-emu int`: telemetry reports of every version the daemon's
//! decoder reads, over a topology of flows on paths of 1–10 hops with EVC VLANs, path changes,
//! drops, congestion and induced loss; ground truth of what was sent; UDP or pcap output.
//!
//! Formats ([`Format`]):
//! * `amlight` — AmLight/NoviFlow's exact layout (reference §6.1): Telemetry Report v1.0 with
//!   Length 4, NProt 0, RepMdBits 0; Ethernet + one 802.1Q tag (the EVC VLAN) + IPv4 (DSCP 0x17) +
//!   UDP; INT v1.0 shim (Length = 3 + 6 × hops), Hop ML 6, instructions 0xFC00, Remaining Hop
//!   Count = 10 − hops; hop latency all-ones (NoviFlow does not fill it); 32-bit timestamps.
//! * `v1` — Telemetry Report v1.0 with all six RepMdBits words, QinQ, IPv6, TCP with options
//!   (INT after them, per the spec), INT v1.0 with L2 ports and TX utilisation (Hop ML 9).
//! * `v05` — Telemetry Report v0.5 with the switch-local header (NProto 2; drop header, NProto 1,
//!   for drops), Ethernet + VLAN + IPv4 + TCP, INT v0.5 (Ins Cnt 6, tail).
//! * `v2` — Telemetry Report v2.0: group header, `coalesce` individual reports per packet
//!   (RepType INT, InType Ethernet, RepMdBits ports/queue/8-byte timestamps [+ drop reason]),
//!   inner packet with INT v2.1 INT-MD (8-byte timestamps, Hop ML 8); `tofino` for switch.p4's
//!   4-bit hw_id / 24-bit sequence.
//!
//! Loss is induced by skipping sequence numbers (the report is built, counted as lost, not
//! sent), so the decoder's loss counters can be checked exactly against [`Truth`].

use std::{
    collections::BTreeMap,
    io::Write,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant, SystemTime},
};

use serde::Serialize;

/// Report layout to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// AmLight/NoviFlow's layout: Telemetry Report v1.0, one VLAN (the EVC), INT v1.0, 6 words a hop.
    Amlight,
    /// Telemetry Report v1.0 with every metadata word, QinQ, IPv6, TCP options, INT v1.0.
    V1,
    /// Telemetry Report v0.5 with the switch-local (or drop) header, INT v0.5.
    V05,
    /// Telemetry Report v2.0: --coalesce individual reports per packet, INT v2.1 INT-MD.
    V2,
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenConfig {
    pub format: Format,
    /// Flows (each on its own EVC VLAN, `vlan_base + i`).
    pub flows: usize,
    /// Hops per path: each flow gets a length in this range (1..=10).
    pub min_hops: usize,
    pub max_hops: usize,
    /// Switches in the network (ids `switch_base + i`).
    pub switches: usize,
    pub switch_base: u32,
    pub vlan_base: u16,
    /// A flow moves to its other path every this many of its reports (0 = never).
    pub path_change_every: u64,
    /// Fraction of reports that carry a drop (D flag, drop reason).
    pub drop_rate: f64,
    /// Fraction of reports whose hops see congestion (deep queue, +50 µs latency).
    pub congestion_rate: f64,
    /// Fraction of reports lost on purpose (sequence number used, report not sent).
    pub loss_rate: f64,
    /// Individual reports per v2.0 packet.
    pub coalesce: usize,
    /// v2.0 with switch.p4's 4-bit hw_id and 24-bit sequence.
    pub tofino: bool,
    /// First sequence number of every stream (to exercise wraparound).
    pub seq_start: u32,
    pub seed: u64,
}

impl Default for GenConfig {
    fn default() -> Self {
        Self {
            format: Format::Amlight,
            flows: 16,
            min_hops: 1,
            max_hops: 5,
            switches: 12,
            switch_base: 0xFB65_D600,
            vlan_base: 100,
            path_change_every: 0,
            drop_rate: 0.0,
            congestion_rate: 0.0,
            loss_rate: 0.0,
            coalesce: 1,
            tofino: false,
            seq_start: 0,
            seed: 1,
        }
    }
}

/// Ground truth of one (switch, hw_id) sequence stream.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct StreamTruth {
    pub switch_id: u32,
    pub hw_id: u8,
    /// Packets (sequence numbers) sent.
    pub sent: u64,
    /// Sequence numbers skipped on purpose.
    pub lost: u64,
    /// Of `lost`, those between two sent packets (a receiver can see them: losses before a
    /// stream's first or after its last sent packet leave no gap).
    pub lost_detectable: u64,
    #[serde(skip)]
    lost_since_sent: u64,
}

/// Ground truth of one flow.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct FlowTruth {
    pub vlan: u16,
    pub src: String,
    pub dst: String,
    pub src_port: u16,
    pub dst_port: u16,
    /// Reports sent.
    pub reports: u64,
    /// Path changes (different switches) between consecutive sent reports.
    pub path_changes: u64,
    /// Switch ids of its paths (primary, alternative).
    pub paths: Vec<Vec<u32>>,
}

/// What was sent (`--truth`).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Truth {
    pub format: Option<Format>,
    /// UDP datagrams (or pcap records) sent.
    pub packets_sent: u64,
    /// Individual reports sent.
    pub reports_sent: u64,
    /// Hop records in the sent reports.
    pub hops_sent: u64,
    /// Sent reports carrying a drop.
    pub drops_sent: u64,
    /// Sent reports with congestion.
    pub congested_sent: u64,
    /// Packets built but not sent (induced loss).
    pub packets_lost: u64,
    /// Of those, the ones between two sent packets of their stream (what sequence numbers show).
    pub packets_lost_detectable: u64,
    /// Individual reports in them.
    pub reports_lost: u64,
    pub path_changes: u64,
    pub streams: Vec<StreamTruth>,
    pub flows: Vec<FlowTruth>,
    /// Sum of every sent report's hop latencies, ns (what `latency_sum_ns` adds up to).
    pub latency_sum_ns: u128,
}

#[derive(Debug, Clone)]
struct Flow {
    vlan: u16,
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    paths: [Vec<u32>; 2],
    ports: [Vec<(u16, u16)>; 2],
    cur: usize,
    reports: u64,
    last_sent_path: Option<usize>,
    path_changes: u64,
}

/// One hop as generated.
#[derive(Debug, Clone, Copy, Default)]
struct GHop {
    node: u32,
    in_port: u16,
    out_port: u16,
    queue: u8,
    occupancy: u32,
    ingress_ts: u64,
    egress_ts: u64,
    latency: u32,
}

/// Deterministic xorshift64*.
#[derive(Debug, Clone)]
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// The generator: builds packets one at a time into a reused buffer.
#[derive(Debug)]
pub struct Generator {
    cfg: GenConfig,
    rng: Rng,
    flows: Vec<Flow>,
    /// Next sequence number per (reporting switch, hw_id).
    seq: BTreeMap<(u32, u8), u32>,
    truth: Truth,
    streams: BTreeMap<(u32, u8), StreamTruth>,
    next_flow: usize,
    /// Device clock, ns.
    clock: u64,
}

/// One built packet: the UDP payload and whether it is to be sent (false = induced loss).
#[derive(Debug)]
pub struct Built<'a> {
    pub payload: &'a [u8],
    pub send: bool,
    /// The reporting switch (for the outer source address).
    pub switch_id: u32,
    /// Its sequence stream: (reporting switch, hw_id).
    pub stream: (u32, u8),
}

impl Generator {
    pub fn new(mut cfg: GenConfig) -> Self {
        cfg.min_hops = cfg.min_hops.clamp(1, 10);
        cfg.max_hops = cfg.max_hops.clamp(cfg.min_hops, 10);
        cfg.switches = cfg.switches.max(cfg.max_hops);
        cfg.flows = cfg.flows.max(1);
        cfg.coalesce = cfg.coalesce.clamp(1, 64);
        let mut rng = Rng(cfg.seed.max(1) ^ 0x9e37_79b9_7f4a_7c15);
        let sw = |i: u64| cfg.switch_base.wrapping_add(i as u32);
        let mut flows = Vec::with_capacity(cfg.flows);
        for i in 0..cfg.flows {
            let hops = cfg.min_hops + rng.below((cfg.max_hops - cfg.min_hops + 1) as u64) as usize;
            let mut paths: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
            let mut ports: [Vec<(u16, u16)>; 2] = [Vec::new(), Vec::new()];
            // Both paths share the UNI switches (first and last); the middle differs when it can.
            let n = cfg.switches as u64;
            let a = rng.below(n);
            let z = (a + 1 + rng.below(n - 1)) % n;
            for (k, path) in paths.iter_mut().enumerate() {
                path.push(sw(a));
                let mut used = vec![a, z];
                for _ in 1..hops.saturating_sub(1) {
                    let mut s = rng.below(n);
                    for _ in 0..n {
                        if !used.contains(&s) {
                            break;
                        }
                        s = (s + 1 + k as u64) % n;
                    }
                    used.push(s);
                    path.push(sw(s));
                }
                if hops > 1 {
                    path.push(sw(z));
                }
                ports[k] = (0..path.len())
                    .map(|_| (1 + rng.below(48) as u16, 1 + rng.below(48) as u16))
                    .collect();
                // Same UNI ports on both paths.
                if k == 1 {
                    ports[1][0].0 = ports[0][0].0;
                    let l = ports[1].len() - 1;
                    ports[1][l].1 = ports[0][ports[0].len() - 1].1;
                }
            }
            let i16 = i as u16;
            flows.push(Flow {
                vlan: cfg.vlan_base.wrapping_add(i16) & 0x0fff,
                src: [10, 1, (i >> 8) as u8, i as u8],
                dst: [10, 2, (i >> 8) as u8, i as u8],
                sport: 40000u16.wrapping_add(i16),
                dport: 50001,
                paths,
                ports,
                cur: 0,
                reports: 0,
                last_sent_path: None,
                path_changes: 0,
            });
        }
        let truth = Truth {
            format: Some(cfg.format),
            ..Truth::default()
        };
        Self {
            rng,
            flows,
            seq: BTreeMap::new(),
            truth,
            streams: BTreeMap::new(),
            next_flow: 0,
            clock: 1_000_000_000,
            cfg,
        }
    }

    /// The ground truth so far.
    pub fn truth(&self) -> Truth {
        let mut t = self.truth.clone();
        t.streams = self.streams.values().cloned().collect();
        t.flows = self
            .flows
            .iter()
            .map(|f| FlowTruth {
                vlan: f.vlan,
                src: Ipv4Addr::from(f.src).to_string(),
                dst: Ipv4Addr::from(f.dst).to_string(),
                src_port: f.sport,
                dst_port: f.dport,
                reports: f.reports,
                path_changes: f.path_changes,
                paths: f.paths.to_vec(),
            })
            .collect();
        t
    }

    /// The EVC listing a Kytos controller would return for the generated flows (JSON): EVC
    /// `evc-<vlan>` named `vlan_<vlan>`, UNIs at the flow's first and last switch.
    pub fn kytos_evcs_json(&self) -> String {
        let dpid = |s: u32| {
            let b = u64::from(s).to_be_bytes();
            b.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        let mut m = serde_json::Map::new();
        for f in &self.flows {
            let p = &f.paths[0];
            let ports = &f.ports[0];
            let id = format!("evc-{}", f.vlan);
            let uni = |s: u32, port: u16| {
                serde_json::json!({"interface_id": format!("{}:{}", dpid(s), port),
                                   "tag": {"tag_type": "vlan", "value": f.vlan}})
            };
            m.insert(
                id.clone(),
                serde_json::json!({
                    "id": id, "name": format!("vlan_{}", f.vlan), "active": true, "enabled": true,
                    "uni_a": uni(p[0], ports[0].0),
                    "uni_z": uni(p[p.len() - 1], ports[ports.len() - 1].1),
                }),
            );
        }
        serde_json::Value::Object(m).to_string()
    }

    fn hops_for(&mut self, f: usize, congested: bool) -> ([GHop; 10], usize) {
        let flow = &self.flows[f];
        let path = &flow.paths[flow.cur];
        let ports = &flow.ports[flow.cur];
        let mut out = [GHop::default(); 10];
        let mut t = self.clock;
        for (i, (&node, &(ip, op))) in path.iter().zip(ports.iter()).enumerate() {
            let base = 800 + self.rng.below(1200) as u32;
            let extra = if congested { 50_000 } else { 0 };
            let latency = base + extra;
            let occ = if congested {
                50_000 + self.rng.below(10_000) as u32
            } else {
                self.rng.below(200) as u32
            };
            out[i] = GHop {
                node,
                in_port: ip,
                out_port: op,
                queue: (self.rng.below(8)) as u8,
                occupancy: occ,
                ingress_ts: t,
                egress_ts: t + u64::from(latency),
                latency,
            };
            t += u64::from(latency) + 500;
        }
        (out, path.len())
    }

    fn next_seq(&mut self, switch: u32, hw_id: u8, bits: u32) -> u32 {
        let mask = if bits == 32 {
            u32::MAX
        } else {
            (1 << bits) - 1
        };
        let start = self.cfg.seq_start & mask;
        let s = self.seq.entry((switch, hw_id)).or_insert(start);
        let v = *s;
        *s = s.wrapping_add(1) & mask;
        v
    }

    /// Builds the next packet into `buf` (cleared first).
    pub fn next_packet<'b>(&mut self, buf: &'b mut Vec<u8>) -> Built<'b> {
        buf.clear();
        self.clock += 10_000 + self.rng.below(1000);
        let lost = self.rng.chance(self.cfg.loss_rate);
        let n_reports = if self.cfg.format == Format::V2 {
            self.cfg.coalesce
        } else {
            1
        };
        let mut reporter = 0;
        let mut stream_key = (0, 0);
        for k in 0..n_reports {
            let f = self.next_flow;
            self.next_flow = (self.next_flow + 1) % self.flows.len();
            // Path changes by the flow's own report count.
            let every = self.cfg.path_change_every;
            {
                let fl = &mut self.flows[f];
                if every > 0 && fl.reports > 0 && fl.reports.is_multiple_of(every) {
                    fl.cur ^= 1;
                }
                fl.reports += 1;
            }
            let congested = self.rng.chance(self.cfg.congestion_rate);
            let dropped = self.rng.chance(self.cfg.drop_rate);
            let (hops, nh) = self.hops_for(f, congested);
            let sink = hops[nh - 1].node;
            if k == 0 {
                reporter = sink;
                let hw_id = (f % 4) as u8;
                let (bits, rep_hw) = match (self.cfg.format, self.cfg.tofino) {
                    (Format::V2, false) => (22, hw_id),
                    (Format::V2, true) => (24, hw_id & 0x0f),
                    _ => (32, hw_id),
                };
                stream_key = (sink, rep_hw);
                let seq = self.next_seq(sink, rep_hw, bits);
                match self.cfg.format {
                    Format::V2 => self.v2_group(buf, rep_hw, seq, sink),
                    Format::Amlight => {
                        v1_report_header(
                            buf,
                            rep_hw,
                            sink,
                            seq,
                            hops[nh - 1].egress_ts as u32,
                            dropped,
                            congested,
                            &[],
                        );
                    }
                    Format::V1 => {
                        let h = &hops[nh - 1];
                        let md = [
                            (u32::from(h.in_port) << 16) | u32::from(h.out_port),
                            h.latency,
                            (u32::from(h.queue) << 24) | h.occupancy,
                            h.egress_ts as u32,
                            (u32::from(h.queue) << 24)
                                | (if dropped { 7u32 << 16 } else { 0xff << 16 }),
                            500,
                        ];
                        v1_report_header(
                            buf,
                            rep_hw,
                            sink,
                            seq,
                            h.ingress_ts as u32,
                            dropped,
                            congested,
                            &md,
                        );
                    }
                    Format::V05 => {
                        let h = &hops[nh - 1];
                        v05_header(
                            buf,
                            rep_hw,
                            seq,
                            h.ingress_ts as u32,
                            dropped,
                            congested,
                            sink,
                            h,
                        );
                    }
                }
            }
            let fl = self.flows[f].clone();
            match self.cfg.format {
                Format::Amlight => amlight_inner(buf, &fl, &hops[..nh]),
                Format::V1 => v1_inner(buf, &fl, &hops[..nh]),
                Format::V05 => v05_inner(buf, &fl, &hops[..nh]),
                Format::V2 => v2_individual(buf, &fl, &hops[..nh], dropped, congested),
            }
            let t = &mut self.truth;
            if lost {
                t.reports_lost += 1;
            } else {
                t.reports_sent += 1;
                t.hops_sent += nh as u64;
                t.drops_sent += u64::from(dropped);
                t.congested_sent += u64::from(congested);
                t.latency_sum_ns += hops[..nh]
                    .iter()
                    .map(|h| u128::from(h.latency))
                    .sum::<u128>();
                let fl = &mut self.flows[f];
                // A change only when the switches differ (1–2-hop paths have one route).
                if fl
                    .last_sent_path
                    .is_some_and(|p| fl.paths[p] != fl.paths[fl.cur])
                {
                    fl.path_changes += 1;
                    t.path_changes += 1;
                }
                fl.last_sent_path = Some(fl.cur);
            }
        }
        let st = self
            .streams
            .entry(stream_key)
            .or_insert_with(|| StreamTruth {
                switch_id: stream_key.0,
                hw_id: stream_key.1,
                ..Default::default()
            });
        if lost {
            st.lost += 1;
            st.lost_since_sent += 1;
            self.truth.packets_lost += 1;
        } else {
            if st.sent > 0 {
                st.lost_detectable += st.lost_since_sent;
                self.truth.packets_lost_detectable += st.lost_since_sent;
            }
            st.lost_since_sent = 0;
            st.sent += 1;
            self.truth.packets_sent += 1;
        }
        Built {
            payload: buf,
            send: !lost,
            switch_id: reporter,
            stream: stream_key,
        }
    }

    fn v2_group(&self, buf: &mut Vec<u8>, hw_id: u8, seq: u32, node: u32) {
        let w = if self.cfg.tofino {
            (2u32 << 28) | (u32::from(hw_id & 0x0f) << 24) | (seq & 0xff_ffff)
        } else {
            (2u32 << 28) | (u32::from(hw_id & 0x3f) << 22) | (seq & 0x3f_ffff)
        };
        buf.extend_from_slice(&w.to_be_bytes());
        buf.extend_from_slice(&node.to_be_bytes());
    }
}

fn put16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_be_bytes());
}
fn put32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_be_bytes());
}

/// Telemetry Report v1.0 header (16 B + one word per metadata value; RepMdBits = the first
/// `md.len()` bits).
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per header field, in wire order"
)]
fn v1_report_header(
    b: &mut Vec<u8>,
    hw_id: u8,
    switch: u32,
    seq: u32,
    ingress_ts: u32,
    d: bool,
    q: bool,
    md: &[u32],
) {
    let len = 4 + md.len() as u8;
    let rep_md: u8 = if md.is_empty() {
        0
    } else {
        (0x3fu8 << (6 - md.len())) & 0x3f
    };
    b.push((1 << 4) | len);
    b.push(rep_md >> 1); // NProt 0 (Ethernet) in the top 3 bits
    b.push(((rep_md & 1) << 7) | u8::from(d));
    b.push((u8::from(q) << 7) | (1 << 6) | (hw_id & 0x3f));
    put32(b, switch);
    put32(b, seq);
    put32(b, ingress_ts);
    for w in md {
        put32(b, *w);
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one argument per header field, in wire order"
)]
fn v05_header(
    b: &mut Vec<u8>,
    hw_id: u8,
    seq: u32,
    ingress_ts: u32,
    d: bool,
    q: bool,
    switch: u32,
    h: &GHop,
) {
    let nproto = if d { 1 } else { 2 };
    b.push(nproto);
    b.push((u8::from(d) << 7) | (u8::from(q) << 6) | (1 << 5));
    b.push(0);
    b.push(hw_id & 0x3f);
    put32(b, seq);
    put32(b, ingress_ts);
    put32(b, switch);
    put16(b, h.in_port);
    put16(b, h.out_port);
    if d {
        b.push(h.queue);
        b.push(7); // drop reason
        put16(b, 0);
    } else {
        put32(b, (u32::from(h.queue) << 24) | h.occupancy);
        put32(b, h.egress_ts as u32);
    }
}

fn ethernet(b: &mut Vec<u8>, tags: &[(u16, u16)], ethertype: u16) {
    b.extend_from_slice(&[0x00, 0x00, 0x5e, 0x00, 0x53, 0x02]);
    b.extend_from_slice(&[0x00, 0x00, 0x5e, 0x00, 0x53, 0x01]);
    for &(tpid, vid) in tags {
        put16(b, tpid);
        put16(b, vid & 0x0fff);
    }
    put16(b, ethertype);
}

fn ipv4_header(b: &mut Vec<u8>, src: [u8; 4], dst: [u8; 4], proto: u8, dscp: u8, payload: usize) {
    let start = b.len();
    b.push(0x45);
    b.push(dscp << 2);
    put16(b, (20 + payload) as u16);
    put16(b, 0x1234);
    put16(b, 0x4000);
    b.push(64);
    b.push(proto);
    put16(b, 0);
    b.extend_from_slice(&src);
    b.extend_from_slice(&dst);
    let csum = checksum(&b[start..start + 20]);
    b[start + 10..start + 12].copy_from_slice(&csum.to_be_bytes());
}

fn checksum(h: &[u8]) -> u16 {
    let mut s: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// INT v1.0 stack words for `hops` (path order), newest first, per the instruction set.
fn v1_hop_words(b: &mut Vec<u8>, hops: &[GHop], amlight: bool) {
    for h in hops.iter().rev() {
        put32(b, h.node);
        put32(b, (u32::from(h.in_port) << 16) | u32::from(h.out_port));
        put32(b, if amlight { u32::MAX } else { h.latency });
        put32(b, (u32::from(h.queue) << 24) | h.occupancy);
        put32(b, h.ingress_ts as u32);
        put32(b, h.egress_ts as u32);
        if !amlight {
            // L2 ports (8 B) and TX utilisation.
            put32(b, u32::from(h.in_port) + 1000);
            put32(b, u32::from(h.out_port) + 1000);
            put32(b, 250);
        }
    }
}

fn amlight_inner(b: &mut Vec<u8>, f: &Flow, hops: &[GHop]) {
    let n = hops.len();
    let int_len = 12 + 24 * n;
    ethernet(b, &[(0x8100, f.vlan)], 0x0800);
    ipv4_header(b, f.src, f.dst, 17, 0x17, 8 + int_len);
    put16(b, f.sport);
    put16(b, f.dport);
    put16(b, (8 + int_len) as u16);
    put16(b, 0);
    // Shim: Type 1, reserved, Length = 3 + 6 × hops, DSCP 0x02 in bits 24..29.
    b.extend_from_slice(&[1, 0, (3 + 6 * n) as u8, 0x02 << 2]);
    // INT v1.0 header: Ver 1, Hop ML 6, Remaining Hop Count 10 − hops, instructions 0xFC00.
    b.extend_from_slice(&[0x10, 0, 6, (10 - n) as u8]);
    put16(b, 0xfc00);
    put16(b, 0);
    v1_hop_words(b, hops, true);
}

fn v1_inner(b: &mut Vec<u8>, f: &Flow, hops: &[GHop]) {
    let n = hops.len();
    let hop_ml = 9;
    let int_len = 12 + 4 * hop_ml * n;
    let tcp_len = 32; // 20 + 12 bytes of options
    ethernet(b, &[(0x88a8, f.vlan), (0x8100, 7)], 0x86dd);
    // IPv6: traffic class = DSCP 0x17.
    let tc: u8 = 0x17 << 2;
    b.push(0x60 | (tc >> 4));
    b.push(tc << 4);
    put16(b, 0);
    put16(b, (tcp_len + int_len) as u16);
    b.push(6);
    b.push(64);
    let v6 = |a: [u8; 4]| {
        let mut x = [0u8; 16];
        x[0] = 0x20;
        x[1] = 0x01;
        x[2] = 0x0d;
        x[3] = 0xb8;
        x[12..].copy_from_slice(&a);
        x
    };
    b.extend_from_slice(&v6(f.src));
    b.extend_from_slice(&v6(f.dst));
    put16(b, f.sport);
    put16(b, f.dport);
    put32(b, 1);
    put32(b, 0);
    b.push(8 << 4); // data offset 8 words
    b.push(0x18);
    put16(b, 1024);
    put32(b, 0);
    b.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]); // NOP NOP timestamps
    b.extend_from_slice(&[1, 0, (3 + hop_ml * n) as u8, 0x17 << 2]);
    b.extend_from_slice(&[0x10, 0, hop_ml as u8, (10 - n) as u8]);
    put16(b, 0xff00);
    put16(b, 0);
    v1_hop_words(b, hops, false);
}

fn v05_inner(b: &mut Vec<u8>, f: &Flow, hops: &[GHop]) {
    let n = hops.len();
    let int_len = 16 + 24 * n;
    ethernet(b, &[(0x8100, f.vlan)], 0x0800);
    ipv4_header(b, f.src, f.dst, 6, 0x17, 20 + int_len);
    put16(b, f.sport);
    put16(b, f.dport);
    put32(b, 1);
    put32(b, 0);
    b.push(5 << 4);
    b.push(0x18);
    put16(b, 1024);
    put32(b, 0);
    // Shim: Type 1, Length includes shim, header, stack and tail.
    b.extend_from_slice(&[1, 0, (4 + 6 * n) as u8, 0]);
    // Ver 0, Ins Cnt 6, Max Hop Cnt 10, Total Hop Cnt n.
    b.extend_from_slice(&[0x00, 6, 10, n as u8]);
    put16(b, 0xfc00);
    put16(b, 0);
    for h in hops.iter().rev() {
        put32(b, h.node);
        put32(b, (u32::from(h.in_port) << 16) | u32::from(h.out_port));
        put32(b, h.latency);
        put32(b, (u32::from(h.queue) << 24) | h.occupancy);
        put32(b, h.ingress_ts as u32);
        put32(b, h.egress_ts as u32);
    }
    // Tail: original protocol, destination port, DSCP.
    b.push(6);
    put16(b, f.dport);
    b.push(0);
}

fn v2_individual(b: &mut Vec<u8>, f: &Flow, hops: &[GHop], d: bool, q: bool) {
    let n = hops.len();
    let hop_ml = 8;
    let int_len = 16 + 4 * hop_ml * n; // shim + 12 B header + stack
    let sink = &hops[n - 1];
    let mut inner = Vec::with_capacity(64 + int_len);
    ethernet(&mut inner, &[(0x8100, f.vlan)], 0x0800);
    ipv4_header(&mut inner, f.src, f.dst, 17, 0x17, 8 + int_len);
    put16(&mut inner, f.sport);
    put16(&mut inner, f.dport);
    put16(&mut inner, (8 + int_len) as u16);
    put16(&mut inner, 0);
    inner.push(1 << 4); // Type INT-MD, NPT 0
    inner.push((3 + hop_ml * n) as u8);
    inner.push(0);
    inner.push(0x17 << 2);
    inner.extend_from_slice(&[0x20, 0, hop_ml as u8, (10 - n) as u8]);
    put16(&mut inner, 0xfc00);
    put16(&mut inner, 0);
    put32(&mut inner, 0);
    for h in hops.iter().rev() {
        put32(&mut inner, h.node);
        put32(
            &mut inner,
            (u32::from(h.in_port) << 16) | u32::from(h.out_port),
        );
        put32(&mut inner, h.latency);
        put32(&mut inner, (u32::from(h.queue) << 24) | h.occupancy);
        put64(&mut inner, h.ingress_ts);
        put64(&mut inner, h.egress_ts);
    }
    while inner.len() % 4 != 0 {
        inner.push(0);
    }
    // RepMdBits: L1 ports, queue, ingress ts (8 B), egress ts (8 B) [+ queue/drop reason].
    let rep_md: u16 = 0x4000 | 0x1000 | 0x0800 | 0x0400 | if d { 0x0001 } else { 0 };
    let md_words = 6 + usize::from(d);
    let rep_len = 2 + md_words + inner.len() / 4;
    b.push((1 << 4) | 3); // RepType INT, InType Ethernet
    b.push(rep_len.min(0xfe) as u8);
    b.push(md_words as u8);
    b.push((u8::from(d) << 7) | (u8::from(q) << 6) | (1 << 5));
    put16(b, rep_md);
    put16(b, 0);
    put16(b, 0);
    put16(b, 0);
    put32(
        b,
        (u32::from(sink.in_port) << 16) | u32::from(sink.out_port),
    );
    put32(b, (u32::from(sink.queue) << 24) | sink.occupancy);
    put64(b, sink.ingress_ts);
    put64(b, sink.egress_ts);
    if d {
        put32(b, (u32::from(sink.queue) << 24) | (7 << 16));
    }
    b.extend_from_slice(&inner);
}

/// Outer Ethernet/IPv4/UDP around a report (pcap output): source 10.255.x.y from the switch id.
pub fn outer_frame(out: &mut Vec<u8>, switch_id: u32, dst_port: u16, payload: &[u8]) {
    out.clear();
    ethernet(out, &[], 0x0800);
    let s = switch_id.to_be_bytes();
    ipv4_header(
        out,
        [10, 255, s[2], s[3]],
        [10, 0, 0, 1],
        17,
        0,
        8 + payload.len(),
    );
    put16(out, 6000);
    put16(out, dst_port);
    put16(out, (8 + payload.len()) as u16);
    put16(out, 0);
    out.extend_from_slice(payload);
}

#[derive(Debug, clap::Parser)]
// bin_name: `cli_main` parses from "int" on, which clap would take as the program's name.
#[command(name = "stel-emu int", bin_name = "stel-emu int", verbatim_doc_comment)]
/// Sends INT telemetry reports like P4/INT switches (AmLight/NoviFlow by default) to a UDP
/// collector, or writes them to a pcap file. The defaults show what INT is for: 1 % of reports
/// carry a drop, 2 % see congestion, and every flow of 3+ hops changes path every 50 of its
/// reports (--drops 0 --congestion 0 --path-change-every 0 for a quiet network).
///
/// Examples:
///   stel-emu int --to 127.0.0.1:5900 --rate 100000 --duration 10s
///   stel-emu int --format v2 --coalesce 4 --flows 64 --max-hops 8 --to 127.0.0.1:5900
///   stel-emu int --format amlight --loss 0.01 --path-change-every 1000 --count 100000 \
///       --pcap int.pcap --truth truth.json --kytos-evcs evcs.json
pub struct IntArgs {
    /// Report layout.
    #[arg(long, value_enum, default_value_t = Format::Amlight)]
    pub format: Format,
    /// Collector address (UDP).
    #[arg(long)]
    pub to: Option<SocketAddr>,
    /// Write the reports (with outer Ethernet/IPv4/UDP to port 5900) to this pcap file.
    #[arg(long)]
    pub pcap: Option<PathBuf>,
    /// Packets per second (0 = as fast as possible).
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Stop after this many packets.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this long (e.g. 10s); default 1s unless --count is given.
    #[arg(long, value_parser = stel_store::units::parse_duration_ns)]
    pub duration: Option<u64>,
    /// Flows (each on its own EVC VLAN, vlan-base + i), reported round robin.
    #[arg(long, default_value_t = 16)]
    pub flows: usize,
    /// Shortest path (hops); each flow gets a length in min-hops..=max-hops.
    #[arg(long, default_value_t = 1)]
    pub min_hops: usize,
    /// Longest path (hops, at most 10 as NoviFlow).
    #[arg(long, default_value_t = 5)]
    pub max_hops: usize,
    /// Switches in the network.
    #[arg(long, default_value_t = 12)]
    pub switches: usize,
    /// First EVC VLAN (flow i uses vlan-base + i).
    #[arg(long, default_value_t = 100)]
    pub vlan_base: u16,
    /// Move each flow to its other path every N of its reports (0 = never). The default shows
    /// path changes within a second (or 1,000 packets) of the default run.
    #[arg(long, default_value_t = 50)]
    pub path_change_every: u64,
    /// Fraction of reports with a drop (D flag, drop reason).
    #[arg(long, default_value_t = 0.01)]
    pub drops: f64,
    /// Fraction of reports with congestion (deep queues, +50 µs per hop).
    #[arg(long, default_value_t = 0.02)]
    pub congestion: f64,
    /// Fraction of packets lost on purpose (sequence numbers skipped).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Individual reports per v2.0 packet.
    #[arg(long, default_value_t = 1)]
    pub coalesce: usize,
    /// v2.0 with switch.p4's 4-bit hw_id / 24-bit sequence.
    #[arg(long)]
    pub tofino: bool,
    /// First sequence number (e.g. 4294967200 to cross the 32-bit wrap).
    #[arg(long, default_value_t = 0)]
    pub seq_start: u32,
    /// Seed of the generator (same seed, same reports).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write ground truth (what was sent) as JSON here at the end.
    #[arg(long)]
    pub truth: Option<PathBuf>,
    /// Write the Kytos mef_eline EVC listing of the generated flows (JSON) here.
    #[arg(long)]
    pub kytos_evcs: Option<PathBuf>,
}

impl IntArgs {
    pub fn gen_config(&self) -> GenConfig {
        GenConfig {
            format: self.format,
            flows: self.flows,
            min_hops: self.min_hops,
            max_hops: self.max_hops,
            switches: self.switches,
            vlan_base: self.vlan_base,
            path_change_every: self.path_change_every,
            drop_rate: self.drops,
            congestion_rate: self.congestion,
            loss_rate: self.loss,
            coalesce: self.coalesce,
            tofino: self.tofino,
            seq_start: self.seq_start,
            seed: self.seed,
            ..GenConfig::default()
        }
    }
}

/// Runs `stel-emu int` (`args` starts with the subcommand name) until its count or duration is
/// reached or `stop` is set (the caller's SIGINT/SIGTERM flag).
pub fn cli_main<I: IntoIterator<Item = std::ffi::OsString>>(
    args: I,
    stop: &std::sync::atomic::AtomicBool,
) -> ExitCode {
    use clap::Parser;
    let a = IntArgs::parse_from(args);
    match run(&a, stop) {
        Ok(t) => {
            eprintln!(
                "stel-emu int: sent {} packets ({} reports, {} hops), lost on purpose {}",
                t.packets_sent, t.reports_sent, t.hops_sent, t.packets_lost
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stel-emu int: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(a: &IntArgs, stop: &std::sync::atomic::AtomicBool) -> Result<Truth, String> {
    if a.to.is_none() && a.pcap.is_none() {
        return Err("nothing to send to: give --to HOST:PORT and/or --pcap FILE".into());
    }
    let mut g = Generator::new(a.gen_config());
    if let Some(p) = &a.kytos_evcs {
        std::fs::write(p, g.kytos_evcs_json()).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let sock = match a.to {
        Some(to) => {
            let bind: SocketAddr = if to.is_ipv4() {
                "0.0.0.0:0".parse().map_err(|e| format!("{e}"))?
            } else {
                "[::]:0".parse().map_err(|e| format!("{e}"))?
            };
            let s = UdpSocket::bind(bind).map_err(|e| format!("bind {bind}: {e}"))?;
            s.connect(to).map_err(|e| format!("connect {to}: {e}"))?;
            Some(s)
        }
        None => None,
    };
    let mut pcap = match &a.pcap {
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
            Some(
                pcap_file::pcap::PcapWriter::new(std::io::BufWriter::new(f))
                    .map_err(|e| format!("{}: {e}", p.display()))?,
            )
        }
        None => None,
    };
    let duration = match (a.duration, a.count) {
        (Some(d), _) => Some(Duration::from_nanos(d)),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(1)),
    };
    let start = Instant::now();
    let mut buf = Vec::with_capacity(2048);
    let mut frame = Vec::with_capacity(2048);
    let mut built = 0u64;
    loop {
        if a.count.is_some_and(|c| built >= c)
            || duration.is_some_and(|d| start.elapsed() >= d)
            || stop.load(std::sync::atomic::Ordering::Relaxed)
        {
            break;
        }
        if a.rate > 0 {
            let due = Duration::from_secs_f64(built as f64 / a.rate as f64);
            let el = start.elapsed();
            if due > el {
                std::thread::sleep((due - el).min(Duration::from_millis(5)));
                continue;
            }
        }
        let p = g.next_packet(&mut buf);
        built += 1;
        if !p.send {
            continue;
        }
        if let Some(s) = &sock {
            // ECONNREFUSED: nobody listening yet (ICMP); the report is still counted as sent.
            match s.send(p.payload) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(format!("send: {e}")),
            }
        }
        if let Some(w) = &mut pcap {
            outer_frame(&mut frame, p.switch_id, 5900, p.payload);
            let ts = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            w.write_packet(&pcap_file::pcap::PcapPacket::new(
                ts,
                frame.len() as u32,
                &frame,
            ))
            .map_err(|e| format!("pcap: {e}"))?;
        }
    }
    if let Some(w) = pcap {
        w.into_writer().flush().map_err(|e| format!("pcap: {e}"))?;
    }
    let t = g.truth();
    if let Some(p) = &a.truth {
        let json = serde_json::to_string_pretty(&t).map_err(|e| e.to_string())?;
        std::fs::write(p, json).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(t)
}
