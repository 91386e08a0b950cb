//! SONiC's rate math (`port_rates.lua` / `rif_rates.lua`) over snapshots, and portstat's
//! formatting of the results.
//!
//! A rate between two polls is `(counter_now − counter_then) / Δt`; BPS is **bytes**/s (the SONiC
//! name notwithstanding), PPS sums unicast and non-unicast packets, utilisation is
//! `bps / (speed_Mbps × 1e6 / 8) × 100`. The per-object `INIT_DONE` state machine is kept: the
//! first poll only stores the counters, the second writes the raw rate, later ones the EMA
//! `α·raw + (1 − α)·old` with `α = 2/(N + 1)` when smoothing is on. Two deliberate differences,
//! both because the polls here are snapshots we choose rather than a fixed timer:
//! - Δt is the measured time between the two snapshots (equal to SONiC's configured interval
//!   when no snapshot is missing);
//! - a counter that goes backwards (a reset) restarts the state machine for that object instead
//!   of producing a negative spike, and a missing input makes only the rates that need it N/A.

use crate::output::thousands;

/// The counters one object's rates need, by short stat name. Missing packet parts count as 0
/// (HFT's allowed PORT counters have no `IF_IN_NON_UCAST_PKTS`), a missing octet counter makes
/// its BPS N/A.
#[derive(Debug, Clone, Copy)]
pub struct RateStats {
    pub rx_octets: &'static str,
    pub tx_octets: &'static str,
    pub rx_pkts: &'static [&'static str],
    pub tx_pkts: &'static [&'static str],
}

/// `SAI_PORT_STAT_*` inputs of `port_rates.lua`.
pub const PORT: RateStats = RateStats {
    rx_octets: "IF_IN_OCTETS",
    tx_octets: "IF_OUT_OCTETS",
    rx_pkts: &["IF_IN_UCAST_PKTS", "IF_IN_NON_UCAST_PKTS"],
    tx_pkts: &["IF_OUT_UCAST_PKTS", "IF_OUT_NON_UCAST_PKTS"],
};

/// `SAI_ROUTER_INTERFACE_STAT_*` inputs of `rif_rates.lua`.
pub const RIF: RateStats = RateStats {
    rx_octets: "IN_OCTETS",
    tx_octets: "OUT_OCTETS",
    rx_pkts: &["IN_PACKETS"],
    tx_pkts: &["OUT_PACKETS"],
};

/// One poll's inputs: RX bytes, TX bytes, RX packets, TX packets (`None`: not subscribed/null).
pub type Inputs = [Option<u64>; 4];

/// Rates and deltas over one poll interval.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rates {
    /// Bytes/s, packets/s — raw or smoothed.
    pub rx_bps: Option<f64>,
    pub tx_bps: Option<f64>,
    pub rx_pps: Option<f64>,
    pub tx_pps: Option<f64>,
    /// Packets in the interval (portstat's RX_OK / TX_OK).
    pub rx_ok: Option<u64>,
    pub tx_ok: Option<u64>,
    /// Bytes in the interval.
    pub rx_bytes: Option<u64>,
    pub tx_bytes: Option<u64>,
    /// Length of the interval, ns.
    pub dt_ns: i64,
}

impl Rates {
    /// Utilisation in % of `speed_mbps` (portstat's formula).
    pub fn util(bps: Option<f64>, speed_mbps: Option<f64>) -> Option<f64> {
        stel_store::rate::util_percent(bps?, speed_mbps?)
    }
}

/// `INIT_DONE` of `RATES:<oid>:PORT` (the daemon's type: one state machine for both).
pub use stel_store::rate::InitState as InitDone;

/// One object's rate state across polls: the daemon's RATES state machine
/// ([`stel_store::rate::RateState`]), so `stel-query rates` and the live `RATES` table agree
/// bit for bit, plus the per-interval deltas portstat prints.
#[derive(Debug, Clone)]
pub struct RateState {
    inner: stel_store::rate::RateState,
    /// Time and inputs of the poll `inner` holds as its `_last` snapshot (the deltas' base).
    prev: Option<(i64, Inputs)>,
    /// Polls whose counters went back (a reset or wrap): their interval has no rate.
    resets: u64,
    /// Time of the last reset seen.
    last_reset_ns: Option<i64>,
}

impl Default for RateState {
    fn default() -> Self {
        Self {
            inner: stel_store::rate::RateState::new(stel_store::rate::RateKind::Port),
            prev: None,
            resets: 0,
            last_reset_ns: None,
        }
    }
}

impl RateState {
    /// The current `INIT_DONE`.
    pub fn init(&self) -> InitDone {
        self.inner.init()
    }

    /// Polls so far whose counters went back (restart, clear, wrap), and when the last was.
    pub fn resets(&self) -> (u64, Option<i64>) {
        (self.resets, self.last_reset_ns)
    }

    /// Feeds the poll at `t_ns`; returns the rates it completes (none for the first poll, a
    /// reset, a poll with no inputs, or one not after the previous one). `alpha` = `None`: no
    /// smoothing (α = 1 gives the raw rate exactly).
    #[inline]
    pub fn poll(&mut self, t_ns: i64, now: Inputs, alpha: Option<f64>) -> Option<Rates> {
        use stel_store::rate::{input, Outcome, RateSample};
        let mut inputs = [None; input::COUNT];
        inputs[input::RX_OCTETS] = now[0];
        inputs[input::TX_OCTETS] = now[1];
        inputs[input::RX_PKTS] = now[2];
        inputs[input::TX_PKTS] = now[3];
        let outcome = self.inner.update(
            &RateSample {
                ts_ns: t_ns,
                inputs,
            },
            alpha.unwrap_or(1.0),
        );
        if let Outcome::Skipped(_) = outcome {
            return None;
        }
        // Every other outcome made this poll the state's `_last` snapshot.
        let before = self.prev.replace((t_ns, now));
        match outcome {
            Outcome::Raw | Outcome::Smoothed => {}
            Outcome::Reset => {
                self.resets += 1;
                self.last_reset_ns = Some(t_ns);
                return None;
            }
            Outcome::Seeded | Outcome::Skipped(_) => return None,
        }
        let (t0, before) = before?;
        // `now` and `before` are [`Inputs`] (RX bytes, TX bytes, RX pkts, TX pkts).
        let delta = |k: usize| Some(now[k]? - before[k]?);
        // A rate the daemon keeps from an earlier poll is N/A here when this poll lacks it.
        let r = self.inner.rates();
        let rate = |k: usize, v: Option<f64>| v.filter(|_| delta(k).is_some());
        Some(Rates {
            rx_bps: rate(0, r.rx_bps),
            tx_bps: rate(1, r.tx_bps),
            rx_pps: rate(2, r.rx_pps),
            tx_pps: rate(3, r.tx_pps),
            rx_ok: delta(2),
            tx_ok: delta(3),
            rx_bytes: delta(0),
            tx_bytes: delta(1),
            dt_ns: t_ns - t0,
        })
    }
}

/// The port speeds utilisation uses: `--speed` for every port when given, else each port's
/// speed as the daemon recorded it from SONiC (queues and priority groups `Ethernet0|3` use
/// their port's), else 100G.
#[derive(Debug, Clone, Default)]
pub struct Speeds {
    flag: Option<f64>,
    recorded: std::collections::BTreeMap<String, f64>,
}

/// The speed assumed when neither `--speed` nor the files say: 100G, in Mb/s.
pub const DEFAULT_SPEED_MBPS: f64 = 100_000.0;

impl Speeds {
    pub fn new(flag: Option<f64>, recorded: std::collections::BTreeMap<String, f64>) -> Self {
        Self { flag, recorded }
    }

    /// The speed of `object`, Mb/s.
    pub fn of(&self, object: &str) -> f64 {
        if let Some(f) = self.flag {
            return f;
        }
        let port = object.split('|').next().unwrap_or(object);
        self.recorded
            .get(object)
            .or_else(|| self.recorded.get(port))
            .copied()
            .unwrap_or(DEFAULT_SPEED_MBPS)
    }

    /// Where the speeds come from: `--speed`, `recorded` (the files) or `default` (100G).
    pub fn source(&self) -> &'static str {
        match (self.flag, self.recorded.is_empty()) {
            (Some(_), _) => "--speed",
            (None, false) => "recorded",
            (None, true) => "default",
        }
    }

    /// For the JSON `begin`: the source and the speeds (`--speed` or per port).
    pub fn to_json(&self) -> serde_json::Value {
        match self.flag {
            Some(f) => serde_json::json!({"source": self.source(), "speed_mbps": f}),
            None if self.recorded.is_empty() => {
                serde_json::json!({"source": self.source(), "speed_mbps": DEFAULT_SPEED_MBPS})
            }
            None => serde_json::json!({"source": self.source(), "port_speed_mbps": self.recorded}),
        }
    }

    /// The sentence for tables when UTIL rests on an assumption.
    pub fn caveat(&self) -> Option<String> {
        (self.source() == "default").then(|| {
            "UTIL assumes 100G ports: the files record no port speed (the daemon reads them from SONiC when it has Redis); --speed sets one.".to_string()
        })
    }
}

/// SONiC's smoothing weight for an interval of `n` polls: `2 / (n + 1)`.
pub fn alpha(n: u32) -> f64 {
    stel_store::rate::alpha_from_interval(n)
}

/// portstat's `RX_BPS`/`TX_BPS` text: MB/s above 10 M, KB/s above 10 K (strictly greater).
pub fn fmt_bps(v: f64) -> String {
    stel_store::rate::format_bps(v)
}

/// portstat's `RX_PPS` text.
pub fn fmt_pps(v: f64) -> String {
    stel_store::rate::format_pps(v)
}

/// portstat's `RX_UTIL` text.
pub fn fmt_util(v: f64) -> String {
    format!("{v:.2}%")
}

/// portstat's `RX_OK` text.
pub fn fmt_ok(v: u64) -> String {
    thousands(v)
}

pub use stel_store::units::parse_speed_mbps;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portstat_formatting_matches_sonic_tests() {
        // sonic-utilities tests/portstat_test.py expectations.
        assert_eq!(fmt_bps(2e9), "2000.00 MB/s");
        assert_eq!(fmt_bps(204800.0), "204.80 KB/s");
        assert_eq!(fmt_bps(13.37e6), "13.37 MB/s");
        assert_eq!(fmt_bps(1.35e6), "1350.00 KB/s");
        assert_eq!(fmt_bps(10e6), "10000.00 KB/s", "strictly greater than 10 M");
        assert_eq!(fmt_bps(10.0), "10.00 B/s");
        assert_eq!(
            fmt_util(Rates::util(Some(2e9), Some(25000.0)).unwrap()),
            "64.00%"
        );
        assert_eq!(fmt_pps(50.25), "50.25/s");
        assert_eq!(parse_speed_mbps("100G").unwrap(), 100_000.0);
        assert_eq!(parse_speed_mbps("25000").unwrap(), 25_000.0);
        assert!(parse_speed_mbps("fast").is_err());
        assert!((alpha(10) - 2.0 / 11.0).abs() < 1e-12);
    }

    /// The query path's state machine agrees with the one the daemon's RATES writer uses.
    #[test]
    fn agrees_with_store_rate_state() {
        use stel_store::rate::{input, RateKind, RateSample, RateState as Store};
        let mut ours = RateState::default();
        let mut theirs = Store::new(RateKind::Port);
        let a = alpha(10);
        let mut c = [0u64; 4];
        let mut x: u64 = 12345;
        for i in 0..500i64 {
            for v in c.iter_mut() {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *v += x >> 50;
            }
            if i == 250 {
                c = [1, 1, 1, 1]; // a counter reset
            }
            let mut inputs = [None; input::COUNT];
            inputs[input::RX_OCTETS] = Some(c[0]);
            inputs[input::TX_OCTETS] = Some(c[1]);
            inputs[input::RX_PKTS] = Some(c[2]);
            inputs[input::TX_PKTS] = Some(c[3]);
            let t = i * 10_000 + (i % 3);
            theirs.update(&RateSample { ts_ns: t, inputs }, a);
            if let Some(r) = ours.poll(t, c.map(Some), Some(a)) {
                let s = theirs.rates();
                assert_eq!(
                    (r.rx_bps, r.tx_bps, r.rx_pps, r.tx_pps),
                    (s.rx_bps, s.tx_bps, s.rx_pps, s.tx_pps),
                    "poll {i}"
                );
            }
        }
    }

    #[test]
    fn init_done_state_machine_and_ema() {
        let mut s = RateState::default();
        let a = Some(alpha(10));
        assert_eq!(s.poll(0, [Some(0); 4], a), None);
        assert_eq!(s.init(), InitDone::CountersLast);
        // Second poll: raw, unsmoothed.
        let r = s
            .poll(1_000_000_000, [Some(1000), Some(500), Some(10), Some(5)], a)
            .unwrap();
        assert_eq!(r.rx_bps, Some(1000.0));
        assert_eq!(r.tx_pps, Some(5.0));
        assert_eq!(r.rx_ok, Some(10));
        assert_eq!(s.init(), InitDone::Done);
        // Third: EMA of raw 3000 with old 1000.
        let r = s
            .poll(
                2_000_000_000,
                [Some(4000), Some(1000), Some(20), Some(10)],
                a,
            )
            .unwrap();
        let al = 2.0 / 11.0;
        assert!((r.rx_bps.unwrap() - (al * 3000.0 + (1.0 - al) * 1000.0)).abs() < 1e-9);
        // A reset: no spike, back to COUNTERS_LAST, then raw again.
        assert_eq!(
            s.poll(3_000_000_000, [Some(10), Some(10), Some(1), Some(1)], a),
            None
        );
        assert_eq!(s.init(), InitDone::CountersLast);
        let r = s
            .poll(4_000_000_000, [Some(110), Some(10), Some(2), Some(1)], a)
            .unwrap();
        assert_eq!(r.rx_bps, Some(100.0));
        // A missing input makes only its rate N/A.
        let r = s
            .poll(5_000_000_000, [Some(210), None, Some(3), Some(1)], None)
            .unwrap();
        assert_eq!((r.rx_bps, r.tx_bps), (Some(100.0), None));
    }
}
