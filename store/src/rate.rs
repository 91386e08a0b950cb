//! Rates the way SONiC computes them, on any stream of counter samples; and the way `portstat`
//! (`show interfaces counters`) renders them.
//!
//! This is the math of sonic-swss `orchagent/port_rates.lua` and `rif_rates.lua` (reference
//! §3.3–§3.5), with no I/O so the daemon's COUNTERS_DB writer and `stel-query` compute the same
//! numbers from the same samples:
//!
//! - [`RateState`] is one object's state machine (`INIT_DONE` absent → `COUNTERS_LAST` → `DONE`):
//!   the first sample only seeds the `*_last` snapshots, the second writes raw rates, later ones an
//!   EMA `new = α·raw + (1 − α)·old` with α = 2 / (N + 1), N = 10 by default ([`DEFAULT_ALPHA`]).
//! - `RX_BPS`/`TX_BPS` are **bytes** per second (despite the name), `RX_PPS`/`TX_PPS` packets per
//!   second (unicast + non-unicast for ports, `*_PACKETS` for router interfaces).
//! - The time base is the samples' own timestamps (switch time), not a nominal poll interval:
//!   scale = 1e9 / Δts_ns, which is port_rates.lua's `1000 / delta_ms` when samples are one poll
//!   apart, and exact when a stream sample is picked a little late.
//!
//! Two deliberate differences from the Lua script, both because stream sessions are not flex
//! counter polls:
//! - **Counter reset or wrap** (any input lower than its `_last`): the Lua script would write a
//!   negative (or, for a wrap, huge) rate. Here it is treated like a fresh first sample: the
//!   `_last` snapshots are re-seeded, the published rates are left as they were (no spike) and the
//!   state goes back to `COUNTERS_LAST`, so the next sample writes the raw rate again.
//! - **Missing inputs**: the Lua script skips a port unless all six inputs exist. HFT's YANG model
//!   does not allow subscribing `IF_IN_NON_UCAST_PKTS`/`IF_OUT_NON_UCAST_PKTS`, so a stream never
//!   carries them; here a missing non-unicast counter counts as 0, and each output is computed
//!   when its own inputs are present (`RX_BPS` needs only `IF_IN_OCTETS`). A sample with none of
//!   the inputs is skipped.
//!
//! `RX_UTIL`/`TX_UTIL` are not written by port_rates.lua, but portstat shows them when present;
//! [`util_percent`] computes them from the port speed as portstat would, and [`port_speed_mbps`]
//! chooses the speed exactly as portstat does (STATE_DB, else APPL_DB).

use std::fmt;

/// SONiC's default smoothing interval N (`enable_counters.py` `DEFAULT_SMOOTH_INTERVAL`).
pub const DEFAULT_SMOOTH_INTERVAL: u32 = 10;

/// α for N = 10: 2 / 11. (SONiC writes the string `0.18`; a configured `PORT_ALPHA` wins.)
pub const DEFAULT_ALPHA: f64 = 2.0 / (DEFAULT_SMOOTH_INTERVAL as f64 + 1.0);

/// Default interval between rate samples: flex counters' `PORT_RATE_COUNTER` poll (1 s).
pub const DEFAULT_RATE_INTERVAL_NS: i64 = 1_000_000_000;

/// α = 2 / (N + 1) for a smoothing interval of N polls (`config rate smoothing-interval N`).
pub fn alpha_from_interval(n: u32) -> f64 {
    2.0 / (f64::from(n) + 1.0)
}

/// Parses an α as SONiC stores it (`0.18`), accepting only 0 < α ≤ 1.
pub fn parse_alpha(s: &str) -> Option<f64> {
    parse_lua_number(s).filter(|a| *a > 0.0 && *a <= 1.0)
}

/// Parses a number as Lua/Redis writes it (`2.e9`, `247.e3`, `50.25`, `1e+06`, ` 7 `).
pub fn parse_lua_number(s: &str) -> Option<f64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(v) = s.parse::<f64>() {
        return v.is_finite().then_some(v);
    }
    // `2.e9`: Rust wants a digit after the point.
    let fixed = s.replacen(".e", ".0e", 1).replacen(".E", ".0E", 1);
    fixed.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Which script's fields and keys: ports (`port_rates.lua`) or router interfaces
/// (`rif_rates.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RateKind {
    Port,
    Rif,
}

/// Positions in a [`RateSample`]'s `inputs`.
pub mod input {
    /// Received octets.
    pub const RX_OCTETS: usize = 0;
    /// Transmitted octets.
    pub const TX_OCTETS: usize = 1;
    /// Received unicast packets (ports) / all packets (RIF).
    pub const RX_PKTS: usize = 2;
    /// Received non-unicast packets (ports only).
    pub const RX_NON_UCAST_PKTS: usize = 3;
    /// Transmitted unicast packets (ports) / all packets (RIF).
    pub const TX_PKTS: usize = 4;
    /// Transmitted non-unicast packets (ports only).
    pub const TX_NON_UCAST_PKTS: usize = 5;
    /// Number of inputs.
    pub const COUNT: usize = 6;
}

const PORT_INPUTS: [Option<&str>; input::COUNT] = [
    Some("SAI_PORT_STAT_IF_IN_OCTETS"),
    Some("SAI_PORT_STAT_IF_OUT_OCTETS"),
    Some("SAI_PORT_STAT_IF_IN_UCAST_PKTS"),
    Some("SAI_PORT_STAT_IF_IN_NON_UCAST_PKTS"),
    Some("SAI_PORT_STAT_IF_OUT_UCAST_PKTS"),
    Some("SAI_PORT_STAT_IF_OUT_NON_UCAST_PKTS"),
];
const PORT_LAST: [Option<&str>; input::COUNT] = [
    Some("SAI_PORT_STAT_IF_IN_OCTETS_last"),
    Some("SAI_PORT_STAT_IF_OUT_OCTETS_last"),
    Some("SAI_PORT_STAT_IF_IN_UCAST_PKTS_last"),
    Some("SAI_PORT_STAT_IF_IN_NON_UCAST_PKTS_last"),
    Some("SAI_PORT_STAT_IF_OUT_UCAST_PKTS_last"),
    Some("SAI_PORT_STAT_IF_OUT_NON_UCAST_PKTS_last"),
];
const RIF_INPUTS: [Option<&str>; input::COUNT] = [
    Some("SAI_ROUTER_INTERFACE_STAT_IN_OCTETS"),
    Some("SAI_ROUTER_INTERFACE_STAT_OUT_OCTETS"),
    Some("SAI_ROUTER_INTERFACE_STAT_IN_PACKETS"),
    None,
    Some("SAI_ROUTER_INTERFACE_STAT_OUT_PACKETS"),
    None,
];
const RIF_LAST: [Option<&str>; input::COUNT] = [
    Some("SAI_ROUTER_INTERFACE_STAT_IN_OCTETS_last"),
    Some("SAI_ROUTER_INTERFACE_STAT_OUT_OCTETS_last"),
    Some("SAI_ROUTER_INTERFACE_STAT_IN_PACKETS_last"),
    None,
    Some("SAI_ROUTER_INTERFACE_STAT_OUT_PACKETS_last"),
    None,
];

impl RateKind {
    /// From a SAI object type value (`1` PORT, `6` ROUTER_INTERFACE).
    pub fn from_object_type(object_type: u32) -> Option<Self> {
        match object_type {
            1 => Some(RateKind::Port),
            6 => Some(RateKind::Rif),
            _ => None,
        }
    }

    /// Full SAI stat names of the inputs, by [`input`] position (`None`: not used by this kind).
    pub fn input_names(self) -> &'static [Option<&'static str>; input::COUNT] {
        match self {
            RateKind::Port => &PORT_INPUTS,
            RateKind::Rif => &RIF_INPUTS,
        }
    }

    /// The `*_last` snapshot field names in `RATES:<oid>`, by [`input`] position.
    pub fn last_names(self) -> &'static [Option<&'static str>; input::COUNT] {
        match self {
            RateKind::Port => &PORT_LAST,
            RateKind::Rif => &RIF_LAST,
        }
    }

    /// Position of a full SAI stat name among the inputs.
    pub fn input_index(self, full_name: &str) -> Option<usize> {
        self.input_names()
            .iter()
            .position(|n| *n == Some(full_name))
    }

    /// Suffix of the per-object state key: `PORT` / `RIF`.
    pub fn suffix(self) -> &'static str {
        match self {
            RateKind::Port => "PORT",
            RateKind::Rif => "RIF",
        }
    }

    /// `RATES:<oid>:PORT` / `RATES:<oid>:RIF` (field `INIT_DONE`).
    pub fn state_key(self, oid: &str) -> String {
        format!("RATES:{oid}:{}", self.suffix())
    }

    /// `RATES:PORT` / `RATES:RIF`: the global smoothing config.
    pub fn config_key(self) -> &'static str {
        match self {
            RateKind::Port => "RATES:PORT",
            RateKind::Rif => "RATES:RIF",
        }
    }

    /// `PORT_ALPHA` / `RIF_ALPHA`.
    pub fn alpha_field(self) -> &'static str {
        match self {
            RateKind::Port => "PORT_ALPHA",
            RateKind::Rif => "RIF_ALPHA",
        }
    }
}

/// `RATES:<oid>` — the rates and snapshots hash.
pub fn rates_key(oid: &str) -> String {
    format!("RATES:{oid}")
}

/// The `INIT_DONE` field of `RATES:<oid>:PORT`.
pub const INIT_DONE_FIELD: &str = "INIT_DONE";

/// One object's input counters at one instant (switch time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateSample {
    pub ts_ns: i64,
    /// By [`input`] position; `None` when the stream does not carry the counter.
    pub inputs: [Option<u64>; input::COUNT],
}

impl RateSample {
    #[inline]
    fn octets(&self, i: usize) -> Option<u64> {
        self.inputs[i]
    }

    /// Unicast (or all) packets plus non-unicast (0 when not carried).
    #[inline]
    fn packets(&self, main: usize, extra: usize) -> Option<u64> {
        self.inputs[main].map(|p| p.wrapping_add(self.inputs[extra].unwrap_or(0)))
    }

    /// The four derived quantities: rx bytes, tx bytes, rx packets, tx packets.
    #[inline]
    fn quantities(&self) -> [Option<u64>; 4] {
        [
            self.octets(input::RX_OCTETS),
            self.octets(input::TX_OCTETS),
            self.packets(input::RX_PKTS, input::RX_NON_UCAST_PKTS),
            self.packets(input::TX_PKTS, input::TX_NON_UCAST_PKTS),
        ]
    }
}

/// The `INIT_DONE` state of one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InitState {
    /// No sample yet (the field is absent).
    #[default]
    Absent,
    /// Snapshots stored; the next sample writes raw rates.
    CountersLast,
    /// Rates are smoothed from now on.
    Done,
}

impl InitState {
    /// The `INIT_DONE` value, `None` when the field is absent.
    pub fn as_str(self) -> Option<&'static str> {
        match self {
            InitState::Absent => None,
            InitState::CountersLast => Some("COUNTERS_LAST"),
            InitState::Done => Some("DONE"),
        }
    }

    /// From an `INIT_DONE` value (anything unknown counts as absent, as the Lua script does).
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("COUNTERS_LAST") => InitState::CountersLast,
            Some("DONE") => InitState::Done,
            _ => InitState::Absent,
        }
    }
}

/// The four published rates; `None` until computed (or when the stream lacks the inputs).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    /// Bytes/s received.
    pub rx_bps: Option<f64>,
    /// Bytes/s transmitted.
    pub tx_bps: Option<f64>,
    /// Packets/s received.
    pub rx_pps: Option<f64>,
    /// Packets/s transmitted.
    pub tx_pps: Option<f64>,
}

impl Rates {
    #[inline]
    fn slots(&mut self) -> [&mut Option<f64>; 4] {
        [
            &mut self.rx_bps,
            &mut self.tx_bps,
            &mut self.rx_pps,
            &mut self.tx_pps,
        ]
    }
}

/// What one [`RateState::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// First sample: only the `_last` snapshots were stored (`INIT_DONE` → `COUNTERS_LAST`).
    Seeded,
    /// Second sample: raw rates published unsmoothed (`INIT_DONE` → `DONE`).
    Raw,
    /// EMA applied.
    Smoothed,
    /// An input went backwards (counter reset or wrap): snapshots re-seeded, rates unchanged,
    /// `INIT_DONE` → `COUNTERS_LAST`.
    Reset,
    /// Nothing changed: see the reason.
    Skipped(SkipReason),
}

/// Why a sample changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The sample carries none of the inputs.
    NoInputs,
    /// Its timestamp is not after the previous sample's.
    NotNewer,
}

impl Outcome {
    /// Whether `RATES:*` changed and should be written.
    #[inline]
    pub fn changed(self) -> bool {
        !matches!(self, Outcome::Skipped(_))
    }
}

/// One object's rate state machine (the content of `RATES:<oid>` and `RATES:<oid>:PORT|RIF`).
#[derive(Debug, Clone, PartialEq)]
pub struct RateState {
    kind: RateKind,
    init: InitState,
    last: Option<RateSample>,
    rates: Rates,
}

impl RateState {
    pub fn new(kind: RateKind) -> Self {
        Self {
            kind,
            init: InitState::Absent,
            last: None,
            rates: Rates::default(),
        }
    }

    #[inline]
    pub fn kind(&self) -> RateKind {
        self.kind
    }

    /// The current `INIT_DONE`.
    #[inline]
    pub fn init(&self) -> InitState {
        self.init
    }

    /// The published rates.
    #[inline]
    pub fn rates(&self) -> &Rates {
        &self.rates
    }

    /// The `_last` snapshot.
    #[inline]
    pub fn last(&self) -> Option<&RateSample> {
        self.last.as_ref()
    }

    /// Feeds one sample with smoothing weight `alpha` (0 < α ≤ 1; see [`parse_alpha`]).
    /// Inlined: `stel-query rates` calls it per snapshot and object from another crate, in a
    /// profile without cross-crate LTO.
    #[inline]
    pub fn update(&mut self, s: &RateSample, alpha: f64) -> Outcome {
        let now = s.quantities();
        if now.iter().all(Option::is_none) {
            return Outcome::Skipped(SkipReason::NoInputs);
        }
        let Some(last) = self.last.filter(|_| self.init != InitState::Absent) else {
            self.last = Some(*s);
            self.init = InitState::CountersLast;
            return Outcome::Seeded;
        };
        if s.ts_ns <= last.ts_ns {
            return Outcome::Skipped(SkipReason::NotNewer);
        }
        // Any individual input going backwards is a reset (or a wrap): re-seed, no spike.
        let went_back = s
            .inputs
            .iter()
            .zip(last.inputs.iter())
            .any(|(n, l)| matches!((n, l), (Some(n), Some(l)) if n < l));
        if went_back {
            self.last = Some(*s);
            self.init = InitState::CountersLast;
            return Outcome::Reset;
        }
        let scale = 1e9 / (s.ts_ns - last.ts_ns) as f64;
        let before = last.quantities();
        let smooth = self.init == InitState::Done;
        for ((slot, n), b) in self.rates.slots().into_iter().zip(now).zip(before) {
            let (Some(n), Some(b)) = (n, b) else {
                continue;
            };
            let raw = n.wrapping_sub(b) as f64 * scale;
            *slot = Some(match (*slot, smooth) {
                (Some(old), true) => alpha * raw + (1.0 - alpha) * old,
                _ => raw,
            });
        }
        self.last = Some(*s);
        self.init = InitState::Done;
        if smooth {
            Outcome::Smoothed
        } else {
            Outcome::Raw
        }
    }

    /// The `RATES:<oid>` fields as they stand: the rates that exist, `RX_UTIL`/`TX_UTIL` when
    /// `speed_mbps` is known, and the `_last` snapshots. Values are numbers as Redis stores them.
    pub fn fields(&self, speed_mbps: Option<f64>) -> Vec<(&'static str, RateValue)> {
        let mut out = Vec::with_capacity(12);
        let r = &self.rates;
        for (name, v) in [
            ("RX_BPS", r.rx_bps),
            ("RX_PPS", r.rx_pps),
            ("TX_BPS", r.tx_bps),
            ("TX_PPS", r.tx_pps),
        ] {
            if let Some(v) = v {
                out.push((name, RateValue::Float(v)));
            }
        }
        if self.kind == RateKind::Port && self.init == InitState::Done {
            for (name, v) in [("RX_UTIL", r.rx_bps), ("TX_UTIL", r.tx_bps)] {
                if let Some(u) = v.and_then(|bps| util_percent(bps, speed_mbps?)) {
                    out.push((name, RateValue::Float(u)));
                }
            }
        }
        if let Some(last) = &self.last {
            for (name, v) in self.kind.last_names().iter().zip(last.inputs) {
                if let (Some(name), Some(v)) = (name, v) {
                    out.push((name, RateValue::Counter(v)));
                }
            }
        }
        out
    }
}

/// A value in `RATES:<oid>`: a rate (float) or a counter snapshot (integer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RateValue {
    Float(f64),
    Counter(u64),
}

impl fmt::Display for RateValue {
    /// Floats in Rust's shortest round-trip form (`2000000000`, `50.25`), which Python's
    /// `float()` and [`parse_lua_number`] read back exactly; counters in decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RateValue::Float(v) => write!(f, "{v}"),
            RateValue::Counter(v) => write!(f, "{v}"),
        }
    }
}

/// Picks rate samples out of a stream: the first sample at or after each `interval_ns` step
/// since the previous pick (switch time). Streams far faster than the interval (10 µs HFT
/// snapshots vs. 1 s rates) thus give one rate sample per interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntervalPicker {
    interval_ns: i64,
    last: Option<i64>,
}

impl IntervalPicker {
    /// `interval_ns` ≤ 0 picks every sample.
    pub fn new(interval_ns: i64) -> Self {
        Self {
            interval_ns,
            last: None,
        }
    }

    /// Whether the sample at `ts_ns` is due; if so it becomes the reference for the next one.
    /// A timestamp that goes backwards (switch clock change) restarts the picker.
    pub fn due(&mut self, ts_ns: i64) -> bool {
        match self.last {
            Some(l) if ts_ns >= l && ts_ns - l < self.interval_ns => false,
            _ => {
                self.last = Some(ts_ns);
                true
            }
        }
    }

    /// The earliest timestamp that would be due (`None` before the first pick).
    pub fn next_due(&self) -> Option<i64> {
        self.last.map(|l| l.saturating_add(self.interval_ns.max(0)))
    }
}

/// Utilisation in percent: bytes/s ÷ (speed Mb/s × 1e6 / 8) × 100 (portstat's formula).
/// `None` for a speed that is not positive.
pub fn util_percent(bytes_per_s: f64, speed_mbps: f64) -> Option<f64> {
    (speed_mbps > 0.0 && speed_mbps.is_finite())
        .then(|| bytes_per_s / (speed_mbps * 1e6 / 8.0) * 100.0)
}

/// The port speed (Mb/s) portstat uses for utilisation: STATE_DB `PORT_TABLE|<port>` `speed`,
/// unless it is missing or `N/A` or APPL_DB `oper_status` is not `up`; then APPL_DB
/// `PORT_TABLE:<port>` `speed`.
pub fn port_speed_mbps(
    state_speed: Option<&str>,
    appl_speed: Option<&str>,
    appl_oper_status: Option<&str>,
) -> Option<f64> {
    let parse = |s: Option<&str>| {
        s.map(str::trim)
            .filter(|s| !s.is_empty() && *s != "N/A")
            .and_then(parse_lua_number)
            .filter(|v| *v > 0.0)
    };
    let state = parse(state_speed);
    match (state, appl_oper_status.map(str::trim)) {
        (Some(v), Some("up")) => Some(v),
        _ => parse(appl_speed),
    }
}

/// Portstat's `RX_BPS`/`TX_BPS` column: `> 1e7` → `"{:.2} MB/s"` of v/1e6, `> 1e4` →
/// `"{:.2} KB/s"` of v/1e3, else `"{:.2} B/s"` (decimal units, strictly greater-than).
pub fn format_bps(bytes_per_s: f64) -> String {
    if bytes_per_s > 10_000_000.0 {
        format!("{:.2} MB/s", bytes_per_s / 1e6)
    } else if bytes_per_s > 10_000.0 {
        format!("{:.2} KB/s", bytes_per_s / 1e3)
    } else {
        format!("{bytes_per_s:.2} B/s")
    }
}

/// How rates are shown: the project's convention is bytes per second in portstat's style
/// ([`format_bps`]: `MB/s`, as RATES `RX_BPS` and `show interfaces counters`); `bits` shows bits
/// per second (`Gb/s`, [`format_bits`]) for those who think in line rate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateUnit {
    /// Bytes per second, portstat style (the default).
    #[default]
    Bytes,
    /// Bits per second.
    Bits,
}

impl RateUnit {
    /// `bytes_per_s` in this unit.
    pub fn format(self, bytes_per_s: f64) -> String {
        match self {
            RateUnit::Bytes => format_bps(bytes_per_s),
            RateUnit::Bits => format_bits(bytes_per_s * 8.0),
        }
    }

    /// `bytes_per_s` in this unit, as a number (what CSV and JSON carry).
    pub fn value(self, bytes_per_s: f64) -> f64 {
        match self {
            RateUnit::Bytes => bytes_per_s,
            RateUnit::Bits => bytes_per_s * 8.0,
        }
    }

    /// The unit's name in headers: `bytes/s`, `bits/s`.
    pub fn name(self) -> &'static str {
        match self {
            RateUnit::Bytes => "bytes/s",
            RateUnit::Bits => "bits/s",
        }
    }
}

impl std::str::FromStr for RateUnit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bytes" => Ok(RateUnit::Bytes),
            "bits" => Ok(RateUnit::Bits),
            _ => Err(format!(
                "`{s}`: expected bytes (MB/s, the default) or bits (Gb/s)"
            )),
        }
    }
}

/// Bits per second with portstat's thresholds one step up: `> 1e10` → `"{:.2} Gb/s"`, `> 1e7` →
/// `"{:.2} Mb/s"`, `> 1e4` → `"{:.2} Kb/s"`, else `"{:.2} b/s"` (decimal units).
pub fn format_bits(bits_per_s: f64) -> String {
    if bits_per_s > 10_000_000_000.0 {
        format!("{:.2} Gb/s", bits_per_s / 1e9)
    } else if bits_per_s > 10_000_000.0 {
        format!("{:.2} Mb/s", bits_per_s / 1e6)
    } else if bits_per_s > 10_000.0 {
        format!("{:.2} Kb/s", bits_per_s / 1e3)
    } else {
        format!("{bits_per_s:.2} b/s")
    }
}

/// Portstat's `RX_PPS`/`TX_PPS` column: `"{:.2}/s"`.
pub fn format_pps(packets_per_s: f64) -> String {
    format!("{packets_per_s:.2}/s")
}

/// Portstat's `RX_UTIL`/`TX_UTIL` column: a `RATES` `*_UTIL` value when present, else bytes/s
/// over the port speed; `N/A` when neither can be computed.
pub fn format_util(
    rates_util: Option<f64>,
    bytes_per_s: Option<f64>,
    speed_mbps: Option<f64>,
) -> String {
    let util = rates_util.or_else(|| util_percent(bytes_per_s?, speed_mbps?));
    match util {
        Some(u) => format!("{u:.2}%"),
        None => "N/A".to_string(),
    }
}

/// A column value from a `RATES` field as portstat renders it (`N/A` for a missing or
/// unparsable field).
pub fn format_rate_field(field: Option<&str>, render: fn(f64) -> String) -> String {
    match field.and_then(parse_lua_number) {
        Some(v) => render(v),
        None => "N/A".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(ts_s: f64, rx_oct: u64, tx_oct: u64, rx_p: u64, tx_p: u64) -> RateSample {
        let mut inputs = [None; input::COUNT];
        inputs[input::RX_OCTETS] = Some(rx_oct);
        inputs[input::TX_OCTETS] = Some(tx_oct);
        inputs[input::RX_PKTS] = Some(rx_p);
        inputs[input::TX_PKTS] = Some(tx_p);
        RateSample {
            ts_ns: (ts_s * 1e9) as i64,
            inputs,
        }
    }

    #[test]
    fn alpha_defaults() {
        assert!((DEFAULT_ALPHA - 0.181_818_181_8).abs() < 1e-9);
        assert_eq!(alpha_from_interval(1), 1.0);
        assert_eq!(parse_alpha("0.18"), Some(0.18));
        assert_eq!(parse_alpha("0"), None);
        assert_eq!(parse_alpha("1.5"), None);
        assert_eq!(parse_alpha("x"), None);
    }

    #[test]
    fn lua_numbers() {
        assert_eq!(parse_lua_number("2.e9"), Some(2e9));
        assert_eq!(parse_lua_number("247.e3"), Some(247e3));
        assert_eq!(parse_lua_number("50.25"), Some(50.25));
        assert_eq!(parse_lua_number("13.37e6"), Some(13.37e6));
        assert_eq!(parse_lua_number("nan"), None);
        assert_eq!(parse_lua_number(""), None);
        for v in [2e9, 0.1, 123_456.789, 1e-7] {
            assert_eq!(parse_lua_number(&RateValue::Float(v).to_string()), Some(v));
        }
    }

    #[test]
    fn init_done_progression_and_ema() {
        let a = 0.5;
        let mut s = RateState::new(RateKind::Port);
        assert_eq!(s.init().as_str(), None);
        assert_eq!(s.update(&port(0.0, 0, 0, 0, 0), a), Outcome::Seeded);
        assert_eq!(s.init().as_str(), Some("COUNTERS_LAST"));
        assert_eq!(s.rates().rx_bps, None);
        // 1000 bytes and 10 packets in 1 s.
        assert_eq!(s.update(&port(1.0, 1000, 2000, 10, 20), a), Outcome::Raw);
        assert_eq!(s.init().as_str(), Some("DONE"));
        assert_eq!(s.rates().rx_bps, Some(1000.0));
        assert_eq!(s.rates().tx_bps, Some(2000.0));
        assert_eq!(s.rates().rx_pps, Some(10.0));
        assert_eq!(s.rates().tx_pps, Some(20.0));
        // Raw 3000 B/s over 0.5 s (1500 bytes): EMA = 0.5·3000 + 0.5·1000.
        assert_eq!(
            s.update(&port(1.5, 2500, 2000, 10, 20), a),
            Outcome::Smoothed
        );
        assert_eq!(s.rates().rx_bps, Some(2000.0));
        assert_eq!(s.rates().tx_bps, Some(1000.0));
    }

    #[test]
    fn reset_is_not_a_spike() {
        let mut s = RateState::new(RateKind::Port);
        s.update(&port(0.0, 1_000_000, 0, 0, 0), DEFAULT_ALPHA);
        s.update(&port(1.0, 2_000_000, 0, 0, 0), DEFAULT_ALPHA);
        assert_eq!(s.rates().rx_bps, Some(1e6));
        // Counters zeroed: no negative or huge rate, state back to COUNTERS_LAST.
        assert_eq!(
            s.update(&port(2.0, 500, 0, 0, 0), DEFAULT_ALPHA),
            Outcome::Reset
        );
        assert_eq!(s.rates().rx_bps, Some(1e6));
        assert_eq!(s.init(), InitState::CountersLast);
        // The next sample publishes the true raw rate.
        assert_eq!(
            s.update(&port(3.0, 1_000_500, 0, 0, 0), DEFAULT_ALPHA),
            Outcome::Raw
        );
        assert_eq!(s.rates().rx_bps, Some(1e6));
        // A wrap of a single input is treated the same way.
        assert_eq!(
            s.update(&port(4.0, 2_000_500, 0, 0, 0), DEFAULT_ALPHA),
            Outcome::Smoothed
        );
        let mut w = port(5.0, 3_000_500, 0, 0, 0);
        w.inputs[input::TX_OCTETS] = Some(0);
        s.last.as_mut().unwrap().inputs[input::TX_OCTETS] = Some(u64::MAX - 5);
        assert_eq!(s.update(&w, DEFAULT_ALPHA), Outcome::Reset);
    }

    #[test]
    fn skips_and_missing_inputs() {
        let mut s = RateState::new(RateKind::Port);
        assert_eq!(
            s.update(&RateSample::default(), 0.5),
            Outcome::Skipped(SkipReason::NoInputs)
        );
        let mut only_rx = RateSample {
            ts_ns: 0,
            ..Default::default()
        };
        only_rx.inputs[input::RX_OCTETS] = Some(0);
        s.update(&only_rx, 0.5);
        only_rx.ts_ns = 0;
        assert_eq!(
            s.update(&only_rx, 0.5),
            Outcome::Skipped(SkipReason::NotNewer)
        );
        only_rx.ts_ns = 2_000_000_000;
        only_rx.inputs[input::RX_OCTETS] = Some(100);
        assert_eq!(s.update(&only_rx, 0.5), Outcome::Raw);
        assert_eq!(s.rates().rx_bps, Some(50.0));
        assert_eq!(s.rates().tx_bps, None);
        let names: Vec<_> = s.fields(Some(25_000.0)).into_iter().map(|f| f.0).collect();
        assert_eq!(
            names,
            ["RX_BPS", "RX_UTIL", "SAI_PORT_STAT_IF_IN_OCTETS_last"]
        );
    }

    #[test]
    fn non_unicast_adds_to_packets() {
        let mut s = RateState::new(RateKind::Port);
        let mut a = port(0.0, 0, 0, 0, 0);
        a.inputs[input::RX_NON_UCAST_PKTS] = Some(0);
        s.update(&a, 1.0);
        let mut b = port(1.0, 0, 0, 10, 0);
        b.inputs[input::RX_NON_UCAST_PKTS] = Some(5);
        s.update(&b, 1.0);
        assert_eq!(s.rates().rx_pps, Some(15.0));
    }

    #[test]
    fn rif_fields() {
        let mut s = RateState::new(RateKind::Rif);
        let mut a = RateSample::default();
        a.inputs[input::RX_OCTETS] = Some(0);
        a.inputs[input::RX_PKTS] = Some(0);
        s.update(&a, 1.0);
        a.ts_ns = 1_000_000_000;
        a.inputs[input::RX_OCTETS] = Some(640);
        a.inputs[input::RX_PKTS] = Some(10);
        s.update(&a, 1.0);
        let f = s.fields(Some(1000.0));
        assert_eq!(f[0], ("RX_BPS", RateValue::Float(640.0)));
        assert_eq!(f[1], ("RX_PPS", RateValue::Float(10.0)));
        assert!(f.iter().all(|(n, _)| !n.ends_with("UTIL")));
        assert_eq!(
            f[2],
            (
                "SAI_ROUTER_INTERFACE_STAT_IN_OCTETS_last",
                RateValue::Counter(640)
            )
        );
        assert_eq!(RateKind::Rif.state_key("oid:0x6"), "RATES:oid:0x6:RIF");
        assert_eq!(
            RateKind::Rif.input_index("SAI_ROUTER_INTERFACE_STAT_OUT_PACKETS"),
            Some(input::TX_PKTS)
        );
    }

    #[test]
    fn picker() {
        let mut p = IntervalPicker::new(1000);
        assert!(p.due(5));
        assert!(!p.due(500));
        assert!(!p.due(1004));
        assert!(p.due(1005));
        assert_eq!(p.next_due(), Some(2005));
        assert!(p.due(10)); // clock went back
    }

    /// The worked examples of reference §3.5 (sonic-utilities `tests/portstat_test.py`).
    #[test]
    fn portstat_worked_examples() {
        assert_eq!(format_bps(2e9), "2000.00 MB/s");
        assert_eq!(format_bps(204_800.0), "204.80 KB/s");
        assert_eq!(format_bps(13.37e6), "13.37 MB/s");
        assert_eq!(RateUnit::Bytes.format(2e9), "2000.00 MB/s");
        assert_eq!(RateUnit::Bits.format(12.5e9), "100.00 Gb/s");
        assert_eq!(RateUnit::Bits.format(2e6), "16.00 Mb/s");
        assert_eq!("bits".parse::<RateUnit>(), Ok(RateUnit::Bits));
        assert!("gbps".parse::<RateUnit>().is_err());
        assert_eq!(RateUnit::Bits.value(1.0), 8.0);
        assert_eq!(RateUnit::Bits.name(), "bits/s");
        assert_eq!(format_bps(1.35e6), "1350.00 KB/s");
        assert_eq!(format_bps(10_000_000.0), "10000.00 KB/s");
        assert_eq!(format_bps(10_000.0), "10000.00 B/s");
        assert_eq!(format_pps(247e3), "247000.00/s");
        // Ethernet0: STATE_DB says 100000 but APPL_DB oper_status is down → APPL_DB's 25000.
        let speed = port_speed_mbps(Some("100000"), Some("25000"), Some("down"));
        assert_eq!(speed, Some(25_000.0));
        assert_eq!(format_util(None, Some(2e9), speed), "64.00%");
        assert_eq!(format_rate_field(Some("2.e9"), format_bps), "2000.00 MB/s");
        assert_eq!(format_rate_field(None, format_bps), "N/A");
        assert_eq!(format_util(None, Some(2e9), None), "N/A");
        assert_eq!(format_util(Some(12.5), None, None), "12.50%");
        assert_eq!(
            port_speed_mbps(Some("100000"), Some("25000"), Some("up")),
            Some(100_000.0)
        );
        assert_eq!(
            port_speed_mbps(Some("N/A"), Some("25000"), Some("up")),
            Some(25_000.0)
        );
        assert_eq!(port_speed_mbps(None, None, None), None);
    }
}
